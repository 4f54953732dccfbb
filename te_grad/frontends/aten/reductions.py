"""Reductions and statistics: sums, means, norms, distances, extrema, variances, cumulative sums,
softmax.

- ``max.dim`` / ``min.dim`` give ``(values, indices)``, the values read at the first extreme's
  index, so that the gradient goes to that element alone (PyTorch's; ``amax`` splits it over ties,
  and so do ``max()`` / ``min()`` of every element).
- ``cdist(x1, x2, p)[.., i, j] = (sum_k |x1[.., i, k] - x2[.., j, k]|^p)^(1/p)``, 0's gradient 0.
- ``var(x, dims, correction) = sum (x - mean)^2 / (n - correction)``; ``std = sqrt(var)``, its
  gradient 0 where the variance is 0, as PyTorch's (so are the 2-norm's and ``cdist``'s at 0).
- ``prod(x, dim)``'s gradient is the product of the other elements (exact where some are zero).
- ``sum`` and ``prod`` take bool and integer tensors as int64, as PyTorch (the sum of a mask
  counts its True; an int32 sum does not wrap at 2^31).
- A 0-d tensor reduces (or normalizes) along dim 0 or -1 as a vector of one element, to a
  0-d result (:func:`~.table.on_a_scalar`).
"""
from __future__ import annotations

from typing import Callable

from ... import dsl, dtypes, nn
from ...errors import UserError
from ...ir import Tensor
from ...sizes import same_shape
from .elementwise import _to_copy
from .indexing import _gather
from .table import RULES, _axes, _axis, on_a_scalar, rule


