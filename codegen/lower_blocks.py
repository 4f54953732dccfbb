"""Which annotated loops keep their kind: the last pass before emission.

The scheduling passes mark register blocks (:class:`~codegen.loopir.RegisterBlocked`)
and 8 x 8 transposes (:class:`~codegen.loopir.Transposed`) from the shape of a nest;
whether a marked loop has a vector form depends on more: its value's element type and
operations, whether every read is safe to evaluate at every lane (interval analysis
over the loops around it), the length of the vector row, and, for lanes that
reassociate a sum or a product, ``fast_math``. :func:`decide_blocks` settles that for
each marked loop and turns a loop without a vector form back into its plain nest, so
the loop program (``kernel.loops``) shows exactly the blocks the machine code has; the
emitter (:mod:`.llvm_emit`) lowers every annotated loop it is given and raises an
:class:`~te_grad.errors.InternalError` on one it cannot.

:func:`block_plan` is the register block's layout (vector width, full blocks, the
overlapping last block), computed from the same facts by this pass and by the
emitter. Promises: the stage computes exactly what it did (a kind never changes a
loop's meaning, :mod:`.loopir`); loops are only ever unmarked, never marked.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, Optional, Tuple

from simplify.linear import coefficient
from te_grad.intervals import interval, speculatable

from .llvm_types import SIZE, strides, vectorizable
from .loopir import (Carried, Loop, RegisterBlock, RegisterBlocked, Stage, StmtMutator, Store, TransposeBlock,
                     Transposed)

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
    """Elements between the store's addresses for consecutive lanes (0 when not a constant)."""
    total = 0
    for ix, stride in zip(st.indices, strides(st.tensor.shape)):
        c = coefficient(ix, var)
        if c is None:
            return 0
        total += c * stride
    return total


def block_plan(blk: RegisterBlock, ranges: Dict[int, tuple], fast_math: bool) -> Optional[BlockPlan]:
    """``(width, full, tail)``, or None when the block has no vector form: ``full`` blocks of
    ``width`` lanes from the block's first element, then at most one overlapping block ``tail =
    (start, keep_from, block width)`` whose lanes before ``keep_from`` are already done (a
    closed form: its size never depends on the axis length). ``ranges`` are the inclusive
    value ranges of the loop variables around the block."""
    st = blk.store
    dt = st.tensor.dtype
    if dt not in ("float32", "float64") or st.combine is None or st.checked:
        return None
    idx = st.indices
    if blk.reduce_lanes:
        if any(coefficient(i, blk.var) != 0 for i in idx):
            return None
        if not fast_math and st.combine in ("sum", "prod"):
            return None  # lanes reassociate the reduction
    elif row_step(st, blk.var) is None and not memory_step(st, blk.var):
        return None
    parts = [st.value] + ([blk.cond] if blk.cond is not None else [])
    if any(not vectorizable(p, dt) for p in parts):
        return None
    ranges = dict(ranges)
    for j in blk.jams:
        outer = ranges.get(id(j.outer))
        if outer is None:
            return None
        ranges[id(j.var)] = j.var_range(outer)
    for lp in blk.loops:
        lo_iv, hi_iv = interval(lp.lo, ranges), interval(lp.hi, ranges)
        if lo_iv is None or hi_iv is None:
            return None
        ranges[id(lp.var)] = (lo_iv[0], hi_iv[1] - 1)
    lo, hi = int(blk.lo.value), int(blk.hi.value)
    ranges[id(blk.var)] = (lo, hi - 1)
    if not all(speculatable(p, ranges) for p in parts):
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


def transpose_fits(blk: TransposeBlock, stage: Stage, ranges: Dict[int, tuple]) -> bool:
    """True if the 8 x 8 block has a vector form: it loads whole rows and evaluates both sides
    of every select, so every read must be in bounds at every point of the stage's domain."""
    st = blk.store
    ranges = dict(ranges)
    ranges.update({id(a): (0, n - 1) for a, n in zip(stage.tensor.op.axes, stage.tensor.shape)})
    return vectorizable(st.value, st.tensor.dtype) and speculatable(st.value, ranges)


class _Decide(StmtMutator):
    """Walks the stage with the value ranges of the loops around each statement (as the
    emitter sees them) and unmarks the annotated loops without a vector form."""

    def __init__(self, stage: Stage, fast_math: bool):
        self.stage, self.fast = stage, fast_math
        self.ranges: Dict[int, tuple] = {}

    def visit_Loop(self, s: Loop):
        if isinstance(s.kind, RegisterBlocked):
            blk = RegisterBlock.of(s)
            return s if block_plan(blk, self.ranges, self.fast) is not None else blk.plain()[0]
        if isinstance(s.kind, Transposed):
            blk = TransposeBlock.of(s)
            return s if transpose_fits(blk, self.stage, self.ranges) else blk.plain()[0]
        if isinstance(s.kind, Carried):
            return s
        lo_iv, hi_iv = interval(s.lo, self.ranges), interval(s.hi, self.ranges)
        if lo_iv is not None and hi_iv is not None:
            self.ranges[id(s.var)] = (lo_iv[0], hi_iv[1] - 1)
        body = self.visit_body(s.body)
        self.ranges.pop(id(s.var), None)
        return s if body is s.body else Loop(s.var, s.lo, s.hi, body, s.kind)


def decide_blocks(stage: Stage, fast_math: bool = True) -> Stage:
    """``stage`` with each register block and transpose block that has no vector form (for
    ``fast_math`` as the kernel is built) turned back into its plain nest."""
    body = _Decide(stage, fast_math).visit_body(stage.body)
    return stage if body is stage.body else replace(stage, body=body)
