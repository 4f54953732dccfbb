"""An interpreter of loop programs: the witness every scheduling transformation is checked against.

:func:`run` executes stages statement by statement in Python, ignoring loop kinds
(a kind never changes what a loop computes, see :mod:`.loopir`): loops run in
order, guards are tested, stores write, and every expression is evaluated with
the reference evaluator's own semantics (:func:`te_grad.evaluator.evaluate_expr`:
Python's ``//`` and ``%``, the op table's numpy functions). Stores are checked
against their tensor's shape. Intermediates start as NaN (floats) or a sentinel
(integers), so an element a schedule forgets to write shows up.

It is slow (a Python step per statement execution): for the small shapes of tests.
Because it knows nothing of LLVM, register blocks or threads, a schedule that
interprets to the evaluator's values is right independently of the emitter; and a
kernel that differs from the interpretation of its own stages points at lowering.
"""
from __future__ import annotations

from typing import Dict, Sequence

import numpy as np

from te_grad import dtypes
from te_grad.errors import InternalError
from te_grad.evaluator import expression_evaluator
from te_grad.ops import reduction
from te_grad.ir import Tensor

from .loopir import If, Loop, Stage, Store

#: the value an integer intermediate starts with (floats start as NaN)
INT_SENTINEL = -(2 ** 31) + 7

def _combine(op: str, old, new):
    """``op(old, new)`` by reduction record ``op``: a NaN wins a selection, as in the kernels."""
    red = reduction(op)
    if red.lowering == "select" and dtypes.is_float(np.asarray(new).dtype.name) and np.isnan(new):
        return new
    return red.combine(old, new)


class _Interpreter:
    def __init__(self, values: Dict[int, np.ndarray], stage: Stage, sizes=None):
        self.values = values
        self.stage = stage
        # size variables (tg.var) are bound for the whole program, like loop variables
        self.env: Dict[int, np.int64] = {id(v): np.int64(n) for v, n in (sizes or {}).items()}
        self.evaluate = expression_evaluator(values, where=stage.tensor.name)

    def value(self, e):
        return self.evaluate(e, self.env)

    def run(self, stmts):
        for s in stmts:
            if isinstance(s, Loop):
                lo, hi = int(self.value(s.lo)), int(self.value(s.hi))
                for i in range(lo, hi):
                    self.env[id(s.var)] = np.int64(i)
                    self.run(s.body)
                self.env.pop(id(s.var), None)
            elif isinstance(s, If):
                if bool(self.value(s.cond)):
                    self.run(s.body)
            elif isinstance(s, Store):
                self.store(s)
            else:
                raise InternalError(f"the loop interpreter does not know {type(s).__name__}")

    def store(self, s: Store):
        buf = self.values[id(s.tensor)]
        idx = tuple(int(self.value(i)) for i in s.indices)
        if any(not 0 <= i < n for i, n in zip(idx, buf.shape)):
            raise InternalError(f"stage {self.stage.tensor.name} stores {s.tensor.name}{list(idx)} outside its "
                                f"shape {list(buf.shape)}")
        if s.index is not None:
            buf[idx] = self.select_pair(s, int(buf[idx]))
            return
        new = np.asarray(self.value(s.value)).astype(buf.dtype)
        buf[idx] = new if s.combine is None else _combine(s.combine, buf[idx], new)

    def select_pair(self, s: Store, old_i: int) -> int:
        """The winner's index of an indexed reduction (argmax) after the candidate
        ``(s.value, s.index)``; the stored one's value is the body evaluated at its index."""
        red = reduction(s.combine)
        new_i = int(self.value(s.index))
        new_v = self.value(s.value)
        if old_i < 0:
            return new_i
        saved = self.env[id(s.index)]
        self.env[id(s.index)] = np.int64(old_i)
        old_v = self.value(s.value)
        self.env[id(s.index)] = saved
        return new_i if bool(red.better(new_v, new_i, old_v, old_i)) else old_i


def run(stages: Sequence[Stage], feed: Dict[Tensor, np.ndarray], sizes=None) -> Dict[int, np.ndarray]:
    """Run ``stages`` in order on the placeholder values of ``feed``; returns every buffer by
    ``id(tensor)``. Size variables (``tg.var``) are bound from the shapes of the fed arrays
    (:func:`te_grad.sizes.bind_sizes`), or given by ``sizes`` (a dict from the variables to
    ints); intermediates are allocated at the bound shapes."""
    from te_grad.sizes import bind_sizes, concrete_shape
    values: Dict[int, np.ndarray] = {id(t): np.asarray(a) for t, a in feed.items()}
    sizes = bind_sizes([(t.name, t.shape, np.shape(a)) for t, a in feed.items()], sizes)
    for stage in stages:
        t = stage.tensor
        if id(t) not in values:
            fill = np.nan if dtypes.is_float(t.dtype) else (False if t.dtype == "bool" else INT_SENTINEL)
            values[id(t)] = np.full(concrete_shape(t.shape, sizes), fill,
                                    dtype=np.bool_ if t.dtype == "bool" else t.dtype)
        with np.errstate(all="ignore"):
            _Interpreter(values, stage, sizes).run(stage.body)
    return values
