"""Segment reductions over CSR row pointers: ragged loops, no padding.

The rows of ``x`` (its first axis, ``E`` of them: the edges of a graph sorted by
destination) are grouped in ``S`` consecutive segments by an integer row pointer
``rowptr`` of shape ``(S + 1,)``: segment ``s`` is the rows ``rowptr[s] <= e <
rowptr[s + 1]``. Each operator is one or a few ``tg.compute`` tensors whose reduce axis
is the ragged loop ``tg.reduce_axis((rowptr[s], rowptr[s + 1]))``; gradients come from
te_grad's autodiff (scatters over the edges). ``rowptr`` must not decrease and must stay
within ``[0, E]``: other data is a :class:`~te_grad.errors.UserError` when the oracle or
a compiled kernel runs (see README.md, "Ragged loops").
"""
from __future__ import annotations

from .. import dsl
from ..errors import UserError
from ..ir import ScatterOp, Tensor
from ._util import check_float, check_int_dtype, check_tensor, compute

__all__ = ["segment_sum", "segment_max", "segment_softmax"]


def _check(op: str, x: Tensor, rowptr: Tensor):
    check_tensor(op, x, "input")
    check_float(op, x, "input")
    if x.ndim == 0:
        raise UserError(f"{op}: input {x.name} must have at least one axis (its rows are grouped), got a scalar")
    check_tensor(op, rowptr, "rowptr", ndim=1)
    check_int_dtype(op, rowptr, "rowptr")
    if isinstance(rowptr.shape[0], int) and rowptr.shape[0] < 1:  # S + 1 with tg.var: bound at run time
        raise UserError(f"{op}: rowptr {rowptr.name} must hold at least one entry (S + 1 for S segments), "
                        "got shape [0]")
    return rowptr.shape[0] - 1


def _segment(rowptr: Tensor, s, name: str = "e"):
    return dsl.reduce_axis((rowptr[s], rowptr[s + 1]), name=name)


def segment_sum(x: Tensor, rowptr: Tensor) -> Tensor:
    """Sums of the rows of ``x`` over CSR segments: shape ``(S,) + x.shape[1:]`` for ``rowptr``
    of shape ``(S + 1,)``.

    ``out[s, ...] = sum over rowptr[s] <= e < rowptr[s + 1] of x[e, ...]``; an empty
    segment sums to 0. The gradient is ``dx[e, ...] = dout[s, ...]`` for ``e`` in
    segment ``s`` (0 for rows in no segment)."""
    op = "segment_sum"
    S = _check(op, x, rowptr)

    def body(idx):
        e = _segment(rowptr, idx[0])
        return dsl.sum(x[(e,) + tuple(idx[1:])], axis=e)

    return compute((S,) + x.shape[1:], body, name=op)


def segment_max(x: Tensor, rowptr: Tensor) -> Tensor:
    """Maxima of the rows of ``x`` over CSR segments: shape ``(S,) + x.shape[1:]``.

    ``out[s, ...] = max over rowptr[s] <= e < rowptr[s + 1] of x[e, ...]``, and **0 for an
    empty segment**: what PyTorch's ``torch.zeros(S, ...).scatter_reduce(0, index, x,
    "amax", include_self=False)`` gives (a segment no row reaches keeps its zero). The
    gradient goes to the rows equal to the maximum, split evenly among ties (te_grad's
    rule for max, as PyTorch's ``amax``); an empty segment passes none. ``segment_max_raw``
    holds the maxima with the identity ``-inf`` for empty segments."""
    op = "segment_max"
    S = _check(op, x, rowptr)
    shape = (S,) + x.shape[1:]

    def raw(idx):
        e = _segment(rowptr, idx[0])
        return dsl.max(x[(e,) + tuple(idx[1:])], axis=e)

    m = compute(shape, raw, name=op + "_raw")

    def body(idx):
        s = idx[0]
        return dsl.if_then_else(rowptr[s + 1] > rowptr[s], m[idx], dsl.const(0.0, x.dtype))

    return compute(shape, body, name=op)


def segment_softmax(scores: Tensor, rowptr: Tensor) -> Tensor:
    """Softmax of per-edge ``scores`` within each CSR segment (a GAT layer's attention over
    each destination's incoming edges): same shape as ``scores``, ``(E,) + heads``.

    For ``e`` in segment ``s`` (``rowptr[s] <= e < rowptr[s + 1]``),
    ``out[e, ...] = exp(scores[e, ...] - m[s, ...]) / sum over e' in segment s of
    exp(scores[e', ...] - m[s, ...])``, with ``m`` the segment's maximum (``segment_softmax_max``,
    a stop-gradient shift that keeps the exponentials from overflowing; it does not change
    the value). Each segment's outputs sum to 1; a row in no segment is 0. Tensors:
    ``segment_softmax_max`` (S, ...), ``segment_softmax_sum`` (S, ...), and the result, a
    scatter visiting each edge of each segment once (``out[e, ...] += ...`` for ``e`` in
    segment ``s``), forward and backward one pass over the edges."""
    op = "segment_softmax"
    S = _check(op, scores, rowptr)
    E = scores.shape[0]
    rest = scores.shape[1:]

    def seg_max(idx):
        e = _segment(rowptr, idx[0])
        return dsl.max(scores[(e,) + tuple(idx[1:])], axis=e)

    m = compute((S,) + rest, seg_max, name=op + "_max")

    def seg_sum(idx):
        e = _segment(rowptr, idx[0])
        return dsl.sum(dsl.exp(scores[(e,) + tuple(idx[1:])] - dsl.stop_gradient(m[idx])), axis=e)

    z = compute((S,) + rest, seg_sum, name=op + "_sum")

    # written as a scatter over the edges of each segment (each edge once): as a sum over
    # every segment pinned to its edge (``where=k == e``), it would visit S x E points
    s = dsl.reduce_axis((0, S), name="s")
    k = _segment(rowptr, s, "k")
    tail = tuple(dsl.reduce_axis(n, name=f"j{d}") for d, n in enumerate(rest))
    value = dsl.exp(scores[(k,) + tail] - dsl.stop_gradient(m[(s,) + tail])) / z[(s,) + tail]
    return Tensor(op, (E,) + rest, scores.dtype, ScatterOp((s, k) + tail, (k,) + tail, value))
