"""Parallel regions: consecutive stages that threads can run without waiting for each other.

Stage ``B`` may follow stage ``A`` inside one parallel region when both split
an output axis of the same extent among threads and every read ``B`` makes of
a tensor computed earlier in the region takes, along that tensor's split
axis, exactly ``B``'s own split axis: the thread computing rows ``[lo, hi)``
of ``B`` then reads only rows ``[lo, hi)`` of ``A``, which the same thread
computed just before. A softmax (row max, exponentials, row sum, quotient)
and its gradient are each one region: one hand-off to the thread pool instead
of one per stage.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from .loopir import Stage, stmt_reads


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


def _joins(first: Stage, s: Stage, split_dim: Dict[int, int]) -> bool:
    if _split_dim(first) is None or s.parallel_extent != first.parallel_extent:
        return False
    for r in stmt_reads(s.body):
        d = split_dim.get(id(r.tensor))
        if d is not None and r.indices[d] is not s.parallel_axis:
            return False
    return True
