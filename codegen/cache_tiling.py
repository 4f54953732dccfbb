"""Cache tiling: keep the operand that every thread's rows re-read in the core's cache.

Input: a register-block nest ``parallel for p: for o2: ... for om: <block>`` whose
outer loops all run over output elements, with constant bounds. A read of the
block that does not depend on ``p`` (the weights of a dense layer when ``p`` runs
over the batch) is read again for every value of ``p``; when what it touches over
the rest of the nest is more than half of one core's L2 cache, each pass streams
it from memory. :func:`tile_for_cache` then cuts one loop that the read depends on
into tiles whose footprint fits, and moves the loop over tiles outside ``p``::

    for ot in range(tiles):
        parallel for p: for o2: ... for o in [ot*size, min(ot*size + size, n)): <block>

The loop cut is the outermost of ``o2 .. om`` that the read depends on or, when
none does (or one value of it is already too much), and the block's lanes run
along an output axis, the outermost of the block's own (reduce) loops that it
depends on (``X @ W``: tiles of ``k`` keep a panel of ``W`` in cache while every
row of ``X`` goes through it).

The block's outermost reduce loop, when its extent is known only at run time (a batch ``b``
in a weight gradient ``dW[o, i] = sum over (b, s) of dY[b, s, o] H[b, s, i]``), cannot be
cut into tiles of a constant size without a partial last tile; when no constant loop can be
cut, the read's footprint for one value of it fits, so does the output (whose accumulators
are loaded and stored once per value), and the constant reduce loops inside it run at least
``Thresholds.min_tile_steps`` times, it is taken one value at a time by a loop outside all
the others (the sum keeps its order: that loop ran outside the block's others)::

    for bt in range(lo, n):
        parallel for p: ... <block, with b in [bt, bt + 1)>

Every tile is whole, whatever ``n``. (Before: each block of ``o`` streamed all of ``H``
from memory; the encoder's ``linear2`` weight gradient, 128 x 512 over 1024 rows, went from
5.6 to 3.8 ms on an AVX2 core.)

Promises: the same stores with the same values, and each element's accumulation in
the same order: only loops over distinct output elements are interchanged, and a
reduce loop is cut only where the accumulators are loaded from and stored to the
output around the block's loops (lanes along an output axis), so a tile goes on
from the exact partial value the previous one stored. Every thread still takes its
own range of ``p``. A nest of any other shape is returned unchanged.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from te_grad import dsl
from te_grad.graph import free_vars
from te_grad.ir import distinct_reads
from te_grad.intervals import interval
from te_grad.ir import Const, Read, ReduceAxis, Var

from .loop_order import representative
from .loopir import Loop, RegisterBlock, RegisterBlocked, Stage, Stmt, loops
from .machine import Machine
from .options import current_options

#: the share of one core's L2 cache a tile of the re-read operand may fill
L2_SHARE = 0.5
#: bytes of a cache line: a row touched at all costs at least one line
LINE_BYTES = 64


def tile_stage(stage: Stage, machine: Machine) -> Stage:
    """Each register-block nest of ``stage`` through :func:`tile_for_cache`, the loops around
    the block that are not over reduce axes taken as its output loops."""
    body = []
    for s in stage.body:
        outs = [lp.var for lp in loops([s]) if not isinstance(lp.var, ReduceAxis)]
        body.extend(tile_for_cache([s], outs, machine))
    return dataclasses.replace(stage, body=tuple(body))


def tile_for_cache(body: List[Stmt], out_vars: Sequence[Var], machine: Machine) -> List[Stmt]:
    """``body`` with one output loop tiled for the L2 cache (see the module's docstring)."""
    chain, block = _chain(body)
    if block is None or not chain or not chain[0].parallel:
        return body
    outputs = {id(v) for v in out_vars}
    if any(id(lp.var) not in outputs or not _constant(lp) for lp in chain):
        return body
    par = chain[0]
    uses = _uses(block)
    ranges = {id(lp.var): (int(lp.lo.value), int(lp.hi.value) - 1) for lp in chain}
    ranges[id(par.var)] = (int(par.lo.value),) * 2  # one value of p: what a pass over the rest touches
    budget = int(machine.l2_bytes * L2_SHARE)
    for read in _block_reads(block):
        if uses(read, par.var):
            continue
        if _footprint(read, _block_ranges(block, ranges)) <= budget:
            continue
        cuttable = [lp for lp in chain[1:] if uses(read, lp.var)]
        if not block.reduce_lanes:
            cuttable += [lp for lp in block.loops if uses(read, lp.var) and _constant(lp)]
        for lp in cuttable:
            lo, hi = int(lp.lo.value), int(lp.hi.value) - 1
            one = _footprint(read, _block_ranges(block, {**ranges, id(lp.var): (lo, lo)}))
            if 2 * one > budget:  # one value of this loop is already too much: try an inner one
                continue
            n = hi - lo + 1
            tiles = -(-n // (budget // one))
            return [_split(chain, block, lp, tiles, -(-n // tiles))]
        # the block's outermost reduce loop, of run-time extent: one value at a time (the sum's
        # order is kept: that loop already ran outside the others)
        first = block.loops[0] if block.loops else None
        if not block.reduce_lanes and first is not None and _sized(first) and uses(read, first.var):
            lo = int(first.lo.value)
            one = _footprint(read, _block_ranges(block, {**ranges, id(first.var): (lo, lo)}))
            steps = _steps(block.loops[1:])
            # the accumulators are loaded and stored once per value: the output must stay in the cache
            whole = {id(lp.var): (int(lp.lo.value), int(lp.hi.value) - 1) for lp in chain}
            out = _footprint(block.store, _block_ranges(block, whole))
            if 2 * one <= budget and out <= budget and steps is not None \
                    and steps >= current_options().thresholds.min_tile_steps:
                return [_outermost(chain, block, first)]
    return body


def _sized(lp: Loop) -> bool:
    """A loop from a constant to an extent known only at run time."""
    return isinstance(lp.lo, Const) and not isinstance(lp.hi, Const) and representative(lp.hi) is not None


def _steps(inner: Sequence[Loop]) -> Optional[int]:
    """Iterations of the constant loops ``inner`` together, None if one is not constant."""
    total = 1
    for lp in inner:
        if not _constant(lp):
            return None
        total *= int(lp.hi.value) - int(lp.lo.value)
    return total


def _chain(body: List[Stmt]) -> Tuple[List[Loop], Optional[RegisterBlock]]:
    """The perfectly nested loops of ``body`` and the register block inside them, if any."""
    chain: List[Loop] = []
    stmts = body
    while len(stmts) == 1 and isinstance(stmts[0], Loop) and not isinstance(stmts[0].kind, RegisterBlocked):
        chain.append(stmts[0])
        stmts = stmts[0].body
    if len(stmts) == 1 and isinstance(stmts[0], Loop):
        return chain, RegisterBlock.of(stmts[0])
    return chain, None


def _constant(lp: Loop) -> bool:
    return isinstance(lp.lo, Const) and isinstance(lp.hi, Const)


def _block_reads(block: RegisterBlock) -> List[Read]:
    exprs = [block.store.value] + ([block.cond] if block.cond is not None else [])
    return [r for e in exprs for r in distinct_reads(e)]


def _uses(block: RegisterBlock):
    """``uses(read, v)``: whether the read's indices vary with loop variable ``v`` (a jammed
    block's variable varies with the loop over its blocks)."""
    jammed = {id(j.outer): j.var for j in block.jams}

    def uses(read: Read, v: Var) -> bool:
        targets = {id(v)} | ({id(jammed[id(v)])} if id(v) in jammed else set())
        return any(id(x) in targets for i in read.indices for x in free_vars(i))

    return uses


def _block_ranges(block: RegisterBlock, outer: Dict[int, Tuple[int, int]]) -> Dict[int, Tuple[int, int]]:
    """Inclusive ranges of every variable of the block given those of its outer loops (a
    range already given for one of the block's loops is kept)."""
    ranges = dict(outer)
    for j in block.jams:
        if id(j.outer) in ranges:
            ranges[id(j.var)] = j.var_range(ranges[id(j.outer)])
    for lp in block.loops:
        lo, hi = interval(lp.lo, ranges), interval(lp.hi, ranges)
        if id(lp.var) not in outer and lo is not None and hi is not None:
            ranges[id(lp.var)] = (lo[0], hi[1] - 1)
    ranges[id(block.var)] = (int(block.lo.value), int(block.hi.value) - 1)
    return ranges


def _footprint(read, ranges: Dict[int, Tuple[int, int]]) -> int:
    """Bytes of ``read``'s tensor (a read's, or a store's) touched over ``ranges`` (a box per
    dimension; a row touched costs at least a cache line; an index that cannot be bounded spans
    its dimension, an extent known only at run time counted at
    :func:`.loop_order.representative`)."""
    size = np.dtype(read.tensor.dtype).itemsize
    elements = 1
    shape = read.tensor.shape
    for d, (ix, n) in enumerate(zip(read.indices, shape)):
        n = representative(n)  # an extent known at run time: judged at a representative size
        span = interval(ix, ranges)
        extent = n if span is None else max(1, min(n, span[1] - span[0] + 1))
        if d == len(shape) - 1:
            extent = min(n, max(extent, LINE_BYTES // size))
        elements *= extent
    return elements * size


def _outermost(chain: List[Loop], block: RegisterBlock, cut: Loop) -> Loop:
    """The nest of ``chain`` around ``block`` with the block's reduce loop ``cut`` (its extent
    known at run time) taken one value at a time by a loop outside all of them (tiles of one
    value: no tile is partial, whatever the extent)."""
    tile = Var(cut.var.name + "t")
    loops_ = tuple(dataclasses.replace(lp, lo=tile, hi=tile + 1) if lp is cut else lp for lp in block.loops)
    inner: List[Stmt] = [dataclasses.replace(block, loops=loops_).loop()]
    for lp in reversed(chain):
        inner = [dataclasses.replace(lp, body=inner)]
    return Loop(tile, cut.lo, cut.hi, inner)


def _split(chain: List[Loop], block: RegisterBlock, cut: Loop, tiles: int, size: int) -> Loop:
    """The nest of ``chain`` around ``block`` with loop ``cut`` (one of either) in ``tiles``
    tiles of ``size`` iterations, the loop over tiles outermost."""
    tile = Var(cut.var.name + "t")
    lo, hi = int(cut.lo.value), int(cut.hi.value)
    first = tile * size + lo
    last = first + size if (hi - lo) % size == 0 else dsl.minimum(first + size, dsl.const(hi))

    def cut_if(lp: Loop, body) -> Loop:
        return dataclasses.replace(lp, lo=first, hi=last, body=body) if lp is cut \
            else dataclasses.replace(lp, body=body)

    inner: List[Stmt] = [dataclasses.replace(block, loops=tuple(cut_if(lp, lp.body) for lp in block.loops)).loop()]
    for lp in reversed(chain):
        inner = [cut_if(lp, inner)]
    return Loop(tile, dsl.const(0), dsl.const(tiles), inner)
