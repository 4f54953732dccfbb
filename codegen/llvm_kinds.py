"""Lowering two annotated loop kinds: 8 x 8 transposes and indexed reductions (argmax).

Mixin of :class:`~codegen.llvm_emit.StageEmitter`, beside the register blocks of
:mod:`.llvm_blocks`:

- a :class:`~codegen.loopir.TransposeBlock` (a loop marked ``Transposed``) reads eight rows
  of the crossing tensor as vectors, transposes them in registers with three rounds of
  shuffles and stores each output row as one vector; a block without that vector form
  never reaches the emitter (:func:`.register_blocking.decide_blocks`);
- a store of an indexed reduction (``Store.index``: argmax, argmin) keeps the winner's
  index; its candidates are compared by value (NaN wins), then by index (the smaller
  wins), so the result does not depend on the order of the candidates. In the loop over
  its own axis the winner's value and index stay in registers (:meth:`pair_loop`).
"""
from __future__ import annotations

from te_grad import dtypes
from te_grad.errors import InternalError
from te_grad.graph import free_vars
from te_grad.ir import Const
from te_grad.ops import reduction

from .llvm import ir
from .llvm_types import I32, I64, MEMORY, SCALAR, SIZE
from .loopir import If, Loop, Store, TransposeBlock
from .register_blocking import transpose_fits


