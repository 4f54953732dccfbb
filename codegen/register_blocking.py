"""Register blocking: the loops of one reduction term, innermost run kept in vector registers.

:func:`accumulate_nest` turns a loop order for ``T[j] = combine(T[j], body)`` into
loops. When the innermost loop runs over an output axis with reduce loops just
outside it (or over a reduce axis whose lanes can combine at the end), those
loops become one register block (a nest annotated :class:`~codegen.loopir.RegisterBlocked`),
sized for the machine
(:func:`block_vector_bits`, :func:`accumulator_registers`), with up to two
serial output loops and the split one unrolled and jammed into it
(:func:`_jam_choices`). :func:`block_registers` is the pass over a stage.

Promises: the nest computes exactly the term (a block's annotation never changes
its meaning: its body is the plain nest); each thread of the split loop takes whole
jammed blocks.

The lowering decision, the last pass before emission (:func:`decide_blocks`, run by
:func:`.schedule.stages_for`): the scheduling passes mark register blocks and 8 x 8
transposes (:class:`~codegen.loopir.Transposed`) from the shape of a nest; whether a
marked loop has a vector form depends on more: its value's element type and
operations, whether every read is safe to evaluate at every lane (interval analysis
over the loops around it), the length of the vector row, and, for lanes that
reassociate a sum or a product, ``fast_math``. :func:`decide_blocks` settles that for
each marked loop and turns a loop without a vector form back into its plain nest, so
the loop program (``kernel.loops``) shows exactly the blocks the machine code has; the
emitter (:mod:`.llvm_emit`) lowers every annotated loop it is given and raises an
:class:`~te_grad.errors.InternalError` on one it cannot. :func:`block_plan` is a
register block's layout (vector width, full blocks, the overlapping last block),
computed from the same facts by this pass and by the emitter. Loops are only ever
unmarked there, never marked, and the stage computes exactly what it did.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Dict, List, Optional, Tuple

from simplify.linear import coefficient
from te_grad import dsl
from te_grad.graph import free_vars
from te_grad.ir import distinct_reads
from te_grad.intervals import interval, speculatable
from te_grad.ir import Const, Expr, Var
from te_grad.ops import reduction

from .llvm_types import SIZE, strides, vectorizable
from .loopir import (SERIAL, Carried, Jam, Loop, Nest, Parallel, RegisterBlock, RegisterBlocked, Stage, StmtMutator,
                     Store, TransposeBlock, Transposed, guarded, nest, register_block, rewrite_nests)
from .loop_order import representative
from .machine import Machine
from .options import current_options
from .symbolic_bounds import speculatable_within, stage_size_vars


def accumulate_nest(order: List[Var], bounds, store: Store, cond, parallel, out_axes,
                     machine: Machine) -> List:
    """The loops of one reduction term; when the innermost loop runs over an output axis
    with reduce loops just outside it, those become a register block. When the split axis's
    factor does not divide it (or its extent is known only at run time), a second block covers
    the values past the last whole block: jammed by a divisor (4, 3 or 2) of the first block's
    factor that divides the axis's constant extent (the threads' ranges, multiples of the
    stages' block sizes, :attr:`.loopir.Stage.parallel_granule`, are then unchanged, and
    give each block to one thread), else one value at a time."""
    inner_var = order[-1]
    k = len(order) - 1
    while k > 0 and not any(order[k - 1] is a for a in out_axes):
        k -= 1
    reduce_suffix = order[k:-1]
    inner_is_output = any(inner_var is a for a in out_axes)
    constant = isinstance(bounds[id(inner_var)][0], Const) and isinstance(bounds[id(inner_var)][1], Const)
    red = reduction(store.combine) if store.combine is not None else None
    lanes_on_reduction = not inner_is_output and red is not None and red.lowering != "mul" and not red.indexed
    if constant and inner_var is not parallel and (inner_is_output and reduce_suffix or lanes_on_reduction):
        loops = [Loop(v, *bounds[id(v)], ()) for v in reduce_suffix]
        accumulators = accumulator_registers(machine)
        outer = list(order[:k])
        bounds = dict(bounds)
        jams = []
        scaled = None
        remainder = None  # the split axis's last values past whole blocks (a run-time extent, or one not divisible)
        row = None  # lanes along an output axis: the block's row, in vector registers
        if inner_is_output:
            lanes = block_vector_bits(machine, reduce_lanes=False) // (8 * SIZE.get(store.tensor.dtype, 4))
            row = (int(bounds[id(inner_var)][1].value) - int(bounds[id(inner_var)][0].value)) // lanes
        for var, factor in _jam_choices(outer, bounds, store, parallel, out_axes, accumulators, row, inner_var):
            jam_outer = Var(var.name + "o")
            hi = bounds[id(var)][1]
            if var is parallel and (not isinstance(hi, Const) or hi.value % factor):
                # the split loop, [0, n), in whole blocks; the values past the last one form a remainder
                if isinstance(hi, Const):
                    whole, start = dsl.const(hi.value // factor), dsl.const(hi.value // factor * factor)
                else:
                    whole = hi // factor
                    start = whole * factor
                remainder = (bounds[id(var)], start)
                jams.append(Jam(var, jam_outer, factor))
                bounds[id(jam_outer)] = (dsl.const(0), whole)
            else:
                lo, hi = (int(b.value) for b in bounds[id(var)])
                jams.append(Jam(var, jam_outer, factor, base=lo))
                bounds[id(jam_outer)] = (dsl.const(0), dsl.const((hi - lo) // factor))
            outer = [jam_outer if v is var else v for v in outer]
            if var is parallel:
                scaled = (jam_outer, factor)

        def blocked(jams, outer, bounds, scaled):
            block = register_block(inner_var, *bounds[id(inner_var)], loops, cond, store, jams,
                                   reduce_lanes=not inner_is_output,
                                   vector_bits=block_vector_bits(machine, reduce_lanes=not inner_is_output),
                                   accumulators=accumulators)
            body: List = [block]
            for v in reversed(outer):
                lo, hi = bounds[id(v)]
                if scaled is not None and v is scaled[0]:  # threads take whole blocks of the split axis
                    body = [Loop(v, lo, hi, body, Parallel(scale=scaled[1]))]
                else:
                    body = [Loop(v, lo, hi, body, Parallel() if v is parallel else SERIAL)]
            return body

        body = blocked(jams, outer, bounds, scaled)
        if remainder is not None:  # the same block over [whole blocks, n), the split axis jammed by
            # a divisor of the main factor dividing both ends when they are constants, else not jammed
            jam_outer, rest, (start, end) = scaled[0], dict(bounds), (remainder[1], remainder[0][1])
            others = [j for j in jams if j.var is not parallel]
            copies = math.prod(j.factor for j in others)
            factor = next((f for f in (4, 3, 2) if isinstance(start, Const) and isinstance(end, Const)
                           and scaled[1] % f == 0 and end.value % f == 0 and copies * f <= accumulators), None)
            if factor is None:
                rest[id(parallel)] = (start, end)
                body += blocked(others, [parallel if v is jam_outer else v for v in outer], rest, None)
            else:  # threads take the same blocks of the split axis as the loop of whole blocks does
                rest_outer = Var(parallel.name + "r")
                rest[id(rest_outer)] = (dsl.const(start.value // factor), dsl.const(end.value // factor))
                body += blocked(others + [Jam(parallel, rest_outer, factor)],
                                [rest_outer if v is jam_outer else v for v in outer], rest, (rest_outer, factor))
        return body
    return nest(order, bounds, guarded(cond, store), parallel)


def block_registers(stage: Stage, machine: Machine) -> Stage:
    """Each accumulating nest of ``stage`` (its loops ordered) through :func:`accumulate_nest`."""
    def block(n: Nest):
        if not n.accumulates or not n.loops:
            return None
        return accumulate_nest(n.order, n.bounds, n.store, n.cond, n.parallel, n.outputs, machine)
    return rewrite_nests(stage, block)


def accumulator_registers(machine: Machine) -> int:
    """Vector registers a register block's accumulators may take: three quarters of the
    machine's (12 of AVX2's 16, 24 of AVX-512's 32), the rest for operands."""
    return machine.vector_registers * 3 // 4


