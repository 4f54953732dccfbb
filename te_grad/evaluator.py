"""The numpy reference evaluator: the oracle every other stage is checked against.

Each tensor of the graph is computed whole, vectorized over its domain: an
index variable is an ``arange`` laid along its own array dimension, so an
expression evaluates to an array that broadcasts to the domain. A reduction
prepends one dimension per reduce axis (numpy broadcasting aligns on the right,
so everything outside the reduction stays valid) and reduces them away.
Large reduction domains are cut into chunks along their first axis to bound
memory.

Guards are exact: every expression is evaluated under a *mask* of the points
where it is actually needed (the branch of a select that is taken, the points
of a reduction domain that satisfy ``where``, the right operand of ``&`` where
the left holds). A read outside its tensor at a needed point is a
:class:`~te_grad.errors.UserError` naming the read and the point; at other
points the index is clamped, so memory is never touched out of bounds.
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence

import numpy as np

from . import dtypes
from .errors import InternalError, UserError
from .graph import topo_order
from .ir import (Binary, Call, Cast, Compare, ComputeOp, Const, Expr, PlaceholderOp, Read, Reduce,
                 ScatterOp, Select, Tensor, Unary, Var)
from .printer import expr_to_str

#: elements of one intermediate array above which a reduction is chunked
CHUNK_ELEMENTS = 1 << 23

_erf = np.frompyfunc(math.erf, 1, 1)

_INTRINSIC = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.abs,
    "sin": np.sin, "cos": np.cos, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
    "round": np.rint,  # half to even, like LLVM's roundeven
    "stop_gradient": lambda x: x,
    "sigmoid": lambda x: 0.5 * (np.tanh(0.5 * x) + 1.0),  # overflow-free logistic
    "erf": lambda x: np.asarray(_erf(x)).astype(x.dtype),  # a 0-d input gives a Python float
}
_ARITH = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
          "min": np.minimum, "max": np.maximum, "pow": np.power,
          "floordiv": np.floor_divide, "floormod": np.remainder}
_COMPARE = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
            "eq": np.equal, "ne": np.not_equal}
_COMBINE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def identity_of(combiner: str, dtype: str):
    """The value of a reduction over an empty domain."""
    if combiner == "sum":
        return 0
    if combiner == "prod":
        return 1
    if dtypes.is_float(dtype):
        return -np.inf if combiner == "max" else np.inf
    info = np.iinfo(dtype)
    return info.min if combiner == "max" else info.max


def _and(mask, cond):
    if mask is None:
        return cond
    return np.logical_and(mask, cond)


class _ExprEvaluator:
    """Evaluates one compute body; ``shape`` is the shape of all dimensions in play."""

    def __init__(self, values: Dict[int, np.ndarray], tensor: Tensor):
        self.values = values
        self.tensor = tensor
        self.env: Dict[int, np.ndarray] = {}
        self.shape: tuple = tensor.shape

    def run(self) -> np.ndarray:
        op: ComputeOp = self.tensor.op
        nd = len(op.axes)
        for d, ax in enumerate(op.axes):
            self.env[id(ax)] = np.arange(self.tensor.shape[d], dtype=np.int64).reshape(
                [self.tensor.shape[d] if e == d else 1 for e in range(nd)])
        out = self.eval(op.body, None)
        # np.array, not np.ascontiguousarray: the latter turns a 0-d result into shape (1,)
        return np.array(np.broadcast_to(out, self.tensor.shape), dtype=self.tensor.dtype, order="C")

    def eval(self, e: Expr, mask) -> np.ndarray:
        out = getattr(self, "e_" + type(e).__name__)(e, mask)
        if out.dtype != np.dtype(e.dtype):
            out = out.astype(e.dtype)
        return out

    # -- leaves ---------------------------------------------------------------
    def e_Const(self, e: Const, mask):
        return np.array(e.value, dtype=e.dtype)

    def e_Var(self, e: Var, mask):
        try:
            return self.env[id(e)]
        except KeyError:
            raise InternalError(f"variable {e.name} is not bound while evaluating "
                                f"{self.tensor.name}") from None

    e_ReduceAxis = e_Var

    # -- arithmetic and logic -------------------------------------------------------
    def e_Binary(self, e: Binary, mask):
        a = self.eval(e.a, mask)
        if e.op in ("and", "or"):
            b_mask = _and(mask, a if e.op == "and" else np.logical_not(a))
            b = self.eval(e.b, b_mask)
            return np.logical_and(a, b) if e.op == "and" else np.logical_or(a, b)
        b = self.eval(e.b, mask)
        if e.op in ("floordiv", "floormod"):
            zero = b == 0
            if np.any(_and(mask, zero)):
                raise UserError(f"integer division by zero in {expr_to_str(e)} "
                                f"(compute {self.tensor.name})")
            b = np.where(zero, 1, b) if np.any(zero) else b
        return _ARITH[e.op](a, b)

    def e_Unary(self, e: Unary, mask):
        a = self.eval(e.a, mask)
        return np.negative(a) if e.op == "neg" else np.logical_not(a)

    def e_Compare(self, e: Compare, mask):
        return _COMPARE[e.op](self.eval(e.a, mask), self.eval(e.b, mask))

    def e_Select(self, e: Select, mask):
        cond = self.eval(e.cond, mask)
        t = self.eval(e.t, _and(mask, cond))
        f = self.eval(e.f, _and(mask, np.logical_not(cond)))
        return np.where(cond, t, f)

    def e_Call(self, e: Call, mask):
        args = [self.eval(a, mask) for a in e.args]
        return _INTRINSIC[e.name](*args)

    def e_Cast(self, e: Cast, mask):
        a = self.eval(e.a, mask)
        if dtypes.is_int(e.dtype) and dtypes.is_float(e.a.dtype):
            a = np.trunc(a)
        return a.astype(e.dtype)

    # -- memory -----------------------------------------------------------------
    def e_Read(self, e: Read, mask):
        arr = self.values.get(id(e.tensor))
        if arr is None:
            raise InternalError(f"tensor {e.tensor.name} read before it was computed")
        idx = [self.eval(i, mask) for i in e.indices]
        safe = []
        bad = None
        for d, ix in enumerate(idx):
            n = e.tensor.shape[d]
            if ix.size and (ix.min() < 0 or ix.max() >= n):
                ok = (ix >= 0) & (ix < n)
                miss = _and(mask, np.logical_not(ok))
                if np.any(miss):
                    bad = miss if bad is None else bad | miss
                ix = np.where(ok, ix, 0)
            elif ix.size == 0 and n == 0:
                ix = np.zeros_like(ix)
            safe.append(ix)
        if bad is not None:
            self._out_of_bounds(e, idx, bad)
        if not safe:
            return np.asarray(arr[()])
        if arr.size == 0:  # an empty tensor: every point of this read was guarded off
            return np.zeros(np.broadcast_shapes(*[ix.shape for ix in safe]), dtype=arr.dtype)
        return arr[tuple(safe)]

    def _out_of_bounds(self, e: Read, idx, bad):
        full = np.broadcast_shapes(bad.shape, *[i.shape for i in idx])
        point = tuple(np.argwhere(np.broadcast_to(bad, full))[0])
        at = tuple(int(np.broadcast_to(i, full)[point]) for i in idx)
        raise UserError(f"read {expr_to_str(e)} in compute {self.tensor.name} reaches index "
                        f"{list(at)} outside tensor {e.tensor.name} of shape {list(e.tensor.shape)}")

    # -- reductions ------------------------------------------------------------------
    def e_Reduce(self, e: Reduce, mask):
        outer_shape = self.shape
        ranges, varying = self._axis_ranges(e.axes, mask, outer_shape)
        ident = np.array(identity_of(e.combiner, e.dtype), dtype=e.dtype)
        result = None
        for part_ranges in self._chunks(ranges, outer_shape):
            inner_mask, sizes = self._enter(e.axes, part_ranges, varying, e.where, mask, outer_shape)
            body = self.eval(e.body, inner_mask)
            full = np.broadcast_shapes(body.shape, sizes + (1,) * len(outer_shape),
                                       () if inner_mask is None else np.shape(inner_mask))
            body = np.broadcast_to(body, full)
            if inner_mask is not None:
                body = np.where(np.broadcast_to(inner_mask, full), body, ident)
            part = np.asarray(_COMBINE[e.combiner].reduce(body, axis=tuple(range(len(e.axes)))),
                              dtype=e.dtype)
            self._leave(e.axes, outer_shape)
            result = part if result is None else _COMBINE[e.combiner](result, part)
        return ident if result is None else result

    def run_scatter(self) -> np.ndarray:
        """``T = 0; T[indices] += value`` over the scatter's domain (np.add.at semantics)."""
        op: ScatterOp = self.tensor.op
        out = np.zeros(self.tensor.shape, dtype=self.tensor.dtype)
        self.shape = ()
        ranges, varying = self._axis_ranges(op.axes, None, ())
        for part_ranges in self._chunks(ranges, ()):
            mask, sizes = self._enter(op.axes, part_ranges, varying, op.where, None, ())
            full = np.broadcast_shapes(sizes, () if mask is None else np.shape(mask))
            sel = np.ones(full, dtype=bool) if mask is None else np.broadcast_to(mask, full)
            idx = [np.broadcast_to(self.eval(i, mask), full)[sel] for i in op.indices]
            for d, ix in enumerate(idx):
                bad = (ix < 0) | (ix >= self.tensor.shape[d])
                if np.any(bad):
                    raise UserError(f"scatter into {self.tensor.name}: index {d} takes the value "
                                    f"{int(ix[bad][0])}, outside [0, {self.tensor.shape[d]}) "
                                    f"({expr_to_str(op.indices[d])})")
            vals = np.broadcast_to(self.eval(op.value, mask), full)[sel]
            np.add.at(out, tuple(idx), vals)
            self._leave(op.axes, ())
        return out

    # -- iteration domains shared by reductions and scatters -----------------------
    def _axis_ranges(self, axes, mask, outer_shape):
        """The bounding range of each axis, and which axes have varying bounds."""
        m = len(axes)
        ranges, varying = [], []
        for t, ax in enumerate(axes):
            # bounds may depend on outer variables and on earlier axes of this domain
            self.shape = tuple(hi - lo for lo, hi in ranges) + (1,) * (m - t) + tuple(outer_shape)
            lo, hi = self.eval(ax.lo, mask), self.eval(ax.hi, mask)
            lo_min = int(lo.min()) if lo.size else 0
            hi_max = int(hi.max()) if hi.size else 0
            ranges.append((lo_min, max(lo_min, hi_max)))
            if lo.ndim or hi.ndim:
                varying.append(t)
            self._bind_axis(ax, t, m, ranges[t], outer_shape)
        self._unbind(axes)
        self.shape = outer_shape
        return ranges, varying

    def _chunks(self, ranges, outer_shape):
        """Sub-ranges of ``ranges``, cut along the first axis, small enough to hold in memory."""
        sizes = [hi - lo for lo, hi in ranges]
        if 0 in sizes:
            return
        inner = int(np.prod(outer_shape, dtype=np.int64)) * int(np.prod(sizes[1:], dtype=np.int64))
        chunk = max(1, CHUNK_ELEMENTS // max(1, inner))
        lo0, hi0 = ranges[0]
        for start in range(lo0, hi0, chunk):
            yield [(start, min(hi0, start + chunk))] + list(ranges[1:])

    def _enter(self, axes, ranges, varying, where, mask, outer_shape):
        """Bind ``axes`` to ``ranges``; return the mask of the domain's points and its sizes."""
        m = len(axes)
        sizes = tuple(hi - lo for lo, hi in ranges)
        for t, ax in enumerate(axes):
            self._bind_axis(ax, t, m, ranges[t], outer_shape)
        self.shape = sizes + tuple(outer_shape)
        inner_mask = mask
        for t in varying:
            ax = axes[t]
            value = self.env[id(ax)]
            lo, hi = self.eval(ax.lo, inner_mask), self.eval(ax.hi, inner_mask)
            inner_mask = _and(inner_mask, (value >= lo) & (value < hi))
        if where is not None:
            inner_mask = _and(inner_mask, self.eval(where, inner_mask))
        return inner_mask, sizes

    def _leave(self, axes, outer_shape):
        self._unbind(axes)
        self.shape = tuple(outer_shape)

    def _bind_axis(self, ax, t, m, rng, outer_shape):
        shape = [1] * (m + len(outer_shape))
        shape[t] = rng[1] - rng[0]
        self.env[id(ax)] = np.arange(rng[0], rng[1], dtype=np.int64).reshape(shape)

    def _unbind(self, axes):
        for ax in axes:
            self.env.pop(id(ax), None)


def check_feed(tensor: Tensor, value) -> np.ndarray:
    """``value`` as an array for placeholder ``tensor``, or a UserError naming the mismatch."""
    if isinstance(value, np.ndarray):
        arr = value
        if arr.dtype != np.dtype(tensor.dtype):
            raise UserError(f"placeholder {tensor.name} expects dtype {tensor.dtype} but got an array of "
                            f"{arr.dtype}; convert it with .astype(np.{tensor.dtype})")
    else:  # Python scalars and lists are converted, but never with a loss of value
        try:
            given = np.asarray(value)
            arr = given.astype(tensor.dtype)
        except (TypeError, ValueError) as err:
            raise UserError(f"cannot convert the value for placeholder {tensor.name} to "
                            f"{tensor.dtype}: {err}") from None
        if given.dtype.kind in "fc" and not dtypes.is_float(tensor.dtype) and not np.array_equal(arr, given):
            raise UserError(f"placeholder {tensor.name} is {tensor.dtype} but was given non-integral "
                            f"values {value!r}")
    if arr.shape != tensor.shape:
        raise UserError(f"placeholder {tensor.name} expects shape {list(tensor.shape)} but got "
                        f"{list(arr.shape)}")
    return arr


def evaluate(tensors: Sequence[Tensor], feed: Dict[Tensor, object]) -> List[np.ndarray]:
    """Compute ``tensors`` with numpy from the placeholder values in ``feed``.

    Returns one new array per tensor. Placeholders the tensors do not need may
    be present in ``feed`` and are ignored; missing ones raise a UserError.
    """
    single = isinstance(tensors, Tensor)
    if single:
        raise UserError("tg.evaluate takes a list of tensors: tg.evaluate([T], feed)")
    tensors = list(tensors)
    for t in tensors:
        if not isinstance(t, Tensor):
            raise UserError(f"tg.evaluate expects tensors, got {t!r}")
    if not isinstance(feed, dict):
        raise UserError(f"feed must be a dict from placeholder tensors to arrays, got {type(feed).__name__}")
    for key in feed:
        if not isinstance(key, Tensor):
            raise UserError(f"feed keys must be placeholder tensors, got {key!r}")
        if not key.is_placeholder:
            raise UserError(f"feed key {key.name} is not a placeholder; it is computed from other tensors")
    values: Dict[int, np.ndarray] = {}
    order = topo_order(tensors)
    missing = [t.name for t in order if t.is_placeholder and t not in feed]
    if missing:
        raise UserError(f"no value in the feed for placeholder(s) {', '.join(missing)}")
    with np.errstate(all="ignore"):
        for t in order:
            if isinstance(t.op, PlaceholderOp):
                values[id(t)] = check_feed(t, feed[t])
            elif isinstance(t.op, ComputeOp):
                values[id(t)] = _ExprEvaluator(values, t).run()
            elif isinstance(t.op, ScatterOp):
                values[id(t)] = _ExprEvaluator(values, t).run_scatter()
            else:
                raise InternalError(f"the evaluator does not know the op of {t.name}: {type(t.op).__name__}")
    return [np.array(values[id(t)], copy=True) for t in tensors]
