"""Random rules: ``native_dropout`` and ``bernoulli``, drawn from the step's seed.

- ``native_dropout(x, p, train)``: ``x / (1 - p)`` where a hash of the element's position
  and the step's seed (``Context.seed``, an input of the training step) falls below ``1 -
  p``, else 0; the identity when ``train`` is false. The mask is te_grad's, not PyTorch's
  generator's (the same law, other draws). A dropout that stays on in evaluation mode
  (``F.dropout(x, p, training=True)``) is refused: a prediction has no seed.
- ``bernoulli(x, p)`` (``Dropout2d``'s mask per channel, drawn into an ``empty`` tensor, whose
  values are zeros here) draws the same way.
"""
from __future__ import annotations

from ...errors import UserError
from ...train.layers import bernoulli, dropout
from .table import rule


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
