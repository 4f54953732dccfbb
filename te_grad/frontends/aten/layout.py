"""Layout rules: views, slices, concatenation, padding, splits, flips, rolls, repeats.

Each reads its input at indices affine in the output's, or floor divisions and remainders of
them (``view``, ``roll``, ``repeat``), under a condition where it reads two inputs or padding
(``cat``, ``constant_pad_nd``); no data is moved until a kernel reads it.

- ``detach(x)``: ``x`` with ``stop_gradient``; kept out of the decomposition, which makes
  it an ``alias`` (the identity, its gradient's stop lost). The results of a
  ``torch.no_grad()`` block are detached before the decomposition inlines the block.
- ``slice(x, d, start, end, step)`` clamps ``start`` and ``end`` into ``[0, n]`` as Python does
  (``_END``, ``2**62``, is PyTorch's "to the end").
- ``roll(x, s, d)[i] = x[(i - s) mod n]`` along ``d``; with no ``dims`` the flattened tensor.
- ``repeat(x, r)[i] = x[i mod n]`` per axis.
"""
from __future__ import annotations

import numpy as np

from ... import dsl, nn
from ...errors import UserError
from ...ir import Tensor
from .table import _axes, _axis, is_int, rule

#: PyTorch's "index to the end" (``x[2:]`` slices to ``sys.maxsize``)
_END = 2 ** 62


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
    if x.ndim == 0:  # PyTorch takes dim 0 or -1 of a 0-d tensor: nothing to squeeze
        return x
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
        return nn.reshape(_rolled(flat, {0: shifts[0]}), x.shape, name="roll")
    axes = [_axis(d, x.ndim) for d in ([dims] if is_int(dims) else dims)]
    if len(axes) != len(shifts):
        raise UserError(f"roll: {len(shifts)} shifts for {len(axes)} dims")
    by = {}
    for a, s in zip(axes, shifts):
        if not is_int(x.shape[a]):
            raise UserError(f"roll along axis {a} of size {x.shape[a]}, known at run time only: not translated")
        by[a] = by.get(a, 0) + s
    return _rolled(x, by)


def _rolled(x: Tensor, by: dict) -> Tensor:
    """``x`` rolled by ``by[a]`` along each axis ``a`` in ``by`` (int sizes): ``out[.., i, ..] =
    x[.., (i + n - s mod n) mod n, ..]``."""
    by = {a: s % int(x.shape[a]) if int(x.shape[a]) else 0 for a, s in by.items()}
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
