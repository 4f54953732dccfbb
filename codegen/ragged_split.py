"""Threads split CSR rows by edges: ranges of rows holding about equal numbers of edges.

A stage whose parallel loop runs over the rows ``v`` of a row pointer ``P`` (its
accumulating nest loops over ``range(P[v], P[v + 1])`` inside) does work in proportion
to the edges of its rows, not to its rows: with skewed segments (a power-law graph's
in-degrees) equal ranges of rows are unequal work. The pass :func:`balance_ragged_rows`
marks such a stage (``Stage.balance = P``); its emitted function then maps the range
``[a, b)`` of ``[0, V)`` a thread is given to the rows ``[r(a), r(b))`` where ``r(0) = 0``,
``r(V) = V`` and otherwise ``r(a)`` is the first row ``v`` with ``P[v] >= P[0] +
span * a // V`` (``span = max(P[V] - P[0], 0)``), found by binary search
(:func:`balanced_range`).

Promise: the rows are computed by the same code, each by exactly one thread, so the
results are bit for bit those of the plain split. ``r`` is non-decreasing for any data
(the target is, and a binary search's answer is monotone in its target even over an
unsorted array), with ``r(0) = 0`` and ``r(V) = V``: the mapped ranges of consecutive
chunks tile ``[0, V)`` with neither gap nor overlap, whatever ``P`` holds, so a row
pointer that decreases still reaches the run-time check of the row where it does. A
balanced stage shares a parallel region (:mod:`.regions`) only with stages balanced by the
same row pointer, whose threads own the same rows.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from te_grad.ir import Const, Read, Tensor

from .llvm import ir
from .llvm_types import I64
from .loopir import Stage, loops
from .ragged_schedule import _offset


def row_pointer(stage: Stage) -> Optional[Tensor]:
    """The row pointer ``P`` whose rows the stage's parallel loops run over, when threads
    may split them by edges: every parallel loop runs over ``[0, extent)`` in single rows,
    and one of them holds a loop over ``range(P[v], P[v + 1])`` of its own variable ``v``,
    with ``P`` of ``extent + 1`` entries. Else None."""
    extent = stage.parallel_extent
    par = [lp for lp in loops(stage.body) if lp.parallel]
    if extent < 2 or not par:
        return None
    for lp in par:
        if not (isinstance(lp.lo, Const) and lp.lo.value == 0 and isinstance(lp.hi, Const)
                and lp.hi.value == extent and lp.scale == 1):
            return None
    for lp in par:
        for inner in loops(lp.body):
            lo, hi = inner.lo, inner.hi
            if (isinstance(lo, Read) and isinstance(hi, Read) and lo.tensor is hi.tensor
                    and lo.tensor.ndim == 1 and lo.tensor.shape[0] == extent + 1
                    and _offset(lo.indices[0], lp.var) == 0 and _offset(hi.indices[0], lp.var) == 1):
                return lo.tensor
    return None


def balance_ragged_rows(stage: Stage) -> Stage:
    """``stage`` with its threads' rows balanced by the edges of its row pointer (module
    docstring), or ``stage`` itself when it has none."""
    if stage.balance is not None:
        return stage
    p = row_pointer(stage)
    if p is None:
        return stage
    return replace(stage, balance=p)


def balanced_range(b: ir.IRBuilder, fn: ir.Function, ptr, dtype: str, extent: int, lo, hi):
    """The rows ``[r(lo), r(hi))`` (i64 values) of the chunk ``[lo, hi)`` of ``[0, extent)``,
    ``ptr`` pointing at the row pointer's ``extent + 1`` entries (module docstring)."""
    n = ir.Constant(I64, extent)

    def entry(i):
        v = b.load(b.gep(ptr, [i], inbounds=True))
        return v if dtype == "int64" else b.sext(v, I64)

    first = entry(ir.Constant(I64, 0))
    span = b.sub(entry(n), first)
    span = b.select(b.icmp_signed("<", span, ir.Constant(I64, 0)), ir.Constant(I64, 0), span)

    def rows(a):
        target = b.add(first, b.sdiv(b.mul(span, a), n))
        start = b.block
        head = fn.append_basic_block("balance.search")
        body = fn.append_basic_block("balance.step")
        done = fn.append_basic_block("balance.found")
        b.branch(head)
        b.position_at_end(head)
        low = b.phi(I64, name="low")
        high = b.phi(I64, name="high")
        low.add_incoming(ir.Constant(I64, 0), start)
        high.add_incoming(n, start)
        b.cbranch(b.icmp_signed("<", low, high), body, done)
        b.position_at_end(body)
        mid = b.sdiv(b.add(low, high), ir.Constant(I64, 2))
        below = b.icmp_signed("<", entry(mid), target)
        low.add_incoming(b.select(below, b.add(mid, ir.Constant(I64, 1)), low), body)
        high.add_incoming(b.select(below, high, mid), body)
        b.branch(head)
        b.position_at_end(done)
        found = low
        found = b.select(b.icmp_signed("<=", a, ir.Constant(I64, 0)), ir.Constant(I64, 0), found)
        return b.select(b.icmp_signed(">=", a, n), n, found)

    return rows(lo), rows(hi)
