"""Data equalities solved: a variable pinned by a value read from a tensor stops being a loop.

A ``where`` conjunct ``d == v + c`` (either side, ``c`` an integer constant, ``d`` an
integer expression that reads tensors and does not use ``v``) pins ``v`` to ``d - c``.
isl cannot see ``d`` (it reads data), so without this step ``v`` would stay a loop and
the conjunct a filter tested at each of its values: ``for i: for e: if dst[e] == i``,
quadratic for a COO graph aggregation.

- :func:`pinned_value` recognises such a conjunct;
- :func:`solve_reduction` removes the reduce axes a conjunct pins: ``v`` is replaced by
  ``d - c`` everywhere, and the conjunct by the range of ``v``,
  ``lo <= d - c < hi``: a value outside it selects no point, as before. Exact for every
  combiner whose value does not name the axis (sum, prod, max, min; not argmax/argmin,
  whose result is the position of the best point);
- :class:`SolveReductions` applies it to every reduction of an expression.

Pinned *output* variables (``y[i, j] = sum_e(... where dst[e] == i)``) make a scatter
instead: see :mod:`.scatter`.
"""
from __future__ import annotations

from typing import List, Optional

from te_grad import dsl, dtypes
from te_grad.graph import free_vars
from te_grad.ir import Binary, Compare, Const, Expr, Reduce, Var, reads_in
from te_grad.ops import identity_of, reduction
from te_grad.transform import substitute
from te_grad.visitor import Mutator

from .affine import conjuncts


def _offset(side: Expr, v: Var) -> Optional[int]:
    """``c`` if ``side`` is ``v + c`` (``v``, ``v + c``, ``c + v``, ``v - c``), else None."""
    if side is v:
        return 0
    if isinstance(side, Binary) and side.op in ("add", "sub"):
        a, b = side.a, side.b
        if a is v and isinstance(b, Const) and dtypes.is_int(b.dtype):
            return b.value if side.op == "add" else -b.value
        if side.op == "add" and b is v and isinstance(a, Const) and dtypes.is_int(a.dtype):
            return a.value
    return None


def pinned_value(cond: Expr, v: Var) -> Optional[Expr]:
    """``d - c`` (an index expression) if ``cond`` is ``d == v + c`` with ``d`` reading data and
    not using ``v``; else None (quasi-affine equalities are isl's)."""
    if not (isinstance(cond, Compare) and cond.op == "eq"):
        return None
    for side, other in ((cond.a, cond.b), (cond.b, cond.a)):
        c = _offset(side, v)
        if c is None or not dtypes.is_int(other.dtype) or not reads_in(other):
            continue
        if any(u is v for u in free_vars(other)):
            continue
        value = dsl.cast(dtypes.INDEX, other)
        return value - c if c else value
    return None


def in_range(value: Expr, lo, hi) -> List[Expr]:
    """The conditions ``lo <= value < hi``."""
    return [value >= lo, value < hi]


def place_ranges(conds: List[Expr], k: int, solved, ranges: List[Expr], value: Expr,
                 dropped=frozenset()) -> Optional[List[Expr]]:
    """``conds`` with the equality ``conds[k]`` replaced by ``ranges`` (the range of the
    solved variables' new value ``value``), placed before every conjunct that mentions a
    solved variable (``solved``: ids): those read at the value, which must be in range
    first, as the loop kept it. The conjuncts before ``conds[k]`` keep their order, so
    each is still evaluated only where the ones before it hold; None when that is not
    possible (a conjunct on a solved variable before one that does not mention it, or
    one that also constrains a variable ``value`` reads with). ``dropped`` (ids): conjuncts
    the caller leaves out afterwards (equalities solved elsewhere), ignored here."""
    def mentions(c):
        return any(id(u) in solved for u in free_vars(c))

    prefix = list(conds[:k])
    first = next((n for n, c in enumerate(prefix) if id(c) not in dropped and mentions(c)), len(prefix))
    moved = [c for c in prefix[first:] if id(c) not in dropped]
    data_vars = {id(u) for u in free_vars(value)}
    if any(not mentions(c) or any(id(u) in data_vars for u in free_vars(c)) for c in moved):
        return None
    return prefix[:first] + list(ranges) + prefix[first:] + list(conds[k + 1:])


def solve_reduction(red: Reduce) -> Expr:
    """``red`` with every reduce axis pinned by a data equality of its ``where`` removed (the
    same object when there is none). All axes pinned: a select of the body or the identity."""
    if reduction(red.combiner).indexed:
        return red  # its value is the position of the best point: the axis must stay
    axes = list(red.axes)
    conds = conjuncts(red.where)
    body = red.body
    changed = True
    solved = False
    while changed:
        changed = False
        for k, c in enumerate(conds):
            for ax in axes:
                value = pinned_value(c, ax)
                if value is None or any(ax is u for b in axes if b is not ax
                                        for u in free_vars(b.lo) + free_vars(b.hi)):
                    continue
                placed = place_ranges(conds, k, {id(ax)}, in_range(value, ax.lo, ax.hi), value)
                if placed is None:
                    continue
                mapping = {ax: value}
                conds = [substitute(x, mapping) for x in placed]
                body = substitute(body, mapping)
                axes.remove(ax)
                changed = solved = True
                break
            if changed:
                break
    if not solved:
        return red
    where = dsl.all(*conds) if conds else None
    if axes:
        return Reduce(red.combiner, body, tuple(axes), where)
    identity = dsl.const(identity_of(red.combiner, red.dtype), red.dtype)
    value = dsl.cast(red.dtype, body)
    return value if where is None else dsl.if_then_else(where, value, identity)


class SolveReductions(Mutator):
    """Every reduction of an expression through :func:`solve_reduction` (inner ones first)."""

    def visit_Reduce(self, node: Reduce):
        out = super().visit_Reduce(node)
        return solve_reduction(out) if isinstance(out, Reduce) else out


def solve_reductions(e: Expr) -> Expr:
    """``e`` with the data-pinned reduce axes of its reductions removed (``e`` itself if none)."""
    return SolveReductions().visit(e)
