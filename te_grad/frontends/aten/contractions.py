"""Contractions: matrix products, ``linear``, convolutions, attention.

- ``addmm(c, a, b, beta, alpha) = beta * c + alpha * (a @ b)``.
- ``linear(x, w, b)[..., n] = sum_k x[..., k] * w[n, k] + b[n]`` over every leading axis of ``x``
  (kept whole: :func:`te_grad.frontends.views.linear`); a ``view`` that flattens ``x``'s leading axes
  into rows before it and one that restores them after are folded away by the translator
  (:func:`te_grad.frontends.translate.linear_folds`).
- ``mm`` / ``bmm`` read their operands through broadcasting and permuting views
  (:func:`te_grad.frontends.views.contraction`).
- ``scaled_dot_product_attention`` is kept whole (:data:`~te_grad.frontends.aten.table.KEEP`) and
  becomes :func:`te_grad.nn.scaled_dot_product_attention` (masks, ``is_causal`` as the index
  condition ``j <= i``, ``scale``); attention dropout (``dropout_p > 0`` in training) and
  grouped-query attention are refused.
"""
from __future__ import annotations

from ... import dsl, dtypes, nn
from ...errors import UserError
from ...ir import Tensor
from ...sizes import same_shape
from ..views import contraction, linear
from .table import rule


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
