"""Interval analysis of integer index expressions over variable ranges.

``interval(e, ranges)`` bounds an integer expression when each variable lies in a
known range. The differentiator uses it for the box outside which an adjoint is
structurally zero; the native backend to decide that a read is in bounds at every
point of its loops whatever the guards around it say, so both branches of an
``if_then_else`` may be evaluated (a ``select``, which vectorizes) instead of
branching.

``index_values(e, env)`` gives the exact values of an integer index expression at
points (``env`` binds each variable to a numpy integer array; the arrays broadcast):
integer ``+ - * // %``, ``min``, ``max``, comparisons, ``and``/``or``/``not``,
``if_then_else`` and integer casts, in each node's dtype (``//`` and ``%`` floor like
Python's). It is what the scheduler probes reduce bounds with and the
iteration counter enumerates loop nests with; anything else (a read, a float, an
intrinsic) is :class:`NotAnIndex`.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from .ir import distinct_nodes, distinct_reads
from .ir import Binary, Cast, Compare, Const, Expr, ReduceAxis, Select, SizeVar, Unary, Var

Interval = Optional[Tuple[int, int]]


def interval(e: Expr, ranges: Dict[int, Tuple[int, int]]) -> Interval:
    """Inclusive bounds of integer ``e`` when each variable ``v`` lies in ``ranges[id(v)]``, or None."""
    if isinstance(e, Const):
        return (int(e.value), int(e.value)) if not isinstance(e.value, float) else None
    if isinstance(e, Var):
        got = ranges.get(id(e))
        if got is None and isinstance(e, ReduceAxis) and e.lo is not None:
            lo, hi = interval(e.lo, ranges), interval(e.hi, ranges)
            if lo is not None and hi is not None and lo[0] <= hi[1] - 1:
                return lo[0], hi[1] - 1
        return got
    if isinstance(e, Cast):
        return interval(e.a, ranges) if e.dtype.startswith("int") and e.a.dtype.startswith("int") else None
    if isinstance(e, Unary) and e.op == "neg":
        a = interval(e.a, ranges)
        return None if a is None else (-a[1], -a[0])
    if not isinstance(e, Binary):
        return None
    a, b = interval(e.a, ranges), interval(e.b, ranges)
    if a is None or b is None:
        return None
    if e.op == "add":
        return a[0] + b[0], a[1] + b[1]
    if e.op == "sub":
        return a[0] - b[1], a[1] - b[0]
    if e.op == "mul":
        corners = [x * y for x in a for y in b]
        return min(corners), max(corners)
    if e.op == "min":
        return min(a[0], b[0]), min(a[1], b[1])
    if e.op == "max":
        return max(a[0], b[0]), max(a[1], b[1])
    if e.op in ("floordiv", "floormod") and b[0] == b[1] and b[0] > 0:
        c = b[0]
        if e.op == "floordiv":
            return a[0] // c, a[1] // c
        return (0, c - 1) if a[1] - a[0] + 1 >= c or a[0] // c != a[1] // c else (a[0] % c, a[1] % c)
    return None


def speculatable(e: Expr, ranges: Dict[int, Tuple[int, int]]) -> bool:
    """True if ``e`` can be evaluated at every point of the loops: reads provably in bounds,
    no integer division by a non-constant or by zero (floats never trap)."""
    for r in distinct_reads(e):
        for ix, n in zip(r.indices, r.tensor.shape):
            iv = interval(ix, ranges)
            if iv is None or isinstance(n, Expr) or iv[0] < 0 or iv[1] >= n:  # an extent known at run time: unproven
                return False
    return not _has_variable_int_division(e)


def has_variable_int_division(e: Expr) -> bool:
    """Whether ``e`` divides integers by a non-constant or by zero (which may trap)."""
    return _has_variable_int_division(e)


def _has_variable_int_division(e: Expr) -> bool:
    return any(isinstance(x, Binary) and x.op in ("floordiv", "floormod") and
               (not isinstance(x.b, Const) or x.b.value == 0) for x in distinct_nodes(e))


class NotAnIndex(Exception):
    """Raised by :func:`index_values` for an expression that is not integer index arithmetic
    (a read, a float, an intrinsic, a reduction, an unbound variable, a division by zero)."""


_INDEX_TYPES = ("bool", "int32", "int64")
_INT_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "min": np.minimum, "max": np.maximum,
               "floordiv": np.floor_divide, "floormod": np.remainder,
               "and": np.logical_and, "or": np.logical_or}
_INT_COMPARE = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
                "eq": np.equal, "ne": np.not_equal}


def index_values(e: Expr, env: Dict[int, np.ndarray]) -> np.ndarray:
    """The values of integer (or boolean) ``e`` where each variable ``v`` takes the values
    ``env[id(v)]`` (numpy arrays that broadcast together), in ``e``'s dtype; raises
    :class:`NotAnIndex` for anything but index arithmetic (see the module docstring).
    Both branches of an ``if_then_else`` are computed, so a division by zero anywhere is
    refused (:class:`NotAnIndex`) rather than guessed."""
    if e.dtype not in _INDEX_TYPES:
        raise NotAnIndex(f"a {e.dtype} expression")
    if isinstance(e, Const):
        out = np.asarray(e.value)
    elif isinstance(e, (Var, SizeVar)):  # also ReduceAxis
        try:
            out = np.asarray(env[id(e)])
        except KeyError:
            raise NotAnIndex(f"{'size' if isinstance(e, SizeVar) else 'variable'} {e.name} is not bound") from None
    elif isinstance(e, Binary) and e.op in _INT_BINARY:
        a, b = index_values(e.a, env), index_values(e.b, env)
        if e.op in ("floordiv", "floormod") and np.any(b == 0):
            raise NotAnIndex("an integer division by zero")
        out = _INT_BINARY[e.op](a, b)
    elif isinstance(e, Unary):
        a = index_values(e.a, env)
        out = np.negative(a) if e.op == "neg" else np.logical_not(a)
    elif isinstance(e, Compare):
        out = _INT_COMPARE[e.op](index_values(e.a, env), index_values(e.b, env))
    elif isinstance(e, Select):
        out = np.where(index_values(e.cond, env), index_values(e.t, env), index_values(e.f, env))
    elif isinstance(e, Cast):
        out = index_values(e.a, env)
    else:
        raise NotAnIndex(f"a {type(e).__name__} node")
    return out.astype(e.dtype, copy=False)


def is_index_expr(e: Expr) -> bool:
    """True if :func:`index_values` can evaluate ``e`` (variables bound), structurally."""
    if e.dtype not in _INDEX_TYPES:
        return False
    if isinstance(e, (Const, Var, SizeVar)):
        return True
    if isinstance(e, Binary):
        return e.op in _INT_BINARY and is_index_expr(e.a) and is_index_expr(e.b)
    if isinstance(e, (Unary, Compare, Select, Cast)):
        return all(is_index_expr(c) for c in e.children())
    return False


def grid_values(e: Expr, axes, shape) -> Optional[np.ndarray]:
    """``e`` at every point of the grid ``axes`` (variables) x ``shape`` (extents), as an
    int64 array of that shape, or None if ``e`` is not an index expression of those axes."""
    env = {id(a): np.arange(n, dtype=np.int64).reshape([n if d == k else 1 for d in range(len(shape))])
           for k, (a, n) in enumerate(zip(axes, shape))}
    try:
        got = index_values(e, env)
    except NotAnIndex:
        return None
    return np.array(np.broadcast_to(got.astype(np.int64, copy=False), tuple(shape)))
