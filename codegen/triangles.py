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
element accumulates exactly the same terms.
"""
from __future__ import annotations

from dataclasses import replace
from typing import List, Optional, Tuple

import numpy as np

from simplify.affine import conjuncts
from te_grad import dsl
from te_grad.graph import free_vars
from te_grad.intervals import grid_values
from te_grad.ir import Const, Expr, ReduceAxis, Select
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
    return rewrite_nests(stage, _split)


def _split(n: Nest):
    for k, lp_v in enumerate(n.loops):
        for lp_u in n.loops[:k]:
            if isinstance(lp_u.var, ReduceAxis) or _const(lp_u.lo) is None or _const(lp_u.hi) is None:
                continue
            if n.accumulates:
                got = _cut(n, lp_u, lp_v)
            elif n.cond is not None:
                got = _follow(n, lp_u, lp_v) or _cut(n, lp_u, lp_v)
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


def _cut(n: Nest, lp_u, lp_v) -> Optional[List]:
    """An accumulating or guarded nest: the blocks' points where the relation holds, the
    others dropped."""
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


def _fit(ends: np.ndarray, live: np.ndarray, u_lo: int) -> Optional[Tuple[int, int, int, int]]:
    """``(s, c, lo, hi)`` with ``ends[k] == clip(s * (u_lo + k) + c, lo, hi)`` at every live row
    ``k``, ``s`` one of 1, -1, 0; None when no such line fits."""
    k = np.nonzero(live)[0]
    x, us = ends[k], u_lo + k
    lo, hi = int(x.min()), int(x.max())
    inner = (x > lo) & (x < hi)
    for s in (1, -1, 0):
        tries = ({int(x[inner][0] - s * us[inner][0])} if inner.any() else
                 {int(e - s * u) for e in (lo, hi) for u in (us[0], us[-1])})
        for c in sorted(tries):
            if np.array_equal(np.clip(s * us + c, lo, hi), x):
                return s, c, lo, hi
    return None


def _line(u, fit) -> Expr:
    s, c, lo, hi = fit
    if s == 0:
        return dsl.const(min(max(c, lo), hi))
    e = (u if s == 1 else dsl.const(0) - u) + c if c else (u if s == 1 else dsl.const(0) - u)
    return dsl.maximum(dsl.const(lo), dsl.minimum(dsl.const(hi), e))


def _follow(n: Nest, lp_u, lp_v) -> Optional[List]:
    """A guarded element-wise nest (a tensor written only on its region): ``v``'s range made
    the relation's interval at each ``u``, ``[max(lo, s u + c), min(hi, s' u + c'))``, when both
    ends follow such lines exactly (checked at every ``u``; rows where the relation holds
    nowhere get an empty range), the relation's conjuncts dropped. One nest, no blocks: an
    element-wise store has no register block that a row-dependent range would break."""
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
    fits = _fit(v_lo + a, live, u_lo), _fit(v_lo + b, live, u_lo)
    if None in fits:
        return None
    us = u_lo + np.arange(len(live))
    starts, stops = (np.clip(f[0] * us + f[1], f[2], f[3]) for f in fits)
    if np.any(starts[~live] < stops[~live]):
        return None  # a row where the relation holds nowhere would get points
    loops = tuple(replace(lp, lo=_line(lp_u.var, fits[0]), hi=_line(lp_u.var, fits[1])) if lp is lp_v else lp
                  for lp in n.loops)
    return [Nest(loops, dsl.all(rest) if rest else None, n.store).stmt(parallel=n.parallel)]


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
