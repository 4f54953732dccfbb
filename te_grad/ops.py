"""The op table: everything te_grad knows about each scalar function and reduction, in one record.

Every stage reads these records instead of keeping its own table: the DSL
builds the user-facing functions from them (name, arity, docstring, dtype
rule), the differentiator takes the derivative rule, the reference evaluator
the numpy lowering, the printers the name, the symbolic checks the sympy
name, and the native backend the C math library symbol or LLVM intrinsic.
Adding a function means adding one :class:`Intrinsic` here; a completeness
test (``tests/core/test_ops.py``) checks that every stage can handle every record,
so a missing piece is an error where the op is defined, not a ``KeyError``
deep in a pipeline.

Derivative rules receive the argument expressions ``args`` and ``y``, an
expression for the function's own value (a read of a stored forward tensor
when there is one, so ``exp``, ``tanh``, ``sigmoid``, ``sqrt`` reuse the
result), and return one partial derivative per argument (``None`` for an
argument the function does not depend on differentiably). Each rule's
``math`` states it.
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
    - ``derivative``: ``(args, y) -> partials`` (see the module docstring), ``None`` when
      the derivative is zero everywhere it exists (``floor``, ``stop_gradient``);
    - ``math``: the derivative rule in words;
    - ``c_name``: the C99 ``<math.h>`` function (``f`` suffix for float32) the native
      backend calls when it has no inline or LLVM lowering; ``llvm``: the LLVM intrinsic
      (``llvm.exp``) that lowers it directly, if any;
    - ``sympy``: the function's name in sympy (or a lambda of sympy arguments), for the
      symbolic derivative checks and LaTeX;
    - ``domain``: an open interval of arguments where the function is smooth, for tests
      and the random-program tester;
    - ``latex``: the LaTeX operator name.
    """
    name: str
    arity: int
    doc: str
    numpy: Callable
    derivative: Optional[Callable]
    math: str
    sympy: object
    c_name: Optional[str] = None
    llvm: Optional[str] = None
    domain: Tuple[float, float] = (-3.0, 3.0)
    latex: Optional[str] = None

    def partials(self, args: Sequence, y) -> list:
        """The partial derivative with respect to each argument (``None``: zero)."""
        if self.derivative is None:
            return [None] * self.arity
        out = self.derivative(*args, y)
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        if len(out) != self.arity:
            raise InternalError(f"the derivative rule of {self.name} gives {len(out)} partials for "
                                f"{self.arity} arguments")
        return out

    def result_dtype(self, arg_dtypes: Sequence[str]) -> str:
        """Float arguments promote; integer arguments become ``float32`` (as in JAX)."""
        floats = [d for d in arg_dtypes if dtypes.is_float(d)]
        return max(floats, key=dtypes.DTYPES.index) if floats else dtypes.DEFAULT_FLOAT


def _dsl():
    from . import dsl  # the rules build expressions; dsl imports this module
    return dsl


def _sign(x, y):
    d = _dsl()
    return d.if_then_else(x > 0, 1.0, d.if_then_else(x < 0, -1.0, 0.0))


INTRINSICS: Dict[str, Intrinsic] = {}


def _add(op: Intrinsic):
    INTRINSICS[op.name] = op


_add(Intrinsic("exp", 1, "The exponential e**x.", np.exp,
               lambda x, y: y, "d exp(x) = exp(x) dx", "exp", "exp", "llvm.exp", latex=r"\exp"))
_add(Intrinsic("log", 1, "The natural logarithm (nan below 0, -inf at 0).", np.log,
               lambda x, y: 1.0 / x, "d log(x) = dx / x", "log", "log", "llvm.log", (0.1, 4.0),
               latex=r"\log"))
_add(Intrinsic("sqrt", 1, "The square root (nan below 0).", np.sqrt,
               lambda x, y: 0.5 / y, "d sqrt(x) = dx / (2 sqrt(x))", "sqrt", "sqrt", "llvm.sqrt",
               (0.1, 4.0)))
_add(Intrinsic("tanh", 1, "The hyperbolic tangent.", np.tanh,
               lambda x, y: 1.0 - y * y, "d tanh(x) = (1 - tanh(x)^2) dx", "tanh", "tanh",
               latex=r"\tanh"))
_add(Intrinsic("sigmoid", 1, "The logistic function 1 / (1 + exp(-x)).", _np_sigmoid,
               lambda x, y: y * (1.0 - y), "d sigmoid(x) = sigmoid(x) (1 - sigmoid(x)) dx",
               lambda s, x: 1 / (1 + s.exp(-x)), latex=r"\sigma"))
_add(Intrinsic("abs", 1, "The absolute value (keeps integer dtypes).", np.abs,
               _sign, "d |x| = sign(x) dx, with sign(0) = 0", "Abs", "fabs", "llvm.fabs",
               latex=r"\operatorname{abs}"))
_add(Intrinsic("sin", 1, "The sine.", np.sin,
               lambda x, y: _dsl().cos(x), "d sin(x) = cos(x) dx", "sin", "sin", "llvm.sin",
               latex=r"\sin"))
