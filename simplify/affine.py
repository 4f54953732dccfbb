"""Quasi-affine analysis: which index expressions and conditions isl can represent.

Quasi-affine means built from the given variables and integer constants with
``+``, ``-``, unary ``-``, multiplication by a constant, ``//`` and ``%`` by a
positive constant, ``minimum`` and ``maximum``; conditions are comparisons of
those combined with ``&``, ``|`` and ``~``. :func:`isl_expr` and
:func:`isl_cond` return isl syntax for such expressions and ``None`` for
anything else (a read of a tensor, a float, a product of two variables).

A size variable (:class:`te_grad.ir.SizeVar`) is an isl *parameter*: it is rendered as
:func:`size_param` of it (``_n`` for ``n``) unless ``names`` names it, and an
:class:`IslNames` records every size variable it renders, so that the caller can declare
them (with their constraints ``lo <= n <= hi``) in the isl set it builds
(:class:`simplify.isl_bridge.Domain` ``sizes=``).
"""
from __future__ import annotations

from typing import Dict, List, Optional

from te_grad import dtypes
from te_grad.graph import free_vars
from te_grad.ir import Binary, Cast, Compare, Const, Expr, Select, SizeVar, Unary, Var

_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=", "ne": "!="}
_NEGATED = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}


def size_param(v: SizeVar) -> str:
    """The isl name of the parameter standing for the size variable ``v`` (never one of the
    simplifier's own names, which do not start with ``_``)."""
    return "_" + v.name


class IslNames(dict):
    """``{id(variable): isl name}`` that also records the size variables rendered with it
    (``sizes``: isl name -> :class:`SizeVar`, in order of first use)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sizes: Dict[str, SizeVar] = {}

    def size_vars(self) -> List[SizeVar]:
        return list(self.sizes.values())


def constant_value(e: Expr) -> Optional[int]:
    """The integer value of ``e`` if it is a constant integer expression."""
    if isinstance(e, Const) and dtypes.is_int(e.dtype):
        return int(e.value)
    if isinstance(e, Cast) and dtypes.is_int(e.dtype) and dtypes.is_int(e.a.dtype):
        return constant_value(e.a)
    if isinstance(e, Unary) and e.op == "neg":
        v = constant_value(e.a)
        return None if v is None else -v
    if isinstance(e, Binary) and e.op in ("add", "sub", "mul", "floordiv", "floormod", "min", "max"):
        a, b = constant_value(e.a), constant_value(e.b)
        if a is None or b is None:
            return None
        if e.op in ("floordiv", "floormod") and b == 0:
            return None
        return {"add": a + b, "sub": a - b, "mul": a * b, "floordiv": a // b if b else None,
                "floormod": a % b if b else None, "min": min(a, b), "max": max(a, b)}[e.op]
    return None


def isl_expr(e: Expr, names: Dict[int, str]) -> Optional[str]:
    """isl syntax for the quasi-affine integer expression ``e`` (variables named by ``names``)."""
    c = constant_value(e)
    if c is not None:
        return str(c)
    if not dtypes.is_int(e.dtype):
        return None
    if isinstance(e, Var):
        return names.get(id(e))
    if isinstance(e, SizeVar):
        name = names.get(id(e))
        if name is None:
            name = size_param(e)
            if isinstance(names, IslNames):
                names.sizes.setdefault(name, e)
        return name
    if isinstance(e, Cast):
        return isl_expr(e.a, names) if dtypes.is_int(e.a.dtype) else None
    if isinstance(e, Unary) and e.op == "neg":
        a = isl_expr(e.a, names)
        return None if a is None else f"(-({a}))"
    if isinstance(e, Binary):
        if e.op in ("add", "sub"):
            a, b = isl_expr(e.a, names), isl_expr(e.b, names)
            if a is None or b is None:
                return None
            return f"({a} {'+' if e.op == 'add' else '-'} {b})"
        if e.op == "mul":
            ca, cb = constant_value(e.a), constant_value(e.b)
            if ca is None and cb is None:
                return None
            const, other = (ca, e.b) if ca is not None else (cb, e.a)
            o = isl_expr(other, names)
            return None if o is None else f"({const} * {o})"
        if e.op in ("floordiv", "floormod"):
            d = constant_value(e.b)
            a = isl_expr(e.a, names)
            if d is None or d <= 0 or a is None:
                return None
            return f"floor(({a}) / {d})" if e.op == "floordiv" else f"(({a}) mod {d})"
        if e.op in ("min", "max"):
            a, b = isl_expr(e.a, names), isl_expr(e.b, names)
            if a is None or b is None:
                return None
            return f"{e.op}({a}, {b})"
    if isinstance(e, Select):
        return None
    return None


def isl_cond(e: Expr, names: Dict[int, str], negate: bool = False) -> Optional[str]:
    """isl syntax for the quasi-affine condition ``e`` (or its negation)."""
    if isinstance(e, Const) and e.dtype == dtypes.BOOL:
        return "0 = 0" if bool(e.value) != negate else "1 = 0"
    if isinstance(e, Compare):
        if not (dtypes.is_int(e.a.dtype) and dtypes.is_int(e.b.dtype)):
            return None
        a, b = isl_expr(e.a, names), isl_expr(e.b, names)
        if a is None or b is None:
            return None
        op = _NEGATED[e.op] if negate else e.op
        return f"({a} {_CMP[op]} {b})"
    if isinstance(e, Unary) and e.op == "not":
        return isl_cond(e.a, names, not negate)
    if isinstance(e, Binary) and e.op in ("and", "or"):
        a, b = isl_cond(e.a, names, negate), isl_cond(e.b, names, negate)
        if a is None or b is None:
            return None
        joiner = "and" if (e.op == "and") != negate else "or"
        return f"({a} {joiner} {b})"
    return None


def local_names(e: Expr) -> Dict[int, str]:
    """isl names for ``e``'s own variables and sizes (``v0``, ``v1``, ...), to test it alone."""
    return {id(v): f"v{n}" for n, v in enumerate(free_vars(e))}


def decided(cond: Expr) -> bool:
    """True if ``cond`` is quasi-affine in its variables (no data, no float): what the static
    bounds proof (:mod:`simplify.bounds`) uses exactly, so the reads it guards were proven there."""
    return isl_cond(cond, local_names(cond)) is not None


def conjuncts(cond: Optional[Expr]) -> List[Expr]:
    """The operands of a chain of ``&`` (``[]`` for no condition)."""
    if cond is None:
        return []
    if isinstance(cond, Binary) and cond.op == "and":
        return conjuncts(cond.a) + conjuncts(cond.b)
    if isinstance(cond, Const) and cond.dtype == dtypes.BOOL and cond.value:
        return []
    return [cond]
