"""Interior pieces: an output domain cut into boxes on which every reduce bound is constant.

A padded convolution's reduce bounds depend on the output index near the borders
only (``max(0, 1 - i) <= r < min(3, 33 - i)``): no loop order is legal for the whole
domain (the bounds use the output loops) and the edges would decide for the interior.
:func:`split_interior` finds boxes (the interior, edges, corners; each kernel position
of a weight gradient) on which the bounds are constant, probing them at every output
point (:func:`te_grad.intervals.grid_values`, integer arithmetic; a bound that is not index
arithmetic of the output axes is kept as it is), and :func:`split_pieces` rewrites each
accumulating nest of a stage as one nest per box, with those constants as bounds.

Promises: the boxes cover the output domain exactly once; on each, the bounds given are
the original bounds' values at every one of its points (a box where they are not constant
keeps the original expressions), so each element accumulates exactly the same terms.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, Sequence, Tuple

import numpy as np

from te_grad import dsl
from te_grad.graph import free_vars
from te_grad.intervals import grid_values
from te_grad.ir import Const, Expr, ReduceAxis, Var
from te_grad.sizes import is_size_expr
from te_grad.transform import substitute

from .loop_order import representative
from .loopir import Loop, Nest, Stage, rewrite_nests


def constant_share(axes, shape, red_axes) -> float:
    """The share of the output domain in pieces where every reduce bound is constant."""
    total = int(np.prod([_extent(n) for n in shape])) if shape else 1
    covered = 0
    for ranges, bounds in split_interior(axes, shape, red_axes):
        if all(isinstance(b, Const) or is_size_expr(b) for lo_hi in bounds.values() for b in lo_hi):
            covered += int(np.prod([_extent(hi) - lo for lo, hi in ranges.values()]))
    return covered / max(total, 1)


def const_bounds(ranges: Dict[int, Tuple[int, int]]) -> Dict[int, Tuple[Expr, Expr]]:
    return {k: (dsl.const(lo), dsl.const(hi)) for k, (lo, hi) in ranges.items()}


def _with_bounds(r: ReduceAxis, lo: Expr, hi: Expr) -> ReduceAxis:
    if lo is r.lo and hi is r.hi:
        return r
    return ReduceAxis(r.name, r.dtype, lo, hi)


def split_interior(axes: Sequence[Var], shape: Sequence, red_axes: Sequence[ReduceAxis]):
    """Pieces ``(output ranges, reduce bounds)`` covering the output domain once.

    When reduce bounds depend on output indices only near the borders (padding,
    kernel overhang), the interior, where every bound is constant, is one piece
    with constant bounds (so any loop order is legal there) and the borders are
    slabs that keep the original bounds.

    An extent may be a size expression (known at run time) on an axis no reduce bound
    uses (a batch): that axis runs whole in every piece. A bound that uses no output axis
    (the batch of a weight gradient's sum) is the same in every piece and kept as it is.
    """
    full = {id(a): (0, n) for a, n in zip(axes, shape)}
    same = [(full, {id(r): (r.lo, r.hi) for r in red_axes})]
    red_ids = {id(r) for r in red_axes}
    used = {id(v) for r in red_axes for b in (r.lo, r.hi) for v in free_vars(b)}
    if not used or used & red_ids:
        return same
    dep = [(a, n) for a, n in zip(axes, shape) if id(a) in used]
    if any(isinstance(n, Expr) for _, n in dep) or int(np.prod([n for _, n in dep])) > (1 << 22):
        return same
    dep_ids = {id(a) for a, _ in dep}
    grid_axes, grid_shape = tuple(a for a, _ in dep), tuple(n for _, n in dep)
    probed, values = [], []  # (axis, 0 for lo / 1 for hi) of each bound that uses an output axis
    for r in red_axes:
        for side, b in enumerate((r.lo, r.hi)):
            if not any(id(v) in dep_ids for v in free_vars(b)):
                continue
            got = grid_values(b, grid_axes, grid_shape)
            if got is None:  # not integer index arithmetic of the output axes: keep the bounds
                return same
            probed.append((r, side))
            values.append(got)
    if not values:  # the bounds use no output axis with an int extent: nothing to cut along
        return same
    uniform = _uniform_pieces(dep, values, probed, red_axes, full)
    if uniform is not None:
        return uniform
    typical = [int(np.bincount(v.ravel() - v.min()).argmax() + v.min()) for v in values]
    inside = np.ones(grid_shape, dtype=bool)
    for v, c in zip(values, typical):
        inside &= v == c
    where = np.nonzero(inside)
    if not where[0].size:
        return same
    box = [(int(w.min()), int(w.max()) + 1) for w in where]
    if not inside[tuple(slice(lo, hi) for lo, hi in box)].all():
        return same  # constant bounds must hold at every point of the box (the slabs keep the rest exact)
    interior = dict(full)
    interior.update({id(a): b for (a, _), b in zip(dep, box)})
    pieces = [(interior, _bounds_at(red_axes, probed, typical))]
    for k, ((a, n), (lo, hi)) in enumerate(zip(dep, box)):  # slabs around the interior box
        for rng in ((0, lo), (hi, n)):
            if rng[0] >= rng[1]:
                continue
            slab = dict(full)
            slab.update({id(b): box[m] for m, (b, _) in enumerate(dep[:k])})
            slab[id(a)] = rng
            pieces.append((slab, same[0][1]))
    return pieces


def _bounds_at(red_axes, probed, key) -> Dict[int, Tuple[Expr, Expr]]:
    """Each reduce axis's bounds: the constants of ``key`` for the probed ones, else its own."""
    bounds = {id(r): [r.lo, r.hi] for r in red_axes}
    for (r, side), v in zip(probed, key):
        bounds[id(r)][side] = dsl.const(int(v))
    return {k: (lo, hi) for k, (lo, hi) in bounds.items()}


def _extent(n) -> int:
    """An extent as an int: a size expression at the loop orders' representative size."""
    if not isinstance(n, Expr):
        return int(n)
    got = representative(n)
    return 1 if got is None else got


#: most pieces an output domain is cut into so that every piece has constant reduce bounds
MAX_PIECES = 32
#: a cut into more than FEW_PIECES pieces must leave each this many iterations on average:
#: every piece is a loop nest of its own (its own code, its own register blocks), and one
#: piece per output row of a resize gradient with three taps costs more to compile than the
#: varying bounds cost to run
FEW_PIECES, MIN_PIECE_WORK = 9, 4096


def _uniform_pieces(dep, values, probed, red_axes, full):
    """The output domain cut into boxes on which every reduce bound is constant, or None.

    Points are grouped by the values their bounds take (interior, edges and corners of
    a padded convolution; each kernel position of its weight gradient); each group must
    be a box, and there must be few of them."""
    stacked = np.stack([v.ravel() for v in values], axis=1)
    keys, labels, counts = np.unique(stacked, axis=0, return_inverse=True, return_counts=True)
    if len(keys) > MAX_PIECES:
        return None
    if len(keys) > FEW_PIECES:
        dep_ids = {id(a) for a, _ in dep}
        rest = int(np.prod([_extent(hi) - lo for k, (lo, hi) in full.items() if k not in dep_ids]))
        trips = np.ones(len(keys))
        for r in red_axes:
            lo = [keys[:, m] for m, (q, side) in enumerate(probed) if q is r and side == 0]
            hi = [keys[:, m] for m, (q, side) in enumerate(probed) if q is r and side == 1]
            lo = lo[0] if lo else _extent(r.lo) if is_size_expr(r.lo) else 0
            hi = hi[0] if hi else _extent(r.hi) if is_size_expr(r.hi) else 1
            trips = trips * np.maximum(np.asarray(hi) - np.asarray(lo), 0)
        if float((counts * trips).sum()) * rest / len(keys) < MIN_PIECE_WORK:
            return None
    labels = labels.reshape(values[0].shape)
    pieces = []
    for label, key in enumerate(keys):
        mask = labels == label
        where = np.nonzero(mask)
        box = [(int(w.min()), int(w.max()) + 1) for w in where]
        if mask[tuple(slice(lo, hi) for lo, hi in box)].sum() != mask.sum() or \
                not mask[tuple(slice(lo, hi) for lo, hi in box)].all():
            return None
        ranges = dict(full)
        ranges.update({id(a): b for (a, _), b in zip(dep, box)})
        pieces.append((ranges, _bounds_at(red_axes, probed, key)))
    return pieces


def _bound(v) -> Expr:
    return v if isinstance(v, Expr) else dsl.const(v)


def split_pieces(stage: Stage) -> Stage:
    """Each accumulating nest over a whole output domain (output loops from 0) as one nest per
    piece of :func:`split_interior`, its reduce axes bounded by the piece's constants."""
    def split(n: Nest):
        if not n.accumulates:
            return None
        whole = n.whole_outputs(sizes=True)
        if whole is None:
            return None
        axes, shape = whole
        red_axes = n.reductions
        out = []
        pieces = split_interior(axes, shape, red_axes)
        if len(pieces) == 1 and any(isinstance(e, Expr) for e in shape) and \
                all(pieces[0][1][id(r)] == (r.lo, r.hi) for r in red_axes):
            return None  # extents known at run time and nothing to cut: the nest stays as it is
        for ranges, red_bounds in pieces:
            here = [_with_bounds(r, *red_bounds[id(r)]) for r in red_axes]
            rename = {r: a for r, a in zip(red_axes, here) if a is not r}
            value = substitute(n.store.value, rename) if rename else n.store.value
            cond = substitute(n.cond, rename) if (rename and n.cond is not None) else n.cond
            loops = tuple(Loop(a, _bound(ranges[id(a)][0]), _bound(ranges[id(a)][1]), ()) for a in axes) + \
                tuple(Loop(a, a.lo, a.hi, ()) for a in here)
            out.append(Nest(loops, cond, replace(n.store, value=value)).stmt())
        return out
    return rewrite_nests(stage, split)
