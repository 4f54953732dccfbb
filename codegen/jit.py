"""The host target, LLVM's optimization pipeline, MCJIT, and the compiled-module cache.

Modules are optimized at O3 with llvmlite's new pass builder (loop and SLP
vectorization on) for the host CPU's name and features, so kernels use the
widest vector units the machine has. Compiled modules are cached in-process
by a key made of the module's text and the target (triple, CPU, features):
building the same kernel twice compiles once.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Dict, List

from te_grad.errors import InternalError

from .llvm import binding as llvm

_lock = threading.Lock()
_target = None
_cache: Dict[str, "Compiled"] = {}


@dataclass
class Target:
    triple: str
    cpu: str
    features: str
    machine: object


def _new_machine(target: Target):
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=3, jit=True)


def clear_cache():
    """Forget every compiled module (kernels already built keep working)."""
    with _lock:
        _cache.clear()


def host_target() -> Target:
    """The host CPU as an LLVM target machine (created once)."""
    global _target
    with _lock:
        if _target is None:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            triple = llvm.get_process_triple()
            cpu = llvm.get_host_cpu_name()
            features = llvm.get_host_cpu_features().flatten()
            machine = llvm.Target.from_triple(triple).create_target_machine(
                cpu=cpu, features=features, opt=3, jit=True)
            _target = Target(triple, cpu, features, machine)
        return _target


@dataclass
class Compiled:
    """A JIT-compiled module: function addresses by name, plus its optimized IR."""
    engine: object
    addresses: Dict[str, int]
    optimized_ir: str

    @property
    def asm(self) -> str:
        """The host assembly of the optimized module."""
        return host_target().machine.emit_assembly(llvm.parse_assembly(self.optimized_ir))


def compile_module(text: str, functions: List[str]) -> Compiled:
    """Optimize and JIT-compile LLVM IR ``text`` (cached); return the addresses of ``functions``."""
    target = host_target()
    key = "\n".join([target.triple, target.cpu, target.features, text])
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            return hit
        try:
            mod = llvm.parse_assembly(text)
            mod.triple = target.triple
            mod.data_layout = str(target.machine.target_data)
            mod.verify()
        except RuntimeError as err:  # te_grad emitted IR that LLVM rejects: a te_grad bug
            raise InternalError(f"LLVM rejected the generated module: {err}") from None
        tuning = llvm.create_pipeline_tuning_options(speed_level=3)
        tuning.loop_vectorization = True
        tuning.slp_vectorization = True
        tuning.loop_interleaving = True
        # full unrolling of short constant loops multiplies code size (megabytes of IR
        # for a conv gradient) and compile time for no measurable speed
        tuning.loop_unrolling = False
        builder = llvm.create_pass_builder(target.machine, tuning)
        builder.getModulePassManager().run(mod, builder)
        optimized = str(mod)
        # an engine owns the target machine it is given: each gets its own, so that freeing
        # one engine (cache eviction) never frees a machine still in use
        engine = llvm.create_mcjit_compiler(mod, _new_machine(target))
        engine.finalize_object()
        addresses = {name: engine.get_function_address(name) for name in functions}
        compiled = Compiled(engine, addresses, optimized)
        _cache[key] = compiled
        return compiled


def cache_size() -> int:
    return len(_cache)

