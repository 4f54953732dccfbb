"""Rules that read at data-dependent indices: ``gather``, ``index_select``, ``index``, ``embedding``.

- ``embedding(w, ids, padding_idx)``: ``out[..., j] = w[ids[...], j]``; the row ``padding_idx``
  gets no gradient (read under ``stop_gradient`` where ``ids == padding_idx``), as PyTorch.
- ``gather(x, d, idx)[i] = x[i with axis d replaced by idx[i]]``.
- ``index(x, [i0, None, i1])``: advanced indexing, the index tensors broadcast together.

Each gradient is a scatter of the output's gradient to the positions read (several reads of
one position add up), which te_grad's scatter-to-gather turns into a gather where it can.
"""
from __future__ import annotations

from ... import dsl, dtypes, nn
from ...errors import UserError
from ...ir import Tensor
from ...nn.elementwise import broadcast_read
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


def _from_end(v, n):
    """An index read ``v`` of an axis of extent ``n`` with a negative one counted from the end
    (``v + n`` where ``-n <= v < 0``, as PyTorch's advanced indexing); one below ``-n`` is left
    as written, so the kernel's range check names the index the model gave."""
    return dsl.if_then_else((v < 0) & (v >= -n), v + n, v)


@rule("aten.index.Tensor")
def _index(t, x, indices):
    """``x[i0, i1, ...]`` with index tensors (PyTorch's and numpy's advanced indexing; ``None``
    a whole axis, as are the axes past the list): the index tensors broadcast together to a
    shape ``B``, and ``out`` holds ``B``'s axes where the indexed axes were when those are
    adjacent, else first, then the whole axes in order; ``out[.., b, ..] = x[.., i0[b],
    i1[b], ..]``. Indices lie in ``[-n, n)`` for an axis of extent ``n``, a negative one
    counting from the end as in PyTorch (``i + n``); a kernel refuses others when it runs. A
    bool mask (a shape that depends on data) is refused."""
    given = [(d, ix) for d, ix in enumerate(indices) if ix is not None]
    if not given:
        return x
    for d, ix in given:
        if not isinstance(ix, Tensor):
            raise UserError(f"index on axis {d} is {ix!r}, not a tensor")
        if ix.dtype == dtypes.BOOL:
            raise UserError("indexing with a bool mask (a data-dependent shape) is not translated")
        if not dtypes.is_int(ix.dtype):
            raise UserError(f"index tensor of dtype {ix.dtype} on axis {d}: an integer tensor was expected")
    shape = nn.broadcast_shape("index", *[ix.shape for _, ix in given])
    rank = len(shape)
    dims = [d for d, _ in given]
    whole = [d for d in range(x.ndim) if d not in dims]
    at = dims[0] if dims == list(range(dims[0], dims[-1] + 1)) else 0
    lead = [d for d in whole if d < at] if at else []
    out_shape = tuple(x.shape[d] for d in lead) + tuple(shape) + tuple(x.shape[d] for d in whole[len(lead):])

    def body(*i):
        b, rest = i[len(lead):len(lead) + rank], i[:len(lead)] + i[len(lead) + rank:]
        picked = {d: _from_end(broadcast_read(ix, b), x.shape[d]) for d, ix in given}
        others = iter(rest)
        return x[tuple(picked[d] if d in picked else next(others) for d in range(x.ndim))]
    return dsl.compute(out_shape, body, name="index")
