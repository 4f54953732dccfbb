"""Activations: elementwise nonlinearities and the (log-)softmax along an axis."""
from __future__ import annotations

import math

from .. import dsl
from ..errors import UserError
from ..ir import Tensor
from ..sizes import same_shape
from ._util import check_float, check_tensor, compute, normalize_axis, size_text

__all__ = ["relu", "leaky_relu", "sigmoid", "tanh", "gelu", "silu", "swiglu", "softmax", "log_softmax"]


def _elementwise(op: str, x: Tensor, fn) -> Tensor:
    check_tensor(op, x, "input")
    check_float(op, x)
    return compute(x.shape, lambda idx: fn(x[idx]), name=op)


def relu(x: Tensor) -> Tensor:
    """``max(x, 0)`` elementwise; same shape as ``x``.

    Written ``0 if x <= 0 else x``: its derivative at exactly 0 is 0, as in PyTorch, JAX's
    ``jax.nn.relu`` and TVM (``tg.maximum(x, 0)`` would split a tie and give 0.5), and a
    NaN stays NaN."""
    return _elementwise("relu", x, lambda v: dsl.if_then_else(v <= 0.0, dsl.const(0.0, v.dtype), v))


def leaky_relu(x: Tensor, alpha: float = 0.01) -> Tensor:
    """``x`` where ``x > 0``, else ``alpha * x``, elementwise; same shape as ``x``."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise UserError(f"leaky_relu: alpha must be a number, got {alpha!r}")
    return _elementwise("leaky_relu", x, lambda v: dsl.if_then_else(v > 0.0, v, v * float(alpha)))


def sigmoid(x: Tensor) -> Tensor:
    """The logistic function ``1 / (1 + exp(-x))`` elementwise; same shape as ``x``."""
    return _elementwise("sigmoid", x, dsl.sigmoid)


def tanh(x: Tensor) -> Tensor:
    """The hyperbolic tangent elementwise; same shape as ``x``."""
    return _elementwise("tanh", x, dsl.tanh)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """The GELU elementwise; same shape as ``x``, as PyTorch's ``F.gelu(x, approximate)``.

    ``approximate="none"`` (the default) is the exact ``0.5 * x * (1 + erf(x / sqrt(2)))``;
    ``approximate="tanh"`` is ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))``."""
    if approximate == "none":
        inv_sqrt2 = 1.0 / math.sqrt(2.0)

        def exact(v):  # h + h erf(...): one fused multiply-add, where h (1 + erf) is two roundings
            h = 0.5 * v
            return h + h * dsl.erf(v * inv_sqrt2)
        return _elementwise("gelu", x, exact)
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return _elementwise("gelu", x, lambda v: 0.5 * v * (1.0 + dsl.tanh(c * (v + 0.044715 * (v * v * v)))))
    raise UserError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def silu(x: Tensor) -> Tensor:
    """The SiLU (swish) ``x * sigmoid(x)`` elementwise; same shape as ``x`` (PyTorch's ``F.silu``)."""
    return _elementwise("silu", x, lambda v: v * dsl.sigmoid(v))


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """The SwiGLU gating ``silu(gate) * up`` elementwise (the Llama MLP's ``act(w1 x) * w3 x``).

    ``gate`` and ``up`` must have the same shape and dtype; the result has it too."""
    op = "swiglu"
    check_tensor(op, gate, "gate")
    check_tensor(op, up, "up")
    check_float(op, gate, "gate")
    check_float(op, up, "up")
    if not same_shape(gate.shape, up.shape) or gate.dtype != up.dtype:
        raise UserError(f"{op}: gate {gate.name} {gate.dtype}{size_text(gate.shape)} and up {up.name} "
                        f"{up.dtype}{size_text(up.shape)} must have the same shape and dtype")
    return compute(gate.shape, lambda idx: gate[idx] * dsl.sigmoid(gate[idx]) * up[idx], name=op)


def _reduced(x: Tensor, axis: int):
    """Shape of ``x`` without ``axis``, and a function putting an index back at ``axis``."""
    shape = x.shape[:axis] + x.shape[axis + 1:]

    def full(idx, k):
        return tuple(idx[:axis]) + (k,) + tuple(idx[axis:])

    return shape, full


def _softmax_parts(op: str, x: Tensor, axis):
    """The max along ``axis`` (``<op>_max``) and helpers shared by softmax and log_softmax.

    The max is only a shift that keeps ``exp`` from overflowing: the result does not
    depend on it (its total derivative is exactly zero), so its reads are wrapped in
    ``stop_gradient`` and the gradient never differentiates the max (as in JAX)."""
    check_tensor(op, x, "input")
    check_float(op, x)
    if x.ndim == 0:
        raise UserError(f"{op}: input {x.name} is 0-d; it needs an axis to normalize over")
    axis = normalize_axis(op, axis, x.ndim)
    if x.shape[axis] == 0:
        raise UserError(f"{op}: axis {axis} of {x.name} is empty (shape {list(x.shape)})")
    shape, full = _reduced(x, axis)
    k = dsl.reduce_axis((0, x.shape[axis]), name="k")
    mx = compute(shape, lambda idx: dsl.max(x[full(idx, k)], axis=k), name=op + "_max")
    return axis, shape, full, mx


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``axis``; same shape as ``x``.

    Numerically stable: ``softmax_max`` is the maximum along the axis,
    ``softmax_exp = exp(x - max)``, ``softmax_sum`` its sum along the axis and the
    result ``softmax_exp / softmax_sum``.
    """
    op = "softmax"
    axis, shape, full, mx = _softmax_parts(op, x, axis)
    e = compute(x.shape, lambda idx: dsl.exp(x[idx] - dsl.stop_gradient(mx[idx[:axis] + idx[axis + 1:]])),
                name=op + "_exp")
    k = dsl.reduce_axis((0, x.shape[axis]), name="k")
    s = compute(shape, lambda idx: dsl.sum(e[full(idx, k)], axis=k), name=op + "_sum")
    return compute(x.shape, lambda idx: e[idx] / s[idx[:axis] + idx[axis + 1:]], name=op)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``x - log(sum(exp(x)))`` along ``axis``; same shape as ``x``.

    Numerically stable: ``log_softmax_max`` is the maximum ``m`` along the axis,
    ``log_softmax_sum = sum(exp(x - m))`` and the result ``x - m - log(sum)``.
    """
    op = "log_softmax"
    axis, shape, full, mx = _softmax_parts(op, x, axis)
    k = dsl.reduce_axis((0, x.shape[axis]), name="k")
    s = compute(shape, lambda idx: dsl.sum(dsl.exp(x[full(idx, k)] - dsl.stop_gradient(mx[idx])), axis=k),
                name=op + "_sum")

    def body(idx):
        r = idx[:axis] + idx[axis + 1:]
        return x[idx] - dsl.stop_gradient(mx[r]) - dsl.log(s[r])

    return compute(x.shape, body, name=op)

