"""CPython's cyclic garbage collector during a build: young generations only.

A build (a gradient, its simplification, scheduling, LLVM IR emission, an import
through ``torch.export``) allocates hundreds of thousands of objects, and enough of
them live long enough that CPython's collector keeps starting *full* (generation 2)
collections, each of which walks every object in the process. In a process that
has imported PyTorch one full collection takes about 0.2 s; the 2-layer encoder of
``benchmarks/build_time.py`` paid six, about a sixth of its cold build.

Inside :func:`young_only` the full collections wait: generation 2's threshold is
raised out of reach, while generations 0 and 1 are collected as before (they free
the build's short-lived cycles: llvmlite's instructions, blocks and functions point
at each other, and a stage's module is garbage once its text is taken). When the
outermost such block ends, the thresholds the process had are put back, so the
deferred full collection runs at its usual trigger. Nothing else changes: no object
is frozen or kept; a process that disabled the collector (``gc.disable()`` or a
threshold of 0) keeps it disabled, and thresholds set while a build runs are kept
(the pause's are put back only if they are still in force); nested or concurrent
builds share one pause (a depth counter under a lock), and a build starting when the
pause is :data:`MAX_PAUSE_S` old first lets one full collection run, so builds that
overlap for hours cannot hold full collections off for good. The thresholds are a
hint: a CPython whose collector has no generation 2 threshold just collects as usual.
This module imports nothing of te_grad.
"""
from __future__ import annotations

import functools
import gc
import threading
import time
from contextlib import contextmanager

#: generation 2's threshold inside a build: never reached
PAUSED = 1 << 30
#: a pause this old lets one full collection through when another build starts (so overlapping
#: builds, as in a server that keeps building, cannot hold full collections off for good)
MAX_PAUSE_S = 30.0

_lock = threading.Lock()
_depth = 0
_saved = None      # the thresholds the process had, while a pause is installed
_installed = None  # the thresholds the pause set (None: the collector was off, nothing set)
_since = 0.0


@contextmanager
def young_only():
    """Collect only the young generations until the outermost block ends."""
    global _depth, _saved, _installed, _since
    collect = False
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            _installed = None
            if _saved[0] > 0:  # a threshold of 0 is a collector switched off: left alone
                _installed = (_saved[0], _saved[1], max(_saved[2], PAUSED))
                gc.set_threshold(*_installed)
            _since = time.monotonic()
        elif _installed is not None and time.monotonic() - _since > MAX_PAUSE_S:
            collect, _since = True, time.monotonic()
        _depth += 1
    try:
        if collect:
            gc.collect()
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                # the thresholds come back unless someone set others meanwhile (theirs stay)
                if _installed is not None and gc.get_threshold() == _installed:
                    gc.set_threshold(*_saved)
                _saved = _installed = None


def during_build(fn):
    """Decorate an entry point of heavy build work so that it runs in :func:`young_only`."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with young_only():
            return fn(*args, **kwargs)
    return wrapper
