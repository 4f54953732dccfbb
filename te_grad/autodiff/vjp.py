"""Reverse mode over tensor graphs: vector-Jacobian products in the raw form.

For a compute ``Y[i] = R_k f(i, k)`` (``R`` a reduction or nothing) and each
read ``X[g(i, k)]`` in ``f``, the contribution to the adjoint of ``X`` is

    dX[j] += sum over {(i, k) in dom(Y) : where(i, k) and g(i, k) == j} of dY[i] * p(i, k)

with ``p`` the scalar partial of ``f`` with respect to that read (see
:mod:`.rules`). The equality ``g == j`` is a constraint of the reduction
domain (its ``where``), never a ``select``: that is the form the isl
simplifier turns into a gather or a scatter. No Jacobian is ever built.

Reductions other than sum scale the seed ``dY[i]``:
- max / min: ``[f(i, k) == Y[i]] / ties(i)``: the adjoint is split evenly among
  all elements equal to the result (JAX's convention), ``ties`` counting them;
- prod: ``prod over k' != k of f(i, k')``, the product of the other factors,
  computed directly (no division by the product, so zeros are exact).
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from .. import dsl, dtypes
from ..errors import UserError
from ..ir import ComputeOp, Expr, Read, Reduce, ReduceAxis, Tensor, Var
from ..transform import substitute
from .normalize import normalized_body
from .rules import backprop

Contribution = Tuple[Tensor, Tensor]  # (tensor receiving the adjoint, contribution tensor)


def _fresh_axes_over(tensor: Tensor, axes: Sequence[Var]) -> List[ReduceAxis]:
    """One reduce axis per dimension of ``tensor``, iterating over its whole shape."""
    return [dsl.reduce_axis((0, n), name=ax.name) for ax, n in zip(axes, tensor.shape)]


def _seed_for_reduction(y: Tensor, axes, red: Reduce, adj_read: Expr) -> Tuple[Expr, Expr]:
    """(seed, extra condition) for differentiating through ``red``, the body of ``y[axes]``."""
    y_read = Read(y, tuple(axes))
    if red.combiner == "sum":
        return adj_read, None
    if red.combiner in ("max", "min"):
        # adjoint split evenly among the elements equal to the result
        is_winner = red.body == y_read
        where = is_winner if red.where is None else dsl.all(red.where, is_winner)
        ties = Tensor(f"{y.name}_ties", y.shape, y.dtype, ComputeOp(
            axes, dsl.sum(dsl.const(1.0, y.dtype), list(red.axes), where=where)))
        return adj_read / Read(ties, tuple(axes)), is_winner
    if red.combiner == "prod":
        others = _product_of_others(y, axes, red)
        index = tuple(axes) + tuple(k - k.lo.value if k.lo.value else k for k in red.axes)
        return adj_read * Read(others, index), None
    raise UserError(f"cannot differentiate a {red.combiner} reduction")


def _product_of_others(y: Tensor, axes, red: Reduce) -> Tensor:
    """``others[i, k] = prod over k' != k of f(i, k')`` (the where of ``red`` kept)."""
    for k in red.axes:
        if k.extent is None:
            raise UserError(f"cannot differentiate the product reduction of {y.name}: "
                            f"axis {k.name} has bounds that are not constant")
    own = [Var(ax.name) for ax in axes]
    at = [Var(k.name) for k in red.axes]
    other = [dsl.reduce_axis((k.lo.value, k.hi.value), name=k.name + "_") for k in red.axes]
    mapping = dict(zip(axes, own))
    mapping.update(zip(red.axes, other))
    body = substitute(red.body, mapping)
    differs = dsl.any([o != a + k.lo.value for o, a, k in zip(other, at, red.axes)])
    where = differs if red.where is None else dsl.all(substitute(red.where, mapping), differs)
    shape = y.shape + tuple(k.extent for k in red.axes)
    return Tensor(f"{y.name}_others", shape, y.dtype,
                  ComputeOp(tuple(own + at), dsl.prod(body, other, where=where)))


def vjp_of_compute(y: Tensor, adj: Tensor) -> List[Contribution]:
    """The raw contributions of compute ``y`` with adjoint ``adj`` to the tensors it reads."""
    # Lifted reductions are differentiated here too, so callers only see the
    # tensors y really reads; y's own stored values stand for its body's value.
    body, lifted = normalized_body(y)
    axes = y.op.axes
    adj_read = Read(adj, tuple(axes))
    if isinstance(body, Reduce):
        seed, extra = _seed_for_reduction(y, axes, body, adj_read)
        scalar, red_axes, where = body.body, list(body.axes), body.where
        if extra is not None:
            where = extra if where is None else dsl.all(where, extra)
        reads = backprop(scalar, seed)
    else:
        red_axes, where = [], None
        reads = backprop(body, adj_read, top_value=Read(y, tuple(axes)))
    fresh = _fresh_axes_over(y, axes)
    rename = dict(zip(axes, fresh))
    out: List[Contribution] = []
    for read, partial in reads:
        x = read.tensor
        if not dtypes.is_float(x.dtype):
            continue
        # reduce axes first: isl keeps the earlier variables as loops and solves the
        # later ones from the index equalities, so kernel offsets stay loop variables
        # (constant ranges in the interior) and output positions are eliminated
        out.append((x, _contribution(x, y, read, partial, red_axes + fresh, where, rename)))
    if lifted:
        out = _resolve_lifted(out, lifted)
    return out


def _contribution(x: Tensor, y: Tensor, read: Read, partial: Expr, domain: List[ReduceAxis],
                  where: Expr, rename: Dict[Var, Expr]) -> Tensor:
    """``dX[j] = sum over domain where (where and read.indices == j) of partial``."""
    js = [Var(f"j{d}" if x.ndim > 1 else "j") for d in range(x.ndim)]
    matches = [substitute(g, rename) == j for g, j in zip(read.indices, js)]
    cond = dsl.all(([substitute(where, rename)] if where is not None else []) + matches)
    value = substitute(partial, rename)
    if domain:
        body = dsl.sum(value, domain, where=cond)
    else:  # a 0-d forward with no reduction: nothing to sum over
        body = dsl.if_then_else(cond, value, dsl.const(0, value.dtype))
    body = dsl.cast(x.dtype, body)
    return Tensor(f"d{x.name}_via_{y.name}", x.shape, x.dtype, ComputeOp(tuple(js), body))


def _resolve_lifted(contribs: List[Contribution], lifted: List[Tensor]) -> List[Contribution]:
    """Push contributions that target lifted tensors through them (consumers first)."""
    pending = list(contribs)
    for t in reversed(lifted):
        mine = [c for x, c in pending if x is t]
        pending = [(x, c) for x, c in pending if x is not t]
        if mine:
            pending.extend(vjp_of_compute(t, sum_contributions(t, mine)))
    return pending


def sum_contributions(x: Tensor, contribs: List[Tensor]) -> Tensor:
    """The adjoint of ``x``: the sum of its contribution tensors, named ``d<name>``."""
    name = f"d{x.name}"
    if len(contribs) == 1:
        c = contribs[0]
        return c if c.is_placeholder else Tensor(name, c.shape, c.dtype, c.op)
    js = [Var(f"j{d}" if x.ndim > 1 else "j") for d in range(x.ndim)]
    total = None
    for c in contribs:
        r = dsl.cast(x.dtype, Read(c, tuple(js)))
        total = r if total is None else total + r
    return Tensor(name, x.shape, x.dtype, ComputeOp(tuple(js), total))


def zeros_like(x: Tensor, name: str) -> Tensor:
    return dsl.compute(x.shape, lambda *i: dsl.const(0, x.dtype), name=name)


def ones_like(x: Tensor, name: str) -> Tensor:
    return dsl.compute(x.shape, lambda *i: dsl.const(1, x.dtype), name=name)
