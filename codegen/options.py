"""Compile options: one object for every setting of a build, scoped like a pass context.

:class:`CompileOptions` holds what a build is made with: what changes the code (the machine
the loops are sized for, ``fast_math``, the packing :class:`Thresholds`, the schedule passes
switched off) and how the library runs (threads, verification, the caches, the compile
worker, how long idle threads spin). It is frozen: :meth:`CompileOptions.replace` gives a
changed copy.

The options in force are :func:`current_options`: those of the innermost
``with compile_options(**changes):`` block of this thread or task (a context variable,
like TVM's ``with PassContext(...)``), else :meth:`CompileOptions.from_env`, the one
place that reads te_grad's environment variables (they only give the defaults).
``codegen.build(..., options=CompileOptions(...), fast_math=False)`` builds with
``options`` (default: the options in force), its keywords overriding fields, and runs the
whole build inside them: everything below reads the options passed down or
:func:`current_options`, never the environment.

Options that change the code (``machine``, ``fast_math``, ``thresholds``,
``disabled_passes``) are part of a build's disk-cache key; the compiled-module caches are
keyed by the module's text, which they change. :func:`codegen.schedule.bisect` names the
schedule pass behind a wrong kernel by building with passes switched off.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import numbers
import os
from dataclasses import dataclass, field
from typing import FrozenSet, Iterable, Optional

from te_grad.errors import UserError

from .machine import Machine


@dataclass(frozen=True)
class Thresholds:
    """When a packing copy, a cache tile, a jam or a thread split pays (speed only: every one
    is exact whatever its size)."""
    #: rows (output elements not indexing the operand) each element of a transposed copy must serve
    min_reuse: int = 16
    #: the shortest reduction worth a transposed copy
    min_reduction: int = 16
    #: the fewest multiply-adds of a contraction worth a copy
    min_work: int = 1 << 16
    #: multiply-adds per element of a padded or split copy below which it is not made
    min_padded_reuse: int = 16
    #: how much larger than the operand a padded copy may be
    max_padded_growth: float = 2.0
    #: the fewest iterations of the constant reduce loops inside a reduce loop of run-time extent
    #: that cache tiling takes one value at a time (the accumulators are loaded and stored once
    #: per value)
    min_tile_steps: int = 16
    #: a contraction operand read along the lanes is copied in panels (:mod:`codegen.packing`)
    #: when a step of its reduction moves at least this many bytes, or when the part of it a
    #: row of blocks walks spans at least ``min_panel_bytes``
    min_panel_stride: int = 2048
    min_panel_bytes: int = 1 << 18
    #: the fewest whole blocks of the split axis a register block jammed along it leaves for the
    #: threads (:mod:`codegen.register_blocking`)
    min_split_blocks: int = 8
    #: the fewest innermost iterations of a run of stages shared among the threads (smaller
    #: runs stay on the calling thread: the team's hand-off, a few atomic operations and
    #: waiting for the slowest chunk, costs more than splitting saves); :func:`codegen.regions.plan`
    min_parallel_work: int = 32_768


def _flag(text: Optional[str], default: bool) -> bool:
    if text is None:
        return default
    return text.strip().lower() not in ("0", "", "false", "no")


@dataclass(frozen=True)
class CompileOptions:
    """Everything a build is made with (see the module docstring). Fields:

    - ``machine``: the :class:`~codegen.machine.Machine` the loops are sized for (None: this
      machine, :func:`codegen.machine.host_machine`);
    - ``fast_math``: reductions may reassociate (so they vectorize), products and sums
      contract into fused multiply-adds;
    - ``threads``: the threads a kernel runs on (None: ``TE_GRAD_NUM_THREADS``, else the CPUs
      this process may use);
    - ``thresholds``: when the packing copies, some cache tiles and jams are made, and when a
      run of stages is split among threads (:class:`Thresholds`);
    - ``disabled_passes``: names of schedule passes to skip (``codegen.schedule.PASSES``;
      each returns its input unchanged; a pass needed for correct code cannot be skipped);
    - ``verify``: run the IR verifier between the stages (:mod:`te_grad.verify`);
    - ``jit_cache``: compiled modules kept in this process for reuse;
    - ``compile_worker``: optimize and compile modules in a worker process;
    - ``spin_us``: microseconds an idle worker thread polls for work before it sleeps;
    - ``disk_cache``: use the persistent kernel cache (:mod:`codegen.disk_cache`);
    - ``cache_dir``: its directory (None: ``$XDG_CACHE_HOME/te_grad``, else ``~/.cache/te_grad``);
    - ``poison``: fill a kernel's intermediate buffers with NaN (integers with their most negative
      value, bools with True) when they are allocated, so that a read of a point no stage wrote
      shows in the outputs (a tensor is written only where it is used, :mod:`simplify.unread`;
      the tests and the fuzzer build with it; it changes no code).
    """
    machine: Optional[Machine] = None
    fast_math: bool = True
    threads: Optional[int] = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    disabled_passes: FrozenSet[str] = frozenset()
    verify: bool = False
    jit_cache: int = 64
    compile_worker: bool = True
    spin_us: float = 2000.0
    disk_cache: bool = True
    cache_dir: Optional[str] = None
    poison: bool = False

    def __post_init__(self):
        if self.machine is not None and not isinstance(self.machine, Machine):
            raise UserError(f"compile options: machine must be a codegen.machine.Machine, got {self.machine!r}")
        if self.threads is not None:
            t = self.threads
            if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 1:
                raise UserError(f"compile options: threads must be a positive int, got {t!r}")
            object.__setattr__(self, "threads", int(t))
        if not isinstance(self.thresholds, Thresholds):
            raise UserError(f"compile options: thresholds must be a codegen.options.Thresholds, "
                            f"got {self.thresholds!r}")
        passes = self.disabled_passes
        if isinstance(passes, str) or not isinstance(passes, Iterable) or \
                not all(isinstance(p, str) for p in passes):
            raise UserError(f"compile options: disabled_passes must be a set of pass names, got {passes!r}")
        object.__setattr__(self, "disabled_passes", frozenset(passes))
        for name in ("fast_math", "verify", "compile_worker", "disk_cache", "poison"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"compile options: {name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.jit_cache, bool) or not isinstance(self.jit_cache, numbers.Integral) or \
                self.jit_cache < 0:
            raise UserError(f"compile options: jit_cache must be an int >= 0, got {self.jit_cache!r}")
        if isinstance(self.spin_us, bool) or not isinstance(self.spin_us, numbers.Real) or not self.spin_us >= 0:
            raise UserError(f"compile options: spin_us must be a number >= 0, got {self.spin_us!r}")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise UserError(f"compile options: cache_dir must be a path, got {self.cache_dir!r}")

    @staticmethod
    def from_env() -> "CompileOptions":
        """The defaults, from the environment: the one place te_grad reads its variables.

        - ``TE_GRAD_NUM_THREADS``: ``threads`` (a whole number; unset: the CPUs);
        - ``TE_GRAD_VERIFY=1``: ``verify`` (read by :func:`te_grad.checking.environment_default`,
          below the compiler, for ``tg.differentiate`` and ``tg.simplify`` outside a build);
        - ``TE_GRAD_JIT_CACHE``: ``jit_cache`` (default 64);
        - ``TE_GRAD_COMPILE_WORKER=0``: ``compile_worker`` off;
        - ``TE_GRAD_SPIN_US``: ``spin_us`` (default 2000);
        - ``TE_GRAD_CACHE=0``: ``disk_cache`` off;
        - ``TE_GRAD_CACHE_DIR``: ``cache_dir``.

        ``machine``, ``fast_math``, ``thresholds`` and ``disabled_passes`` have no variable.
        A malformed number keeps the default, but for ``TE_GRAD_NUM_THREADS`` (a UserError).
        """
        env = _environment()
        cached = _from_env_cache.get(env)
        if cached is None:
            cached = _parse_env(dict(zip(VARIABLES, env)))
            _from_env_cache.clear()
            _from_env_cache[env] = cached
        return cached

    def replace(self, **changes) -> "CompileOptions":
        """A copy with ``changes`` (field names) applied; an unknown name is a UserError."""
        unknown = sorted(set(changes) - set(FIELDS))
        if unknown:
            raise UserError(f"unknown compile option(s) {', '.join(unknown)}; the options are "
                            f"{', '.join(FIELDS)}")
        return dataclasses.replace(self, **changes)

    def resolved_machine(self) -> Machine:
        """``machine``, or this machine's when it is None."""
        if self.machine is not None:
            return self.machine
        from .machine import host_machine
        return host_machine()

    def resolved_threads(self) -> int:
        """``threads``, or the CPUs this process may use when it is None."""
        if self.threads is not None:
            return self.threads
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def resolved_cache_dir(self) -> str:
        """``cache_dir``, or the standard place: ``$XDG_CACHE_HOME/te_grad``, else
        ``~/.cache/te_grad``."""
        if self.cache_dir:
            return os.fspath(self.cache_dir)
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "te_grad")

    def code_key(self) -> str:
        """The options that change the generated code, as text (part of a build's cache key)."""
        return (f"fast_math={self.fast_math};{self.resolved_machine()!r};{self.thresholds!r}"
                + (f";disabled={sorted(self.disabled_passes)}" if self.disabled_passes else ""))


