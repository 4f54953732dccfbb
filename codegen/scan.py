"""Running reductions: ``T[.., v, ..] = R(body(r) for r in range(lo, hi(v)))`` as a scan.

A prefix sum written in the DSL, ``cumsum[i, j] = sum(X[i, k] for k in range(j + 1))``,
is a triangle of ``n^2 / 2`` additions; its gradient, ``sum(h[i, j] for j in
range(k, n))``, the mirror triangle. When one output axis ``v`` moves only one
bound of the reduce axis (the upper one forward, the lower one backward), the
bound never goes back, and the body does not read ``v``, each element extends
the previous one:

    T[.., v, ..] = T[.., v - 1, ..]  combined with  body(r) for r in range(hi(v - 1), hi(v))

which is linear in ``n``. ``v`` then runs in order (forward, or backward for a
moving lower bound) and is never split among threads; the other output axes
keep the order of the stage's initialization nest, so a scan along a
non-innermost axis still vectorizes across the innermost one.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from simplify.linear import normalize
from te_grad import dsl
from te_grad.ops import identity_of, reduction
from te_grad.graph import free_vars
from te_grad.intervals import grid_values
from te_grad.ir import Const, Expr, ReduceAxis, Tensor, Var, as_expr
from te_grad.transform import substitute

from .loop_order import representative
from .loopir import Loop, Nest, Stage, Store, carried_scan, guarded, nest

#: a scan replaces the direct reduction when its rows are at least this long on average
MIN_MEAN_EXTENT = 4
#: the most output points whose bounds are probed to prove them monotonic
MAX_PROBE = 1 << 22


def scans(stage: Stage) -> Stage:
    """A stage that writes the identity and then accumulates one reduction term whose bound
    moves with an output axis, computed as a scan (see the module docstring); any other
    stage as it is. The initialization nest's loop order (:mod:`.loop_order`) is kept for
    the other output axes.

    Promises: each element receives exactly the terms of its reduction, in increasing (or,
    for a moving lower bound, decreasing) order of the reduce axis, added to the previous
    element's running value instead of being summed again."""
    if len(stage.body) != 2:
        return stage
    init, term = Nest.of(stage.body[0]), Nest.of(stage.body[1])
    t = stage.tensor
    if init is None or term is None or init.accumulates or not term.accumulates or len(term.reductions) != 1:
        return stage
    value = init.store.value
    if not isinstance(value, Const) or value.value != identity_of(term.store.combine, t.dtype):
        return stage  # an element-wise part as well: not a running value alone
    shape_of = dict(zip(map(id, t.op.axes), t.shape))
    got = scan_nests(t, init.order, shape_of, term.reductions[0], term.store.combine, term.store.value, term.cond)
    if got is None:
        return stage
    body, par = got
    extent = shape_of[id(par)] if par is not None else 0
    if isinstance(extent, Expr):  # a size known at run time: its representative value, as the
        extent = representative(extent) or 0  # schedule's; the kernel binds the call's (codegen.kernel)
    return replace(stage, body=tuple(body), parallel_extent=extent, parallel_axis=par)


def _long(extent) -> bool:
    """At least 4 values (an extent known at run time counts at its representative size)."""
    return (extent if isinstance(extent, int) else representative(extent) or 0) >= 4


