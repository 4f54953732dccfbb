"""Parallel regions: consecutive stages that threads can run without waiting for each other.

Stage ``B`` may follow stage ``A`` inside one parallel region when both split
an output axis of the same extent among threads and every read ``B`` makes of
a tensor computed earlier in the region takes, along that tensor's split
axis, exactly ``B``'s own split axis: the thread computing rows ``[lo, hi)``
of ``B`` then reads only rows ``[lo, hi)`` of ``A``, which the same thread
computed just before. A softmax (row max, exponentials, row sum, quotient)
and its gradient are each one region: one hand-off to the thread team instead
of one per stage. Stages whose threads split rows by the edges of a row pointer
(:mod:`.ragged_split`) join only stages split by the same one.

A region whose tensors do not fit in cache also runs in blocks of rows
(:func:`row_blocks`): each thread computes every stage of the region for a few
rows of its range before going on to the next rows, so that what one stage
writes is still in cache when the next stage reads it. The blocks are multiples
of every stage's granule, like the threads' ranges, so the stages' results are
the same whatever the block (each row is computed by the same code).
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Sequence, Tuple

import math

import numpy as np

from te_grad.ir import Expr

from .loopir import Loop, Stage, stmt_reads

#: a region whose tensors take more than this runs in blocks of rows
REGION_CACHE_BYTES = 2 << 20
#: bytes of all the region's tensors that one block of rows covers
BLOCK_BYTES = 128 << 10


def regions(stages: Sequence[Stage]) -> List[Tuple[int, int]]:
    """``[(first, last)]`` covering ``stages`` in order, each a run that may share one region."""
    out: List[Tuple[int, int]] = []
    split_dim: Dict[int, int] = {}  # id(tensor) -> the dimension its region's threads split
    for k, s in enumerate(stages):
        dim = _split_dim(s)
        if out and dim is not None and _joins(stages[out[-1][0]], s, split_dim):
            out[-1] = (out[-1][0], k + 1)
        else:
            out.append((k, k + 1))
            split_dim = {}
        if dim is not None:
            split_dim[id(s.tensor)] = dim
    return out


def _split_dim(s: Stage):
    if s.parallel_axis is None or s.parallel_extent <= 1:
        return None
    return next((d for d, a in enumerate(s.tensor.op.axes) if a is s.parallel_axis), None)


def split_extent(s: Stage):
    """The extent of the output axis ``s`` splits among threads: an int, or a size expression
    (bound at each call), or None."""
    d = _split_dim(s)
    return None if d is None else s.tensor.shape[d]


def _joins(first: Stage, s: Stage, split_dim: Dict[int, int]) -> bool:
    if _split_dim(first) is None or s.parallel_extent != first.parallel_extent:
        return False
    a, b = split_extent(first), split_extent(s)
    if isinstance(a, Expr) or isinstance(b, Expr):  # extents known at run time: the same expression
        if not (isinstance(a, Expr) and isinstance(b, Expr) and a.same_as(b)):
            return False
    if first.balance is not s.balance:  # rows split by edges: the same row pointer, the same rows
        return False
    for r in stmt_reads(s.body):
        d = split_dim.get(id(r.tensor))
        if d is not None and r.indices[d] is not s.parallel_axis:
            return False
    return True


def row_blocks(stages: Sequence[Stage], runs: Sequence[Tuple[int, int]]) -> List[int]:
    """For each region of ``runs``, the rows of its parallel range a block covers (0: no blocks).

    A region is blocked when it has several stages, each made of loops split among
    threads at the top (a stage with another loop around its parallel one would run
    that loop once per block), and its tensors exceed :data:`REGION_CACHE_BYTES`."""
    out = []
    for first, last in runs:
        members = stages[first:last]
        if len(members) < 2 or not all(s.body and all(isinstance(x, Loop) and x.parallel for x in s.body)
                                       for s in members):
            out.append(0)
            continue
        extent = members[0].parallel_extent
        touched = {}
        for s in members:
            touched[id(s.tensor)] = s.tensor
            for r in stmt_reads(s.body):
                touched.setdefault(id(r.tensor), r.tensor)
        if any(isinstance(n, Expr) for t in touched.values() for n in t.shape):
            out.append(0)  # extents known only at run time: no blocks
            continue
        total = sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize for t in touched.values())
        if total <= REGION_CACHE_BYTES or extent <= 1:
            out.append(0)
            continue
        granule = math.lcm(*[s.parallel_granule for s in members])
        rows = max(1, BLOCK_BYTES * extent // total) // granule * granule
        out.append(max(rows, granule) if max(rows, granule) < extent else 0)
    return out


class Run(NamedTuple):
    """Stages ``[first, last)`` run together: see :func:`plan`."""
    first: int
    last: int
    block: int
    extent: int
    chunks: int
    granule: int


def plan(stages: Sequence[Stage], works: Sequence[int], runs: Sequence[Tuple[int, int]],
         blocks: Sequence[int], threads: int, threshold: int) -> List[Run]:
    """How a kernel runs on ``threads`` threads: a list of :class:`Run`.

    Each is a run of stages ``[first, last)``: shared among the threads in ``chunks``
    chunks of its parallel range ``[0, extent)`` (multiples of ``granule``, every
    stage's granule), or,
    with ``chunks == 0``, made on the calling thread, a block of ``block`` rows at a time
    when ``block`` > 0 (:func:`row_blocks`). ``runs`` are the kernel's regions
    (:func:`regions`), ``works`` each stage's innermost iterations. Consecutive regions too
    small to share (under ``threshold`` iterations: a kernel's
    ``Thresholds.min_parallel_work``, :mod:`codegen.options`) and not blocked are merged into
    one run."""
    out: List[Run] = []
    for (first, last), block in zip(runs, blocks):
        extent = stages[first].parallel_extent
        granule = math.lcm(*[s.parallel_granule for s in stages[first:last]])
        work = sum(works[first:last])
        chunks = min(threads, extent // granule) if threads > 1 and work >= threshold else 0
        if chunks < 2:
            chunks = 0
        if out and not chunks and not block and not out[-1].chunks and not out[-1].block:
            out[-1] = out[-1]._replace(last=last)
        else:
            out.append(Run(first, last, block, extent, chunks, granule))
    return out


def chunk_bounds(extent: int, chunks: int, granule: int) -> List[Tuple[int, int]]:
    """The ranges of the parallel loop that ``chunks`` chunks take (as the team computes them;
    an empty range is possible when the granule is coarse): chunk ``k`` starts at
    ``extent * k / chunks`` rounded to the nearest multiple of ``granule`` (at most ``extent``).
    Rounding down instead gave the last chunk every remainder: 16 rows in blocks of 3 split
    as 6 and 10, where 9 and 7 is the best split."""
    bounds = [0] + [min(extent, (2 * extent * k + chunks * granule) // (2 * chunks * granule) * granule)
                    for k in range(1, chunks)] + [extent]
    return list(zip(bounds[:-1], bounds[1:]))
