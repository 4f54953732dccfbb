"""Elementwise rules: arithmetic, comparisons, logic, the float functions, activations, casts.

- ``add(a, b, alpha) = a + alpha * b``, ``sub(a, b, alpha) = a - alpha * b``,
  ``rsub(a, b, alpha) = b - alpha * a``, under numpy broadcasting.
- ``floor`` / ``ceil`` / ``trunc`` / ``round`` of an integer tensor is the tensor (gradient 0).
- ``atan2(a, b)`` has PyTorch's gradient 0 at the origin (``a = b = 0``), not ``0 / 0``.
- ``masked_fill(x, mask, v) = where(mask, v, x)``.
- ``hardswish`` / ``hardsigmoid`` are kept whole, with PyTorch's gradient at their kinks ``x = +-3``
  (and NaN for NaN).
- ``softplus`` is kept whole: its gradient is 1 where ``exp`` of the second piece would overflow;
  ``sinc`` too: its gradient at 0 is 0.
- ``pow(a, b)`` of two tensors (or of a number and a tensor) has PyTorch's gradients 0 where
  its formulas give ``0 * inf``: the exponent's where ``a = 0`` and ``b >= 0``, the base's where
  ``b = 0``.
- ``xlogy`` / ``special.xlog1py`` are kept whole, with PyTorch's gradient ``log(y)`` for ``x`` at
  ``x = 0`` (decomposed, 0).
- ``clamp`` by tensor bounds differentiates as PyTorch's (see :func:`_clamp_tensor`);
  ``bitwise_not`` of bools and integers, ``isnan``.
"""
from __future__ import annotations

import math

from ... import dsl, dtypes, nn
from ...errors import UserError
from ...ir import Tensor
from .table import RULES, _dtype, binary, rule, unary


for _n, _f in {"relu": nn.relu, "sigmoid": nn.sigmoid, "tanh": nn.tanh}.items():
    RULES[f"aten.{_n}.default"] = (lambda f: lambda t, x: f(x))(_f)


for _n, _f in {"exp": dsl.exp, "log": dsl.log, "sqrt": dsl.sqrt, "erf": dsl.erf, "sin": dsl.sin, "cos": dsl.cos,
               "log1p": dsl.log1p, "expm1": dsl.expm1, "rsqrt": lambda v: 1.0 / dsl.sqrt(v),
               "reciprocal": lambda v: 1.0 / v, "atan": dsl.atan, "asin": dsl.asin, "acos": dsl.acos}.items():
    rule(f"aten.{_n}.default", promote=True)(unary(_f, _n))


RULES["aten.neg.default"] = unary(lambda v: -v, "neg", floating=False)


RULES["aten.abs.default"] = unary(dsl.abs, "abs", floating=False)


@rule("aten.add.Tensor", "aten.add.Scalar", promote=True)
def _add(t, a, b, alpha=1):
    if alpha != 1:
        b = nn.multiply(b, alpha) if isinstance(b, Tensor) else b * alpha
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return a + b
    return nn.add(a, b)


@rule("aten.sub.Tensor", "aten.sub.Scalar", promote=True)
def _sub(t, a, b, alpha=1):
    if alpha != 1:
        b = nn.multiply(b, alpha) if isinstance(b, Tensor) else b * alpha
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return a - b
    return nn.subtract(a, b)


@rule("aten.rsub.Scalar", "aten.rsub.Tensor", promote=True)
def _rsub(t, a, b, alpha=1):
    return _sub(t, b, a, alpha)


@rule("aten.mul.Tensor", "aten.mul.Scalar", promote=True)
def _mul(t, a, b):
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return a * b
    return nn.multiply(a, b)


@rule("aten.div.Tensor", "aten.div.Scalar", promote=True)
def _div(t, a, b):
    for v in (a, b):
        if isinstance(v, Tensor) and not dtypes.is_float(v.dtype):
            raise UserError("integer true division is not translated")
    return nn.divide(a, b)


