"""A small loop IR between te_grad tensors and LLVM, with a C-like printer.

A :class:`Stage` computes one tensor: a list of statements run for a range of
its parallel loop. Statements are loops, guarded blocks and stores; the
expressions inside them are ordinary te_grad expressions without reductions
(a ``Read`` is a load from a buffer).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

from te_grad.ir import Const, Expr, ReduceAxis, Tensor, Var
from te_grad.printer import ExprPrinter, Namer


@dataclass
class Loop:
    """``for var in range(lo, hi): body``; ``parallel`` marks the loop split across threads."""
    var: Var
    lo: Expr
    hi: Expr
    body: List["Stmt"]
    parallel: bool = False


@dataclass
class If:
    """``if cond: body``."""
    cond: Expr
    body: List["Stmt"]


@dataclass
class Store:
    """``tensor[indices] = value``, or ``= combine(tensor[indices], value)`` when ``combine`` is set.

    ``checked`` stores (scatters with data-dependent indices) verify the indices at run time.
    """
    tensor: Tensor
    indices: Sequence[Expr]
    value: Expr
    combine: Optional[str] = None
    checked: bool = False


Stmt = Union[Loop, If, Store]


@dataclass
class Stage:
    """The statements that compute ``tensor``; ``parallel_extent`` > 0 if its outer loop may be split."""
    tensor: Tensor
    body: List[Stmt]
    parallel_extent: int = 0
    checked_reads: List[Expr] = field(default_factory=list)


_COMBINE_SYM = {"sum": "+=", "prod": "*=", "max": "max=", "min": "min="}


def stage_text(stage: Stage, tensor_names: Namer) -> str:
    """The stage as C-like text."""
    p = ExprPrinter(Namer(), tensor_names)
    out: List[str] = [f"// {tensor_names.name(stage.tensor, stage.tensor.name)}: "
                      f"{stage.tensor.dtype}{list(stage.tensor.shape)}"]

    def emit(stmts, depth):
        pad = "  " * depth
        for s in stmts:
            if isinstance(s, Loop):
                v = p(s.var)
                tag = "parallel " if s.parallel else ""
                out.append(f"{pad}{tag}for ({v} = {p(s.lo)}; {v} < {p(s.hi)}; ++{v}) {{")
                emit(s.body, depth + 1)
                out.append(f"{pad}}}")
            elif isinstance(s, If):
                out.append(f"{pad}if ({p(s.cond)}) {{")
                emit(s.body, depth + 1)
                out.append(f"{pad}}}")
            else:
                name = tensor_names.name(s.tensor, s.tensor.name)
                idx = "".join(f"[{p(i)}]" for i in s.indices)
                op = "=" if s.combine is None else _COMBINE_SYM[s.combine]
                out.append(f"{pad}{name}{idx} {op} {p(s.value)};")

    emit(stage.body, 0)
    return "\n".join(out)


def program_text(stages: Sequence[Stage]) -> str:
    names = Namer()
    return "\n\n".join(stage_text(s, names) for s in stages)
