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
enumerated, vectorized, with the innermost loop's trip count in closed form.
(isl's ``count_val`` enumerates points one by one, which is too slow for the
10^12-point raw domains; the tests check both agree on small domains.)
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

from te_grad import dsl
from te_grad.evaluator import evaluate
from te_grad.graph import free_vars, reads_in, reductions_in, topo_order
from te_grad.ir import (ComputeOp, Expr, PlaceholderOp, ReduceAxis, ScatterOp, Tensor, Var)

Loop = Tuple[Expr, Expr, Expr]  # (variable, lo, hi)


def _count_nest(out_axes: Sequence[Var], shape: Sequence[int], loops: Sequence[ReduceAxis],
                guards: Sequence[Expr]) -> int:
    guards = [g for g in guards if not reads_in(g)]  # data-dependent guards restrict nothing here
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
    if inner:  # a guard inside the loops (a select in an enclosing reduction): count point by point
        body = dsl.sum(dsl.const(1), list(rest_loops), where=dsl.all(inner))
    elif not rest_loops:
        body = dsl.const(1)
    else:
        last = rest_loops[-1]
        trip = dsl.maximum(last.hi - last.lo, 0)
        body = dsl.sum(trip, list(rest_loops[:-1])) if len(rest_loops) > 1 else trip
    if outer:
        body = dsl.if_then_else(dsl.all(outer), body, dsl.const(0))
    counter = Tensor("count", tuple(rest_shape), "int64", ComputeOp(tuple(rest_out), body))
    return factor * int(np.sum(evaluate([counter], {})[0], dtype=np.int64))


def tensor_iterations(t: Tensor) -> int:
    """Innermost iterations to compute ``t`` once from its inputs (see the module docstring)."""
    if isinstance(t.op, PlaceholderOp):
        return 0
    if isinstance(t.op, ScatterOp):
        return _count_nest([], [], t.op.axes, [])
    found = reductions_in(t.op.body)
    if not found:
        return t.size
    return sum(_count_nest(t.op.axes, t.shape, loops + list(red.axes), guards)
               for red, guards, loops in found)


def iterations(tensors) -> int:
    """Innermost iterations to compute ``tensors`` and everything they need, each tensor once."""
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    return sum(tensor_iterations(t) for t in topo_order(list(tensors)))
