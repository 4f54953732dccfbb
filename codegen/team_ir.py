"""The native half of the thread team (:mod:`.team`): a worker loop and a plan runner, one LLVM module.

A kernel's whole plan (its runs of stages, :func:`.regions.plan`) is one native
call, :data:`RUN`: runs too small to share go one after the other on the calling
thread; a shared run is posted to the team and split into chunks that any
thread claims, the calling thread included, so nothing ever waits for a worker
that is asleep or late (the caller just takes more chunks). A run starts only
once every chunk of the one before has finished: that is the barrier between
regions, and it costs a few atomic operations, not a hand-off through Python.

The team lives in memory the Python side owns: :data:`WORDS` int64 words, its
hot fields on cache lines of their own.

- ``GEN``: the generation of the posted job; workers poll it.
- ``CLAIM``: ``gen << 32 | width << 24 | chunks << 12 | next``. A thread claims
  chunk ``next`` by compare-and-swap of the whole word, so a claim succeeds only
  for the job it read: a worker that wakes late sees another generation and
  claims nothing. Only threads numbered below ``width`` (the kernel's thread
  count) claim, the caller being number 0.
- ``DONE``: chunks finished; the caller moves on when it equals the chunk count.
  The job's fields are written before ``CLAIM`` is published and are read only
  after a successful claim, which the caller cannot outlive (it waits for
  ``DONE``): a claimed chunk always runs the job it was claimed from.
- ``RC``/``ERR``: the first failing chunk's code and error record.
- ``BUSY``: held by the caller running a plan; a second caller that finds it
  taken (kernels called from several threads at once) runs its plan alone.
- ``WORKER_CHUNKS``: how many chunks workers (not callers) have claimed, for tests
  and diagnostics.

Workers spin (with the CPU's pause instruction, then yielding the core) for
``spin_ns`` after their last job, then return to Python to sleep until the next
call wakes them.
"""
from __future__ import annotations

from .llvm import ir
from .llvm_types import I8, I32, I64

#: word offsets of the team's fields (each group on a 64-byte line of its own)
GEN, STOP = 0, 1
CLAIM = 8
DONE = 16
RUN_FN, REGION_FN, TABLE, FIRST, LAST, BLOCK, EXTENT, GRANULE = range(24, 32)
RC, ERR = 40, 41  # ERR .. ERR + 3
BUSY = 48
WORKER_CHUNKS = 56  # chunks claimed by workers (not the caller) since the team started
WORDS = 64

#: a plan record: int64 words [first, last, block, extent, chunks, width, granule, unused]
REC_FIRST, REC_LAST, REC_BLOCK, REC_EXTENT, REC_CHUNKS, REC_WIDTH, REC_GRANULE = range(7)
RECORD = 8
#: most chunks a shared run may have, and most threads, in the claim word's fields
MAX_CHUNKS, MAX_WIDTH = (1 << 12) - 1, (1 << 8) - 1

#: ``i64 te_team_work(i64* team, i64 tid, i64 seen, i64 spin_ns)``: the worker loop; returns
#: the last generation seen once idle for ``spin_ns``, or -1 when the team stops
WORK = "te_team_work"
#: ``i32 te_team_run(i64* team, i64* plan, i64 records, run_stages*, run_region*, i8** table,
#: i64* err)``: the plan on the calling thread and the team; the first error code, 0 if none
RUN = "te_team_run"

#: the parallel range of a run made whole (each stage clamps it to its own loop)
WHOLE = 1 << 62
#: a worker idle this long starts yielding its core between polls
YIELD_AFTER_NS = 50_000

_I8P = ir.PointerType(I8)
_I64P = ir.PointerType(I64)
_RUN_T = ir.FunctionType(I32, [ir.PointerType(_I8P), I64, I64, I64, I64, _I64P])
_REGION_T = ir.FunctionType(I32, [ir.PointerType(_I8P), I64, I64, I64, I64, I64, _I64P])


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def runtime_module(triple: str, clock_monotonic: int) -> str:
    """The module's text for the host ``triple``; ``clock_monotonic`` is the platform's
    ``CLOCK_MONOTONIC`` (Python's ``time.CLOCK_MONOTONIC``)."""
    module = ir.Module(name="te_grad_team")
    module.triple = triple
    rt = _Runtime(module, triple, clock_monotonic)
    claims = rt.claims()
    rt.work(claims)
    rt.run(claims)
    return str(module)


