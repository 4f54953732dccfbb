"""Compile te_grad graphs to native code: scheduling, LLVM lowering, JIT.

:func:`build` simplifies the graph (isl), schedules each tensor as loop nests
(:mod:`.schedule`), lowers them to one LLVM module (:mod:`.llvm_module`, a function per stage by :mod:`.llvm_emit`),
optimizes and JIT-compiles it for the host CPU (:mod:`.jit`), and wraps it as
a callable :class:`~codegen.kernel.Kernel`. Every setting of a build is a field of
:class:`~codegen.options.CompileOptions` (:mod:`.options`).
"""
from __future__ import annotations

from typing import Sequence, Union

import simplify as _simplify  # its function looked up at build time: either package may be imported first
from simplify.count import RAGGED_TRIPS, tensor_iterations
from te_grad.collector import during_build
from te_grad.errors import UserError
from te_grad.graph import reads_in, topo_order
from te_grad.ir import Expr, Tensor
from te_grad.sizes import graph_size_vars, size_vars_in

from . import build_codec, disk_cache
from .jit import cached_module, compile_module, module_key
from .kernel import CompiledStage, Kernel, default_threads
from .llvm_module import RUN_REGION, RUN_STAGES, emit_module
from .loopir import tensors_of
from .machine import Machine
from .options import FIELDS, CompileOptions, compile_options, current_options, using
from .regions import regions
from .schedule import disabled_pass_names, stages_for

__all__ = ["build", "Kernel", "CompileOptions", "compile_options", "current_options"]


@during_build
def build(outputs: Union[Tensor, Sequence[Tensor]], inputs: Sequence[Tensor], *, options: CompileOptions = None,
          fast_math: bool = None, threads: int = None, machine: Machine = None, wait: bool = True,
          **changes) -> Kernel:
    """Compile ``outputs`` as functions of the placeholders ``inputs`` into one kernel.

    ``options`` (a :class:`codegen.options.CompileOptions`; default: the options in force,
    :func:`codegen.options.current_options`, i.e. the innermost ``with compile_options(...)``
    block's, else the environment's) holds every setting; keywords naming its fields
    (``fast_math=``, ``threads=``, ``machine=``, ``disabled_passes=``, ``thresholds=``,
    ``verify=``, ``disk_cache=``, ...) override them, and the whole build runs under the
    result. ``fast_math`` (default True) lets reductions reassociate (so they vectorize) and
    products and sums contract into fused multiply-adds. ``threads`` defaults to the
    CPUs available (or ``TE_GRAD_NUM_THREADS``). ``machine`` (a
    :class:`codegen.machine.Machine`: vector width and registers, cache sizes)
    is what the loops are sized for; by default this machine's own
    (:func:`codegen.machine.host_machine`). ``disabled_passes`` names schedule passes to
    skip (:data:`codegen.schedule.PASSES`). With ``wait=False`` the kernel is returned as
    soon as its LLVM module is handed to the compile worker (LLVM then runs in another
    process while the caller prepares its next kernel); its first call, or
    ``kernel.wait()``, waits for the machine code. LLVM's own errors then come from there.
    """
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = list(inputs)
    for t in outs + inputs:
        if not isinstance(t, Tensor):
            raise UserError(f"tg.build expects tensors, got {t!r}")
    for t in inputs:
        if not t.is_placeholder:
            raise UserError(f"input {t.name} of tg.build is not a placeholder")
    if options is not None and not isinstance(options, CompileOptions):
        raise UserError(f"tg.build: options must be a codegen.options.CompileOptions, got {options!r}")
    for name, value in (("fast_math", fast_math), ("threads", threads), ("machine", machine)):
        if value is not None:
            changes[name] = value
    unknown = sorted(set(changes) - set(FIELDS))
    if unknown:
        raise UserError(f"tg.build got unknown keyword(s) {', '.join(unknown)}; the options are "
                        f"{', '.join(FIELDS)} (and wait)")
    try:
        options = (options if options is not None else current_options()).replace(**changes)
    except UserError as err:
        raise UserError(f"tg.build: {err}") from None
    if len({id(t) for t in inputs}) != len(inputs):
        raise UserError("tg.build lists the same input twice")
    needed = [t for t in topo_order(outs) if t.is_placeholder and not any(t is x for x in inputs)]
    if needed:
        raise UserError(f"tg.build: the outputs need placeholder(s) {', '.join(t.name for t in needed)} "
                        "that are not among the inputs")
    # the machine resolved and the passes named as the registry names them (a clear error
    # for a name that is no pass): both part of the build's cache key
    options = options.replace(machine=options.resolved_machine(),
                              disabled_passes=disabled_pass_names(options.disabled_passes))
    with using(options):
        return _build(outs, inputs, options, wait)