#: the field names of :class:`CompileOptions`
FIELDS = tuple(f.name for f in dataclasses.fields(CompileOptions))
#: the environment variables :meth:`CompileOptions.from_env` reads
VARIABLES = ("TE_GRAD_NUM_THREADS", "TE_GRAD_VERIFY", "TE_GRAD_JIT_CACHE", "TE_GRAD_COMPILE_WORKER",
             "TE_GRAD_SPIN_US", "TE_GRAD_CACHE", "TE_GRAD_CACHE_DIR")
_from_env_cache: dict = {}


def _environment():
    return tuple(os.environ.get(name) for name in VARIABLES)


def _parse_env(values: dict) -> CompileOptions:
    from te_grad.checking import verify_flag
    out = {}
    threads = values.get("TE_GRAD_NUM_THREADS")
    if threads:
        try:
            out["threads"] = max(1, int(threads))
        except ValueError:
            raise UserError(f"TE_GRAD_NUM_THREADS must be a whole number of threads, got {threads!r}") from None
    out["verify"] = verify_flag(values.get("TE_GRAD_VERIFY"))  # the value read with the others
    try:
        out["jit_cache"] = max(0, int(values.get("TE_GRAD_JIT_CACHE") or "64"))
    except ValueError:
        pass
    out["compile_worker"] = _flag(values.get("TE_GRAD_COMPILE_WORKER"), True)
    try:
        out["spin_us"] = max(0.0, float(values.get("TE_GRAD_SPIN_US") or "2000"))
    except ValueError:
        pass
    out["disk_cache"] = _flag(values.get("TE_GRAD_CACHE"), True)
    out["cache_dir"] = values.get("TE_GRAD_CACHE_DIR") or None
    return CompileOptions(**out)


_CURRENT: "contextvars.ContextVar[Optional[CompileOptions]]" = contextvars.ContextVar(
    "te_grad_compile_options", default=None)


def current_options() -> CompileOptions:
    """The options in force: the innermost :func:`compile_options` (or :func:`using`) block's,
    else :meth:`CompileOptions.from_env`."""
    got = _CURRENT.get()
    return got if got is not None else CompileOptions.from_env()


@contextlib.contextmanager
def using(options: CompileOptions):
    """Make ``options`` the options in force inside the ``with`` block (verification included)."""
    if not isinstance(options, CompileOptions):
        raise UserError(f"expected codegen.options.CompileOptions, got {options!r}")
    from te_grad.checking import checking
    token = _CURRENT.set(options)
    vtoken = checking.set(options.verify)
    try:
        yield options
    finally:
        checking.reset(vtoken)
        _CURRENT.reset(token)


@contextlib.contextmanager
def compile_options(**changes):
    """``with compile_options(fast_math=False, disabled_passes={"register_blocking"}):``:
    the options in force, changed, inside the block (nested blocks change the outer's)."""
    with using(current_options().replace(**changes)) as options:
        yield options
