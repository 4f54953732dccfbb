"""Layout operators: reshape, flatten, transpose, concat, split, chunk, pad and strided_slice.

Every output element reads one input element through a quasi-affine index map
(sums, constant multiples, ``//`` and ``%`` by constants), with guards only
where an output element has no source (padding, the boundaries of a concat).
"""
from __future__ import annotations

import functools
import numbers
from typing import List, Sequence

from .. import dsl, dtypes
from ..errors import UserError
from ..ir import Expr, SizeVar, Tensor
from ..sizes import same_shape
from ._util import (affine, check_tensor, compute, is_int, is_size, monomial, monomial_div, monomial_equal,
                    monomial_expr, monomial_mul, monomial_prod, normalize_axis, prod)

__all__ = ["reshape", "flatten", "transpose", "concat", "split", "chunk", "pad", "strided_slice"]


def _newshape(x: Tensor, newshape) -> tuple:
    if is_int(newshape) or isinstance(newshape, Expr):
        newshape = (newshape,)
    try:
        shape = tuple(newshape)
    except TypeError:
        raise UserError(f"reshape: newshape must be a tuple of ints, got {newshape!r}") from None
    if not all(is_size(s) for s in shape):
        raise UserError(f"reshape: newshape must hold non-negative ints, size expressions (tg.var) and at "
                        f"most one -1, got {_show(newshape)}")
    if not all(is_int(s) for s in shape + tuple(x.shape)):
        return _symbolic_newshape(x, shape, newshape)
    if not all(s >= -1 for s in shape) or sum(s == -1 for s in shape) > 1:
        raise UserError(f"reshape: newshape must hold non-negative ints and at most one -1, "
                        f"got {newshape!r}")
    if -1 in shape:
        known = prod(s for s in shape if s != -1)
        if known == 0 or x.size % known:
            raise UserError(f"reshape: cannot reshape {x.name} of shape {list(x.shape)} "
                            f"({x.size} elements) into {list(shape)}")
        shape = tuple(x.size // known if s == -1 else int(s) for s in shape)
    if prod(shape) != x.size:
        raise UserError(f"reshape: cannot reshape {x.name} of shape {list(x.shape)} ({x.size} "
                        f"elements) into {list(shape)} ({prod(shape)} elements)")
    return tuple(int(s) for s in shape)


def _show(shape) -> str:
    try:
        return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    except TypeError:
        return repr(shape)


def _symbolic_newshape(x: Tensor, shape, given) -> tuple:
    """``newshape`` for a shape with size expressions: the -1 and the element count are found by
    structural arithmetic on products (``n * 64 == 64 * n``, ``(n * 64) / 64 == n``), so a reshape
    is accepted exactly when it is one for every value of the size variables."""
    ints = [s for s in shape if is_int(s)]
    if any(s < -1 for s in ints) or sum(s == -1 for s in ints) > 1:
        raise UserError(f"reshape: newshape must hold non-negative ints, size expressions (tg.var) and at "
                        f"most one -1, got {_show(given)}")
    total = monomial_prod(x.shape)
    if any(is_int(s) and s == -1 for s in shape):
        known = monomial_prod(s for s in shape if not (is_int(s) and s == -1))
        rest = monomial_div(total, known)
        if rest is None:
            raise UserError(f"reshape: cannot infer the -1 of {_show(given)} for {x.name} of shape "
                            f"{_show(x.shape)}: its {monomial_expr(total)} elements are not a multiple of "
                            f"{monomial_expr(known)} for every value of the sizes; give that extent explicitly")
        shape = tuple(monomial_expr(rest) if is_int(s) and s == -1 else s for s in shape)
    if not monomial_equal(monomial_prod(shape), total):
        raise UserError(f"reshape: cannot reshape {x.name} of shape {_show(x.shape)} ({monomial_expr(total)} "
                        f"elements) into {_show(shape)} ({monomial_expr(monomial_prod(shape))} elements) for "
                        f"every value of the sizes")
    return tuple(int(s) if is_int(s) else s for s in shape)


def _blocks(a: Sequence[int], b: Sequence[int]):
    """Split two shapes of equal size into runs of dimensions with equal products."""
    if not all(is_int(s) for s in tuple(a) + tuple(b)):
        return _symbolic_blocks(a, b)
    if 0 in a or 0 in b:
        return [(list(range(len(a))), list(range(len(b))))]
    blocks, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        si, sj = i, j
        pa, pb = a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                pa, i = pa * a[i], i + 1
            else:
                pb, j = pb * b[j], j + 1
        blocks.append((list(range(si, i)), list(range(sj, j))))
    if i < len(a) or j < len(b):  # the remaining dimensions all have size 1
        rest = (list(range(i, len(a))), list(range(j, len(b))))
        if blocks:
            blocks[-1] = (blocks[-1][0] + rest[0], blocks[-1][1] + rest[1])
        else:
            blocks.append(rest)
    return blocks


def _symbolic_blocks(a, b):
    """:func:`_blocks` for shapes with size expressions: products compared structurally; a run
    grows on the side whose product divides the other's (or, when neither does, on ``a``)."""
    ma, mb = [monomial(s) for s in a], [monomial(s) for s in b]
    if any(m[0] == 0 and not m[1] for m in ma + mb):
        return [(list(range(len(a))), list(range(len(b))))]
    one = (1, ())
    blocks, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        si, sj = i, j
        pa, pb = ma[i], mb[j]
        i, j = i + 1, j + 1
        while not monomial_equal(pa, pb):
            grow_b = monomial_div(pa, pb) is not None and \
                (monomial_div(pb, pa) is None or pb[0] < pa[0])
            if grow_b and j < len(b):
                pb, j = monomial_mul(pb, mb[j]), j + 1
            elif i < len(a):
                pa, i = monomial_mul(pa, ma[i]), i + 1
            elif j < len(b):
                pb, j = monomial_mul(pb, mb[j]), j + 1
            else:  # pragma: no cover - the element counts were checked equal
                raise UserError(f"reshape: cannot match the dimensions of {_show(a)} and {_show(b)}")
        blocks.append((list(range(si, i)), list(range(sj, j))))
    if i < len(a) or j < len(b):  # the remaining dimensions all have size 1
        if not all(monomial_equal(m, one) for m in ma[i:] + mb[j:]):  # pragma: no cover - counts are equal
            raise UserError(f"reshape: cannot match the dimensions of {_show(a)} and {_show(b)}")
        rest = (list(range(i, len(a))), list(range(j, len(b))))
        if blocks:
            blocks[-1] = (blocks[-1][0] + rest[0], blocks[-1][1] + rest[1])
        else:
            blocks.append(rest)
    return blocks


def _is_one(s) -> bool:
    return is_int(s) and s == 1


def _need_int(what, s, in_shape, out_shape):
    if not is_int(s):
        raise UserError(f"reshape: {_show(in_shape)} to {_show(out_shape)} would index by {what} {s}, a size "
                        f"known only at run time (indices must stay affine in the sizes); keep size "
                        f"variables in dimensions that map one to one (e.g. the batch first) or after "
                        f"every other extent of their group")
    return s


def _reshape_index(in_shape, out_shape, idx):
    """The input index read by output ``idx`` of a row-major reshape."""
    out = [0] * len(in_shape)
    for ins, outs in _blocks(in_shape, out_shape):
        flat, stride = 0, 1
        for d in reversed(outs):
            if not _is_one(out_shape[d]):
                term = affine(idx[d], _need_int("a stride", stride, in_shape, out_shape))
                flat = term if isinstance(flat, int) else term + flat
            stride = stride * out_shape[d]
        stride, first = 1, next((d for d in ins if not _is_one(in_shape[d])), None)
        for d in reversed(ins):
            if _is_one(in_shape[d]) or isinstance(flat, int):
                out[d] = 0
                continue
            e = flat if _is_one(stride) else flat // _need_int("a stride", stride, in_shape, out_shape)
            out[d] = e if d == first else e % _need_int("an extent", in_shape[d], in_shape, out_shape)
            stride = stride * in_shape[d]
    return tuple(out)


def reshape(x: Tensor, newshape, name: str = "reshape") -> Tensor:
    """``x`` with its elements, in row-major order, laid out in ``newshape``.

    ``newshape`` is a tuple of ints (or size expressions, ``tg.var``) of the same total
    size; one entry may be -1 (inferred). Output element ``idx`` reads the input element
    with the same row-major flat position; runs of dimensions whose products agree are
    mapped separately, so merging or splitting axes gives short index formulas.

    With size expressions the products are compared structurally: ``(n, 8, 8)`` reshapes to
    ``(n, 64)``, ``(-1, 64)`` (the -1 is ``n``) or ``(n * 64,)``; a -1 that does not divide
    the element count for every size, a different count, or a layout whose index would need
    a run-time stride or modulus (``(n, 4)`` to ``(4, n)``) is a :class:`UserError`.
    """
    check_tensor("reshape", x, "input")
    shape = _newshape(x, newshape)
    return compute(shape, lambda idx: x[_reshape_index(x.shape, shape, idx)], name=name)


def flatten(x: Tensor) -> Tensor:
    """``x`` (N, d1, d2, ...) reshaped to (N, d1*d2*...), keeping dimension 0.

    Same as TVM's ``batch_flatten`` (``torch.flatten(x, 1)`` for rank >= 2); a 1-D ``x``
    becomes (N, 1).
    """
    check_tensor("flatten", x, "input")
    if x.ndim < 1:
        raise UserError(f"flatten: input {x.name} is 0-d; it needs a batch dimension")
    return reshape(x, (x.shape[0], prod(x.shape[1:])), name="flatten")


def transpose(x: Tensor, axes=None) -> Tensor:
    """``x`` with its axes permuted: output axis ``d`` is input axis ``axes[d]``.

    ``axes`` defaults to reversing the axes (as ``numpy.transpose``); negative
    entries count from the end. ``out[i_0, ..., i_{r-1}] = x[j]`` with ``j[axes[d]] = i_d``.
    """
    op = "transpose"
    check_tensor(op, x, "input")
    if axes is None:
        axes = tuple(reversed(range(x.ndim)))
    try:
        axes = tuple(axes)
    except TypeError:
        raise UserError(f"{op}: axes must be a permutation of the axes of {x.name}, got {axes!r}") \
            from None
    perm = tuple(normalize_axis(op, a, x.ndim) for a in axes)
    if sorted(perm) != list(range(x.ndim)):
        raise UserError(f"{op}: axes {axes!r} is not a permutation of range({x.ndim})")
    shape = tuple(x.shape[p] for p in perm)

    def body(idx):
        src = [None] * x.ndim
        for d, p in enumerate(perm):
            src[p] = idx[d]
        return x[tuple(src)]

    return compute(shape, body, name=op)


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """The tensors joined along ``axis``; all other dimensions must agree.

    Along ``axis`` the output at position ``i`` reads tensor ``t`` at ``i - offset_t``
    where ``offset_t <= i < offset_t + size_t``: a chain of ``tg.if_then_else`` on ``i``.
    Dtypes promote as in arithmetic.
    """
    op = "concat"
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)) or not tensors:
        raise UserError(f"{op}: expects a non-empty list of tensors, got {tensors!r}")
    for t in tensors:
        check_tensor(op, t, "every input")
    first = tensors[0]
    axis = normalize_axis(op, axis, first.ndim)
    for t in tensors[1:]:
        if t.ndim != first.ndim or any(not same_shape(t.shape[d:d + 1], first.shape[d:d + 1])
                                       for d in range(t.ndim) if d != axis):
            raise UserError(f"{op}: {t.name} of shape {list(t.shape)} does not match "
                            f"{first.name} of shape {list(first.shape)} outside axis {axis}")
    parts, offset = [], 0
    for t in tensors:
        ext = t.shape[axis]
        if not (is_int(ext) and ext == 0):
            parts.append((offset, t))
        offset = ext if is_int(offset) and offset == 0 else offset + ext  # a size expression with tg.var
    shape = first.shape[:axis] + (offset,) + first.shape[axis + 1:]
    dtype = functools.reduce(dtypes.promote, [t.dtype for t in tensors])

    def body(idx):
        def at(t, off):
            at_axis = affine(idx[axis], 1, -off) if is_int(off) else idx[axis] - off
            return dsl.cast(dtype, t[idx[:axis] + (at_axis,) + idx[axis + 1:]])

        if not parts:
            return dsl.cast(dtype, 0)
        off, t = parts[-1]
        val = at(t, off)
        for (off, t), (nxt, _) in zip(reversed(parts[:-1]), reversed(parts[1:])):
            val = dsl.if_then_else(idx[axis] < nxt, at(t, off), val)
        return val

    return compute(shape, body, name=op)


