"""Transposing element-wise nests: tiles that keep both layouts in cache, 8 x 8 blocks in registers.

An element-wise nest whose store is unit-stride in its innermost loop ``v`` but which
reads a tensor unit-stride in another loop ``u`` (a transpose, a layout change) touches
one of them a cache line per element. :func:`tile_transposes` cuts ``u`` and ``v`` into
``TILE x TILE`` tiles, and, for 32-bit values and extents divisible by 8, each tile into
8 x 8 blocks annotated :class:`~codegen.loopir.Transposed` (eight vector loads of the
crossing read, a transpose in registers, eight vector stores).

Promises: every element is stored once with its own value (the tiles and blocks
partition the domain); threads take ranges of the stage's parallel axis when it is an
outer loop of the nest (a batch), else ranges of tiles of ``u``. ``u`` and ``v`` have extents
known when the kernel is built; an outer loop's may be a size known at run time only.
"""
from __future__ import annotations

from dataclasses import replace
from numbers import Integral

from simplify.linear import coefficient
from te_grad import dsl
from te_grad.ir import distinct_reads
from te_grad.ir import Read, Tensor, Var
from te_grad.transform import substitute

from .loop_order import representative
from .loopir import SERIAL, Loop, Nest, Parallel, Stage, Store, transpose_block


TILE = 32


def _tile_transposed(t: Tensor, order, store: Store, parallel=None):
    """Tile the two loops of a transposing element-wise nest, or None if it does not transpose.

    With ``v`` innermost (unit stride for the store) and a read unit-stride in
    another variable ``u``, ``TILE x TILE`` blocks keep both in cache:
    ``for uo, vo: for ui < TILE, vi < TILE`` with ``u = uo*TILE + ui``.
    Threads split ``parallel`` (the stage's own axis) when it is one of the other, outer
    loops (a batch: a reader splitting the same axis then shares the region), else ``uo``.
    Returns (statements, extent of the parallel loop, its variable when it is ``parallel``).
    """
    if len(order) < 2:
        return None
    v = order[-1]
    extent = dict(zip(map(id, t.op.axes), t.shape))
    for read in distinct_reads(store.value):
        acc = read.indices
        if not acc or coefficient(acc[-1], v) != 0 or all(coefficient(i, v) == 0 for i in acc):
            continue  # unit-stride or invariant in v: nothing to tile for
        u = next((x for x in order[:-1] if coefficient(acc[-1], x) in (1, -1)), None)
        if u is not None and all(isinstance(extent[id(x)], Integral) and extent[id(x)] >= 2 * TILE for x in (u, v)):
            break  # (an extent known at run time only, a batch, is not tiled)
    else:
        return None
    outer = [x for x in order if x is not u and x is not v]
    uo, vo, ui, vi = Var(u.name + "o"), Var(v.name + "o"), Var(u.name + "i"), Var(v.name + "i")
    nu, nv = extent[id(u)], extent[id(v)]
    c = dsl.const
    if _blocks_of_eight(t, store, read, u, v, nu, nv):  # 8 x 8 blocks transposed in registers
        ub, vb = Var(u.name + "b"), Var(v.name + "b")
        body = [transpose_block(u, v, uo * TILE + ub * 8, vo * TILE + vb * 8, store, read)]
        body = [Loop(vb, c(0), dsl.minimum(c(TILE), nv - vo * TILE) // 8, body)]
        body = [Loop(ub, c(0), dsl.minimum(c(TILE), nu - uo * TILE) // 8, body)]
    else:
        rename = {u: uo * TILE + ui, v: vo * TILE + vi}
        body = [Store(t, tuple(substitute(i, rename) for i in store.indices), substitute(store.value, rename))]
        body = [Loop(vi, c(0), dsl.minimum(c(TILE), nv - vo * TILE), body)]
        body = [Loop(ui, c(0), dsl.minimum(c(TILE), nu - uo * TILE), body)]
    by_outer = parallel is not None and any(parallel is x for x in outer)
    body = [Loop(vo, c(0), c(-(-nv // TILE)), body)]
    body = [Loop(uo, c(0), c(-(-nu // TILE)), body, SERIAL if by_outer else Parallel())]
    for x in reversed(outer):  # an outer extent may be known at run time only (a batch size variable)
        n = extent[id(x)]
        body = [Loop(x, c(0), c(n) if isinstance(n, Integral) else n, body,
                     Parallel() if by_outer and x is parallel else SERIAL)]
    # an extent known at run time only is split as schedule's stages split it: its representative
    # value here, the bound one at each call (codegen.kernel)
    return body, (representative(extent[id(parallel)]) if by_outer else -(-nu // TILE)), \
        (parallel if by_outer else None)


def _blocks_of_eight(t: Tensor, store: Store, read: Read, u: Var, v: Var, nu: int, nv: int) -> bool:
    """True if the tiles can be cut into 8 x 8 blocks transposed in registers: 32-bit values,
    extents divisible by 8, the store's row unit-stride in ``v`` and the read's in ``u``."""
    four_bytes = ("float32", "int32")
    if t.dtype not in four_bytes or read.tensor.dtype not in four_bytes or nu % 8 or nv % 8:
        return False
    last_of = [(store.indices, v, u), (read.indices, u, v)]
    for idx, along, _ in last_of:
        if coefficient(idx[-1], along) != 1 or any(coefficient(i, along) != 0 for i in idx[:-1]):
            return False
    return all(coefficient(i, v) is not None and coefficient(i, u) is not None for i in read.indices)


def tile_transposes(stage: Stage) -> Stage:
    """A stage that is one element-wise nest (its loops ordered, see :mod:`.loop_order`)
    which transposes, tiled (see the module docstring); any other stage as it is."""
    n = Nest.of(stage.body[0]) if len(stage.body) == 1 else None
    if n is None or n.accumulates or n.reductions or n.cond is not None:
        return stage
    tiled = _tile_transposed(stage.tensor, n.order, n.store, stage.parallel_axis)
    if tiled is None:
        return stage
    return replace(stage, body=tuple(tiled[0]), parallel_extent=tiled[1], parallel_axis=tiled[2])
