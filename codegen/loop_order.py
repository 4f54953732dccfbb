"""Loop order: which loop runs innermost (carries the vector lanes), which outermost, which
is split among threads.

:func:`loop_order` decides for one nest from the cost of each access per vector of lanes;
the passes apply it to a stage's nests: :func:`order_elementwise` to its initialization
nest, :func:`order_reductions` to each accumulating nest (after the congruence classes
and the interior pieces are cut, so that each piece gets the order best for it).

Promises: only perfectly nested loops are permuted, and only where no loop's bounds use
a variable placed inside it; every nest of a stage splits the stage's own parallel axis
among threads (so that a thread writes the same rows in every nest of the stage). An
initialization nest writes each element once and an accumulating nest combines each
element's terms in some order: a permutation changes which element is computed when,
and, under ``fast_math``, the order of a sum's terms, never which terms.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from simplify.affine import constant_value
from simplify.linear import coefficient
from te_grad import dsl
from te_grad.graph import free_vars
from te_grad.ir import Binary, Const, Expr, Read, Reduce, ReduceAxis, Tensor, Var, distinct_reads
from te_grad.transform import substitute

from .loopir import Nest, Stage, rewrite_nests


#: relative cost of one access per vector of lanes along the innermost loop: a unit-stride
#: load or store, a value invariant in the loop (loaded once and broadcast), and any
#: other stride (a gather or a scatter, one element per lane)
UNIT_COST, INVARIANT_COST, STRIDED_COST = 1.0, 0.25, 8.0
#: a loop shorter than a vector cannot vectorize: the extra cost of putting lanes on it
SHORT_LOOP_COST = 16.0


#: the value a size variable (``tg.var``) stands at when a loop order is chosen for extents
#: known only at run time (clamped to the variable's range): a long loop
REPRESENTATIVE_SIZE = 256


def representative(n) -> Optional[int]:
    """An extent as an int to choose loop orders by: an int itself, a size expression at
    :data:`REPRESENTATIVE_SIZE` (each variable clamped to its range), None if it uses
    loop variables."""
    if not isinstance(n, Expr):
        return int(n)
    from te_grad.sizes import clamped, is_size_expr, size_vars_in, value
    if not is_size_expr(n):
        return None
    return value(n, clamped(size_vars_in(n), REPRESENTATIVE_SIZE))


def _size_bound(e: Expr) -> bool:
    """Whether a loop bound is a constant or a size expression (no loop variable)."""
    return isinstance(e, Const) or representative(e) is not None


def panel_width(indices: Sequence[Expr], v: Var) -> Optional[int]:
    """``w``, a power of two, when ``indices`` are ``[.., v // w, .., v % w]`` with ``v`` in no
    other index: a copy in panels of ``w`` along ``v`` (:mod:`.packing`), whose lanes along
    ``v`` are contiguous within a panel (one vector load per panel when a block's first lane
    is a multiple of ``w`` or of its width, both powers of two, :mod:`.llvm_blocks`)."""
    last = indices[-1] if indices else None
    if not (isinstance(last, Binary) and last.op == "floormod" and last.a is v and isinstance(last.b, Const)):
        return None
    w = int(last.b.value)
    quotients = [k for k, i in enumerate(indices[:-1]) if isinstance(i, Binary) and i.op == "floordiv"
                 and i.a is v and isinstance(i.b, Const) and int(i.b.value) == w]
    if w < 2 or w & (w - 1) or len(quotients) != 1 or any(k != quotients[0] and any(x is v for x in free_vars(i))
                                           for k, i in enumerate(indices[:-1])):
        return None
    return w


def _lane_cost(indices: Sequence[Expr], v: Var) -> float:
    """The cost of an access at ``indices`` when vector lanes run along ``v``."""
    if not indices:
        return INVARIANT_COST
    uses = [any(x is v for x in free_vars(i)) for i in indices]
    if not any(uses):
        return INVARIANT_COST
    if not any(uses[:-1]) and coefficient(indices[-1], v) in (1, -1) or panel_width(indices, v):
        return UNIT_COST
    return STRIDED_COST


def contiguous_indices(indices: Sequence[Expr], shape: Sequence) -> Tuple[Expr, ...]:
    """``indices`` without the trailing dimensions of extent 1, which never move the address:
    the lanes along ``c`` of ``conv2d[n, c, 0, 0]`` (a 1 x 1 image) are contiguous."""
    k = len(indices)
    while k > 1 and k <= len(shape) and not isinstance(shape[k - 1], Expr) and shape[k - 1] == 1:
        k -= 1
    return tuple(indices[:k])


def _max_stride(v: Var, reads: Sequence[Read]) -> int:
    """The largest number of elements one step of ``v`` moves any of ``reads``."""
    best = 0
    for r in reads:
        stride = 1
        if panel_width(r.indices, v):  # contiguous within a panel
            best = max(best, 1)
            continue
        for ix, n in reversed(list(zip(r.indices, r.tensor.shape))):
            c = coefficient(ix, v)
            if c is None:
                best = max(best, stride)
            elif c:
                best = max(best, abs(c) * stride)
            stride *= representative(n) or 1
    return best


def parallel_axis(out_axes: Sequence[Var], shape: Sequence[int]) -> Optional[Var]:
    """The output axis split among threads: the first of at least 4 values (else the longest)."""
    if not out_axes:
        return None
    big = [a for a, n in zip(out_axes, shape) if n >= 4]
    return big[0] if big else max(zip(out_axes, shape), key=lambda p: p[1])[0]


def loop_order(out_axes: Sequence[Var], shape: Sequence[int], red_axes: Sequence[ReduceAxis],
               accesses: Sequence[Sequence[Expr]], store: Sequence[Expr],
               reads: Sequence[Read] = (), piece: Optional[Sequence[int]] = None,
               parallel: Optional[Var] = None, first: Optional[Sequence[int]] = None
               ) -> Tuple[List[Var], Optional[Var]]:
    """An order for the loops over ``out_axes`` (extents ``shape``) and ``red_axes``, and the parallel axis.

    ``piece`` gives the extents of the output axes in the piece of the domain being
    ordered (an edge of a padded convolution is one column wide): the innermost loop is
    chosen for them; reduce bounds that vary are measured in the middle of the whole
    domain (``first``: its first values, 0 by default). The parallel axis is ``parallel``
    when given (a stage splits one axis in every nest), else :func:`parallel_axis` of the
    whole domain."""
    shape = [representative(n) or 0 for n in shape]  # extents known at run time: at a representative size
    extents: Dict[int, int] = {id(a): representative(n) or 0
                               for a, n in zip(out_axes, piece if piece is not None else shape)}
    starts = first if first is not None else [0] * len(out_axes)
    middle_point = {a: dsl.const(s + n // 2) for a, s, n in zip(out_axes, starts, shape)}
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
    if parallel is None:
        parallel = parallel_axis(out_axes, shape)
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
        # between equal costs, an axis not split among threads when reduce loops run
        # (lanes along the split axis leave no register block: a convolution of 2 x 2
        # images with lanes along its batch, not its channels, ran 500 times slower);
        # then the smaller largest stride: lanes a page or more apart (a batch axis)
        # share cache sets and miss the TLB one by one
        return (-cost, not (red_axes and v is parallel), -stride(v), n)

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


def lane_var(t: Tensor, red: Reduce) -> Optional[Var]:
    """The variable :func:`loop_order` runs the vector lanes of reduction term ``red`` of
    ``t`` along (its innermost loop), over the whole output domain."""
    order, _ = loop_order(list(t.op.axes), list(t.shape), list(red.axes), accesses(red.body, red.where),
                          contiguous_indices(t.op.axes, t.shape), distinct_reads(red.body))
    return order[-1] if order else None


def accesses(*exprs: Optional[Expr]) -> List[Sequence[Expr]]:
    """The indices of each read node of ``exprs`` (a node shared within one expression once:
    the emitted code loads it once)."""
    return [r.indices for e in exprs if e is not None for r in distinct_reads(e)]


def _nest_order(n: Nest, parallel: Optional[Var], domains: Dict[int, Tuple[int, int]],
                strides_of_reads: bool = True) -> List[Var]:
    """The order :func:`loop_order` gives the loops of ``n`` (output bounds constant), the
    extents of varying reduce bounds taken in the middle of ``domains`` (each output
    variable's range over all the pieces of its term); ties between lanes are broken by the
    memory strides of the store and, with ``strides_of_reads``, of the reads."""
    outs = n.outputs
    out_ids = {id(v) for v in outs}
    piece = [representative(lp.hi) - representative(lp.lo) for lp in n.loops if id(lp.var) in out_ids]
    whole = [domains[id(v)] for v in outs]
    reads = distinct_reads(n.store.value) if strides_of_reads else ()
    order, _ = loop_order(outs, [hi - lo for lo, hi in whole], n.reductions, accesses(n.store.value, n.cond),
                          contiguous_indices(n.store.indices, n.store.tensor.shape), reads, piece,
                          parallel=parallel, first=[lo for lo, _ in whole])
    return order


def _domains(stage: Stage) -> Dict[int, Tuple[int, int]]:
    """Each output variable's range over all the nests of ``stage`` that loop over it with
    constant bounds (the pieces of one term share their output variables)."""
    out: Dict[int, Tuple[int, int]] = {}
    for s in stage.body:
        n = Nest.of(s)
        for lp in n.loops if n is not None else ():
            if not isinstance(lp.var, ReduceAxis) and _size_bound(lp.lo) and _size_bound(lp.hi):
                lo0, hi0 = representative(lp.lo), representative(lp.hi)
                lo, hi = out.get(id(lp.var), (lo0, hi0))
                out[id(lp.var)] = (min(lo, lo0), max(hi, hi0))
    return out


def order_elementwise(stage: Stage) -> Stage:
    """The initialization nest (the first statement, no reduce loop) in its best order, the
    stage's parallel axis split among threads."""
    done = []

    def order(n: Nest):
        if done or n.accumulates or n.reductions or any(not _size_bound(b) for lo_hi in n.bounds.values()
                                                        for b in lo_hi):
            return None
        done.append(True)
        return [n.stmt(_nest_order(n, stage.parallel_axis, _domains(stage), strides_of_reads=False),
                       parallel=stage.parallel_axis)]
    return rewrite_nests(stage, order)


def order_reductions(stage: Stage) -> Stage:
    """Each accumulating nest in its best order for its own extents (an edge piece of a padded
    convolution may vectorize along another axis than the interior), the stage's parallel
    axis split among threads in every one."""
    domains = _domains(stage)

    def order(n: Nest):
        if not n.accumulates or not all(_size_bound(b) for lp in n.loops
                                        if not isinstance(lp.var, ReduceAxis) for b in (lp.lo, lp.hi)):
            return None
        return [n.stmt(_nest_order(n, stage.parallel_axis, domains), parallel=stage.parallel_axis)]
    return rewrite_nests(stage, order)
