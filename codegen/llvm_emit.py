"""Lower loop-IR stages to LLVM IR (llvmlite.ir).

Each stage becomes ``i32 stage(T* noalias buf0, ..., i64 lo, i64 hi, i64* err)``:
the buffers it touches (distinct allocations, hence ``noalias``, which lets
LLVM keep accumulators in registers and vectorize), the range of its parallel
loop, and an error record. It returns 0, or 1 after writing
``err = [buffer, dimension, index]`` when a run-time checked index is out of
range, or 2 for an integer division by zero, or 4 with ``err = [lo, hi, loop]`` when a
ragged loop (bounds read from data, a CSR row pointer) would run backwards; it never
touches memory out of bounds. Checked at run time: every index computed from data (a gather, a
scatter) and, in a stage emitted with ``bound_checks`` (the kernel has reads
that :mod:`simplify.bounds` could not decide), every read evaluated under a
condition or in a loop whose bounds are not quasi-affine (a condition on data:
the taken branch of an ``if_then_else``, a reduction's ``where``, the right
operand of ``&``/``|``) or whose index is not quasi-affine (``X[i * k]``), in
each dimension interval analysis does not keep inside the tensor. Such a read
is evaluated exactly where the reference evaluator evaluates it, so the kernel
fails where the evaluator raises.

Semantics match the reference evaluator: ``//`` and ``%`` floor like Python;
``if_then_else`` and ``&``/``|`` evaluate only what is needed (branches),
except where interval analysis proves every read of the other side in bounds
over the loops: then both sides are computed and selected, which vectorizes; ``round`` is
round-half-even. Accumulations carry the ``reassoc`` flag (so reductions
vectorize) and products/sums ``contract`` (fused multiply-add), unless the
kernel is built with ``fast_math=False``.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Dict, List, Sequence

from .llvm import ir

from te_grad import dtypes
from te_grad.errors import InternalError
from te_grad.ops import identity_of, reduction
from te_grad.graph import free_var_ids, free_vars, reads_in
from te_grad.ir import distinct_nodes, distinct_reads
from te_grad.ir import (Binary, Call, Cast, Compare, Const, Expr, Read, Reduce, Select, SizeVar, Tensor, Unary,
                        Var)

from te_grad.intervals import interval, speculatable
from simplify.affine import decided, isl_expr, local_names
from .llvm_blocks import RegisterBlockEmitter
from .llvm_kinds import LoopKindEmitter
from .llvm_types import FCMP, I1, I8, I32, I64, MEMORY, SCALAR, lowering, strides
from .loopir import (Carried, If, Loop, RegisterBlock, RegisterBlocked, Scan, Stage, Store, TransposeBlock, Transposed,
                     ragged_loop_vars, stmt_exprs, stmt_stores, tensors_of)
from .ragged_split import balanced_range
from .symbolic_bounds import speculatable_within, stage_size_vars, symbolic_inside
from .trig import cos_f32, cos_f64, sin_f32, sin_f64
from .vecmath import (acos_f32, acos_f64, asin_f32, asin_f64, atan2_f32, atan2_f64, atan_f32, atan_f64, erf_f32,
                      erf_f64, exp_f32, exp_f64, expm1_f32, expm1_f64, intrinsic, lanewise, log1p_f32, log1p_f64,
                      log_f32, log_f64, pow_f32, pow_f64, sigmoid_f32, sigmoid_f64, tanh_f32, tanh_f64)

_VECMATH = {("exp", "float32"): exp_f32, ("tanh", "float32"): tanh_f32, ("tanh", "float64"): tanh_f64, ("sigmoid", "float32"): sigmoid_f32,
            ("erf", "float32"): erf_f32, ("erf", "float64"): erf_f64,
            ("log", "float32"): log_f32, ("log", "float64"): log_f64,
            ("sin", "float32"): sin_f32, ("cos", "float32"): cos_f32,
            ("sin", "float64"): sin_f64, ("cos", "float64"): cos_f64,
            ("exp", "float64"): exp_f64, ("sigmoid", "float64"): sigmoid_f64,
            ("log1p", "float32"): log1p_f32, ("log1p", "float64"): log1p_f64,
            ("expm1", "float32"): expm1_f32, ("expm1", "float64"): expm1_f64,
            ("atan", "float32"): atan_f32, ("atan", "float64"): atan_f64,
            ("atan2", "float32"): atan2_f32, ("atan2", "float64"): atan2_f64,
            ("asin", "float32"): asin_f32, ("asin", "float64"): asin_f64,
            ("acos", "float32"): acos_f32, ("acos", "float64"): acos_f64}

_I32_ZERO = ir.Constant(I32, 0)


@functools.lru_cache(maxsize=None)
def _splat_constants(element, width: int):
    """The undefined vector and the all-zero mask of a splat of ``element`` values to ``width``
    lanes (constants, shared by every splat: the same IR, built once)."""
    return (ir.Constant(ir.VectorType(element, width), ir.Undefined),
            ir.Constant(ir.VectorType(I32, width), [_I32_ZERO] * width))


def _decided_bound(e: Expr) -> bool:
    return isl_expr(e, local_names(e)) is not None


def _opaque(lo: Expr, hi: Expr) -> bool:
    """True if a loop's bounds are not quasi-affine: the reads inside were not proven."""
    return not (_decided_bound(lo) and _decided_bound(hi))


