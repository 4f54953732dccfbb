"""Compiled kernels: argument checking, buffers, threads and run-time errors."""
from __future__ import annotations

import ctypes
import functools
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from te_grad.errors import InternalError, UserError
from te_grad.graph import reads_in
from te_grad.ir import Expr, Tensor

from . import team_ir
from te_grad.argcheck import check_feed
from .jit import Pending
from .llvm_module import RUN_REGION, RUN_STAGES
from .regions import plan, row_blocks
from .loopir import Stage, program_text, ragged_loop_vars, stmt_reads, stmt_stores
from .options import current_options
from . import team as _team_module
from .team import team

#: the parallel range given to stages run whole (each clamps it to its own loop)
_WHOLE = team_ir.WHOLE
#: the key of a scratch set's address table
_TABLE = -1
#: the key of the sizes a scratch set's intermediates were allocated at (symbolic kernels)
_SIZES = -2
#: scratch sets a symbolic kernel keeps for other sizes than the current call's
_KEPT_SCRATCH = 4
#: the error record a run of stages fills in (tensor, dimension, index, stage)
_ERR = ctypes.c_int64 * 4


def _at_sizes(t: Tensor, sizes) -> Tensor:
    """Placeholder ``t`` with its shape at ``sizes`` (for checking an argument against it)."""
    from te_grad.sizes import concrete_shape, shape_is_concrete
    if shape_is_concrete(t.shape):
        return t
    return Tensor(t.name, concrete_shape(t.shape, sizes), t.dtype, t.op)


def default_threads() -> int:
    """``threads`` of the compile options in force (``TE_GRAD_NUM_THREADS`` if set), else the
    number of CPUs this process may use."""
    return current_options().resolved_threads()


def refuse_overlaps(inputs: Sequence[Tensor], in_arrays: Sequence[np.ndarray], outputs: Sequence[Tensor],
                    out_arrays: Sequence[np.ndarray]):
    """A ``UserError`` naming the first output array that shares memory with an input array
    or another output: a kernel reads and writes its buffers as distinct memory
    (``noalias``), and an overlap would give wrong values. ``np.may_share_memory`` (bounds
    only) first, the exact test only when it says maybe; names are formatted only to refuse."""
    for n, (t, a) in enumerate(zip(outputs, out_arrays)):
        for k, b in enumerate(list(in_arrays) + list(out_arrays[:n])):
            if isinstance(b, np.ndarray) and np.may_share_memory(a, b) and np.shares_memory(a, b):
                other = f"input {inputs[k].name}" if k < len(in_arrays) else f"output {outputs[k - len(in_arrays)].name}"
                raise UserError(f"out array for output {t.name} shares memory with the array of {other}; the "
                                "kernel needs distinct buffers (write into a fresh array, then copy)")


class CompiledStage:
    """A stage of a kernel: its loops and its innermost iterations."""

    def __init__(self, stage: Stage, work: int):
        self.stage = stage
        self.work = work


