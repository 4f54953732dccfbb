"""Folding constructors for building derivative expressions.

They behave like the DSL operators but drop the identities that derivative
rules produce everywhere (``x * 1``, ``0 + x``, ``x * 0``, ``--x``), so
gradients print readably. Folding ``x * 0`` to ``0`` is exact here because
these expressions are formed from finite partials; a NaN in ``x`` could only
come from the forward computation, whose own gradient keeps it.
"""
from .. import dsl
from ..ir import Const, Expr, Unary


def is_const(e, value) -> bool:
    return isinstance(e, Const) and e.value == value


def zero(dtype: str) -> Const:
    return dsl.const(0, dtype)


def add(a: Expr, b: Expr) -> Expr:
    if is_const(a, 0):
        return dsl.cast(b.dtype, b) if isinstance(b, Expr) else dsl.as_expr(b)
    if is_const(b, 0):
        return a
    if isinstance(b, Unary) and b.op == "neg":
        return sub(a, b.a)
    return a + b


def sub(a: Expr, b: Expr) -> Expr:
    if is_const(b, 0):
        return a
    if is_const(a, 0):
        return neg(b)
    return a - b


def neg(a: Expr) -> Expr:
    if isinstance(a, Unary) and a.op == "neg":
        return a.a
    if isinstance(a, Const):
        return dsl.const(-a.value, a.dtype)
    return -a


def mul(a: Expr, b: Expr) -> Expr:
    a, b = dsl.as_expr(a, getattr(b, "dtype", None)), dsl.as_expr(b, getattr(a, "dtype", None))
    if is_const(a, 0) or is_const(b, 0):
        return zero(dsl.binary("mul", a, b).dtype)
    if is_const(a, 1):
        return b
    if is_const(b, 1):
        return a
    if is_const(a, -1):
        return neg(b)
    if is_const(b, -1):
        return neg(a)
    if isinstance(a, Unary) and a.op == "neg":
        return neg(mul(a.a, b))
    if isinstance(b, Unary) and b.op == "neg":
        return neg(mul(a, b.a))
    return a * b


def div(a: Expr, b: Expr) -> Expr:
    if is_const(b, 1):
        return a
    if is_const(a, 0):
        return a
    return a / b