rule("aten.maximum.default", promote=True)(binary(dsl.maximum, "maximum"))


rule("aten.minimum.default", promote=True)(binary(dsl.minimum, "minimum"))


rule("aten.pow.Tensor_Scalar", promote=True)(binary(lambda a, b: a * a if b == 2 else dsl.pow(a, b), "pow"))


def _pow_of_tensors(u, v):
    """``u ** v`` with PyTorch's gradients where its formulas give ``0 * inf``: none for the
    exponent where ``u = 0`` and ``v >= 0`` (``log(0)`` times ``0 ** v``), none for the base where
    ``v = 0`` (``0 * u ** -1``). There the operand is read under ``stop_gradient``."""
    zero = dsl.const(0.0, u.dtype)
    base = dsl.if_then_else(v == zero, dsl.stop_gradient(u), u)
    power = dsl.if_then_else(dsl.all(u == zero, v >= zero), dsl.stop_gradient(v), v)
    return dsl.pow(base, power)


rule("aten.pow.Tensor_Tensor", promote=True)(binary(_pow_of_tensors, "pow"))


@rule("aten.clamp.default")
def _clamp(t, x, min=None, max=None):  # noqa: A002 - ATen's names
    return nn.clip(x, min, max)


@rule("aten.clamp.Tensor", promote=True)
def _clamp_tensor(t, x, min=None, max=None):  # noqa: A002 - ATen's names
    """``min(max(x, lo), hi)`` with bounds read from tensors (broadcast), as PyTorch computes and
    differentiates it: ``x``'s gradient where ``lo <= x <= hi``, ``lo``'s where ``x < lo < hi``,
    ``hi``'s where ``x > hi`` or ``lo > hi`` (the result then ``hi``), none where ``x < lo = hi``.
    The result is NaN where ``x`` or a bound is, the gradients those comparisons give."""
    lo, hi = min, max
    if lo is None and hi is None:
        raise UserError("clamp: at least one of min and max must be given")
    operands = [v for v in (x, lo, hi) if v is not None]
    shape = nn.elementwise.broadcast_shape("clamp", *[v.shape for v in operands if isinstance(v, Tensor)])
    read = nn.elementwise.broadcast_read

    def body(*i):
        v = read(x, i)
        a = read(lo, i) if lo is not None else None
        b = read(hi, i) if hi is not None else None
        # NaN where x or a bound is (added to the piece the comparisons pick, which keeps its gradient)
        nan = dsl.if_then_else(dsl.any(*[u != u for u in (v, a, b) if u is not None]),
                               dsl.const(float("nan"), v.dtype), dsl.const(0.0, v.dtype))
        if hi is None:
            return dsl.if_then_else(v >= a, v, dsl.if_then_else(v < a, a, dsl.stop_gradient(v))) + nan
        if lo is None:
            return dsl.if_then_else(v <= b, v, dsl.if_then_else(v > b, b, dsl.stop_gradient(v))) + nan
        return dsl.if_then_else(
            dsl.all(v >= a, v <= b), v, dsl.if_then_else(
                dsl.all(v < a, a < b), a, dsl.if_then_else(
                    dsl.any(v > b, a > b), b, dsl.stop_gradient(dsl.minimum(dsl.maximum(v, a), b))))) + nan
    return dsl.compute(shape, body, name="clamp")


@rule("aten.bitwise_not.default")
def _bitwise_not(t, x):
    """``not x`` of a bool tensor, ``-x - 1`` (two's complement) of an integer one."""
    if x.dtype == dtypes.BOOL:
        return dsl.compute(x.shape, lambda *i: dsl.logical_not(x[i]), name="bitwise_not")
    if dtypes.is_float(x.dtype):
        raise UserError(f"bitwise_not of a {x.dtype} tensor")
    return dsl.compute(x.shape, lambda *i: -x[i] - dsl.const(1, x.dtype), name="bitwise_not")


