"""A small loop IR between te_grad tensors and LLVM, with a C-like printer.

A :class:`Stage` computes one tensor: a list of statements run for a range of
its parallel loop. Statements are loops, guarded blocks and stores; the
expressions inside them are ordinary te_grad expressions without reductions
(a ``Read`` is a load from a buffer).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple, Union

from te_grad.ops import identity_of
from te_grad import dsl
from te_grad.graph import reads_in
from te_grad.ir import Expr, Tensor, Var
from te_grad.printer import ExprPrinter, Namer


@dataclass
class Loop:
    """``for var in range(lo, hi): body``; ``parallel`` marks the loop split across threads."""
    var: Var
    lo: Expr
    hi: Expr
    body: List["Stmt"]
    parallel: bool = False
    #: a parallel loop over blocks of ``scale`` consecutive indices of the split axis
    #: (threads get ranges that are whole blocks)
    scale: int = 1


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


@dataclass
class RegisterBlock:
    """``for var in range(lo, hi)`` innermost under ``loops``, computed ``width`` values at a time.

    Equivalent to ``loops`` (outer first) around ``for var: if cond: store``; the
    emitter keeps ``width`` consecutive elements of the store in vector registers
    across ``loops`` (or emits exactly that plain nest when it cannot).
    """
    var: Var
    lo: Expr
    hi: Expr
    loops: List[Loop]  # bodies unused: only (var, lo, hi), outer first
    cond: Optional[Expr]
    store: "Store"
    #: unroll-and-jam (see :class:`Jam`): the block also covers ``factor`` consecutive
    #: values of each jammed output variable; the first varies slowest among the copies
    jams: Tuple["Jam", ...] = ()
    #: the lanes run along a reduce axis: the vector accumulates over all the loops and
    #: its lanes are combined once at the end
    reduce_lanes: bool = False
    #: bits of one vector register (the emitter uses 1, 2, 4 or 8 registers per copy)
    vector_bits: int = 256
    #: vector registers the accumulators of all the jammed copies may take together
    accumulators: int = 12

    @property
    def jam(self) -> int:
        """How many jammed copies the block computes."""
        n = 1
        for j in self.jams:
            n *= j.factor
        return n

    def jam_values(self, copy: int) -> List[Tuple["Jam", int]]:
        """``[(jam, offset)]``: copy ``copy`` computes ``jam.var = jam.first + offset``."""
        out = []
        for j in reversed(self.jams):
            out.append((j, copy % j.factor))
            copy //= j.factor
        return list(reversed(out))

    def plain(self) -> List["Stmt"]:
        inner = [If(self.cond, [self.store])] if self.cond is not None else [self.store]
        body: List["Stmt"] = [Loop(self.var, self.lo, self.hi, inner)]
        for lp in reversed(self.loops):
            body = [Loop(lp.var, lp.lo, lp.hi, body)]
        for j in reversed(self.jams):
            body = [Loop(j.var, j.first, j.first + j.factor, body)]
        return body


@dataclass(frozen=True)
class Jam:
    """An output variable ``var`` unrolled by ``factor`` and jammed into a register block:
    the loop around the block runs over ``outer`` in ``[0, n / factor)`` and the block
    computes ``var = base + outer * factor + offset`` for each ``offset < factor``."""
    var: Var
    outer: Var
    factor: int
    base: int = 0

    @property
    def first(self) -> Expr:
        return self.outer * self.factor + self.base if self.base else self.outer * self.factor

    def var_range(self, outer_range: Tuple[int, int]) -> Tuple[int, int]:
        """The inclusive range of ``var`` when ``outer`` lies in ``outer_range``."""
        return (self.base + outer_range[0] * self.factor, self.base + outer_range[1] * self.factor + self.factor - 1)


@dataclass
class Scan:
    """A running reduction carried in a register along ``var`` in ``[0, n)``::

        acc = identity
        for var in range(n):
            for axis in range(lo, hi): if cond: acc = combine(acc, store.value)
            store.tensor[store.indices] = acc
    """
    var: Var
    n: int
    axis: Var
    lo: Expr
    hi: Expr
    cond: Optional[Expr]
    store: Store  # its ``combine`` is the running combiner


@dataclass
class TransposeBlock:
    """``for u in [u0, u0 + 8): for v in [v0, v0 + 8): store``, where ``store`` is unit-stride
    in ``v`` and ``read`` (in its value) unit-stride in ``u``: eight rows of ``read`` are
    loaded as vectors and transposed in registers, then each row of the store is one vector."""
    u: Var
    v: Var
    u0: Expr
    v0: Expr
    store: Store
    read: Expr  # the Read node of ``store.value`` that crosses the store's layout

    def plain(self) -> List["Stmt"]:
        return [Loop(self.u, self.u0, self.u0 + 8, [Loop(self.v, self.v0, self.v0 + 8, [self.store])])]


Stmt = Union[Loop, If, Store, RegisterBlock, Scan, TransposeBlock]


@dataclass
class Stage:
    """The statements that compute ``tensor``; ``parallel_extent`` > 0 if its outer loop may be split."""
    tensor: Tensor
    body: List[Stmt]
    parallel_extent: int = 0
    checked_reads: List[Expr] = field(default_factory=list)
    #: the output axis split among threads, when the parallel loop runs over one (not a tile index)
    parallel_axis: Optional[Var] = None
    #: threads must get ranges of the split axis that are multiples of this
    parallel_granule: int = 1
    #: innermost iterations, when they differ from the tensor's own count (a scatter's zero-fill)
    work: Optional[int] = None


def stmt_exprs(stmts: Sequence[Stmt]):
    """Every expression in ``stmts`` (loop bounds, guards, indices and values), in program order."""
    for s in stmts:
        if isinstance(s, Loop):
            exprs = [s.lo, s.hi]
        elif isinstance(s, If):
            exprs = [s.cond]
        elif isinstance(s, (RegisterBlock, TransposeBlock)):
            yield from stmt_exprs(s.plain())
            continue
        elif isinstance(s, Scan):
            exprs = [s.lo, s.hi, s.store.value] + list(s.store.indices) + ([s.cond] if s.cond is not None else [])
        else:
            exprs = list(s.indices) + [s.value]
        yield from exprs
        if isinstance(s, (Loop, If)):
            yield from stmt_exprs(s.body)


def stmt_reads(stmts: Sequence[Stmt]):
    """Every read in ``stmts`` (loop bounds, guards, indices and values), in program order."""
    for e in stmt_exprs(stmts):
        yield from reads_in(e)


def tensors_of(stage: Stage) -> List[Tensor]:
    """The buffers a stage touches: its output first, then what it reads, in order."""
    seen = {id(stage.tensor): stage.tensor}
    for r in stmt_reads(stage.body):
        seen.setdefault(id(r.tensor), r.tensor)
    return list(seen.values())


def register_blocks(stmts: Sequence[Stmt]):
    """Every register block in ``stmts``."""
    for s in stmts:
        if isinstance(s, RegisterBlock):
            yield s
        elif isinstance(s, (Loop, If)):
            yield from register_blocks(s.body)


def stmt_stores(stmts: Sequence[Stmt]):
    """Every store in ``stmts`` (a scan's included)."""
    for s in stmts:
        if isinstance(s, (RegisterBlock, TransposeBlock)):
            yield from stmt_stores(s.plain())
        elif isinstance(s, (Loop, If)):
            yield from stmt_stores(s.body)
        elif isinstance(s, Scan):
            yield s.store
        else:
            yield s


def nest(order: Sequence[Var], bounds, inner: List[Stmt], parallel: Optional[Var] = None) -> List[Stmt]:
    """Loops over ``order`` (outermost first, ``bounds[id(var)] = (lo, hi)``) around ``inner``;
    the loop over ``parallel`` is marked as split among threads."""
    body = inner
    for v in reversed(list(order)):
        lo, hi = bounds[id(v)]
        body = [Loop(v, lo, hi, body, parallel=v is parallel)]
    return body


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
            elif isinstance(s, RegisterBlock):
                v = p(s.var)
                what = "lanes of a vector accumulator" if s.reduce_lanes else \
                    "in vector registers across the loops below"
                out.append(f"{pad}// {v}: {what}")
                emit(s.plain(), depth)
            elif isinstance(s, TransposeBlock):
                out.append(f"{pad}// 8 x 8: rows of {p(s.read)} transposed in vector registers")
                emit(s.plain(), depth)
            elif isinstance(s, Scan):
                v, r = p(s.var), p(s.axis)
                name = tensor_names.name(s.store.tensor, s.store.tensor.name)
                idx = "".join(f"[{p(i)}]" for i in s.store.indices)
                op = _COMBINE_SYM[s.store.combine]
                out.append(f"{pad}// acc: a register carried along {v}")
                dt = s.store.tensor.dtype
                out.append(f"{pad}acc = {p(dsl.const(identity_of(s.store.combine, dt), dt))};")
                out.append(f"{pad}for ({v} = 0; {v} < {s.n}; ++{v}) {{")
                out.append(f"{pad}  for ({r} = {p(s.lo)}; {r} < {p(s.hi)}; ++{r}) {{")
                inner = f"acc {op} {p(s.store.value)};"
                if s.cond is not None:
                    out.append(f"{pad}    if ({p(s.cond)}) {inner}")
                else:
                    out.append(f"{pad}    {inner}")
                out.append(f"{pad}  }}")
                out.append(f"{pad}  {name}{idx} = acc;")
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
