"""Triangles and bands: a loop whose range follows another loop, cut into blocks of constant bounds.

A causal or banded mask leaves reduction terms whose domain relates two loops: a guard
``j <= i`` on a score matrix's contraction, or a reduce loop ``for e in range(i + 1)`` after
isl scanned a masked sum. Such a nest cannot be register blocked well (the inner loop's
range changes from row to row, so rows cannot be jammed, and a guard inside the vector loop
computes every lane anyway). :func:`split_triangles` cuts the outer loop ``u`` into blocks
of ``B`` values and, in each block, the related loop ``v`` into the part where the relation
holds for every ``u`` of the block (no guard) and the parts where it holds for some (the
guard kept): ``for i in [I, I + B): for j in [0, I + 1)`` unguarded, then the diagonal block
``for j in [I + 1, I + B): if j <= i``. Every bound is then a constant, so the later passes
block and vectorize each piece as a box, and the work is the triangle's plus a diagonal
band of blocks.

The relation is found by probing, not by pattern: for each value of ``u`` the range of
``v`` where every conjunct of the guard that uses ``u`` and ``v`` holds and ``v``'s own
bounds (expressions of ``u``) allow; it must be one interval (``[a(u), b(u))``) at every
``u``, else the nest is left as it is.

Promises: for each block of ``u``, the pieces' ranges of ``v`` are disjoint and cover every
``v`` the original nest visits at each ``u`` of the block; a piece drops the relational
conjuncts only where they hold at every point of it (and its bounds are the original ones'
values there), and keeps them (with the original bounds as conjuncts) elsewhere. So each
element accumulates exactly the same terms. The one exception: a piece of a stage whose
``region`` (:mod:`simplify.unread`) has the relation's conjuncts, storing the stage's tensor
at its own axes, with the relation from the guard (``v``'s bounds constant), may drop them
when its reads are in bounds at every point of its box: each point of the region still accumulates
exactly the same terms, the others (which no reader uses) whatever the box computes there.
A guarded element-wise nest's range following the row (:func:`_follow`) visits exactly the
points where the relation holds.
"""
from __future__ import annotations

from dataclasses import replace
from typing import List, Optional, Tuple

import numpy as np

from simplify.affine import conjuncts
from te_grad import dsl
from te_grad.graph import free_vars
from te_grad.intervals import grid_values, interval, speculatable
from te_grad.ir import Const, Expr, ReduceAxis, Select, structurally_equal
from te_grad.transform import substitute

from .loopir import Nest, Stage, rewrite_nests

#: at most this many blocks of the outer loop (each block is up to three nests of code)
MAX_BLOCKS = 8
#: the smallest block (a multiple of the rows a register block jams)
MIN_BLOCK = 16
#: the most points a relation is probed at
PROBE_POINTS = 1 << 22
#: cut only when the pieces visit at most this share of the original nest's points
WORTH = 0.85
#: the narrowest part of a block without a guard worth nests of its own (narrower, it joins the guarded ones)
MIN_FULL = 8
#: at most this many blocks for a band narrower than a block of :data:`MAX_BLOCKS`
MAX_NARROW_BLOCKS = 16


def _const(e: Expr) -> Optional[int]:
    return int(e.value) if isinstance(e, Const) and not isinstance(e.value, bool) else None


def split_triangles(stage: Stage) -> Stage:
    """Each accumulating or guarded nest with a triangle or a band between two loops cut into
    blocks of constant bounds, each element-wise nest storing a select on one into blocks
    storing either branch or the select (see the module docstring)."""
    return rewrite_nests(stage, lambda n: _split(n, stage))


def _split(n: Nest, stage: Stage):
    for k, lp_v in enumerate(n.loops):
        for lp_u in n.loops[:k]:
            if isinstance(lp_u.var, ReduceAxis) or _const(lp_u.lo) is None or _const(lp_u.hi) is None:
                continue
            if n.accumulates:
                got = _cut(n, lp_u, lp_v, stage)
            elif n.cond is not None:
                got = _follow(n, lp_u, lp_v) or _cut(n, lp_u, lp_v, stage)
            else:
                got = _cut_select(n, lp_u, lp_v)
            if got is not None:
                return got
    return None