def block_vector_bits(machine: Machine, reduce_lanes: bool) -> int:
    """Bits of the vectors of a register block: the machine's widest, except that lanes
    along a reduce axis stay at 256 bits. Such a block loads a vector of every operand
    for each multiply-add, and with 512-bit vectors it is limited by loads from the
    cache (on an AVX-512 Xeon, a 1024-square ``X @ W.T`` ran at 83-86 GFLOP/s with
    512-bit vectors against 97 with 256-bit ones; ``X @ W``, which broadcasts one
    operand, gains from 79 to 131)."""
    return machine.vector_bits if not reduce_lanes else min(machine.vector_bits, 256)


def _jam_choices(outer: List[Var], bounds, store: Store, parallel, out_axes,
                 max_copies: int, row: Optional[int] = None, inner: Optional[Var] = None) -> List[Tuple[Var, int]]:
    """Output loops to unroll-and-jam into the register block, with their factors.

    Each must have constant bounds ``[lo, hi)`` with ``hi - lo`` divisible by its factor
    (``lo`` is 0 for the split loop, whose threads take ranges of blocks, and whose last values
    past whole blocks may form a remainder, see :func:`accumulate_nest`), must not bound other
    loops, and some read of the body must not depend on it (that read is then shared by
    the jammed copies). First the innermost such loop that is not split among threads
    and the next such loop out, each by 4, 3 or 2 (a block of ``Q @ K.T`` then
    shares each row of ``Q`` among columns and each row of ``K`` among rows); then the
    split loop itself, by the largest of 8, 6, 4, 3, 2 dividing its extent (of 8, 4, 2 when
    the extent is known at run time; when the row is one vector register, the factor keeping
    the most copies busy, dividing or not, the last values then forming a remainder); at most
    ``max_copies`` copies in all, and at least ``Thresholds.min_split_blocks`` blocks of the split
    loop for the threads (:mod:`codegen.options`).

    When the block's lanes run along an output axis whose row holds at least 2 vector
    registers (``row``; ``inner`` is the lanes' loop), the factors are chosen together
    instead (:func:`_jams_by_loads`): the most accumulators busy, then the least weighted
    loads per step of the reduce loops. With 12 accumulators, 6 rows of 2 registers rather
    than 8 rows of one (8 accumulators, too few to cover the latency of two multiply-add
    units, and 9 loads for 8 multiply-adds)."""
    reads = distinct_reads(store.value)

    def eligible(v):
        if not any(v is a for a in out_axes):
            return False
        lo, hi = bounds[id(v)]
        if not isinstance(lo, Const) or (v is parallel and lo.value != 0):
            return False
        # an extent known at run time: only the split loop, over whole blocks and a remainder
        if not isinstance(hi, Const) and not (v is parallel and representative(hi) is not None):
            return False
        # no loop (outer, or inside the block) may have bounds that use v: the jammed copies
        # run those loops once, for all values of v together
        if any(v is x for k, lo_hi in bounds.items() if k != id(v) for b in lo_hi for x in free_vars(b)):
            return False
        return any(not _uses(r, v) for r in reads)

    if row is not None and row >= 2:
        assert inner is not None, "the lanes' loop decides which reads are vectors"
        return _jams_by_loads(outer, bounds, parallel, eligible, max_copies, row, reads, inner)
    chosen: List[Tuple[Var, int]] = []
    copies = 1
    for v in reversed(outer):
        if v is not parallel and eligible(v):
            n = bounds[id(v)][1].value - bounds[id(v)][0].value
            factor = next((f for f in (4, 3, 2) if n % f == 0 and n >= f and copies * f <= max_copies), None)
            if factor is not None:
                chosen.append((v, factor))
                copies *= factor
                if len(chosen) == 2:
                    break
    if parallel is not None and any(parallel is v for v in outer) and eligible(parallel):
        hi = bounds[id(parallel)][1]
        fewest = current_options().thresholds.min_split_blocks
        if isinstance(hi, Const) and row:  # (a row of one register)
            n = hi.value
            fits = [f for f in (8, 6, 4, 3, 2) if n // f >= fewest and copies * f <= max_copies]
            factor = max(fits, key=lambda f: (_accumulators_used(copies * f, max_copies, row), n % f == 0, f),
                         default=None)
        elif isinstance(hi, Const):
            n = hi.value
            factor = next((f for f in (8, 6, 4, 3, 2) if n % f == 0 and n // f >= fewest
                           and copies * f <= max_copies), None)
        else:  # chosen at a representative size; the values past the last whole block form a remainder
            n = representative(hi)
            factor = next((f for f in (8, 4, 2) if n // f >= fewest and copies * f <= max_copies), None)
        if factor is not None:
            chosen.append((parallel, factor))
    return chosen


#: what a vector load of a register block's operand weighs against a broadcast of one value
#: (an estimate): the vector rows stream through the block from the outer cache levels (a row
#: of ``W`` in ``X @ W``), the broadcast values are the few elements of the block's own rows,
#: in L1. With 1, 3 rows of 4 registers (7 loads per 12 multiply-adds) would win over 6 rows
#: of 2 (8 loads); on AVX2 (``znver3``) the 6 rows of 2 ran faster (BENCHMARKS.md)
VECTOR_LOAD_COST = 2


def _uses(r, v) -> bool:
    """Whether an index of read ``r`` uses loop variable ``v``."""
    return any(x is v for i in r.indices for x in free_vars(i))


def _jams_by_loads(outer: List[Var], bounds, parallel, eligible, max_copies: int, row: int, reads,
                   inner: Var) -> List[Tuple[Var, int]]:
    """The jam of a block whose lanes run along an output axis (loop ``inner``, its row ``row``
    vector registers long), chosen among every combination of factors, at most ``max_copies``
    copies in all, of the two innermost eligible loops not split among threads that have one
    (4, 3, 2 dividing their extents, or none) and of the split loop (8, 6, 4, 3, 2 with at
    least ``Thresholds.min_split_blocks`` blocks at its extent or representative size, or
    none; a factor not dividing it leaves a remainder, :func:`accumulate_nest`). The order:
    the most accumulators in use (:func:`_accumulators_used`), then the least weighted loads
    per step of the reduce loops, then a split factor dividing the split loop's constant
    extent, then the smallest split factor (the shortest remainder), then the fewest copies
    (each then holds more of the row: its vector loads run longer along one row of memory).
    A read weighs, per step, one load for each of its distinct copies (the product of the
    factors of the jammed loops its indices use), :data:`VECTOR_LOAD_COST` per vector
    register when it varies along the lanes.

    ``Y[b, s, :] = X[b, s, :] @ W`` over a run-time batch ``b`` (the reshaped layout of a
    transformer's linear layers) so gets 6 rows (``s`` by 2, ``b`` by 3) of 2 registers: 6
    broadcasts and 2 vector loads for 12 multiply-adds, where jamming ``s`` by 4 first left
    room for ``b`` by 2 only, 8 rows of one register (8 broadcasts and a vector load for 8).
    A convolution whose vector operand varies with the output rows gets copies along the
    channels and the images, which share the weights' broadcasts and the input rows."""
    fewest = current_options().thresholds.min_split_blocks
    loops: List[Tuple[Var, List[int]]] = []
    for v in reversed(outer):
        if len(loops) == 2:
            break
        if v is not parallel and eligible(v):
            n = bounds[id(v)][1].value - bounds[id(v)][0].value
            factors = [f for f in (4, 3, 2) if n % f == 0 and n >= f]
            if factors:
                loops.append((v, factors + [1]))
    hi = None
    if parallel is not None and any(parallel is v for v in outer) and eligible(parallel):
        hi = bounds[id(parallel)][1]
        n = hi.value if isinstance(hi, Const) else representative(hi)
        loops.append((parallel, [f for f in (8, 6, 4, 3, 2) if n // f >= fewest] + [1]))
    used = [[_uses(r, v) for v, _ in loops] for r in reads]
    along = [_uses(r, inner) for r in reads]
    best, chosen = None, []
    for combo in itertools.product(*[factors for _, factors in loops]):
        copies = math.prod(combo)
        if copies > max_copies:
            continue
        acc = _accumulators_used(copies, max_copies, row)
        per_copy = acc // copies
        loads = sum(math.prod(f for f, u in zip(combo, us) if u) * (VECTOR_LOAD_COST * per_copy if a else 1)
                    for us, a in zip(used, along))
        split = combo[-1] if hi is not None else 1
        divides = not isinstance(hi, Const) or hi.value % split == 0
        key = (acc, -loads, divides, -split, -copies)
        if best is None or key > best:
            best, chosen = key, [(v, f) for (v, _), f in zip(loops, combo) if f > 1]
    return chosen


def _accumulators_used(copies: int, max_copies: int, row: int) -> int:
    """Accumulator registers of a block of ``copies`` jammed copies whose row holds ``row``
    vector registers: each copy takes a power of two of them (at most 8, as
    :func:`block_plan` does), within its share of ``max_copies``."""
    per_copy = 1
    while per_copy * 2 <= min(max_copies // copies, row, 8):
        per_copy *= 2
    return copies * per_copy


# -- the lowering decision, before emission ---------------------------------------------------
#: ``(width, full, tail)``: ``full`` blocks of ``width`` lanes from the block's first element,
#: then at most one overlapping block ``tail = (start, keep_from, block width)``
BlockPlan = Tuple[int, int, Optional[Tuple[int, int, int]]]


def row_step(st: Store, var) -> "int | None":
    """The step between lanes when they all lie in one row of the store (1 to 4), else None."""
    step = coefficient(st.indices[-1], var)
    if step in (1, 2, 3, 4) and all(coefficient(i, var) == 0 for i in st.indices[:-1]):
        return step
    return None


def memory_step(st: Store, var) -> int:
    """Elements between the store's addresses for consecutive lanes (0 when not a constant,
    as when a dimension the lanes move along has a stride known only at run time)."""
    total = 0
    for ix, stride in zip(st.indices, strides(st.tensor.shape)):
        c = coefficient(ix, var)
        if c is None or (c and not isinstance(stride, int)):
            return 0
        if c:  # a dimension the lanes do not move along adds nothing, whatever its stride
            total += c * stride
    return total


def block_plan(blk: RegisterBlock, ranges: Dict[int, tuple], fast_math: bool,
               bounds: Optional[Dict[int, tuple]] = None) -> Optional[BlockPlan]:
    """``(width, full, tail)``, or None when the block has no vector form: ``full`` blocks of
    ``width`` lanes from the block's first element, then at most one overlapping block ``tail =
    (start, keep_from, block width)`` whose lanes before ``keep_from`` are already done (a
    closed form: its size never depends on the axis length). ``ranges`` are the inclusive
    value ranges of the loop variables around the block; in a stage whose extents are known
    only at run time, ``bounds`` are their ``(lo, hi)`` expressions, which prove reads in
    bounds for every value of the sizes (:func:`.symbolic_bounds.speculatable_within`)."""
    st = blk.store
    dt = st.tensor.dtype
    if dt not in ("float32", "float64") or st.combine is None or st.checked:
        return None
    idx = st.indices
    if blk.reduce_lanes:
        if any(coefficient(i, blk.var) != 0 for i in idx):
            return None
        if not fast_math and reduction(st.combine).lowering in ("add", "mul"):
            return None  # lanes reassociate the reduction
    elif row_step(st, blk.var) is None and not memory_step(st, blk.var):
        return None
    parts = [st.value] + ([blk.cond] if blk.cond is not None else [])
    if any(not vectorizable(p, dt) for p in parts):
        return None
    ranges = dict(ranges)
    bounds = dict(bounds) if bounds is not None else None
    for j in blk.jams:
        outer = ranges.get(id(j.outer))
        if outer is not None:
            ranges[id(j.var)] = j.var_range(outer)
        if bounds is not None and id(j.outer) in bounds:
            olo, ohi = bounds[id(j.outer)]
            bounds[id(j.var)] = (olo * j.factor + j.base, ohi * j.factor + j.base)
        elif outer is None:
            return None
    for lp in blk.loops:
        lo_iv, hi_iv = interval(lp.lo, ranges), interval(lp.hi, ranges)
        if bounds is not None:
            bounds[id(lp.var)] = (lp.lo, lp.hi)
        if lo_iv is None or hi_iv is None:
            if bounds is None:
                return None
            continue
        ranges[id(lp.var)] = (lo_iv[0], hi_iv[1] - 1)
    lo, hi = int(blk.lo.value), int(blk.hi.value)
    ranges[id(blk.var)] = (lo, hi - 1)
    if bounds is not None:
        bounds[id(blk.var)] = (blk.lo, blk.hi)
        if not all(speculatable_within(p, ranges, bounds) for p in parts):
            return None
    elif not all(speculatable(p, ranges) for p in parts):
        return None
    lanes = blk.vector_bits // (8 * SIZE[dt])  # one vector register
    n = hi - lo
    budget = max(1, blk.accumulators // blk.jam)  # accumulator registers for each jammed copy
    # a power-of-two number of lanes (LLVM splits other vector lengths into scalars across
    # loops), from 256 bits (a row shorter than one wide register still gets vectors) up to
    # ``budget`` of the block's registers; among them the widest computing at most 1/8 more
    # lanes than the row has, else the one computing the fewest
    least = min(lanes, 256 // (8 * SIZE[dt]))
    widths = [w for w in (least << k for k in range(8)) if w <= min(budget, 8) * lanes and w <= n]
    if not widths:
        return None

    # lanes along an output axis: the last block may be narrower (a row of 34 is a block
    # of 32 and one of 8); lanes along a reduction share one width of accumulators
    def computed(w):
        rest = n % w
        if rest and not blk.reduce_lanes:
            rest = min(x for x in widths if x >= rest)
        return n - n % w + rest if rest else n

    close = [w for w in widths if computed(w) - n <= n // 8]
    width = max(close) if close else min(widths, key=lambda w: (computed(w), -w))
    tail = None
    if n % width:
        last = width if blk.reduce_lanes else min(x for x in widths if x >= n % width)
        tail = (hi - last, lo + (n // width) * width, last)  # overlaps the previous block
    return width, n // width, tail


def transpose_fits(blk: TransposeBlock, stage: Stage, ranges: Dict[int, tuple],
                   bounds: Optional[Dict[int, tuple]] = None) -> bool:
    """True if the 8 x 8 block has a vector form: it loads whole rows and evaluates both sides
    of every select, so every read must be in bounds at every point of the stage's domain
    (for every value of the sizes when ``bounds`` are given, as for :func:`block_plan`)."""
    st = blk.store
    ranges = dict(ranges)
    axes = list(zip(stage.tensor.op.axes, stage.tensor.shape))
    ranges.update({id(a): (0, n - 1) for a, n in axes if not isinstance(n, Expr)})
    if bounds is not None:
        bounds = {**bounds, **{id(a): (dsl.const(0), n if isinstance(n, Expr) else dsl.const(n)) for a, n in axes}}
        return vectorizable(st.value, st.tensor.dtype) and speculatable_within(st.value, ranges, bounds)
    return vectorizable(st.value, st.tensor.dtype) and speculatable(st.value, ranges)


class _Decide(StmtMutator):
    """Walks the stage with the value ranges of the loops around each statement (as the
    emitter sees them) and unmarks the annotated loops without a vector form."""

    def __init__(self, stage: Stage, fast_math: bool):
        self.stage, self.fast = stage, fast_math
        self.ranges: Dict[int, tuple] = {}
        # the loops' bounds as expressions, in a stage whose extents are known at run time
        self.bounds: Optional[Dict[int, tuple]] = {} if stage_size_vars(stage) else None

    def visit_Loop(self, s: Loop):
        if isinstance(s.kind, RegisterBlocked):
            blk = RegisterBlock.of(s)
            return s if block_plan(blk, self.ranges, self.fast, self.bounds) is not None else blk.plain()[0]
        if isinstance(s.kind, Transposed):
            blk = TransposeBlock.of(s)
            return s if transpose_fits(blk, self.stage, self.ranges, self.bounds) else blk.plain()[0]
        if isinstance(s.kind, Carried):
            return s
        lo_iv, hi_iv = interval(s.lo, self.ranges), interval(s.hi, self.ranges)
        if lo_iv is not None and hi_iv is not None:
            self.ranges[id(s.var)] = (lo_iv[0], hi_iv[1] - 1)
        if self.bounds is not None:
            self.bounds[id(s.var)] = (s.lo, s.hi)
        body = self.visit_body(s.body)
        self.ranges.pop(id(s.var), None)
        if self.bounds is not None:
            self.bounds.pop(id(s.var), None)
        return s if body is s.body else Loop(s.var, s.lo, s.hi, body, s.kind)


def decide_blocks(stage: Stage, fast_math: bool = True) -> Stage:
    """``stage`` with each register block and transpose block that has no vector form (for
    ``fast_math`` as the kernel is built) turned back into its plain nest."""
    body = _Decide(stage, fast_math).visit_body(stage.body)
    return stage if body is stage.body else replace(stage, body=body)