@rule("aten.isnan.default")
def _isnan(t, x):
    """``x != x`` (false for integers)."""
    if not dtypes.is_float(x.dtype):
        return dsl.compute(x.shape, lambda *i: dsl.const(0, x.dtype) != dsl.const(0, x.dtype), name="isnan")
    return dsl.compute(x.shape, lambda *i: x[i] != x[i], name="isnan")


@rule("aten.pow.Scalar", promote=True)
def _pow_scalar(t, base, x):
    """``base ** x`` of a number and a float tensor, with :func:`_pow_of_tensors`' gradients
    (none where ``base = 0`` and ``x >= 0``)."""
    if not isinstance(x, Tensor) or not dtypes.is_float(x.dtype):
        raise UserError(f"pow of the number {base!r} to a non-float tensor is not translated")
    return dsl.compute(x.shape, lambda *i: _pow_of_tensors(dsl.const(float(base), x.dtype), x[i]), name="pow")


@rule("aten.hardtanh.default")
def _hardtanh(t, x, min_val=-1.0, max_val=1.0):
    """``clamp(x, min_val, max_val)`` with PyTorch's gradient: 1 strictly inside the bounds, 0
    on them (``clamp``'s is 1 on them; ``relu6`` is ``hardtanh(x, 0, 6)``)."""
    lo, hi = dsl.const(float(min_val), x.dtype), dsl.const(float(max_val), x.dtype)
    return dsl.compute(x.shape, lambda *i: dsl.if_then_else(x[i] <= lo, lo, dsl.if_then_else(x[i] >= hi, hi, x[i])),
                       name="hardtanh")


@rule("aten.hardswish.default")
def _hardswish(t, x):
    """``x * relu6(x + 3) / 6`` by pieces, kept whole (:data:`~.table.KEEP`) for PyTorch's
    gradient at the kinks: 0 at ``x = -3``, 1 at ``x = 3`` (decomposed, ``-1/2`` and ``3/2``)."""
    three, zero = dsl.const(3.0, x.dtype), dsl.const(0.0, x.dtype)
    return dsl.compute(x.shape, lambda *i: dsl.if_then_else(  # NaN in the middle piece: NaN and its gradient
        x[i] <= -three, zero, dsl.if_then_else(x[i] >= three, x[i], x[i] * (x[i] + three) / 6.0)), name="hardswish")


@rule("aten.hardsigmoid.default")
def _hardsigmoid(t, x):
    """``relu6(x + 3) / 6`` by pieces, kept whole (:data:`~.table.KEEP`) for PyTorch's gradient
    at the kinks: 0 at ``x = -3`` and ``x = 3`` (decomposed, ``1/6``), and at NaN (the value NaN)."""
    three, zero, one = dsl.const(3.0, x.dtype), dsl.const(0.0, x.dtype), dsl.const(1.0, x.dtype)
    return dsl.compute(x.shape, lambda *i: dsl.if_then_else(  # NaN: NaN with gradient 0, as PyTorch's
        x[i] <= -three, zero, dsl.if_then_else(x[i] >= three, one, dsl.if_then_else(
            x[i] == x[i], x[i] / 6.0 + 0.5, dsl.stop_gradient(x[i])))), name="hardsigmoid")


@rule("aten.sinc.default", promote=True)
def _sinc(t, x):
    """``sin(pi x) / (pi x)``, 1 at ``x = 0``, kept whole (:data:`~.table.KEEP`): decomposed, the
    quotient was differentiated at 0 too (``0 / 0``, a NaN gradient where PyTorch's is 0). Here
    the quotient reads 1 there."""
    one = dsl.const(1.0, x.dtype)

    def body(*i):
        at_zero = x[i] == dsl.const(0.0, x.dtype)
        px = dsl.if_then_else(at_zero, one, x[i]) * math.pi
        return dsl.if_then_else(at_zero, one, dsl.sin(px) / px)
    return dsl.compute(x.shape, body, name="sinc")