def _build(outs, inputs, options: CompileOptions, wait: bool) -> Kernel:
    fast_math, machine = options.fast_math, options.machine
    cached = _cached_build(outs, inputs, options)
    if cached is not None:
        return cached
    undecided = []  # reads simplify.check_bounds could not prove in bounds
    simplified = _simplify.simplify(outs, runtime=undecided)
    # a read whose index is data is always checked; one under a condition on data, or with an
    # index that is not quasi-affine, in kernels that have such a read (proven graphs keep
    # their code as it was)
    bound_checks = any(not any(reads_in(i) for i in c.read.indices) for c in undecided)
    stages = stages_for(simplified, machine, options)
    buffers = list(inputs)
    index = {id(t): n for n, t in enumerate(buffers)}
    for s in stages:
        for t in tensors_of(s):
            if id(t) not in index:
                index[id(t)] = len(buffers)
                buffers.append(t)
    for t in simplified:
        if id(t) not in index:
            index[id(t)] = len(buffers)
            buffers.append(t)
    works = [s.work if s.work is not None else tensor_iterations(s.tensor, RAGGED_TRIPS) for s in stages]
    size_vars = graph_size_vars(outs)  # bound at each call; one module for every value
    text = emit_module(stages, index, fast_math, works=works, bound_checks=bound_checks, sizes=size_vars)
    compiled = compile_module(text, [RUN_STAGES, RUN_REGION], wait=wait)
    compiled_stages = [CompiledStage(s, w) for s, w in zip(stages, works)]
    kernel = Kernel(simplified, inputs, buffers, compiled_stages, regions(stages), compiled,
                    options.resolved_threads(), size_vars)
    kernel.fast_math = fast_math  # what Kernel.export re-emits the stages with
    kernel.bound_checks = bound_checks
    kernel.options = options
    _remember_build(outs, inputs, options, kernel, text)
    return kernel


def _build_key(outs, inputs, options: CompileOptions) -> str:
    """The disk-cache key of a build: the graph's structure and the options that change the
    code (``CompileOptions.code_key``)."""
    from te_grad.fingerprint import fingerprint
    return disk_cache.key(fingerprint(outs, inputs, extra=options.code_key()))


def _remember_build(outs, inputs, options, kernel, text):
    """Store the build in the disk cache (as JSON: :mod:`.build_codec`)."""
    if not disk_cache.enabled():
        return
    entry = dict(outputs=kernel.outputs, inputs=kernel.inputs, buffers=kernel.buffers,
                 stages=[(cs.stage, cs.work) for cs in kernel.stages], regions=kernel.regions,
                 module=module_key(text), text=text, bound_checks=kernel.bound_checks)
    try:
        value = build_codec.encode(entry)
    except ValueError:
        return  # something the codec does not hold: not cached
    disk_cache.store_json("build", _build_key(outs, inputs, options), value)


def _checked_build(entry, inputs):
    """``entry`` if it is a decoded build for ``inputs`` (its parts of the right types and
    its module key that of its text), else None."""
    from .loopir import Stage
    if not isinstance(entry, dict) or set(entry) != {"outputs", "inputs", "buffers", "stages", "regions",
                                                     "module", "text", "bound_checks"}:
        return None
    tensors = list(entry["outputs"]) + list(entry["inputs"]) + list(entry["buffers"])
    if not all(isinstance(t, Tensor) for t in tensors) or len(entry["inputs"]) != len(inputs):
        return None
    if any(not _same_extents(o.shape, n.shape) or o.dtype != n.dtype for o, n in zip(entry["inputs"], inputs)):
        return None
    if not all(isinstance(s, tuple) and len(s) == 2 and isinstance(s[0], Stage) and type(s[1]) is int
               for s in entry["stages"]):
        return None
    if not isinstance(entry["text"], str) or entry["module"] != module_key(entry["text"]):
        return None
    if type(entry["bound_checks"]) is not bool:
        return None
    return entry


def _same_extents(a, b) -> bool:
    """Whether two shapes are the same: ints equal, size expressions printed alike with
    variables of the same ranges (a cached graph's variables are objects of its own)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, Expr) != isinstance(y, Expr):
            return False
        if isinstance(x, Expr):
            vx, vy = size_vars_in(x), size_vars_in(y)
            if str(x) != str(y) or [(v.name, v.lo, v.hi) for v in vx] != [(v.name, v.lo, v.hi) for v in vy]:
                return False
        elif x != y:
            return False
    return True


def _cached_build(outs, inputs, options: CompileOptions):
    """The kernel of an identical earlier build (this process or another), or None."""
    if not disk_cache.enabled():
        return None
    key = _build_key(outs, inputs, options)
    value = disk_cache.load_json("build", key)
    if value is None:
        return None
    try:
        entry = _checked_build(build_codec.decode(value), inputs)
    except Exception:  # noqa: BLE001 - a malformed entry (a te_grad bug or a forged file): rebuild
        entry = None
    if entry is None:
        disk_cache.discard("build", key)
        return None
    compiled = cached_module(entry["module"], [RUN_STAGES, RUN_REGION], entry["text"])
    if compiled is None:
        return None
    old_inputs = entry["inputs"]
    swap = {id(o): n for o, n in zip(old_inputs, inputs)}
    buffers = [swap.get(id(t), t) for t in entry["buffers"]]
    outputs = [swap.get(id(t), t) for t in entry["outputs"]]  # an input may be an output too
    stages = [CompiledStage(stage, work) for stage, work in entry["stages"]]
    size_vars = graph_size_vars(outs)
    kernel = Kernel(outputs, inputs, buffers, stages, entry["regions"], compiled,
                    options.resolved_threads(), size_vars)
    # the cached graph's size variables stand for the caller's of the same names
    mine = {v.name: v for v in size_vars}
    cached = {id(v): v for t in kernel.buffers + kernel.outputs for n in t.shape for v in size_vars_in(n)}
    kernel._aliases = {v: mine[v.name] for v in cached.values() if v.name in mine and mine[v.name] is not v}
    for o, n in zip(old_inputs, inputs):  # the stages read the cached placeholders
        kernel._index[id(o)] = kernel._index[id(n)]
    kernel.fast_math = options.fast_math
    kernel.options = options
    kernel.bound_checks = entry["bound_checks"]
    return kernel