class Kernel:
    """A compiled graph: ``kernel(*inputs, out=None, **named)`` returns the outputs as numpy
    arrays (one array, or a tuple for several outputs).

    The call binds its arrays to the placeholders ``inputs`` (the order given to
    ``tg.build``) as Python binds arguments: positionally first, then keyword arguments by
    placeholder name (``kern(x, W=w)``, ``kern(W=w, X=x)``); every input exactly once. An
    unknown name, an input given twice (by position and by name), a missing one or a name
    shared by two inputs (pass those by position) is a ``UserError`` naming them; an input
    named ``out`` can only be given by position. Inputs are checked (shape and dtype
    exactly; non-contiguous arrays are copied). ``out`` may give C-contiguous, writeable
    arrays to write the outputs into (one array, or a sequence of one per output): out=
    must not overlap any input or other output (the stages are compiled for distinct
    buffers, ``noalias``); a ``UserError`` names the pair that does. Use fresh arrays and
    copy back to update an input in place.

    ``inputs`` and ``outputs`` are the placeholders and tensors in call order; ``loops`` is
    the C-like loop program, ``llvm_ir`` the optimized LLVM IR, ``asm`` the host assembly;
    :meth:`profile` times each stage; :meth:`export` writes the kernel as an object file and
    a C header (docs/EXPORT.md); :meth:`run` and :meth:`run_pointers` are the lean calls of
    the framework bridges. A bad index read from data (an embedding id out of range), or a
    read out of bounds under a condition on data, is a :class:`~te_grad.errors.UserError`
    naming the tensor and the value.
    """

    def __init__(self, outputs: Sequence[Tensor], inputs: Sequence[Tensor], buffers: Sequence[Tensor],
                 stages: Sequence[CompiledStage], regions: Sequence[Tuple[int, int]], compiled, threads: int,
                 size_vars: Sequence = ()):
        self.outputs = list(outputs)
        #: the size variables (``tg.var``) bound at each call from the arguments' shapes, in the
        #: order of :func:`te_grad.sizes.graph_size_vars` (that of an exported kernel's sizes)
        self.size_vars = tuple(size_vars)
        self._aliases = {}  # a cached build's own size variables -> the caller's of the same name
        self._bound: Dict[tuple, tuple] = {}  # input shapes -> (sizes, inputs at those sizes)
        self.inputs = list(inputs)
        self.buffers = list(buffers)
        self.stages = list(stages)
        self.regions = list(regions)  # runs of stages a thread can go through without waiting
        self.blocks = row_blocks([cs.stage for cs in self.stages], self.regions)  # rows per block, or 0
        self._compiled = compiled  # keeps the JIT engine (and so the machine code) alive
        self.threads = threads
        self._index = {id(t): n for n, t in enumerate(self.buffers)}
        self._input_slots = [self._index[id(t)] for t in self.inputs]
        self._output_slots = [self._index[id(t)] for t in self.outputs]
        self._plans: Dict[int, np.ndarray] = {}
        self._launch: Dict[object, tuple] = {}  # plan key -> (team, records, shared, bound call)
        given = {id(t) for t in self.inputs} | {id(t) for t in self.outputs}
        self._intermediates = [n for n, t in enumerate(self.buffers) if id(t) not in given]
        self._table_type = ctypes.c_void_p * len(self.buffers)  # the address table of a kernel without sizes
        #: no intermediates and the buffers are the inputs then the outputs: a call's table is its addresses
        self._ordered = not self._intermediates and not self.size_vars and \
            self._input_slots + self._output_slots == list(range(len(self.buffers)))
        self._n_in, self._n_out = len(self._input_slots), len(self._output_slots)
        self._scratch: List[Dict[int, np.ndarray]] = []
        self._lock = threading.Lock()
        self._run_stages = None
        if isinstance(compiled, Pending):  # the worker process is still compiling it
            self._pending = compiled
        else:
            self._pending = None
            self._take(compiled)

    def _take(self, compiled):
        self._compiled = compiled  # keeps the JIT engine (and so the machine code) alive
        self._stages_fn = compiled.addresses[RUN_STAGES]
        self._region_fn = compiled.addresses[RUN_REGION]
        self._run_stages = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)(self._stages_fn)

    def wait(self) -> "Kernel":
        """Wait until the machine code is there (a kernel built with ``wait=False`` gets it
        from the compile worker in the background; every call waits by itself)."""
        pending = self._pending
        if pending is not None:
            with self._lock:
                if self._pending is not None:
                    self._take(self._pending.result())
                    self._pending = None
        return self

    def plan(self, threads: Optional[int] = None, **options):
        """How a call runs on ``threads`` threads (default: the kernel's):
        :func:`codegen.regions.plan`'s runs of stages (``options`` are its own; its
        ``threshold`` defaults to the build's ``Thresholds.min_parallel_work``)."""
        options.setdefault("threshold", self._parallel_work())
        return plan([cs.stage for cs in self.stages], [cs.work for cs in self.stages], self.regions,
                    self.blocks, self.threads if threads is None else threads, **options)

    def _parallel_work(self) -> int:
        """The fewest iterations of a run shared among the threads: the build's threshold."""
        options = getattr(self, "options", None)
        return (options.thresholds if options is not None else current_options().thresholds).min_parallel_work

    def _stages_at(self, sizes):
        """``(stages, works)`` with the parallel extents and the innermost iterations of the
        stages whose extents are size expressions at ``sizes`` (a call's own plan)."""
        import dataclasses
        from te_grad.sizes import concrete_shape, value
        from .loopir import loops
        from .regions import split_extent
        from te_grad.ir import Const as _Const, ReduceAxis
        stages, works = [], []
        for cs in self.stages:
            s, w = cs.stage, cs.work
            if s.tensor.shape and any(isinstance(n, Expr) for n in s.tensor.shape):
                extent = split_extent(s)
                if extent is not None:
                    s = dataclasses.replace(s, parallel_extent=value(extent, sizes))
                inner = 1
                for lp in loops(s.body):
                    if isinstance(lp.var, ReduceAxis) and isinstance(lp.lo, _Const) and isinstance(lp.hi, _Const):
                        inner *= max(1, int(lp.hi.value) - int(lp.lo.value))
                w = int(np.prod(concrete_shape(s.tensor.shape, sizes))) * inner
            stages.append(s)
            works.append(w)
        return stages, works

    def _plan_records(self, sizes=None) -> np.ndarray:
        """The plan as the team's records (:mod:`.team_ir`), made once per thread count (and
        per sizes, for a kernel with size variables)."""
        key = self.threads if not sizes else (self.threads, tuple(sizes))
        records = self._plans.get(key)
        if records is None:
            if sizes:
                stages, works = self._stages_at(self._aliased(dict(zip(self.size_vars, sizes))))
                runs = plan(stages, works, self.regions, self.blocks, self.threads, self._parallel_work())
                if len(self._plans) > 64:
                    self._plans.clear()
            else:
                runs = self.plan()
            records = np.zeros((len(runs), team_ir.RECORD), dtype=np.int64)
            width = min(self.threads, team_ir.MAX_WIDTH)  # what the team's claim word holds
            for row, r in zip(records, runs):
                row[:team_ir.REC_GRANULE + 1] = (r.first, r.last, r.block, r.extent,
                                                 min(r.chunks, team_ir.MAX_CHUNKS), width, r.granule)
            self._plans[key] = records
        return records

    @property
    def loops(self) -> str:
        """The kernel as a C-like program: each stage's loop nest after scheduling (tiles,
        vector loops, parallel loops marked), as ``print(kernel.loops)`` shows it."""
        return program_text([s.stage for s in self.stages])

    @property
    def llvm_ir(self) -> str:
        """The optimized LLVM IR of the kernel (text)."""
        return self.wait()._compiled.optimized_ir

    @property
    def asm(self) -> str:
        """The host assembly of the kernel (text)."""
        return self.wait()._compiled.asm

    def __repr__(self):
        ins = ", ".join(t.name for t in self.inputs)
        outs = ", ".join(t.name for t in self.outputs)
        return f"Kernel(({ins}) -> ({outs}), {len(self.stages)} stages, {self.threads} threads)"

    # -- calling ----------------------------------------------------------------------------
    def __call__(self, *arrays, out=None, **named):
        arrays = self._bind(arrays, named)
        sizes, checked, outputs, values_key = None, self.inputs, None, None
        if self.size_vars:
            arrays = [a if isinstance(a, np.ndarray) else np.asarray(a) for a in arrays]
            key = tuple(a.shape for a in arrays) if out is None else None
            bound = self._bound.get(key) if key is not None else None
            if bound is None:  # the sizes, the inputs and outputs at those sizes, once per set of shapes
                got = self.bind_sizes(arrays, out)
                bound = (got, [_at_sizes(t, got) for t in self.inputs], [_at_sizes(t, got) for t in self.outputs],
                         self._size_values(got))
                if key is not None:
                    if len(self._bound) > 64:
                        self._bound.clear()
                    self._bound[key] = bound
            sizes, checked, outputs, values_key = bound
        values: List[Optional[np.ndarray]] = [None] * len(self.buffers)
        given = []
        for t, c, a in zip(self.inputs, checked, arrays):
            a = check_feed(c, a)
            given.append(a)
            values[self._index[id(t)]] = np.ascontiguousarray(a)
        outs = self._out_arrays(out, sizes, outputs)
        if out is not None:
            refuse_overlaps(self.inputs, given, self.outputs, outs)
        for t, a in zip(self.outputs, outs):
            if values[self._index[id(t)]] is None:
                values[self._index[id(t)]] = a
        scratch = self._take_scratch(sizes, values_key)
        try:
            self._run_all(values, scratch)
        finally:
            self._give_scratch(scratch)
        results = []
        for t, a in zip(self.outputs, outs):
            src = values[self._index[id(t)]]
            if src is not a:  # an output that is also an input or another output
                a[...] = src
            results.append(a)
        return results[0] if len(results) == 1 else tuple(results)

    def bind_sizes(self, arrays: Sequence, outs=None) -> Dict:
        """The values of :attr:`size_vars` stated by the shapes of ``arrays`` (one per input)
        and of the ``out=`` arrays when given (:func:`te_grad.sizes.bind_sizes`): a
        ``UserError`` names the variable and the two arguments that disagree, or the one that
        states no size."""
        from te_grad.sizes import bind_sizes, check_extents
        declared = [(t.name, t.shape, np.shape(a)) for t, a in zip(self.inputs, arrays)]
        if outs is not None:
            outs = [outs] if isinstance(outs, np.ndarray) else list(outs)
            declared += [(f"out={t.name}", t.shape, np.shape(a)) for t, a in zip(self.outputs, outs)
                         if isinstance(a, np.ndarray)]
        sizes = self._aliased(bind_sizes(declared))
        unbound = [v.name for v in self.size_vars if v not in sizes]
        if unbound:
            raise UserError(f"no argument's shape states the size(s) {', '.join(unbound)} of this kernel: "
                            "give the outputs with out=")
        for t in self.buffers:  # an extent that comes out negative: named, never a numpy error
            check_extents(t, sizes)
        return sizes

    def _aliased(self, sizes) -> Dict:
        """``sizes`` with the values of the cached graph's variables (:attr:`_aliases`) too."""
        if self._aliases:
            sizes = dict(sizes)
            for alias, v in self._aliases.items():
                if v in sizes:
                    sizes.setdefault(alias, sizes[v])
                elif alias in sizes:
                    sizes[v] = sizes[alias]
        return sizes

    def _size_values(self, sizes) -> Tuple[int, ...]:
        return tuple(int(sizes[v]) for v in self.size_vars)

    def _bind(self, arrays: tuple, named: dict) -> list:
        """One array per input, from positional and named arguments (see the class docstring)."""
        n = len(self.inputs)
        names = ", ".join(t.name for t in self.inputs)
        if len(arrays) > n or (not named and len(arrays) != n):
            raise UserError(f"kernel expects {n} arrays ({names}), got {len(arrays)}")
        if not named:
            return list(arrays)
        slots: Dict[str, List[int]] = {}
        for k, t in enumerate(self.inputs):
            slots.setdefault(t.name, []).append(k)
        unknown = [name for name in named if name not in slots]
        if unknown:
            raise UserError(f"kernel has no input named {', '.join(map(repr, unknown))}; its inputs are ({names})")
        shared = [name for name in named if len(slots[name]) > 1]
        if shared:
            raise UserError(f"kernel inputs {', '.join(map(repr, shared))} name more than one placeholder: "
                            "pass them by position")
        twice = [name for name in named if slots[name][0] < len(arrays)]
        if twice:
            raise UserError(f"kernel input(s) {', '.join(map(repr, twice))} given both by position and by name")
        bound = list(arrays) + [None] * (n - len(arrays))
        for name, a in named.items():
            bound[slots[name][0]] = a
        missing = [t.name for t, a in zip(self.inputs, bound) if a is None]
        if missing:
            raise UserError(f"kernel call is missing input(s) {', '.join(missing)} (expects {names})")
        return bound

    def run(self, arrays: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        """The lean call for framework bridges: ``arrays`` (one per input) and ``outs`` (one
        per output) must already be C-contiguous numpy arrays of exactly the right shapes
        and dtypes (the bridge checked them once, when it chose this kernel), and every
        output distinct from the inputs and the other outputs (an overlap is a
        ``UserError``). The results are written into ``outs``."""
        sizes = self._checked_sizes(arrays, outs)
        refuse_overlaps(self.inputs, arrays, self.outputs, outs)
        self.run_pointers([a.ctypes.data for a in arrays], [a.ctypes.data for a in outs], sizes=sizes)

    def _checked_sizes(self, arrays, outs):
        """The sizes of a call of :meth:`run` or :meth:`profile` (None for a fixed-shape
        kernel), bound from the shapes of its arrays, which must then be those the sizes give."""
        if not self.size_vars:
            return None
        sizes = self.bind_sizes(arrays, outs)
        for t, a in list(zip(self.inputs, arrays)) + list(zip(self.outputs, outs)):
            t = _at_sizes(t, sizes)
            if a.shape != t.shape or a.dtype != np.dtype(t.dtype) or not a.flags.c_contiguous:
                raise UserError(f"array for {t.name} must be a C-contiguous {t.dtype} array of shape "
                                f"{list(t.shape)}, got {a.dtype} {list(a.shape)}")
        return sizes

    def run_pointers(self, inputs: Sequence[int], outputs: Sequence[int], sizes=None) -> None:
        """:meth:`run` with the data addresses of the arrays (a framework tensor's
        ``data_ptr()``): the same contract, no numpy object in between. A kernel with size
        variables needs their values: ``sizes``, a dict from the variables (or their names)
        to ints, which the arrays must follow."""
        if self._ordered and len(inputs) == self._n_in and len(outputs) == self._n_out:  # the table: the addresses
            self._run_plan(self._table_type(*inputs, *outputs))
            return
        if len(inputs) != len(self._input_slots) or len(outputs) != len(self._output_slots):
            raise UserError(f"run_pointers needs {len(self._input_slots)} input and {len(self._output_slots)} "
                            f"output addresses, got {len(inputs)} and {len(outputs)}")
        if self.size_vars:
            from te_grad.sizes import named_sizes
            sizes = self._aliased(named_sizes(self.size_vars, sizes))
            missing = [v.name for v in self.size_vars if v not in sizes]
            if missing:
                raise UserError(f"run_pointers needs sizes= for {', '.join(missing)}")
        else:
            sizes = None
            if not self._intermediates:  # nothing of the kernel's own: a table of the call's addresses
                table = self._table_type()
                for n, p in zip(self._input_slots, inputs):
                    table[n] = p
                for n, p in zip(self._output_slots, outputs):
                    table[n] = p
                self._run_plan(table)
                return
        scratch = self._take_scratch(sizes)
        table = scratch[_TABLE]
        try:
            for n, p in zip(self._input_slots, inputs):
                table[n] = p
            for n, p in zip(self._output_slots, outputs):
                table[n] = p
            self._run_plan(table, sizes)
        finally:
            self._give_scratch(scratch)

    def export(self, path: str, target: str = "host", *, shared: bool = False, cpu: str = None,
               features: str = None, threads: int = 1, name: str = None, scalars: Sequence[Tensor] = ()):
        """Write the kernel as ``path.o`` and ``path.h`` (and ``path.so`` when ``shared``) for
        ``target`` (``"host"``, ``"aarch64-linux-gnu"``, ``"armv7-linux-gnueabihf"``,
        ``"riscv64-linux-gnu"`` or an LLVM triple), callable from C with no Python: see
        :mod:`codegen.export` and docs/EXPORT.md. The entry point is named after the file (other
        characters than letters, digits and ``_`` made ``_``), or ``name``, which must be a C
        identifier that is no C keyword, no reserved name and no name the header or the object
        already uses (a :class:`UserError` otherwise); the 0-d inputs in ``scalars`` are passed
        by value. Returns the file paths."""
        import os
        from .export import c_name, entry_for, export
        entry = entry_for(self, name if name is not None else c_name(os.path.basename(path)), scalars)
        return export([entry], path, target, cpu=cpu, features=features, shared=shared, threads=threads)

    def profile(self, arrays: Sequence[np.ndarray], outs: Sequence[np.ndarray], repeat: int = 5) -> List[dict]:
        """Each stage timed on its own (one thread; the median of ``repeat`` runs of the whole
        kernel), with the arguments of :meth:`run`: ``[{stage, tensor, ms, work}]`` in order."""
        import statistics
        import time
        sizes = self._checked_sizes(arrays, outs)
        refuse_overlaps(self.inputs, arrays, self.outputs, outs)
        samples = [[] for _ in self.stages]
        for _ in range(max(1, repeat)):
            scratch = self._take_scratch(sizes)
            table = scratch[_TABLE]
            try:
                for n, a in zip(self._input_slots, arrays):
                    table[n] = a.ctypes.data
                for n, a in zip(self._output_slots, outs):
                    table[n] = a.ctypes.data
                for k in range(len(self.stages)):
                    t0 = time.perf_counter()
                    self._check(self._run_range(table, k, k + 1, 0, _WHOLE), sizes)
                    samples[k].append(time.perf_counter() - t0)
            finally:
                self._give_scratch(scratch)
        return [dict(stage=f"{k}: {cs.stage.tensor.name}", tensor=cs.stage.tensor.name,
                     ms=statistics.median(v) * 1e3, work=cs.work)
                for k, (cs, v) in enumerate(zip(self.stages, samples))]

    def _take_scratch(self, sizes=None, key=None) -> Dict[int, np.ndarray]:
        """Buffers for the intermediates of one call: allocated once, kept by the kernel and
        reused (a set per concurrent call), so that calls do not fault in fresh pages. The
        set also holds its table of buffer addresses (:data:`_TABLE`), intermediates filled in,
        followed by the values of the sizes (a symbolic kernel's intermediates are allocated
        at the sizes of the call, :data:`_SIZES`, whose values ``key`` may give)."""
        if key is None:
            key = self._size_values(sizes) if self.size_vars else ()
        with self._lock:
            for k in range(len(self._scratch) - 1, -1, -1):
                if self._scratch[k][_SIZES] == key:
                    return self._scratch.pop(k)
        from te_grad.sizes import check_extents
        scratch = {n: np.empty(check_extents(t, sizes) if key else t.shape,  # new sizes: a negative extent named
                               dtype=np.bool_ if t.dtype == "bool" else t.dtype)
                   for n in self._intermediates for t in [self.buffers[n]]}
        if getattr(self, "options", None) is not None and self.options.poison:
            for a in scratch.values():  # a point no stage writes shows in the outputs
                a.fill(np.nan if a.dtype.kind == "f" else True if a.dtype == np.bool_ else np.iinfo(a.dtype).min)
        table = (ctypes.c_void_p * (len(self.buffers) + len(key)))()
        for n, a in scratch.items():
            table[n] = a.ctypes.data
        for k, v in enumerate(key):
            table[len(self.buffers) + k] = v
        scratch[_TABLE] = table
        scratch[_SIZES] = key
        return scratch

    def _give_scratch(self, scratch):
        with self._lock:
            self._scratch.append(scratch)
            if self.size_vars and len(self._scratch) > _KEPT_SCRATCH:
                del self._scratch[0]

    def _run_all(self, values, scratch):
        table = scratch[_TABLE]
        for n, a in enumerate(values):
            if a is not None:
                table[n] = a.ctypes.data
        self._run_plan(table, scratch[_SIZES])

    def _run_plan(self, table, sizes=None):
        if self._pending is not None:
            self.wait()
        if not sizes:
            key = self.threads
        else:
            if isinstance(sizes, dict):
                sizes = self._size_values(sizes)
            key = (self.threads, tuple(sizes))
        launch = self._launch.get(key)
        crew = launch[0] if launch is not None else None
        if crew is None or crew is not _team_module._team:  # new (or a forked child's team): bind the call once
            crew = team(self.threads)
            records = launch[1] if launch is not None else self._plan_records(sizes)
            if len(self._launch) > 64:
                self._launch.clear()
            # (team, the plan's records, whether a run is shared, the runtime's call with all but
            # the table and the error words bound)
            launch = self._launch[key] = (
                crew, records, bool((records[:, team_ir.REC_CHUNKS] > 0).any()),
                functools.partial(crew.run_plan, crew.address, records.ctypes.data, len(records),
                                  self._stages_fn, self._region_fn))
        if launch[2] and crew.sleepers:  # a plan run whole on the calling thread wakes nobody
            crew.wake()
        err = _ERR()
        rc = launch[3](table, err)
        if rc:
            self._check((rc, list(err)), sizes)

    def _out_arrays(self, out, sizes=None, outputs=None) -> List[np.ndarray]:
        if outputs is None:  # the outputs at ``sizes`` (given when already made for these sizes)
            outputs = self.outputs if sizes is None else [_at_sizes(t, sizes) for t in self.outputs]
        if out is None:
            return [np.empty(t.shape, dtype=t.dtype) for t in outputs]
        out = [out] if isinstance(out, np.ndarray) else list(out)
        if len(out) != len(self.outputs):
            raise UserError(f"out= must give {len(self.outputs)} arrays, got {len(out)}")
        for t, a in zip(outputs, out):
            if not isinstance(a, np.ndarray) or a.shape != t.shape or a.dtype != np.dtype(t.dtype):
                raise UserError(f"out array for {t.name} must be a numpy array of shape {list(t.shape)} "
                                f"and dtype {t.dtype}, got {getattr(a, 'shape', a)!r} "
                                f"{getattr(a, 'dtype', '')}")
            if not a.flags.c_contiguous or not a.flags.writeable:
                raise UserError(f"out array for {t.name} must be C-contiguous and writeable")
        return out

    def _run_range(self, table, first: int, last: int, lo: int, hi: int):
        self.wait()
        err = (ctypes.c_int64 * 4)()
        rc = self._run_stages(table, first, last, lo, hi, ctypes.addressof(err))
        return (0, None) if rc == 0 else (rc, list(err))

    def _indexed_by_data(self, stage: Stage, buffer: int) -> bool:
        """True if ``stage`` reads buffer number ``buffer`` at an index computed from data, or
        scatters into it."""
        def mine(t):
            return self._index.get(id(t)) == buffer
        return any(mine(r.tensor) and any(reads_in(i) for i in r.indices) for r in stmt_reads(stage.body)) or \
            any(st.checked and mine(st.tensor) for st in stmt_stores(stage.body))

    def _check(self, result, sizes=None):
        """Raise the error a run of stages returned, if any (``err[3]`` is the failing stage)."""
        rc, err = result
        if rc == 0:
            return
        if sizes and not isinstance(sizes, dict):  # the values, in the order of size_vars
            sizes = self._aliased(dict(zip(self.size_vars, sizes)))
        stage = self.stages[err[3]].stage.tensor.name
        tensor = self.buffers[err[0]] if 0 <= err[0] < len(self.buffers) else None
        name = tensor.name if tensor is not None else "?"
        if rc == 1:
            why = "a data-dependent index" if self._indexed_by_data(self.stages[err[3]].stage, err[0]) else \
                "a read under a condition on the data or with a non-affine index"
            extent = tensor.shape[err[1]]
            if sizes:
                from te_grad.sizes import value
                extent = value(extent, sizes)
            raise UserError(f"index {err[2]} is out of range [0, {extent}) for "
                            f"dimension {err[1]} of tensor {name} ({why}, while computing {stage})")
        if rc == 2:
            raise UserError(f"integer division by zero while computing {name}")
        if rc == 4:
            ragged = ragged_loop_vars(self.stages[err[3]].stage.body)
            loop = f"ragged loop {ragged[err[2]].name}" if 0 <= err[2] < len(ragged) else "a ragged loop"
            raise UserError(f"the {loop} runs backwards from {err[0]} to {err[1]} while computing {stage}: "
                            "the bounds of a loop read from data must not decrease (is the row pointer "
                            "sorted?)")
        raise InternalError(f"stage {stage} returned code {rc}")
