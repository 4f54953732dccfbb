"""The thread team: worker threads that run kernels' parallel regions in native code.

One team per process, shared by every kernel. Its workers are Python threads
that spend their life inside the native worker loop (:mod:`.team_ir`, the GIL
released): after a job they keep polling for the next one for
:func:`spin_seconds` (the compile option ``spin_us``: ``TE_GRAD_SPIN_US``, default
2000 µs), yielding their core after the first 50 µs, so that kernels called back to back (a training loop, a
model of many small stages) hand work over in a few atomic operations instead of
waking a thread. A worker idle for longer returns to Python and sleeps on an
event until the next kernel call wakes it; that call does not wait for it (the
calling thread claims the chunks nobody else has).

The team is created on the first call of a kernel with more than one thread, and
grows to the largest thread count asked for. A process forked from this one starts
without a team (its threads are not inherited); at exit the workers are stopped
and joined.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import threading
import time
from typing import List, Optional

import numpy as np

from . import team_ir
from .jit import compile_module, host_target
from .options import current_options

_lock = threading.Lock()
_team: Optional["Team"] = None


def spin_seconds() -> float:
    """How long an idle worker polls for work before it sleeps (``spin_us`` of the compile
    options in force: ``TE_GRAD_SPIN_US``)."""
    return current_options().spin_us * 1e-6


class Team:
    """Worker threads and the native runtime they run (see the module docstring)."""

    def __init__(self):
        text = team_ir.runtime_module(host_target().triple, time.CLOCK_MONOTONIC)
        self._compiled = compile_module(text, [team_ir.WORK, team_ir.RUN])
        raw = np.zeros(team_ir.WORDS + 8, dtype=np.int64)
        skip = (-raw.ctypes.data % 64) // 8  # the fields sit on 64-byte cache lines
        self._raw = raw
        self.words = raw[skip:skip + team_ir.WORDS]
        self.address = self.words.ctypes.data
        self._work = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                      ctypes.c_int64)(self._compiled.addresses[team_ir.WORK])
        #: ``run_plan(team, plan, records, run_stages, run_region, table, err) -> code``
        self.run_plan = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_void_p)(self._compiled.addresses[team_ir.RUN])
        self._spin_ns = int(spin_seconds() * 1e9)
        self._threads: List[threading.Thread] = []
        self._events: List[threading.Event] = []
        self._asleep: List[bool] = []
        self.sleepers = 0  # workers sleeping in Python; read without the lock (a hint)
        self._guard = threading.Lock()

    @property
    def workers(self) -> int:
        return len(self._threads)

    @property
    def worker_chunks(self) -> int:
        """Chunks of shared runs that workers (not the calling threads) have run."""
        return int(self.words[team_ir.WORKER_CHUNKS])

    def reserve(self, threads: int) -> None:
        """Make sure the team has ``threads - 1`` workers (the caller is the other one)."""
        if threads - 1 <= len(self._threads):
            return
        with self._guard:
            while len(self._threads) < min(threads - 1, team_ir.MAX_WIDTH - 1):
                tid = len(self._threads) + 1
                self._events.append(threading.Event())
                self._asleep.append(False)
                t = threading.Thread(target=self._main, args=(tid,), name=f"te_grad-{tid}", daemon=True)
                self._threads.append(t)
                t.start()

    def wake(self) -> None:
        """Wake the workers sleeping in Python (they join the next job when they arrive)."""
        with self._guard:
            for k, asleep in enumerate(self._asleep):
                if asleep:
                    self._asleep[k] = False
                    self.sleepers -= 1
                    self._events[k].set()

    def _main(self, tid: int):
        seen = int(self.words[team_ir.GEN])
        event = self._events[tid - 1]
        while True:
            seen = self._work(self.address, tid, seen, self._spin_ns)
            if seen < 0:
                return
            with self._guard:
                if self.words[team_ir.STOP]:
                    return
                self._asleep[tid - 1] = True
                self.sleepers += 1
            event.wait()
            event.clear()
            if self.words[team_ir.STOP]:
                return

    def stop(self) -> None:
        """Stop and join the workers (at exit)."""
        self.words[team_ir.STOP] = 1
        for e in self._events:
            e.set()
        for t in self._threads:
            t.join(timeout=1.0)


def team(threads: int) -> Team:
    """The process's team, with at least ``threads - 1`` workers."""
    global _team
    t = _team
    if t is None:
        with _lock:
            if _team is None:
                _team = Team()
            t = _team
    t.reserve(threads)
    return t


def _forget_in_child():
    global _team, _lock
    _team = None
    _lock = threading.Lock()


@atexit.register
def _stop_at_exit():
    if _team is not None:
        _team.stop()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
