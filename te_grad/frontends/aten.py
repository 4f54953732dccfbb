"""The ATen operator table: one rule per operator, mapping it onto te_grad tensors.

``RULES["aten.relu.default"]`` is a function ``rule(t, *args, **kwargs)`` of the
:class:`~te_grad.frontends.translate.Translator` ``t`` and the node's arguments with te_grad
values substituted (tensors, numbers, size expressions, lists of them); it returns the node's
value. Rules use ``te_grad.nn`` where an operator exists there and the DSL otherwise, and
follow PyTorch's semantics (the translator checks every result's rank, extents and dtype
against the captured program's). The operators are those of PyTorch's core ATen opset after
``torch.export``'s decompositions, plus the few composite ones kept whole
(:data:`KEEP`), because te_grad has a better form of them than their decomposition.
Arithmetic and the float functions (``rule(..., promote=True)``) first cast integer and
boolean tensor operands to the float dtype PyTorch recorded for the result: an int64 tensor
times a Python float is float64 under ``torch.set_default_dtype(torch.float64)``, not float32
widened after.

Math of the less obvious rules:

- ``_native_batch_norm_legit_functional(x, w, b, rm, rv, training, momentum, eps)``: with the
  batch mean ``m`` and biased variance ``v`` over every axis but 1, ``out = (x - m) /
  sqrt(v + eps) * w + b``; the running statistics become ``(1 - momentum) * rm + momentum *
  m`` and ``(1 - momentum) * rv + momentum * v * n / (n - 1)`` (``n`` the count per channel,
  a size expression under a symbolic batch), as PyTorch updates them, under
  ``stop_gradient`` (PyTorch updates the buffers in place without recording them: a model
  reading ``running_mean`` after the update gets no gradient through it). The saved mean and
  inverse standard deviation (results 1 and 2) are under ``stop_gradient`` too: PyTorch's
  derivative of batch norm reads the gradient of its output alone.
- ``native_dropout(x, p, train)``: ``x / (1 - p)`` where a hash of the element's position
  and the step's seed (``Context.seed``, an input of the training step) falls below ``1 -
  p``, else 0; the identity when ``train`` is false. The mask is te_grad's, not PyTorch's
  generator's (the same law, other draws). A dropout that stays on in evaluation mode
  (``F.dropout(x, p, training=True)``) is refused: a prediction has no seed. ``bernoulli(x,
  p)`` (``Dropout2d``'s mask per channel, drawn into an ``empty`` tensor, whose values are
  zeros here) draws the same way.
- ``detach(x)``: ``x`` with ``stop_gradient``; kept out of the decomposition, which makes
  it an ``alias`` (the identity, its gradient's stop lost). The results of a
  ``torch.no_grad()`` block are detached before the decomposition inlines the block.
- ``addmm(c, a, b, beta, alpha) = beta * c + alpha * (a @ b)``.
- ``linear(x, w, b)[..., n] = sum_k x[..., k] * w[n, k] + b[n]`` over every leading axis of ``x``
  (kept whole: :func:`te_grad.frontends.views.linear`); a ``view`` that flattens ``x``'s leading axes
  into rows before it and one that restores them after are folded away by the translator
  (:func:`te_grad.frontends.translate.linear_folds`).
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Callable, Dict

import numpy as np

from .. import dsl, dtypes, nn
from ..errors import UserError
from ..ir import Tensor
from ..train.layers import bernoulli, dropout
from ..sizes import same_shape
from .translate import dtype_of
from .views import contraction, linear

#: operator name -> rule
RULES: Dict[str, Callable] = {}

#: composite operators ``torch.export`` keeps whole (not decomposed) because a rule here covers them
KEEP = ("aten.scaled_dot_product_attention.default", "aten.linear.default", "aten.roll.default",
        "aten.detach.default")  # decomposed, ``detach`` is ``alias``: its gradient's stop lost

#: PyTorch's "index to the end" (``x[2:]`` slices to ``sys.maxsize``)
_END = 2 ** 62


def rule(*names: str, promote: bool = False):
    """Register the decorated function as the rule of each operator in ``names``; with
    ``promote`` (arithmetic and the float functions), its integer and boolean tensor operands
    are first cast to the float dtype PyTorch recorded (:func:`_promoted`)."""
    def deco(fn):
        for n in names:
            if n in RULES:
                raise RuntimeError(f"two rules for {n}")
            RULES[n] = _promoted(fn) if promote else fn
        return fn
    return deco


def _promoted(rule_fn: Callable) -> Callable:
    """``rule_fn`` with its integer and boolean tensor operands first cast to the float dtype
    PyTorch recorded for the node's result: PyTorch gives an integer tensor times a Python
    float the default dtype (float64 after ``torch.set_default_dtype``), where te_grad's own
    promotion would compute it in float32 and the result be widened after."""
    def apply(t, *args, **kw):
        val = getattr(getattr(t, "node", None), "meta", {}).get("val")
        want = dtype_of(getattr(val, "dtype", None))
        if want is not None and dtypes.is_float(want):
            args = [dsl.compute(a.shape, lambda *i, a=a: dsl.cast(want, a[i]), name="to_float")
                    if isinstance(a, Tensor) and not dtypes.is_float(a.dtype) else a for a in args]
        return rule_fn(t, *args, **kw)
    return apply


# -- helpers -----------------------------------------------------------------------------------
def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _axis(d, ndim: int) -> int:
    if not is_int(d):
        raise UserError(f"dimension {d!r} is not an int")
    d = int(d)
    if not -max(ndim, 1) <= d < max(ndim, 1):
        raise UserError(f"dimension {d} is out of range for a tensor of rank {ndim}")
    return d % max(ndim, 1)


def _axes(dims, ndim: int):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(ndim))
    if is_int(dims):
        dims = [dims]
    return tuple(sorted({_axis(d, ndim) for d in dims}))


def _float(x: Tensor) -> str:
    return x.dtype if dtypes.is_float(x.dtype) else dtypes.FLOAT32


def unary(fn: Callable, name: str, floating: bool = True):
    """A rule applying ``fn`` elementwise (integers converted to float32 first when ``floating``)."""
    def apply(t, x):
        if not isinstance(x, Tensor):
            raise UserError(f"{name}: expected a tensor, got {x!r}")
        if floating and not dtypes.is_float(x.dtype):
            return dsl.compute(x.shape, lambda *i: fn(dsl.cast(dtypes.FLOAT32, x[i])), name=name)
        return dsl.compute(x.shape, lambda *i: fn(x[i]), name=name)
    return apply


def binary(fn: Callable, name: str):
    """A rule applying ``fn`` to two operands (tensors or numbers) under numpy broadcasting."""
    def apply(t, a, b, **kw):
        return nn.elementwise._binary(name, fn, a, b)
    return apply


# -- elementwise -------------------------------------------------------------------------------
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
rule("aten.pow.Tensor_Tensor", promote=True)(binary(dsl.pow, "pow"))


@rule("aten.clamp.default")
def _clamp(t, x, min=None, max=None):  # noqa: A002 - ATen's names
    return nn.clip(x, min, max)


@rule("aten.hardtanh.default")
def _hardtanh(t, x, min_val=-1.0, max_val=1.0):
    """``clamp(x, min_val, max_val)`` with PyTorch's gradient: 1 strictly inside the bounds, 0
    on them (``clamp``'s is 1 on them; ``relu6`` is ``hardtanh(x, 0, 6)``)."""
    lo, hi = dsl.const(float(min_val), x.dtype), dsl.const(float(max_val), x.dtype)
    return dsl.compute(x.shape, lambda *i: dsl.if_then_else(x[i] <= lo, lo, dsl.if_then_else(x[i] >= hi, hi, x[i])),
                       name="hardtanh")


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


@rule("aten.sym_size.int")
def _sym_size(t, x, dim):
    return x.shape[_axis(dim, x.ndim)]


@rule("aten.sym_numel.default")
def _sym_numel(t, x):
    n = 1
    for s in x.shape:
        n = n * s
    return n


# -- constants ---------------------------------------------------------------------------------
def _dtype(dtype, default=dtypes.FLOAT32) -> str:
    from .translate import dtype_of
    got = dtype_of(dtype)
    return got if got is not None else default


@rule("aten.full.default")
def _full(t, size, value, dtype=None, layout=None, device=None, pin_memory=None):
    dt = _dtype(dtype, dtypes.FLOAT32 if isinstance(value, float) else dtypes.INT64)
    return dsl.compute(tuple(size), lambda *i: dsl.const(value, dt), name="full")


@rule("aten.empty.memory_format")
def _empty(t, size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """A tensor whose values PyTorch leaves undefined (``Dropout2d`` draws its mask into one):
    zeros here."""
    return _full(t, size, 0.0 if dtype is None or dtype.is_floating_point else 0, dtype)


@rule("aten.scalar_tensor.default")
def _scalar_tensor(t, value, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(t, (), value, dtype)


@rule("aten.full_like.default")
def _full_like(t, x, value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _full(t, x.shape, value, dtype if dtype is not None else x.dtype)


# -- layout ------------------------------------------------------------------------------------
@rule("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def _view(t, x, shape):
    return nn.reshape(x, tuple(shape))


@rule("aten.permute.default")
def _permute(t, x, dims):
    return nn.transpose(x, tuple(_axis(d, x.ndim) for d in dims))


@rule("aten.t.default")
def _t(t, x):
    return nn.transpose(x, (1, 0)) if x.ndim == 2 else x


@rule("aten.transpose.int")
def _transpose(t, x, a, b):
    perm = list(range(x.ndim))
    a, b = _axis(a, x.ndim), _axis(b, x.ndim)
    perm[a], perm[b] = perm[b], perm[a]
    return nn.transpose(x, tuple(perm))


@rule("aten.clone.default", "aten.alias.default", "aten.contiguous.default", "aten.lift_fresh_copy.default")
def _identity(t, x, memory_format=None):
    return x


@rule("aten.detach.default")
def _detach(t, x):
    return dsl.compute(x.shape, lambda *i: dsl.stop_gradient(x[i]), name="detach")


@rule("aten.unsqueeze.default")
def _unsqueeze(t, x, dim):
    return nn.expand_dims(x, _axis(dim, x.ndim + 1))


@rule("aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default")
def _squeeze(t, x, dims=None):
    axes = _axes(dims, x.ndim) if dims is not None else tuple(range(x.ndim))
    axes = tuple(d for d in axes if is_int(x.shape[d]) and x.shape[d] == 1)
    if not axes:
        return x
    return nn.squeeze(x, axes)


@rule("aten.expand.default")
def _expand(t, x, size, implicit=False):
    size = tuple(size)
    lead = len(size) - x.ndim
    if lead < 0:
        raise UserError(f"expand: {len(size)} sizes for a tensor of rank {x.ndim}")
    shape = tuple(x.shape[d - lead] if (is_int(s) and s == -1) else s for d, s in enumerate(size))

    def body(*i):
        return x[tuple(0 if is_int(x.shape[d]) and x.shape[d] == 1 and not (is_int(shape[d + lead]) and
                                                                            shape[d + lead] == 1)
                       else i[d + lead] for d in range(x.ndim))]
    return dsl.compute(shape, body, name="expand")


def _clamp_index(v, n):
    if v is None:
        return None
    if is_int(v) and v >= _END:
        return n
    if is_int(v) and v < 0:
        if is_int(n):
            return max(n + v, 0)
        return n + v
    if is_int(v) and is_int(n):
        return min(v, n)
    return v


@rule("aten.slice.Tensor")
def _slice(t, x, dim=0, start=None, end=None, step=1):
    d = _axis(dim, x.ndim)
    n = x.shape[d]
    start = _clamp_index(start, n) if start is not None else 0
    end = _clamp_index(end, n) if end is not None else n
    if is_int(start) and start == 0 and end is n and step == 1:
        return x
    if not is_int(step) or step < 1:
        raise UserError(f"slice: step must be a positive int, got {step!r}")
    length = end - start if step == 1 else (end - start + step - 1) // step
    if is_int(length):
        length = max(length, 0)
    shape = x.shape[:d] + (length,) + x.shape[d + 1:]
    return dsl.compute(shape, lambda *i: x[i[:d] + (i[d] * step + start,) + i[d + 1:]], name="slice")


@rule("aten.select.int")
def _select(t, x, dim, index):
    d = _axis(dim, x.ndim)
    if is_int(index) and index < 0:
        index = x.shape[d] + index
    shape = x.shape[:d] + x.shape[d + 1:]
    return dsl.compute(shape, lambda *i: x[i[:d] + (index,) + i[d:]], name="select")


@rule("aten.cat.default")
def _cat(t, tensors, dim=0):
    tensors = [x for x in tensors if not (x.ndim == 1 and is_int(x.shape[0]) and x.shape[0] == 0)]
    return nn.concat(tensors, _axis(dim, tensors[0].ndim))


@rule("aten.constant_pad_nd.default")
def _constant_pad_nd(t, x, pad, value=0):
    """``F.pad`` in constant mode (what ``padding="same"`` with an even kernel emits): ``pad``
    holds (before, after) pairs from the last axis backwards; ``nn.pad`` with those pairs."""
    pad = list(pad)
    if len(pad) % 2 or len(pad) // 2 > x.ndim or not all(is_int(p) for p in pad):
        raise UserError(f"constant_pad_nd: padding {pad!r} must be (before, after) int pairs for at most "
                        f"{x.ndim} axes")
    if any(int(p) < 0 for p in pad):
        raise UserError(f"constant_pad_nd with a negative padding (a crop) is not translated: {pad!r}")
    pairs = [(0, 0)] * x.ndim
    for k in range(len(pad) // 2):
        pairs[x.ndim - 1 - k] = (int(pad[2 * k]), int(pad[2 * k + 1]))
    return nn.pad(x, pairs, value)


@rule("aten.split_with_sizes.default")
def _split_with_sizes(t, x, sizes, dim=0):
    d = _axis(dim, x.ndim)
    out, start = [], 0
    for s in sizes:
        out.append(_slice(t, x, d, start, start + s, 1))
        start = start + s
    return tuple(out)


@rule("aten.split.Tensor")
def _split(t, x, size, dim=0):
    d = _axis(dim, x.ndim)
    n = x.shape[d]
    if not is_int(n):
        raise UserError("split along a run-time dimension is not translated")
    return _split_with_sizes(t, x, [min(size, n - s) for s in range(0, n, size)], d)


# -- linear algebra ----------------------------------------------------------------------------
@rule("aten.mm.default")
def _mm(t, a, b):
    viewed = contraction(a, b, "matmul") if a.ndim == 2 and b.ndim == 2 and same_shape(a.shape[1:], b.shape[:1]) \
        else None
    return viewed if viewed is not None else nn.matmul(a, b)


@rule("aten.addmm.default")
def _addmm(t, c, a, b, beta=1, alpha=1):
    ab = _mm(t, a, b)
    if alpha != 1:
        ab = nn.multiply(ab, alpha)
    if beta == 0:
        return ab
    return nn.add(ab, c if beta == 1 else nn.multiply(c, beta))


@rule("aten.bmm.default")
def _bmm(t, a, b):
    viewed = contraction(a, b, "batch_matmul") \
        if a.ndim == 3 and b.ndim == 3 and same_shape((a.shape[0], a.shape[2]), b.shape[:2]) else None
    return viewed if viewed is not None else nn.batch_matmul(a, b)


@rule("aten.linear.default")
def _linear(t, x, w, b=None):
    if not isinstance(x, Tensor) or not isinstance(w, Tensor) or w.ndim not in (1, 2) or x.ndim < 1 \
            or not same_shape(x.shape[-1:], w.shape[-1:]):
        raise UserError(f"linear: input {list(getattr(x, 'shape', ()))} and weight {list(getattr(w, 'shape', ()))} "
                        "do not match (the weight is (out_features, in_features) or (in_features,))")
    out = linear(x, w)
    return out if b is None else nn.add(out, b)


# -- reductions --------------------------------------------------------------------------------
@rule("aten.sum.dim_IntList", "aten.sum.default")
def _sum(t, x, dims=None, keepdim=False, dtype=None):
    return nn.sum(x, _axes(dims, x.ndim), keepdims=keepdim)


@rule("aten.mean.dim", "aten.mean.default")
def _mean(t, x, dims=None, keepdim=False, dtype=None):
    return nn.mean(x, _axes(dims, x.ndim), keepdims=keepdim)


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


@rule("aten.flip.default")
def _flip(t, x, dims):
    axes = set(_axes(dims, x.ndim)) if dims else set()
    return dsl.compute(x.shape, lambda *i: x[tuple(x.shape[d] - 1 - v if d in axes else v for d, v in enumerate(i))],
                       name="flip")


@rule("aten.roll.default")
def _roll(t, x, shifts, dims=()):
    """``torch.roll``: ``out[..., i, ...] = x[..., (i - s) mod n, ...]`` along each axis of
    ``dims`` by its shift ``s`` (kept whole at import: decomposed, it is an ``index_select``
    at indices computed with ``fmod``, a gather; here the index is affine modulo ``n``). An
    empty ``dims`` rolls the flattened tensor; the rolled axes must have sizes known at
    import."""
    if not all(is_int(s) for s in shifts):
        raise UserError(f"roll by shifts {list(shifts)}: a shift known at run time only is not translated")
    shifts = [int(s) for s in shifts]
    if not dims:
        if len(shifts) != 1:
            raise UserError(f"roll: {len(shifts)} shifts without dims")
        if not all(is_int(n) for n in x.shape):
            raise UserError(f"roll of the flattened tensor of shape {tuple(x.shape)}: sizes known at run time "
                            "are not translated")
        flat = nn.reshape(x, (int(np.prod([int(n) for n in x.shape])),), name="roll_flat")
        return nn.reshape(_roll(t, flat, shifts, [0]), x.shape, name="roll")
    axes = [_axis(d, x.ndim) for d in ([dims] if is_int(dims) else dims)]
    if len(axes) != len(shifts):
        raise UserError(f"roll: {len(shifts)} shifts for {len(axes)} dims")
    by = {}
    for a, s in zip(axes, shifts):
        if not is_int(x.shape[a]):
            raise UserError(f"roll along axis {a} of size {x.shape[a]}, known at run time only: not translated")
        n = int(x.shape[a])
        by[a] = (by.get(a, 0) + s) % n if n else 0
    return dsl.compute(x.shape, lambda *i: x[tuple((v + (x.shape[d] - by[d])) % x.shape[d] if by.get(d) else v
                                                   for d, v in enumerate(i))], name="roll")


@rule("aten.repeat.default")
def _repeat(t, x, repeats):
    """``x`` tiled ``repeats`` times along each axis (new leading axes first):
    ``out[..., i, ...] = x[..., i % n, ...]``."""
    repeats = [int(r) if is_int(r) else r for r in repeats]  # a count may be a size (InstanceNorm: the batch)
    lead = len(repeats) - x.ndim
    if lead < 0 or any(is_int(r) and r < 0 for r in repeats):
        raise UserError(f"repeat: {repeats} for a tensor of rank {x.ndim}")
    shape = tuple(repeats[:lead]) + tuple(n * r for n, r in zip(x.shape, repeats[lead:]))
    return dsl.compute(shape, lambda *i: x[tuple(v if is_int(r) and r == 1 else v % n
                                                  for v, n, r in zip(i[lead:], x.shape, repeats[lead:]))],
                       name="repeat")


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


def _nearest_rows(n: int, m: int, scale) -> "np.ndarray":
    """The input row of each of the ``m`` output rows of PyTorch's nearest resampling of ``n``
    rows: ``min(floor(float32(i) * s), n - 1)`` in float32, ``s = float32(1 / scale)`` for a
    given scale, else ``float32(n) / m`` (``i // 2`` for ``m = 2 n``, ``i`` for ``m = n``)."""
    if m == n:
        return np.arange(m)
    if m == 2 * n:
        return np.arange(m) >> 1
    s = np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(n) / np.float32(m)
    return np.minimum(np.floor(np.arange(m).astype(np.float32) * s).astype(np.int64), n - 1)


@rule("aten.upsample_nearest2d.vec")
def _upsample_nearest(t, x, output_size, scale_factors):
    """Nearest upsampling (or subsampling) by whole factors: ``out[.., i, j] = x[.., i // k, j // l]``
    (``x[.., i * k, j * l]`` for a factor ``1 / k``), where PyTorch's own rows
    (:func:`_nearest_rows`, in float32) are those; other sizes and factors are refused (at a
    factor of 41, PyTorch's float32 reads row 0 for output row 41)."""
    src, shape = [], list(x.shape[:-2])
    for axis, n in enumerate(x.shape[-2:]):
        f = None if scale_factors is None else float(scale_factors[axis])
        m = None if output_size is None else output_size[axis]
        if not is_int(n) or (m is not None and not is_int(m)):
            raise UserError(f"upsample_nearest2d: sizes known at run time ({tuple(x.shape[-2:])}) are not translated")
        if m is None:
            m = int(math.floor(n * f))
        rows = _nearest_rows(n, m, f) if m > 0 else None
        k = None
        if rows is not None and m % n == 0 and np.array_equal(rows, np.arange(m) // (m // n)):
            k = m // n
            src.append(lambda v, k=k: v // k)
        elif rows is not None and n % m == 0 and np.array_equal(rows, np.arange(m) * (n // m)):
            k = n // m
            src.append(lambda v, k=k: v * k)
        if k is None:
            raise UserError(f"upsample_nearest2d: {n} rows to {m} (scale {f}) is not a whole factor whose rows "
                            "PyTorch's float32 index picks exactly (only those are translated)")
        shape.append(int(m))
    return dsl.compute(tuple(shape), lambda *i: x[i[:-2] + (src[0](i[-2]), src[1](i[-1]))], name="upsample_nearest")


def _linear_source(n: int, m: int, align_corners: bool, scale, dtype, where: str):
    """PyTorch's source of output row ``d`` (of ``m``) in linear resampling of ``n`` rows, as
    ``d -> (h0, h1, lam)``: ``out[d] = (1 - lam) * x[h0] + lam * x[h1]``, with the coordinates
    computed exactly. PyTorch's source coordinate is ``s = r * d`` with corners aligned
    (``r = (n - 1) / (m - 1)``, 0 for ``m = 1``), else ``max(r * (d + 1/2) - 1/2, 0)`` with
    ``r = 1 / scale`` for a given scale factor and ``n / m`` otherwise; ``h0 = min(floor(s),
    n - 1)``, ``h1 = min(h0 + 1, n - 1)``, ``lam = s - floor(s)``. Here ``r = p / q`` is a
    fraction and ``s = N(d) / D`` with an integer numerator, so ``h0`` and ``lam`` are a floor
    division and a remainder: PyTorch computes ``s`` in the input's float type, so the two
    agree to that type's rounding of ``s`` (the result is continuous in ``s``: where
    ``floor`` jumps, ``lam`` goes to 1 on the row the next ``h0`` reads). One exception:
    PyTorch floors a float64 ``s`` in float32 (``floorf``), and where that rounds ``s`` up to
    a whole number it clamps ``lam`` to 0; past about ten million (input rows times output
    rows: 5,000 to 4,999) its float64 results then differ from the exact ones by up to 4e-4
    of the values, where te_grad's do not."""
    if align_corners or not (scale is not None and scale > 0):
        r = Fraction(n - 1, m - 1) if align_corners and m > 1 else Fraction(0) if align_corners else Fraction(n, m)
    else:
        f = Fraction(float(scale)).limit_denominator(1 << 16)
        if float(f) != float(scale):
            raise UserError(f"{where}: scale factor {scale} is not a ratio of small integers (not translated)")
        r = 1 / f
    p, q = r.numerator, r.denominator
    if align_corners:  # s = d * p / q
        slope, offset, den = p, 0, q
    else:  # s = ((2 d + 1) p - q) / (2 q), clamped at 0
        slope, offset, den = 2 * p, p - q, 2 * q
    clamp_low = offset < 0
    top = max(slope * (m - 1) + offset, 0) // den  # the largest floor(s)

    def source(d):
        num = d * slope + offset
        if clamp_low:
            num = dsl.maximum(num, 0)
        h0 = num // den if den > 1 else num
        lam = dsl.cast(dtype, num % den) / dsl.const(float(den), dtype) if den > 1 else dsl.const(0.0, dtype)
        if top > n - 1:
            h0 = dsl.minimum(h0, n - 1)
        h1 = dsl.minimum(h0 + 1, n - 1) if min(top, n - 1) + 1 > n - 1 else h0 + 1
        return h0, h1, lam
    return source


@rule("aten.upsample_bilinear2d.vec")
def _upsample_bilinear(t, x, output_size, align_corners, scale_factors):
    """Bilinear resampling of the last two axes (``F.interpolate(mode="bilinear")``):
    ``out[.., i, j] = (1 - a) r[y0, j] + a r[y1, j]``, ``r[h, j] = (1 - b) x[h, x0] + b x[h, x1]``,
    the rows and weights of :func:`_linear_source` (exact coordinates) for ``i`` and ``j``;
    sizes known at import, scale factors ratios of integers. Two stages, along the width
    then along the height, in PyTorch's order of operations: written as one stage reading
    ``x`` at four clamped corners, the gradient's clamped pieces multiplied (2,000 lines of
    loops, a 12 s build and 5 ms for a 16 x 16 to 32 x 32 step that takes 0.8 ms so)."""
    where = "upsample_bilinear2d"
    if x.ndim != 4:
        raise UserError(f"{where}: input of rank {x.ndim}, 4 expected")
    sources, shape = [], list(x.shape[:-2])
    for axis, n in enumerate(x.shape[-2:]):
        f = None if scale_factors is None else float(scale_factors[axis])
        m = None if output_size is None else output_size[axis]
        if not is_int(n) or (m is not None and not is_int(m)):
            raise UserError(f"{where}: sizes known at run time ({tuple(x.shape[-2:])}) are not translated")
        if m is None:
            m = int(math.floor(n * f))
        if m < 1:
            raise UserError(f"{where}: an output of {m} rows")
        sources.append(_linear_source(int(n), int(m), bool(align_corners), f, x.dtype, where))
        shape.append(int(m))

    def along_w(*i):
        x0, x1, b = sources[1](i[-1])
        return (1 - b) * x[i[:-1] + (x0,)] + b * x[i[:-1] + (x1,)]
    rows = dsl.compute(tuple(x.shape[:-1]) + (shape[-1],), along_w, name="upsample_bilinear_rows")

    def along_h(*i):
        y0, y1, a = sources[0](i[-2])
        return (1 - a) * rows[i[:-2] + (y0, i[-1])] + a * rows[i[:-2] + (y1, i[-1])]
    return dsl.compute(tuple(shape), along_h, name="upsample_bilinear")


@rule("aten._softmax.default")
def _softmax(t, x, dim, half_to_float=False):
    return nn.softmax(x, _axis(dim, x.ndim))


@rule("aten._log_softmax.default")
def _log_softmax(t, x, dim, half_to_float=False):
    return nn.log_softmax(x, _axis(dim, x.ndim))


# -- convolution, pooling, normalization -------------------------------------------------------
@rule("aten.convolution.default")
def _convolution(t, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if x.ndim == 3 and not transposed:  # nn.Conv1d
        return nn.conv1d(x, w, bias=b, stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation),
                         groups=groups)
    if x.ndim != 4:
        raise UserError(f"only 1-D and 2-D convolutions and 2-D transposed ones are translated here "
                        f"(input rank {x.ndim}{', transposed' if transposed else ''})")
    if transposed:
        return nn.conv2d_transpose(x, w, stride=tuple(stride), padding=tuple(padding),
                                   output_padding=tuple(output_padding), dilation=tuple(dilation),
                                   groups=groups, bias=b)
    return nn.conv2d(x, w, stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation),
                     groups=groups, bias=b)


def _pair(v, what):
    v = tuple(v) if isinstance(v, (list, tuple)) else (v, v)
    if len(v) == 1:
        v = (v[0], v[0])
    if len(v) != 2 or not all(is_int(a) for a in v):
        raise UserError(f"{what} must be an int or a pair of ints, got {v!r}")
    return tuple(int(a) for a in v)


def _ceil_extra(n, k, s, p, d):
    """The padding past the end that ``ceil_mode`` adds along one axis (PyTorch's
    ``pooling_output_shape``): the output is ``ceil((n + 2p - d(k-1) - 1) / s) + 1``, less one
    when the last window would start in the padding past the end."""
    span = n + 2 * p - d * (k - 1) - 1
    out = -(-span // s) + 1
    if (out - 1) * s >= n + p:
        out -= 1
    return max((out - 1) * s + d * (k - 1) + 1 - (n + 2 * p), 0)


@rule("aten.max_pool2d_with_indices.default")
def _max_pool2d(t, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    kernel = _pair(kernel, "max_pool2d: kernel_size")
    stride = _pair(stride, "max_pool2d: stride") if stride else kernel
    pad = _pair(padding, "max_pool2d: padding")
    dil = _pair(dilation, "max_pool2d: dilation")
    if ceil_mode:
        h, w = x.shape[2], x.shape[3]
        if not (is_int(h) and is_int(w)):
            raise UserError(f"max_pool2d with ceil_mode=True needs int spatial extents, got {h} x {w}")
        eh, ew = (_ceil_extra(n, k, s, p, d) for n, k, s, p, d in zip((h, w), kernel, stride, pad, dil))
        if eh or ew:
            # the windows ceil_mode adds at the end read -inf past the input (padding is -inf)
            nh, nw = h + eh, w + ew
            x = dsl.compute(x.shape[:2] + (nh, nw), lambda n, c, i, j: dsl.if_then_else(
                dsl.all(i < h, j < w), x[n, c, dsl.minimum(i, h - 1), dsl.minimum(j, w - 1)],
                dsl.const(float("-inf"), x.dtype)), name="max_pool2d_ceil_pad")
    return (nn.max_pool2d(x, kernel, stride, pad, dil), None)


@rule("aten.adaptive_max_pool2d.default")
def _adaptive_max_pool2d(t, x, output_size):
    """Adaptive max pooling to an output size that divides the input's: max pooling by windows
    of ``(h // oh, w // ow)`` (PyTorch's windows then; its gradient to the first maximum of
    each window, as :func:`_max_pool2d`'s). The indices are not translated; other sizes
    (windows of varying size) are refused."""
    oh, ow = _pair(output_size, "adaptive_max_pool2d: output_size")
    h, w = x.shape[-2:]
    if x.ndim != 4 or not (is_int(h) and is_int(w)) or oh < 1 or ow < 1 or h % oh or w % ow:
        raise UserError(f"adaptive_max_pool2d of {tuple(x.shape)} to {oh}x{ow}: only an output size dividing "
                        "spatial extents known at import is translated")
    return (nn.max_pool2d(x, (h // oh, w // ow)), None)


@rule("aten.avg_pool2d.default")
def _avg_pool2d(t, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    if ceil_mode or divisor_override is not None:
        raise UserError("avg_pool2d with ceil_mode or divisor_override is not translated")
    return nn.avg_pool2d(x, tuple(kernel), tuple(stride) if stride else None,
                         tuple(padding) if isinstance(padding, (list, tuple)) else padding,
                         count_include_pad=count_include_pad)


@rule("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(t, x, output_size):
    oh, ow = _pair(output_size, "adaptive_avg_pool2d: output_size")
    h, w = x.shape[-2:]
    if (oh, ow) == (1, 1):
        return nn.mean(x, (x.ndim - 2, x.ndim - 1), keepdims=True)
    if not (is_int(h) and is_int(w)):
        raise UserError(f"adaptive_avg_pool2d to {oh}x{ow} needs int spatial extents, got {h} x {w}")
    if h % oh == 0 and w % ow == 0:
        return nn.avg_pool2d(x, (h // oh, w // ow))
    # PyTorch's windows: rows floor(i*h/oh) .. ceil((i+1)*h/oh) (likewise columns), overlapping
    # and of varying size when the output does not divide the input
    kh = max(-(-((i + 1) * h) // oh) - (i * h) // oh for i in range(oh))
    kw = max(-(-((j + 1) * w) // ow) - (j * w) // ow for j in range(ow))
    ry, rx = dsl.reduce_axis((0, kh), "ry"), dsl.reduce_axis((0, kw), "rx")
    lead = x.shape[:-2]

    def bounds(i, n, o):
        return (i * n) // o, (i * n + n + o - 1) // o

    def total(*idx):
        i, j = idx[-2], idx[-1]
        (h0, h1), (w0, w1) = bounds(i, h, oh), bounds(j, w, ow)
        inside = dsl.all(h0 + ry < h1, w0 + rx < w1)
        val = x[idx[:-2] + (dsl.minimum(h0 + ry, h - 1), dsl.minimum(w0 + rx, w - 1))]
        return dsl.sum(dsl.if_then_else(inside, val, dsl.const(0.0, x.dtype)), axis=[ry, rx])
    sums = dsl.compute(lead + (oh, ow), total, name="adaptive_avg_pool2d_sum")

    def body(*idx):
        i, j = idx[-2], idx[-1]
        (h0, h1), (w0, w1) = bounds(i, h, oh), bounds(j, w, ow)
        return sums[idx] / dsl.cast(x.dtype, (h1 - h0) * (w1 - w0))
    return dsl.compute(lead + (oh, ow), body, name="adaptive_avg_pool2d")


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


# -- dropout -----------------------------------------------------------------------------------
@rule("aten.native_dropout.default")
def _native_dropout(t, x, p, train=True):
    ctx = t.context
    if not train or p == 0.0:
        return (x, None)
    if ctx is None or not getattr(ctx, "training", False):  # F.dropout(..., training=True) in evaluation
        raise UserError(f"dropout (p={p}) in evaluation mode (F.dropout(x, p, training=True), Monte Carlo "
                        "dropout): te_grad's prediction draws no random numbers")
    if not 0.0 <= p < 1.0:
        raise UserError(f"dropout probability {p} is not in [0, 1)")
    return (dropout(x, p, ctx), None)


@rule("aten.bernoulli.p")
def _bernoulli(t, x, p=0.5, generator=None):
    """``torch.bernoulli(x, p)``: 1 with probability ``p``, else 0, in ``x``'s shape and dtype
    (``Dropout2d`` / ``Dropout1d``: a mask per channel, ``x`` an empty tensor of shape ``(N, C,
    1, 1)``), drawn from the step's seed as ``native_dropout``'s mask is (te_grad's draws,
    PyTorch's law). Its gradient is zero, as PyTorch's. In evaluation mode it is refused: a
    prediction has no seed."""
    ctx = t.context
    if ctx is None or not getattr(ctx, "training", False):
        raise UserError(f"bernoulli (p={p}) in evaluation mode (F.dropout2d(x, p, training=True)): te_grad's "
                        "prediction draws no random numbers")
    if not 0.0 <= p <= 1.0:
        raise UserError(f"bernoulli probability {p} is not in [0, 1]")
    if not x.dtype.startswith("float"):
        raise UserError(f"bernoulli into a tensor of dtype {x.dtype}: only float tensors are translated")
    return bernoulli(x.shape, float(p), x.dtype, ctx)


# -- transformers, recurrent nets and losses ---------------------------------------------------
# Embedding lookups, GELU, attention, positions (arange), dtype conversions, gathers and the
# loss operators, as GPT-2 / ViT blocks, unrolled LSTMs and modules returning their loss give them.
#
# - ``embedding(w, ids, padding_idx)``: ``out[..., j] = w[ids[...], j]``; the row ``padding_idx``
#   gets no gradient (read under ``stop_gradient`` where ``ids == padding_idx``), as PyTorch.
# - ``scaled_dot_product_attention`` is kept whole (:data:`KEEP`) and becomes
#   :func:`te_grad.nn.scaled_dot_product_attention` (masks, ``is_causal`` as the index
#   condition ``j <= i``, ``scale``); attention dropout (``dropout_p > 0`` in training) and
#   grouped-query attention are refused.
# - ``nll_loss_forward(x, y, weight, reduction, ignore_index)``: ``-w[y_n] * x[n, y_n]`` for the
#   rows with ``y_n != ignore_index``; ``mean`` divides by the sum of those rows' weights
#   (``total_weight``, the second result; 0 under ``none``), ``sum`` does not, ``none`` keeps the rows.
# - ``mse_loss(x, y, reduction)``: ``(x - y)^2`` elementwise, reduced by mean or sum.

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _reduction(op: str, reduction) -> str:
    if reduction not in _REDUCTIONS:
        raise UserError(f"{op}: reduction {reduction!r} is not 0 (none), 1 (mean) or 2 (sum)")
    return _REDUCTIONS[reduction]


@rule("aten.embedding.default")
def _embedding(t, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        raise UserError("embedding with scale_grad_by_freq=True is not translated")
    if not is_int(padding_idx) or padding_idx < 0:
        return nn.embedding(weight, indices)
    pad = int(padding_idx)

    def body(*i):
        row = indices[i[:-1]]
        value = weight[row, i[-1]]
        return dsl.if_then_else(dsl.cast(dtypes.INT64, row) == pad, dsl.stop_gradient(value), value)
    return dsl.compute(indices.shape + (weight.shape[1],), body, name="embedding")


@rule("aten.gelu.default")
def _gelu(t, x, approximate="none"):
    return nn.gelu(x, approximate=approximate)


@rule("aten.silu.default")
def _silu(t, x):
    return nn.silu(x)


def _arange_length(start, end, step):
    if not is_int(step) and not isinstance(step, float):
        raise UserError(f"arange: step must be a number, got {step!r}")
    if step == 0:
        raise UserError("arange: step must not be 0")
    if all(is_int(v) for v in (start, end, step)):
        return max(-(-(end - start) // step), 0)
    if all(isinstance(v, numbers.Real) for v in (start, end, step)):
        import math
        return max(int(math.ceil((end - start) / step)), 0)
    if step == 1:   # a size expression as the end (a run-time length)
        return end - start
    raise UserError(f"arange({start!r}, {end!r}, {step!r}): a run-time bound with a step other than 1 "
                    "is not translated")


@rule("aten.arange.start_step", "aten.arange.start", "aten.arange.default")
def _arange(t, *args, dtype=None, layout=None, device=None, pin_memory=None):
    if len(args) == 1:
        start, end, step = 0, args[0], 1
    elif len(args) == 2:
        (start, end), step = args, 1
    elif len(args) == 3:
        start, end, step = args
    else:
        raise UserError(f"arange: expected 1 to 3 bounds, got {len(args)}")
    floats = any(isinstance(v, float) for v in (start, end, step))
    dt = _dtype(dtype, dtypes.FLOAT32 if floats else dtypes.INT64)
    n = _arange_length(start, end, step)
    if dtypes.is_float(dt):
        return dsl.compute((n,), lambda i: dsl.cast(dt, i) * float(step) + float(start), name="arange")
    return dsl.compute((n,), lambda i: dsl.cast(dt, i * step + start), name="arange")


@rule("aten._to_copy.default")
def _to_copy(t, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    dt = _dtype(dtype, x.dtype)
    if dt == x.dtype:
        return x
    return dsl.compute(x.shape, lambda *i: dsl.cast(dt, x[i]), name="to_copy")


@rule("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(t, x, mask, value):
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise UserError(f"masked_fill: the fill value must be 0-d, got shape {list(value.shape)}")
        value = dsl.compute(value.shape, lambda: dsl.cast(x.dtype, value[()]), name="masked_fill_value")
    return nn.where(mask, value, x)


@rule("aten.gather.default")
def _gather(t, x, dim, index, sparse_grad=False):
    d = _axis(dim, x.ndim)
    if index.ndim != x.ndim:
        raise UserError(f"gather: index of rank {index.ndim} for an input of rank {x.ndim}")
    return dsl.compute(index.shape, lambda *i: x[i[:d] + (index[i],) + i[d + 1:]], name="gather")


@rule("aten.index_select.default")
def _index_select(t, x, dim, index):
    return nn.take(x, index, _axis(dim, x.ndim))


@rule("aten.index.Tensor")
def _index(t, x, indices):
    given = [(d, ix) for d, ix in enumerate(indices) if ix is not None]
    if len(given) != 1:
        raise UserError("index with more than one index tensor is not translated")
    d, ix = given[0]
    if ix.dtype == dtypes.BOOL:
        raise UserError("indexing with a bool mask (a data-dependent shape) is not translated")
    return nn.take(x, ix, d)


@rule("aten.scaled_dot_product_attention.default")
def _sdpa(t, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if enable_gqa:
        raise UserError("scaled_dot_product_attention with enable_gqa=True is not translated")
    if dropout_p:
        ctx = t.context
        if ctx is not None and getattr(ctx, "training", False):
            raise UserError(f"scaled_dot_product_attention with dropout_p={dropout_p} in training is not "
                            "translated; apply nn.Dropout to the attention weights of a hand-written "
                            "attention instead")
    if attn_mask is not None and attn_mask.dtype != dtypes.BOOL and attn_mask.dtype != q.dtype:
        attn_mask = dsl.compute(attn_mask.shape, lambda *i: dsl.cast(q.dtype, attn_mask[i]), name="attn_mask")
    return nn.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=bool(is_causal),
                                           scale=scale)


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


def _bool_as_int(base: Callable) -> Callable:
    """``base`` with a bool input counted as int64 (``torch.sum`` of a mask counts its True)."""
    def apply(t, x, *args, **kwargs):
        if isinstance(x, Tensor) and x.dtype == dtypes.BOOL:
            x = dsl.compute(x.shape, lambda *i: dsl.cast(dtypes.INT64, x[i]), name="count")
        return base(t, x, *args, **kwargs)
    return apply


for _n in ("aten.sum.dim_IntList", "aten.sum.default"):
    RULES[_n] = _bool_as_int(RULES[_n])