@rule("aten.sum.dim_IntList", "aten.sum.default")
@on_a_scalar
def _sum(t, x, dims=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = _to_copy(t, x, dtype)
    return nn.sum(x, _axes(dims, x.ndim), keepdims=keepdim)


@rule("aten.mean.dim", "aten.mean.default")
@on_a_scalar
def _mean(t, x, dims=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = _to_copy(t, x, dtype)
    return nn.mean(x, _axes(dims, x.ndim), keepdims=keepdim)


@rule("aten.prod.dim_int", "aten.prod.default")
@on_a_scalar
def _prod(t, x, dim=None, keepdim=False, dtype=None):
    """``torch.prod``: the product over ``dim`` (every axis for ``prod.default``; 1 over an
    empty axis). Integer and bool inputs multiply as int64, as in PyTorch. The gradient is
    te_grad's derivative of a product reduction, the product of the other elements, exact
    where some are zero (as PyTorch's)."""
    if dtype is not None:
        x = _to_copy(t, x, dtype)
    axes = _axes(dim, x.ndim) if dim is not None else tuple(range(x.ndim))
    return nn.reduce._reduce("prod", "prod", x, axes, keepdim)


@rule("aten.linalg_vector_norm.default")
@on_a_scalar
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
    return _root(nn.sum(dsl.compute(x.shape, lambda *i: x[i] * x[i], name="norm_square"), axes, keepdims=keepdim),
                 name="norm")


def _root(total: Tensor, p: float = 2.0, name: str = "root") -> Tensor:
    """``total ** (1 / p)`` (the square root for ``p = 2``) whose gradient where ``total`` is 0
    is 0, PyTorch's for norms, distances and ``std``, not ``1 / 0`` times 0: the root is read
    where ``total`` is not 0 only."""
    zero, one = dsl.const(0.0, total.dtype), dsl.const(1.0, total.dtype)

    def root(v):
        return dsl.sqrt(v) if p == 2.0 else dsl.pow(v, dsl.const(1.0 / p, v.dtype))
    return dsl.compute(total.shape, lambda *i: dsl.if_then_else(
        total[i] == zero, zero, root(dsl.if_then_else(total[i] == zero, one, total[i]))), name=name)


@rule("aten._euclidean_dist.default")
def _euclidean_dist(t, x1, x2):
    """The 2-norm distances ``cdist`` computes from a matrix product above 25 rows (what
    ``torch.compile`` traces ``cdist`` to): kept whole and summed from the differences, as
    :func:`_cdist` with ``p = 2``."""
    return _cdist(t, x1, x2, 2.0)


@rule("aten.cdist.default", "aten._cdist_forward.default")
def _cdist(t, x1, x2, p=2.0, compute_mode=None):
    """``torch.cdist``: ``out[..., i, j] = (sum_k |x1[..., i, k] - x2[..., j, k]|^p)^(1/p)``
    for ``p`` of at least 1 (``p = 1``: the sum of ``|d|``), the leading axes of both operands
    the same. ``cdist`` and ``_euclidean_dist`` are kept whole (:data:`~.table.KEEP`):
    decomposed, ``cdist`` becomes, for ``p = 2`` above 25 rows (or with ``compute_mode`` asking
    for it), ``sqrt`` of ``x1^2 + x2^2 - 2 x1 x2`` from a matrix product, whose gradient at a
    zero distance is NaN where PyTorch's own is 0. Here the distances are summed from the
    differences themselves in every case (PyTorch's matrix product rounds otherwise: a zero
    distance may come out as 1e-8 there). The gradient of a zero distance is 0, as PyTorch's (the root is read where
    the sum is not 0 only). ``p`` below 1 or infinite is refused (PyTorch's gradient of the
    infinite one gives every tie the whole gradient)."""
    if not (isinstance(x1, Tensor) and isinstance(x2, Tensor)) or x1.ndim < 2 or x1.ndim != x2.ndim or \
            not same_shape(x1.shape[:-2], x2.shape[:-2]) or not same_shape(x1.shape[-1:], x2.shape[-1:]):
        raise UserError(f"cdist of shapes {getattr(x1, 'shape', x1)} and {getattr(x2, 'shape', x2)}: operands "
                        "of one rank with the same leading axes and features are translated")
    p = float(p)
    if not 1.0 <= p < float("inf"):
        raise UserError(f"cdist with p={p}: p of at least 1 and finite is translated")
    k = dsl.reduce_axis((0, x1.shape[-1]), "k")

    def term(d):
        if p == 1.0:
            return dsl.abs(d)
        if p == 2.0:
            return d * d
        return dsl.pow(dsl.abs(d), dsl.const(p, d.dtype))
    total = dsl.compute(x1.shape[:-1] + x2.shape[-2:-1], lambda *i: dsl.sum(
        term(x1[i[:-1] + (k,)] - x2[i[:-2] + (i[-1], k)]), axis=k), name="cdist_sum")
    return total if p == 1.0 else _root(total, p, name="cdist")


@rule("aten.amax.default")
@on_a_scalar
def _amax(t, x, dims=(), keepdim=False):
    return nn.max(x, _axes(dims, x.ndim), keepdims=keepdim)


@rule("aten.amin.default")
@on_a_scalar
def _amin(t, x, dims=(), keepdim=False):
    return nn.min(x, _axes(dims, x.ndim), keepdims=keepdim)


def _extreme_of_all(reduce):
    """``x.max()`` / ``x.min()`` over every element, 0-d: ``amax`` / ``amin`` of all dimensions,
    whose gradient is split evenly over tied elements, as PyTorch's (``evenly_distribute_backward``;
    where the result is NaN, PyTorch splits it over the NaN elements, te_grad gives none)."""
    def apply(t, x):
        if x.ndim == 0:
            return dsl.compute((), lambda: x[()], name="extreme")
        return reduce(x, tuple(range(x.ndim)), keepdims=False)
    return apply


RULES["aten.max.default"] = _extreme_of_all(nn.max)
RULES["aten.min.default"] = _extreme_of_all(nn.min)


@rule("aten.var.correction")
@on_a_scalar
def _var(t, x, dims=None, correction=None, keepdim=False):
    corr = 1 if correction is None else correction
    return nn.variance(x, _axes(dims, x.ndim), keepdims=keepdim, correction=corr)


@rule("aten.var_mean.correction")
@on_a_scalar
def _var_mean(t, x, dims=None, correction=None, keepdim=False):
    return (_var(t, x, dims, correction, keepdim), _mean(t, x, dims, keepdim))


@rule("aten.std.correction")
@on_a_scalar
def _std(t, x, dims=None, correction=None, keepdim=False):
    """``sqrt(var)``, kept whole (:data:`~.table.KEEP`): its gradient where the variance is 0
    (a constant row, one element) is 0, as PyTorch's ``std``; decomposed, ``sqrt``'s was NaN."""
    return _root(_var(t, x, dims, correction, keepdim))


@rule("aten.std_mean.correction")
@on_a_scalar
def _std_mean(t, x, dims=None, correction=None, keepdim=False):
    return (_std(t, x, dims, correction, keepdim), _mean(t, x, dims, keepdim))


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


RULES["aten.max.dim"] = on_a_scalar(_selecting("max"))


RULES["aten.min.dim"] = on_a_scalar(_selecting("min"))


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


RULES["aten.argmax.default"] = on_a_scalar(_arg_rule("argmax"))


RULES["aten.argmin.default"] = on_a_scalar(_arg_rule("argmin"))


@rule("aten.cumsum.default")
@on_a_scalar
def _cumsum(t, x, dim, dtype=None):
    if dtype is not None:
        x = _to_copy(t, x, dtype)
    return nn.cumsum(x, _axis(dim, x.ndim))


@rule("aten._softmax.default")
@on_a_scalar
def _softmax(t, x, dim, half_to_float=False):
    return nn.softmax(x, _axis(dim, x.ndim))


@rule("aten._log_softmax.default")
@on_a_scalar
def _log_softmax(t, x, dim, half_to_float=False):
    return nn.log_softmax(x, _axis(dim, x.ndim))


def _integers_as_int64(base: Callable) -> Callable:
    """``base`` with a bool or integer input other than int64 taken as int64, as ``torch.sum``
    and ``torch.prod`` take them (the sum of a mask counts its True); a ``dtype`` given is
    ``base``'s to apply (keyword-only in all four schemas)."""
    def apply(t, x, *args, **kwargs):
        if isinstance(x, Tensor) and kwargs.get("dtype") is None and not dtypes.is_float(x.dtype) and x.dtype != dtypes.INT64:
            x = dsl.compute(x.shape, lambda *i: dsl.cast(dtypes.INT64, x[i]), name="as_int64")
        return base(t, x, *args, **kwargs)
    return apply


for _n in ("aten.sum.dim_IntList", "aten.sum.default", "aten.prod.dim_int", "aten.prod.default"):
    RULES[_n] = _integers_as_int64(RULES[_n])
