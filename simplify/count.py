"""Exact innermost-iteration counts of tensor graphs.

The count of a tensor is the number of points of the iteration domains of its
reductions: for each reduction, the output elements (restricted by quasi-affine
guards around the reduction) times the points of its loops, with loop bounds as
written (a ``where`` filter is evaluated at every point, so it restricts
nothing). A tensor without reductions counts one per element; a scatter counts
the points of its domain; a placeholder counts nothing. So a raw VJP, whose
index equality is a filter, shows its full |dX| x |domain| cost.

Counting is exact and symbolic where it can be: every variable with constant
bounds that no other bound or guard mentions contributes a factor; the rest is
enumerated, vectorized, in integer arithmetic on the index expressions
(:func:`te_grad.intervals.index_values`), with the innermost loop's trip count in
closed form. Points are enumerated in blocks of at most :data:`BLOCK` at a time, so
memory stays bounded. (isl's ``count_val`` enumerates points one by one, which is too
slow for the 10^12-point raw domains; the tests check both agree on small domains.)
A guard that reads data or computes in floats restricts nothing here.

A *ragged* loop, whose bounds read data (``range(rowptr[v], rowptr[v + 1])``), has no
count before the data is known: counting it is a :class:`~te_grad.errors.UserError`
naming the loop, unless ``ragged=N`` is given, which counts each ragged loop as ``N``
trips at every point of the loops around it: an estimate, not a bound (``tg.build``
sizes its threading with :data:`RAGGED_TRIPS`). For the exact count of given data,
count it there (for a CSR segment loop over every row: ``rowptr[-1] - rowptr[0]``).
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from te_grad.errors import InternalError, UserError
from te_grad.graph import free_vars, reads_in, reductions_in, topo_order
from te_grad.intervals import NotAnIndex, index_values, is_index_expr
from te_grad.ir import Expr, PlaceholderOp, ReduceAxis, ScatterOp, Tensor, Var, const
from te_grad.printer import expr_to_str
from te_grad.transform import substitute

#: most points enumerated at once
BLOCK = 1 << 22

#: trips a ragged loop is assumed to make per point where an estimate will do (kernels' threading)
RAGGED_TRIPS = 16

Loop = Tuple[Expr, Expr, Expr]  # (variable, lo, hi)


def _estimate_ragged(name: str, loops: Sequence[ReduceAxis], guards: Sequence[Expr],
                     ragged: Optional[int]) -> Tuple[List[ReduceAxis], List[Expr]]:
    """``loops`` with each ragged loop (bounds reading data) made ``range(0, ragged)``, the
    later bounds and the guards following it; a UserError if ``ragged`` is None."""
    mapping = {}
    out = []
    for ax in loops:
        lo, hi = (substitute(b, mapping) if mapping else b for b in (ax.lo, ax.hi))
        if reads_in(lo) or reads_in(hi):
            if ragged is None:
                raise UserError(
                    f"the iterations of {name} depend on data: its ragged loop {ax.name} runs over "
                    f"range({expr_to_str(ax.lo)}, {expr_to_str(ax.hi)}); te_grad counts loops whose bounds "
                    f"are known before the data is; pass ragged=N to count each ragged loop as N trips "
                    f"per point (an estimate)")
            lo, hi = const(0), const(int(ragged))
        if lo is not ax.lo or hi is not ax.hi:
            new = ReduceAxis(ax.name, ax.dtype, lo, hi)
            mapping[ax] = new
            ax = new
        out.append(ax)
    if mapping:
        guards = [substitute(g, mapping) for g in guards]
    return out, list(guards)


def _count_nest(out_axes: Sequence[Var], shape: Sequence[int], loops: Sequence[ReduceAxis],
                guards: Sequence[Expr], name: str = "", ragged: Optional[int] = None) -> int:
    loops, guards = _estimate_ragged(name, loops, guards, ragged)
    # data-dependent (or float) guards restrict nothing here
    guards = [g for g in guards if not reads_in(g) and is_index_expr(g)]
    mentioned = set()
    for ax in loops:
        mentioned |= {id(v) for v in free_vars(ax.lo)} | {id(v) for v in free_vars(ax.hi)}
    for g in guards:
        mentioned |= {id(v) for v in free_vars(g)}
    factor = 1
    rest_out, rest_shape, rest_loops = [], [], []
    for ax, n in zip(out_axes, shape):
        if id(ax) in mentioned:
            rest_out.append(ax)
            rest_shape.append(n)
        else:
            factor *= n
    for ax in loops:
        if id(ax) not in mentioned and ax.extent is not None:
            factor *= ax.extent
        else:
            rest_loops.append(ax)
    if factor == 0:
        return 0
    loop_ids = {id(ax) for ax in rest_loops}
    inner = [g for g in guards if any(id(v) in loop_ids for v in free_vars(g))]
    outer = [g for g in guards if not any(id(v) in loop_ids for v in free_vars(g))]
    try:
        return factor * _enumerate(rest_out, rest_shape, rest_loops, inner, outer)
    except NotAnIndex as err:
        names = ", ".join(ax.name for ax in rest_loops)
        raise InternalError(f"cannot count the iterations of loops ({names}): {err}") from None


def _enumerate(out_axes: Sequence[Var], shape: Sequence[int], loops: Sequence[ReduceAxis],
               inner: Sequence[Expr], outer: Sequence[Expr]) -> int:
    """Points ``(out, loops)`` with ``0 <= out < shape``, every loop within its bounds,
    ``outer`` holding at the output point and ``inner`` at the whole point."""
    total = 0
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    for start in range(0, size, BLOCK):
        flat = np.arange(start, min(size, start + BLOCK), dtype=np.int64)
        coords = np.unravel_index(flat, tuple(shape)) if shape else ()
        env = {id(a): c.astype(np.int64) for a, c in zip(out_axes, coords)}
        n = len(flat)
        if outer:
            keep = _holds(outer, env, n)
            env = {k: v[keep] for k, v in env.items()}
            n = int(keep.sum())
        total += _count_loops(env, n, list(loops), inner)
    return total


def _holds(guards: Sequence[Expr], env: Dict[int, np.ndarray], n: int) -> np.ndarray:
    """Where every guard holds, at each of the ``n`` points of ``env``."""
    keep = np.ones(n, dtype=bool)
    for g in guards:
        keep &= np.broadcast_to(index_values(g, env), (n,))
    return keep


def _column(e: Expr, env: Dict[int, np.ndarray], n: int) -> np.ndarray:
    return np.broadcast_to(index_values(e, env), (n,)).astype(np.int64)


def _count_loops(env: Dict[int, np.ndarray], n: int, loops: List[ReduceAxis], inner: Sequence[Expr]) -> int:
    """Points of ``loops`` (outermost first) at each of the ``n`` points of ``env`` where
    every guard of ``inner`` holds."""
    if n == 0:
        return 0
    if not loops:
        return int(_holds(inner, env, n).sum()) if inner else n
    ax = loops[0]
    lo, hi = _column(ax.lo, env, n), _column(ax.hi, env, n)
    sizes = np.maximum(hi - lo, 0)
    if len(loops) == 1 and not inner:  # the innermost trip count in closed form
        return int(sizes.sum(dtype=np.int64))
    total = 0
    for rows, values in _expand(lo, sizes):
        sub = {k: v[rows] for k, v in env.items()}
        sub[id(ax)] = values
        total += _count_loops(sub, len(rows), loops[1:], inner)
    return total


def _expand(lo: np.ndarray, sizes: np.ndarray) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """``(rows, values)`` blocks listing each point ``k`` once per value of
    ``range(lo[k], lo[k] + sizes[k])``, about :data:`BLOCK` values per block."""
    rows = np.nonzero(sizes > 0)[0]
    lo, sizes = lo[rows], sizes[rows]
    pieces = -(-sizes // BLOCK)  # a range longer than a block is cut into pieces
    if np.any(pieces > 1):
        first = np.repeat(np.cumsum(pieces) - pieces, pieces)
        k = np.arange(int(pieces.sum()), dtype=np.int64) - first
        rows, lo, sizes = np.repeat(rows, pieces), np.repeat(lo, pieces), np.repeat(sizes, pieces)
        lo, sizes = lo + k * BLOCK, np.minimum(sizes - k * BLOCK, BLOCK)
    ends = np.cumsum(sizes)
    group = (ends - sizes) // BLOCK  # each group starts within one block of values
    cuts = np.nonzero(np.diff(group))[0] + 1
    for s, e in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(rows)]])):
        if s == e:
            continue
        size = sizes[s:e]
        at = np.repeat(np.arange(e - s), size)
        offset = np.arange(int(size.sum()), dtype=np.int64) - np.repeat(np.cumsum(size) - size, size)
        yield rows[s:e][at], np.repeat(lo[s:e], size) + offset


def tensor_iterations(t: Tensor, ragged: Optional[int] = None) -> int:
    """Innermost iterations to compute ``t`` once from its inputs (see the module docstring;
    ``ragged``: the trips assumed for a loop whose bounds read data, else such a loop is an error)."""
    if isinstance(t.op, PlaceholderOp):
        return 0
    if isinstance(t.op, ScatterOp):
        return _count_nest([], [], t.op.axes, [], t.name, ragged)
    found = reductions_in(t.op.body)
    if not found:
        return t.size
    return sum(_count_nest(t.op.axes, t.shape, loops + list(red.axes), guards, t.name, ragged)
               for red, guards, loops in found)


def iterations(tensors, ragged: Optional[int] = None) -> int:
    """Innermost iterations to compute ``tensors`` and everything they need, each tensor once.
    A loop whose bounds read data (a ragged loop) is a UserError, or counts ``ragged`` trips
    per point when that estimate is given."""
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    return sum(tensor_iterations(t, ragged) for t in topo_order(list(tensors)))
