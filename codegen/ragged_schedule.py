"""Scatters over ragged (CSR) loops: a loop order with a contiguous innermost axis, and
threads split along an axis that decides the location written.

A scatter ``for p in domain: T[idx(p)] += v(p)`` runs, as written, on one thread (two
points may write the same location). Over CSR segments many of its loops cannot
collide: a loop whose variable *is* a store index (``dh[src[e], f] += ...``: two values
of ``f`` never write the same element), and the segment loop ``s`` of an edge loop
``k in range(P[s], P[s + 1])`` when ``k`` is a store index (``dalpha[k] += ...``): the
segments of a row pointer that does not decrease are disjoint, and a compiled ragged loop
checks at run time that it does not run backwards (an error otherwise, never a result).
Such a variable is *fixed by the location*: every point writing one location has the same
value of it. This pass (:func:`order_ragged_scatter`), for a scatter nest with a ragged
loop:

1. moves innermost the axis with constant bounds that no bound uses and that is the last
   index of the store or of a read (the feature axis: unit stride, one vector), when the
   loops it passes are fixed by the location, or it is itself;
2. splits among threads its outermost loop when that loop is fixed by the location and
   runs over ``[0, n)``.

Promise: each location receives the same contributions in the same order as before (a
loop moved past others is fixed by the location, or they all are), so the results are
bit for bit those of the serial scatter; threads write disjoint locations. The loop
interpreter (:mod:`.interpret`) checks both forms in the tests.
"""
from __future__ import annotations

from typing import List, Optional, Set

from te_grad.graph import free_vars, reads_in
from te_grad.ir import Binary, Const, Expr, Read, Var
from te_grad.visitor import Visitor

from .loopir import Loop, Nest, Parallel, SERIAL, Stage, guarded


def _const(e: Expr) -> Optional[int]:
    return int(e.value) if isinstance(e, Const) and float(e.value).is_integer() else None


def _offset(e: Expr, var: Var) -> Optional[int]:
    """``c`` when ``e`` is ``var + c`` (or ``var``), else None."""
    if e is var:
        return 0
    if isinstance(e, Binary) and e.op == "add":
        for a, b in ((e.a, e.b), (e.b, e.a)):
            if a is var and _const(b) is not None:
                return _const(b)
    return None


def _segment_of(lp: Loop, loops: List[Loop]) -> Optional[Var]:
    """``s`` when ``lp`` runs over ``range(P[s + c], P[s + c + 1])`` for a 1-d ``P`` and an
    outer loop variable ``s``, else None."""
    lo, hi = lp.lo, lp.hi
    if not (isinstance(lo, Read) and isinstance(hi, Read) and lo.tensor is hi.tensor
            and len(lo.indices) == 1 and len(hi.indices) == 1):
        return None
    for outer in loops:
        if outer is lp:
            return None
        a, b = _offset(lo.indices[0], outer.var), _offset(hi.indices[0], outer.var)
        if a is not None and b == a + 1:
            return outer.var
    return None


def fixed_by_location(nest: Nest) -> Set[int]:
    """``id`` of the loop variables that every point writing one location shares: the
    store's plain indices, and the segment of a ragged loop among them."""
    fixed = {id(ix) for ix in nest.store.indices if isinstance(ix, Var)}
    loops = list(nest.loops)
    for lp in loops:
        if id(lp.var) in fixed:
            s = _segment_of(lp, loops)
            if s is not None:
                fixed.add(id(s))
    return fixed


def _inner_axis(nest: Nest, bound_vars: Set[int]) -> Optional[Loop]:
    """The loop to run innermost: constant bounds, used by no bound, the last index of the
    store or of a read."""
    lasts = {id(nest.store.indices[-1])} if nest.store.indices else set()
    for e in [nest.store.value] + ([nest.cond] if nest.cond is not None else []):
        lasts |= {id(r.indices[-1]) for r in _reads(e) if r.indices}
    for lp in reversed(nest.loops):
        if (id(lp.var) in lasts and id(lp.var) not in bound_vars and _const(lp.lo) is not None
                and _const(lp.hi) is not None):
            return lp
    return None


class _Reads(Visitor):
    def __init__(self):
        self.found: List[Read] = []

    def visit_Read(self, node):
        self.found.append(node)
        self.generic_visit(node)


def _reads(e: Expr) -> List[Read]:
    v = _Reads()
    v.visit(e)
    return v.found


def order_ragged_scatter(stage: Stage) -> Stage:
    """``stage`` (a scatter's accumulating stage) reordered and split among threads as the
    module docstring says, or ``stage`` itself when it has no ragged loop or nothing applies."""
    if len(stage.body) != 1 or stage.parallel_extent:
        return stage
    nest = Nest.of(stage.body[0])
    if nest is None or not nest.store.checked or not any(reads_in(lp.lo) or reads_in(lp.hi) for lp in nest.loops):
        return stage
    fixed = fixed_by_location(nest)
    bound_vars = {id(v) for lp in nest.loops for b in (lp.lo, lp.hi) for v in free_vars(b)}
    order = list(nest.loops)
    inner = _inner_axis(nest, bound_vars)
    if inner is not None and inner is not order[-1]:
        passed = order[order.index(inner) + 1:]
        if id(inner.var) in fixed or all(id(lp.var) in fixed for lp in passed):
            order.remove(inner)
            order.append(inner)
    outer = order[0]
    extent = _const(outer.hi)
    parallel = (id(outer.var) in fixed and _const(outer.lo) == 0 and extent is not None and extent >= 2
                and not free_vars(outer.hi))
    if order == list(nest.loops) and not parallel:
        return stage
    body = guarded(nest.cond, nest.store)
    for lp in reversed(order):
        body = (Loop(lp.var, lp.lo, lp.hi, body, Parallel() if parallel and lp is outer else SERIAL),)
    return Stage(stage.tensor, body, extent if parallel else 0, parallel_axis=None, work=stage.work)
