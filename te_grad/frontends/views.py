"""Matrix products read through views (the importer's ``mm``, ``addmm`` and ``bmm`` rules).

A view that only broadcasts, permutes or inserts unit axes (``expand``, ``transpose``,
``permute``, ``unsqueeze``: a compute whose body is one read at its own axes or 0) satisfies
``x[i] == source[index(i)]``. A contraction reading its operands at their sources computes the
same values, and its gradient with respect to the source is one contraction over every row:
PyTorch's multi-head attention expands its projection weight along the batch of ``bmm``, and
differentiating through the expanded copy would build that copy's gradient and sum it over the
batch afterwards.
"""
from __future__ import annotations

import numbers
from typing import Optional

from simplify.linear import normalize

from .. import dsl
from ..ir import ComputeOp, Const, Read, Tensor, Var, distinct_reads
from ..transform import substitute


def view_source(x: Tensor):
    """``(source, index)`` with ``x[i] == source[index(i)]`` for every ``i``, following ``x``
    back through views that only broadcast, permute or insert unit axes (expand, transpose,
    permute, unsqueeze: a body that is one read whose indices are ``x``'s own axes or 0); ``x``
    itself with the identity when it is no such view."""
    index = None  # None: the identity

    def compose(outer, inner_indices, axes):
        def at(i):
            i = outer(i) if outer is not None else tuple(i)
            where = {id(a): v for a, v in zip(axes, i)}
            return tuple(where[id(e)] if isinstance(e, Var) else e for e in inner_indices)
        return at

    while isinstance(x.op, ComputeOp) and isinstance(x.op.body, Read):
        body, axes = x.op.body, x.op.axes
        ids = {id(a) for a in axes}
        if not all((isinstance(e, Var) and id(e) in ids) or (isinstance(e, Const) and e.value == 0)
                   for e in body.indices) or body.tensor.dtype != x.dtype:
            break
        index = compose(index, body.indices, axes)
        x = body.tensor
    return x, (index if index is not None else tuple)


def contraction(a: Tensor, b: Tensor, name: str) -> Optional[Tensor]:
    """``out[..., i, j] = sum_k a[..., i, k] * b[..., k, j]`` over equal leading (batch) axes,
    reading ``a`` and ``b`` through their broadcast and permutation views: a weight expanded
    along the batch of ``bmm`` (PyTorch's multi-head attention projections) is then read
    where it is, and its gradient is one contraction over every batch row instead of a
    gradient of the expanded tensor summed over the batch afterwards. None when neither
    operand is such a view (the plain product serves)."""
    sa, ia = view_source(a)
    sb, ib = view_source(b)
    if sa is a and sb is b:
        return None
    k = dsl.reduce_axis((0, a.shape[-1]), name="k")
    shape = tuple(a.shape[:-1]) + (b.shape[-1],)

    def body(*o):
        lead, i, j = o[:-2], o[-2], o[-1]
        return dsl.sum(sa[ia(lead + (i, k))] * sb[ib(lead + (k, j))], axis=k)
    return dsl.compute(shape, body, name=name)


def linear(x: Tensor, w: Tensor, name: str = "linear") -> Tensor:
    """``out[..., n] = sum_k x[..., k] * w[n, k]`` (ATen's ``linear`` without its bias) for an ``x``
    of any rank >= 1, reading ``x`` and ``w`` through their broadcast and permutation views
    (``nn.Linear`` on a transposed input reads the input where it is); a 1-D ``w`` gives
    ``out[...] = sum_k x[..., k] * w[k]``."""
    sx, ix = view_source(x)
    sw, iw = view_source(w)
    k = dsl.reduce_axis((0, x.shape[-1]), name="k")
    shape = tuple(x.shape[:-1]) + tuple(w.shape[:-1])

    def body(*o):
        lead, n = (o[:-1], o[-1:]) if w.ndim == 2 else (o, ())
        return dsl.sum(sx[ix(lead + (k,))] * sw[iw(n + (k,))], axis=k)
    return dsl.compute(shape, body, name=name)


def _pure_view(t: Tensor) -> bool:
    """``t`` is a compute whose body is one read of a tensor of its dtype at indices that read
    no tensor (a reshape, a permutation, a slice, a broadcast, a selection)."""
    if not isinstance(t.op, ComputeOp) or not isinstance(t.op.body, Read):
        return False
    read = t.op.body
    return read.tensor.dtype == t.dtype and not any(distinct_reads(ix) for ix in read.indices)


def composed(x: Tensor) -> Tensor:
    """``x`` when it is not a view of a view; else the one view of the innermost source that
    reads, for every element, the element ``x`` reads through the chain (see the module
    docstring), its indices normalized over ``x``'s extents."""
    if not _pure_view(x) or not _pure_view(x.op.body.tensor):
        return x
    indices, source = tuple(x.op.body.indices), x.op.body.tensor
    while _pure_view(source):
        where = dict(zip(source.op.axes, indices))
        indices = tuple(substitute(e, where) for e in source.op.body.indices)
        source = source.op.body.tensor

    def body(*i):
        where = dict(zip(x.op.axes, i))
        ranges = {id(v): (0, n - 1) for v, n in zip(i, x.shape) if isinstance(n, numbers.Integral)}
        return source[tuple(normalize(substitute(e, where), ranges) for e in indices)]
    return dsl.compute(x.shape, body, name=x.name)
