"""Packing: copies of a contraction's operands in the layout its loops want.

Four kinds of copy, each a stage of its own computed on every call (it costs one pass over
the operand, repaid by the reuse of each element):

**Transposed** (``X @ W.T``, ``nn.dense``, ``Q @ K.T``, ``A.T @ B.T``). In
``Y[i, j] = sum_k A[i, k] * B[j, k]`` both operands are contiguous along the
reduce axis ``k``, so the register block's lanes would run along ``k``: every
multiply-add loads a vector of both operands and the lanes are summed at the end
of each dot product (with ``A[k, i]``, along ``i``, the output's rows, stored
element by element). Reading a copy ``P[k, j] = B[j, k]`` instead (``B`` with the
dimensions of ``j`` and ``k`` swapped) lets the lanes run along the output axis
``j``: one vector of ``P`` per ``k`` for a block of rows broadcasting ``A``, the
form of a GEMM micro-kernel. Made when the schedule would run the lanes along
another axis and each element of ``B`` serves enough rows (:class:`Thresholds`).

**Zero-padded** (convolutions with padding, and their gradients). After
simplification a padded convolution sums over bounds such as
``ry in [max(0, 1 - h), min(3, 33 - h))``: exact, but the loops then split the
output into an interior and thin edge pieces whose lanes cross rows (gathers).
When one factor ``X[..]`` of the summand is what clips the bounds, reading a copy
``Xp`` of ``X`` with a border of zeros lets the sum run over the constant hull of
the bounds (``ry in [0, 3)``) at every output point. isl proves, for each such
term, that every point the hull adds reads ``X`` out of its range: there ``Xp``
holds 0, a factor of the summand, so the term's value is unchanged for finite
operands. Every factor must be a read or a constant: a computed factor (a
partial derivative such as ``0.5 / sqrt(x)``) could be infinite at an added point,
and te_grad never multiplies a structural zero by a partial. An infinite or NaN
*input* element multiplied by the border gives NaN there, as in PyTorch's padded
convolution and in the formula written with ``if_then_else(inside, X, 0) * W``;
the evaluator, which skips those points, gives the other factors' sum.

**Split into congruence classes** (strided convolutions and their weight
gradients). A read ``X[.., 2*w + rx]`` whose lanes run along ``w`` steps by 2:
each vector is a span twice as long, shuffled. The copy
``P[.., q, m] = X[.., 2*m + q]`` holds each class ``q`` of the last dimension
contiguously and the read becomes ``P[.., rx % 2, w + rx // 2]``: unit stride in
``w``. Made for steps 2 to 4 along the axis the schedule runs the term's lanes
along, when each element is read
often enough (not for a pooling window, which reads each once).

**In panels** (long weight rows: ``X @ W`` over 512 outputs, the input gradient through
``W``, a weight gradient walking many rows of a layer input). A register block whose lanes
run along the output axis ``j`` reads ``W[k, j0 : j0 + 16]`` for each step of ``k``: one
cache line per step, but each 2 KiB past the last, a new page every second step. The copy
``P[j // w, k, j % w] = W[k, j]`` (``w`` columns: one cache line, 16 float32 or 8 float64)
lays each panel's rows one after the other, and the read becomes ``P[j // w, k, j % w]``:
:func:`.loop_order.panel_width` costs it as contiguous along ``j``, and a block whose first
lane is a multiple of ``w`` (or of its width, when narrower) loads each panel's part as one
vector (:mod:`.llvm_blocks`; a block starting elsewhere, the last block of an output row that
is not a multiple of ``w``, gathers its lanes). Made for a sum whose lanes run along the
output axis ``j``, read as the last index of ``W`` and by no other operand, when ``W``'s last
extent is a multiple of ``w`` (more than one panel); when neither the term's bounds nor its
``where`` depend on ``j`` and the output is not among the tensors a padded hull must not
read (those written only on a region, and the like: their loops may start anywhere); when a
step of the reduction moves at least ``min_panel_stride`` bytes or the walk spans
``min_panel_bytes``; and when each element serves ``min_reuse`` rows and the product has
``min_work`` multiply-adds (:class:`Thresholds`; on a Zen 3 core ``(1024, 128) @ (128, 512)``
went from 2.09 to 1.68 ms, 64 to 80 GFLOP/s, BENCHMARKS.md; a 128-wide ``W`` of 128 rows
gained nothing). A transposed copy may itself be copied in panels (two passes). The copy is
chosen from the lanes :func:`.loop_order.lane_var` predicts; where the final schedule runs
them elsewhere (tiny operands built with every copy) it is made and read element by element.

Promises: the rewritten body computes the same values (the copies hold exactly
the operands' values, and zeros); the copies are returned, producers of the new
body. Terms that do not match are left as they are.
"""
from __future__ import annotations

