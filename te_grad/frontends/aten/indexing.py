"""Rules that read at data-dependent indices: ``gather``, ``index_select``, ``index``, ``embedding``.

- ``embedding(w, ids, padding_idx)``: ``out[..., j] = w[ids[...], j]``; the row ``padding_idx``
  gets no gradient (read under ``stop_gradient`` where ``ids == padding_idx``), as PyTorch.
- ``gather(x, d, idx)[i] = x[i with axis d replaced by idx[i]]``.
"""
from __future__ import annotations

from ... import dsl, dtypes, nn
from ...errors import UserError
from .table import _axis, is_int, rule


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
