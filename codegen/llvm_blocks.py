"""Register blocks: runs of an innermost loop kept in vector registers.

A :class:`~codegen.loopir.RegisterBlock` is emitted as explicit vector code:
``width`` consecutive values of its variable per vector (contiguous reads are
one vector load, others are gathered lane by lane, uniform values are
splat), accumulators in registers across the loops around it, optionally
several jammed copies for consecutive values of a second output variable, and
an overlapping last block instead of a scalar remainder. When its lanes run
along a reduce axis, the vectors accumulate across all the loops and their
lanes are combined once at the end. Its layout is :func:`.register_blocking.block_plan`;
a block without one never reaches the emitter (:func:`.register_blocking.decide_blocks`
turned it back into its plain nest).
"""
from __future__ import annotations

import math

from te_grad.errors import InternalError
from te_grad.ops import identity_of
from te_grad.graph import free_vars
from simplify.linear import coefficient
from te_grad.ir import Const, Read

from .llvm import ir
from .llvm_types import I32, I64, MEMORY, SCALAR, SIZE
from .loop_order import panel_width
from .loopir import RegisterBlock, Store
from .register_blocking import block_plan, memory_step, row_step


class RegisterBlockEmitter:
    """Mixin of :class:`~codegen.llvm_emit.StageEmitter` for register blocks."""

    def register_block(self, blk: RegisterBlock):
        plan = block_plan(blk, self.ranges, self.fast, self.bounds if self.sizes else None)
        if plan is None:  # register_blocking.decide_blocks leaves only blocks with a vector form
            raise InternalError(f"the register block along {blk.var.name} in {self.stage.tensor.name} has no "
                                "vector form: its stage did not go through codegen.register_blocking.decide_blocks")
        width, full, tail = plan
        if blk.reduce_lanes:
            self.reduction_lanes(blk, width, full, tail, self.accumulators(blk, width), _iota(width))
            return
        # full blocks as a loop (code size independent of the axis length), then the tail,
        # which may be narrower
        self.output_lanes(blk, width, None, full)
        if tail is not None:
            start, keep_from, w = tail
            self.output_lanes(blk, w, (start, keep_from if keep_from > start else None), 0)
        for j in blk.jams:
            self.env.pop(id(j.var), None)

    def accumulators(self, blk: RegisterBlock, width: int):
        vt = ir.VectorType(SCALAR[blk.store.tensor.dtype], width)
        with self.b.goto_entry_block():
            return [self.b.alloca(vt) for _ in range(blk.jam)]  # promoted to registers (SROA)

    def output_lanes(self, blk: RegisterBlock, width: int, tail, full: int):
        """``full`` blocks of ``width`` lanes from the block's first element (as a loop), or
        the one overlapping block ``tail = (start, keep_from)``: lanes before ``keep_from``
        were computed by an earlier block and keep their value."""
        st = blk.store
        align = SIZE[st.tensor.dtype]
        accs = self.accumulators(blk, width)
        iota = _iota(width)
        if row_step(st, blk.var) is not None:  # 2 to 4: a strided row (a congruence class)
            row = StridedRow(self.b, SCALAR[st.tensor.dtype], width, row_step(st, blk.var), align)
        else:  # lanes far apart in memory: read and written element by element, once per block
            row = ScatteredRow(self.b, SCALAR[st.tensor.dtype], width, memory_step(st, blk.var))

        def one_block(v0, keep_from, align):
            lanes = self.b.add(self.splat(v0, width), iota)
            self.lane_align = align
            targets = []
            self.env[id(blk.var)] = v0
            for j, acc in enumerate(accs):
                self.bind_jam(blk, j)
                target = row.pointer(self.address(st.tensor, [self.expr(i) for i in st.indices]))
                targets.append(target)
                self.b.store(row.load(target), acc)
            self.vec = (id(blk.var), lanes, width)
            self.block_loops(blk, 0, st, accs, lambda accumulate: accumulate(lanes, None))
            self.vec = None
            for acc, target in zip(accs, targets):
                value = self.b.load(acc)
                if keep_from is not None:  # overlapping last block: lanes already done keep their value
                    done = self.b.icmp_signed("<", lanes, self.splat(ir.Constant(I64, keep_from), width))
                    value = self.b.select(done, row.load(target), value)
                row.store(value, target)
            del self.env[id(blk.var)]
            self.lane_align = 1

        if tail is not None:
            one_block(ir.Constant(I64, tail[0]), tail[1], math.gcd(tail[0], width))
            return
        lo = int(blk.lo.value)
        self.counted(ir.Constant(I64, 0), ir.Constant(I64, full), blk.var.name + "_block",
                     lambda b: one_block(self.b.add(ir.Constant(I64, lo), self.b.mul(b, ir.Constant(I64, width))),
                                         None, math.gcd(lo, width)))

    def reduction_lanes(self, blk: RegisterBlock, width: int, n_full: int, tail, accs, iota):
        """Lanes along a reduce axis: vectors accumulate across every loop, lanes combine at the end."""
        st = blk.store
        dt = st.tensor.dtype
        identity = self.e_Const(Const(identity_of(st.combine, dt), dt))
        for acc in accs:
            self.b.store(self.splat(identity, width), acc)
        lo = int(blk.lo.value)
        tails = [(tail[0], tail[1])] if tail is not None and tail[1] > tail[0] else []

        def lanes_of(accumulate):
            def full(b):  # full lane blocks, iterated by a loop
                first = self.b.add(ir.Constant(I64, lo), self.b.mul(b, ir.Constant(I64, width)))
                accumulate(self.b.add(self.splat(first, width), iota), None)

            self.counted(ir.Constant(I64, 0), ir.Constant(I64, n_full), "lanes", full)
            for start, keep_from in tails:  # overlapping last block: lanes already counted add nothing
                lanes = self.b.add(self.splat(ir.Constant(I64, start), width), iota)
                accumulate(lanes, self.b.icmp_signed(">=", lanes, self.splat(ir.Constant(I64, keep_from), width)))

        self.vec = (id(blk.var), None, width)
        self.block_loops(blk, 0, st, accs, lanes_of)
        self.vec = None
        self.env.pop(id(blk.var), None)
        for j, acc in enumerate(accs):
            self.bind_jam(blk, j)
            total = self.horizontal(st.combine, dt, self.b.load(acc), width, blk.vector_bits)
            ptr = self.address(st.tensor, [self.expr(i) for i in st.indices])
            self.store_scalar(st.tensor, self.combine(st.combine, dt, self.load_scalar(st.tensor, ptr), total), ptr)
        for j in blk.jams:
            self.env.pop(id(j.var), None)

    def horizontal(self, op: str, dt: str, vec, width: int, register_bits: int):
        """The lanes of ``vec`` combined into one value, in whole vectors: register-sized
        pieces first, then halves (extracting every lane one by one makes LLVM split the
        accumulator into scalars inside the loop)."""
        reg = min(width, register_bits // (8 * SIZE[dt]))

        def part(v, first, n):
            return self.b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                         ir.Constant(ir.VectorType(I32, n),
                                                     [ir.Constant(I32, first + k) for k in range(n)]))

        acc = part(vec, 0, reg) if width > reg else vec
        for first in range(reg, width, reg):
            acc = self.combine(op, dt, acc, part(vec, first, reg))
        n = reg
        while n > 1:
            n //= 2
            acc = self.combine(op, dt, part(acc, 0, n), part(acc, n, n))
        return self.b.extract_element(acc, ir.Constant(I32, 0))

    def bind_jam(self, blk: RegisterBlock, copy: int):
        for j, offset in blk.jam_values(copy):
            self.env[id(j.var)] = self.b.add(self.b.mul(self.env[id(j.outer)], ir.Constant(I64, j.factor)),
                                             ir.Constant(I64, j.base + offset))

    def block_loops(self, blk: RegisterBlock, k: int, st: Store, accs, lanes_of):
        """The block's loops; innermost, ``lanes_of(accumulate)`` calls ``accumulate(lanes, mask)``
        once per vector of lanes."""
        if k == len(blk.loops):
            dt = st.tensor.dtype
            identity = self.splat(self.e_Const(Const(identity_of(st.combine, dt), dt)), self.vec[2])

            def accumulate(lanes, mask):
                self.vec = (self.vec[0], lanes, self.vec[2])
                if blk.reduce_lanes:
                    self.env[id(blk.var)] = self.b.extract_element(lanes, ir.Constant(I32, 0))
                for j, acc in enumerate(accs):
                    self.bind_jam(blk, j)
                    value = self.as_vector(self.stored_value(st))
                    if blk.cond is not None:
                        value = self.b.select(self.as_vector(self.expr(blk.cond)), value, identity)
                    if mask is not None:
                        value = self.b.select(mask, value, identity)
                    self.b.store(self.combine(st.combine, dt, self.b.load(acc), value), acc)

            lanes_of(accumulate)
            return
        lp = blk.loops[k]

        def body(i):
            self.env[id(lp.var)] = i
            self.block_loops(blk, k + 1, st, accs, lanes_of)
            del self.env[id(lp.var)]

        saved, self.vec = self.vec, None  # loop bounds are scalar
        lo, hi = self.expr(lp.lo), self.expr(lp.hi)
        self.vec = saved
        self.counted(lo, hi, lp.var.name, body)

    def vector_read(self, e: Read):
        """The read at each lane: one vector load if contiguous in the lanes, a load and a shuffle
        if strided by 2 to 4 along a row, else lane by lane."""
        var_id, lanes, width = self.vec
        var = next(x for i in e.indices for x in free_vars(i) if id(x) == var_id)
        elem = MEMORY[e.tensor.dtype]
        if coefficient(e.indices[-1], var) == 1 and all(coefficient(i, var) == 0 for i in e.indices[:-1]):
            self.vec = None  # the first lane's address, computed with the variable at its first value
            ptr = self.address(e.tensor, [self.expr(i) for i in e.indices])
            self.vec = (var_id, lanes, width)
            return self.b.load(self.b.bitcast(ptr, ir.PointerType(ir.VectorType(elem, width))),
                               align=SIZE[e.tensor.dtype])
        step = coefficient(e.indices[-1], var)
        if step in (2, 3, 4) and all(coefficient(i, var) == 0 for i in e.indices[:-1]):
            # a strided row: load the span from the first to the last lane (all between two
            # in-bounds elements of one row) and keep every step-th element
            self.vec = None
            ptr = self.address(e.tensor, [self.expr(i) for i in e.indices])
            self.vec = (var_id, lanes, width)
            span = ir.VectorType(elem, step * (width - 1) + 1)
            row = self.b.load(self.b.bitcast(ptr, ir.PointerType(span)), align=SIZE[e.tensor.dtype])
            pick = ir.Constant(ir.VectorType(I32, width), [ir.Constant(I32, step * k) for k in range(width)])
            return self.b.shuffle_vector(row, ir.Constant(span, ir.Undefined), pick)
        panel = panel_width(e.indices, var)  # a power of two, as the width is: one divides the other
        if panel is not None and self.lane_align % min(width, panel) == 0:
            return self.panel_read(e, var, width, min(width, panel))
        idx = [self.as_vector(self.expr(i)) for i in e.indices]
        offset = None
        for ix, stride in zip(idx, self.strides_of(e.tensor.shape)):
            if not isinstance(stride, int):  # a stride known at run time (an i64 value): one per lane
                stride = self.as_vector(stride)
                term = self.b.mul(ix, stride)
            else:
                term = ix if stride == 1 else self.b.mul(ix, self.const(ix, stride))
            offset = term if offset is None else self.b.add(offset, term)
        out = ir.Constant(ir.VectorType(elem, width), ir.Undefined)
        base = self.ptr[id(e.tensor)]
        for k in range(width):
            lane = self.b.extract_element(offset, ir.Constant(I32, k))
            out = self.b.insert_element(out, self.b.load(self.b.gep(base, [lane], inbounds=True)),
                                        ir.Constant(I32, k))
        return out

    def panel_read(self, e: Read, var, width: int, chunk: int):
        """The read ``P[.., v // w, .., v % w]`` of a block whose first lane is a multiple of
        ``chunk`` (which divides ``w``): each run of ``chunk`` lanes lies in one panel, one
        vector load each, joined."""
        elem = MEMORY[e.tensor.dtype]
        saved, self.vec = self.vec, None
        first = self.env[id(var)]
        parts = []
        for c in range(width // chunk):
            self.env[id(var)] = self.b.add(first, ir.Constant(I64, c * chunk)) if c else first
            ptr = self.address(e.tensor, [self.expr(i) for i in e.indices])
            parts.append(self.b.load(self.b.bitcast(ptr, ir.PointerType(ir.VectorType(elem, chunk))),
                                     align=SIZE[e.tensor.dtype]))
        self.env[id(var)] = first
        self.vec = saved
        while len(parts) > 1:
            n = parts[0].type.count
            join = ir.Constant(ir.VectorType(I32, 2 * n), [ir.Constant(I32, k) for k in range(2 * n)])
            parts = [self.b.shuffle_vector(a, b, join) for a, b in zip(parts[::2], parts[1::2])]
        return parts[0]


def _iota(width: int):
    """The vector ``[0, 1, ..., width - 1]`` of i64."""
    return ir.Constant(ir.VectorType(I64, width), [ir.Constant(I64, k) for k in range(width)])


class ScatteredRow:
    """``width`` elements ``step`` apart anywhere in memory, read and written one by one.

    For a block whose lanes run along an axis that is not contiguous in the store: the
    accumulators stay in vector registers across the reduce loops and only their initial
    values and results move element by element. Each lane touches only its own element.
    """

    def __init__(self, builder, elem, width: int, step: int):
        self.b, self.width, self.step = builder, width, step
        self.vt = ir.VectorType(elem, width)

    def pointer(self, first):
        return first

    def _lane(self, ptr, k):
        return self.b.gep(ptr, [ir.Constant(I64, k * self.step)], inbounds=True)

    def load(self, ptr):
        value = ir.Constant(self.vt, ir.Undefined)
        for k in range(self.width):
            value = self.b.insert_element(value, self.b.load(self._lane(ptr, k)), ir.Constant(I32, k))
        return value

    def store(self, value, ptr):
        for k in range(self.width):
            self.b.store(self.b.extract_element(value, ir.Constant(I32, k)), self._lane(ptr, k))


class StridedRow:
    """``width`` elements ``step`` apart in one row, loaded and stored as a vector.

    With ``step`` 1 this is a plain vector load and store. Otherwise the span from
    the first to the last element is loaded and shuffled (loads), or loaded, blended
    and stored back (stores): the elements in between are written with the values
    just read, so the row's other classes must not change meanwhile (they belong to
    the same thread: the parallel axis is never split into classes).
    """

    def __init__(self, builder, elem, width: int, step: int, align: int):
        self.b, self.width, self.step, self.align = builder, width, step, align
        self.span = ir.VectorType(elem, step * (width - 1) + 1)
        self.vt = ir.VectorType(elem, width)

    def pointer(self, first):
        return self.b.bitcast(first, ir.PointerType(self.span))

    def load(self, ptr):
        row = self.b.load(ptr, align=self.align)
        if self.step == 1:
            return row
        pick = ir.Constant(ir.VectorType(I32, self.width), [ir.Constant(I32, self.step * k)
                                                          for k in range(self.width)])
        return self.b.shuffle_vector(row, ir.Constant(self.span, ir.Undefined), pick)

    def store(self, value, ptr):
        if self.step == 1:
            self.b.store(value, ptr, align=self.align)
            return
        n = self.span.count
        # lane k of value goes to element step*k of the span: widen, then blend with what is there
        spread = ir.Constant(ir.VectorType(I32, n), [ir.Constant(I32, k // self.step if k % self.step == 0 else 0)
                                                     for k in range(n)])
        wide = self.b.shuffle_vector(value, ir.Constant(self.vt, ir.Undefined), spread)
        mine = ir.Constant(ir.VectorType(ir.IntType(1), n), [ir.Constant(ir.IntType(1), k % self.step == 0)
                                                            for k in range(n)])
        old = self.b.load(ptr, align=self.align)
        self.b.store(self.b.select(mine, wide, old), ptr, align=self.align)
