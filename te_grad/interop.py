"""numpy meets a te_grad expression: what ``np.float32(2) * x`` builds and what ``np.exp(x)`` says.

An expression's ``__array_ufunc__`` hands a numpy ufunc here. A ufunc that is a Python
operator (``add``, ``less``, ...) with numpy scalars beside the expression builds IR as the
operator does; anything else (``np.exp(x)``, a numpy array in a formula) is a
:class:`~te_grad.errors.UserError` naming the te_grad function to write instead. Facts and
messages only: this module imports nothing of te_grad but its errors.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .errors import UserError

#: numpy ufuncs that are Python operators: (method when the expression is first, when second)
UFUNC_OPERATORS = {
    "add": ("__add__", "__radd__"), "subtract": ("__sub__", "__rsub__"), "multiply": ("__mul__", "__rmul__"),
    "true_divide": ("__truediv__", "__rtruediv__"), "divide": ("__truediv__", "__rtruediv__"),
    "floor_divide": ("__floordiv__", "__rfloordiv__"), "remainder": ("__mod__", "__rmod__"),
    "power": ("__pow__", "__rpow__"), "bitwise_and": ("__and__", "__rand__"),
    "bitwise_or": ("__or__", "__ror__"), "less": ("__lt__", "__gt__"), "less_equal": ("__le__", "__ge__"),
    "greater": ("__gt__", "__lt__"), "greater_equal": ("__ge__", "__le__"), "equal": ("__eq__", "__eq__"),
    "not_equal": ("__ne__", "__ne__"), "negative": ("__neg__", None), "positive": ("__pos__", None),
    "invert": ("__invert__", None),
}
#: what to write for a numpy function on an expression
NUMPY_FUNCTIONS = {
    "exp": "tg.exp(x)", "log": "tg.log(x)", "sqrt": "tg.sqrt(x)", "tanh": "tg.tanh(x)", "sin": "tg.sin(x)",
    "cos": "tg.cos(x)", "arcsin": "tg.asin(x)", "arccos": "tg.acos(x)", "arctan": "tg.atan(x)",
    "arctan2": "tg.atan2(y, x)", "log1p": "tg.log1p(x)", "expm1": "tg.expm1(x)", "absolute": "tg.abs(x)",
    "fabs": "tg.abs(x)", "abs": "tg.abs(x)", "maximum": "tg.maximum(a, b)", "fmax": "tg.maximum(a, b)",
    "minimum": "tg.minimum(a, b)", "fmin": "tg.minimum(a, b)", "floor": "tg.floor(x)", "ceil": "tg.ceil(x)",
    "trunc": "tg.trunc(x)", "rint": "tg.round(x)", "round": "tg.round(x)", "around": "tg.round(x)",
    "logical_not": "tg.logical_not(c) or ~c", "logical_and": "tg.all(a, b) or a & b",
    "logical_or": "tg.any(a, b) or a | b", "where": "tg.if_then_else(cond, a, b)",
    "clip": "tg.minimum(tg.maximum(x, low), high)", "square": "x * x", "reciprocal": "1.0 / x",
    "sum": "tg.sum(expr, axis=k) over a k = tg.reduce_axis((0, n))", "max": "tg.max(expr, axis=k)",
    "amax": "tg.max(expr, axis=k)", "min": "tg.min(expr, axis=k)", "amin": "tg.min(expr, axis=k)",
    "prod": "tg.prod(expr, axis=k)", "float_power": "tg.pow(a, b)", "sign": "tg.if_then_else(x > 0, 1.0, "
    "tg.if_then_else(x < 0, -1.0, 0.0))",
}


def numpy_call_message(what: str, expr, write: Optional[str]) -> str:
    hint = f"write {write}" if write else \
        "use te_grad's functions (tg.exp, tg.log, tg.sqrt, tg.maximum, tg.sum, ...: docs/API.md)"
    return (f"{what} on the te_grad expression {expr}: numpy functions compute on arrays and do not "
            f"build formulas; {hint}")


def numpy_ufunc(expr, ufunc, method, inputs, kwargs, expr_class):
    """A numpy ufunc with an expression among its operands (see ``Expr.__array_ufunc__``, which
    passes its own class as ``expr_class``)."""
    name = ufunc.__name__
    # numpy hands a numpy scalar over as a 0-d array for some operators (np.float32(2) < x)
    inputs = tuple(x[()] if isinstance(x, np.ndarray) and x.ndim == 0 else x for x in inputs)
    arrays = [x for x in inputs if isinstance(x, np.ndarray)]
    if arrays:
        a = arrays[0]
        raise UserError(
            f"np.{name} of a numpy array (shape {list(a.shape)}) and the te_grad expression {expr}: a "
            "formula reads te_grad tensors only; make the array a placeholder fed when the kernel runs "
            "(tg.placeholder(a.shape, name=...)) and read it element-wise, or a single number "
            "tg.const(float(value))")
    ops = UFUNC_OPERATORS.get(name)
    plain = all(isinstance(x, (expr_class, int, float, bool, np.generic)) for x in inputs)
    if method == "__call__" and ops is not None and not kwargs and plain:
        if isinstance(inputs[0], expr_class):
            return getattr(inputs[0], ops[0])(*inputs[1:])
        return getattr(inputs[1], ops[1])(inputs[0])
    what = f"np.{name}" if method == "__call__" else f"np.{name}.{method}"
    raise UserError(numpy_call_message(what, expr, NUMPY_FUNCTIONS.get(name)))