from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from simplify.affine import IslNames, isl_expr
from simplify.isl_bridge import IslError, parse_map
from simplify.linear import coefficient, normalize
from te_grad import dsl
from te_grad.graph import free_vars
from te_grad.ir import distinct_reads
from te_grad.intervals import interval, speculatable
from te_grad.ir import Binary, Const, Expr, Read, Reduce, ReduceAxis, Tensor, Var
from te_grad.sizes import is_size_expr, size_vars_in
from te_grad.transform import substitute
from te_grad.visitor import Mutator

from .llvm_types import SIZE
from .loop_order import representative
from .options import Thresholds, compile_options, current_options
from .symbolic_bounds import speculatable_within, symbolic_inside

#: the thresholds kernels are built with
DEFAULT = Thresholds()
#: every valid copy and cache tile, whatever its size, and split axes jammed down to one block:
#: lets tests and the fuzzer exercise the copies, tiles and jams on small programs
EVERY_COPY = Thresholds(min_reuse=2, min_reduction=2, min_work=0, min_padded_reuse=0, max_padded_growth=1e9,
                        min_tile_steps=1, min_split_blocks=1, min_panel_stride=0, min_panel_bytes=0)


def thresholds() -> Thresholds:
    """The thresholds in force: ``thresholds`` of the compile options (part of a build's
    cache key)."""
    return current_options().thresholds


def using(t: Thresholds):
    """Build kernels with thresholds ``t`` inside the ``with`` block (shorthand for
    ``compile_options(thresholds=t)``)."""
    return compile_options(thresholds=t)


class Copies:
    """The copies made for one kernel: an operand copied the same way twice (the input of a
    convolution, padded for its forward and for its weight gradient) is copied once."""

    def __init__(self):
        self.made: Dict[tuple, Tensor] = {}

    def get(self, key: tuple, make: Callable[[], Tensor]) -> Tuple[Tensor, bool]:
        """The copy ``key`` names, and whether it is new (``make`` builds it)."""
        if key in self.made:
            return self.made[key], False
        self.made[key] = make()
        return self.made[key], True


