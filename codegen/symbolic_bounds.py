"""Proofs about loops whose bounds are known only at run time (size variables, ``tg.var``).

:func:`symbolic_inside` proves an index in ``[0, n)`` for every value of the sizes when the
loop bounds around it and the extent ``n`` are affine in size variables;
:func:`speculatable_within` is :func:`te_grad.intervals.speculatable` with that proof as a
fallback (the scheduling passes' and the emitter's test that an expression may be evaluated
at every point of the loops, e.g. at every lane of a vector).
"""
from __future__ import annotations

from fractions import Fraction
from typing import Dict, Optional, Tuple

from te_grad import dtypes
from te_grad.ir import distinct_reads
from te_grad.intervals import has_variable_int_division, interval
from te_grad.ir import Binary, Cast, Const, Expr, SizeVar, Unary, Var

from .loopir import Stage, stmt_exprs, tensors_of


#: an affine form in size variables: ``{size variable or None (the constant): coefficient}``
Form = Dict[object, Fraction]


def _combine(a: Form, b: Form, c=1) -> Form:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + c * v
    return out


def _scale(a: Form, c) -> Form:
    return {k: v * c for k, v in a.items()}


def _constant(a: Form):
    return a.get(None, 0) if all(k is None or v == 0 for k, v in a.items()) else None


def extremes(e: Expr, bounds: Dict[int, tuple], depth: int = 0) -> Optional[Tuple[Form, Form]]:
    """``(least, most)``: affine forms in size variables between which integer ``e`` lies for
    every value of the sizes, each loop variable ``v`` of ``e`` in ``[lo, hi)`` with
    ``bounds[id(v)] = (lo, hi)`` (bounds may use outer loop variables); None if ``e`` is not
    built from constants, sizes and loop variables by ``+ - *`` by a constant and ``//`` by a
    positive constant."""
    if depth > 64:
        return None
    if isinstance(e, Const):
        if not dtypes.is_int(e.dtype):
            return None
        f = {None: Fraction(int(e.value))}
        return f, f
    if isinstance(e, SizeVar):
        f = {e: Fraction(1)}
        return f, f
    if isinstance(e, Var):
        got = bounds.get(id(e))
        if got is None:
            return None
        lo, hi = extremes(got[0], bounds, depth + 1), extremes(got[1], bounds, depth + 1)
        if lo is None or hi is None:
            return None
        return lo[0], _combine(hi[1], {None: Fraction(-1)})
    if isinstance(e, Cast):
        return extremes(e.a, bounds, depth + 1) if dtypes.is_int(e.dtype) and dtypes.is_int(e.a.dtype) else None
    if isinstance(e, Unary) and e.op == "neg":
        a = extremes(e.a, bounds, depth + 1)
        return None if a is None else (_scale(a[1], -1), _scale(a[0], -1))
    if not isinstance(e, Binary) or e.op not in ("add", "sub", "mul", "floordiv"):
        return None
    a, b = extremes(e.a, bounds, depth + 1), extremes(e.b, bounds, depth + 1)
    if a is None or b is None:
        return None
    if e.op == "add":
        return _combine(a[0], b[0]), _combine(a[1], b[1])
    if e.op == "sub":
        return _combine(a[0], b[1], -1), _combine(a[1], b[0], -1)
    if e.op == "mul":
        if _constant(a[0]) is not None and a[0] == a[1]:
            a, b = b, a
        c = _constant(b[0])
        if c is None or b[0] != b[1]:
            return None
        return (_scale(a[0], c), _scale(a[1], c)) if c >= 0 else (_scale(a[1], c), _scale(a[0], c))
    c = _constant(b[0])  # floordiv: (A - (c - 1)) / c <= A // c <= A / c
    if c is None or b[0] != b[1] or c <= 0 or c.denominator != 1:
        return None
    least = {None: Fraction(0)} if _never_negative(a[0]) else _scale(_combine(a[0], {None: -(c - 1)}), 1 / c)
    return least, _scale(a[1], 1 / c)


def _never_negative(form: Form) -> bool:
    """Whether an affine form in size variables is >= 0 for every value of the sizes in their
    ranges (a sufficient test: no negative coefficient, >= 0 at the least sizes)."""
    total = form.get(None, 0)
    for k, c in form.items():
        if k is None or c == 0:
            continue
        if not isinstance(k, SizeVar) or c < 0:
            return False
        total += c * k.lo
    return total >= 0


def symbolic_inside(ix: Expr, n, bounds: Dict[int, tuple]) -> bool:
    """Whether index ``ix`` stays in ``[0, n)`` wherever it is evaluated, ``n`` an extent (int or
    size expression), each loop variable ``v`` of ``ix`` in ``[lo, hi)`` with ``bounds[id(v)] =
    (lo, hi)`` (:func:`extremes`): the proof of the reads of stages whose extents are known
    only at run time (the static proof in :mod:`simplify.bounds` does not see sizes yet)."""
    got = extremes(ix, bounds)
    extent = extremes(n, {}) if isinstance(n, Expr) else ({None: Fraction(int(n))},) * 2
    if got is None or extent is None:
        return False
    room = _combine(_combine(extent[0], {None: Fraction(-1)}), got[1], -1)
    return _never_negative(got[0]) and _never_negative(room)


def speculatable_within(e: Expr, ranges: Dict[int, tuple], bounds: Optional[Dict[int, tuple]] = None) -> bool:
    """True if ``e`` can be evaluated at every point of the loops: each read's index in bounds
    by the int ``ranges`` (inclusive) of the loop variables, or, for every value of the sizes,
    by the ``bounds`` (``(lo, hi)`` expressions) of the loops (:func:`symbolic_inside`); no
    integer division by a non-constant or by zero."""
    for r in distinct_reads(e):
        for ix, n in zip(r.indices, r.tensor.shape):
            iv = interval(ix, ranges)
            if iv is not None and not isinstance(n, Expr) and iv[0] >= 0 and iv[1] < n:
                continue
            if bounds is not None and symbolic_inside(ix, n, bounds):
                continue
            return False
    return not has_variable_int_division(e)


def stage_size_vars(stage: Stage) -> Dict[int, SizeVar]:
    """The size variables ``stage`` uses (in its loops and expressions, and in the shapes of
    its buffers), by id."""
    from te_grad.sizes import size_vars_in
    found: Dict[int, SizeVar] = {}
    for e in list(stmt_exprs(stage.body)) + [n for t in tensors_of(stage) for n in t.shape]:
        for v in size_vars_in(e):
            found.setdefault(id(v), v)
    return found
