"""The threaded build of an exported kernel: each parallel region forked onto pthreads.

The plan is the one a :class:`~codegen.kernel.Kernel` follows (:func:`.regions.plan`):
runs of stages, a run big enough shared among the threads by static chunks of its
parallel loop (multiples of its granule), the calling thread taking the last chunk, and
small runs in one call; only the threshold differs, since a thread is started per chunk
here where kernels hand chunks to a team of waiting workers (:mod:`.team`). ``pthread_create`` failing is no error: that chunk then runs on
the calling thread. The first non-zero code of any chunk is returned.
"""
from __future__ import annotations

from typing import List, Tuple

from .llvm import ir
from .llvm_types import I8, I32, I64
from .regions import chunk_bounds
from .team_ir import WHOLE as _WHOLE


#: an exported kernel starts a thread per chunk of a shared run (about 20 µs each), so it
#: shares only runs of at least this many innermost iterations
EXPORT_THRESHOLD = 500_000


def plan(kernel, threads: int) -> List[Tuple[int, int, List[Tuple[int, int]]]]:
    """``[(first, last, chunks)]``: ``chunks`` empty for a run made in one call."""
    out = []
    for r in kernel.plan(threads, threshold=EXPORT_THRESHOLD):
        chunks = [(lo, hi) for lo, hi in chunk_bounds(r.extent, r.chunks, r.granule) if hi > lo] \
            if r.chunks else []
        out.append((r.first, r.last, chunks))
    return out


def run_threaded(module, b, entry, run, table_p, err_p, threads: int, pointer_bits: int):
    """Emit the calls of every run (see the module docstring); returns the i32 code."""
    i8p = ir.PointerType(I8)
    task_t = ir.LiteralStructType([ir.PointerType(i8p), I64, I64, I64, I64, ir.ArrayType(I64, 4), I32])
    worker = _worker(module, entry.name, run, task_t)
    create = module.globals.get("pthread_create") or ir.Function(
        module, ir.FunctionType(I32, [i8p, i8p, ir.PointerType(ir.FunctionType(i8p, [i8p])), i8p]),
        "pthread_create")
    join = _join(module, pointer_bits)
    fn = b.function
    done = fn.append_basic_block("done")
    result = None
    pending = []  # (block, code) feeding the final phi
    for first, last, chunks in plan(entry.kernel, threads):
        if not chunks:
            rc = b.call(run, [table_p, ir.Constant(I64, first), ir.Constant(I64, last), ir.Constant(I64, 0),
                              ir.Constant(I64, _WHOLE), err_p])
        else:
            rc = _fork(b, worker, create, join, run, task_t, table_p, err_p, first, last, chunks)
        failed = b.icmp_signed("!=", rc, ir.Constant(I32, 0))
        nxt = fn.append_basic_block("next")
        pending.append((b.block, rc))
        b.cbranch(failed, done, nxt)
        b.position_at_end(nxt)
    pending.append((b.block, ir.Constant(I32, 0)))
    b.branch(done)
    b.position_at_end(done)
    result = b.phi(I32)
    for block, code in pending:
        result.add_incoming(code, block)
    return result


def _worker(module, name, run, task_t):
    i8p = ir.PointerType(I8)
    existing = module.globals.get(f"{name}__worker")
    if existing is not None:
        return existing
    fn = ir.Function(module, ir.FunctionType(i8p, [i8p]), f"{name}__worker")
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    task = b.bitcast(fn.args[0], ir.PointerType(task_t))

    def field(k):
        return b.gep(task, [ir.Constant(I32, 0), ir.Constant(I32, k)], inbounds=True)
    err = b.gep(task, [ir.Constant(I32, 0), ir.Constant(I32, 5), ir.Constant(I32, 0)], inbounds=True)
    rc = b.call(run, [b.load(field(0)), b.load(field(1)), b.load(field(2)), b.load(field(3)), b.load(field(4)),
                      err])
    b.store(rc, field(6))
    b.ret(ir.Constant(i8p, None))
    return fn


def _fork(b, worker, create, join, run, task_t, table_p, err_p, first, last, chunks):
    """Chunks but the last on new threads (or here, if a thread cannot be made), the last here;
    join; the first non-zero code (its error record copied to ``err_p``)."""
    i8p = ir.PointerType(I8)
    tasks, handles, started = [], [], []
    for lo, hi in chunks[:-1]:
        task = b.alloca(task_t)
        for k, v in enumerate([table_p, ir.Constant(I64, first), ir.Constant(I64, last), ir.Constant(I64, lo),
                               ir.Constant(I64, hi)]):
            b.store(v, b.gep(task, [ir.Constant(I32, 0), ir.Constant(I32, k)], inbounds=True))
        handle = b.alloca(ir.ArrayType(I8, 16))  # pthread_t is at most 8 bytes on the supported targets
        handle_p = b.bitcast(handle, i8p)
        rc = b.call(create, [handle_p, ir.Constant(i8p, None), worker, b.bitcast(task, i8p)])
        ok = b.icmp_signed("==", rc, ir.Constant(I32, 0))
        with b.if_then(b.not_(ok), likely=False):  # no thread: run the chunk here
            b.call(worker, [b.bitcast(task, i8p)])
        tasks.append(task)
        handles.append(handle_p)
        started.append(ok)
    lo, hi = chunks[-1]
    mine = b.call(run, [table_p, ir.Constant(I64, first), ir.Constant(I64, last), ir.Constant(I64, lo),
                        ir.Constant(I64, hi), err_p])
    code = mine
    for task, handle_p, ok in zip(tasks, handles, started):
        with b.if_then(ok):
            b.call(join, [handle_p])
        theirs = b.load(b.gep(task, [ir.Constant(I32, 0), ir.Constant(I32, 6)], inbounds=True))
        take = b.and_(b.icmp_signed("==", code, ir.Constant(I32, 0)), b.icmp_signed("!=", theirs, ir.Constant(I32, 0)))
        with b.if_then(take, likely=False):
            for k in range(4):
                src = b.gep(task, [ir.Constant(I32, 0), ir.Constant(I32, 5), ir.Constant(I32, k)], inbounds=True)
                b.store(b.load(src), b.gep(err_p, [ir.Constant(I64, k)]))
        code = b.select(take, theirs, code)
    return code


def _join(module, pointer_bits: int):
    """``te_grad_join(handle*)``: ``pthread_join`` with the handle (an unsigned long on Linux)
    read at the platform's width."""
    fn = module.globals.get("te_grad_join")
    if fn is not None:
        return fn
    i8p = ir.PointerType(I8)
    handle_t = ir.IntType(pointer_bits)
    pthread_join = ir.Function(module, ir.FunctionType(I32, [handle_t, ir.PointerType(i8p)]), "pthread_join")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [i8p]), "te_grad_join")
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    handle = b.load(b.bitcast(fn.args[0], ir.PointerType(handle_t)))
    b.call(pthread_join, [handle, ir.Constant(ir.PointerType(i8p), None)])
    b.ret_void()
    return fn
