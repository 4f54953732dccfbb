"""te_grad expressions as sympy expressions: LaTeX for notebooks, and the symbolic derivative checks.

:func:`to_sympy` translates a scalar expression (reads become indexed symbols,
index variables integer symbols, reductions ``Sum`` / ``Product`` / a max or min
over a range); :func:`latex` renders tensors as LaTeX equations, which is what
``Tensor._repr_latex_`` shows in Jupyter. ``tests/core/test_ops.py`` checks every
derivative rule of :mod:`te_grad.ops` against sympy's own derivative of the same
function. sympy is imported here only, when one of these is called.
"""
from __future__ import annotations

from typing import Dict, Iterable, Union

from . import ops
from .errors import InternalError
from .graph import topo_order
from .ir import (Binary, Call, Cast, Compare, ComputeOp, Const, Expr, Read, Reduce, ScatterOp, Select,
                 Tensor, Unary, Var)
from .printer import Namer


def _sympy():
    import sympy
    return sympy


def _reduce_class(kind: str):
    """A sympy function printing as ``\\max_{k=lo}^{hi} body`` (sympy has no max over a range)."""
    sp = _sympy()

    def _latex(self, printer):
        body, var, lo, hi = self.args
        return (rf"{ops.combiner(kind).latex}_{{{printer._print(var)}={printer._print(lo)}}}"
                rf"^{{{printer._print(hi)}}} {printer._print(body)}")

    return type(f"Reduce_{kind}", (sp.Function,), {"_latex": _latex, "nargs": 4})


class _Translator:
    def __init__(self, names: Namer = None, tensor_names: Namer = None):
        self.sp = _sympy()
        self.vars = names or Namer()
        self.tensors = tensor_names or Namer()
        self.symbols: Dict[int, object] = {}

    def __call__(self, e: Expr):
        method = getattr(self, "t_" + type(e).__name__, None)
        if method is None:
            raise InternalError(f"no sympy translation for {type(e).__name__}")
        return method(e)

    def t_Const(self, e: Const):
        if e.dtype == "bool":
            return self.sp.true if e.value else self.sp.false
        if isinstance(e.value, float):
            return self.sp.Float(e.value) if e.value not in (0.5, 1.0, 2.0, -1.0) else self.sp.nsimplify(e.value)
        return self.sp.Integer(e.value)

    def t_Var(self, e: Var):
        sym = self.symbols.get(id(e))
        if sym is None:
            sym = self.symbols[id(e)] = self.sp.Symbol(self.vars.name(e, e.name), integer=True)
        return sym

    t_ReduceAxis = t_Var

    def t_Read(self, e: Read):
        name = self.tensors.name(e.tensor, e.tensor.name)
        if not e.indices:
            return self.sp.Symbol(name)
        return self.sp.IndexedBase(name)[tuple(self(i) for i in e.indices)]

    def t_Binary(self, e: Binary):
        sp = self.sp
        a, b = self(e.a), self(e.b)
        return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "div": lambda: a / b,
                "pow": lambda: a ** b, "floordiv": lambda: sp.floor(a / b), "floormod": lambda: sp.Mod(a, b),
                "min": lambda: sp.Min(a, b), "max": lambda: sp.Max(a, b), "and": lambda: sp.And(a, b),
                "or": lambda: sp.Or(a, b)}[e.op]()

    def t_Unary(self, e: Unary):
        a = self(e.a)
        return -a if e.op == "neg" else self.sp.Not(a)

    def t_Compare(self, e: Compare):
        sp = self.sp
        cls = {"lt": sp.Lt, "le": sp.Le, "gt": sp.Gt, "ge": sp.Ge, "eq": sp.Eq, "ne": sp.Ne}[e.op]
        return cls(self(e.a), self(e.b), evaluate=False)

    def t_Select(self, e: Select):
        return self.sp.Piecewise((self(e.t), self(e.cond)), (self(e.f), True))

    def t_Call(self, e: Call):
        return sympy_function(e.name)(*[self(a) for a in e.args])

    def t_Cast(self, e: Cast):
        return self(e.a)  # a conversion of dtype: the same value (up to rounding)

    def t_Reduce(self, e: Reduce):
        sp = self.sp
        body = self(e.body)
        if e.where is not None:
            identity = ops.reduction(e.combiner).value_identity(e.body.dtype)  # no candidate there
            body = sp.Piecewise((body, self(e.where)), (sp.sympify(identity), True))
        for ax in reversed(e.axes):
            var, lo, hi = self(ax), self(ax.lo), self(ax.hi) - 1
            if e.combiner == "sum":
                body = sp.Sum(body, (var, lo, hi))
            elif e.combiner == "prod":
                body = sp.Product(body, (var, lo, hi))
            else:
                body = _reduce_class(e.combiner)(body, var, lo, hi)
        return body


def sympy_function(name: str):
    """The sympy function of intrinsic ``name`` (from its record in :mod:`te_grad.ops`)."""
    sp = _sympy()
    spec = ops.intrinsic(name).sympy
    if spec is None:
        return sp.Function(name)
    if callable(spec):
        return lambda *args: spec(sp, *args)
    return getattr(sp, spec)


def to_sympy(e: Expr):
    """``e`` as a sympy expression."""
    return _Translator()(e)


def latex(tensors: Union[Tensor, Iterable[Tensor]], dependencies: bool = True) -> str:
    """The formulas of ``tensors`` (and of what they depend on) as LaTeX, one equation a line."""
    sp = _sympy()
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    names = Namer()
    lines = []
    for t in topo_order(tensors) if dependencies else tensors:
        name = names.name(t, t.name)
        if t.is_placeholder:
            continue
        tr = _Translator(Namer(), names)
        if isinstance(t.op, ComputeOp):
            lhs = sp.IndexedBase(name)[tuple(tr(a) for a in t.op.axes)] if t.op.axes else sp.Symbol(name)
            lines.append(f"{sp.latex(lhs)} = {sp.latex(tr(t.op.body))}")
        elif isinstance(t.op, ScatterOp):
            op = t.op
            lhs = sp.IndexedBase(name)[tuple(tr(i) for i in op.indices)]
            ranges = r",\ ".join(rf"{sp.latex(tr(ax))} \in [{sp.latex(tr(ax.lo))}, {sp.latex(tr(ax.hi))})"
                                 for ax in op.axes)
            lines.append(rf"{sp.latex(lhs)} \mathrel{{+}}= {sp.latex(tr(op.value))} \quad ({ranges})")
    return r" \\ ".join(lines)
