"""Compiled kernels: argument checking, buffers, threads and run-time errors."""
from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from te_grad.errors import InternalError, UserError
from te_grad.evaluator import check_feed
from te_grad.ir import Tensor

from .llvm_emit import RUN_STAGES
from .loopir import Stage, program_text

#: below this many innermost iterations a stage runs on one thread: handing work to
#: another thread costs about 20 µs, more than splitting saves on smaller stages
PARALLEL_THRESHOLD = 200_000

_pools: Dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    pool = _pools.get(threads)
    if pool is None:
        pool = _pools[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="te_grad")
    return pool


def default_threads() -> int:
    """``TE_GRAD_NUM_THREADS`` if set, else the number of CPUs this process may use."""
    env = os.environ.get("TE_GRAD_NUM_THREADS")
    if env:
        return max(1, int(env))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class CompiledStage:
    def __init__(self, stage: Stage, address: int, buffers: List[int], work: int):
        self.stage = stage
        self.buffers = buffers  # indices into the kernel's buffer list, in argument order
        self.work = work
        argtypes = [ctypes.c_void_p] * len(buffers) + [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        self.fn = ctypes.CFUNCTYPE(ctypes.c_int32, *argtypes)(address)


class Kernel:
    """A compiled graph: ``kernel(*inputs, out=None)`` returns the outputs as numpy arrays.

    Inputs are checked (shape and dtype exactly; non-contiguous arrays are
    copied); ``out`` may give C-contiguous arrays to write the outputs into.
    ``loops`` is the C-like loop program, ``llvm_ir`` the optimized LLVM IR,
    ``asm`` the host assembly.
    """

    def __init__(self, outputs: Sequence[Tensor], inputs: Sequence[Tensor], buffers: Sequence[Tensor],
                 stages: Sequence[CompiledStage], compiled, threads: int):
        self.outputs = list(outputs)
        self.inputs = list(inputs)
        self.buffers = list(buffers)
        self.stages = list(stages)
        self._compiled = compiled  # keeps the JIT engine (and so the machine code) alive
        self.threads = threads
        self._index = {id(t): n for n, t in enumerate(self.buffers)}
        self._plans: Dict[int, List[Tuple[int, int, bool]]] = {}
        run_stages = compiled.addresses[RUN_STAGES]
        self._run_stages = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                            ctypes.c_void_p)(run_stages)

    def _plan(self) -> List[Tuple[int, int, bool]]:
        """Runs of stages ``(first, last, shared)``: a shared stage is split among threads; runs
        of the others go to native code in one call."""
        cached = self._plans.get(self.threads)
        if cached is not None:
            return cached
        runs: List[Tuple[int, int, bool]] = []
        for k, cs in enumerate(self.stages):
            shared = self.threads > 1 and cs.work >= PARALLEL_THRESHOLD and cs.stage.parallel_extent > 1
            if runs and not shared and not runs[-1][2]:
                runs[-1] = (runs[-1][0], k + 1, False)
            else:
                runs.append((k, k + 1, shared))
        self._plans[self.threads] = runs
        return runs

    # -- inspection ---------------------------------------------------------------------
    @property
    def loops(self) -> str:
        return program_text([s.stage for s in self.stages])

    @property
    def llvm_ir(self) -> str:
        return self._compiled.optimized_ir

    @property
    def asm(self) -> str:
        return self._compiled.asm

    def _repr_html_(self):
        from te_grad.display import kernel_html
        return kernel_html(self)

    def __repr__(self):
        ins = ", ".join(t.name for t in self.inputs)
        outs = ", ".join(t.name for t in self.outputs)
        return f"Kernel(({ins}) -> ({outs}), {len(self.stages)} stages, {self.threads} threads)"

    # -- calling ----------------------------------------------------------------------------
    def __call__(self, *arrays, out=None):
        if len(arrays) != len(self.inputs):
            names = ", ".join(t.name for t in self.inputs)
            raise UserError(f"kernel expects {len(self.inputs)} arrays ({names}), got {len(arrays)}")
        values: List[Optional[np.ndarray]] = [None] * len(self.buffers)
        for t, a in zip(self.inputs, arrays):
            values[self._index[id(t)]] = np.ascontiguousarray(check_feed(t, a))
        outs = self._out_arrays(out)
        for t, a in zip(self.outputs, outs):
            if values[self._index[id(t)]] is None:
                values[self._index[id(t)]] = a
        for n, t in enumerate(self.buffers):
            if values[n] is None:
                values[n] = np.empty(t.shape, dtype=np.bool_ if t.dtype == "bool" else t.dtype)
        pointers = [a.ctypes.data for a in values]
        table = None
        for first, last, shared in self._plan():
            if shared:
                self._run(self.stages[first], pointers)
                continue
            if table is None:
                table = (ctypes.c_void_p * len(pointers))(*pointers)
            err = (ctypes.c_int64 * 4)()
            rc = self._run_stages(table, first, last, ctypes.addressof(err))
            if rc:
                self._check(self.stages[err[3]], [(rc, list(err))])
        results = []
        for t, a in zip(self.outputs, outs):
            src = values[self._index[id(t)]]
            if src is not a:  # an output that is also an input or another output
                a[...] = src
            results.append(a)
        return results[0] if len(results) == 1 else tuple(results)

    def _out_arrays(self, out) -> List[np.ndarray]:
        if out is None:
            return [np.empty(t.shape, dtype=t.dtype) for t in self.outputs]
        out = [out] if isinstance(out, np.ndarray) else list(out)
        if len(out) != len(self.outputs):
            raise UserError(f"out= must give {len(self.outputs)} arrays, got {len(out)}")
        for t, a in zip(self.outputs, out):
            if not isinstance(a, np.ndarray) or a.shape != t.shape or a.dtype != np.dtype(t.dtype):
                raise UserError(f"out array for {t.name} must be a numpy array of shape {list(t.shape)} "
                                f"and dtype {t.dtype}, got {getattr(a, 'shape', a)!r} "
                                f"{getattr(a, 'dtype', '')}")
            if not a.flags.c_contiguous or not a.flags.writeable:
                raise UserError(f"out array for {t.name} must be C-contiguous and writeable")
        return out

    def _run(self, cs: CompiledStage, pointers):
        """One stage split among the threads."""
        args = [pointers[b] for b in cs.buffers]
        extent = cs.stage.parallel_extent
        threads = min(self.threads, extent)
        bounds = [extent * k // threads for k in range(threads + 1)]
        chunks = [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]
        # the calling thread takes the last chunk itself: one hand-off fewer
        futures = [_pool(self.threads).submit(self._call, cs, args, lo, hi) for lo, hi in chunks[:-1]]
        mine = self._call(cs, args, *chunks[-1])
        self._check(cs, [f.result() for f in futures] + [mine])

    @staticmethod
    def _call(cs: CompiledStage, args, lo: int, hi: int):
        err = (ctypes.c_int64 * 4)()
        rc = cs.fn(*args, lo, hi, ctypes.addressof(err))
        return rc, list(err)

    def _check(self, cs: CompiledStage, results):
        for rc, err in results:
            if rc == 0:
                continue
            tensor = self.buffers[err[0]] if 0 <= err[0] < len(self.buffers) else None
            name = tensor.name if tensor is not None else "?"
            if rc == 1:
                raise UserError(f"index {err[2]} is out of range [0, {tensor.shape[err[1]]}) for "
                                f"dimension {err[1]} of tensor {name} (a data-dependent index, "
                                f"while computing {cs.stage.tensor.name})")
            if rc == 2:
                raise UserError(f"integer division by zero while computing {name}")
            raise InternalError(f"stage {cs.stage.tensor.name} returned code {rc}")
