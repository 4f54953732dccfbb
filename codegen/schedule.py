"""The schedule: each tensor of a graph as a stage of loop nests, chosen for a machine.

This module is the policy. It writes each compute tensor's *definition* as plain loop
nests (:func:`definition`): an initialization nest ``T[i] = elementwise part`` (or the
combiner's identity; under the tensor's region when its readers use it only there,
:mod:`simplify.unread`), then, for each reduction term ``R_k f(i, k)`` of the body, an
accumulating nest ``for i: for k: [if guard:] T[i] = combine(T[i], f(i, k))`` (terms
form: a body that is not a sum of element-wise parts and guarded reductions first has
its nested reductions lifted into tensors of their own, :func:`te_grad.lift.normalized_body`).
It then runs the scheduling passes in a fixed order (:data:`PASSES`), each a
``Stage -> Stage`` function in a module of its own that states what it preserves:

1. :func:`.loop_order.order_elementwise`: the initialization nest's loop order, the
   stage's parallel axis (the first output axis of at least 4 values) split among threads;
2. :func:`.transpose_tiling.tile_transposes`: an element-wise stage that transposes, in
   tiles and 8 x 8 register blocks (then done);
3. :func:`.scan.scans`: a running reduction as a scan (then done);
4. :func:`.congruence.interleave_classes`: the initialization nest's innermost axis in
   congruence classes when it is divided (pooling gradients);
5. :func:`.select_ranges.split_select_ranges`: the initialization nest cut where its
   comparisons of an output loop with constants switch (a concat, the gradient of chunks),
   selects folded in each piece, its loop strip-mined by the constant it divides by;
6. :func:`.congruence.split_classes`: reduction terms split into congruence classes;
7. :func:`.pieces.split_pieces`: reduction terms cut into pieces with constant bounds;
8. :func:`.guard_ranges.narrow_guarded_loops`: guards bounding an output loop by
   constants moved into its range;
9. :func:`.triangles.split_triangles`: a loop whose range follows an outer loop (a causal
   triangle, a band) cut into blocks with constant bounds;
10. :func:`.loop_order.order_reductions`: each term nest's own best loop order;
11. :func:`.register_blocking.block_registers`: register blocks sized for the machine;
12. :func:`.cache_tiling.tile_stage`: cache tiles for the machine's L2.

Operands may first be replaced by copies in a better layout, stages of their own
(:mod:`.packing`, the pass ``"packing"``). Each pass is a :class:`SchedulePass` of the
registry :data:`PASSES`, named, with its one-line promise; the compile option
``disabled_passes`` (:mod:`.options`) switches passes off by name (or by module name:
``"register_blocking"``, ``"congruence"``...): a switched-off pass returns its input
unchanged, so a wrong kernel can be bisected to the pass that made it
(:func:`bisect`). The two loop-order passes cannot be switched off: they
mark the loop each nest splits among threads, and a stage split among threads with an
unmarked nest would run that nest whole on every thread (a race, wrong sums). A scatter becomes a zero-fill split among threads, then a serial
stage that accumulates with run-time checked indices; over CSR segments (a ragged loop),
:func:`.ragged_schedule.order_ragged_scatter` (the pass ``"order_ragged_scatter"``) puts its
feature axis innermost and splits it among threads along an axis that decides the location
written; threads then split the rows of a row pointer by their edges
(:func:`.ragged_split.balance_ragged_rows`, the pass ``"balance_ragged_rows"``). Each pass's output computes
exactly what its input did (:mod:`.interpret` runs both; the tests compare).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from te_grad import dsl
from te_grad.lift import normalized_body
from te_grad.ops import identity_of, reduction
from te_grad.graph import topo_order
from te_grad.transform import summands
from te_grad.errors import UserError
from te_grad.ir import Const, Expr, PlaceholderOp, Reduce, ScatterOp, Select, Tensor, Var, distinct_nodes
from te_grad.ir import structurally_equal
from simplify.count import RAGGED_TRIPS, tensor_iterations
from simplify.inline import Redirect
from simplify.unread import read_through, written_regions
from te_grad.transform import sum_terms
from te_grad.sizes import uses_sizes

from .cache_tiling import tile_stage
from .congruence import interleave_classes, split_classes
from .guard_ranges import narrow_guarded_loops
from .triangles import split_triangles
from .ragged_schedule import order_ragged_scatter
from .ragged_split import balance_ragged_rows
from .loop_order import lane_var, order_elementwise, order_reductions, parallel_axis, representative
from .loopir import Stage, Store, guarded, nest, stmt_stores
from .machine import PORTABLE, Machine
from .options import CompileOptions, current_options, using
from .packing import Copies, pack_operands
from .pieces import split_pieces
from .register_blocking import block_registers, decide_blocks
from .scan import scans
from .select_ranges import split_select_ranges
from .transpose_tiling import tile_transposes


#: the innermost iterations a stage with run-time extents is counted as (an int for the
#: plans and the optimizer's choices; such stages run whole on one thread)
SYMBOLIC_WORK = 1 << 20


def _has_reduce(e: Expr) -> bool:
    return any(isinstance(x, Reduce) for x in distinct_nodes(e))


def split_terms(body: Expr):
    """``(elementwise, [(guard, reduce)], combiner)`` if ``body`` is in terms form, else None."""
    if isinstance(body, Reduce):
        return (None, [(None, body)], body.combiner) if not _reduce_inside(body) else None
    elementwise: List[Expr] = []
    terms = []
    for s in summands(body):
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
    ew = sum_terms(elementwise) if elementwise else None
    return ew, terms, "sum"


def _reduce_inside(red: Reduce) -> bool:
    parts = [red.body] + ([red.where] if red.where is not None else [])
    parts += [b for ax in red.axes for b in (ax.lo, ax.hi)]
    return any(_has_reduce(p) for p in parts)


def definition(t: Tensor, body: Expr, region: Optional[Expr] = None) -> Stage:
    """The stage of compute ``t`` whose body (in terms form) is ``body``, as plain loops in
    the order of its axes: the initialization nest, then one accumulating nest per term.
    Its parallel axis is chosen (:func:`.loop_order.parallel_axis`), no loop is marked yet
    (but for an indexed reduction, which no pass changes: its loop over that axis is split).
    With a ``region`` (:func:`simplify.unread.written_regions`: no reader uses ``t`` elsewhere)
    the initialization nest runs under it, and a body ``if_then_else(region, e, c)`` stores
    ``e`` there."""
    ew, terms, _ = split_terms(body)
    axes, shape = list(t.op.axes), list(t.shape)
    symbolic = uses_sizes(t)
    # extents known at run time: the parallel axis chosen at a representative size, its
    # extent bound at each call (codegen.kernel)
    par = parallel_axis(axes, [representative(n) for n in shape] if symbolic else shape)
    split = par if any(reduction(red.combiner).indexed for _, red in terms) else None
    init = ew
    if terms and ew is None:
        init = dsl.const(identity_of(terms[0][1].combiner, t.dtype), t.dtype)
    if region is not None and isinstance(init, Select) and structurally_equal(init.cond, region):
        init = init.t
    full = {id(a): (dsl.const(0), n if isinstance(n, Expr) else dsl.const(n)) for a, n in zip(axes, shape)}
    stmts = nest(axes, full, guarded(region, Store(t, tuple(axes), dsl.cast(t.dtype, init))), split)
    for guard, red in terms:
        conds = ([guard] if guard is not None else []) + ([red.where] if red.where is not None else [])
        if reduction(red.combiner).indexed:  # the pair (body, axis): the body keeps its dtype
            store = Store(t, tuple(axes), red.body, combine=red.combiner, index=red.axes[0])
        else:
            store = Store(t, tuple(axes), dsl.cast(t.dtype, red.body), combine=red.combiner)
        bounds = {**full, **{id(r): (r.lo, r.hi) for r in red.axes}}
        stmts += nest(axes + list(red.axes), bounds, guarded(dsl.all(conds) if conds else None, store), split)
    if symbolic:  # the extent split among threads is that of the bound sizes (codegen.kernel)
        extent = representative(dict(zip(map(id, axes), shape))[id(par)]) if par is not None else 0
        return Stage(t, stmts, extent if extent > 1 else 0, parallel_axis=par if extent > 1 else None,
                     work=SYMBOLIC_WORK, region=region)
    return Stage(t, stmts, dict(zip(map(id, axes), shape))[id(par)] if par is not None else 0, parallel_axis=par,
                 region=region)


@dataclass(frozen=True)
class SchedulePass:
    """A scheduling pass of the registry :data:`PASSES`: ``run(stage, machine) -> stage``
    (None for ``"packing"``, which rewrites a tensor's operands before its stages are made);
    a ``final`` pass that changes the stage ends the scheduling, and only the ``lowering``
    passes (decisions on how marked loops are emitted) run after it; ``needed`` says why the
    pass cannot be switched off (None: it only makes code faster)."""
    name: str
    module: str
    run: Optional[Callable[[Stage, Machine], Stage]]
    promise: str
    final: bool = False
    needed: Optional[str] = None
    lowering: bool = False


#: the scheduling passes in order, each with its promise (the stage it returns computes
#: what its input did)
PASSES = (
    SchedulePass("packing", "packing", None,
                 "contraction operands read from copies in the layout their loops want (same values)"),
    SchedulePass("order_elementwise", "loop_order", lambda stage, machine: order_elementwise(stage),
                 "the initialization nest's loop order; the stage's parallel axis split among threads",
                 needed="it marks the loop the initialization nest splits among threads"),
    SchedulePass("tile_transposes", "transpose_tiling", lambda stage, machine: tile_transposes(stage),
                 "an element-wise transpose in tiles and 8 x 8 register blocks (then done)", final=True),
    SchedulePass("scans", "scan", lambda stage, machine: scans(stage),
                 "a running reduction as a linear scan (then done)", final=True),
    SchedulePass("interleave_classes", "congruence", lambda stage, machine: interleave_classes(stage),
                 "a divided innermost output axis of the initialization nest in congruence classes"),
    SchedulePass("split_select_ranges", "select_ranges", lambda stage, machine: split_select_ranges(stage),
                 "the initialization nest cut where its comparisons of an output loop with constants switch, "
                 "each piece's selects folded and its loop strip-mined by the constant it divides by"),
    SchedulePass("split_classes", "congruence", lambda stage, machine: split_classes(stage),
                 "reduction terms split into congruence classes of their output index"),
    SchedulePass("split_pieces", "pieces", lambda stage, machine: split_pieces(stage),
                 "reduction terms cut into pieces on which every bound is constant"),
    SchedulePass("narrow_guarded_loops", "guard_ranges", lambda stage, machine: narrow_guarded_loops(stage),
                 "guards bounding an output loop by constants moved into its range"),
    SchedulePass("split_triangles", "triangles", lambda stage, machine: split_triangles(stage),
                 "a loop whose range follows an outer loop (a triangle, a band) cut into blocks of constant bounds"),
    SchedulePass("order_reductions", "loop_order", lambda stage, machine: order_reductions(stage),
                 "each accumulating nest's own best loop order, the stage's parallel axis split",
                 needed="it marks the loop each accumulating nest splits among threads"),
    SchedulePass("block_registers", "register_blocking", block_registers,
                 "register blocks sized for the machine's vector registers"),
    SchedulePass("tile_stage", "cache_tiling", tile_stage, "cache tiles sized for the machine's L2"),
    SchedulePass("order_ragged_scatter", "ragged_schedule", lambda stage, machine: order_ragged_scatter(stage),
                 "a scatter over CSR segments: the feature axis innermost and an axis fixed by the location "
                 "written split among threads, each location's contributions in the same order (scatters only)"),
    SchedulePass("balance_ragged_rows", "ragged_split", lambda stage, machine: balance_ragged_rows(stage),
                 "rows of a row pointer split among threads by their edges instead of their number (each row "
                 "computed by one thread, the same code)"),
    # the lowering decision, last before emission: the loop program shows what is emitted
    SchedulePass("decide_blocks", "register_blocking",
                 lambda stage, machine: decide_blocks(stage, current_options().fast_math),
                 "register blocks and transposes without a vector form (for these options' fast_math) "
                 "turned back into the plain nests the emitter lowers",
                 needed="the emitter lowers only the blocks that have a vector form", lowering=True),
)


#: the passes run on a stage whose extents are known only at run time (size variables): every
#: scheduling pass (a copy of packing keeps a dimension of run-time extent whole). Decisions over int extents are as at fixed sizes;
#: those along an extent known at run time are taken at a representative size
#: (:func:`.loop_order.representative`: loop orders, cache tiles, the unroll-and-jam factor of
#: the split axis, whose values past the last whole block run in a remainder nest), and
#: reads are proven in bounds for every size (:mod:`.symbolic_bounds`)
RUN_TIME_EXTENT_PASSES = frozenset(p.name for p in PASSES)


def optional_passes() -> List[str]:
    """The names of the passes that may be switched off, in order."""
    return [p.name for p in PASSES if p.needed is None]


def disabled_pass_names(names: Iterable[str]) -> FrozenSet[str]:
    """The passes ``names`` switch off (a name is a pass's or its module's), checked: an
    unknown name, or a pass needed for correct code, is a UserError."""
    out = set()
    for name in sorted(set(names)):
        # a module's name switches off its passes, not the lowering decisions it also holds
        chosen = [p for p in PASSES if name == p.name or (name == p.module and not p.lowering)]
        if not chosen:
            modules = sorted({p.module for p in PASSES} - {p.name for p in PASSES})
            raise UserError(f"unknown schedule pass {name!r} in disabled_passes; the passes are "
                            f"{', '.join(p.name for p in PASSES)} (or by module: {', '.join(modules)})")
        for p in chosen:
            if p.needed is not None:
                raise UserError(f"the schedule pass {p.name} cannot be disabled: {p.needed} (without it the "
                                f"kernel would compute wrong values); the passes that can be are "
                                f"{', '.join(optional_passes())}")
            out.add(p.name)
    return frozenset(out)


def schedule_steps(t: Tensor, body: Expr, machine: Machine = PORTABLE,
                   disabled: Iterable[str] = (), region: Optional[Expr] = None) -> Iterator[Tuple[str, Stage]]:
    """``(pass name, stage)`` after the definition and after each pass of :data:`PASSES`:
    every intermediate schedule of ``t`` (each computes ``t``, at least on ``region``; the
    tests interpret them all). A pass in ``disabled`` (names as :func:`disabled_pass_names`
    takes them) returns its input unchanged."""
    off = disabled_pass_names(disabled)
    stage = definition(t, body, region)
    yield "definition", stage
    symbolic = uses_sizes(t)
    if any(s.index is not None for s in stmt_stores(stage.body)):
        return  # an indexed reduction stays as defined: its winner test evaluates the body at the stored index
    ended = False  # a final pass changed the stage: only the lowering decisions follow
    for p in PASSES:
        if p.run is None or (ended and not p.lowering):
            continue
        if symbolic and p.name not in RUN_TIME_EXTENT_PASSES:
            continue  # extents known only at run time: this pass needs int extents
        new = stage if p.name in off else p.run(stage, machine)
        yield p.name, new
        ended = ended or (p.final and new is not stage)
        stage = new


def compute_stage(t: Tensor, body: Expr, machine: Machine = PORTABLE, disabled: Iterable[str] = (),
                  region: Optional[Expr] = None) -> Stage:
    """The stage of compute ``t`` whose body (in terms form) is ``body``, scheduled for
    ``machine`` by :data:`PASSES` (but those ``disabled``), writing ``t`` at least on
    ``region`` (everywhere without one)."""
    stage = None
    for _, stage in schedule_steps(t, body, machine, disabled, region):
        pass
    if region is not None and stage.work is None:  # the threads sized for the points written
        stage = replace(stage, work=tensor_iterations(t, RAGGED_TRIPS, region))
    return stage


def scatter_stages(t: Tensor, off: FrozenSet[str] = frozenset()) -> List[Stage]:
    """A zero-fill (split among threads), then ``t[indices] += value`` over the domain on one
    thread, indices checked at run time (over CSR segments, split among threads where no two
    threads write one location, :mod:`.ragged_schedule`, by edges, :mod:`.ragged_split`,
    unless ``off`` names the passes)."""
    op: ScatterOp = t.op
    axes = [Var(f"i{d}") for d in range(t.ndim)]
    parallel = axes[0] if axes else None
    if uses_sizes(t):  # extents known at run time: both nests run whole
        parallel = None
    zero = nest(axes, {id(a): (dsl.const(0), n if isinstance(n, Expr) else dsl.const(n))
                       for a, n in zip(axes, t.shape)},
                [Store(t, tuple(axes), dsl.const(0, t.dtype))], parallel)
    store = Store(t, op.indices, dsl.cast(t.dtype, op.value), combine="sum", checked=True)
    acc = nest(list(op.axes), {id(r): (r.lo, r.hi) for r in op.axes}, guarded(op.where, store), None)
    if parallel is None and axes:
        return [Stage(t, zero, 0, work=SYMBOLIC_WORK), Stage(t, acc, 0, work=SYMBOLIC_WORK)]
    zero_fill = Stage(t, zero, t.shape[0] if axes else 0, parallel_axis=parallel, work=int(np.prod(t.shape)))
    accumulate = Stage(t, acc, 0)
    if "order_ragged_scatter" not in off:
        accumulate = order_ragged_scatter(accumulate)
    if "balance_ragged_rows" not in off:
        accumulate = balance_ragged_rows(accumulate)
    return [zero_fill, accumulate]


def stages_for(outputs: Sequence[Tensor], machine: Optional[Machine] = None,
               options: Optional[CompileOptions] = None) -> List[Stage]:
    """The stages computing every non-placeholder tensor behind ``outputs``, producers first,
    scheduled for ``machine`` (default: that of ``options``, else this one) with ``options``
    (default: the compile options in force: their packing thresholds, their disabled passes)."""
    options = options if options is not None else current_options()
    machine = machine if machine is not None else options.resolved_machine()
    off = disabled_pass_names(options.disabled_passes)
    with using(options):  # what the packing thresholds are read from
        return _stages(outputs, machine, off)


def _stages(outputs: Sequence[Tensor], machine: Machine, off: FrozenSet[str]) -> List[Stage]:
    copies = Copies()
    stages: List[Stage] = []
    done = set()
    regions = written_regions(outputs)  # tensors no reader uses everywhere: written only there
    through = read_through(outputs, regions)  # masked copies: their readers read what they copy
    redirect = Redirect(through, {}).visit if through else (lambda e: e)
    # what a padded hull (codegen.packing) must not read: tensors written only on their region,
    # those a copy's readers now read instead (their values outside it are the graph's, never
    # evaluated), and below, each tensor's lifted reductions (computed at every point)
    unhulled = frozenset(regions) | {id(x) for x in through.values()}
    for t in topo_order(list(outputs)):
        if isinstance(t.op, PlaceholderOp):
            continue
        if isinstance(t.op, ScatterOp):
            stages.extend(scatter_stages(t, off))
            continue
        if id(t) in through:
            continue
        body = t.op.body
        if split_terms(body) is None:
            body, lifted = normalized_body(t)
            for lt in lifted:  # lifted reductions are in terms form by construction
                unhulled |= {id(lt)}
                if id(lt) not in done:
                    stages.append(compute_stage(lt, redirect(lt.op.body), machine, off))
                    done.add(id(lt))
        body = redirect(body)
        packed = []
        if "packing" not in off:
            body, packed = pack_operands(t, body, split_terms(body)[1], lane_var, copies, unhulled)
        stages.extend(compute_stage(p, p.op.body, machine, off) for p in packed)
        stages.append(compute_stage(t, body, machine, off, regions.get(id(t))))
    return stages


def bisect(build_fn: Callable[[CompileOptions], object], check_fn: Callable[[object], bool],
           passes: Optional[Sequence[str]] = None, base: Optional[CompileOptions] = None) -> Optional[str]:
    """The schedule pass that makes a build wrong, or None if the build is right.

    ``build_fn(options)`` builds (a kernel, say) with ``options``; ``check_fn(result)`` is
    True when the result is right. The passes that may be switched off (``passes``, default
    every optional pass in order) are bisected: the first pass of the order that, switched
    on together with every pass before it, makes the check fail. A UserError if the build
    is wrong with every such pass off (the fault is elsewhere)."""
    base = base if base is not None else current_options()
    order = list(passes) if passes is not None else list(optional_passes())

    def good(enabled: int) -> bool:  # the first ``enabled`` passes on, the rest off
        off = base.disabled_passes | frozenset(order[enabled:])
        return bool(check_fn(build_fn(base.replace(disabled_passes=off))))

    if good(len(order)):
        return None
    if not good(0):
        raise UserError("bisect: the build is wrong with every optional schedule pass switched off")
    lo, hi = 0, len(order)  # good(lo), not good(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if good(mid):
            lo = mid
        else:
            hi = mid
    return order[hi - 1]