def _times_log(log_fn, edge: float):
    """``x * log_fn(y)``, 0 where ``x = 0`` (and ``y`` is not NaN), with PyTorch's gradients:
    ``log_fn(y)`` for ``x`` (0 where ``x = 0`` and ``y <= edge``, the logarithm's domain's
    edge), ``x * log_fn'(y)`` for ``y`` (0 where ``x = 0``). Where ``x = 0`` the value is
    ``(x - stop_gradient(x)) * stop_gradient(log_fn(y))``, and the product reads ``y`` at a safe
    point there (decomposed, ``x = 0`` selected a constant 0: ``x``'s gradient was 0). At ``x = 0``
    and ``y`` on the edge (``0 / 0`` in PyTorch's ``y`` gradient, NaN) ``y``'s gradient is 0."""
    def fn(u, v):
        zero = dsl.const(0.0, u.dtype)
        at_zero = dsl.all(u == zero, v == v)
        inside = v > dsl.const(edge, v.dtype)
        safe = dsl.if_then_else(at_zero, dsl.const(edge + 1.0, v.dtype), v)
        slope = dsl.stop_gradient(dsl.if_then_else(inside, log_fn(dsl.if_then_else(inside, v, dsl.const(
            edge + 1.0, v.dtype))), zero))
        return dsl.if_then_else(at_zero, (u - dsl.stop_gradient(u)) * slope, u * log_fn(safe))
    return fn


rule("aten.xlogy.Tensor", promote=True)(binary(_times_log(dsl.log, 0.0), "xlogy"))
rule("aten.special_xlog1py.default", promote=True)(binary(_times_log(dsl.log1p, -1.0), "xlog1py"))


@rule("aten.softplus.default")
def _softplus(t, x, beta=1.0, threshold=20.0):
    """``x`` where ``beta x > threshold``, else ``log1p(exp(beta x)) / beta``, kept whole
    (:data:`~.table.KEEP`): decomposed, the second piece was also computed where the first is
    taken, and where ``exp`` overflows (``beta x`` above 88.7 in float32, 709.8 in float64) its
    gradient, ``0 * (inf / inf)``, was NaN where PyTorch's is 1. Here the second piece reads 0
    there."""
    beta, threshold = float(beta), float(threshold)

    def body(*i):
        z = x[i] * beta
        above = z > threshold
        inner = dsl.if_then_else(above, dsl.const(0.0, x.dtype), z)
        return dsl.if_then_else(above, x[i], dsl.log1p(dsl.exp(inner)) / beta)
    return dsl.compute(x.shape, body, name="softplus")


@rule("aten.leaky_relu.default")
def _leaky_relu(t, x, negative_slope=0.01):
    """``x`` where ``x > 0``, else ``negative_slope * x`` (at 0 the gradient is the slope, as PyTorch's)."""
    return nn.leaky_relu(x, float(negative_slope))


