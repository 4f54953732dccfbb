"""Reductions and statistics: sums, means, norms, extrema, variances, cumulative sums, softmax.

- ``max.dim`` / ``min.dim`` give ``(values, indices)``, the values read at the first extreme's
  index, so that the gradient goes to that element alone (PyTorch's; ``amax`` splits it over ties).
- ``var(x, dims, correction) = sum (x - mean)^2 / (n - correction)``.
- ``prod(x, dim)``'s gradient is the product of the other elements (exact where some are zero).
- ``sum`` of a bool tensor counts its True elements (as int64).
"""
from __future__ import annotations

from typing import Callable

from ... import dsl, dtypes, nn
from ...errors import UserError
from ...ir import Tensor
from .elementwise import _to_copy
from .indexing import _gather
from .table import RULES, _axes, _axis, rule


@rule("aten.sum.dim_IntList", "aten.sum.default")
def _sum(t, x, dims=None, keepdim=False, dtype=None):
    return nn.sum(x, _axes(dims, x.ndim), keepdims=keepdim)


@rule("aten.mean.dim", "aten.mean.default")
def _mean(t, x, dims=None, keepdim=False, dtype=None):
    return nn.mean(x, _axes(dims, x.ndim), keepdims=keepdim)


@rule("aten.prod.dim_int", "aten.prod.default")
def _prod(t, x, dim=None, keepdim=False, dtype=None):
    """``torch.prod``: the product over ``dim`` (every axis for ``prod.default``; 1 over an
    empty axis). Integer and bool inputs multiply as int64, as in PyTorch. The gradient is
    te_grad's derivative of a product reduction, the product of the other elements, exact
    where some are zero (as PyTorch's)."""
    if dtype is not None:
        x = _to_copy(t, x, dtype)
    elif not dtypes.is_float(x.dtype) and x.dtype != dtypes.INT64:
        x = dsl.compute(x.shape, lambda *i: dsl.cast(dtypes.INT64, x[i]), name="prod_int64")
    axes = _axes(dim, x.ndim) if dim is not None else tuple(range(x.ndim))
    return nn.reduce._reduce("prod", "prod", x, axes, keepdim)


@rule("aten.linalg_vector_norm.default")
def _vector_norm(t, x, ord=2, dim=None, keepdim=False, dtype=None):  # noqa: A002 - ATen's names
    """``sum(|x|)`` (``ord=1``) or ``sqrt(sum(x * x))`` (``ord=2``, ``F.normalize``) over ``dim``.
    The 2-norm of a zero vector has PyTorch's gradient 0 (the square root is read where the sum
    is not 0 only), not ``0 / 0``. Other orders are refused."""
    if dtype is not None:
        x = _to_copy(t, x, dtype)
    axes = _axes(dim, x.ndim)
    if ord == 1:
        return nn.sum(dsl.compute(x.shape, lambda *i: dsl.abs(x[i]), name="norm_abs"), axes, keepdims=keepdim)
    if ord != 2:
        raise UserError(f"linalg_vector_norm: ord={ord!r} is not translated (1 and 2 are)")
    total = nn.sum(dsl.compute(x.shape, lambda *i: x[i] * x[i], name="norm_square"), axes, keepdims=keepdim)
    zero, one = dsl.const(0.0, total.dtype), dsl.const(1.0, total.dtype)
    return dsl.compute(total.shape, lambda *i: dsl.if_then_else(
        total[i] == zero, zero, dsl.sqrt(dsl.if_then_else(total[i] == zero, one, total[i]))), name="norm")


@rule("aten.amax.default")
def _amax(t, x, dims=(), keepdim=False):
    return nn.max(x, _axes(dims, x.ndim), keepdims=keepdim)


@rule("aten.amin.default")
def _amin(t, x, dims=(), keepdim=False):
    return nn.min(x, _axes(dims, x.ndim), keepdims=keepdim)


@rule("aten.var.correction")
def _var(t, x, dims=None, correction=None, keepdim=False):
    corr = 1 if correction is None else correction
    return nn.variance(x, _axes(dims, x.ndim), keepdims=keepdim, correction=corr)


@rule("aten.var_mean.correction")
def _var_mean(t, x, dims=None, correction=None, keepdim=False):
    return (_var(t, x, dims, correction, keepdim), _mean(t, x, dims, keepdim))


def _selecting(kind: str):
    """``max.dim`` / ``min.dim``: ``(values, indices)``, the values read at the first extreme's
    index, so that the gradient goes to that element alone (PyTorch's, where ``amax`` splits
    it over ties)."""
    arg = nn.argmax if kind == "max" else nn.argmin

    def apply(t, x, dim, keepdim=False):
        d = _axis(dim, x.ndim)
        at = arg(x, d, keepdims=True)
        values = _gather(t, x, d, at)
        if not keepdim:
            return (nn.squeeze(values, d), nn.squeeze(at, d))
        return (values, at)
    return apply


RULES["aten.max.dim"] = _selecting("max")


RULES["aten.min.dim"] = _selecting("min")


def _arg_rule(kind: str):
    arg = nn.argmax if kind == "argmax" else nn.argmin

    def apply(t, x, dim=None, keepdim=False):
        if dim is None:
            if x.ndim > 1:
                raise UserError(f"{kind} over every axis of a tensor of rank {x.ndim} (dim=None) is not "
                                "translated; give dim")
            dim = 0
        return arg(x, _axis(dim, x.ndim), keepdims=keepdim)
    return apply


RULES["aten.argmax.default"] = _arg_rule("argmax")


RULES["aten.argmin.default"] = _arg_rule("argmin")


@rule("aten.cumsum.default")
def _cumsum(t, x, dim, dtype=None):
    if dtype is not None:
        x = _to_copy(t, x, dtype)
    return nn.cumsum(x, _axis(dim, x.ndim))


@rule("aten._softmax.default")
def _softmax(t, x, dim, half_to_float=False):
    return nn.softmax(x, _axis(dim, x.ndim))


@rule("aten._log_softmax.default")
def _log_softmax(t, x, dim, half_to_float=False):
    return nn.log_softmax(x, _axis(dim, x.ndim))


def _bool_as_int(base: Callable) -> Callable:
    """``base`` with a bool input counted as int64 (``torch.sum`` of a mask counts its True)."""
    def apply(t, x, *args, **kwargs):
        if isinstance(x, Tensor) and x.dtype == dtypes.BOOL:
            x = dsl.compute(x.shape, lambda *i: dsl.cast(dtypes.INT64, x[i]), name="count")
        return base(t, x, *args, **kwargs)
    return apply


for _n in ("aten.sum.dim_IntList", "aten.sum.default"):
    RULES[_n] = _bool_as_int(RULES[_n])
