"""The host target, LLVM's optimization pipeline, MCJIT, and the compiled-module caches.

Modules are optimized at O3 with llvmlite's new pass builder (loop and SLP
vectorization on) for the host CPU's name and features, so kernels use the
widest vector units the machine has. Compiled modules are cached by a key made
of the module's text and the target (triple, CPU, features): in this process
(at most :func:`cache_limit` engines, ``jit_cache`` of the compile options, least recently used evicted; a kernel keeps
its own engine alive), and on disk (:mod:`.disk_cache`), where another process
finds the machine code and skips LLVM altogether. A kernel's module is compiled in parts, a
stage function each, cached by the stage's own text (:func:`split_module`): a stage shared by
kernels or models is compiled once, and the missing parts are compiled side by side by the
compile workers (:func:`codegen.compile_worker.compile_many`).
"""
from __future__ import annotations

import contextvars
import hashlib
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
    """Forget every compiled module and part (kernels already built keep working)."""
    global _parts_bytes
    with _lock:
        _cache.clear()
        _parts.clear()
        _parts_bytes = 0


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
    parts = split_module(text, functions)
    if parts is not None:
        if not wait:
            if _background is None:
                from concurrent.futures import ThreadPoolExecutor
                _background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="te_grad-compile")
            found = _split_compiled(text, key, functions, parts, compile_missing=False)
            if found is not None:
                return found
            context = contextvars.copy_context()
            return Pending(_background.submit(context.run, _split_compiled, text, key, functions, parts))
        return _split_compiled(text, key, functions, parts)
    with _lock:
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
    """The compiled module of ``key`` from this process's cache or the disk cache, or None
    (a module split per stage: its parts found in the caches, the missing ones compiled)."""
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    parts = split_module(text, functions)
    if parts is not None:
        return _split_compiled(text, key, functions, parts)
    with _lock:
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



# ---------------------------------------------------------------------------------------------
# modules split per stage

#: object files of module parts kept in this process (by their disk-cache key), at most
#: this many bytes: a kernel sharing a stage with an earlier one loads its machine code even
#: when the disk cache is off
PART_CACHE_BYTES = 64 << 20
_parts: "OrderedDict[str, bytes]" = OrderedDict()
_parts_bytes = 0


@dataclass
class Split:
    """A kernel's module cut in pieces: ``parts`` (symbol, module text), a stage function
    each, named by a hash of its own text (so the same stage in any kernel or model is the
    same part, compiled once and cached once), and ``glue``, the entry points calling them."""
    parts: List[tuple]
    glue: str


def split_module(text: str, functions: List[str]) -> Optional[Split]:
    """``text`` (a module of :mod:`.llvm_module`: declarations, stage functions, and the entry
    points ``functions``) as a :class:`Split`, or None when it has fewer than two stage
    functions or defines anything else (a helper of internal linkage, a global): such a
    module is compiled whole.

    Each stage function is optimized in a module of its own, with the module's declarations
    and metadata: its functions are ``noinline`` and of external linkage, so LLVM's
    optimizer treats each of them the same alone as among the others (no inlining, no
    interprocedural constants); its optimized IR is the one of the whole module's, the
    function's name aside (``tests/codegen/test_split_modules.py`` checks it), as long as no
    function of the module is over :data:`.compile_worker.SLP_LANE_OPS` (the whole module is
    then optimized without SLP, the stages under it alone with it)."""
    head, defines, block = [], [], None
    for line in text.split("\n"):
        if block is not None:
            block.append(line)
            if line == "}":
                defines.append(block)
                block = None
        elif line.startswith("define "):
            block = [line]
        elif line.startswith("@") or line.startswith("attributes ") or line.startswith("$"):
            return None  # a global, an attribute group or a comdat: not split
        else:
            head.append(line)
    if block is not None:
        return None
    entry, stages = [], []
    for d in defines:
        name = _defined_name(d[0])
        if name is None:
            return None
        if name in functions:
            entry.append(d)
        elif d[0].split()[1] in ("internal", "private", "linkonce", "linkonce_odr", "weak", "weak_odr"):
            return None
        else:
            stages.append((name, d))
    if len(stages) < 2 or len(entry) != len(functions):
        return None
    head_text = "\n".join(head) + "\n"
    parts, glue_decls, renames = [], [], {}
    for name, d in stages:
        body = "\n".join(d)
        anonymous = body.replace(f'@"{name}"', '@"_"')
        symbol = "tgs_" + hashlib.sha256((head_text + anonymous).encode()).hexdigest()[:40]
        renames[name] = symbol
        parts.append((symbol, head_text + body.replace(f'@"{name}"', f'@"{symbol}"') + "\n"))
        header = d[0].replace(f'@"{name}"', f'@"{symbol}"')
        glue_decls.append("declare " + header[len("define "):header.rindex(")") + 1])
    glue = "\n".join(entry_line for d in entry for entry_line in d)
    for name, symbol in renames.items():
        glue = glue.replace(f'@"{name}"', f'@"{symbol}"')
    return Split(parts, head_text + "\n".join(glue_decls) + "\n" + glue + "\n")


