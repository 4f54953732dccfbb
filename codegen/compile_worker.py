"""LLVM's optimizer and code generator in a worker process, so that this one stays small.

Optimizing and compiling a module with llvmlite keeps some 50 to 100 KB of native memory
for the life of the process, whatever is freed afterwards (measured with llvmlite 0.50 /
LLVM 22: the pass pipeline and the code generator each leak; loading a finished object
file does not). A process that builds thousands of distinct kernels (a framework bridge
fed varying shapes) would grow without bound. So modules are compiled here, in a worker
process started on first use, which returns the object file and the optimized IR; the
worker is replaced after :data:`MAX_JOBS` modules, and the process that asked only loads
objects. The compile option ``compile_worker=False`` (``TE_GRAD_COMPILE_WORKER=0``, see
:mod:`codegen.options`) compiles in-process instead; so does a worker that cannot be started.

Protocol on the worker's stdin/stdout: an 8-byte little-endian length, then a pickle:
``(text, triple, cpu, features)`` in, ``("object", object bytes)`` or ``("error", message)``
out; ``text`` may be a list of modules, answered by ``("objects", [object bytes, ...])``.
:func:`compile_many` deals the parts of a module split per stage (:mod:`.jit`) out to
several workers, which compile them side by side. (The optimized IR is not sent back: printing a large module costs as much as
optimizing a small one, and a kernel shows it only when asked, by optimizing again.)

The worker runs this file as a script, importing nothing of te_grad (a light process); so
:func:`optimize`, the one optimization pipeline of the host kernels, lives here, and it
takes llvmlite's binding as an argument rather than importing it (``codegen/llvm.py``
stays the one module that imports llvmlite; the script imports it only when it runs alone).
"""
from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import Optional

#: modules a worker compiles before it is replaced (its memory only grows)
MAX_JOBS = 400

#: workers that compile the parts of one split module side by side (:func:`compile_many`)
MAX_WORKERS = 4


class _Slot:
    """One worker process and the lock of its pipe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.worker: Optional[subprocess.Popen] = None
        self.jobs = 0


_slots = [_Slot()]
_slots_lock = threading.Lock()


def _send(stream, obj):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def _receive(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the compile worker closed its output")
    (n,) = struct.unpack("<Q", head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("the compile worker's answer was cut short")
    return pickle.loads(data)


def _start() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)


def _stop(worker):
    try:
        worker.stdin.close()
        worker.wait(timeout=5)
    except Exception:  # noqa: BLE001 - a worker that will not stop is killed
        worker.kill()


def _ask(slot: _Slot, request, jobs: int):
    """The worker of ``slot``'s answer to ``request`` (started or replaced as needed), or None
    when no worker works."""
    with slot.lock:
        for attempt in range(2):
            try:
                if slot.worker is None or slot.worker.poll() is not None or slot.jobs >= MAX_JOBS:
                    if slot.worker is not None:
                        _stop(slot.worker)
                    slot.worker, slot.jobs = _start(), 0
                _send(slot.worker.stdin, request)
                answer = _receive(slot.worker.stdout)
                slot.jobs += jobs
            except (OSError, EOFError, pickle.UnpicklingError):
                if slot.worker is not None:
                    slot.worker.kill()
                slot.worker = None
                continue
            if answer[0] == "error":
                raise RuntimeError(answer[1])
            return answer[1]
    return None


def compile_remote(text: str, triple: str, cpu: str, features: str) -> Optional[bytes]:
    """The object file from the worker, or None when there is no working worker."""
    return _ask(_slots[0], (text, triple, cpu, features), 1)


def parallelism() -> int:
    """Workers :func:`compile_many` uses: the CPUs this process may run on, at most
    :data:`MAX_WORKERS`."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cpus))