def _inside(iv, n: int) -> bool:
    return iv is not None and not isinstance(n, Expr) and iv[0] >= 0 and iv[1] < n


def _keeps_a_max(s: Store) -> bool:
    """True if ``s`` stores a float max or min reduction's value: accumulated, or stored
    directly when the reduction has a single term (a winner test compares with it); or
    accumulates an argmax of float values (it compares the body at two indices)."""
    if s.index is not None:
        return dtypes.is_float(s.value.dtype)
    body = getattr(s.tensor.op, "body", None)
    return dtypes.is_float(s.tensor.dtype) and (
        s.combine is not None and reduction(s.combine).selects
        or isinstance(body, Reduce) and reduction(body.combiner).selects)


def _float_equalities(stage: Stage):
    """The float ``==`` / ``!=`` tests in ``stage``."""
    for e in distinct_nodes(*stmt_exprs(stage.body)):
        if isinstance(e, Compare) and e.op in ("eq", "ne") and dtypes.is_float(e.a.dtype):
            yield e


def compared_tensors(stages: Sequence[Stage]) -> set:
    """Ids of the tensors read in the operands of a float equality test of any stage: a
    max's winner test compares the body, recomputed, with the stored maximum, so a tensor
    read there must be computed exactly as written (a single-term max is folded into a
    plain tensor by then, and nothing else says what it was)."""
    return {id(r.tensor) for s in stages for e in _float_equalities(s) for r in distinct_reads(e)}


def _tests_float_equality(stage: Stage) -> bool:
    """True if ``stage`` compares floats for (in)equality or stores a float max / min."""
    return any(_keeps_a_max(s) for s in stmt_stores(stage.body)) or \
        next(_float_equalities(stage), None) is not None


