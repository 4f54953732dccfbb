"""Loss functions; each returns a 0-d tensor (shape ``()``) holding the mean loss."""
from __future__ import annotations

from .. import dsl
from ..errors import UserError
from ..ir import Tensor
from ..sizes import same_shape
from ._util import check_float, check_int_dtype, check_tensor, compute, prod, reciprocal, reduce, reduce_axes

__all__ = ["mse_loss", "binary_cross_entropy", "softmax_cross_entropy", "cross_entropy"]

#: lower clamp of the logarithms in binary_cross_entropy, as in PyTorch's BCELoss
LOG_CLAMP = -100.0


def _same_shape(op: str, a: Tensor, b: Tensor, what_a: str, what_b: str):
    check_tensor(op, a, what_a)
    check_tensor(op, b, what_b)
    check_float(op, a, what_a)
    check_float(op, b, what_b)
    if not same_shape(a.shape, b.shape):  # size expressions (tg.var) compare structurally
        raise UserError(f"{op}: {what_a} {a.name} has shape {list(a.shape)} but {what_b} "
                        f"{b.name} has shape {list(b.shape)}")
    if a.size == 0:
        raise UserError(f"{op}: {what_a} {a.name} is empty (shape {list(a.shape)})")


def _mean(op: str, shape, term) -> Tensor:
    """``mean_idx term(idx)`` over ``shape`` as one 0-d reduction."""
    idx, axes = reduce_axes(shape, [f"r{d}" for d in range(len(shape))])
    def body(_):
        value = term(tuple(idx))
        return reduce("sum", value * reciprocal(prod(shape), value.dtype), axes)
    return compute((), body, name=op)


def mse_loss(pred: Tensor, target: Tensor) -> Tensor:
    """The mean squared error ``mean((pred - target)**2)`` over all elements, as a 0-d tensor.

    ``pred`` and ``target`` are float tensors of the same shape.
    """
    op = "mse_loss"
    _same_shape(op, pred, target, "pred", "target")

    def term(idx):
        d = pred[idx] - target[idx]
        return d * d

    return _mean(op, pred.shape, term)


def binary_cross_entropy(prob: Tensor, target: Tensor) -> Tensor:
    """The mean binary cross entropy of probabilities, as a 0-d tensor (PyTorch's ``BCELoss``).

    ``mean(-(target * log(prob) + (1 - target) * log(1 - prob)))`` over all
    elements, with each logarithm clamped below at -100 as PyTorch does, so a
    probability of exactly 0 or 1 gives a finite loss. ``prob`` and ``target``
    are float tensors of the same shape with values in [0, 1].
    """
    op = "binary_cross_entropy"
    _same_shape(op, prob, target, "prob", "target")

    def term(idx):
        p, t = prob[idx], target[idx]
        log_p = dsl.maximum(dsl.log(p), LOG_CLAMP)
        log_q = dsl.maximum(dsl.log(1.0 - p), LOG_CLAMP)
        return -(t * log_p + (1.0 - t) * log_q)

    return _mean(op, prob.shape, term)


def softmax_cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """The mean cross entropy of ``softmax(logits)`` against integer class labels, 0-d.

    ``logits`` is (N, C) float and ``labels`` (N,) int32/int64 with values in
    [0, C). With ``m[n] = max_c logits[n, c]`` (``softmax_cross_entropy_max``) and
    ``s[n] = sum_c exp(logits[n, c] - m[n])`` (``softmax_cross_entropy_sum``), the
    loss is ``mean_n(m[n] + log(s[n]) - logits[n, labels[n]])``, i.e. PyTorch's
    ``cross_entropy`` with mean reduction, computed without overflow. The loss does
    not depend on the shift ``m`` (its total derivative is zero): its reads are
    wrapped in ``stop_gradient``.
    """
    op = "softmax_cross_entropy"
    check_tensor(op, logits, "logits", ndim=2)
    check_float(op, logits, "logits")
    check_tensor(op, labels, "labels", ndim=1)
    check_int_dtype(op, labels, "labels")
    n, c = logits.shape
    if labels.shape[0] != n:
        raise UserError(f"{op}: labels {labels.name} has {labels.shape[0]} entries but logits "
                        f"{logits.name} has {n} rows")
    if n == 0 or c == 0:
        raise UserError(f"{op}: logits {logits.name} is empty (shape {list(logits.shape)})")
    k = dsl.reduce_axis((0, c), name="k")
    mx = dsl.compute((n,), lambda i: dsl.max(logits[i, k], axis=k), name=op + "_max")
    k = dsl.reduce_axis((0, c), name="k")
    s = dsl.compute((n,), lambda i: dsl.sum(dsl.exp(logits[i, k] - dsl.stop_gradient(mx[i])), axis=k),
                    name=op + "_sum")
    return _mean(op, (n,), lambda idx: dsl.stop_gradient(mx[idx]) + dsl.log(s[idx]) - logits[idx[0], labels[idx]])


def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """The mean cross entropy of ``softmax(logits)`` against dense targets, 0-d (PyTorch's
    ``cross_entropy`` with class probabilities as the target).

    ``logits`` and ``target`` are (N, C) floats, each row of ``target`` a distribution over the
    classes (label smoothing, soft labels). The loss is
    ``mean_n sum_c target[n, c] * (m[n] + log(s[n]) - logits[n, c])`` with ``m`` the row maximum
    (``cross_entropy_max``, a shift the loss does not depend on) and
    ``s[n] = sum_c exp(logits[n, c] - m[n])`` (``cross_entropy_sum``).
    """
    op = "cross_entropy"
    _same_shape(op, logits, target, "logits", "target")
    check_tensor(op, logits, "logits", ndim=2)
    n, c = logits.shape
    k = dsl.reduce_axis((0, c), name="k")
    mx = dsl.compute((n,), lambda i: dsl.max(logits[i, k], axis=k), name=op + "_max")
    k = dsl.reduce_axis((0, c), name="k")
    s = dsl.compute((n,), lambda i: dsl.sum(dsl.exp(logits[i, k] - dsl.stop_gradient(mx[i])), axis=k),
                    name=op + "_sum")
    return _mean(op, (n,), lambda idx: _row_term(logits, target, mx, s, idx[0], c))


def _row_term(logits, target, mx, s, i, c):
    k = dsl.reduce_axis((0, c), name="c")
    lse = dsl.stop_gradient(mx[i]) + dsl.log(s[i])
    return dsl.sum(target[i, k] * (lse - logits[i, k]), axis=k)