def _slice_axis(x: Tensor, axis: int, start: int, stop: int, name: str, extent=None) -> Tensor:
    ext = extent if extent is not None else stop if is_int(start) and start == 0 else stop - start
    shape = x.shape[:axis] + (ext,) + x.shape[axis + 1:]

    def body(idx):
        at = affine(idx[axis], 1, start) if is_int(start) else idx[axis] + start
        return x[idx[:axis] + (at,) + idx[axis + 1:]]

    return compute(shape, body, name=name)


def split(x: Tensor, indices_or_sections=None, axis: int = 0, *, sizes=None) -> List[Tensor]:
    """``x`` cut along ``axis`` into a list of tensors, as ``numpy.split`` or ``torch.split``.

    ``indices_or_sections`` (``numpy.split``) is either an int ``k`` (``k`` equal parts; it
    must divide the axis) or a sorted list of cut positions (``[2, 5]`` gives ``[:2]``,
    ``[2:5]``, ``[5:]``; positions beyond the axis are clipped). ``sizes`` instead (keyword
    only; ``torch.split(x, sizes, axis)``) is either an int ``s`` (parts of ``s`` elements,
    the last one smaller when ``s`` does not divide the axis) or a list of part lengths
    summing to the axis. Part ``t`` reads ``x`` at ``i + start_t`` along the axis.
    """
    op = "split"
    check_tensor(op, x, "input")
    axis = normalize_axis(op, axis, x.ndim)
    n = x.shape[axis]
    if sizes is not None or indices_or_sections is None:
        if indices_or_sections is not None:
            raise UserError(f"{op}: give indices_or_sections (numpy.split) or sizes (torch.split), not both")
        indices_or_sections = _torch_cuts(op, x, axis, n, sizes)
    return _split(x, indices_or_sections, axis, n, op)