def pack_operands(t: Tensor, body: Expr, terms, lane_of: Callable[[Tensor, Reduce], Optional[Var]],
                  copies: Optional[Copies] = None, unhulled: FrozenSet[int] = frozenset()) -> Tuple[Expr, List[Tensor]]:
    """``body`` (of compute ``t``, in terms form: ``terms`` as ``split_terms`` gives them)
    with padded, split and transposed operands read from copies, and the copies made for
    it (those already in ``copies`` are reused, not returned). ``lane_of(t, term)`` is the
    variable the schedule will run a term's vector lanes along. ``unhulled``: ids of tensors a
    padded hull must not read (written only where their readers use them,
    :mod:`simplify.unread`, or computed at points the graph never evaluates: a lifted
    reduction, the tensor a masked copy's readers read instead)."""
    copies = copies if copies is not None else Copies()
    packed: List[Tensor] = []
    swaps: Dict[int, Expr] = {}

    def use(key, make):
        copy, new = copies.get(key, make)
        if new:
            packed.append(copy)
        return copy

    for _, red in terms:
        new = red
        padded = _padded_term(t, new, unhulled)
        if padded is not None:
            f, before, shape, axes = padded
            copy = use(("padded", id(f.tensor), tuple(before), shape),
                       lambda: _zero_padded(f.tensor, before, shape))
            new = _hulled(new, f, copy, before, axes)
        interleaved = _interleaved_read(t, new, lane_of(t, new))
        if interleaved is not None:
            read, step = interleaved
            copy = use(("classes", id(read.tensor), step), lambda: _deinterleaved(read.tensor, step))
            new = _Replace({id(read): _class_read(read, copy, step)}).visit(new)
        lane = lane_of(t, new)
        read = _dot_product_operand(t, new, lane)
        if read is not None:
            perm = _swap_to_last(read, _contiguous_axis(t))
            copy = use(("packed", id(read.tensor), tuple(perm)), lambda: _transposed(read.tensor, perm))
            new = _Replace({id(read): Read(copy, tuple(read.indices[p] for p in perm))}).visit(new)
        else:
            gathered = _gathered_along_lanes(t, new, lane)
            if gathered is not None:
                read, order = gathered
                fixed = tuple(None if k in order else int(i.value) for k, i in enumerate(read.indices))
                copy = use(("lanes last", id(read.tensor), order, fixed),
                           lambda: _reordered(read.tensor, tuple(read.indices), order))
                new = _Replace({id(read): Read(copy, tuple(read.indices[d] for d in order))}).visit(new)
        panel = _panel_operand(t, new, lane_of(t, new), unhulled)
        if panel is not None:
            read, d, w = panel
            copy = use(("panels", id(read.tensor), d, w), lambda: _panels(read.tensor, d, w))
            new = _Replace({id(read): _panel_read(read, copy, d, w)}).visit(new)
        if new is not red:
            swaps[id(red)] = new
    if not swaps:
        return body, []
    return _Replace(swaps).visit(body), packed


# -- transposed copies ---------------------------------------------------------------------

def _plain(read: Read) -> bool:
    """Every index a distinct variable."""
    return all(isinstance(i, Var) for i in read.indices) and \
        len({id(i) for i in read.indices}) == len(read.indices)


def _dot_product_operand(t: Tensor, red: Reduce, lane: Optional[Var]) -> Optional[Read]:
    """The read ``B[.., j, .., k]`` of a sum over ``k`` when the lanes would not run along
    ``j``, the output's contiguous axis (they run along ``lane``), while ``B`` is read at
    ``j`` and contiguous in ``k``; None if the term is not such a contraction or too small
    to repay the copy."""
    if red.combiner != "sum" or not t.op.axes or lane is _contiguous_axis(t):
        return None
    j = _contiguous_axis(t)
    reads = distinct_reads(red.body)
    for b in reads:
        if not _plain(b) or b.tensor is t or len(b.indices) < 2:
            continue
        k = b.indices[-1]
        if not isinstance(k, ReduceAxis) or not any(k is a for a in red.axes) or k.extent is None:
            continue
        if not any(j is i for i in b.indices[:-1]) or k.extent < thresholds().min_reduction:
            continue
        if any(r is not b and any(j is x for i in r.indices for x in free_vars(i)) for r in reads):
            continue  # another operand is read along j as well: it would not be a broadcast
        used = {id(i) for i in b.indices}
        reuse = _count([n for a, n in zip(t.op.axes, t.shape) if id(a) not in used])
        if reuse < thresholds().min_reuse or _count(t.shape) * k.extent < thresholds().min_work:
            continue
        return b
    return None


