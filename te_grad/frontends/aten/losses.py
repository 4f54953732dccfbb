"""Loss operators, as modules returning their loss give them.

- ``nll_loss_forward(x, y, weight, reduction, ignore_index)``: ``-w[y_n] * x[n, y_n]`` for the
  rows with ``y_n != ignore_index``; ``mean`` divides by the sum of those rows' weights
  (``total_weight``, the second result; 0 under ``none``), ``sum`` does not, ``none`` keeps the rows.
- ``mse_loss(x, y, reduction)``: ``(x - y)^2`` elementwise, reduced by mean or sum.
- ``binary_cross_entropy(x, y, weight, reduction)``: ``-w (y max(log x, -100) + (1 - y)
  max(log1p(-x), -100))``, kept whole with PyTorch's gradient ``w (x - y) / max(x (1 - x), eps)``
  for ``x`` and ``log1p(-x) - log(x)`` for ``y``: decomposed, the derivative of the clamped
  logarithms was NaN at ``x = 0`` and ``x = 1`` (a float32 sigmoid saturates to 1 above about 17)
  and 0 where a logarithm is clamped (``eps`` is 1e-12 rounded to float32, as PyTorch's).
"""
from __future__ import annotations

import numpy as np

from ... import dsl, dtypes
from ...errors import UserError
from ...ir import Tensor
from ...sizes import same_shape
from .table import is_int, rule


_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _reduction(op: str, reduction) -> str:
    if reduction not in _REDUCTIONS:
        raise UserError(f"{op}: reduction {reduction!r} is not 0 (none), 1 (mean) or 2 (sum)")
    return _REDUCTIONS[reduction]


def _reduce_all(op, shape, term, how, divide_by=None):
    if how == "none":
        return dsl.compute(shape, lambda *i: term(i), name=op)
    axes = [dsl.reduce_axis((0, n), f"r{d}") for d, n in enumerate(shape)]
    if axes:
        total = dsl.compute((), lambda: dsl.sum(term(tuple(axes)), axis=axes), name=op + "_sum")
    else:
        total = dsl.compute((), lambda: term(()), name=op + "_sum")
    if how == "sum":
        return total
    if divide_by is None:
        count = 1
        for n in shape:
            count = count * n
        divide_by = count
    if isinstance(divide_by, Tensor):
        return dsl.compute((), lambda: total[()] / divide_by[()], name=op)
    if is_int(divide_by):
        return dsl.compute((), lambda: total[()] * (1.0 / max(divide_by, 1)), name=op)
    return dsl.compute((), lambda: total[()] / dsl.cast(total.dtype, divide_by), name=op)


@rule("aten.mse_loss.default")
def _mse_loss(t, x, y, reduction=1):
    how = _reduction("mse_loss", reduction)
    if isinstance(y, Tensor) and not same_shape(tuple(x.shape), tuple(y.shape)):
        raise UserError(f"mse_loss: input shape {list(x.shape)} and target shape {list(y.shape)} differ")

    def term(i):
        diff = x[i] - y[i]
        return diff * diff
    return _reduce_all("mse_loss", x.shape, term, how)


#: the least ``x (1 - x)`` PyTorch's gradient of ``binary_cross_entropy`` divides by: 1e-12
#: rounded to float32 (PyTorch's constant is a float), 9.99999996e-13
_BCE_EPSILON = float(np.float32(1e-12))


@rule("aten.binary_cross_entropy.default")
def _binary_cross_entropy(t, x, y, weight=None, reduction=1):
    """The loss of the clamped logarithms of ``x``, read under ``stop_gradient`` with ``y``, plus
    ``stop_gradient(d) * (x - stop_gradient(x))`` and ``stop_gradient(e) * (y - stop_gradient(y))``
    (0 for finite ``x`` and ``y``), with ``d = (x - y) / max(x (1 - x), eps)`` and ``e = log1p(-x) -
    log(x)``, PyTorch's derivatives: the gradient of ``x`` is ``d``, that of ``y`` is ``e`` (times
    the weight). Where ``x`` is exactly 0 or 1, PyTorch's ``e`` is infinite; here it is the
    difference of the clamped logarithms, +-100."""
    how = _reduction("binary_cross_entropy", reduction)
    for what, v in (("target", y), ("weight", weight)):
        if isinstance(v, Tensor) and not same_shape(tuple(x.shape), tuple(v.shape)):
            raise UserError(f"binary_cross_entropy: input shape {list(x.shape)} and {what} shape "
                            f"{list(v.shape)} differ")
    if not isinstance(y, Tensor):
        raise UserError("binary_cross_entropy: the target must be a tensor")
    one, clamp = dsl.const(1.0, x.dtype), dsl.const(-100.0, x.dtype)

    def term(i):
        p, q = x[i], y[i]
        fixed, target = dsl.stop_gradient(p), dsl.stop_gradient(q)
        log_p = dsl.maximum(dsl.log(fixed), clamp)
        log_q = dsl.maximum(dsl.log1p(-fixed), clamp)
        slope = dsl.stop_gradient((p - q) / dsl.maximum(p * (one - p), dsl.const(_BCE_EPSILON, x.dtype)))
        logit = dsl.log1p(-fixed) - dsl.log(fixed)
        finite = dsl.abs(logit) < dsl.const(float("inf"), x.dtype)
        odds = dsl.stop_gradient(dsl.if_then_else(finite, logit, log_q - log_p))
        loss = -(target * log_p + (one - target) * log_q) + slope * (p - fixed) + odds * (q - target)
        return loss * weight[i] if isinstance(weight, Tensor) else loss
    return _reduce_all("binary_cross_entropy", x.shape, term, how)


@rule("aten.nll_loss_forward.default")
def _nll_loss_forward(t, x, target, weight, reduction, ignore_index):
    how = _reduction("nll_loss", reduction)
    if x.ndim not in (1, 2):
        raise UserError(f"nll_loss: input of rank {x.ndim} (only (N, C) and (C,) are translated)")
    if x.ndim == 1:
        rows, read = (), (lambda i: x[target[()]])
        tgt = lambda i: target[()]  # noqa: E731
    else:
        rows, read = (x.shape[0],), (lambda i: x[i[0], target[i[0]]])
        tgt = lambda i: target[i[0]]  # noqa: E731
    zero = dsl.const(0.0, x.dtype)

    def w(i):
        keep = dsl.cast(dtypes.INT64, tgt(i)) != ignore_index
        if weight is None:
            return dsl.if_then_else(keep, dsl.const(1.0, x.dtype), zero)
        return dsl.if_then_else(keep, weight[tgt(i)], zero)

    def term(i):
        keep = dsl.cast(dtypes.INT64, tgt(i)) != ignore_index
        value = -read(i) if weight is None else -read(i) * weight[tgt(i)]
        # the target of an ignored row may be out of range: it is never read there
        return dsl.if_then_else(keep, value, zero)
    if how == "none":   # PyTorch's total_weight is 0 without a reduction
        total_weight = dsl.compute((), lambda: zero, name="nll_loss_total_weight")
    elif rows:
        r = dsl.reduce_axis((0, rows[0]), "r")
        total_weight = dsl.compute((), lambda: dsl.sum(w((r,)), axis=r), name="nll_loss_total_weight")
    else:
        total_weight = dsl.compute((), lambda: w(()), name="nll_loss_total_weight")
    if how == "mean":
        out = _reduce_all("nll_loss", rows, term, "sum")
        out = dsl.compute((), lambda: out[()] / total_weight[()], name="nll_loss")
    else:
        out = _reduce_all("nll_loss", rows, term, how)
    return (out, total_weight)
