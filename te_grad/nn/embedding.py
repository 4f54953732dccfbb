"""Data-dependent gathers: ``embedding`` lookup and numpy-style ``take``."""
from __future__ import annotations

from ..errors import UserError
from ..ir import Tensor
from ._util import check_int_dtype, check_tensor, compute, normalize_axis

__all__ = ["embedding", "take"]


def embedding(table: Tensor, ids: Tensor) -> Tensor:
    """Rows of ``table`` selected by ``ids``: ``out[..., j] = table[ids[...], j]``.

    ``table`` is (V, D); ``ids`` is an int32 or int64 tensor of any shape with
    values in [0, V) (an id outside the table is an error at evaluation time).
    The result has shape ``ids.shape + (D,)`` and the dtype of ``table``.
    """
    op = "embedding"
    check_tensor(op, table, "table", ndim=2)
    check_tensor(op, ids, "ids")
    check_int_dtype(op, ids, "ids")
    if table.shape[0] == 0:
        raise UserError(f"{op}: table {table.name} has no rows")
    return compute(ids.shape + (table.shape[1],),
                   lambda idx: table[ids[idx[:-1]], idx[-1]], name=op)


def take(x: Tensor, indices: Tensor, axis: int = 0) -> Tensor:
    """Elements of ``x`` picked along ``axis`` by an integer tensor, as ``numpy.take``.

    ``out[a..., i..., b...] = x[a..., indices[i...], b...]`` where ``a`` spans the
    axes of ``x`` before ``axis`` and ``b`` those after it; the result has shape
    ``x.shape[:axis] + indices.shape + x.shape[axis+1:]``. ``indices`` is int32 or
    int64 with values in [0, x.shape[axis]) (others are an error at evaluation time).
    """
    op = "take"
    check_tensor(op, x, "input")
    check_tensor(op, indices, "indices")
    check_int_dtype(op, indices, "indices")
    axis = normalize_axis(op, axis, x.ndim)
    if x.shape[axis] == 0:
        raise UserError(f"{op}: axis {axis} of {x.name} is empty (shape {list(x.shape)})")
    k = indices.ndim

    def body(idx):
        picked = indices[idx[axis:axis + k]]
        return x[idx[:axis] + (picked,) + idx[axis + k:]]

    return compute(x.shape[:axis] + indices.shape + x.shape[axis + 1:], body, name=op)