@rule("aten.elu.default")
def _elu(t, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """``scale * x`` where ``x > 0``, else ``scale * alpha * expm1(input_scale * x)`` (ELU, SELU and
    CELU; at 0 the gradient is the second branch's, as PyTorch's). CELU's ``input_scale`` is
    ``1 / alpha``, exact here; PyTorch's own CELU gradient rounds it to float32 (a relative
    difference of about 1e-8 in float64 where ``alpha`` is not a power of two)."""
    a, s, k = float(alpha), float(scale), float(input_scale)
    return dsl.compute(x.shape, lambda *i: dsl.if_then_else(x[i] > 0, x[i] * s, dsl.expm1(x[i] * k) * (s * a)),
                       name="elu")


@rule("aten.sign.default")
def _sign(t, x):
    """1, -1 or 0 by the sign of ``x`` (0 for NaN and for -0.0, as PyTorch); its gradient is 0."""
    if x.dtype == dtypes.BOOL:
        return x
    one, minus, zero = dsl.const(1, x.dtype), dsl.const(-1, x.dtype), dsl.const(0, x.dtype)
    return dsl.compute(x.shape, lambda *i: dsl.if_then_else(x[i] > 0, one, dsl.if_then_else(x[i] < 0, minus, zero)),
                       name="sign")


for _n, _f in {"floor": dsl.floor, "ceil": dsl.ceil, "trunc": dsl.trunc, "round": dsl.round}.items():
    # integers are their own floor (PyTorch returns them as they are); the gradient is 0
    RULES[f"aten.{_n}.default"] = (lambda f, n: lambda t, x: x if not dtypes.is_float(x.dtype) else
                                   dsl.compute(x.shape, lambda *i: f(x[i]), name=n))(_f, _n)


@rule("aten.where.self")
def _where(t, cond, a, b):
    return nn.where(cond, a, b)


for _n, _f in {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
               "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}.items():
    for _kind in ("Scalar", "Tensor"):
        RULES[f"aten.{_n}.{_kind}"] = (lambda f, n: lambda t, a, b: nn.elementwise._binary(
            n, f, a, b))(_f, _n)


@rule("aten.logical_not.default")
def _logical_not(t, x):
    return dsl.compute(x.shape, lambda *i: dsl.logical_not(x[i] != 0) if x.dtype != dtypes.BOOL
                       else dsl.logical_not(x[i]), name="logical_not")


@rule("aten.logical_and.default")
def _logical_and(t, a, b):
    return nn.elementwise._binary("logical_and", lambda x, y: dsl.all(x, y), a, b)


@rule("aten.logical_or.default")
def _logical_or(t, a, b):
    return nn.elementwise._binary("logical_or", lambda x, y: dsl.any(x, y), a, b)


@rule("aten.atan2.default", promote=True)
def _atan2(t, a, b):
    """``atan2(a, b)``, with PyTorch's gradient 0 at the origin (``a = b = 0``), not ``0 / 0``:
    there the value is read under ``stop_gradient`` and the differentiated one at (1, 1)."""
    def fn(u, v):
        origin = dsl.all(u == 0, v == 0)
        one = dsl.const(1.0, u.dtype)
        return dsl.if_then_else(origin, dsl.stop_gradient(dsl.atan2(u, v)),
                                dsl.atan2(dsl.if_then_else(origin, one, u), dsl.if_then_else(origin, one, v)))
    return nn.elementwise._binary("atan2", fn, a, b)


@rule("aten.gelu.default")
def _gelu(t, x, approximate="none"):
    return nn.gelu(x, approximate=approximate)


@rule("aten.silu.default")
def _silu(t, x):
    return nn.silu(x)


@rule("aten._to_copy.default")
def _to_copy(t, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    dt = _dtype(dtype, x.dtype)
    if dt == x.dtype:
        return x
    return dsl.compute(x.shape, lambda *i: dsl.cast(dt, x[i]), name="to_copy")


@rule("aten._assert_tensor_metadata.default")
def _assert_tensor_metadata(t, x, size=None, stride=None, dtype=None, device=None, layout=None):
    """The check ``torch.export`` puts before a dtype conversion (``.float()``, ``.to(dtype)``):
    ``x`` has the dtype recorded (and its shape, when one is given); no value."""
    want = _dtype(dtype, None)
    if isinstance(x, Tensor) and want is not None and want != x.dtype:
        raise UserError(f"tensor metadata: PyTorch recorded dtype {want}, te_grad has {x.dtype}")
    if isinstance(x, Tensor) and size is not None and len(size) != x.ndim:
        raise UserError(f"tensor metadata: PyTorch recorded rank {len(size)}, te_grad has {x.ndim}")
    return None


@rule("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(t, x, mask, value):
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise UserError(f"masked_fill: the fill value must be 0-d, got shape {list(value.shape)}")
        value = dsl.compute(value.shape, lambda: dsl.cast(x.dtype, value[()]), name="masked_fill_value")
    return nn.where(mask, value, x)
