"""Reductions over axes: sum, mean, variance, max, min, argmax and argmin (NumPy's and PyTorch's
semantics)."""
from __future__ import annotations

from typing import Sequence, Union

from .. import dsl
from ..errors import UserError
from ..ir import Tensor
from ..ops import reduction
from ._util import check_float, check_tensor, compute, normalize_axis, prod, reciprocal

__all__ = ["sum", "mean", "variance", "max", "min", "argmax", "argmin"]

Axes = Union[None, int, Sequence[int]]


def _axes(op: str, x: Tensor, axis: Axes):
    """The reduced axes, sorted and distinct (``None``: all of them)."""
    if axis is None:
        return list(range(x.ndim))
    axes = [axis] if not isinstance(axis, (list, tuple)) else list(axis)
    out = sorted({normalize_axis(op, a, x.ndim) for a in axes})
    if len(out) != len(axes):
        raise UserError(f"{op}: axis {axis!r} names an axis twice")
    return out


def _reduce(op: str, combiner: str, x: Tensor, axis: Axes, keepdims: bool, scale=None, name=None) -> Tensor:
    check_tensor(op, x, "input")
    axes = _axes(op, x, axis)
    if reduction(combiner).selects and any(x.shape[a] == 0 for a in axes):
        raise UserError(f"{op}: cannot take the {combiner} over the empty axis of {x.name} {list(x.shape)}")
    kept = [d for d in range(x.ndim) if d not in axes]
    shape = tuple(1 if d in axes else x.shape[d] for d in range(x.ndim)) if keepdims else \
        tuple(x.shape[d] for d in kept)
    red = {d: dsl.reduce_axis((0, x.shape[d]), name=f"k{d}") for d in axes}

    def body(idx):
        out_idx = list(idx)
        full = []
        pos = 0
        for d in range(x.ndim):
            if d in red:
                full.append(red[d])
                if keepdims:
                    pos += 1
            else:
                full.append(out_idx[pos])
                pos += 1
        value = x[tuple(full)]
        if not red:
            return value if scale is None else value * scale
        total = getattr(dsl, combiner)(value if scale is None else value * scale, axis=list(red.values()))
        return total
    return compute(shape, body, name=name or op)


def sum(x: Tensor, axis: Axes = None, keepdims: bool = False) -> Tensor:  # noqa: A001 - NumPy's name
    """The sum of ``x`` over ``axis`` (an int, a list, or None for all axes); ``keepdims`` keeps
    the reduced axes with extent 1 (``numpy.sum``, ``torch.sum``)."""
    return _reduce("sum", "sum", x, axis, keepdims)


def mean(x: Tensor, axis: Axes = None, keepdims: bool = False) -> Tensor:
    """The mean of ``x`` over ``axis`` (``numpy.mean``); ``x`` must be a float tensor."""
    check_tensor("mean", x, "input")
    check_float("mean", x)
    axes = _axes("mean", x, axis)
    count = prod(x.shape[a] for a in axes)
    if isinstance(count, int) and count == 0:  # a size expression is checked when bound
        raise UserError(f"mean: the reduced axes of {x.name} {list(x.shape)} are empty")
    return _reduce("mean", "sum", x, axis, keepdims, scale=reciprocal(count, x.dtype))


def variance(x: Tensor, axis: Axes = None, keepdims: bool = False, correction: int = 0) -> Tensor:
    """The variance of ``x`` over ``axis``: ``sum((x - mean)^2) / (n - correction)`` (``numpy.var``
    with ``ddof=correction``; ``torch.var`` uses ``correction=1`` by default). The mean is the
    tensor ``variance_mean``."""
    op = "variance"
    check_tensor(op, x, "input")
    check_float(op, x)
    axes = _axes(op, x, axis)
    count = prod(x.shape[a] for a in axes)
    if isinstance(count, int) and count - correction <= 0:  # a size expression is checked when bound
        raise UserError(f"{op}: {count} elements and correction {correction} leave no degree of freedom")
    mu = _reduce(op, "sum", x, axes, True, scale=reciprocal(count, x.dtype), name=op + "_mean")
    centered = compute(x.shape, lambda idx: x[idx] - mu[tuple(0 if d in axes else i for d, i in enumerate(idx))],
                       name=op + "_centered")
    sq = compute(x.shape, lambda idx: centered[idx] * centered[idx], name=op + "_square")
    return _reduce(op, "sum", sq, axes, keepdims, scale=reciprocal(count - correction, x.dtype))


def max(x: Tensor, axis: Axes = None, keepdims: bool = False) -> Tensor:  # noqa: A001 - NumPy's name
    """The maximum of ``x`` over ``axis`` (``numpy.max``, ``torch.amax``); the gradient of a tie
    is split evenly among the tied elements, as ``torch.amax`` and ``jnp.max`` do."""
    return _reduce("max", "max", x, axis, keepdims)


def min(x: Tensor, axis: Axes = None, keepdims: bool = False) -> Tensor:  # noqa: A001 - NumPy's name
    """The minimum of ``x`` over ``axis`` (``numpy.min``, ``torch.amin``); ties split the gradient."""
    return _reduce("min", "min", x, axis, keepdims)


def _arg(op: str, x: Tensor, axis: int, keepdims: bool) -> Tensor:
    check_tensor(op, x, "input")
    if isinstance(axis, (list, tuple)) or axis is None:
        raise UserError(f"{op}: axis must be one int (the position is along one axis), got {axis!r}")
    a = normalize_axis(op, axis, x.ndim)
    if x.shape[a] == 0:
        raise UserError(f"{op}: no position along the empty axis {a} of {x.name} {list(x.shape)}")
    r = dsl.reduce_axis((0, x.shape[a]), name=f"k{a}")
    shape = tuple(1 if d == a else n for d, n in enumerate(x.shape)) if keepdims else \
        x.shape[:a] + x.shape[a + 1:]

    def body(idx):
        idx = list(idx)
        full = idx[:a] + [r] + idx[a + (1 if keepdims else 0):]
        return getattr(dsl, op)(x[tuple(full)], r)
    return compute(shape, body, name=op)


def argmax(x: Tensor, axis: int, keepdims: bool = False) -> Tensor:
    """The position (int64) of the maximum of ``x`` along ``axis`` (``numpy.argmax``,
    ``torch.argmax``): the first on ties, the first NaN if there is one. Zero derivative; a
    read of ``x`` at it (:func:`te_grad.nn.take`, an index) differentiates through the read."""
    return _arg("argmax", x, axis, keepdims)


def argmin(x: Tensor, axis: int, keepdims: bool = False) -> Tensor:
    """The position (int64) of the minimum of ``x`` along ``axis`` (``numpy.argmin``): as :func:`argmax`."""
    return _arg("argmin", x, axis, keepdims)
