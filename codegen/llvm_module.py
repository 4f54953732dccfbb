"""One LLVM module per kernel: a function per stage (:mod:`.llvm_emit`) and the two entry
points the kernel calls, :data:`RUN_STAGES` (a range of stages over a range of rows, in one
native call) and :data:`RUN_REGION` (the same, a block of rows at a time)."""
from __future__ import annotations

from typing import Dict, Sequence

from .llvm import ir
from .llvm_emit import StageEmitter, compared_tensors
from .llvm_types import I8, I32, I64
from .loopir import RegisterBlocked, Stage, loops_of_kind, tensors_of


#: the function running stages ``[first, last)`` one after the other on the calling thread
RUN_STAGES = "run_stages"
RUN_REGION = "run_region"


#: a stage of at most this many innermost iterations is compiled without LLVM's optimizer
#: (``optnone``) when the module is compiled just in time: every function costs the
#: optimizer and the vectorizer some milliseconds whatever its size, more than such a
#: stage takes to run in thousands of calls (the digits training step has 22 such stages
#: of 45: its cold build went from 1.06 s to 0.93 s, its step time unchanged)
UNOPTIMIZED_WORK = 256


def emit_module(stages: Sequence[Stage], buffer_index: Dict[int, int], fast_math: bool = True,
                prefix: str = "", internal: bool = False, works: Sequence[int] = None,
                bound_checks: bool = True, sizes: Sequence = ()):
    """One LLVM module with a function per stage, as text.

    It also defines :data:`RUN_STAGES`, ``i32 run_stages(i8** buffers, i64 first,
    i64 last, i64 lo, i64 hi, i64* err)``: stages ``first`` to ``last - 1``, each over
    ``[lo, hi)`` of its parallel loop (clamped to the loop), the kernel's buffers by
    index; on an error it returns the stage's code and writes the stage's number to
    ``err[3]``. Stages too small to share among threads run in one call, and so does
    each thread's share of a parallel region (:mod:`.regions`).

    ``prefix`` starts every function name (so that several kernels can share one object
    file) and ``internal`` gives the stage functions internal linkage (:mod:`.export`).
    ``works`` (each stage's innermost iterations), when given, marks the stages of at most
    :data:`UNOPTIMIZED_WORK` iterations ``optnone``. ``bound_checks`` checks at run time the
    reads whose bounds the static proof cannot decide (:mod:`.llvm_emit`); ``tg.build`` turns
    it off when :func:`simplify.check_bounds` decided every read of the graph.

    ``sizes`` (the kernel's size variables, ``kernel.size_vars``) are known only at run time:
    their values (int64) follow the buffer addresses in ``buffers`` (slot ``len(buffers)``
    on), and each stage that uses them gets a pointer to them after its buffers.
    """
    module = ir.Module(name="te_grad")
    functions = []
    compared = compared_tensors(stages)
    bodies: Dict[str, ir.Function] = {}  # a stage function's text, its name left out -> the function
    texts: Dict[int, str] = {}  # id of a stage function -> its text (printed once: the module reuses it)
    for n, s in enumerate(stages):
        name = f"{prefix}stage{n}_{s.tensor.name}"
        fn = StageEmitter(module, s, name, buffer_index, fast_math, id(s.tensor) in compared,
                          bound_checks, sizes).emit()
        fn.attributes.add("noinline")  # called from run_stages too: one copy of the code
        if works is not None and works[n] <= UNOPTIMIZED_WORK:
            fn.attributes.add("optnone")
        widest = max((lp.kind.vector_bits for lp in loops_of_kind(s.body, RegisterBlocked)), default=0)
        if widest > 256:
            _allow_vectors_of(fn, widest)
        if internal:
            fn.linkage = "internal"
        # stages that differ only in the buffers they touch (the steps of an unrolled stencil,
        # the layers of a model repeating one shape) share one function: each is compiled once
        text = str(fn)
        body = text.replace(f'@"{name}"', "@_", 1)
        same = bodies.setdefault(body, fn)
        if same is not fn:
            del module.globals[name]
        else:
            texts[id(fn)] = text
        functions.append(same)
    run = _emit_run_stages(module, stages, functions, buffer_index, prefix + RUN_STAGES)
    region = _emit_run_region(module, run, prefix + RUN_REGION)
    if internal:  # an exported kernel runs its regions whole
        region.linkage = "internal"
    return _module_text(module, texts)


