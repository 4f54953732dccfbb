"""Array operations: clip, stack, expand_dims, squeeze, where, one_hot, gather_nd, cumsum, arange."""
from __future__ import annotations

from typing import Sequence

from .. import dsl, dtypes
from ..errors import UserError
from ..ir import Tensor
from ..sizes import same_shape
from ._util import check_float, check_int_dtype, check_tensor, compute, is_int, normalize_axis
from .elementwise import broadcast_read, broadcast_shape

__all__ = ["clip", "stack", "expand_dims", "squeeze", "where", "one_hot", "gather_nd", "cumsum", "arange"]


def clip(x: Tensor, lo=None, hi=None) -> Tensor:
    """``x`` limited to ``[lo, hi]`` elementwise (``numpy.clip``, ``torch.clamp``); either bound may
    be None. The gradient is 1 inside the interval, bounds included (as PyTorch's), 0 outside."""
    op = "clip"
    check_tensor(op, x, "input")
    if lo is None and hi is None:
        raise UserError(f"{op}: give lo, hi or both")
    if lo is not None and hi is not None and lo > hi:
        raise UserError(f"{op}: lo {lo} is above hi {hi}")

    def body(idx):
        v = x[idx]
        if lo is not None:
            v = dsl.if_then_else(v < lo, dsl.as_expr(lo, x.dtype), v)
        if hi is not None:
            v = dsl.if_then_else(v > hi, dsl.as_expr(hi, x.dtype), v)
        return v
    return compute(x.shape, body, name=op)


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """The tensors (all of one shape and dtype) stacked along a new ``axis`` (``numpy.stack``)."""
    op = "stack"
    tensors = list(tensors)
    if not tensors:
        raise UserError(f"{op}: no tensors to stack")
    for t in tensors:
        check_tensor(op, t, "input")
        if not same_shape(t.shape, tensors[0].shape) or t.dtype != tensors[0].dtype:
            raise UserError(f"{op}: {t.name} {t.dtype}{list(t.shape)} differs from {tensors[0].name} "
                            f"{tensors[0].dtype}{list(tensors[0].shape)}")
    axis = normalize_axis(op, axis, tensors[0].ndim + 1)
    shape = tensors[0].shape[:axis] + (len(tensors),) + tensors[0].shape[axis:]

    def body(idx):
        rest = idx[:axis] + idx[axis + 1:]
        out = tensors[-1][rest]
        for k in range(len(tensors) - 2, -1, -1):
            out = dsl.if_then_else(idx[axis] == k, tensors[k][rest], out)
        return out
    return compute(shape, body, name=op)


def expand_dims(x: Tensor, axis: int) -> Tensor:
    """``x`` with a new axis of extent 1 at ``axis`` (``numpy.expand_dims``, ``torch.unsqueeze``)."""
    op = "expand_dims"
    check_tensor(op, x, "input")
    axis = normalize_axis(op, axis, x.ndim + 1)
    shape = x.shape[:axis] + (1,) + x.shape[axis:]
    return compute(shape, lambda idx: x[idx[:axis] + idx[axis + 1:]], name=op)


def squeeze(x: Tensor, axis=None) -> Tensor:
    """``x`` without its axes of extent 1 (``axis``: only that one, which must have extent 1)."""
    op = "squeeze"
    check_tensor(op, x, "input")
    if axis is None:
        drop = [d for d, n in enumerate(x.shape) if n == 1]
    else:
        axes = [axis] if is_int(axis) else list(axis)
        drop = sorted({normalize_axis(op, a, x.ndim) for a in axes})
        for d in drop:
            if x.shape[d] != 1:
                raise UserError(f"{op}: axis {d} of {x.name} {list(x.shape)} has extent {x.shape[d]}, not 1")
    shape = tuple(n for d, n in enumerate(x.shape) if d not in drop)

    def body(idx):
        it = iter(idx)
        return x[tuple(0 if d in drop else next(it) for d in range(x.ndim))]
    return compute(shape, body, name=op)