def _split(x: Tensor, indices_or_sections, axis: int, n, name: str) -> List[Tensor]:
    """:func:`split` (numpy's form) on a normalized ``axis`` of size ``n``; the parts are named ``name``."""
    op = "split"
    if not is_int(n):
        return _split_symbolic(x, indices_or_sections, axis, n, name)
    if is_int(indices_or_sections):
        k = int(indices_or_sections)
        if k < 1 or n % k:
            raise UserError(f"{op}: {k} sections do not divide axis {axis} of {x.name} "
                            f"(size {n})")
        cuts = [n // k * t for t in range(1, k)]
    else:
        try:
            cuts = list(indices_or_sections)
        except TypeError:
            raise UserError(f"{op}: indices_or_sections must be an int or a list of ints, got "
                            f"{indices_or_sections!r}") from None
        if not all(is_int(c) and c >= 0 for c in cuts) or cuts != sorted(cuts):
            raise UserError(f"{op}: split indices must be sorted non-negative ints, got "
                            f"{indices_or_sections!r}")
        cuts = [min(int(c), n) for c in cuts]
    bounds = [0] + cuts + [n]
    return [_slice_axis(x, axis, a, b, name) for a, b in zip(bounds[:-1], bounds[1:])]


def _torch_cuts(op: str, x: Tensor, axis: int, n, sizes) -> List[int]:
    """The cut positions of ``torch.split(x, sizes, axis)`` (an int part length or a list of them)."""
    if sizes is None:
        raise UserError(f"{op}: give indices_or_sections (numpy.split) or sizes (torch.split)")
    if not is_int(n):
        raise UserError(f"{op}: axis {axis} of {x.name} has the size {n}, known only at run time; "
                        f"sizes= needs an int extent (split it into equal sections with indices_or_sections)")
    if is_int(sizes):
        if sizes < 1:
            raise UserError(f"{op}: the part length sizes must be a positive int, got {sizes!r}")
        return list(range(int(sizes), n, int(sizes)))
    try:
        parts = list(sizes)
    except TypeError:
        raise UserError(f"{op}: sizes must be an int or a list of ints, got {sizes!r}") from None
    if not parts or not all(is_int(p) and p >= 0 for p in parts) or sum(parts) != n:
        raise UserError(f"{op}: sizes must be non-negative ints summing to the size {n} of axis {axis} of "
                        f"{x.name}, got {sizes!r}")
    cuts, at = [], 0
    for p in parts[:-1]:
        at += int(p)
        cuts.append(at)
    return cuts


def chunk(x: Tensor, chunks: int, axis: int = 0) -> List[Tensor]:
    """``x`` cut along ``axis`` into at most ``chunks`` parts, as ``torch.chunk``.

    Each part has ``ceil(n / chunks)`` elements (``n`` the axis' size) but the last, which
    holds the rest; so there are fewer than ``chunks`` parts where the rest runs out sooner
    (6 in 4 chunks gives 2, 2, 2). On an axis whose size is a size expression (``tg.var``),
    ``chunks`` must divide it structurally (``4 * n`` in 2 or 4 chunks): equal parts.
    """
    op = "chunk"
    check_tensor(op, x, "input")
    if not is_int(chunks) or chunks < 1:
        raise UserError(f"{op}: chunks must be a positive int, got {chunks!r}")
    axis = normalize_axis(op, axis, x.ndim)
    n = x.shape[axis]
    if not is_int(n):
        if monomial_div(monomial(n), (int(chunks), ())) is None:
            raise UserError(f"{op}: axis {axis} of {x.name} has the size {n}, known only at run time; "
                            f"{chunks} chunks need it to be a multiple of {chunks} for every value of the sizes")
        return _split(x, int(chunks), axis, n, op)
    if n == 0:
        raise UserError(f"{op}: axis {axis} of {x.name} is empty (shape {list(x.shape)})")
    size = -(-n // int(chunks))
    return _split(x, list(range(size, n, size)), axis, n, op)


def _split_symbolic(x: Tensor, indices_or_sections, axis: int, n, name: str = "split") -> List[Tensor]:
    """:func:`split` along an axis whose size ``n`` is a size expression: ``k`` sections need ``n``
    to be a multiple of ``k`` structurally (``4 * n`` in 2); cut positions need a size variable
    whose ``min`` reaches the last cut, so that no part is ever negative."""
    op = "split"
    if is_int(indices_or_sections):
        k = int(indices_or_sections)
        part = monomial_div(monomial(n), (k, ())) if k >= 1 else None
        if part is None:
            raise UserError(f"{op}: {k} sections do not divide axis {axis} of {x.name} (size {n}) for every "
                            f"value of the sizes")
        step = monomial_expr(part)
        return [_slice_axis(x, axis, step * t if t > 1 else (step if t else 0), None, name, extent=step)
                for t in range(k)]
    else:
        try:
            cuts = list(indices_or_sections)
        except TypeError:
            raise UserError(f"{op}: indices_or_sections must be an int or a list of ints, got "
                            f"{indices_or_sections!r}") from None
        if not all(is_int(c) and c >= 0 for c in cuts) or cuts != sorted(cuts):
            raise UserError(f"{op}: split indices must be sorted non-negative ints, got "
                            f"{indices_or_sections!r}")
        last = max(cuts, default=0)
        lo = getattr(n, "lo", None)
        if last and not (isinstance(n, SizeVar) and lo >= last):
            raise UserError(f"{op}: axis {axis} of {x.name} has the size {n}, known only at run time; cutting "
                            f"it at {cuts} needs a size variable declared with min >= {last} "
                            f"(tg.var(..., min={last}))")
        bounds = [0] + [int(c) for c in cuts] + [n]
    return [_slice_axis(x, axis, a, b, name) for a, b in zip(bounds[:-1], bounds[1:])]


def _pad_width(x: Tensor, pad_width):
    def bad():
        return UserError(f"pad: pad_width must be an int, (before, after) or one (before, after) "
                         f"pair per axis of {x.name} (rank {x.ndim}), with non-negative ints; "
                         f"got {pad_width!r}")
    if is_int(pad_width):
        pairs = [(pad_width, pad_width)] * x.ndim
    else:
        try:
            items = list(pad_width)
        except TypeError:
            raise bad() from None
        if len(items) == 2 and all(is_int(v) for v in items):
            pairs = [tuple(items)] * x.ndim
        elif len(items) == 1 and isinstance(items[0], (tuple, list)):
            pairs = [tuple(items[0])] * x.ndim
        elif len(items) == x.ndim:
            pairs = [tuple(p) if isinstance(p, (tuple, list)) else p for p in items]
        else:
            raise bad()
    for p in pairs:
        if not (isinstance(p, tuple) and len(p) == 2 and all(is_int(v) and v >= 0 for v in p)):
            raise bad()
    return [(int(a), int(b)) for a, b in pairs]


def pad(x: Tensor, pad_width, value=0.0) -> Tensor:
    """``x`` padded with the constant ``value``, as ``numpy.pad(x, pad_width)`` in constant mode.

    ``pad_width`` is an int, a (before, after) pair for every axis, or one pair
    per axis. The output has ``before + size + after`` elements along each axis and
    reads ``x[i - before]`` where ``before <= i < before + size``, else ``value``.
    The result keeps the dtype of ``x`` (``value`` must be representable in it).
    """
    check_tensor("pad", x, "input")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UserError(f"pad: value must be a number, got {value!r}")
    pairs = _pad_width(x, pad_width)
    try:
        fill = dsl.const(value, x.dtype)
    except UserError as err:
        raise UserError(f"pad: value {value!r} does not fit the dtype of {x.name}: {err}") from None
    shape = tuple(b + s + a for (b, a), s in zip(pairs, x.shape))

    def body(idx):
        conds = []
        for i, (b, a), s in zip(idx, pairs, x.shape):
            if b:
                conds.append(i >= b)
            if a:
                conds.append(i < b + s)
        val = x[tuple(affine(i, 1, -b) for i, (b, _) in zip(idx, pairs))]
        return dsl.if_then_else(dsl.all(*conds), val, fill) if conds else val

    return compute(shape, body, name="pad")


def strided_slice(x: Tensor, begin, end, strides=None) -> Tensor:
    """``x[begin[0]:end[0]:strides[0], begin[1]:end[1]:strides[1], ...]`` with numpy semantics.

    ``begin``, ``end`` and ``strides`` list one entry per leading axis (missing
    axes are kept whole; a ``None`` entry means the default); negative positions
    count from the end and out-of-range ones are clipped, as in Python slicing.
    Strides may be negative. Along each axis the output reads ``start + i * stride``.
    """
    op = "strided_slice"
    check_tensor(op, x, "input")
    begin, end = list(_seq(op, "begin", begin)), list(_seq(op, "end", end))
    strides = [1] * len(begin) if strides is None else list(_seq(op, "strides", strides))
    if not len(begin) == len(end) == len(strides) or len(begin) > x.ndim:
        raise UserError(f"{op}: begin {begin}, end {end} and strides {strides} must have the same "
                        f"length, at most the rank {x.ndim} of {x.name}")
    for s in strides:
        if s == 0:
            raise UserError(f"{op}: strides must be non-zero, got {strides}")
    starts, steps, shape = [], [], []
    for d, n in enumerate(x.shape):
        if d < len(begin):
            sl = slice(begin[d], end[d], strides[d])
        else:
            sl = slice(None)
        if not is_int(n):  # a size known at run time: only kept whole
            if sl.start not in (None, 0) or sl.stop is not None or sl.step not in (None, 1):
                raise UserError(f"{op}: axis {d} of {x.name} has the size {n}, known only at run time; "
                                f"strided_slice keeps such an axis whole (begin 0 or None, end None, stride "
                                f"1), got {begin[d]}:{end[d]}:{strides[d]}")
            starts.append(0)
            steps.append(1)
            shape.append(n)
            continue
        start, stop, step = sl.indices(n)
        starts.append(start)
        steps.append(step)
        shape.append(len(range(start, stop, step)))

    def body(idx):
        src = []
        for i, start, step in zip(idx, starts, steps):
            if step > 0:
                src.append(affine(i, step, start))
            else:  # start - i * |step|
                src.append(start - (i if step == -1 else i * -step))
        return x[tuple(src)]

    return compute(tuple(shape), body, name=op)


def _seq(op, what, v):
    if is_int(v):
        v = (v,)
    try:
        v = tuple(v)
    except TypeError:
        raise UserError(f"{op}: {what} must be a list of ints, got {v!r}") from None
    if not all(e is None or is_int(e) for e in v):
        raise UserError(f"{op}: {what} must be a list of ints (or None), got {v!r}")
    return tuple(None if e is None else int(e) for e in v)
