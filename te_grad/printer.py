"""Deterministic, readable printing of expressions and tensor graphs.

The text is Python-like DSL (``sum(A[i, k] * B[k, j] for k in range(32))``)
with Python's operator precedence, so a formula can be read as code. Names are
the user's hints; when two different variables (or tensors) share a hint in one
scope, later ones get ``_1``, ``_2``, ... in order of first appearance, so
the same graph always prints the same text.
"""
from __future__ import annotations

import html
from typing import Dict, Iterable, List, Union

from .deep import deep_entry
from .ir import (Binary, Call, Cast, Compare, ComputeOp, Const, Expr, Read, Reduce, ScatterOp,
                 Select, Tensor, Unary, Var)

_BIN_SYM = {"add": ("+", 8), "sub": ("-", 8), "mul": ("*", 9), "div": ("/", 9),
            "floordiv": ("//", 9), "floormod": ("%", 9), "pow": ("**", 11),
            "and": ("&", 6), "or": ("|", 4)}
_CMP_SYM = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_ATOM = 13


class Namer:
    """Assigns each distinct object a readable name, unique within this namer."""

    def __init__(self):
        self._names: Dict[int, str] = {}
        self._used = set()
        self._keep = []  # keeps named objects alive so their ids stay unique

    def name(self, obj, hint: str) -> str:
        got = self._names.get(id(obj))
        if got is not None:
            return got
        hint = hint or "t"
        name, n = hint, 0
        while name in self._used:
            n += 1
            name = f"{hint}_{n}"
        self._used.add(name)
        self._names[id(obj)] = name
        self._keep.append(obj)
        return name


class ExprPrinter:
    def __init__(self, var_names: Namer = None, tensor_names: Namer = None):
        self.vars = var_names or Namer()
        self.tensors = tensor_names or Namer()

    def __call__(self, e: Expr) -> str:
        return self.fmt(e)[0]

    def fmt(self, e: Expr):
        """Return (text, precedence) for ``e``."""
        m = getattr(self, "p_" + type(e).__name__)
        return m(e)

    def wrap(self, e: Expr, min_prec: int) -> str:
        text, prec = self.fmt(e)
        return f"({text})" if prec < min_prec else text

    def p_Const(self, e: Const):
        v = e.value
        if isinstance(v, float):
            text = repr(v) if v == v and abs(v) != float("inf") else ("nan" if v != v else
                                                                     ("inf" if v > 0 else "-inf"))
            return text, (10 if text.startswith("-") else _ATOM)
        return repr(v), (10 if isinstance(v, int) and v < 0 else _ATOM)

    def p_Var(self, e: Var):
        return self.vars.name(e, e.name), _ATOM

    p_ReduceAxis = p_Var

    def p_SizeVar(self, e):
        return e.name, _ATOM

    def p_Binary(self, e: Binary):
        if e.op in ("min", "max"):
            fn = "minimum" if e.op == "min" else "maximum"
            return f"{fn}({self(e.a)}, {self(e.b)})", _ATOM
        sym, prec = _BIN_SYM[e.op]
        if e.op == "pow":  # right associative
            return f"{self.wrap(e.a, prec + 1)} ** {self.wrap(e.b, prec)}", prec
        return f"{self.wrap(e.a, prec)} {sym} {self.wrap(e.b, prec + 1)}", prec

    def p_Unary(self, e: Unary):
        sym = "-" if e.op == "neg" else "~"
        return f"{sym}{self.wrap(e.a, 10)}", 10

    def p_Compare(self, e: Compare):
        return f"{self.wrap(e.a, 7)} {_CMP_SYM[e.op]} {self.wrap(e.b, 7)}", 3

    def p_Select(self, e: Select):
        return f"if_then_else({self(e.cond)}, {self(e.t)}, {self(e.f)})", _ATOM

    def p_Call(self, e: Call):
        return f"{e.name}({', '.join(self(a) for a in e.args)})", _ATOM

    def p_Cast(self, e: Cast):
        return f"{e.dtype}({self(e.a)})", _ATOM

    def p_Read(self, e: Read):
        name = self.tensors.name(e.tensor, e.tensor.name)
        if not e.indices:  # a 0-d tensor, read as in the DSL
            return f"{name}[()]", _ATOM
        return f"{name}[{', '.join(self(i) for i in e.indices)}]", _ATOM

    def p_Reduce(self, e: Reduce):
        loops = [f"for {self.vars.name(ax, ax.name)} in range({_range_text(ax, self)})" for ax in e.axes]
        where = f" if {self(e.where)}" if e.where is not None else ""
        return f"{e.combiner}({self(e.body)} {' '.join(loops)}{where})", _ATOM


@deep_entry
def expr_to_str(e: Expr) -> str:
    """One expression as text (names unique within it)."""
    return ExprPrinter()(e)


def _type_str(t: Tensor) -> str:
    return f"{t.dtype}[{', '.join(str(s) for s in t.shape)}]"


def tensor_lines(tensors: Iterable[Tensor], tensor_names: Namer = None) -> List[str]:
    """One line per tensor of the graph behind ``tensors``, producers first."""
    from .graph import topo_order
    names = tensor_names or Namer()
    lines = []
    for t in topo_order(list(tensors)):
        tname = names.name(t, t.name)
        if t.is_placeholder:
            lines.append(f"input {tname}: {_type_str(t)}")
            continue
        p = ExprPrinter(Namer(), names)
        note = f"  [fallback: {t.op.note}]" if getattr(t.op, "note", None) else ""
        if isinstance(t.op, ScatterOp):
            lines.append(f"{tname} = 0; {scatter_text(tname, t.op, p)}    # {_type_str(t)}{note}")
        else:
            lines.append(f"{tname}{op_header(t.op, p)} = {p(t.op.body)}    # {_type_str(t)}{note}")
    return lines


def scatter_text(name: str, op: ScatterOp, p: ExprPrinter) -> str:
    """``T[idx] += value for r in range(...) ... if cond``."""
    loops = " ".join(f"for {p(ax)} in range({_range_text(ax, p)})" for ax in op.axes)
    where = f" if {p(op.where)}" if op.where is not None else ""
    return f"{name}[{', '.join(p(i) for i in op.indices)}] += {p(op.value)} {loops}{where}"


def _range_text(ax, p: ExprPrinter) -> str:
    if isinstance(ax.lo, Const) and ax.lo.value == 0:
        return p(ax.hi)
    return f"{p(ax.lo)}, {p(ax.hi)}"


def op_header(op: ComputeOp, p: ExprPrinter) -> str:
    if not op.axes:
        return ""
    return "[" + ", ".join(p(a) for a in op.axes) + "]"


@deep_entry
def show(tensors: Union[Tensor, Iterable[Tensor]]) -> str:
    """The formulas of ``tensors`` and of everything they depend on, one line each."""
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    return "\n".join(tensor_lines(tensors))


def show_html(tensors) -> str:
    return "<pre>" + html.escape(show(tensors)) + "</pre>"


# The IR core does not import its printer: the printer installs the text form of every
# expression node (``repr`` and ``str``) when it is loaded, which the package does first.
Expr.__repr__ = Expr.__str__ = expr_to_str
