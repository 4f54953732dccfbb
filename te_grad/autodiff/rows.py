"""Row gradients: a gradient that scatters into a few rows, kept as those rows.

The gradient of an embedding table ``table[ids[i], j]`` is a scatter
``dtable[ids[i], j] += head[i, j]`` into a dense table of zeros. When the
table is large and ``ids`` short, writing the zeros costs far more than the
rest (50000x128 floats written for 4096 rows read). :func:`row_gradient`
returns the same gradient as ``(ids, rows)`` — PyTorch's ``sparse=True``
embedding gradient, TensorFlow's ``IndexedSlices`` — for an optimizer that
updates only those rows:

    dense = zeros(shape);  np.add.at(dense, ids, rows)      # == the dense gradient

Ids may repeat: their rows add up.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np

from .. import dsl
from ..errors import UserError
from ..graph import free_vars
from ..ir import Const, ScatterOp, Tensor
from ..transform import substitute


@dataclass(frozen=True)
class RowGradient:
    """``ids`` (int64, any shape S) and ``rows`` (shape S + dense_shape[1:]) of a gradient."""
    ids: Tensor
    rows: Tensor
    dense_shape: Tuple[int, ...]

    def to_dense(self, ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The dense gradient from computed ``ids`` and ``rows`` (repeated ids add up)."""
        dense = np.zeros(self.dense_shape, dtype=rows.dtype)
        np.add.at(dense, np.asarray(ids), rows)
        return dense


def row_gradient(grad: Tensor) -> RowGradient:
    """``grad`` as the rows it adds to; ``grad`` must be a scatter along its first axis only.

    That is ``grad[d(a), b1, ..., bk] += value(a, b)`` over axes ``a`` (any
    number, constant bounds) and ``b`` (each running over the whole of its
    dimension), with ``d`` data-dependent: the gradient of a table read at data
    rows, as ``tg.gradient`` returns it. Anything else is a UserError.
    """
    op = grad.op
    if not isinstance(op, ScatterOp):
        raise UserError(f"row_gradient: {grad.name} is not a scatter (its gradient has a dense part, "
                        "or no data-dependent rows); use it as a dense gradient")
    first, rest = op.indices[0], op.indices[1:]
    axes = list(op.axes)
    for ax in axes:
        if not (isinstance(ax.lo, Const) and isinstance(ax.hi, Const)):
            raise UserError(f"row_gradient: the scatter axis {ax.name} of {grad.name} has bounds "
                            f"that vary ({ax.lo}, {ax.hi})")
    trailing = []
    for k, (ix, n) in enumerate(zip(rest, grad.shape[1:]), start=1):
        ax = next((a for a in axes if ix is a), None)
        if ax is None or int(ax.lo.value) != 0 or int(ax.hi.value) != n or any(ax is t for t in trailing):
            raise UserError(f"row_gradient: index {k} of the scatter into {grad.name} ({ix}) is not one "
                            f"axis running over all of dimension {k}")
        trailing.append(ax)
    row_axes = [a for a in axes if not any(a is t for t in trailing)]
    if any(any(v is t for t in trailing) for v in free_vars(first)):
        raise UserError(f"row_gradient: the row index {first} of {grad.name} depends on a column axis")
    shape = tuple(int(a.hi.value) - int(a.lo.value) for a in row_axes)

    def at(new_axes):
        return {a: v + a.lo for a, v in zip(row_axes, new_axes)}

    value, row = op.value, first
    if op.where is not None:  # rows whose condition fails add zero to row 0
        value = dsl.if_then_else(op.where, value, dsl.const(0, grad.dtype))
        row = dsl.if_then_else(op.where, row, dsl.const(0, row.dtype))
    ids = dsl.compute(shape, lambda *a: dsl.cast("int64", substitute(row, at(a))),
                      name=f"{grad.name}_ids", dtype="int64")

    def rows_body(*idx):
        mapping = at(idx[:len(row_axes)])
        mapping.update(dict(zip(trailing, idx[len(row_axes):])))
        return dsl.cast(grad.dtype, substitute(value, mapping))

    rows = dsl.compute(shape + tuple(grad.shape[1:]), rows_body, name=f"{grad.name}_rows", dtype=grad.dtype)
    return RowGradient(ids, rows, tuple(grad.shape))