def _related(cond: Optional[Expr], lp_u, lp_v) -> Tuple[List[Expr], List[Expr]]:
    """The conjuncts of ``cond`` over exactly ``u`` and ``v``, and the others."""
    both, rest = [], []
    for c in conjuncts(cond):
        ids = {id(x) for x in free_vars(c)}
        (both if ids == {id(lp_u.var), id(lp_v.var)} else rest).append(c)
    return both, rest


def _rows(lp_u, lp_v, both: List[Expr]):
    """``(v_lo, v_hi, a, b, live)``: at each ``u`` (from ``u``'s lower bound) the one interval
    ``[v_lo + a, v_lo + b)`` of ``v`` inside its bounds where every conjunct of ``both`` holds
    (``live``: not empty), or None when it is not one interval or cannot be probed."""
    u, v = lp_u.var, lp_v.var
    u_lo, u_hi = _const(lp_u.lo), _const(lp_u.hi)
    if u_hi - u_lo < 2 * MIN_BLOCK:
        return None
    lo = grid_values(lp_v.lo, [u], [u_hi])
    hi = grid_values(lp_v.hi, [u], [u_hi])
    if lo is None or hi is None:
        return None
    lo, hi = lo[u_lo:], hi[u_lo:]
    v_lo, v_hi = int(lo.min()), int(hi.max())
    if v_hi - v_lo <= 0 or v_lo < 0 or u_hi * v_hi > PROBE_POINTS:
        return None
    inside = np.arange(v_lo, v_hi)[None, :] >= lo[:, None]
    inside &= np.arange(v_lo, v_hi)[None, :] < hi[:, None]
    for c in both:
        got = _probe(c, u, v, u_lo, u_hi, v_lo, v_hi)
        if got is None:
            return None
        inside &= got
    live = inside.any(axis=1)
    a = np.where(live, inside.argmax(axis=1), 0)
    b = np.where(live, inside.shape[1] - inside[:, ::-1].argmax(axis=1), 0)
    if np.any(inside.sum(axis=1) != b - a):
        return None
    return v_lo, v_hi, a, b, live


