"""Turn a (simplified) tensor graph into stages of explicit loop nests.

Each compute tensor becomes one :class:`~codegen.loopir.Stage`:

- its body is split into an element-wise part and reduction terms (summands
  ``R(...)`` or ``if_then_else(guard, R(...), identity)``); a body of any
  other shape first has its nested reductions lifted into tensors of their own;
- an initialization nest writes the element-wise part (or the identity), then
  each reduction term is one accumulating nest ``T[j] = combine(T[j], body)``,
  which frees the loop order: reduce loops may sit outside output loops;
- loop order: innermost, the variable giving the most unit-stride accesses
  (vectorizable) among those no bound depends on; one output axis is split
  across threads (each writes its own range of T), outermost unless it is the
  innermost loop; the others in between, each after the variables its bounds use;
- operands may first be read from copies in a better layout (:mod:`.packing`), and
  each term's loops become register blocks tiled for the cache
  (:mod:`.register_blocking`, :mod:`.cache_tiling`), sized for the machine.
A scatter becomes a serial stage: zero-fill, then accumulate with run-time
checked indices.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from te_grad import dsl
from te_grad.lift import normalized_body
from te_grad.errors import InternalError
from te_grad.evaluator import evaluate
from te_grad.ops import identity_of
from te_grad.graph import free_vars, reads_in, topo_order
from te_grad.transform import substitute
from simplify.affine import constant_value
from simplify.linear import coefficient
from te_grad.ir import (Binary, ComputeOp, Const, Expr, PlaceholderOp, Read, Reduce, ReduceAxis,
                        ScatterOp, Select, Tensor, Var)

from . import congruence
from .packing import Copies, pack_operands
from .register_blocking import accumulate_nest
from .loopir import If, Loop, Parallel, Stage, Store, nest, transpose_block
from .machine import PORTABLE, Machine, host_machine
from .scan import scan_nests


def _summands(e: Expr) -> List[Expr]:
    if isinstance(e, Binary) and e.op == "add":
        return _summands(e.a) + _summands(e.b)
    return [e]


def _has_reduce(e: Expr) -> bool:
    if isinstance(e, Reduce):
        return True
    return any(_has_reduce(c) for c in e.children())


def split_terms(body: Expr):
    """``(elementwise, [(guard, reduce)], combiner)`` if ``body`` is in terms form, else None."""
    if isinstance(body, Reduce):
        return (None, [(None, body)], body.combiner) if not _reduce_inside(body) else None
    elementwise: List[Expr] = []
    terms = []
    for s in _summands(body):
        guard, red = None, s
        if isinstance(s, Select) and isinstance(s.t, Reduce) and isinstance(s.f, Const) and s.f.value == 0:
            guard, red = s.cond, s.t
        if isinstance(red, Reduce):
            if red.combiner != "sum" or _reduce_inside(red) or (guard is not None and _has_reduce(guard)):
                return None
            terms.append((guard, red))
        elif _has_reduce(s):
            return None
        else:
            elementwise.append(s)
    ew = None
    for e in elementwise:
        ew = e if ew is None else ew + e
    return ew, terms, "sum"


def _reduce_inside(red: Reduce) -> bool:
    parts = [red.body] + ([red.where] if red.where is not None else [])
    parts += [b for ax in red.axes for b in (ax.lo, ax.hi)]
    return any(_has_reduce(p) for p in parts)


# ---------------------------------------------------------------------------
# loop order
# ---------------------------------------------------------------------------

#: relative cost of one access per vector of lanes along the innermost loop: a unit-stride
#: load or store, a value invariant in the loop (loaded once and broadcast), and any
#: other stride (a gather or a scatter, one element per lane)
UNIT_COST, INVARIANT_COST, STRIDED_COST = 1.0, 0.25, 8.0
#: a loop shorter than a vector cannot vectorize: the extra cost of putting lanes on it
SHORT_LOOP_COST = 16.0


def _lane_cost(indices: Sequence[Expr], v: Var) -> float:
    """The cost of an access at ``indices`` when vector lanes run along ``v``."""
    if not indices:
        return INVARIANT_COST
    uses = [any(x is v for x in free_vars(i)) for i in indices]
    if not any(uses):
        return INVARIANT_COST
    if not any(uses[:-1]) and coefficient(indices[-1], v) in (1, -1):
        return UNIT_COST
    return STRIDED_COST


def _max_stride(v: Var, reads: Sequence[Read]) -> int:
    """The largest number of elements one step of ``v`` moves any of ``reads``."""
    best = 0
    for r in reads:
        stride = 1
        for ix, n in reversed(list(zip(r.indices, r.tensor.shape))):
            c = coefficient(ix, v)
            if c is None:
                best = max(best, stride)
            elif c:
                best = max(best, abs(c) * stride)
            stride *= n
    return best


def loop_order(out_axes: Sequence[Var], shape: Sequence[int], red_axes: Sequence[ReduceAxis],
               accesses: Sequence[Sequence[Expr]], store: Sequence[Expr],
               reads: Sequence[Read] = (), piece: Optional[Sequence[int]] = None
               ) -> Tuple[List[Var], Optional[Var]]:
    """An order for the loops over ``out_axes`` (extents ``shape``) and ``red_axes``, and the parallel axis.

    ``piece`` gives the extents of the output axes in the piece of the domain being
    ordered (an edge of a padded convolution is one column wide): the innermost loop
    is chosen for them, the parallel axis for the whole domain, so that every piece
    splits the same axis among threads."""
    extents: Dict[int, int] = {id(a): n for a, n in zip(out_axes, piece if piece is not None else shape)}
    middle_point = {a: dsl.const(n // 2) for a, n in zip(out_axes, shape)}
    for r in red_axes:
        if r.extent is not None:
            extents[id(r)] = r.extent
        else:  # bounds that vary: their extent in the middle of the output domain
            lo = constant_value(substitute(r.lo, middle_point))
            hi = constant_value(substitute(r.hi, middle_point))
            if lo is not None and hi is not None:
                extents[id(r)] = max(0, hi - lo)
    deps: Dict[int, set] = {id(a): set() for a in out_axes}
    for r in red_axes:
        deps[id(r)] = {id(x) for b in (r.lo, r.hi) for x in free_vars(b)}
    parallel = None
    if out_axes:
        big = [a for a, n in zip(out_axes, shape) if n >= 4]
        parallel = big[0] if big else max(zip(out_axes, shape), key=lambda p: p[1])[0]
    every = list(out_axes) + list(red_axes)
    if len(every) <= 1:
        return every, parallel

    # Lanes go along the loop whose accesses cost least per vector: reads in the body are
    # paid on every iteration; the store as well in an elementwise nest, but only once per
    # output element when reduce loops run inside (the register block accumulates), and a
    # scattered store costs a little more than a gather.
    store_weight = 1.25 if not red_axes else 0.125

    def stride(v):
        """The largest memory step of ``v`` over the reads and the store, in elements."""
        step, out = _max_stride(v, reads), 1
        for ix, n in reversed(list(zip(store, shape))):
            c = coefficient(ix, v)
            step = max(step, out if c is None else abs(c) * out)
            out *= n
        return step

    def score(v):
        cost = store_weight * _lane_cost(store, v) + sum(_lane_cost(acc, v) for acc in accesses)
        n = extents.get(id(v), 0)
        if id(v) in extents and n < 8:
            cost += SHORT_LOOP_COST
        # between equal costs, the smaller largest stride: lanes a page or more apart
        # (a batch axis) share cache sets and miss the TLB one by one
        return (-cost, -stride(v), n)

    needed = {d for v in every for d in deps[id(v)]}
    candidates = [v for v in every if id(v) not in needed]
    inner = max(candidates, key=score) if candidates else every[-1]
    middle = [v for v in every if v is not inner and v is not parallel]
    # output loops first; reduce loops by the largest memory stride they step, largest outermost
    middle.sort(key=lambda v: (0, 0) if any(v is a for a in out_axes) else (1, -_max_stride(v, reads)))
    # the parallel axis goes outermost unless it is the innermost loop: threads only
    # need disjoint ranges of it, wherever its loop is
    ordered: List[Var] = [parallel] if parallel is not None and parallel is not inner else []
    placed = {id(v) for v in ordered}
    while middle:  # stable topological order: each variable after those its bounds use
        for v in middle:
            if deps[id(v)] <= placed:
                ordered.append(v)
                placed.add(id(v))
                middle.remove(v)
                break
        else:
            ordered.extend(middle)
            break
    ordered.append(inner)
    return ordered, parallel


# ---------------------------------------------------------------------------
# stages
# ---------------------------------------------------------------------------

def _lane_var(t: Tensor, red: Reduce) -> Optional[Var]:
    """The variable :func:`loop_order` runs the vector lanes of reduction term ``red`` of
    ``t`` along (its innermost loop), over the whole output domain."""
    order, _ = loop_order(list(t.op.axes), list(t.shape), list(red.axes), _accesses(red.body, red.where),
                          list(t.op.axes), reads_in(red.body))
    return order[-1] if order else None


def _accesses(*exprs: Optional[Expr]) -> List[Sequence[Expr]]:
    return [r.indices for e in exprs if e is not None for r in reads_in(e)]


def compute_stage(t: Tensor, body: Expr, machine: Machine = PORTABLE) -> Stage:
    """The stage of compute ``t`` whose body (in terms form) is ``body``, scheduled for ``machine``."""
    ew, terms, combiner = split_terms(body)
    axes, shape = list(t.op.axes), list(t.shape)
    if terms:
        init = ew if ew is not None else dsl.const(identity_of(combiner, t.dtype), t.dtype)
    else:
        init = ew
    order, parallel = loop_order(axes, shape, [], _accesses(init), axes)
    store_init = Store(t, tuple(axes), dsl.cast(t.dtype, init))
    tiled = None if terms else _tile_transposed(t, order, _accesses(init), store_init)
    if tiled is not None:  # an element-wise stage whose reads cross the store's layout
        return Stage(t, tiled[0], tiled[1])
    stmts = _elementwise_nest(t, order, shape, store_init, parallel)
    shape_of = dict(zip(map(id, axes), shape))
    for guard, red in terms:
        conds = ([guard] if guard is not None else []) + ([red.where] if red.where is not None else [])
        cond = dsl.all(conds) if conds else None
        if ew is None and len(terms) == 1:  # T holds the running value alone: a scan may extend it
            scan = scan_nests(t, order, shape_of, red, cond)
            if scan is not None:  # it writes every element: no initialization
                body, par = scan
                return Stage(t, body, shape_of[id(par)] if par is not None else 0, parallel_axis=par)
        mods = _class_moduli(axes, shape, red, cond, parallel)
        for view in congruence.class_views(axes, shape, mods):
            if view.mapping:
                red_axes, value, cond_v = congruence.reduce_axes_in_class(red.axes, red.body, cond, view)
            else:
                red_axes, value, cond_v = list(red.axes), red.body, cond
            stmts += _term_nests(t, view, red_axes, value, cond_v, red.combiner, parallel, machine)
    extent = dict(zip(map(id, axes), shape))
    par_extent = extent[id(parallel)] if parallel is not None else 0
    return Stage(t, stmts, par_extent, parallel_axis=parallel)


def _class_moduli(axes, shape, red: Reduce, cond: Optional[Expr], parallel) -> Dict[int, int]:
    """The congruence classes to split a reduction term into: axes entering ``//`` or ``%``
    in its body or guard, and in its reduce bounds when cutting the output domain into
    pieces leaves most of it without constant bounds (they alternate with a parity)."""
    used = [cond, red.body]
    if _constant_share(axes, shape, red.axes) < 0.5:
        used += [b for r in red.axes for b in (r.lo, r.hi)]
    return congruence.moduli(axes, shape, used, exclude=[parallel] if parallel is not None else [])


def _constant_share(axes, shape, red_axes) -> float:
    """The share of the output domain in pieces where every reduce bound is constant."""
    total = int(np.prod(shape)) if shape else 1
    covered = 0
    for ranges, bounds in split_interior(axes, shape, red_axes):
        if all(isinstance(b, Const) for lo_hi in bounds.values() for b in lo_hi):
            covered += int(np.prod([hi - lo for lo, hi in ranges.values()]))
    return covered / max(total, 1)


def _elementwise_nest(t: Tensor, order: List[Var], shape, store: Store, parallel) -> List:
    """The loops of ``t[axes] = value``. When the innermost axis enters ``// m`` or ``% m``
    (a pooling gradient, an upsampling), it runs over ``m`` times fewer values with one
    store per class in its body: unit-stride reads, interleaved stores."""
    axes = list(t.op.axes)
    full = _const_bounds({id(a): (0, n) for a, n in zip(axes, shape)})
    if not order:  # a 0-d tensor
        return nest(order, full, [store], parallel)
    inner = order[-1]
    extent = [dict(zip(map(id, axes), shape))[id(inner)]]
    mods = congruence.moduli([inner], extent, [store.value], exclude=[parallel] if parallel is not None else [])
    if not mods:
        return nest(order, full, [store], parallel)
    views = congruence.class_views([inner], extent, mods)
    stores = [Store(t, tuple(v.mapping.get(a, a) for a in axes), congruence.in_class(store.value, v))
              for v in views]
    full[id(views[0].axes[0])] = (dsl.const(0), dsl.const(views[0].shape[0]))
    return nest(order[:-1] + views[0].axes, full, stores, parallel)


def _term_nests(t: Tensor, view, red_axes, value: Expr, cond: Optional[Expr], combiner: str,
                parallel, machine: Machine) -> List:
    """The accumulating nests of one reduction term over one congruence class of the output."""
    if isinstance(cond, Const):
        if not cond.value:
            return []  # the class receives nothing from this term
        cond = None
    stmts = []
    for ranges, red_bounds in split_interior(view.axes, view.shape, red_axes):
        axes_here = [_with_bounds(r, *red_bounds[id(r)]) for r in red_axes]
        rename = {r: a for r, a in zip(red_axes, axes_here) if a is not r}
        value_here = substitute(value, rename) if rename else value
        cond_here = substitute(cond, rename) if (rename and cond is not None) else cond
        piece = [ranges[id(a)][1] - ranges[id(a)][0] for a in view.axes]
        order, par = loop_order(view.axes, view.shape, axes_here, _accesses(value_here, cond_here),
                                view.store, reads_in(value_here), piece)
        if par is not parallel:
            raise InternalError(f"the reduction nests of {t.name} chose another parallel axis")
        bounds = _const_bounds(ranges)
        bounds.update({id(r): (r.lo, r.hi) for r in axes_here})
        store = Store(t, tuple(view.store), dsl.cast(t.dtype, value_here), combine=combiner)
        stmts += accumulate_nest(order, bounds, store, cond_here, par, view.axes, machine)
    return stmts


TILE = 32


def _tile_transposed(t: Tensor, order: List[Var], accesses, store: Store):
    """Tile the two loops of a transposing element-wise nest, or None if it does not transpose.

    With ``v`` innermost (unit stride for the store) and a read unit-stride in
    another variable ``u``, ``TILE x TILE`` blocks keep both in cache:
    ``for uo, vo: for ui < TILE, vi < TILE`` with ``u = uo*TILE + ui``.
    Returns (statements, number of parallel tiles).
    """
    if len(order) < 2:
        return None
    v = order[-1]
    extent = dict(zip(map(id, t.op.axes), t.shape))
    for read in reads_in(store.value):
        acc = read.indices
        if not acc or coefficient(acc[-1], v) != 0 or all(coefficient(i, v) == 0 for i in acc):
            continue  # unit-stride or invariant in v: nothing to tile for
        u = next((x for x in order[:-1] if coefficient(acc[-1], x) in (1, -1)), None)
        if u is not None and extent[id(u)] >= 2 * TILE and extent[id(v)] >= 2 * TILE:
            break
    else:
        return None
    outer = [x for x in order if x is not u and x is not v]
    uo, vo, ui, vi = Var(u.name + "o"), Var(v.name + "o"), Var(u.name + "i"), Var(v.name + "i")
    nu, nv = extent[id(u)], extent[id(v)]
    c = dsl.const
    if _blocks_of_eight(t, store, read, u, v, nu, nv):  # 8 x 8 blocks transposed in registers
        ub, vb = Var(u.name + "b"), Var(v.name + "b")
        body = [transpose_block(u, v, uo * TILE + ub * 8, vo * TILE + vb * 8, store, read)]
        body = [Loop(vb, c(0), dsl.minimum(c(TILE), nv - vo * TILE) // 8, body)]
        body = [Loop(ub, c(0), dsl.minimum(c(TILE), nu - uo * TILE) // 8, body)]
    else:
        rename = {u: uo * TILE + ui, v: vo * TILE + vi}
        body = [Store(t, tuple(substitute(i, rename) for i in store.indices), substitute(store.value, rename))]
        body = [Loop(vi, c(0), dsl.minimum(c(TILE), nv - vo * TILE), body)]
        body = [Loop(ui, c(0), dsl.minimum(c(TILE), nu - uo * TILE), body)]
    body = [Loop(vo, c(0), c(-(-nv // TILE)), body)]
    body = [Loop(uo, c(0), c(-(-nu // TILE)), body, Parallel())]
    for x in reversed(outer):
        body = [Loop(x, c(0), c(extent[id(x)]), body)]
    return body, -(-nu // TILE)


def _blocks_of_eight(t: Tensor, store: Store, read: Read, u: Var, v: Var, nu: int, nv: int) -> bool:
    """True if the tiles can be cut into 8 x 8 blocks transposed in registers: 32-bit values,
    extents divisible by 8, the store's row unit-stride in ``v`` and the read's in ``u``."""
    four_bytes = ("float32", "int32")
    if t.dtype not in four_bytes or read.tensor.dtype not in four_bytes or nu % 8 or nv % 8:
        return False
    last_of = [(store.indices, v, u), (read.indices, u, v)]
    for idx, along, _ in last_of:
        if coefficient(idx[-1], along) != 1 or any(coefficient(i, along) != 0 for i in idx[:-1]):
            return False
    return all(coefficient(i, v) is not None and coefficient(i, u) is not None for i in read.indices)


def _const_bounds(ranges: Dict[int, Tuple[int, int]]) -> Dict[int, Tuple[Expr, Expr]]:
    return {k: (dsl.const(lo), dsl.const(hi)) for k, (lo, hi) in ranges.items()}


def _with_bounds(r: ReduceAxis, lo: Expr, hi: Expr) -> ReduceAxis:
    if lo is r.lo and hi is r.hi:
        return r
    return ReduceAxis(r.name, r.dtype, lo, hi)


def split_interior(axes: Sequence[Var], shape: Sequence[int], red_axes: Sequence[ReduceAxis]):
    """Pieces ``(output ranges, reduce bounds)`` covering the output domain once.

    When reduce bounds depend on output indices only near the borders (padding,
    kernel overhang), the interior, where every bound is constant, is one piece
    with constant bounds (so any loop order is legal there) and the borders are
    slabs that keep the original bounds.
    """
    full = {id(a): (0, n) for a, n in zip(axes, shape)}
    same = [(full, {id(r): (r.lo, r.hi) for r in red_axes})]
    red_ids = {id(r) for r in red_axes}
    used = {id(v) for r in red_axes for b in (r.lo, r.hi) for v in free_vars(b)}
    if not used or used & red_ids:
        return same
    dep = [(a, n) for a, n in zip(axes, shape) if id(a) in used]
    if int(np.prod([n for _, n in dep])) > (1 << 22):
        return same
    grid = Tensor("grid", tuple(n for _, n in dep), "bool", ComputeOp(tuple(a for a, _ in dep), dsl.const(True)))
    values = []
    for r in red_axes:
        for b in (r.lo, r.hi):
            probe = Tensor("bound", grid.shape, "int64", ComputeOp(grid.op.axes, dsl.cast("int64", b)))
            values.append(evaluate([probe], {})[0])
    uniform = _uniform_pieces(dep, values, red_axes, full)
    if uniform is not None:
        return uniform
    typical = [int(np.bincount(v.ravel() - v.min()).argmax() + v.min()) for v in values]
    inside = np.ones(grid.shape, dtype=bool)
    for v, c in zip(values, typical):
        inside &= v == c
    where = np.nonzero(inside)
    if not where[0].size:
        return same
    box = [(int(w.min()), int(w.max()) + 1) for w in where]
    if not inside[tuple(slice(lo, hi) for lo, hi in box)].all():
        return same  # constant bounds must hold at every point of the box (the slabs keep the rest exact)
    const_bounds = {}
    for n, r in enumerate(red_axes):
        const_bounds[id(r)] = (dsl.const(typical[2 * n]), dsl.const(typical[2 * n + 1]))
    interior = dict(full)
    interior.update({id(a): b for (a, _), b in zip(dep, box)})
    pieces = [(interior, const_bounds)]
    for k, ((a, n), (lo, hi)) in enumerate(zip(dep, box)):  # slabs around the interior box
        for rng in ((0, lo), (hi, n)):
            if rng[0] >= rng[1]:
                continue
            slab = dict(full)
            slab.update({id(b): box[m] for m, (b, _) in enumerate(dep[:k])})
            slab[id(a)] = rng
            pieces.append((slab, same[0][1]))
    return pieces


#: most pieces an output domain is cut into so that every piece has constant reduce bounds
MAX_PIECES = 32


def _uniform_pieces(dep, values, red_axes, full):
    """The output domain cut into boxes on which every reduce bound is constant, or None.

    Points are grouped by the values their bounds take (interior, edges and corners of
    a padded convolution; each kernel position of its weight gradient); each group must
    be a box, and there must be few of them."""
    stacked = np.stack([v.ravel() for v in values], axis=1)
    keys, labels = np.unique(stacked, axis=0, return_inverse=True)
    if len(keys) > MAX_PIECES:
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
        bounds = {id(r): (dsl.const(int(key[2 * n])), dsl.const(int(key[2 * n + 1])))
                  for n, r in enumerate(red_axes)}
        pieces.append((ranges, bounds))
    return pieces


def scatter_stages(t: Tensor) -> List[Stage]:
    """A zero-fill (split among threads), then ``t[indices] += value`` over the domain on one
    thread, indices checked at run time."""
    op: ScatterOp = t.op
    axes = [Var(f"i{d}") for d in range(t.ndim)]
    parallel = axes[0] if axes else None
    zero = nest(axes, {id(a): (dsl.const(0), dsl.const(n)) for a, n in zip(axes, t.shape)},
                 [Store(t, tuple(axes), dsl.const(0, t.dtype))], parallel)
    store = Store(t, op.indices, dsl.cast(t.dtype, op.value), combine="sum", checked=True)
    inner = [If(op.where, [store])] if op.where is not None else [store]
    acc = nest(list(op.axes), {id(r): (r.lo, r.hi) for r in op.axes}, inner, None)
    zero_fill = Stage(t, zero, t.shape[0] if axes else 0, parallel_axis=parallel, work=int(np.prod(t.shape)))
    return [zero_fill, Stage(t, acc, 0)]


def stages_for(outputs: Sequence[Tensor], machine: Optional[Machine] = None) -> List[Stage]:
    """The stages computing every non-placeholder tensor behind ``outputs``, producers first,
    scheduled for ``machine`` (default: this one)."""
    machine = machine if machine is not None else host_machine()
    copies = Copies()
    stages: List[Stage] = []
    done = set()
    for t in topo_order(list(outputs)):
        if isinstance(t.op, PlaceholderOp):
            continue
        if isinstance(t.op, ScatterOp):
            stages.extend(scatter_stages(t))
            continue
        body = t.op.body
        if split_terms(body) is None:
            body, lifted = normalized_body(t)
            for lt in lifted:  # lifted reductions are in terms form by construction
                if id(lt) not in done:
                    stages.append(compute_stage(lt, lt.op.body, machine))
                    done.add(id(lt))
        body, packed = pack_operands(t, body, split_terms(body)[1], _lane_var, copies)
        stages.extend(compute_stage(p, p.op.body, machine) for p in packed)
        stages.append(compute_stage(t, body, machine))
    return stages