def _contiguous_axis(t: Tensor) -> Var:
    """The output axis along which ``t``'s elements are contiguous: the last one whose extent
    is not 1 (``conv2d[n, c, 0, 0]`` of a 1 x 1 image steps by 1 along ``c``)."""
    axes = [a for a, n in zip(t.op.axes, t.shape) if isinstance(n, Expr) or n != 1]
    return axes[-1] if axes else t.op.axes[-1]


def _gathered_along_lanes(t: Tensor, red: Reduce, lane: Optional[Var]) -> Optional[Tuple[Read, Tuple[int, ...]]]:
    """A read ``B[.., j, .., f(k)]`` of a sum whose lanes run along the output axis ``j``,
    ``B`` indexed by ``j`` alone in a dimension that is not its last (each lane a gather)
    while its last index runs with the reduction; with the order of ``B``'s dimensions
    that moves ``j``'s last (``w[c, rc, ry, rx]`` in a convolution whose lanes run along
    the output channels ``c``: ``P[rc, ry, rx, c]``, one vector per tap and input
    channel). None if there is none, another operand is read along ``j`` too (it would
    not be a broadcast), or the copy would not pay."""
    if red.combiner != "sum" or lane is None or isinstance(lane, ReduceAxis) \
            or not any(lane is a for a in t.op.axes):
        return None
    reads = distinct_reads(red.body)
    th = thresholds()
    for b in reads:
        if b.tensor is t or len(b.indices) < 2:
            continue
        uses = [any(lane is x for x in free_vars(i)) for i in b.indices]
        if sum(uses) != 1 or uses[-1]:
            continue
        d = uses.index(True)
        # the copy may have extents known at run time (a batch read by a weight gradient's sum)
        # but not along the lanes
        if b.indices[d] is not lane or isinstance(b.tensor.shape[d], Expr):
            continue
        if any(r is not b and any(lane is x for i in r.indices for x in free_vars(i)) for r in reads):
            continue
        used = {id(x) for i in b.indices for x in free_vars(i)}
        reuse = _count([n for a, n in zip(t.op.axes, t.shape) if id(a) not in used])
        # a dimension read at a constant (the centre tap of a 1 x 1 image) is left out of the copy
        kept = [k for k, i in enumerate(b.indices) if k != d and not isinstance(i, Const)]
        reduction = _count([b.tensor.shape[k] for k in kept])
        if reuse < th.min_reuse or reduction < th.min_reduction or _count(t.shape) * reduction < th.min_work:
            continue
        return b, tuple(kept) + (d,)
    return None


def _reordered(src: Tensor, at: Tuple[Expr, ...], order: Tuple[int, ...]) -> Tensor:
    """``P[a] = src[b]`` with ``b[order[i]] = a[i]``, and ``b[k] = at[k]`` (a constant) for a
    dimension ``k`` not in ``order``: ``src``'s dimensions in ``order``."""
    def body(*axes):
        index = list(at)
        for i, d in enumerate(order):
            index[d] = axes[i]
        return src[tuple(index)]
    return dsl.compute(tuple(src.shape[d] for d in order), body, name=f"{src.name}_packed")


def _count(shape) -> int:
    """The number of elements of ``shape``, an extent known only at run time counted at its
    representative size (:func:`.loop_order.representative`): the copies are chosen there."""
    return int(np.prod([representative(n) for n in shape] or [1]))


def _out_bounds(t: Tensor) -> Tuple[Dict[int, tuple], Dict[int, tuple]]:
    """The inclusive int ranges of ``t``'s axes whose extents are ints, and the ``(lo, hi)``
    bounds of all of them (extents known at run time as size expressions)."""
    ranges = {id(a): (0, n - 1) for a, n in zip(t.op.axes, t.shape) if not isinstance(n, Expr)}
    bounds = {id(a): (dsl.const(0), n if isinstance(n, Expr) else dsl.const(n)) for a, n in zip(t.op.axes, t.shape)}
    return ranges, bounds