class StageEmitter(RegisterBlockEmitter, LoopKindEmitter):
    """Emits one stage as one LLVM function into ``module``."""

    def __init__(self, module: ir.Module, stage: Stage, name: str, buffer_index: Dict[int, int],
                 fast_math: bool = True, compared: bool = False, bound_checks: bool = True,
                 sizes: Sequence[SizeVar] = ()):
        self.module = module
        # reads the static bounds proof could not decide are checked at run time (module docstring)
        self.bound_checks = bound_checks
        self.undecided = 0  # > 0: inside a condition or loop the static bounds proof could not use
        self.stage = stage
        self.fast = fast_math
        self.compared = compared  # an equality test reads this stage's tensor: store it exactly
        self.buffer_index = buffer_index
        self.tensors = tensors_of(stage)
        # a stage whose extents are known only at run time gets the sizes (``i64* sizes``, in
        # the order of ``sizes``) after its buffers, and loads those it uses at its entry
        self.sizes = [v for v in sizes if id(v) in stage_size_vars(stage)]
        extra = [ir.PointerType(I64)] if self.sizes else []
        args = [ir.PointerType(MEMORY[t.dtype]) for t in self.tensors] + extra + [I64, I64, ir.PointerType(I64)]
        self.fn = ir.Function(module, ir.FunctionType(I32, args), name)
        for a in self.fn.args[:len(self.tensors) + len(extra)]:
            a.add_attribute("noalias")
        self.ptr = {id(t): self.fn.args[n] for n, t in enumerate(self.tensors)}
        self.lo, self.hi, self.err = self.fn.args[-3:]
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        if stage.balance is not None:  # this thread's rows hold about its share of the edges
            self.lo, self.hi = balanced_range(self.b, self.fn, self.ptr[id(stage.balance)], stage.balance.dtype,
                                              stage.parallel_extent, self.lo, self.hi)
        self.env: Dict[int, ir.Value] = {}
        if self.sizes:
            table = self.fn.args[len(self.tensors)]
            for k, v in enumerate(sizes):
                if any(v is u for u in self.sizes):
                    self.env[id(v)] = self.b.load(self.b.gep(table, [ir.Constant(I64, k)], inbounds=True),
                                                  name=v.name)
        self.ranges: Dict[int, tuple] = {}  # inclusive value ranges of the enclosing loop variables
        self.bounds: Dict[int, tuple] = {}  # (lo, hi) expressions of the enclosing loops (symbolic_inside)
        self.vec = None  # inside a register block: (id of its variable, lane values, width)
        self.lane_align = 1  # a power of two known to divide the register block's first lane
        self.transposed = None  # inside a transpose block: (its read, the vector of this row)
        self.emitted: List[Loop] = []  # the annotated loops (blocks, transposes, scans) lowered as marked
        self.exact = 0  # > 0: float arithmetic without contraction (see stored_value)
        self.pair_acc = {}  # id(indexed store) -> its winner's (value, index) registers (pair_loop)
        self.memo: Dict[tuple, tuple] = {}  # emitted values of shared subexpressions (see expr)
        # the regions of the blocks the expressions that branch open (a select, a short-circuit
        # and/or, a run-time check): the block after one continues the region of the block
        # before it (which dominates it), each branch opens a region inside that one; a value
        # memoized in a region serves the rest of it and the regions inside (see expr)
        self.region: Dict[int, int] = {}  # id(block) -> its region (a block's own id if none)
        self.region_parent: Dict[int, int] = {}
        self.hoisted: Dict[int, set] = {}  # region -> ids of the nodes hoist_safe_parts walked there
        self.decided: Dict[int, tuple] = {}  # id(cond) -> (cond, decided(cond))
        self.fv: Dict[int, tuple] = {}  # id(expr) -> (expr, ids of its free variables)
        # reciprocal multiplies (LLVM's arcp) only in stages that never test floats for
        # equality: once LLVM rewrites a division into a multiply by a reciprocal it may share
        # that form with the same division in an exact context, and a max's winner test
        # then misses by a last bit (see stored_value)
        self.reciprocals = fast_math and not compared and not _tests_float_equality(stage)

    # -- statements -------------------------------------------------------------------
    def emit(self) -> ir.Function:
        self.stmts(self.stage.body)
        self.b.ret(ir.Constant(I32, 0))
        return self.fn

    def stmts(self, stmts):
        for s in stmts:
            if isinstance(s, Loop):
                self.annotated_loop(s)
            elif isinstance(s, If):
                if self.filtered_accumulation(s):
                    continue
                cond = self.expr(s.cond)
                with self.b.if_then(cond), self.guarded_by(s.cond):
                    self.stmts(s.body)
            elif isinstance(s, Store):
                self.store(s)
            else:
                raise InternalError(f"unknown loop statement {s!r}")

    def annotated_loop(self, s: Loop):
        """A loop, lowered as its kind says (see :mod:`.loopir`)."""
        if isinstance(s.kind, RegisterBlocked):
            self.register_block(RegisterBlock.of(s))
        elif isinstance(s.kind, Transposed):
            self.transpose_block(TransposeBlock.of(s))
        elif isinstance(s.kind, Carried):
            self.scan(Scan.of(s))
        elif self.pair_loop(s):
            pass
        else:
            self.loop(s, split=s.parallel and self.stage.parallel_extent > 0)
            return
        self.emitted.append(s)

    def loop(self, s: Loop, split: bool):
        lo, hi = self.expr(s.lo), self.expr(s.hi)
        self.check_ragged(s.lo, s.hi, lo, hi, s.var)
        if split:  # this thread's share of the parallel loop (in blocks of ``scale`` indices)
            first, end = self.lo, self.hi
            if s.scale > 1:
                up = ir.Constant(I64, s.scale - 1)
                first = self.b.sdiv(self.b.add(first, up), ir.Constant(I64, s.scale))
                end = self.b.sdiv(self.b.add(end, up), ir.Constant(I64, s.scale))
            lo = self.b.select(self.b.icmp_signed(">", first, lo), first, lo)
            hi = self.b.select(self.b.icmp_signed("<", end, hi), end, hi)
        lo_iv, hi_iv = interval(s.lo, self.ranges), interval(s.hi, self.ranges)
        opaque = _opaque(s.lo, s.hi)

        def body(i):
            self.env[id(s.var)] = i
            if lo_iv is not None and hi_iv is not None:
                self.ranges[id(s.var)] = (lo_iv[0], hi_iv[1] - 1)
            self.bounds[id(s.var)] = (s.lo, s.hi)
            self.undecided += opaque
            self.stmts(s.body)
            self.undecided -= opaque
            self.ranges.pop(id(s.var), None)
            self.bounds.pop(id(s.var), None)
            del self.env[id(s.var)]

        self.counted(lo, hi, s.var.name, body)

    def counted(self, lo, hi, name: str, body):
        """``for i in range(lo, hi): body(i)`` (i64 values)."""
        pre = self.b.block
        head = self.fn.append_basic_block("loop")
        inner = self.fn.append_basic_block("body")
        done = self.fn.append_basic_block("done")
        self.b.cbranch(self.b.icmp_signed("<", lo, hi), head, done)
        self.b.position_at_end(head)
        i = self.b.phi(I64, name=name)
        i.add_incoming(lo, pre)
        self.b.branch(inner)
        self.b.position_at_end(inner)
        body(i)
        nxt = self.b.add(i, ir.Constant(I64, 1), flags=["nsw"])
        i.add_incoming(nxt, self.b.block)
        self.b.cbranch(self.b.icmp_signed("<", nxt, hi), head, done)
        self.b.position_at_end(done)

    @contextmanager
    def guarded_by(self, cond: Expr):
        """Around code that runs only where ``cond`` (or its negation) holds."""
        hit = self.decided.get(id(cond))
        if hit is None or hit[0] is not cond:
            hit = self.decided[id(cond)] = (cond, decided(cond))
        opaque = not hit[1]
        self.undecided += opaque
        try:
            yield
        finally:
            self.undecided -= opaque

    def splat(self, value, width: int):
        if isinstance(value.type, ir.VectorType):
            return value
        undef, mask = _splat_constants(value.type, width)
        one = self.b.insert_element(undef, value, _I32_ZERO)
        return self.b.shuffle_vector(one, undef, mask)

    def as_vector(self, value):
        return self.splat(value, self.vec[2]) if self.vec is not None else value

    def match(self, *values):
        """Splat scalars to vectors when any operand is a vector."""
        if self.vec is None or not any(isinstance(v.type, ir.VectorType) for v in values):
            return values
        return tuple(self.splat(v, self.vec[2]) for v in values)

    def const(self, like, value):
        """A constant of ``like``'s type (splat for vectors)."""
        if isinstance(like.type, ir.VectorType):
            return ir.Constant(like.type, [ir.Constant(like.type.element, value)] * like.type.count)
        return ir.Constant(like.type, value)

    def speculatable(self, e: Expr) -> bool:
        """Whether ``e`` may be evaluated at every point of the enclosing loops (for every value
        of the sizes in a stage that uses them)."""
        return speculatable_within(e, self.ranges, self.bounds) if self.sizes else speculatable(e, self.ranges)

    def filtered_accumulation(self, s: If) -> bool:
        """``if c: T[j] op= v`` as ``T[j] op= select(c, v, identity)`` when c and v are safe to
        evaluate everywhere (no branch in the loop, so it vectorizes). True if emitted."""
        if len(s.body) != 1 or not isinstance(s.body[0], Store):
            return False
        st = s.body[0]
        if st.combine is None or st.checked or st.index is not None or not (self.speculatable(s.cond)
                                                                                   and self.speculatable(st.value)):
            return False
        identity = Const(identity_of(st.combine, st.tensor.dtype), st.tensor.dtype)
        self.store(Store(st.tensor, st.indices, Select(s.cond, st.value, identity), st.combine))
        return True

    def scan(self, s: Scan):
        """A running reduction: the accumulator stays in a register across the scan steps."""
        st = s.store
        dt = st.tensor.dtype
        with self.b.goto_entry_block():
            acc = self.b.alloca(SCALAR[dt])  # promoted to a register (SROA)
        self.b.store(self.e_Const(Const(identity_of(st.combine, dt), dt)), acc)

        def step(u):
            self.env[id(s.var)] = u

            def add(r):
                self.env[id(s.axis)] = r
                if s.cond is None:
                    self.b.store(self.combine(st.combine, dt, self.b.load(acc), self.stored_value(st)), acc)
                else:
                    with self.b.if_then(self.expr(s.cond)), self.guarded_by(s.cond):
                        self.b.store(self.combine(st.combine, dt, self.b.load(acc), self.stored_value(st)), acc)
                del self.env[id(s.axis)]

            opaque = _opaque(s.lo, s.hi)
            self.undecided += opaque
            lo, hi = self.expr(s.lo), self.expr(s.hi)
            self.check_ragged(s.lo, s.hi, lo, hi, s.axis)
            self.counted(lo, hi, s.axis.name, add)
            self.undecided -= opaque
            self.store_scalar(st.tensor, self.b.load(acc), self.address(st.tensor, [self.expr(i) for i in st.indices]))
            del self.env[id(s.var)]

        self.counted(ir.Constant(I64, 0), ir.Constant(I64, s.n), s.var.name, step)

    def stored_value(self, s: Store):
        """The value of a store. The body of a float max / min reduction is computed without
        contracting products and sums into fused multiply-adds, like every float equality
        test: the gradient of a max finds its winners by comparing the body, recomputed in
        another stage, with the stored maximum, and the two must agree to the bit (where a
        multiply-add fuses depends on how LLVM placed the two operations)."""
        if _keeps_a_max(s) or self.compared:
            self.exact += 1
            try:
                return self.expr(s.value)
            finally:
                self.exact -= 1
        return self.expr(s.value)

    def store(self, s: Store):
        t = s.tensor
        idx = [self.expr(i) for i in s.indices]
        if s.checked:
            self.check_indices(t, idx)
        ptr = self.address(t, idx)
        if s.index is not None:
            winner = self.select_pair(s, ptr)
            if winner is not None:
                self.store_scalar(t, winner, ptr)
            return
        value = self.stored_value(s)
        if s.combine is not None:
            old = self.load_scalar(t, ptr)
            value = self.combine(s.combine, t.dtype, old, value)
        self.store_scalar(t, value, ptr)

    def combine(self, op: str, dtype: str, old, new):
        """``op(old, new)`` by the lowering of reduction record ``op`` (:data:`te_grad.ops.REDUCTIONS`)."""
        red = reduction(op)
        flags = ("reassoc", "contract") if self.fast else ()
        if dtypes.is_float(dtype):
            if red.lowering == "add":
                return self.b.fadd(old, new, flags=flags)
            if red.lowering == "mul":
                return self.b.fmul(old, new, flags=flags)
            # NaN-propagating max/min as compares and a select, which stay vectors at any
            # width (llvm.maximum is scalarized on vectors x86 cannot hold in whole registers)
            better = self.b.fcmp_ordered(red.order, new, old)
            return self.b.select(self.b.or_(better, self.b.fcmp_unordered("uno", new, new)), new, old)
        if red.lowering == "add":
            return self.b.add(old, new)
        if red.lowering == "mul":
            return self.b.mul(old, new)
        cmp = self.b.icmp_signed(red.order, new, old)
        return self.b.select(cmp, new, old)

    # -- memory ---------------------------------------------------------------------------
    def extent(self, n):
        """An extent (int or size expression) as an i64 value."""
        return ir.Constant(I64, n) if not isinstance(n, Expr) else self.expr(n)

    def strides_of(self, shape):
        """The strides of a row-major tensor of ``shape``: ints, or i64 values computed from
        the sizes when an extent is a size expression."""
        if all(not isinstance(n, Expr) for n in shape):
            return strides(shape)
        out, acc = [], 1
        for n in reversed(shape):
            out.append(acc)
            if isinstance(acc, int) and not isinstance(n, Expr):
                acc *= n
            else:
                a = ir.Constant(I64, acc) if isinstance(acc, int) else acc
                acc = self.b.mul(a, self.extent(n), flags=["nsw"])
        return list(reversed(out))

    def address(self, t: Tensor, idx):
        offset = None
        for ix, stride in zip(idx, self.strides_of(t.shape)):
            if not isinstance(stride, int):
                term = self.b.mul(ix, stride, flags=["nsw"])
            else:
                term = ix if stride == 1 else self.b.mul(ix, ir.Constant(I64, stride), flags=["nsw"])
            offset = term if offset is None else self.b.add(offset, term, flags=["nsw"])
        return self.b.gep(self.ptr[id(t)], [offset if offset is not None else ir.Constant(I64, 0)],
                          inbounds=True)

    def load_scalar(self, t: Tensor, ptr):
        v = self.b.load(ptr)
        return self.b.trunc(v, I1) if t.dtype == "bool" else v

    def store_scalar(self, t: Tensor, v, ptr):
        self.b.store(self.b.zext(v, I8) if t.dtype == "bool" else v, ptr)

    def check_indices(self, t: Tensor, idx, dims=None):
        for d, (ix, n) in enumerate(zip(idx, t.shape)):
            if dims is not None and d not in dims:
                continue
            bad = self.b.icmp_unsigned(">=", ix, self.extent(n))  # negatives wrap to huge
            before = self.b.block
            with self.b.if_then(bad, likely=False):
                self.fail(1, [self.buffer_index[id(t)], d], ix)
            self.continues(self.b.block, before)

    def check_ragged(self, lo_e: Expr, hi_e: Expr, lo, hi, var: Var):
        """A loop whose bounds read data (a ragged loop, ``range(rowptr[v], rowptr[v + 1])``)
        must not run backwards: return 4 with ``err = [lo, hi, loop]`` where ``hi < lo``,
        ``loop`` the position of ``var`` in :func:`ragged_loop_vars` of the stage (-1 if absent),
        as the evaluator refuses that range."""
        if not (reads_in(lo_e) or reads_in(hi_e)):
            return
        ordinal = next((k for k, v in enumerate(ragged_loop_vars(self.stage.body)) if v is var), -1)
        with self.b.if_then(self.b.icmp_signed("<", hi, lo), likely=False):
            for k, v in enumerate((lo, hi, ir.Constant(I64, ordinal))):
                self.b.store(v, self.b.gep(self.err, [ir.Constant(I64, k)]))
            self.b.ret(ir.Constant(I32, 4))
            self.b.position_at_end(self.fn.append_basic_block("after_error"))

    def fail(self, code: int, record: List[int], value):
        for k, v in enumerate(record):
            self.b.store(ir.Constant(I64, v), self.b.gep(self.err, [ir.Constant(I64, k)]))
        self.b.store(value, self.b.gep(self.err, [ir.Constant(I64, len(record))]))
        self.b.ret(ir.Constant(I32, code))
        # code after the return is unreachable; give the builder a fresh block to continue in
        self.b.position_at_end(self.fn.append_basic_block("after_error"))

    # -- expressions ------------------------------------------------------------------------
    def expr(self, e: Expr):
        """The value of ``e`` here. A subexpression shared by several parents (a DAG: second-order
        gradients share heavily) is emitted once per emission context and region, not once per
        path: a value emitted earlier in this region or in one around it is used again (the
        blocks of a region are this block and those before it that dominate it, across the
        selects, short-circuit ``and``/``or`` and run-time checks emitted since; a branch of
        one is a region inside); the key holds what the value depends on besides (the values
        bound to its free variables, the register block's lanes, exactness). Keyed by block
        alone, nested selects whose branches share values emitted them again after every
        select: exponential in the nesting."""
        if isinstance(e, (Const, Var)):
            return getattr(self, "e_" + type(e).__name__)(e)
        key = self.memo_key(e)
        region = self.region_of(self.b.block)
        while region is not None:  # this region, then the regions around it
            hit = self.memo.get((region,) + key)
            if hit is not None and hit[0] is e:
                return hit[1]
            region = self.region_parent.get(region)
        value = getattr(self, "e_" + type(e).__name__)(e)
        # the region emission ended in (a branching child moves on to its join block, which
        # continues the region), where the value's definition dominates what follows
        self.memo[(self.region_of(self.b.block),) + key] = (e, value)
        return value

    def region_of(self, block) -> int:
        return self.region.get(id(block), id(block))

    def continues(self, block, before) -> None:
        """``block`` comes after a branch opened in ``before`` (which dominates it)."""
        self.region[id(block)] = self.region_of(before)

    def opens(self, block, before) -> None:
        """``block`` is a branch opened in ``before``: a region inside ``before``'s."""
        self.region[id(block)] = id(block)
        self.region_parent[id(block)] = self.region_of(before)

    def memo_key(self, e: Expr) -> tuple:
        fv = free_var_ids(e, self.fv)
        vec = self.vec
        lanes = None if vec is None else (vec[0] in fv, id(vec[1]), vec[2], vec[0] if vec[0] in fv else None)
        transposed = None if self.transposed is None else (id(self.transposed[0]), id(self.transposed[1]))
        env = tuple(id(self.env.get(v)) for v in fv)
        return (id(e), self.exact, lanes, transposed, env)

    def e_Const(self, e: Const):
        return ir.Constant(SCALAR[e.dtype], int(e.value) if e.dtype == "bool" else e.value)

    def e_Var(self, e: Var):
        if self.vec is not None and self.vec[0] == id(e):
            return self.vec[1]
        try:
            return self.env[id(e)]
        except KeyError:
            raise InternalError(f"variable {e.name} used outside its loop in {self.stage.tensor.name}") from None

    e_ReduceAxis = e_Var

    def e_SizeVar(self, e: SizeVar):
        try:
            return self.env[id(e)]
        except KeyError:
            raise InternalError(f"size {e.name} is not passed to stage {self.stage.tensor.name}") from None

    def e_Read(self, e: Read):
        if self.transposed is not None and e is self.transposed[0]:
            return self.transposed[1]
        if self.vec is not None and any(x is not None and id(x) == self.vec[0] for i in e.indices
                                        for x in free_vars(i)):
            return self.vector_read(e)
        idx = [self.expr(i) for i in e.indices]
        if any(reads_in(i) for i in e.indices):  # data-dependent index: checked at run time
            self.check_indices(e.tensor, idx)
        elif self.bound_checks:  # under a condition on data, or not quasi-affine: unless intervals prove it
            dims = [d for d, (i, n) in enumerate(zip(e.indices, e.tensor.shape))
                    if (self.undecided or not _decided_bound(i)) and not _inside(interval(i, self.ranges), n)
                    and not (self.sizes and symbolic_inside(i, n, self.bounds))]
            if dims:
                self.check_indices(e.tensor, idx, dims)
        return self.load_scalar(e.tensor, self.address(e.tensor, idx))

    def e_Unary(self, e: Unary):
        a = self.expr(e.a)
        if e.op == "not":
            return self.b.xor(a, self.const(a, 1))
        return self.b.fneg(a) if dtypes.is_float(e.dtype) else self.b.neg(a)

    def e_Compare(self, e: Compare):
        exact = e.op in ("eq", "ne") and dtypes.is_float(e.a.dtype)
        self.exact += exact
        try:
            a, b = self.match(self.expr(e.a), self.expr(e.b))
        finally:
            self.exact -= exact
        if dtypes.is_float(e.a.dtype):
            if e.op == "ne":
                return self.b.fcmp_unordered("!=", a, b)
            return self.b.fcmp_ordered(FCMP[e.op], a, b)
        if e.a.dtype == "bool":
            return self.b.icmp_unsigned(FCMP[e.op], a, b)
        return self.b.icmp_signed(FCMP[e.op], a, b)

    def e_Binary(self, e: Binary):
        if e.op in ("and", "or"):
            return self.logic(e)
        a, b = self.match(self.expr(e.a), self.expr(e.b))
        dt = e.dtype
        if dtypes.is_float(dt):
            flags = ("contract",) if self.fast and not self.exact else ()
            if e.op == "add":
                return self.b.fadd(a, b, flags=flags)
            if e.op == "sub":
                return self.b.fsub(a, b, flags=flags)
            if e.op == "mul":
                return self.b.fmul(a, b, flags=flags)
            if e.op == "div":  # arcp: x / d with d loop-invariant becomes x * (1 / d) (LICM)
                return self.b.fdiv(a, b, flags=("arcp",) if self.reciprocals and not self.exact else ())
            if e.op == "pow":
                return (pow_f32 if dt == "float32" else pow_f64)(self.b, self.module, a, b)
            return self.call_intrinsic("llvm.maximum" if e.op == "max" else "llvm.minimum", dt, [a, b])
        if e.op == "add":
            return self.b.add(a, b)
        if e.op == "sub":
            return self.b.sub(a, b)
        if e.op == "mul":
            return self.b.mul(a, b)
        if e.op in ("min", "max"):
            return self.b.select(self.b.icmp_signed("<" if e.op == "min" else ">", a, b), a, b)
        if e.op in ("floordiv", "floormod"):
            return self.floor_divmod(e.op, a, b, int(e.b.value) if isinstance(e.b, Const) else None)
        raise InternalError(f"no lowering for {e.op} on {dt}")

    def floor_divmod(self, op: str, a, b, b_const):
        """Python's floor division / modulo (``b_const``: the divisor's value if constant)."""
        if b_const is not None and b_const > 0:
            c = self.const(a, b_const)
            if b_const & (b_const - 1) == 0:  # a power of two: shifts and masks floor exactly
                if op == "floordiv":
                    return self.b.ashr(a, self.const(a, b_const.bit_length() - 1))
                return self.b.and_(a, self.const(a, b_const - 1))
            # truncating division (a multiply-shift for a constant), moved down by one
            # when the remainder is negative: no intermediate can overflow
            r = self.b.srem(a, c)
            negative = self.b.icmp_signed("<", r, self.const(a, 0))
            if op == "floordiv":
                return self.b.sub(self.b.sdiv(a, c), self.b.zext(negative, a.type))
            return self.b.select(negative, self.b.add(r, c), r)
        if b_const is None or b_const == 0:  # a divisor folded to the constant 0 fails where it runs
            zero = self.b.icmp_signed("==", b, self.const(b, 0))
            before = self.b.block
            with self.b.if_then(zero, likely=False):
                self.fail(2, [self.buffer_index[id(self.stage.tensor)], 0], self.b.sext(b, I64)
                          if b.type != I64 else b)
            self.continues(self.b.block, before)
        # x86 traps on MIN // -1; divide by 1 instead and negate (wrapping, as numpy does)
        minus_one = self.b.icmp_signed("==", b, self.const(b, -1))
        safe_b = self.b.select(minus_one, self.const(b, 1), b)
        q = self.b.select(minus_one, self.b.neg(a), self.b.sdiv(a, safe_b))
        r = self.b.srem(a, safe_b)
        zero = self.const(a, 0)
        # adjust truncating division to floor: when the remainder's sign differs from b's
        adjust = self.b.and_(self.b.icmp_signed("!=", r, zero),
                             self.b.icmp_signed("!=", self.b.icmp_signed("<", r, zero),
                                                self.b.icmp_signed("<", b, zero)))
        if op == "floordiv":
            return self.b.sub(q, self.b.zext(adjust, a.type))
        return self.b.select(adjust, self.b.add(r, b), r)

    def logic(self, e: Binary):
        a = self.expr(e.a)
        if self.speculatable(e.b) or self.vec is not None:
            a, b = self.match(a, self.expr(e.b))
            return self.b.and_(a, b) if e.op == "and" else self.b.or_(a, b)
        # short-circuit: the right operand may read memory only where the left allows
        start = self.b.block
        rhs = self.fn.append_basic_block("rhs")
        join = self.fn.append_basic_block("join")
        self.opens(rhs, start)
        self.continues(join, start)
        if e.op == "and":
            self.b.cbranch(a, rhs, join)
        else:
            self.b.cbranch(a, join, rhs)
        self.b.position_at_end(rhs)
        with self.guarded_by(e.a):
            b = self.expr(e.b)
        rhs_end = self.b.block
        self.b.branch(join)
        self.b.position_at_end(join)
        phi = self.b.phi(I1)
        phi.add_incoming(ir.Constant(I1, 0 if e.op == "and" else 1), start)
        phi.add_incoming(b, rhs_end)
        return phi

    def e_Select(self, e: Select):
        cond = self.expr(e.cond)
        if self.vec is not None or (self.speculatable(e.t) and self.speculatable(e.f)):
            t, f = self.match(self.expr(e.t), self.expr(e.f))
            if isinstance(t.type, ir.VectorType):
                cond = self.as_vector(cond) if isinstance(cond.type, ir.VectorType) else cond
            else:
                t, f = self.match(t, f) if not isinstance(cond.type, ir.VectorType) else \
                    (self.as_vector(t), self.as_vector(f))
            return self.b.select(cond, t, f)
        self.hoist_safe_parts(e)
        start = self.b.block
        with self.b.if_else(cond) as (then, otherwise):
            with then, self.guarded_by(e.cond):
                self.opens(self.b.block, start)
                t = self.expr(e.t)
                t_end = self.b.block
            with otherwise, self.guarded_by(e.cond):
                self.opens(self.b.block, start)
                f = self.expr(e.f)
                f_end = self.b.block
        self.continues(self.b.block, start)
        phi = self.b.phi(t.type)
        phi.add_incoming(t, t_end)
        phi.add_incoming(f, f_end)
        return phi

    def hoist_safe_parts(self, e: Select):
        """Before the branches of a select that cannot evaluate both sides everywhere: the
        largest subexpressions of either side that can (speculatable: no read that may leave
        its tensor, no integer division by a variable), emitted here, where both branches
        and whatever follows the select see them. A value shared by the branches of nested
        selects, or by sibling selects (a gradient's ``if_then_else(guard, g_i, 0)`` terms),
        is then emitted once, not once per path (exponential in the nesting); branch-free
        selects compute both sides anyway."""
        if self.sizes:  # bounds known at run time: speculatable_within decides per select
            return
        safe: Dict[int, bool] = {}
        order = []
        stack = [(e.t, False), (e.f, False)]
        while stack:  # post-order of the distinct nodes of both sides
            n, done = stack.pop()
            if done:
                order.append(n)
            elif id(n) not in safe:
                safe[id(n)] = False
                stack.append((n, True))
                stack.extend((c, False) for c in n.children() if isinstance(c, Expr))
        for n in order:
            kids = [c for c in n.children() if isinstance(c, Expr)]
            safe[id(n)] = all(safe[id(c)] for c in kids) and not self.traps(n)
        region = self.region_of(self.b.block)
        seen = self.hoisted.setdefault(region, set())
        around = []
        r = self.region_parent.get(region)
        while r is not None:
            around.append(self.hoisted.get(r, ()))
            r = self.region_parent.get(r)
        stack = [e.t, e.f]
        while stack:  # the largest safe ones, top down (a hoist here or around walked the rest)
            n = stack.pop()
            if id(n) in seen or isinstance(n, (Const, Var)) or any(id(n) in w for w in around):
                continue
            seen.add(id(n))
            if safe[id(n)]:
                self.expr(n)
            else:
                stack.extend(c for c in n.children() if isinstance(c, Expr))

    def traps(self, n: Expr) -> bool:
        """Whether ``n`` itself (not its operands) may fail where it is not meant to run: a
        read not provably inside its tensor, an integer division by a variable or by 0, a
        reduction."""
        if isinstance(n, Read):
            for ix, size in zip(n.indices, n.tensor.shape):
                iv = interval(ix, self.ranges)
                if iv is None or isinstance(size, Expr) or iv[0] < 0 or iv[1] >= size:
                    return True
            return False
        if isinstance(n, Binary) and n.op in ("floordiv", "floormod"):
            return not isinstance(n.b, Const) or n.b.value == 0
        return isinstance(n, Reduce)

    def e_Call(self, e: Call):
        args = [self.expr(a) for a in e.args]
        if len(args) > 1:
            args = list(self.match(*args))
        x = args[0]
        dt = e.dtype
        how, what = lowering(e.name, dt)
        if e.name == "stop_gradient":
            return x
        if how == "inline":
            return _VECMATH[e.name, dt](self.b, self.module, *args)
        if how == "libm":
            if isinstance(x.type, ir.VectorType):
                return self.lanewise_call(what, args)
            fn = self.module.globals.get(what)
            if fn is None:
                fn = ir.Function(self.module, ir.FunctionType(x.type, [x.type] * len(args)), what)
            return self.b.call(fn, args)
        if how == "llvm":
            return self.call_intrinsic(what, dt, args)
        raise InternalError(f"no lowering for intrinsic {e.name}")

    def lanewise_call(self, symbol: str, args):
        """A scalar C function applied lane by lane to vector arguments."""
        vt = args[0].type
        fn = self.module.globals.get(symbol)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(vt.element, [vt.element] * len(args)), symbol)
        return lanewise(self.b, list(args), lambda *lanes: self.b.call(fn, list(lanes)))

    def call_intrinsic(self, name: str, dtype: str, args):
        args = self.match(*args)
        return self.b.call(intrinsic(self.module, name, args[0].type, len(args)), list(args))

    def e_Cast(self, e: Cast):
        a = self.expr(e.a)
        src, dst = e.a.dtype, e.dtype
        if dst == "bool":
            if dtypes.is_float(src):
                return self.b.fcmp_unordered("!=", a, self.const(a, 0.0))
            return self.b.icmp_signed("!=", a, self.const(a, 0))
        to = SCALAR[dst]
        if isinstance(a.type, ir.VectorType):
            to = ir.VectorType(to, a.type.count)
        if src == "bool":
            return self.b.uitofp(a, to) if dtypes.is_float(dst) else self.b.zext(a, to)
        if dtypes.is_float(src) and dtypes.is_float(dst):
            return self.b.fpext(a, to) if dst == "float64" else self.b.fptrunc(a, to)
        if dtypes.is_float(src):
            return self.b.fptosi(a, to)
        if dtypes.is_float(dst):
            return self.b.sitofp(a, to)
        src_width = (a.type.element if isinstance(a.type, ir.VectorType) else a.type).width
        dst_width = (to.element if isinstance(to, ir.VectorType) else to).width
        return self.b.sext(a, to) if dst_width > src_width else self.b.trunc(a, to)