class _Runtime:
    def __init__(self, module: ir.Module, triple: str, clock_monotonic: int):
        self.module = module
        self.clock_monotonic = clock_monotonic
        timespec = ir.LiteralStructType([I64, I64])
        self.timespec = timespec
        self.clock_gettime = ir.Function(module, ir.FunctionType(I32, [I32, ir.PointerType(timespec)]),
                                         "clock_gettime")
        self.sched_yield = ir.Function(module, ir.FunctionType(I32, []), "sched_yield")
        arch = triple.split("-")[0]
        if arch in ("x86_64", "i386", "i686"):
            self.pause_fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
            self.pause_args = []
        elif arch in ("aarch64", "arm64"):
            self.pause_fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I32]), "llvm.aarch64.hint")
            self.pause_args = [ir.Constant(I32, 1)]  # YIELD
        else:
            self.pause_fn = None

    # -- helpers ----------------------------------------------------------------------------
    @staticmethod
    def word(b: ir.IRBuilder, team, k: int):
        return b.gep(team, [_c(k)], inbounds=True)

    def pause(self, b: ir.IRBuilder):
        if self.pause_fn is not None:
            b.call(self.pause_fn, self.pause_args)

    def now(self, b: ir.IRBuilder, ts):
        b.call(self.clock_gettime, [ir.Constant(I32, self.clock_monotonic), ts])
        sec = b.load(b.gep(ts, [ir.Constant(I32, 0), ir.Constant(I32, 0)], inbounds=True))
        nsec = b.load(b.gep(ts, [ir.Constant(I32, 0), ir.Constant(I32, 1)], inbounds=True))
        return b.add(b.mul(sec, _c(1_000_000_000)), nsec)

    # -- the claim loop, shared by workers and the caller -------------------------------------
    def claims(self) -> ir.Function:
        """``void claims(i64* team, i64 tid, i64 gen)``: claim and run chunks of job ``gen``
        until none is left (or the job is no longer ``gen``, or ``tid`` is not in it)."""
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [_I64P, I64, I64]), "te_team_claims")
        fn.linkage = "internal"
        team, tid, gen = fn.args
        entry = fn.append_basic_block("entry")
        b = ir.IRBuilder(entry)
        err = b.alloca(ir.ArrayType(I64, 4), name="err")
        err_p = b.gep(err, [ir.Constant(I32, 0), ir.Constant(I32, 0)], inbounds=True)
        head, done = fn.append_basic_block("claim"), fn.append_basic_block("done")
        b.branch(head)

        b.position_at_end(head)
        w = b.load_atomic(self.word(b, team, CLAIM), "acquire", 8)
        same_job = b.icmp_unsigned("==", b.lshr(w, _c(32)), gen)
        width = b.and_(b.lshr(w, _c(24)), _c(MAX_WIDTH))
        chunks = b.and_(b.lshr(w, _c(12)), _c(MAX_CHUNKS))
        chunk = b.and_(w, _c(MAX_CHUNKS))
        open_ = b.and_(b.and_(same_job, b.icmp_signed("<", tid, width)), b.icmp_signed("<", chunk, chunks))
        try_claim = fn.append_basic_block("try")
        b.cbranch(open_, try_claim, done)

        b.position_at_end(try_claim)
        pair = b.cmpxchg(self.word(b, team, CLAIM), w, b.add(w, _c(1)), "acq_rel", "acquire")
        claimed = fn.append_basic_block("claimed")
        b.cbranch(b.extract_value(pair, 1), claimed, head)

        b.position_at_end(claimed)
        with b.if_then(b.icmp_signed(">", tid, _c(0))):
            b.atomic_rmw("add", self.word(b, team, WORKER_CHUNKS), _c(1), "monotonic")
        f = {k: b.load(self.word(b, team, k)) for k in (RUN_FN, REGION_FN, TABLE, FIRST, LAST, BLOCK, EXTENT,
                                                        GRANULE)}
        extent, granule = f[EXTENT], f[GRANULE]

        def bound(k):  # extent * k / chunks to the nearest multiple of the granule, at most extent
            twice = b.mul(chunks, b.mul(granule, _c(2)))
            near = b.mul(b.sdiv(b.add(b.mul(b.mul(extent, k), _c(2)), b.mul(chunks, granule)), twice), granule)
            return b.select(b.icmp_signed(">", near, extent), extent, near)
        nxt = b.add(chunk, _c(1))
        lo = b.select(b.icmp_signed("==", chunk, _c(0)), _c(0), bound(chunk))
        hi = b.select(b.icmp_signed("==", nxt, chunks), extent, bound(nxt))
        table = b.inttoptr(f[TABLE], ir.PointerType(_I8P))
        run_blk, region_blk, finish = (fn.append_basic_block(n) for n in ("run", "region", "finish"))
        nonempty = fn.append_basic_block("nonempty")
        b.cbranch(b.icmp_signed(">", hi, lo), nonempty, finish)
        b.position_at_end(nonempty)
        b.cbranch(b.icmp_signed("!=", f[BLOCK], _c(0)), region_blk, run_blk)
        b.position_at_end(run_blk)
        rc_run = b.call(b.inttoptr(f[RUN_FN], ir.PointerType(_RUN_T)),
                        [table, f[FIRST], f[LAST], lo, hi, err_p])
        ran = b.block
        after = fn.append_basic_block("after")
        b.branch(after)
        b.position_at_end(region_blk)
        rc_region = b.call(b.inttoptr(f[REGION_FN], ir.PointerType(_REGION_T)),
                           [table, f[FIRST], f[LAST], lo, hi, f[BLOCK], err_p])
        regioned = b.block
        b.branch(after)
        b.position_at_end(after)
        rc = b.phi(I32)
        rc.add_incoming(rc_run, ran)
        rc.add_incoming(rc_region, regioned)
        failed = fn.append_basic_block("failed")
        b.cbranch(b.icmp_signed("!=", rc, ir.Constant(I32, 0)), failed, finish)
        b.position_at_end(failed)
        first_error = b.cmpxchg(self.word(b, team, RC), _c(0), b.sext(rc, I64), "acq_rel", "monotonic")
        with b.if_then(b.extract_value(first_error, 1)):
            for k in range(4):
                src = b.load(b.gep(err_p, [ir.Constant(I32, k)], inbounds=True))
                b.store(src, self.word(b, team, ERR + k))
        b.branch(finish)
        b.position_at_end(finish)
        b.atomic_rmw("add", self.word(b, team, DONE), _c(1), "release")
        b.branch(head)

        b.position_at_end(done)
        b.ret_void()
        return fn

    # -- the worker loop ------------------------------------------------------------------------
    def work(self, claims: ir.Function) -> ir.Function:
        fn = ir.Function(self.module, ir.FunctionType(I64, [_I64P, I64, I64, I64]), WORK)
        team, tid, seen0, spin_ns = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        ts = b.alloca(self.timespec, name="ts")
        seen, idle, spins = b.alloca(I64, name="seen"), b.alloca(I64, name="idle"), b.alloca(I64, name="spins")
        b.store(seen0, seen)
        b.store(self.now(b, ts), idle)
        b.store(_c(0), spins)
        poll, stopped, job, wait = (fn.append_basic_block(n) for n in ("poll", "stopped", "job", "wait"))
        b.branch(poll)

        b.position_at_end(poll)
        stop = b.load_atomic(self.word(b, team, STOP), "monotonic", 8)
        not_stopped = fn.append_basic_block("running")
        b.cbranch(b.icmp_signed("!=", stop, _c(0)), stopped, not_stopped)
        b.position_at_end(stopped)
        b.ret(_c(-1))

        b.position_at_end(not_stopped)
        gen = b.load_atomic(self.word(b, team, GEN), "acquire", 8)
        b.cbranch(b.icmp_signed("!=", gen, b.load(seen)), job, wait)

        b.position_at_end(job)
        b.store(gen, seen)
        b.call(claims, [team, tid, gen])
        b.store(self.now(b, ts), idle)
        b.store(_c(0), spins)
        b.branch(poll)

        b.position_at_end(wait)
        self.pause(b)
        n = b.add(b.load(spins), _c(1))
        b.store(n, spins)
        check = fn.append_basic_block("check")
        b.cbranch(b.icmp_signed("==", b.and_(n, _c(63)), _c(0)), check, poll)
        b.position_at_end(check)
        idle_for = b.sub(self.now(b, ts), b.load(idle))
        give_up, keep = fn.append_basic_block("idle"), fn.append_basic_block("keep")
        b.cbranch(b.icmp_signed(">", idle_for, spin_ns), give_up, keep)
        b.position_at_end(give_up)
        b.ret(b.load(seen))
        b.position_at_end(keep)
        with b.if_then(b.icmp_signed(">", idle_for, _c(YIELD_AFTER_NS))):
            b.call(self.sched_yield, [])
        b.branch(poll)
        return fn

    # -- the plan runner ------------------------------------------------------------------------
    def run(self, claims: ir.Function) -> ir.Function:
        fn = ir.Function(self.module, ir.FunctionType(I32, [_I64P, _I64P, I64, ir.PointerType(_RUN_T),
                                                          ir.PointerType(_REGION_T), ir.PointerType(_I8P),
                                                          _I64P]), RUN)
        team, plan, records, run_fn, region_fn, table, err = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        r = b.alloca(I64, name="r")
        owned = b.alloca(I64, name="owned")  # 1: this call holds BUSY; 2: another caller does
        code = b.alloca(I32, name="code")
        spins = b.alloca(I64, name="spins")
        b.store(_c(0), r)
        b.store(_c(0), owned)
        b.store(ir.Constant(I32, 0), code)
        head, body, out = (fn.append_basic_block(n) for n in ("head", "body", "out"))
        b.branch(head)

        b.position_at_end(head)
        b.cbranch(b.icmp_signed("<", b.load(r), records), body, out)

        b.position_at_end(body)
        base = b.mul(b.load(r), _c(RECORD))
        rec = {k: b.load(b.gep(plan, [b.add(base, _c(k))], inbounds=True))
               for k in (REC_FIRST, REC_LAST, REC_BLOCK, REC_EXTENT, REC_CHUNKS, REC_WIDTH, REC_GRANULE)}
        shared = b.icmp_signed(">", rec[REC_CHUNKS], _c(0))
        with b.if_then(b.and_(shared, b.icmp_signed("==", b.load(owned), _c(0)))):
            got = b.cmpxchg(self.word(b, team, BUSY), _c(0), _c(1), "acquire", "monotonic")
            b.store(b.select(b.extract_value(got, 1), _c(1), _c(2)), owned)
        together = b.and_(shared, b.icmp_signed("==", b.load(owned), _c(1)))
        alone_blk, team_blk, next_blk = (fn.append_basic_block(n) for n in ("alone", "team", "next"))
        b.cbranch(together, team_blk, alone_blk)

        # a run on this thread alone: blocked over its parallel range, or whole
        b.position_at_end(alone_blk)
        region_blk, whole_blk, ran = (fn.append_basic_block(n) for n in ("region", "whole", "ran"))
        b.cbranch(b.icmp_signed("!=", rec[REC_BLOCK], _c(0)), region_blk, whole_blk)
        b.position_at_end(region_blk)
        rc1 = b.call(region_fn, [table, rec[REC_FIRST], rec[REC_LAST], _c(0), rec[REC_EXTENT], rec[REC_BLOCK], err])
        b.store(rc1, code)
        b.branch(ran)
        b.position_at_end(whole_blk)
        rc2 = b.call(run_fn, [table, rec[REC_FIRST], rec[REC_LAST], _c(0), _c(WHOLE), err])
        b.store(rc2, code)
        b.branch(ran)
        b.position_at_end(ran)
        b.cbranch(b.icmp_signed("!=", b.load(code), ir.Constant(I32, 0)), out, next_blk)

        # a shared run: post it, claim chunks with the workers, wait for all of them
        b.position_at_end(team_blk)
        gen = b.add(b.load_atomic(self.word(b, team, GEN), "monotonic", 8), _c(1))
        fields = {RUN_FN: b.ptrtoint(run_fn, I64), REGION_FN: b.ptrtoint(region_fn, I64),
                  TABLE: b.ptrtoint(table, I64), FIRST: rec[REC_FIRST], LAST: rec[REC_LAST],
                  BLOCK: rec[REC_BLOCK], EXTENT: rec[REC_EXTENT], GRANULE: rec[REC_GRANULE],
                  DONE: _c(0), RC: _c(0)}
        for k, v in fields.items():
            b.store(v, self.word(b, team, k))
        word = b.or_(b.or_(b.shl(gen, _c(32)), b.shl(rec[REC_WIDTH], _c(24))), b.shl(rec[REC_CHUNKS], _c(12)))
        b.store_atomic(word, self.word(b, team, CLAIM), "release", 8)
        b.store_atomic(gen, self.word(b, team, GEN), "release", 8)
        b.call(claims, [team, _c(0), gen])
        b.store(_c(0), spins)
        wait, waiting, finished = (fn.append_basic_block(n) for n in ("wait", "waiting", "finished"))
        b.branch(wait)
        b.position_at_end(wait)
        finished_chunks = b.load_atomic(self.word(b, team, DONE), "acquire", 8)
        b.cbranch(b.icmp_signed("==", finished_chunks, rec[REC_CHUNKS]), finished, waiting)
        b.position_at_end(waiting)
        self.pause(b)
        n = b.add(b.load(spins), _c(1))
        b.store(n, spins)
        with b.if_then(b.icmp_signed("==", b.and_(n, _c(4095)), _c(0))):
            b.call(self.sched_yield, [])
        b.branch(wait)
        b.position_at_end(finished)
        rc = b.trunc(b.load(self.word(b, team, RC)), I32)
        b.store(rc, code)
        failed = fn.append_basic_block("failed")
        b.cbranch(b.icmp_signed("!=", rc, ir.Constant(I32, 0)), failed, next_blk)
        b.position_at_end(failed)
        for k in range(4):
            b.store(b.load(self.word(b, team, ERR + k)), b.gep(err, [_c(k)], inbounds=True))
        b.branch(out)

        b.position_at_end(next_blk)
        b.store(b.add(b.load(r), _c(1)), r)
        b.branch(head)

        b.position_at_end(out)
        with b.if_then(b.icmp_signed("==", b.load(owned), _c(1))):
            b.store_atomic(_c(0), self.word(b, team, BUSY), "release", 8)
        b.ret(b.load(code))
        return fn