def _module_text(module: ir.Module, texts: Dict[int, str]) -> str:
    """``str(module)``, the globals whose text is in ``texts`` (by id) not printed again (a
    large kernel's functions take seconds to print). The layout is llvmlite's
    ``Module.__repr__``: header, identified types, globals, metadata."""
    lines = ['; ModuleID = "%s"' % (module.name,), 'target triple = "%s"' % (module.triple,),
             'target datalayout = "%s"' % (module.data_layout,), '']
    lines += [t.get_declaration() for t in module.get_identified_types().values()]
    lines += [texts.get(id(v)) or str(v) for v in module.globals.values()]
    lines += module._get_metadata_lines()
    return "\n".join(lines)


def _allow_vectors_of(fn: ir.Function, bits: int):
    """Let LLVM keep ``fn``'s vectors of ``bits`` whole. On CPUs where it prefers 256-bit
    vectors (AVX-512 Xeons) it splits wider ones unless the function sets the string
    attribute ``"min-legal-vector-width"``; llvmlite's attribute set checks names against
    the enumerated attributes only, so this one is added to the set as written."""
    set.add(fn.attributes, f'"min-legal-vector-width"="{bits}"')


def _emit_run_stages(module: ir.Module, stages: Sequence[Stage], functions, buffer_index: Dict[int, int],
                     name: str = RUN_STAGES):
    i8p = ir.PointerType(I8)
    fn = ir.Function(module, ir.FunctionType(I32, [ir.PointerType(i8p), I64, I64, I64, I64,
                                                   ir.PointerType(I64)]), name)
    bufs, first, last, lo, hi, err = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    for k, (stage, callee) in enumerate(zip(stages, functions)):
        run, skip = fn.append_basic_block(f"run{k}"), fn.append_basic_block(f"after{k}")
        k64 = ir.Constant(I64, k)
        b.cbranch(b.and_(b.icmp_signed("<=", first, k64), b.icmp_signed("<", k64, last)), run, skip)
        b.position_at_end(run)
        args = []
        tensors = tensors_of(stage)
        for t, param in zip(tensors, callee.args):
            slot = b.gep(bufs, [ir.Constant(I64, buffer_index[id(t)])], inbounds=True)
            args.append(b.bitcast(b.load(slot), param.type))
        if len(callee.args) > len(tensors) + 3:  # the sizes, after the buffer addresses
            first_size = ir.Constant(I64, max(buffer_index.values()) + 1)
            args.append(b.bitcast(b.gep(bufs, [first_size], inbounds=True), ir.PointerType(I64)))
        rc = b.call(callee, args + [lo, hi, err])
        failed = fn.append_basic_block(f"failed{k}")
        b.cbranch(b.icmp_signed("!=", rc, ir.Constant(I32, 0)), failed, skip)
        b.position_at_end(failed)
        b.store(k64, b.gep(err, [ir.Constant(I64, 3)], inbounds=True))
        b.ret(rc)
        b.position_at_end(skip)
    b.ret(ir.Constant(I32, 0))
    return fn


def _emit_run_region(module: ir.Module, run_stages, name: str = RUN_REGION):
    """``i32 run_region(i8** buffers, i64 first, i64 last, i64 lo, i64 hi, i64 block, i64* err)``:
    :data:`RUN_STAGES` over ``[lo, hi)`` a block of ``block`` rows at a time (:mod:`.regions`)."""
    i8p = ir.PointerType(I8)
    fn = ir.Function(module, ir.FunctionType(I32, [ir.PointerType(i8p), I64, I64, I64, I64, I64,
                                                   ir.PointerType(I64)]), name)
    bufs, first, last, lo, hi, block, err = fn.args
    entry, head, body, done = (fn.append_basic_block(n) for n in ("entry", "head", "body", "done"))
    b = ir.IRBuilder(entry)
    b.branch(head)
    b.position_at_end(head)
    start = b.phi(I64)
    start.add_incoming(lo, entry)
    b.cbranch(b.icmp_signed("<", start, hi), body, done)
    b.position_at_end(body)
    end = b.add(start, block)
    end = b.select(b.icmp_signed("<", end, hi), end, hi)
    rc = b.call(run_stages, [bufs, first, last, start, end, err])
    failed = fn.append_basic_block("failed")
    after = fn.append_basic_block("next")
    b.cbranch(b.icmp_signed("!=", rc, ir.Constant(I32, 0)), failed, after)
    b.position_at_end(failed)
    b.ret(rc)
    b.position_at_end(after)
    start.add_incoming(end, after)
    b.branch(head)
    b.position_at_end(done)
    b.ret(ir.Constant(I32, 0))
    return fn
