"""Attention: ``scaled_dot_product_attention`` (PyTorch's ``F.scaled_dot_product_attention``)."""
from __future__ import annotations

import math
import numbers

from .. import dsl, dtypes
from ..errors import UserError
from ..ir import Tensor
from ..sizes import same_shape
from ._util import check_float, check_tensor, compute, is_int, size_text
from .elementwise import broadcast_read, broadcast_shape

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float = None) -> Tensor:
    """``softmax(q @ k^T * scale + mask) @ v`` over the last two axes, as PyTorch's
    ``F.scaled_dot_product_attention`` (same argument order).

    ``q`` is (..., L, E), ``k`` (..., S, E) and ``v`` (..., S, Ev) with the same leading
    (batch, head) axes, any number of them; the result is (..., L, Ev). ``scale`` defaults to
    ``1 / sqrt(E)``. ``attn_mask``, broadcastable to (..., L, S), is either bool (True: the key
    takes part) or of ``q``'s float dtype (added to the scores). ``is_causal=True`` lets query
    ``i`` see the keys ``j <= i`` (PyTorch's ``ones(L, S).tril()``), a condition on the indices
    rather than a mask tensor; it excludes ``attn_mask``. ``dropout_p`` must be 0.

    Parts: ``<op>_scores`` (the scaled products; a float mask is added where they are read), ``<op>_max`` (the largest
    score a query may see: only a shift against overflow, read under ``stop_gradient`` as in
    :func:`softmax`), ``<op>_exp`` (``exp(score - max)``, 0 where masked), ``<op>_sum``,
    ``<op>_weights`` and the result. A query that may see no key at all (its bool mask row all
    False, or its scores all ``-inf``) gets weights 0 and an output of 0, as PyTorch 2.13's
    (a NaN where a score is NaN or ``+inf``).
    """
    op = "scaled_dot_product_attention"
    for t, what in ((q, "query"), (k, "key"), (v, "value")):
        check_tensor(op, t, what)
        check_float(op, t, what)
        if t.ndim < 2:
            raise UserError(f"{op}: {what} {t.name} must have at least 2 axes (..., length, features), got "
                            f"shape {size_text(t.shape)}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or dropout_p != 0:
        raise UserError(f"{op}: dropout_p must be 0 (dropout is not supported), got {dropout_p!r}")
    if not isinstance(is_causal, bool):
        raise UserError(f"{op}: is_causal must be True or False, got {is_causal!r}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise UserError(f"{op}: query {q.name}, key {k.name} and value {v.name} must have one dtype, got "
                        f"{q.dtype}, {k.dtype} and {v.dtype}")
    batch = q.shape[:-2]
    if not (same_shape(k.shape[:-2], batch) and same_shape(v.shape[:-2], batch)):
        raise UserError(f"{op}: query {q.name} {size_text(q.shape)}, key {k.name} {size_text(k.shape)} and value "
                        f"{v.name} {size_text(v.shape)} must have the same leading (batch) axes")
    (length, e), (s_len, ek), (sv, ev) = q.shape[-2:], k.shape[-2:], v.shape[-2:]
    if not same_shape((e,), (ek,)):
        raise UserError(f"{op}: query {q.name} has {e} features but key {k.name} has {ek}")
    if not same_shape((s_len,), (sv,)):
        raise UserError(f"{op}: key {k.name} has {s_len} positions but value {v.name} has {sv}")
    if scale is None:
        if not is_int(e):
            raise UserError(f"{op}: the feature size {e} is known only at run time; give scale explicitly")
        if e == 0:
            raise UserError(f"{op}: query {q.name} has no features (shape {size_text(q.shape)})")
        scale = 1.0 / math.sqrt(e)
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise UserError(f"{op}: scale must be a finite number or None, got {scale!r}")
    scale = float(scale)
    scores_shape = batch + (length, s_len)
    is_bool_mask = False
    if attn_mask is not None:
        if is_causal:
            raise UserError(f"{op}: attn_mask must be None when is_causal=True (the causal mask is implied)")
        check_tensor(op, attn_mask, "attn_mask")
        if attn_mask.dtype == dtypes.BOOL:
            is_bool_mask = True
        elif attn_mask.dtype != q.dtype:
            raise UserError(f"{op}: attn_mask {attn_mask.name} must be bool or {q.dtype} like the query, got "
                            f"{attn_mask.dtype}")
        try:
            fits = attn_mask.ndim <= len(scores_shape) and same_shape(
                broadcast_shape(op, attn_mask.shape, scores_shape), scores_shape)
        except UserError:
            fits = False
        if not fits:
            raise UserError(f"{op}: attn_mask {attn_mask.name} {size_text(attn_mask.shape)} does not broadcast to the "
                            f"scores' shape {size_text(scores_shape)} (..., L, S)")
    nb = len(batch)
    neg_inf = dsl.const(-math.inf, q.dtype)
    zero = dsl.const(0.0, q.dtype)

    def allowed(idx):
        """The condition for query ``idx[-2]`` to see key ``idx[-1]``, or None when it always may."""
        if is_causal:
            return idx[-1] <= idx[-2]
        if is_bool_mask:
            return broadcast_read(attn_mask, idx)
        return None

    re = dsl.reduce_axis((0, e), name="e")
    scores = compute(scores_shape, lambda idx: dsl.sum(q[idx[:nb] + (idx[-2], re)] * scale
                                                       * k[idx[:nb] + (idx[-1], re)], axis=re), name=op + "_scores")

    def score(idx):
        """The score of query ``idx[-2]`` for key ``idx[-1]``, a float mask added."""
        if attn_mask is None or is_bool_mask:
            return scores[idx]
        return scores[idx] + broadcast_read(attn_mask, idx)

    def visible(idx, value, otherwise):
        cond = allowed(idx)
        return value if cond is None else dsl.if_then_else(cond, value, otherwise)

    rj = dsl.reduce_axis((0, s_len), name="j")
    mx = compute(batch + (length,), lambda idx: dsl.max(visible(idx + (rj,), score(idx + (rj,)), neg_inf), axis=rj),
                 name=op + "_max")

    def shift(r):
        """The max as a shift (0 where a query sees no finite score, so ``exp`` gives 0, not NaN)."""
        m = dsl.stop_gradient(mx[r])
        return dsl.if_then_else(m == neg_inf, zero, m)

    ex = compute(scores_shape, lambda idx: visible(idx, dsl.exp(score(idx) - shift(idx[:-1])), zero),
                 name=op + "_exp")
    rj = dsl.reduce_axis((0, s_len), name="j")
    total = compute(batch + (length,), lambda idx: dsl.sum(ex[idx + (rj,)], axis=rj), name=op + "_sum")

    def weights_body(idx):
        r = idx[:-1]
        return dsl.if_then_else(dsl.stop_gradient(mx[r]) == neg_inf, zero, ex[idx] / total[r])

    weights = compute(scores_shape, weights_body, name=op + "_weights")
    rj = dsl.reduce_axis((0, s_len), name="j")
    return compute(batch + (length, ev),
                   lambda idx: dsl.sum(weights[idx[:-1] + (rj,)] * v[idx[:-2] + (rj, idx[-1])], axis=rj), name=op)
