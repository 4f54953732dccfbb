"""Interval analysis of integer index expressions over variable ranges.

``interval(e, ranges)`` bounds an integer expression when each variable lies in a
known range. The differentiator uses it for the box outside which an adjoint is
structurally zero; the native backend to decide that a read is in bounds at every
point of its loops whatever the guards around it say, so both branches of an
``if_then_else`` may be evaluated (a ``select``, which vectorizes) instead of
branching.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from .graph import reads_in
from .ir import Binary, Cast, Const, Expr, ReduceAxis, Unary, Var

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
    for r in reads_in(e):
        for ix, n in zip(r.indices, r.tensor.shape):
            iv = interval(ix, ranges)
            if iv is None or iv[0] < 0 or iv[1] >= n:
                return False
    return not _has_variable_int_division(e)


def _has_variable_int_division(e: Expr) -> bool:
    if isinstance(e, Binary) and e.op in ("floordiv", "floormod") and \
            (not isinstance(e.b, Const) or e.b.value == 0):
        return True
    return any(_has_variable_int_division(c) for c in e.children())
