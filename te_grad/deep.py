"""Deep expressions: every stage handles expressions up to :data:`te_grad.ir.MAX_DEPTH` deep.

The IR's own bookkeeping never recurses (hashes, depths and dtypes are computed
when a node is built; structural equality, reads and free variables use explicit
stacks), but the passes over expressions (printing, evaluation, simplification,
lowering) are recursive walkers, one Python frame or a few per level. Public
entry points are wrapped in :func:`deep_entry`: when the graph they receive is
deeper than :data:`SHALLOW`, the call runs on a thread of its own with a large
stack and a recursion limit sized to the depth, and returns (or raises) exactly
what it would have. Shallow graphs, nearly all of them, run directly.

Deep *graphs* (chains of thousands of compute stages, unrolled recurrences) need no
such thread: every walk over tensors is iterative (topological order, explicit stacks),
and no pass builds an expression whose depth grows with the number of stages (the
adjoint of a tensor read by every stage sums its contributions as a balanced tree,
:func:`te_grad.transform.sum_terms`). tests/core/test_deep_graphs.py runs 10,000 stages.
"""
from __future__ import annotations

import functools
import sys
import threading
from typing import Iterable

from .ir import Expr, Tensor

#: graphs up to this depth run on the calling thread
SHALLOW = 150
#: the stack of the thread that runs a deep call (virtual memory: only what is used is committed)
STACK_BYTES = 1 << 30
#: Python frames allowed per level of expression depth
FRAMES_PER_LEVEL = 24

_state = threading.local()
_lock = threading.Lock()


def graph_depth(items) -> int:
    """The depth of the deepest expression among ``items`` (tensors, expressions, lists of
    them) and the graphs behind them."""
    from .graph import topo_order
    tensors, exprs = [], []
    stack = [items]
    while stack:
        x = stack.pop()
        if isinstance(x, Tensor):
            tensors.append(x)
        elif isinstance(x, Expr):
            exprs.append(x)
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    depth = max((e.depth for e in exprs), default=0)
    for t in topo_order(tensors) if tensors else ():
        for part in _op_parts(t.op):
            depth = max(depth, part.depth)
    return depth


def _op_parts(op) -> Iterable[Expr]:
    for name in ("body", "value", "where"):
        part = getattr(op, name, None)
        if isinstance(part, Expr):
            yield part
    for part in getattr(op, "indices", ()) or ():
        yield part


def run_deep(depth: int, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, on a thread with room for walkers ``depth`` levels deep when
    ``depth`` exceeds :data:`SHALLOW` (and this thread is not already such a thread)."""
    if depth <= SHALLOW:
        return fn(*args, **kwargs)
    needed = FRAMES_PER_LEVEL * depth + 2000
    if sys.getrecursionlimit() < needed:
        sys.setrecursionlimit(needed)  # global, and never lowered: other deep calls may be running
    if getattr(_state, "deep", False):  # already on a deep thread: its stack has room, the limit now too
        return fn(*args, **kwargs)
    outcome = {}

    def target():
        _state.deep = True
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as err:  # re-raised on the calling thread, unchanged
            outcome["error"] = err

    with _lock:
        previous = threading.stack_size()
        threading.stack_size(STACK_BYTES)
        try:
            worker = threading.Thread(target=target, name="te_grad-deep")
            worker.start()
        finally:
            threading.stack_size(previous)
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def deep_entry(fn):
    """Decorate a public function of tensors / expressions so that deep graphs work (see the
    module docstring)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if getattr(_state, "deep", False):
            return fn(*args, **kwargs)
        return run_deep(graph_depth([args, kwargs]), fn, *args, **kwargs)
    return wrapper