def compile_many(texts, triple: str, cpu: str, features: str, workers: int = None) -> Optional[list]:
    """The object files of several modules, compiled by up to ``workers`` (default
    :func:`parallelism`) worker processes side by side, the modules dealt out by size (largest
    first, each to the least loaded worker); None when a worker cannot be had."""
    texts = list(texts)
    n = max(1, min(workers or parallelism(), len(texts)))
    with _slots_lock:
        while len(_slots) < n:
            _slots.append(_Slot())
    groups = [[] for _ in range(n)]
    loads = [0] * n
    for k in sorted(range(len(texts)), key=lambda k: -len(texts[k])):
        g = loads.index(min(loads))
        groups[g].append(k)
        loads[g] += len(texts[k])
    results = [None] * n
    errors = []

    def run(g):
        try:
            results[g] = _ask(_slots[g], ([texts[k] for k in groups[g]], triple, cpu, features), len(groups[g]))
        except RuntimeError as err:
            errors.append(err)
    threads = [threading.Thread(target=run, args=(g,)) for g in range(1, n)]
    for t in threads:
        t.start()
    run(0)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    if any(r is None for r in results):
        return None
    out = [None] * len(texts)
    for g, ks in enumerate(groups):
        for k, obj in zip(ks, results[g]):
            out[k] = obj
    return out


#: a module with a function that sets or reads more vector lanes one at a time (``insertelement``
#: and ``extractelement``) than this is optimized without the SLP vectorizer (see :func:`optimize`)
SLP_LANE_OPS = 3000


def lane_ops(text: str) -> int:
    """The most ``insertelement`` and ``extractelement`` instructions in one function of module
    ``text`` (SLP's cost grows with a function's, not with the module's)."""
    return max(f.count("= insertelement ") + f.count("= extractelement ") for f in text.split("\ndefine "))


def optimize(llvm, text: str, triple: str, machine, context=None):
    """The module ``text`` parsed and optimized at O3 for ``machine`` (llvmlite's ``binding`` is
    ``llvm``): loop and SLP vectorization on, full unrolling off (it multiplies code size, to
    megabytes of IR for a convolution's gradient, and compile time, for no measurable speed).
    SLP is off in a module with a function of more than :data:`SLP_LANE_OPS` single-lane operations: the
    stages that gather register blocks lane by lane (ResNet-18's convolution gradients on a
    run-time batch, some 8,000 of them in a function) spent 46 of their 48 s of compilation
    in it, and their vectors are already explicit.
    Raises RuntimeError if LLVM rejects the module. ``context``: an LLVM context of its own
    for the module (None: the global one)."""
    mod = llvm.parse_assembly(text) if context is None else llvm.parse_assembly(text, context=context)
    mod.triple = triple
    mod.data_layout = str(machine.target_data)
    mod.verify()
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = True
    tuning.slp_vectorization = lane_ops(text) <= SLP_LANE_OPS
    tuning.loop_interleaving = True
    tuning.loop_unrolling = False
    builder = llvm.create_pass_builder(machine, tuning)
    builder.getModulePassManager().run(mod, builder)
    return mod


def _serve():
    import signal
    # Ctrl-C in a terminal (or a notebook kernel's shutdown) reaches the whole process group:
    # the process that asked handles it, and this worker ends when its input closes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import llvmlite.binding as llvm  # this process is the worker: nothing else of codegen runs here
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machines = {}
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            text, triple, cpu, features = _receive(stdin)
        except EOFError:
            return
        try:
            key = (triple, cpu, features)
            if key not in machines:
                machines[key] = llvm.Target.from_triple(triple).create_target_machine(
                    cpu=cpu, features=features, opt=3, jit=True)
            if isinstance(text, list):  # several modules, one object each (compile_many)
                answer = ("objects", [machines[key].emit_object(optimize(llvm, t, triple, machines[key]))
                                      for t in text])
            else:
                answer = ("object", machines[key].emit_object(optimize(llvm, text, triple, machines[key])))
        except Exception as err:  # noqa: BLE001 - reported to the process that asked
            answer = ("error", f"{type(err).__name__}: {err}")
        _send(stdout, answer)


if __name__ == "__main__":
    _serve()