def _defined_name(line: str) -> Optional[str]:
    at = line.find(' @"')
    if at < 0:
        return None
    end = line.find('"', at + 3)
    return None if end < 0 else line[at + 3:end]


def _remember_part(k: str, obj: bytes):
    global _parts_bytes
    if k in _parts:
        return
    _parts[k] = obj
    _parts_bytes += len(obj)
    while _parts_bytes > PART_CACHE_BYTES and len(_parts) > 1:
        _, old = _parts.popitem(last=False)
        _parts_bytes -= len(old)


def _part_object(k: str) -> Optional[bytes]:
    obj = _parts.get(k)
    if obj is not None:
        _parts.move_to_end(k)
        return obj
    obj = disk_cache.load_object(k)
    if obj is not None:
        _remember_part(k, obj)
    return obj


def _compile_parts(texts: List[str]) -> List[bytes]:
    """Object files of the module texts: in the worker processes side by side, else here."""
    target = host_target()
    if current_options().compile_worker:
        try:
            got = compile_worker.compile_many(texts, target.triple, target.cpu, target.features)
        except RuntimeError as err:
            raise InternalError(f"LLVM rejected the generated module: {err}") from None
        if got is not None:
            return got
    with _lock:
        return [target.machine.emit_object(_optimized_module(t, target, llvm.create_context())) for t in texts]


def _split_compiled(text: str, key: str, functions: List[str], split: Split,
                    compile_missing: bool = True) -> Optional[Compiled]:
    """The kernel module ``text`` of ``key`` from its parts: each part's object from this
    process's part cache or the disk cache, the others compiled (all at once, side by side)
    and stored; then linked in one engine. None if a part is missing and ``compile_missing``
    is false."""
    target = host_target()
    pieces = {symbol: part for symbol, part in split.parts}
    pieces["tgglue"] = split.glue
    keys = {symbol: disk_cache.key(target.triple, target.cpu, target.features, part)
            for symbol, part in pieces.items()}
    with _lock:
        objects = {symbol: _part_object(keys[symbol]) for symbol in pieces}
    missing = [symbol for symbol, obj in objects.items() if obj is None]
    if missing:
        if not compile_missing:
            return None
        made = _compile_parts([pieces[symbol] for symbol in missing])
        with _lock:
            for symbol, obj in zip(missing, made):
                disk_cache.store_object(keys[symbol], obj)
                _remember_part(keys[symbol], obj)
                objects[symbol] = obj
    with _lock:
        compiled = _link(objects, functions, text, key)
        if compiled is None:  # an object without its functions: a te_grad bug, never a wrong kernel
            raise InternalError("the parts of a kernel's module do not link")
        _remember(key, compiled)
        return compiled


def _link(objects: Dict[str, bytes], functions: List[str], text: str, key: str) -> Optional[Compiled]:
    """One engine running the object files ``objects`` (by module name) together."""
    if not all(disk_cache.plausible_object(obj) for obj in objects.values()):
        return None  # LLVM aborts the process on bytes that are not an object file
    target = host_target()
    context = llvm.create_context()
    modules = []
    for name in objects:
        m = llvm.parse_assembly("", context=context)
        m.name = name
        m.triple = target.triple
        modules.append(m)
    engine = llvm.create_mcjit_compiler(modules[0], _new_machine(target))
    for m in modules[1:]:
        engine.add_module(m)
    engine.set_object_cache(getbuffer_func=lambda m: objects.get(m.name))
    engine.finalize_object()
    addresses = {name: engine.get_function_address(name) for name in functions}
    if not all(addresses.values()):
        return None
    return Compiled(engine, addresses, text, None, key, context)
