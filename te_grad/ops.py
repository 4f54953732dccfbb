"""The op table: everything te_grad knows about each scalar function and reduction, in one record.

Every stage reads these records instead of keeping its own table: the DSL
builds the user-facing functions from them (name, arity, docstring, dtype
rule), the reference evaluator the numpy lowering, the printers the name, the
symbolic checks the sympy name, and the native backend the C math library
symbol or LLVM intrinsic. Adding a function means adding one :class:`Intrinsic`
here and its derivative rule in :mod:`te_grad.autodiff.rules`
(``INTRINSIC_RULES``); a completeness test (``tests/core/test_ops.py``) checks that
every stage can handle every record, so a missing piece is an error where the
op is defined, not a ``KeyError`` deep in a pipeline.

Reductions are :class:`Reduction` records in :data:`REDUCTIONS` (``Reduce.combiner``
names one): the facts every layer needs (identity per dtype, how two values
combine, whether the combine is idempotent or selects one of its operands, how
LLVM lowers it). Behaviour that belongs to a layer (the emitter's instructions,
the derivative's seed) lives in that layer, in one table keyed by the record's name.

This module holds facts only: it imports nothing of te_grad above
:mod:`te_grad.dtypes` and :mod:`te_grad.errors`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from . import dtypes
from .errors import InternalError, UserError

_erf = np.frompyfunc(math.erf, 1, 1)


def _np_erf(x):
    return np.asarray(_erf(x)).astype(np.asarray(x).dtype)  # a 0-d input gives a Python float


def _np_sigmoid(x):
    """The logistic function, to a few ulps in both tails: with ``e = exp(-|x|)`` (in (0, 1], no
    overflow), ``sigmoid(|x|) = 1 / (1 + e)`` and ``sigmoid(-|x|) = e / (1 + e)``. (The
    ``0.5 (tanh(x/2) + 1)`` form cancels for negative ``x``: 1.7e-4 relative error at -30, and 0
    from -37.5, so ``log(sigmoid(-40))`` was ``-inf``.)"""
    x = np.asarray(x)
    e = np.exp(-np.abs(x))
    r = 1.0 / (1.0 + e)
    return np.where(x >= 0, r, e * r)  # NaN fails ``x >= 0`` and stays NaN through ``e * r``


@dataclass(frozen=True)
class Intrinsic:
    """A scalar function of float arguments (``tg.exp``, ``tg.atan2``, ...).

    - ``numpy``: the evaluator's lowering (elementwise on arrays);
    - ``math``: the derivative rule in words (the rule itself is
      :data:`te_grad.autodiff.rules.INTRINSIC_RULES` ``[name]``);
    - ``c_name``: the C99 ``<math.h>`` function (``f`` suffix for float32) the native
      backend calls when it has no inline or LLVM lowering; ``llvm``: the LLVM intrinsic
      (``llvm.exp``) that lowers it directly, if any;
    - ``sympy``: the function's name in sympy (or a lambda of sympy arguments), for the
      symbolic derivative checks and LaTeX;
    - ``domain``: an open interval of arguments where the function is smooth, for tests
      and the random-program tester;
    - ``latex``: the LaTeX operator name;
    - ``cheap``: about one instruction, so a backward pass recomputes it rather than
      saving its result (:mod:`te_grad.residuals`).
    """
    name: str
    arity: int
    doc: str
    numpy: Callable
    math: str
    sympy: object
    c_name: Optional[str] = None
    llvm: Optional[str] = None
    domain: Tuple[float, float] = (-3.0, 3.0)
    latex: Optional[str] = None
    cheap: bool = False

    def result_dtype(self, arg_dtypes: Sequence[str]) -> str:
        """Float arguments promote; integer arguments become ``float32`` (as in JAX)."""
        floats = [d for d in arg_dtypes if dtypes.is_float(d)]
        return max(floats, key=dtypes.DTYPES.index) if floats else dtypes.DEFAULT_FLOAT


INTRINSICS: Dict[str, Intrinsic] = {}


def _add(op: Intrinsic):
    INTRINSICS[op.name] = op


_add(Intrinsic("exp", 1, "The exponential e**x.", np.exp,
               "d exp(x) = exp(x) dx", "exp", "exp", "llvm.exp", latex=r"\exp"))
_add(Intrinsic("log", 1, "The natural logarithm (nan below 0, -inf at 0).", np.log,
               "d log(x) = dx / x", "log", "log", "llvm.log", (0.1, 4.0), latex=r"\log"))
_add(Intrinsic("sqrt", 1, "The square root (nan below 0).", np.sqrt,
               "d sqrt(x) = dx / (2 sqrt(x))", "sqrt", "sqrt", "llvm.sqrt", (0.1, 4.0)))
_add(Intrinsic("tanh", 1, "The hyperbolic tangent.", np.tanh,
               "d tanh(x) = (1 - tanh(x)^2) dx", "tanh", "tanh", latex=r"\tanh"))
_add(Intrinsic("sigmoid", 1, "The logistic function 1 / (1 + exp(-x)).", _np_sigmoid,
               "d sigmoid(x) = sigmoid(x) (1 - sigmoid(x)) dx",
               lambda s, x: 1 / (1 + s.exp(-x)), latex=r"\sigma"))
_add(Intrinsic("abs", 1, "The absolute value (keeps integer dtypes).", np.abs,
               "d |x| = sign(x) dx, with sign(0) = 0", "Abs", "fabs", "llvm.fabs",
               latex=r"\operatorname{abs}", cheap=True))
_add(Intrinsic("sin", 1, "The sine.", np.sin,
               "d sin(x) = cos(x) dx", "sin", "sin", "llvm.sin", latex=r"\sin"))
_add(Intrinsic("cos", 1, "The cosine.", np.cos,
               "d cos(x) = -sin(x) dx", "cos", "cos", "llvm.cos", latex=r"\cos"))
_add(Intrinsic("erf", 1, "The error function.", _np_erf,
               "d erf(x) = 2 / sqrt(pi) exp(-x^2) dx", "erf", "erf", latex=r"\operatorname{erf}"))
_add(Intrinsic("asin", 1, "The arcsine (nan outside [-1, 1]).", np.arcsin,
               "d asin(x) = dx / sqrt(1 - x^2)", "asin", "asin", domain=(-0.9, 0.9), latex=r"\arcsin"))
_add(Intrinsic("acos", 1, "The arccosine (nan outside [-1, 1]).", np.arccos,
               "d acos(x) = -dx / sqrt(1 - x^2)", "acos", "acos", domain=(-0.9, 0.9), latex=r"\arccos"))
_add(Intrinsic("atan", 1, "The arctangent.", np.arctan,
               "d atan(x) = dx / (1 + x^2)", "atan", "atan", latex=r"\arctan"))
_add(Intrinsic("atan2", 2, "The angle of the point (x, y): atan2(y, x), in (-pi, pi].", np.arctan2,
               "d atan2(a, b) = (b da - a db) / (a^2 + b^2)", "atan2", "atan2", domain=(0.2, 3.0),
               latex=r"\operatorname{atan2}"))
_add(Intrinsic("log1p", 1, "log(1 + x), accurate for small x.", np.log1p,
               "d log1p(x) = dx / (1 + x)",
               lambda s, x: s.log(1 + x), "log1p", domain=(-0.5, 3.0), latex=r"\operatorname{log1p}"))
_add(Intrinsic("expm1", 1, "exp(x) - 1, accurate for small x.", np.expm1,
               "d expm1(x) = exp(x) dx = (expm1(x) + 1) dx",
               lambda s, x: s.exp(x) - 1, "expm1", latex=r"\operatorname{expm1}"))
for _name, _np_fn, _doc in (("floor", np.floor, "The largest integer value <= x (as a float)."),
                            ("ceil", np.ceil, "The smallest integer value >= x (as a float)."),
                            ("trunc", np.trunc, "x rounded toward zero (as a float)."),
                            ("round", np.rint, "x rounded to the nearest integer, halves to even.")):
    _add(Intrinsic(_name, 1, _doc, _np_fn, f"{_name} is piecewise constant: zero derivative",
                   {"floor": "floor", "ceil": "ceiling", "trunc": "trunc", "round": None}[_name],
                   None if _name == "round" else _name,
                   "llvm.roundeven" if _name == "round" else f"llvm.{_name}",
                   latex=rf"\operatorname{{{_name}}}", cheap=True))
_add(Intrinsic("stop_gradient", 1,
               "x, with a zero derivative (JAX's lax.stop_gradient): for quantities the result does "
               "not depend on mathematically, such as the shift that keeps a softmax's exponentials "
               "from overflowing.", lambda x: x,
               "zero by definition: the user states the result does not depend on x",
               lambda s, x: x, latex=r"\operatorname{sg}", cheap=True))


def intrinsic(name: str) -> Intrinsic:
    """The record of intrinsic ``name`` (a UserError naming the known ones otherwise)."""
    op = INTRINSICS.get(name)
    if op is None:
        raise UserError(f"unknown intrinsic {name!r}; known: {', '.join(INTRINSICS)}")
    return op


# ---------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reduction:
    """A reduction kind (``tg.sum``, ``tg.argmax``, ...): facts only.

    - ``lowering``: how two values combine, for the native backend: ``"add"``, ``"mul"``, or
      ``"select"`` (keep the better of two by ``order``, NaN winning: max, min, argmax, argmin);
    - ``order``: for a selecting reduction, ``">"`` (the larger wins) or ``"<"``;
    - ``idempotent``: combining a value with itself gives it back (max, min): a point counted
      twice does not change the result;
    - ``selects``: the result is one of the combined values (or its index), so a gradient or
      a winner test compares values for exact equality;
    - ``indexed``: a (value, index) reduction: it combines pairs ``(body(k), k)`` and its result
      is the index of the winner (``int64``, ``-1`` over an empty domain); ties go to the
      smallest index, so the combine is a total order and any evaluation order gives the
      first occurrence, as numpy's ``argmax``. Indexed reductions run over one reduce axis.
    - ``ufunc``: the numpy function combining two values (the oracle's combine on numbers).
    """
    name: str
    doc: str
    ufunc: object
    latex: str
    lowering: str
    order: Optional[str] = None
    idempotent: bool = False
    selects: bool = False
    indexed: bool = False

    def value_identity(self, dtype: str):
        """The identity of the combined values of dtype ``dtype``."""
        if self.lowering == "add":
            return 0
        if self.lowering == "mul":
            return 1
        lowest = self.order == ">"
        if dtypes.is_float(dtype):
            return -np.inf if lowest else np.inf
        if dtype == dtypes.BOOL:
            return not lowest
        info = np.iinfo(dtype)
        return info.min if lowest else info.max

    def identity(self, dtype: str):
        """The result over an empty domain (``dtype`` is the result's dtype)."""
        return -1 if self.indexed else self.value_identity(dtype)

    def result_dtype(self, body_dtype: str) -> str:
        return dtypes.INDEX if self.indexed else body_dtype

    def combine(self, a, b):
        """Combine two values (numbers or arrays) as the kernels do: a NaN wins a selection.
        For an indexed reduction ``a`` and ``b`` are ``(value, index)`` pairs (index -1: none)."""
        if not self.indexed:
            return self.ufunc(a, b)  # np.maximum and np.minimum propagate NaN
        (va, ia), (vb, ib) = a, b
        b_wins = self.better(vb, ib, va, ia)
        return np.where(b_wins, vb, va), np.where(b_wins, ib, ia)

    def better(self, v, i, w, j):
        """True where the pair ``(v, i)`` beats ``(w, j)`` (index -1 is no pair): NaN first, then
        the value by ``order``, then the smaller index."""
        v, w, i, j = np.asarray(v), np.asarray(w), np.asarray(i), np.asarray(j)
        nan_v = np.isnan(v) if v.dtype.kind == "f" else np.zeros(v.shape, bool)
        nan_w = np.isnan(w) if w.dtype.kind == "f" else np.zeros(w.shape, bool)
        with np.errstate(invalid="ignore"):
            strictly = (v > w) if self.order == ">" else (v < w)
            equal = (v == w) | (nan_v & nan_w)
        wins = (nan_v & ~nan_w) | (~nan_v & ~nan_w & strictly) | (equal & (i < j))
        return (i >= 0) & ((j < 0) | wins)

    def reduce_pairs(self, values, indices, valid, axis):
        """``(value, index)`` of the winner along ``axis`` among the points where ``valid``."""
        values = np.asarray(values)
        ident = self.value_identity(values.dtype.name)
        nan = np.isnan(values) & valid if values.dtype.kind == "f" else np.zeros(values.shape, bool)
        has_nan = np.any(nan, axis=axis, keepdims=True)
        masked = np.where(valid & ~nan, values, ident)
        best = np.max(masked, axis=axis, keepdims=True) if self.order == ">" else \
            np.min(masked, axis=axis, keepdims=True)
        if values.dtype.kind == "f":
            best = np.where(has_nan, np.nan, best)
        hit = valid & (np.where(has_nan, nan, masked == best))
        big = np.iinfo(np.int64).max
        index = np.min(np.where(hit, indices, big), axis=axis)
        index = np.where(index == big, -1, index)
        return np.squeeze(best, axis=axis), index


REDUCTIONS: Dict[str, Reduction] = {r.name: r for r in (
    Reduction("sum", "Sum over the reduce axes (0 for an empty domain).", np.add, r"\sum", "add"),
    Reduction("prod", "Product over the reduce axes (1 for an empty domain).", np.multiply, r"\prod",
              "mul"),
    Reduction("max", "Maximum over the reduce axes (-inf, or the dtype's minimum, for an empty domain).",
              np.maximum, r"\max", "select", ">", idempotent=True, selects=True),
    Reduction("min", "Minimum over the reduce axes (+inf, or the dtype's maximum, for an empty domain).",
              np.minimum, r"\min", "select", "<", idempotent=True, selects=True),
    Reduction("argmax", "Index of the maximum along the reduce axis (int64; the first on ties, a NaN "
              "first of all, as numpy; -1 for an empty domain).", None, r"\operatorname{argmax}",
              "select", ">", idempotent=True, selects=True, indexed=True),
    Reduction("argmin", "Index of the minimum along the reduce axis (int64; the first on ties, a NaN "
              "first of all, as numpy; -1 for an empty domain).", None, r"\operatorname{argmin}",
              "select", "<", idempotent=True, selects=True, indexed=True),
)}

#: the former name of :data:`REDUCTIONS`
COMBINERS = REDUCTIONS


def reduction(name: str) -> Reduction:
    """The record of reduction kind ``name``."""
    op = REDUCTIONS.get(name)
    if op is None:
        raise InternalError(f"unknown reduction kind {name!r}; known: {', '.join(REDUCTIONS)}")
    return op


combiner = reduction


def identity_of(combiner_name: str, dtype: str):
    """The value of a ``combiner_name`` reduction of dtype ``dtype`` over an empty domain."""
    return reduction(combiner_name).identity(dtype)


# ---------------------------------------------------------------------------------------------
# binary arithmetic
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BinaryOp:
    """An arithmetic operator on two operands of one dtype: numpy lowering, printing, LaTeX.

    Derivative rules of the binary operators live in :mod:`te_grad.autodiff.rules`
    (``BINARY_RULES``), which the completeness test checks against this table."""
    name: str
    numpy: Callable
    symbol: Optional[str]  # the Python operator, or None for a function (minimum, maximum)
    precedence: int
    ints: bool = True      # defined on integers
    floats: bool = True    # defined on floats


BINARY_OPS: Dict[str, BinaryOp] = {op.name: op for op in (
    BinaryOp("add", np.add, "+", 8),
    BinaryOp("sub", np.subtract, "-", 8),
    BinaryOp("mul", np.multiply, "*", 9),
    BinaryOp("div", np.true_divide, "/", 9, ints=False),
    BinaryOp("floordiv", np.floor_divide, "//", 9, floats=False),
    BinaryOp("floormod", np.remainder, "%", 9, floats=False),
    BinaryOp("pow", np.power, "**", 11, ints=False),
    BinaryOp("min", np.minimum, None, 13),
    BinaryOp("max", np.maximum, None, 13),
)}