def where(cond: Tensor, a, b) -> Tensor:
    """``a`` where the bool tensor ``cond`` holds, else ``b`` (``numpy.where``), with broadcasting;
    ``a`` and ``b`` are tensors or numbers. The gradient flows to the chosen element only."""
    op = "where"
    check_tensor(op, cond, "cond")
    if cond.dtype != dtypes.BOOL:
        raise UserError(f"{op}: cond {cond.name} must be a bool tensor, got {cond.dtype}")
    shapes = [cond.shape] + [t.shape for t in (a, b) if isinstance(t, Tensor)]
    shape = broadcast_shape(op, *shapes)

    def pick(t, idx):
        return broadcast_read(t, idx) if isinstance(t, Tensor) else t
    return compute(shape, lambda idx: dsl.if_then_else(broadcast_read(cond, idx), pick(a, idx), pick(b, idx)),
                   name=op)


def one_hot(ids: Tensor, depth: int, dtype: str = "float32") -> Tensor:
    """``out[..., c] = 1 if ids[...] == c else 0`` for ``c`` in ``[0, depth)`` (``torch.nn.functional.one_hot``)."""
    op = "one_hot"
    check_tensor(op, ids, "ids")
    check_int_dtype(op, ids, "ids")
    if not is_int(depth) or depth < 1:
        raise UserError(f"{op}: depth must be a positive int, got {depth!r}")
    return compute(ids.shape + (depth,), lambda idx: dsl.if_then_else(
        dsl.cast("int64", ids[idx[:-1]]) == idx[-1], dsl.const(1, dtype), dsl.const(0, dtype)), name=op)


def gather_nd(x: Tensor, indices: Tensor) -> Tensor:
    """``out[i...] = x[indices[i..., 0], ..., indices[i..., K-1], ...]`` (TVM's ``gather_nd`` with the
    index tuple on the last axis of ``indices``; the remaining axes of ``x`` follow). Indices are
    checked at run time."""
    op = "gather_nd"
    check_tensor(op, x, "input")
    check_tensor(op, indices, "indices")
    check_int_dtype(op, indices, "indices")
    if indices.ndim < 1 or not 1 <= indices.shape[-1] <= x.ndim:
        raise UserError(f"{op}: the last axis of indices {list(indices.shape)} must hold 1 to {x.ndim} "
                        f"indices into {x.name} {list(x.shape)}")
    k = indices.shape[-1]
    lead = indices.shape[:-1]
    shape = lead + x.shape[k:]

    def body(idx):
        pos = idx[:len(lead)]
        at = tuple(dsl.cast("int64", indices[pos + (m,)]) for m in range(k))
        return x[at + idx[len(lead):]]
    return compute(shape, body, name=op)


def cumsum(x: Tensor, axis: int = 0) -> Tensor:
    """The running sum along ``axis`` (``numpy.cumsum``): ``out[..., j, ...] = sum_{k <= j} x[..., k, ...]``,
    compiled as a linear-time scan."""
    from ..ir import ReduceAxis
    op = "cumsum"
    check_tensor(op, x, "input")
    check_float(op, x)
    axis = normalize_axis(op, axis, x.ndim)

    def body(idx):
        k = ReduceAxis("k", "int64", dsl.const(0), idx[axis] + 1)
        return dsl.sum(x[idx[:axis] + (k,) + idx[axis + 1:]], axis=k)
    return compute(x.shape, body, name=op)


def arange(n: int, dtype: str = "int64") -> Tensor:
    """``[0, 1, ..., n - 1]`` (``numpy.arange``); ``n`` may be a size expression (``tg.var``)."""
    from ._util import is_size
    if not is_size(n) or (is_int(n) and n < 0):
        raise UserError(f"arange: n must be a non-negative int or a size expression (tg.var), got {n!r}")
    return compute((n,), lambda idx: dsl.cast(dtype, idx[0]), name="arange")