class LoopKindEmitter:
    """Mixin of :class:`~codegen.llvm_emit.StageEmitter` for transposes and indexed pairs."""

    def transpose_block(self, blk: TransposeBlock):
        """Eight vector loads of the crossing read, an 8 x 8 transpose in registers (three
        rounds of shuffles), then each of the eight store rows computed as one vector."""
        st, rd = blk.store, blk.read
        if not transpose_fits(blk, self.stage, self.ranges, self.bounds if self.sizes else None):  # register_blocking.decide_blocks unmarks those
            raise InternalError(f"the 8 x 8 transpose block in {self.stage.tensor.name} has no vector form: "
                                "its stage did not go through codegen.register_blocking.decide_blocks")
        u0, v0 = self.expr(blk.u0), self.expr(blk.v0)
        row_t = ir.VectorType(MEMORY[rd.tensor.dtype], 8)
        rows = []
        self.env[id(blk.u)] = u0
        for k in range(8):
            self.env[id(blk.v)] = self.b.add(v0, ir.Constant(I64, k))
            ptr = self.address(rd.tensor, [self.expr(i) for i in rd.indices])
            rows.append(self.b.load(self.b.bitcast(ptr, ir.PointerType(row_t)), align=SIZE[rd.tensor.dtype]))
        cols = self.transpose8(rows)
        iota = ir.Constant(ir.VectorType(I64, 8), [ir.Constant(I64, k) for k in range(8)])
        out_t = ir.VectorType(MEMORY[st.tensor.dtype], 8)
        for m in range(8):
            self.env[id(blk.u)] = self.b.add(u0, ir.Constant(I64, m))
            self.env[id(blk.v)] = v0
            ptr = self.address(st.tensor, [self.expr(i) for i in st.indices])
            self.vec = (id(blk.v), self.b.add(self.splat(v0, 8), iota), 8)
            self.transposed = (rd, cols[m])
            value = self.as_vector(self.expr(st.value))
            self.vec, self.transposed = None, None
            self.b.store(value, self.b.bitcast(ptr, ir.PointerType(out_t)), align=SIZE[st.tensor.dtype])
        del self.env[id(blk.u)], self.env[id(blk.v)]

    def transpose8(self, rows):
        """``cols[m][k] = rows[k][m]`` for eight 8-lane vectors."""
        def shuffle(a, b, idx):
            return self.b.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, len(idx)),
                                                           [ir.Constant(I32, i) for i in idx]))
        lo_pairs = [shuffle(rows[2 * k], rows[2 * k + 1], [0, 8, 1, 9, 4, 12, 5, 13]) for k in range(4)]
        hi_pairs = [shuffle(rows[2 * k], rows[2 * k + 1], [2, 10, 3, 11, 6, 14, 7, 15]) for k in range(4)]
        low, high = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
        quads = []
        for half in (0, 2):
            a, b = lo_pairs[half], lo_pairs[half + 1]
            c, d = hi_pairs[half], hi_pairs[half + 1]
            quads += [shuffle(a, b, low), shuffle(a, b, high), shuffle(c, d, low), shuffle(c, d, high)]
        cols = [None] * 8
        for m in range(4):
            cols[m] = shuffle(quads[m], quads[m + 4], [0, 1, 2, 3, 8, 9, 10, 11])
            cols[m + 4] = shuffle(quads[m], quads[m + 4], [4, 5, 6, 7, 12, 13, 14, 15])
        return cols

    def pair_loop(self, s: Loop) -> bool:
        """The loop over the axis of an indexed reduction (argmax) whose body is its one
        (guarded) store: the winner's value and index stay in registers across the loop, the
        index is stored after it. True if emitted."""
        body = s.body[0].body if len(s.body) == 1 and isinstance(s.body[0], If) else s.body
        if len(body) != 1 or not isinstance(body[0], Store) or body[0].index is not s.var or s.parallel \
                or any(v is s.var for i in body[0].indices for v in free_vars(i)):
            return False
        st = body[0]
        red, dt = reduction(st.combine), st.value.dtype
        ptr = self.address(st.tensor, [self.expr(i) for i in st.indices])
        with self.b.goto_entry_block():
            acc_v, acc_i = self.b.alloca(SCALAR[dt]), self.b.alloca(I64)  # promoted to registers (SROA)
        old_i = self.load_scalar(st.tensor, ptr)
        self.b.store(old_i, acc_i)
        self.b.store(self.e_Const(Const(red.value_identity(dt), dt)), acc_v)
        with self.b.if_then(self.b.icmp_signed(">=", old_i, ir.Constant(I64, 0))):
            self.env[id(st.index)] = old_i  # a point visited before: in bounds
            self.b.store(self.stored_value(st), acc_v)
            del self.env[id(st.index)]
        self.pair_acc[id(st)] = (acc_v, acc_i)
        self.loop(s, split=False)
        del self.pair_acc[id(st)]
        self.store_scalar(st.tensor, self.b.load(acc_i), ptr)
        return True

    def select_pair(self, s: Store, ptr):
        """The index of the winner of an indexed reduction (argmax) after the candidate
        ``(s.value, s.index)``: the stored index (-1: none yet) is compared through the value
        recomputed there (or kept in registers by :meth:`pair_loop`)."""
        new_i = self.expr(s.index)
        new_v = self.stored_value(s)
        if id(s) in self.pair_acc:
            acc_v, acc_i = self.pair_acc[id(s)]
            old_v, old_i = self.b.load(acc_v), self.b.load(acc_i)
            wins = self.pair_wins(s, new_v, new_i, old_v, old_i)
            self.b.store(self.b.select(wins, new_v, old_v), acc_v)
            self.b.store(self.b.select(wins, new_i, old_i), acc_i)
            return None
        old_i = self.load_scalar(s.tensor, ptr)
        none = self.b.icmp_signed("<", old_i, ir.Constant(I64, 0))
        saved = self.env[id(s.index)]
        self.env[id(s.index)] = self.b.select(none, new_i, old_i)  # a visited point: in bounds
        old_v = self.stored_value(s)
        self.env[id(s.index)] = saved
        return self.b.select(self.pair_wins(s, new_v, new_i, old_v, old_i), new_i, old_i)

    def pair_wins(self, s: Store, new_v, new_i, old_v, old_i):
        """True if ``(new_v, new_i)`` beats ``(old_v, old_i)`` (``old_i`` -1: none): NaN wins, then
        the value by the record's order, then the smaller index, so the result does not depend
        on the order of the candidates."""
        red, dt = reduction(s.combine), s.value.dtype
        none = self.b.icmp_signed("<", old_i, ir.Constant(I64, 0))
        first = self.b.icmp_signed("<", new_i, old_i)
        if dtypes.is_float(dt):
            nan_new = self.b.fcmp_unordered("uno", new_v, new_v)
            nan_old = self.b.fcmp_unordered("uno", old_v, old_v)
            beats = self.b.or_(self.b.fcmp_ordered(red.order, new_v, old_v),
                               self.b.and_(nan_new, self.b.not_(nan_old)))
            tie = self.b.or_(self.b.fcmp_ordered("==", new_v, old_v), self.b.and_(nan_new, nan_old))
        else:
            beats = self.b.icmp_signed(red.order, new_v, old_v)
            tie = self.b.icmp_signed("==", new_v, old_v)
        return self.b.or_(none, self.b.or_(beats, self.b.and_(tie, first)))