def _swap_to_last(b: Read, j: Var) -> List[int]:
    """The permutation of ``b``'s dimensions swapping the one ``j`` indexes with the last
    (an involution: ``P[a] = B[a[perm[0]], a[perm[1]], ...]``)."""
    d = next(n for n, i in enumerate(b.indices) if i is j)
    perm = list(range(len(b.indices)))
    perm[d], perm[-1] = perm[-1], perm[d]
    return perm


def _transposed(src: Tensor, perm: List[int]) -> Tensor:
    """``P[a] = src[a[perm[0]], a[perm[1]], ...]``."""
    return dsl.compute(tuple(src.shape[p] for p in perm),
                       lambda *axes: src[tuple(axes[p] for p in perm)], name=f"{src.name}_packed")


# -- copies in panels ----------------------------------------------------------------------

#: bytes across a panel: one cache line
PANEL_BYTES = 64


def _panel_operand(t: Tensor, red: Reduce, lane: Optional[Var],
                   unhulled: FrozenSet[int] = frozenset()) -> Optional[Tuple[Read, int, int]]:
    """``(read, d, w)`` for a read ``B[.., k, .., j]`` of a sum whose lanes run along the
    output axis ``j`` (``B`` contiguous along the lanes, one vector load per row of a block) and
    over a reduce axis ``k``, whose steps along ``k`` move far in memory (a weight ``W[k, j]``
    with long rows: a block takes each step's 64 bytes from a line 2 KiB past the last one);
    ``d`` is the first dimension of ``B`` a reduce axis indexes, ``w`` the panel width (one
    cache line). None if there is none, or the lanes might not start at a multiple of ``w``
    (the term's bounds or ``t``'s written region depend on ``j``), or the copy would not pay."""
    if red.combiner != "sum" or lane is None or isinstance(lane, ReduceAxis) or id(t) in unhulled \
            or not any(lane is a for a in t.op.axes):
        return None
    if any(lane is x for r in red.axes for b in (r.lo, r.hi) for x in free_vars(b)) or \
            (red.where is not None and any(lane is x for x in free_vars(red.where))):
        return None
    th = thresholds()
    reads = distinct_reads(red.body)
    for b in reads:
        if b.tensor is t or len(b.indices) < 2 or b.indices[-1] is not lane:
            continue
        if any(lane is x for i in b.indices[:-1] for x in free_vars(i)):
            continue
        n = b.tensor.shape[-1]
        w = PANEL_BYTES // SIZE[b.tensor.dtype]
        if isinstance(n, Expr) or n % w or n <= w or w < 2:
            continue
        if any(r is not b and any(lane is x for i in r.indices for x in free_vars(i)) for r in reads):
            continue  # another operand is read along the lanes too: not one vector per row of a block
        walked = [k for k, i in enumerate(b.indices) if any(isinstance(x, ReduceAxis) and any(x is a for a in red.axes)
                                                              for x in free_vars(i))]
        if not walked:
            continue
        d = walked[0]
        step = _count(b.tensor.shape[walked[-1] + 1:]) * SIZE[b.tensor.dtype]
        span = _count(b.tensor.shape[d:]) * SIZE[b.tensor.dtype]
        used = {id(x) for i in b.indices for x in free_vars(i)}
        reuse = _count([m for a, m in zip(t.op.axes, t.shape) if id(a) not in used])
        if step < th.min_panel_stride and span < th.min_panel_bytes:
            continue
        if reuse < th.min_reuse or _count(t.shape) * _count([b.tensor.shape[k] for k in walked]) < th.min_work:
            continue
        return b, d, w
    return None