def _blocks(lp_u, rows):
    """``[(u range, [((v range), kind)])]`` per block of ``u``, ``kind`` one of ``"full"`` (the
    relation holds at every point), ``"partial"`` (at some), ``"none"`` (at no point)."""
    v_lo, v_hi, a, b, live = rows
    u_lo = _const(lp_u.lo)
    n = len(live)
    block = max(MIN_BLOCK, -(-n // MAX_BLOCKS))
    widest = int((b - a)[live].max()) if live.any() else 0
    if widest < block:  # a band: blocks about as tall as it is wide waste less of each
        block = max(MIN_BLOCK, widest, -(-n // MAX_NARROW_BLOCKS))
    block = -(-block // 8) * 8
    out = []
    for start in range(0, n, block):
        stop = min(n, start + block)
        here = live[start:stop]
        parts = []
        if here.any():
            aa, bb = a[start:stop][here], b[start:stop][here]
            full_lo, full_hi = int(aa.max()), int(bb.min())
            hull_lo, hull_hi = int(aa.min()), int(bb.max())
            if full_lo + MIN_FULL <= full_hi and here.all():
                parts = [((hull_lo, full_lo), "partial"), ((full_lo, full_hi), "full"), ((full_hi, hull_hi), "partial")]
            else:
                parts = [((hull_lo, hull_hi), "partial")]
            parts = [((0, hull_lo), "none")] + parts + [((hull_hi, v_hi - v_lo), "none")]
        else:
            parts = [((0, v_hi - v_lo), "none")]
        out.append(((u_lo + start, u_lo + stop), [((v_lo + x, v_lo + y), k) for (x, y), k in parts if x < y]))
    return out


def _unused_outside(n: Nest, both: List[Expr], stage: Stage) -> bool:
    """True if the relation's conjuncts ``both`` are conjuncts of the stage's region (its
    readers use no point outside them: the nest may store anything there) and the nest stores
    the stage's tensor at its own axes: a block may then run without the relation."""
    region = stage.region
    if region is None or n.store.tensor is not stage.tensor or \
            tuple(map(id, n.store.indices)) != tuple(map(id, stage.tensor.op.axes)):
        return False
    have = conjuncts(region)
    return all(any(structurally_equal(c, h) for h in have) for c in both)


def _speculatable_in(loops, exprs) -> bool:
    """Every read of ``exprs`` in bounds and no integer division by a variable, at every point
    of ``loops`` (constant bounds, or reduce axes bounded by them)."""
    ranges = {}
    for lp in loops:
        lo, hi = interval(lp.lo, ranges), interval(lp.hi, ranges)
        if lo is None or hi is None:
            return False
        ranges[id(lp.var)] = (lo[0], hi[1] - 1)
    return all(speculatable(e, ranges) for e in exprs)


def _cut(n: Nest, lp_u, lp_v, stage: Optional[Stage] = None) -> Optional[List]:
    """An accumulating or guarded nest: the blocks' points where the relation holds, the
    others dropped. A block where the relation holds at some points runs as a box without
    it when the stage's readers use no point outside it and the box's reads stay in bounds
    (its other points then store values no one reads)."""
    u, v = lp_u.var, lp_v.var
    bound_ids = {id(x) for b in (lp_v.lo, lp_v.hi) for x in free_vars(b)}
    if not bound_ids <= {id(u)}:
        return None
    both, rest = _related(n.cond, lp_u, lp_v)
    if not both and not bound_ids:
        return None
    rows = _rows(lp_u, lp_v, both)
    if rows is None:
        return None
    v_lo, v_hi = rows[0], rows[1]
    pieces = [(ur, vr, kind == "partial") for ur, parts in _blocks(lp_u, rows) for vr, kind in parts
              if kind != "none"]
    visited = sum((ur[1] - ur[0]) * (vr[1] - vr[0]) for ur, vr, _ in pieces)
    if visited > WORTH * (_const(lp_u.hi) - _const(lp_u.lo)) * (v_hi - v_lo):
        return None
    original = [c for c in (dsl.compare("ge", v, lp_v.lo) if bound_ids else None,
                            dsl.compare("lt", v, lp_v.hi) if bound_ids else None) if c is not None]
    out = []
    for (ua, ub), (va, vb), guarded in pieces:
        # a partial piece keeps the relation: as the guard's conjuncts, and as v's own bounds
        # (a range per row, cheaper than a test per point) when they are all of it
        lo, hi = dsl.const(va), dsl.const(vb)
        if guarded and bound_ids and not both:
            lo, hi = dsl.maximum(lo, lp_v.lo), dsl.minimum(hi, lp_v.hi)
        conds = rest + (both + original if guarded and both else [])
        if guarded and both and not original and stage is not None and _unused_outside(n, both, stage):
            box = tuple(replace(lp, lo=dsl.const(ua), hi=dsl.const(ub)) if lp is lp_u else
                        replace(lp, lo=lo, hi=hi) if lp is lp_v else lp for lp in n.loops)
            if _speculatable_in(box, [n.store.value] + rest):
                conds = list(rest)
        cond = dsl.all(conds) if conds else None
        store, var = n.store, v
        if isinstance(v, ReduceAxis):  # the piece's axis carries the piece's bounds, as in .pieces
            var = ReduceAxis(v.name, v.dtype, lo, hi)
            store = replace(store, value=substitute(store.value, {v: var}),
                            index=var if store.index is v else store.index)
            cond = None if cond is None else substitute(cond, {v: var})
        loops = tuple(replace(lp, lo=dsl.const(ua), hi=dsl.const(ub)) if lp is lp_u else
                      replace(lp, var=var, lo=lo, hi=hi) if lp is lp_v else lp
                      for lp in n.loops)
        out.append(Nest(loops, cond, store).stmt(parallel=n.parallel))
    return out


def _fits(ends: np.ndarray, live: np.ndarray, u_lo: int) -> List[Tuple[int, int, Optional[int], Optional[int]]]:
    """The lines ``(s, c, lo, hi)`` with ``ends[k] == clip(s * (u_lo + k) + c, lo, hi)`` at every
    live row ``k`` (``s`` one of 0, 1, -1; a None clip is none), the unclipped first: a row
    where the relation holds nowhere may need the line past the live rows' ends."""
    k = np.nonzero(live)[0]
    x, us = ends[k], u_lo + k
    lo, hi = int(x.min()), int(x.max())
    if lo == hi:
        return [(0, lo, None, None)]
    inner = (x > lo) & (x < hi)
    out = []
    for s in (1, -1):
        tries = ({int(x[inner][0] - s * us[inner][0])} if inner.any() else
                 {int(e - s * u) for e in (lo, hi) for u in (us[0], us[-1])})
        for c in sorted(tries):
            for clip in ((None, None), (lo, None), (None, hi), (lo, hi)):
                if np.array_equal(np.clip(s * us + c, *clip), x) and (s, c) + clip not in out:
                    out.append((s, c) + clip)
    return out


def _at(fit, us: np.ndarray) -> np.ndarray:
    s, c, lo, hi = fit
    return np.clip(s * us + c, lo, hi) if lo is not None or hi is not None else s * us + c


def _line(u, fit) -> Expr:
    s, c, lo, hi = fit
    if s == 0:
        return dsl.const(c)
    e = u if s == 1 else dsl.const(0) - u
    e = e + c if c else e
    e = dsl.minimum(dsl.const(hi), e) if hi is not None else e
    return dsl.maximum(dsl.const(lo), e) if lo is not None else e


def _follow(n: Nest, lp_u, lp_v) -> Optional[List]:
    """A guarded element-wise nest (a tensor written only on its region): ``v``'s range made
    the relation's interval at each ``u``, ``[max(lo, s u + c), min(hi, s' u + c'))`` (each clip
    only where needed), when both ends follow such lines exactly at every ``u`` where the
    relation holds somewhere and give an empty range at the others (checked at every row); the
    relation's conjuncts dropped. One nest, no blocks: an element-wise store has no register
    block that a row-dependent range would break."""
    both, rest = _related(n.cond, lp_u, lp_v)
    if not both or not all(_const(b) is not None for b in (lp_u.lo, lp_u.hi, lp_v.lo, lp_v.hi)):
        return None
    rows = _rows(lp_u, lp_v, both)
    if rows is None:
        return None
    v_lo, _, a, b, live = rows
    u_lo = _const(lp_u.lo)
    if not live.any():
        return []
    us = u_lo + np.arange(len(live))
    for start in _fits(v_lo + a, live, u_lo):
        for stop in _fits(v_lo + b, live, u_lo):
            if np.all(_at(start, us)[~live] >= _at(stop, us)[~live]):  # no point where the relation holds nowhere
                loops = tuple(replace(lp, lo=_line(lp_u.var, start), hi=_line(lp_u.var, stop)) if lp is lp_v
                              else lp for lp in n.loops)
                return [Nest(loops, dsl.all(rest) if rest else None, n.store).stmt(parallel=n.parallel)]
    return None


def _cut_select(n: Nest, lp_u, lp_v) -> Optional[List]:
    """An element-wise nest storing ``if_then_else(c, x, y)``: per block, ``x`` where the
    relation of ``c`` holds at every point, ``y`` where it holds at none, the select between."""
    value = n.store.value
    if not isinstance(value, Select) or n.cond is not None:
        return None
    if any(not isinstance(lp.lo, Const) or not isinstance(lp.hi, Const) for lp in n.loops):
        return None
    both, rest = _related(value.cond, lp_u, lp_v)
    if not both:
        return None
    rows = _rows(lp_u, lp_v, both)
    if rows is None:
        return None
    full = value.t if not rest else Select(dsl.all(rest), value.t, value.f)
    blocks = _blocks(lp_u, rows)
    work = sum((ur[1] - ur[0]) * (vr[1] - vr[0]) for ur, parts in blocks for vr, kind in parts if kind != "none")
    if work > WORTH * (_const(lp_u.hi) - _const(lp_u.lo)) * (rows[1] - rows[0]):
        return None
    out = []
    for (ua, ub), parts in blocks:
        for (va, vb), kind in parts:
            stored = {"full": full, "partial": value, "none": value.f}[kind]
            loops = tuple(replace(lp, lo=dsl.const(ua), hi=dsl.const(ub)) if lp is lp_u else
                          replace(lp, lo=dsl.const(va), hi=dsl.const(vb)) if lp is lp_v else lp
                          for lp in n.loops)
            out.append(Nest(loops, None, replace(n.store, value=stored)).stmt(parallel=n.parallel))
    return out


def _probe(c: Expr, u, v, u_lo: int, u_hi: int, v_lo: int, v_hi: int) -> Optional[np.ndarray]:
    """``c`` at every ``(u, v)`` of ``[u_lo, u_hi) x [v_lo, v_hi)`` (bool), or None."""
    got = grid_values(c, [u, v], [u_hi, v_hi])
    if got is None:
        return None
    return got[u_lo:, v_lo:].astype(bool)
