"""The host target, LLVM's optimization pipeline, MCJIT, and the compiled-module caches.

Modules are optimized at O3 with llvmlite's new pass builder (loop and SLP
vectorization on) for the host CPU's name and features, so kernels use the
widest vector units the machine has. Compiled modules are cached by a key made
of the module's text and the target (triple, CPU, features): in this process
(at most :func:`cache_limit` engines, ``jit_cache`` of the compile options, least recently used evicted; a kernel keeps
its own engine alive), and on disk (:mod:`.disk_cache`), where another process
finds the machine code and skips LLVM altogether.
"""
from __future__ import annotations

import contextvars
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from te_grad.errors import InternalError

from . import compile_worker, disk_cache
from .llvm import binding as llvm
from .options import current_options

_lock = threading.RLock()  # compile_module holds it while loading from the disk cache
_target = None
_cache: "OrderedDict[str, Compiled]" = OrderedDict()


def cache_limit() -> int:
    """Engines kept in this process for reuse (``jit_cache`` of the compile options in force:
    ``TE_GRAD_JIT_CACHE``, default 64)."""
    return current_options().jit_cache


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
    """A JIT-compiled module: function addresses by name; its optimized IR on request."""
    engine: object
    addresses: Dict[str, int]
    text: str = field(repr=False, default="")
    _optimized: Optional[str] = field(repr=False, default=None)
    key: str = ""  # the module's key in the disk cache
    context: object = field(repr=False, default=None)  # the module's own LLVM context

    def __del__(self):
        # the engine (which owns the module) goes before the context its types live in; a
        # context of its own per module is what lets LLVM free the module's constants and
        # types (the global context would keep them for the life of the process)
        engine = self.__dict__.pop("engine", None)
        if engine is not None:
            engine.close()

    @property
    def optimized_ir(self) -> str:
        """The module after LLVM's optimizations (recomputed when it came from the disk cache)."""
        if self._optimized is None:
            self._optimized = str(_optimized_module(self.text, host_target()))
        return self._optimized

    @property
    def asm(self) -> str:
        """The host assembly of the optimized module."""
        return host_target().machine.emit_assembly(llvm.parse_assembly(self.optimized_ir))


def _optimized_module(text: str, target: Target, context=None):
    try:
        return compile_worker.optimize(llvm, text, target.triple, target.machine, context)
    except RuntimeError as err:  # te_grad emitted IR that LLVM rejects: a te_grad bug
        raise InternalError(f"LLVM rejected the generated module: {err}") from None


def module_key(text: str) -> str:
    """The disk-cache key of a module compiled for the host."""
    target = host_target()
    return disk_cache.key(target.triple, target.cpu, target.features, text)


class Pending:
    """A module being compiled by the worker process: :meth:`result` waits for it."""

    def __init__(self, future):
        self._future = future

    def result(self) -> "Compiled":
        return self._future.result()


_background = None


def _remote(text: str, key: str, functions: List[str]) -> Optional[Compiled]:
    """The module compiled by the worker process and loaded, or None without a worker."""
    target = host_target()
    try:
        produced = compile_worker.compile_remote(text, target.triple, target.cpu, target.features)
    except RuntimeError as err:
        raise InternalError(f"LLVM rejected the generated module: {err}") from None
    if produced is None:
        return None
    disk_cache.store_object(key, produced)
    with _lock:
        compiled = _load_object(produced, functions, text, key)
        if compiled is not None:
            _remember(key, compiled)
    return compiled


def compile_module(text: str, functions: List[str], wait: bool = True):
    """Optimize and JIT-compile LLVM IR ``text`` (cached); return the addresses of ``functions``.

    With ``wait=False`` a module that must be compiled goes to the worker process in the
    background and a :class:`Pending` is returned at once (the caller goes on preparing
    its next module while LLVM works on this one); a module found in a cache is returned
    as it is."""
    global _background
    key = module_key(text)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
        compiled = load_compiled(key, functions, text)
        if compiled is not None:
            _remember(key, compiled)
            return compiled
    if current_options().compile_worker:
        if not wait:
            if _background is None:
                from concurrent.futures import ThreadPoolExecutor
                _background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="te_grad-compile")
            # the compile runs under the caller's options (its disk cache)
            context = contextvars.copy_context()
            return Pending(_background.submit(context.run, _compile_or_here, text, key, functions))
        compiled = _remote(text, key, functions)
        if compiled is not None:
            return compiled
    return _compile_here(text, key, functions)


def _compile_or_here(text: str, key: str, functions: List[str]) -> Compiled:
    compiled = _remote(text, key, functions)
    return compiled if compiled is not None else _compile_here(text, key, functions)


def _compile_here(text: str, key: str, functions: List[str]) -> Compiled:
    """The module optimized and compiled in this process."""
    target = host_target()
    with _lock:
        context = llvm.create_context()
        mod = _optimized_module(text, target, context)
        optimized = str(mod)
        # an engine owns the target machine it is given: each gets its own, so that freeing
        # one engine (cache eviction) never frees a machine still in use
        engine = llvm.create_mcjit_compiler(mod, _new_machine(target))
        produced = {}
        engine.set_object_cache(notify_func=lambda m, data: produced.setdefault("object", bytes(data)))
        engine.finalize_object()
        if "object" in produced:
            disk_cache.store_object(key, produced["object"])
        addresses = {name: engine.get_function_address(name) for name in functions}
        compiled = Compiled(engine, addresses, text, optimized, key, context)
        _remember(key, compiled)
        return compiled


def load_compiled(key: str, functions: List[str], text: str = "") -> Optional[Compiled]:
    """The module of ``key`` from the disk cache, loaded without LLVM's optimizer or code
    generator, or None."""
    obj = disk_cache.load_object(key)
    if obj is None:
        return None
    return _load_object(obj, functions, text, key)


def _load_object(obj: bytes, functions: List[str], text: str, key: str) -> Optional[Compiled]:
    """An engine running the object file ``obj`` (machine code for the host), or None."""
    if not disk_cache.plausible_object(obj):
        return None  # LLVM aborts the process on bytes that are not an object file
    target = host_target()
    context = llvm.create_context()
    empty = llvm.parse_assembly("", context=context)
    empty.triple = target.triple
    engine = llvm.create_mcjit_compiler(empty, _new_machine(target))
    engine.set_object_cache(getbuffer_func=lambda m: obj)
    engine.finalize_object()
    addresses = {name: engine.get_function_address(name) for name in functions}
    if not all(addresses.values()):
        return None  # an object without the functions: ignore it
    return Compiled(engine, addresses, text, None, key, context)


def cached_module(key: str, functions: List[str], text: str) -> Optional[Compiled]:
    """The compiled module of ``key`` from this process's cache or the disk cache, or None."""
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
        compiled = load_compiled(key, functions, text)
        if compiled is not None:
            _remember(key, compiled)
        return compiled


def _remember(key: str, compiled: Compiled):
    _cache[key] = compiled
    limit = cache_limit()
    while len(_cache) > limit:
        _cache.popitem(last=False)


def cache_size() -> int:
    return len(_cache)

