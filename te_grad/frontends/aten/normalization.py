"""Normalization: batch, layer and group norm.

- ``_native_batch_norm_legit_functional(x, w, b, rm, rv, training, momentum, eps)``: with the
  batch mean ``m`` and biased variance ``v`` over every axis but 1, ``out = (x - m) /
  sqrt(v + eps) * w + b``; the running statistics become ``(1 - momentum) * rm + momentum *
  m`` and ``(1 - momentum) * rv + momentum * v * n / (n - 1)`` (``n`` the count per channel,
  a size expression under a symbolic batch), as PyTorch updates them, under
  ``stop_gradient`` (PyTorch updates the buffers in place without recording them: a model
  reading ``running_mean`` after the update gets no gradient through it). The saved mean and
  inverse standard deviation (results 1 and 2) are under ``stop_gradient`` too: PyTorch's
  derivative of batch norm reads the gradient of its output alone.
- ``native_group_norm(x, w, b, N, C, HW, G, eps)``: each sample's channels in ``G`` groups, each
  group normalized over its channels and positions by its mean and biased variance, then
  ``* w[c] + b[c]``.
"""
from __future__ import annotations

from ... import dsl, nn
from ...errors import UserError
from .table import is_int, rule


@rule("aten.native_group_norm.default")
def _group_norm(t, x, w, b, n, c, hw, group, eps):
    """Group normalization: the channels of each sample in ``group`` groups, each group
    normalized over its channels and positions by its mean and biased variance, then
    ``* w[c] + b[c]``. Returns ``(out, mean, rstd)``, the statistics of shape ``(N, group)``."""
    group = int(group)
    channels = x.shape[1]
    if not is_int(channels) or channels % group:
        raise UserError(f"group_norm: {channels} channels in {group} groups")
    per = channels // group
    rows = nn.reshape(x, (x.shape[0], group, -1), name="group_norm_rows")
    mean, var = nn.mean(rows, (2,)), nn.variance(rows, (2,))
    rstd = dsl.compute(var.shape, lambda i, g: 1.0 / dsl.sqrt(var[i, g] + eps), name="group_norm_rstd")

    def body(*i):
        v = (x[i] - mean[i[0], i[1] // per]) * rstd[i[0], i[1] // per]
        if w is not None:
            v = v * w[i[1]]
        if b is not None:
            v = v + b[i[1]]
        return v
    return (dsl.compute(x.shape, body, name="group_norm"), mean, rstd)


def _batch_stats(x):
    axes = tuple(d for d in range(x.ndim) if d != 1)
    return nn.mean(x, axes), nn.variance(x, axes)


def _normalized(x, mean, var, w, b, eps):
    def body(*i):
        c = i[1]
        v = (x[i] - mean[c]) / dsl.sqrt(var[c] + eps)
        if w is not None:
            v = v * w[c]
        if b is not None:
            v = v + b[c]
        return v
    return dsl.compute(x.shape, body, name="batch_norm")


@rule("aten._native_batch_norm_legit_functional.default")
def _bn_functional(t, x, w, b, rm, rv, training, momentum, eps):
    if not training:
        out = _normalized(x, rm, rv, w, b, eps)
        return (out, None, None, rm, rv)
    mean, var = _batch_stats(x)
    out = _normalized(x, mean, var, w, b, eps)
    n = 1
    for d in range(x.ndim):
        if d != 1:
            n = n * x.shape[d]
    if is_int(n):
        unbias = n / max(n - 1, 1)
    else:
        unbias = dsl.cast(x.dtype, n) / dsl.cast(x.dtype, dsl.maximum(n - 1, 1))
    m = momentum
    # the new running statistics are buffers PyTorch updates in place under no_grad: a model that
    # reads one after the update gets no gradient through it (stop_gradient), as in PyTorch
    new_rm = dsl.compute(rm.shape, lambda c: dsl.stop_gradient((1.0 - m) * rm[c] + m * mean[c]),
                         name="running_mean_new")
    new_rv = dsl.compute(rv.shape, lambda c: dsl.stop_gradient((1.0 - m) * rv[c] + (m * unbias) * var[c]),
                         name="running_var_new")
    rstd = dsl.compute(var.shape, lambda c: dsl.stop_gradient(1.0 / dsl.sqrt(var[c] + eps)), name="batch_norm_rstd")
    return (out, _saved_mean(mean), rstd, new_rm, new_rv)


def _saved_mean(mean):
    """Batch norm's ``save_mean`` result: the batch mean, under ``stop_gradient`` as the saved
    statistics are in PyTorch (its derivative formula reads the gradient of the output alone)."""
    return dsl.compute(mean.shape, lambda c: dsl.stop_gradient(mean[c]), name="batch_norm_mean")


@rule("aten._native_batch_norm_legit_no_training.default")
def _bn_eval(t, x, w, b, rm, rv, momentum, eps):
    return (_normalized(x, rm, rv, w, b, eps), None, None)


@rule("aten._native_batch_norm_legit.no_stats")
def _bn_no_stats(t, x, w, b, training, momentum, eps):
    mean, var = _batch_stats(x)
    return (_normalized(x, mean, var, w, b, eps), _saved_mean(mean), None)


@rule("aten.native_layer_norm.default")
def _layer_norm(t, x, normalized_shape, w, b, eps):
    k = len(normalized_shape)
    out = nn.layer_norm(x, w, b, axis=tuple(range(x.ndim - k, x.ndim)), eps=eps)
    return (out, None, None)