def scan_nests(t: Tensor, order: Sequence[Var], shape_of: Dict[int, int], r: ReduceAxis, combiner: str,
               value: Expr, cond: Optional[Expr]) -> Optional[Tuple[List, Optional[Var]]]:
    """``(statements, parallel axis)`` computing ``t = combiner(value for r)`` as a scan, or
    None if it is not a running reduction (see the module doc). ``order`` is the output
    loop order."""
    if reduction(combiner).indexed:
        return None  # a running argmax would need the running value beside the index
    outputs = {id(a): a for a in t.op.axes}
    movers = [a for a in t.op.axes if any(a is x for b in (r.lo, r.hi) for x in free_vars(b))]
    if len(movers) != 1:
        return None
    v = movers[0]
    # threads share another axis: the first long enough, in loop order
    parallel = next((a for a in order if a is not v and _long(shape_of[id(a)])), None)
    if not isinstance(shape_of[id(v)], int):
        return None  # the scan's step count is the moving axis's extent, known here
    in_lo, in_hi = (any(v is x for x in free_vars(b)) for b in (r.lo, r.hi))
    if in_lo == in_hi:
        return None  # a sliding window (both bounds move) is not a scan
    if any(v is x for e in (value, cond) if e is not None for x in free_vars(e)):
        return None
    if any(id(x) not in outputs for b in (r.lo, r.hi) for x in free_vars(b)):
        return None
    forward = in_hi
    if not _monotonic(t, v, r.hi if forward else r.lo, r.lo if forward else r.hi):
        return None

    n = shape_of[id(v)]
    identity = dsl.const(identity_of(combiner, t.dtype), t.dtype)
    u = Var(v.name + "s")  # the scan step: v itself forward, n - 1 - v backward
    at_v = u if forward else dsl.const(n - 1) - u
    prev = u - 1 if forward else dsl.const(n) - u  # v - 1 forward, v + 1 backward, for u >= 1
    first = dsl.compare("eq", u, dsl.const(0))

    def here(e):
        return substitute(e, {v: at_v})

    def before(e):
        return substitute(e, {v: prev})

    axes = list(t.op.axes)
    store_at = tuple(at_v if a is v else a for a in axes)
    clamped = dsl.maximum(prev, dsl.const(0)) if forward else dsl.minimum(prev, dsl.const(n - 1))
    carried = dsl.if_then_else(first, identity, t[tuple(clamped if a is v else a for a in axes)])
    if forward:  # r from where the previous element stopped to hi(v)
        lo = dsl.if_then_else(first, r.lo, dsl.maximum(r.lo, before(r.hi)))
        hi = here(r.hi)
    else:  # r from lo(v) to where the next element started
        lo = here(r.lo)
        hi = dsl.if_then_else(first, r.hi, dsl.minimum(r.hi, before(r.lo)))
    lo, hi, carried = normalize(lo), normalize(hi), normalize(carried)
    store = Store(t, store_at, dsl.cast(t.dtype, value), combine=combiner)
    body = guarded(cond, store)

    full = {id(a): (dsl.const(0), as_expr(shape_of[id(a)])) for a in order}  # an extent may be a size (tg.var)
    pos = next(k for k, a in enumerate(order) if a is v)
    outer, inner = list(order[:pos]), list(order[pos + 1:])
    if not inner:  # v innermost: the running value stays in a register
        scan = carried_scan(u, n, r, lo, hi, cond, store, carried)
        return nest(outer, full, [scan], parallel), parallel
    copy = nest(inner, full, [Store(t, store_at, carried)], parallel)
    accumulate = [Loop(r, lo, hi, nest(inner, full, body, parallel))]
    return nest(outer, full, [Loop(u, dsl.const(0), dsl.const(n), copy + accumulate)], parallel), parallel


def _monotonic(t: Tensor, v: Var, moving: Expr, fixed: Expr) -> bool:
    """True if ``moving`` never decreases along ``v`` and the rows are long enough on average
    for a scan to pay, probed at every output point the bounds depend on (in integer
    arithmetic, :func:`te_grad.intervals.grid_values`; False for a bound it cannot evaluate)."""
    used = [a for a in t.op.axes if any(a is x for b in (moving, fixed) for x in free_vars(b))]
    extent = dict(zip(map(id, t.op.axes), t.shape))
    dims = tuple(extent[id(a)] for a in used)
    if not all(isinstance(d, int) for d in dims):  # the bounds move along a size known at run time
        return False  # (not probed: the sum stays a reduction, exact at every size)
    if int(np.prod(dims)) > MAX_PROBE:
        return False
    values = []
    for b in (moving, fixed):
        got = grid_values(b, used, dims)
        if got is None:  # not integer index arithmetic of the output axes
            return False
        values.append(got)
    along = next(k for k, a in enumerate(used) if a is v)
    if np.any(np.diff(values[0], axis=along) < 0):
        return False
    length = np.abs(values[0] - values[1])
    return float(length.mean()) >= MIN_MEAN_EXTENT