_add(Intrinsic("cos", 1, "The cosine.", np.cos,
               lambda x, y: -_dsl().sin(x), "d cos(x) = -sin(x) dx", "cos", "cos", "llvm.cos",
               latex=r"\cos"))
_add(Intrinsic("erf", 1, "The error function.", _np_erf,
               lambda x, y: (2.0 / math.sqrt(math.pi)) * _dsl().exp(-(x * x)),
               "d erf(x) = 2 / sqrt(pi) exp(-x^2) dx", "erf", "erf", latex=r"\operatorname{erf}"))
_add(Intrinsic("asin", 1, "The arcsine (nan outside [-1, 1]).", np.arcsin,
               lambda x, y: 1.0 / _dsl().sqrt(1.0 - x * x), "d asin(x) = dx / sqrt(1 - x^2)",
               "asin", "asin", domain=(-0.9, 0.9), latex=r"\arcsin"))
_add(Intrinsic("acos", 1, "The arccosine (nan outside [-1, 1]).", np.arccos,
               lambda x, y: -1.0 / _dsl().sqrt(1.0 - x * x), "d acos(x) = -dx / sqrt(1 - x^2)",
               "acos", "acos", domain=(-0.9, 0.9), latex=r"\arccos"))
_add(Intrinsic("atan", 1, "The arctangent.", np.arctan,
               lambda x, y: 1.0 / (1.0 + x * x), "d atan(x) = dx / (1 + x^2)", "atan", "atan",
               latex=r"\arctan"))
_add(Intrinsic("atan2", 2, "The angle of the point (x, y): atan2(y, x), in (-pi, pi].", np.arctan2,
               lambda a, b, y: [b / (a * a + b * b), -a / (a * a + b * b)],
               "d atan2(a, b) = (b da - a db) / (a^2 + b^2)", "atan2", "atan2", domain=(0.2, 3.0),
               latex=r"\operatorname{atan2}"))
_add(Intrinsic("log1p", 1, "log(1 + x), accurate for small x.", np.log1p,
               lambda x, y: 1.0 / (1.0 + x), "d log1p(x) = dx / (1 + x)",
               lambda s, x: s.log(1 + x), "log1p", domain=(-0.5, 3.0), latex=r"\operatorname{log1p}"))
_add(Intrinsic("expm1", 1, "exp(x) - 1, accurate for small x.", np.expm1,
               lambda x, y: y + 1.0, "d expm1(x) = exp(x) dx = (expm1(x) + 1) dx",
               lambda s, x: s.exp(x) - 1, "expm1", latex=r"\operatorname{expm1}"))
for _name, _np_fn, _doc in (("floor", np.floor, "The largest integer value <= x (as a float)."),
                            ("ceil", np.ceil, "The smallest integer value >= x (as a float)."),
                            ("trunc", np.trunc, "x rounded toward zero (as a float)."),
                            ("round", np.rint, "x rounded to the nearest integer, halves to even.")):
    _add(Intrinsic(_name, 1, _doc, _np_fn, None, f"{_name} is piecewise constant: zero derivative",
                   {"floor": "floor", "ceil": "ceiling", "trunc": "trunc", "round": None}[_name],
                   None if _name == "round" else _name,
                   "llvm.roundeven" if _name == "round" else f"llvm.{_name}",
                   latex=rf"\operatorname{{{_name}}}"))
_add(Intrinsic("stop_gradient", 1,
               "x, with a zero derivative (JAX's lax.stop_gradient): for quantities the result does "
               "not depend on mathematically, such as the shift that keeps a softmax's exponentials "
               "from overflowing.", lambda x: x, None,
               "zero by definition: the user states the result does not depend on x",
               lambda s, x: x, latex=r"\operatorname{sg}"))


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
class Combiner:
    """A reduction kind: its identity (the value over an empty domain), numpy ufunc, LaTeX."""
    name: str
    doc: str
    ufunc: object
    latex: str

    def identity(self, dtype: str):
        if self.name == "sum":
            return 0
        if self.name == "prod":
            return 1
        if dtypes.is_float(dtype):
            return -np.inf if self.name == "max" else np.inf
        if dtype == dtypes.BOOL:
            return self.name == "min"
        info = np.iinfo(dtype)
        return info.min if self.name == "max" else info.max


COMBINERS: Dict[str, Combiner] = {
    "sum": Combiner("sum", "Sum over the reduce axes (0 for an empty domain).", np.add, r"\sum"),
    "prod": Combiner("prod", "Product over the reduce axes (1 for an empty domain).", np.multiply,
                     r"\prod"),
    "max": Combiner("max", "Maximum over the reduce axes (-inf, or the dtype's minimum, for an "
                    "empty domain).", np.maximum, r"\max"),
    "min": Combiner("min", "Minimum over the reduce axes (+inf, or the dtype's maximum, for an "
                    "empty domain).", np.minimum, r"\min"),
}


def combiner(name: str) -> Combiner:
    op = COMBINERS.get(name)
    if op is None:
        raise InternalError(f"unknown reduction kind {name!r}")
    return op


def identity_of(combiner_name: str, dtype: str):
    """The value of a ``combiner_name`` reduction of dtype ``dtype`` over an empty domain."""
    return combiner(combiner_name).identity(dtype)


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
