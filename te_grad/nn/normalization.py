"""Normalization layers: ``layer_norm``, ``rms_norm`` and training-mode ``batch_norm``."""
from __future__ import annotations

import numbers

from .. import dsl
from ..errors import UserError
from ..ir import Tensor
from ._util import (check_float, check_tensor, compute, is_int, normalize_axis, prod, reciprocal, reduce,
                    reduce_axes)

__all__ = ["layer_norm", "rms_norm", "batch_norm"]


#: each float dtype's machine epsilon (``torch.finfo(dtype).eps``), rms_norm's default eps
_MACHINE_EPS = {"float32": 2.0 ** -23, "float64": 2.0 ** -52}


def _eps(op: str, eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0:
        raise UserError(f"{op}: eps must be a non-negative number, got {eps!r}")
    return float(eps)


def _moments(op: str, x: Tensor, red):
    """Mean and biased variance of ``x`` over the axes ``red`` (``<op>_mean``, ``<op>_var``).

    Both have the shape of the kept axes. Returns them with ``kept(idx)``, which
    maps an index of ``x`` to the index of the statistics.
    """
    keep = [d for d in range(x.ndim) if d not in red]
    shape = tuple(x.shape[d] for d in keep)
    count = prod(x.shape[d] for d in red)
    if count == 0:
        raise UserError(f"{op}: no elements to normalize over in {x.name} {list(x.shape)}")
    inv = reciprocal(count, x.dtype)

    def full(idx, taps):
        out, it_k, it_r = [], iter(idx), iter(taps)
        for d in range(x.ndim):
            out.append(next(it_r) if d in red else next(it_k))
        return tuple(out)

    def kept(idx):
        return tuple(idx[d] for d in keep)

    names = [f"r{d}" for d in red]
    taps, axes = reduce_axes([x.shape[d] for d in red], names)
    mean = compute(shape, lambda idx: reduce("sum", x[full(idx, taps)] * inv, axes),
                   name=op + "_mean")
    taps, axes = reduce_axes([x.shape[d] for d in red], names)

    def var_body(idx):
        dev = x[full(idx, taps)] - mean[idx]
        return reduce("sum", dev * dev * inv, axes)

    var = compute(shape, var_body, name=op + "_var")
    return mean, var, kept


def _affine_param(op: str, p, what: str, shape):
    if p is None:
        return None
    check_tensor(op, p, what)
    if tuple(p.shape) != tuple(shape):
        raise UserError(f"{op}: {what} {p.name} has shape {list(p.shape)} but {list(shape)} is "
                        f"needed")
    return p


def _normalize(op: str, x: Tensor, mean, var, kept, gamma, beta, param_idx, eps: float):
    def body(idx):
        s = kept(idx)
        out = (x[idx] - mean[s]) / dsl.sqrt(var[s] + eps)
        if gamma is not None:
            out = out * gamma[param_idx(idx)]
        if beta is not None:
            out = out + beta[param_idx(idx)]
        return out

    return compute(x.shape, body, name=op)


def layer_norm(x: Tensor, gamma: Tensor = None, beta: Tensor = None, axis=-1,
               eps: float = 1e-5) -> Tensor:
    """Layer normalization over the trailing ``axis`` (an int or a tuple of trailing axes).

    With ``mean`` and biased ``var`` of ``x`` over those axes (``layer_norm_mean``,
    ``layer_norm_var``), ``out = (x - mean) / sqrt(var + eps) * gamma + beta``.
    ``gamma`` and ``beta`` have the shape of the normalized axes (either may be
    None); the result has the shape of ``x``. Same as PyTorch's ``layer_norm``
    with ``normalized_shape = x.shape[axis...]``.
    """
    op = "layer_norm"
    check_tensor(op, x, "input")
    check_float(op, x)
    eps = _eps(op, eps)
    red = _trailing_axes(op, x, axis)
    pshape = tuple(x.shape[d] for d in red)
    gamma = _affine_param(op, gamma, "gamma", pshape)
    beta = _affine_param(op, beta, "beta", pshape)
    mean, var, kept = _moments(op, x, red)
    first = red[0]
    return _normalize(op, x, mean, var, kept, gamma, beta, lambda idx: tuple(idx[first:]), eps)


def _trailing_axes(op: str, x: Tensor, axis):
    """``axis`` (an int or a tuple of ints) as the sorted list of trailing axes of ``x`` it names."""
    if x.ndim == 0:
        raise UserError(f"{op}: input {x.name} is 0-d; there is no axis to normalize over")
    axes = (axis,) if is_int(axis) else tuple(axis) if isinstance(axis, (tuple, list)) else None
    if not axes:
        raise UserError(f"{op}: axis must be an int or a non-empty tuple of ints, got {axis!r}")
    red = sorted({normalize_axis(op, a, x.ndim) for a in axes})
    if len(red) != len(axes) or red != list(range(x.ndim - len(red), x.ndim)):
        raise UserError(f"{op}: axis {axis!r} must name distinct trailing axes of {x.name} "
                        f"(rank {x.ndim})")
    return red


def rms_norm(x: Tensor, weight: Tensor = None, eps: float = None, axis=-1) -> Tensor:
    """Root-mean-square normalization over the trailing ``axis`` (an int or a tuple of trailing axes).

    With ``rms_norm_ms`` the mean of ``x * x`` over those axes, ``out = x / sqrt(ms + eps) * weight``
    (no centering, no bias). ``weight`` has the shape of the normalized axes (or is None); the
    result has the shape of ``x``. ``eps=None`` is PyTorch's default, the machine epsilon of
    ``x``'s dtype (``torch.finfo(dtype).eps``: 2**-23 for float32, 2**-52 for float64). Same as
    PyTorch's ``F.rms_norm(x, x.shape[axis...], weight, eps)``.
    """
    op = "rms_norm"
    check_tensor(op, x, "input")
    check_float(op, x)
    eps = _MACHINE_EPS[x.dtype] if eps is None else _eps(op, eps)
    red = _trailing_axes(op, x, axis)
    weight = _affine_param(op, weight, "weight", tuple(x.shape[d] for d in red))
    keep = x.ndim - len(red)
    count = prod(x.shape[d] for d in red)
    if is_int(count) and count == 0:
        raise UserError(f"{op}: no elements to normalize over in {x.name} {list(x.shape)}")
    inv = reciprocal(count, x.dtype)
    taps, axes = reduce_axes([x.shape[d] for d in red], [f"r{d}" for d in red])
    ms = compute(x.shape[:keep], lambda idx: reduce("sum", x[tuple(idx) + tuple(taps)] * x[tuple(idx) + tuple(taps)]
                                                     * inv, axes), name=op + "_ms")

    def body(idx):
        out = x[idx] / dsl.sqrt(ms[idx[:keep]] + eps)
        return out * weight[idx[keep:]] if weight is not None else out

    return compute(x.shape, body, name=op)


def batch_norm(x: Tensor, gamma: Tensor = None, beta: Tensor = None, eps: float = 1e-5) -> Tensor:
    """Training-mode batch normalization with batch statistics; channels on axis 1.

    ``x`` is (N, C), (N, C, L) or (N, C, H, W); ``mean`` and biased ``var`` are
    taken per channel over every other axis (N, H, W for NCHW; N for (N, C)) as
    ``batch_norm_mean`` and ``batch_norm_var``, and ``out = (x - mean[c]) /
    sqrt(var[c] + eps) * gamma[c] + beta[c]`` with ``gamma`` and ``beta`` of shape
    (C,) (either may be None). The result has the shape of ``x``; running
    statistics are not tracked.
    """
    op = "batch_norm"
    check_tensor(op, x, "input", ndim=(2, 3, 4, 5))
    check_float(op, x)
    eps = _eps(op, eps)
    c = x.shape[1]
    gamma = _affine_param(op, gamma, "gamma", (c,))
    beta = _affine_param(op, beta, "beta", (c,))
    red = [d for d in range(x.ndim) if d != 1]
    mean, var, kept = _moments(op, x, red)
    return _normalize(op, x, mean, var, kept, gamma, beta, lambda idx: (idx[1],), eps)