def _panels(src: Tensor, d: int, w: int) -> Tensor:
    """``P[.., q, (dims from d), r] = src[.., (dims from d), q * w + r]``: ``src`` in panels
    of ``w`` along its last dimension, each panel contiguous across the dimensions from ``d``."""
    shape = tuple(src.shape[:d]) + (src.shape[-1] // w,) + tuple(src.shape[d:-1]) + (w,)

    def body(*axes):
        q, r = axes[d], axes[-1]
        return src[tuple(axes[:d]) + tuple(axes[d + 1:-1]) + (q * w + r,)]
    return dsl.compute(shape, body, name=f"{src.name}_panels")


def _panel_read(read: Read, copy: Tensor, d: int, w: int) -> Read:
    """``read`` of ``B[.., j]`` as the read of its panel copy: ``P[.., j // w, .., j % w]``."""
    j = read.indices[-1]
    idx = tuple(read.indices[:d]) + (j // w,) + tuple(read.indices[d:-1]) + (j % w,)
    return Read(copy, idx)


# -- zero-padded copies --------------------------------------------------------------------

def _factors(e: Expr) -> List[Expr]:
    """The operands of a chain of products."""
    if isinstance(e, Binary) and e.op == "mul":
        return _factors(e.a) + _factors(e.b)
    return [e]


def _padded_term(t: Tensor, red: Reduce, unhulled: FrozenSet[int] = frozenset()):
    """``(factor, border before, padded shape, hull)`` when the term may be summed over the
    constant hull of its bounds with that factor read from a zero-padded copy; None when
    the term's bounds are constant, no factor accounts for them (proved by isl), a factor
    reads a tensor of ``unhulled`` (whose values at the hull's other points are anything: 0
    times a NaN is no 0), or the copy would not pay."""
    if red.combiner != "sum" or red.where is not None or all(r.extent is not None for r in red.axes):
        return None
    out_ranges, out_bounds = _out_bounds(t)  # an axis of run-time extent has no int range
    hull: List[Tuple[int, int]] = []
    for r in red.axes:
        if any(isinstance(x, ReduceAxis) for b in (r.lo, r.hi) for x in free_vars(b)):
            return None  # bounds that depend on another reduce axis
        if _whole(r):  # a range of run-time extent over sizes alone (a weight gradient's batch): kept whole
            hull.append((r.lo, r.hi))
            continue
        lo, hi = interval(r.lo, out_ranges), interval(r.hi, out_ranges)
        if lo is None or hi is None or lo[0] >= hi[1]:
            return None
        hull.append((lo[0], hi[1]))
    factors = _factors(red.body)
    if not all(isinstance(g, (Read, Const)) for g in factors):
        return None  # a computed factor (a partial derivative) may be infinite where the hull adds points
    if any(isinstance(g, Read) and id(g.tensor) in unhulled for g in factors):
        return None
    for f in factors:
        if not isinstance(f, Read) or f.tensor is t:
            continue
        # a hull from intervals may be loose: another factor read at a reduce axis itself,
        # in range at every point of the term, clips it
        clipped = list(hull)
        for other in distinct_reads(red.body):
            if other is f:
                continue
            for i, n in zip(other.indices, other.tensor.shape):
                for k, r in enumerate(red.axes):
                    if i is r and not isinstance(n, Expr) and not _whole(r):
                        clipped[k] = (max(clipped[k][0], 0), min(clipped[k][1], n))
        if any(not isinstance(lo, Expr) and lo >= hi for lo, hi in clipped):
            continue
        ranges = dict(out_ranges)
        ranges.update({id(r): (lo, hi - 1) for r, (lo, hi) in zip(red.axes, clipped) if not isinstance(lo, Expr)})
        bounds = dict(out_bounds)
        bounds.update({id(r): (lo, hi) if isinstance(lo, Expr) else (dsl.const(lo), dsl.const(hi))
                       for r, (lo, hi) in zip(red.axes, clipped)})
        if not all(speculatable(g, ranges) if len(ranges) == len(bounds) else speculatable_within(g, ranges, bounds)
                   for g in factors if g is not f):
            continue  # another factor would be read out of its range somewhere in the hull
        work = _count(t.shape) * int(np.prod([representative(hi - lo) for lo, hi in clipped]))
        spans = [interval(i, ranges) for i in f.indices]
        # a dimension of run-time extent is never padded: its index stays inside for every size
        if any(s is None and not (isinstance(n, Expr) and symbolic_inside(i, n, bounds))
               or s is not None and isinstance(n, Expr) for s, i, n in zip(spans, f.indices, f.tensor.shape)):
            continue
        before = [max(0, -s[0]) if s is not None else 0 for s in spans]
        after = [max(0, s[1] - (n - 1)) if s is not None else 0 for s, n in zip(spans, f.tensor.shape)]
        if not any(before) and not any(after):
            continue
        shape = tuple(n + b + a if not isinstance(n, Expr) else n for n, b, a in zip(f.tensor.shape, before, after))
        size, original = _count(shape), _count(f.tensor.shape)
        th = thresholds()
        if size > th.max_padded_growth * original or work < max(th.min_work, th.min_padded_reuse * size):
            continue
        if not _hull_adds_only_reads_out_of_range(t, red, clipped, f):
            continue
        return f, before, shape, clipped
    return None


def _whole(r: ReduceAxis) -> bool:
    """Whether reduce axis ``r`` runs over a range of sizes alone (``0 <= n < batch``): its
    bounds are size expressions using a size variable, and no index variable."""
    return (bool(size_vars_in(r.lo) or size_vars_in(r.hi)) and is_size_expr(r.lo) and is_size_expr(r.hi))


def _hulled(red: Reduce, f: Read, copy: Tensor, before: Sequence[int], hull) -> Reduce:
    """``red`` summed over ``hull`` with ``f`` read from its zero-padded ``copy``."""
    axes = [dsl.reduce_axis((lo, hi), r.name) for r, (lo, hi) in zip(red.axes, hull)]
    rename = dict(zip(red.axes, axes))
    read = Read(copy, tuple(substitute(i, rename) + b for i, b in zip(f.indices, before)))
    return dsl.sum(substitute(_Replace({id(f): read}).visit(red.body), rename), axis=axes)


def _zero_padded(src: Tensor, before: Sequence[int], shape) -> Tensor:
    """``src`` inside a border of zeros: ``before[d]`` elements before it along dimension d."""
    def body(*axes):
        at = [a - b for a, b in zip(axes, before)]
        inside = dsl.all(*[c for x, n, b, m in zip(at, src.shape, before, shape)
                           for c in ((x >= 0, x < n) if (b or m is not n and m - n - b) else ())])
        return dsl.if_then_else(inside, src[tuple(at)], dsl.const(0, src.dtype))
    return dsl.compute(shape, body, name=f"{src.name}_padded")


def _hull_adds_only_reads_out_of_range(t: Tensor, red: Reduce, hull, f: Read) -> bool:
    """Whether the term's own domain lies in the hull, and every point of the hull where
    ``f`` reads inside its tensor is a point of the term's own domain (isl decides; False
    when a bound or index is not quasi-affine)."""
    names = IslNames({id(a): f"o{n}" for n, a in enumerate(t.op.axes)})
    names.update({id(r): f"r{n}" for n, r in enumerate(red.axes)})
    dims = ", ".join(list(names.values()))

    def extent(n):  # an int, or a size expression over isl parameters
        return str(n) if not isinstance(n, Expr) else isl_expr(n, names)
    if any(extent(n) is None for n in list(t.shape) + list(f.tensor.shape)):
        return False
    box = [f"0 <= o{n} < {extent(size)}" for n, size in enumerate(t.shape)]
    own, hulled = list(box), list(box)
    for n, (r, (lo, hi)) in enumerate(zip(red.axes, hull)):
        lo_text, hi_text = isl_expr(r.lo, names), isl_expr(r.hi, names)
        if lo_text is None or hi_text is None:
            return False
        own.append(f"{lo_text} <= r{n} < {hi_text}")
        if isinstance(lo, Expr):  # a whole range of run-time extent: the sizes as isl parameters
            lo, hi = isl_expr(lo, names), isl_expr(hi, names)
            if lo is None or hi is None:
                return False
        hulled.append(f"{lo} <= r{n} < {hi}")
    for i, size in zip(f.indices, f.tensor.shape):
        text = isl_expr(i, names)
        if text is None:
            return False
        hulled.append(f"0 <= {text} < {extent(size)}")
    params = names.size_vars()  # the sizes, isl parameters in their ranges
    head = f"[{', '.join(names.sizes)}] -> " if params else ""
    ranges = [f"{v.lo} <= {p}" + (f" <= {v.hi}" if v.hi is not None else "") for p, v in names.sizes.items()]
    try:
        inside = parse_map(f"{head}{{ [{dims}] -> [] : {' and '.join(hulled + ranges)} }}")
        domain = parse_map(f"{head}{{ [{dims}] -> [] : {' and '.join(own + ranges)} }}")
        box = parse_map(f"{head}{{ [{dims}] -> [] : {' and '.join(hulled[:len(own)] + ranges)} }}")
        return bool(inside.is_subset(domain)) and bool(domain.is_subset(box))
    except IslError:
        return False


# -- de-interleaved copies -----------------------------------------------------------------

def _interleaved_read(t: Tensor, red: Reduce, v: Optional[Var]) -> Optional[Tuple[Read, int]]:
    """A read ``X[.., s*v + g]`` of the term (``s`` in 2..4) when its lanes run along ``v``,
    with the step ``s``; None if there is none or the copy would not pay."""
    if v is None:
        return None
    reads = distinct_reads(red.body)
    extents = []
    out_ranges, _ = _out_bounds(t)
    for r in red.axes:
        lo, hi = interval(r.lo, out_ranges), interval(r.hi, out_ranges)
        if lo is None or hi is None:
            return None
        extents.append(max(0, hi[1] - lo[0]))
    work = _count(t.shape) * int(np.prod(extents or [1]))
    for f in reads:
        if f.tensor is t or not f.indices or isinstance(f.tensor.shape[-1], Expr):
            continue
        step = coefficient(f.indices[-1], v)
        if step not in (2, 3, 4) or any(v is x for i in f.indices[:-1] for x in free_vars(i)):
            continue
        size = _count(f.tensor.shape[:-1]) * step * -(-f.tensor.shape[-1] // step)
        if work >= max(thresholds().min_work, thresholds().min_padded_reuse * size):
            return f, step
    return None


def _deinterleaved(src: Tensor, step: int) -> Tensor:
    """``P[.., q, m] = src[.., step*m + q]``: the last dimension split into ``step`` classes,
    each contiguous (zeros past the end when ``step`` does not divide it)."""
    n = src.shape[-1]
    shape = tuple(src.shape[:-1]) + (step, -(-n // step))

    def body(*axes):
        at = step * axes[-1] + axes[-2]
        value = src[tuple(axes[:-2]) + (at,)]
        return value if n % step == 0 else dsl.if_then_else(at < n, value, dsl.const(0, src.dtype))
    return dsl.compute(shape, body, name=f"{src.name}_classes")


def _class_read(f: Read, copy: Tensor, step: int) -> Read:
    """The read of the split ``copy`` equal to ``f``."""
    last = f.indices[-1]
    return Read(copy, tuple(f.indices[:-1]) + (normalize(last % step), normalize(last // step)))


class _Replace(Mutator):
    """Replaces given nodes (by identity) wherever they occur."""

    def __init__(self, swaps: Dict[int, Expr]):
        super().__init__()
        self.swaps = swaps

    def visit(self, node):
        got = self.swaps.get(id(node))
        return got if got is not None else super().visit(node)
