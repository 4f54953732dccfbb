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

Supports: every adjoint comes with a *box*, per dimension the range outside
which it is structurally zero (a slice's gradient is zero outside the slice).
A contribution iterates only over the part of ``dom(Y)`` inside the box of
``dY``, so a partial is never evaluated where the adjoint is structurally zero:
``0 * inf`` (the gradient of ``sqrt`` at 0, reached only through elements the
output does not use) cannot turn a zero gradient into NaN. The box of a
contribution is the interval hull of ``g`` over that part.

A scatter ``Y = 0; Y[d(p)] += v(p)`` (a simplified gradient, differentiated again) is
linear in ``v``; its transpose is the gather ``dv(p) = dY[d(p)]``, so it is
differentiated as the sum over its points of ``v(p)`` seeded with ``dY[d(p)]``
(:func:`vjp_of_scatter`).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from .. import dsl, dtypes
from ..errors import UserError
from ..intervals import interval
from ..ir import ComputeOp, Expr, Read, Reduce, ReduceAxis, ScatterOp, Tensor, Var
from ..lift import normalized_body
from ..transform import substitute, sum_terms
from .rules import REDUCTION_RULES, backprop

#: bodies deeper than this are differentiated through pieces of this depth (:mod:`te_grad.lift`)
PIECE_DEPTH = 8

#: per dimension ``(lo, hi)``: the adjoint is zero outside ``lo <= j < hi``; a dimension whose
#: extent is a size expression (``tg.var``) always has the whole range ``(0, n)``
Box = Tuple[Tuple[int, int], ...]
#: (tensor receiving the adjoint, contribution tensor, the contribution's box)
Contribution = Tuple[Tensor, Tensor, Box]


def full_box(t: Tensor) -> Box:
    return tuple((0, n) for n in t.shape)


def is_empty(box: Box) -> bool:
    """Whether ``box`` holds no point (a symbolic dimension is never known to be empty)."""
    return any(isinstance(lo, int) and isinstance(hi, int) and lo >= hi for lo, hi in box)


def hull(boxes: Sequence[Box]) -> Box:
    """The smallest box containing every box of ``boxes`` (empty boxes ignored); a symbolic
    dimension is the tensor's whole range in every box, so it is that range."""
    real = [b for b in boxes if not is_empty(b)]
    if not real:
        return boxes[0] if boxes else ()
    out = []
    for d in range(len(real[0])):
        col = [b[d] for b in real]
        if all(isinstance(lo, int) and isinstance(hi, int) for lo, hi in col):
            out.append((min(lo for lo, _ in col), max(hi for _, hi in col)))
        else:
            out.append(col[0])
    return tuple(out)


def _inner(lo, hi, n):
    """The conditions ``lo <= f`` and ``f < hi`` that a box's range adds inside ``[0, n)``:
    ``(lo > 0, hi < n)`` for ints, nothing for a symbolic dimension (its whole range)."""
    if not (isinstance(lo, int) and isinstance(hi, int) and isinstance(n, int)):
        return False, False
    return lo > 0, hi < n


def _seed_for_reduction(y: Tensor, axes, red: Reduce, adj_read: Expr) -> Tuple[Expr, Expr]:
    """(seed, extra condition) for differentiating through ``red``, the body of ``y[axes]``:
    the rule of its reduction kind (:data:`.rules.REDUCTION_RULES`)."""
    rule = REDUCTION_RULES.get(red.combiner)
    if rule is None:
        raise UserError(f"cannot differentiate a {red.combiner} reduction")
    return rule(y, axes, red, adj_read)


def vjp_of_compute(y: Tensor, adj: Tensor, box: Optional[Box] = None) -> List[Contribution]:
    """The raw contributions of compute ``y`` with adjoint ``adj`` (zero outside ``box``) to
    the tensors it reads."""
    # Lifted reductions are differentiated here too, so callers only see the
    # tensors y really reads; y's own stored values stand for its body's value.
    box = full_box(y) if box is None else box
    if is_empty(box):
        return []  # the adjoint is structurally zero: nothing flows back
    body, lifted = normalized_body(y, PIECE_DEPTH)
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
    domain, rename, inside, fresh = _domain(y, red_axes, box)
    if where is not None:
        where = substitute(where, rename)
    if inside is not None:
        where = inside if where is None else dsl.all(where, inside)
    ranges = {id(f): (lo, hi - 1) for f, (lo, hi) in zip(fresh, box) if isinstance(lo, int) and isinstance(hi, int)}
    out: List[Contribution] = []
    for read, guards, partial in reads:
        x = read.tensor
        if not dtypes.is_float(x.dtype):
            continue
        indices = [substitute(g, rename) for g in read.indices]
        x_box = _box_of(x, indices, ranges)
        if is_empty(x_box):
            continue
        conds = ([where] if where is not None else []) + [substitute(g, rename) for g in guards]
        out.append((x, _contribution(x, y, indices, substitute(partial, rename), domain,
                                     dsl.all(conds) if conds else None), x_box))
    if lifted:
        out = _resolve_lifted(out, lifted)
    return out


def vjp_of_scatter(y: Tensor, adj: Tensor, box: Optional[Box] = None) -> List[Contribution]:
    """The raw contributions of scatter ``y`` with adjoint ``adj`` (zero outside ``box``) to the
    tensors its value reads.

    ``y = 0; y[d(p)] += v(p)`` for the points ``p`` of its axes where its ``where`` holds is
    linear in ``v``, and its transpose is a gather: the adjoint of ``v(p)`` is ``dy[d(p)]``.
    So the scatter is differentiated as the sum ``R_p v(p)`` seeded with ``dy[d(p)]`` at each
    point; the reads of ``v`` (the tensor the scatter's value reads, a forward input among
    them) then get their contributions by the ordinary rules:

        dX[j] += sum over {p : where(p) and g(p) == j} of dy[d(p)] * dv/dX[g](p)

    The indices ``d`` (integer: index tensors have no gradient) are read, never
    differentiated. Points whose ``d(p)`` lies outside ``box`` are left out (``dy`` is zero
    there), so a partial is never evaluated where nothing flows back."""
    op: ScatterOp = y.op
    box = full_box(y) if box is None else box
    if is_empty(box):
        return []
    # the scatter's value as the body of a 0-d sum, so nested reductions (and deep
    # pieces) are lifted exactly as for a compute's reduction
    as_sum = Tensor(y.name, (), y.dtype, ComputeOp((), Reduce("sum", op.value, op.axes, op.where)))
    body, lifted = normalized_body(as_sum, PIECE_DEPTH)
    conds = [] if body.where is None else [body.where]
    for ix, (lo, hi), n in zip(op.indices, box, y.shape):
        above, below = _inner(lo, hi, n)
        if above:
            conds.append(ix >= lo)
        if below:
            conds.append(ix < hi)
    seed = Read(adj, tuple(op.indices))
    out: List[Contribution] = []
    for read, guards, partial in backprop(body.body, seed):
        x = read.tensor
        if not dtypes.is_float(x.dtype):
            continue
        x_box = _box_of(x, read.indices, {})
        if is_empty(x_box):
            continue
        where = conds + list(guards)
        out.append((x, _contribution(x, y, read.indices, partial, list(body.axes),
                                     dsl.all(where) if where else None), x_box))
    if lifted:
        out = _resolve_lifted(out, lifted)
    return out


def _domain(y: Tensor, red_axes: List[ReduceAxis], box: Box):
    """The contribution's iteration domain: the reduce axes of ``y``'s body and one fresh axis
    per output dimension, the renaming of ``y``'s variables onto them, and the condition
    that keeps the output axes inside ``box`` (None when the box is the whole shape).

    Reduce axes come first (isl keeps the earlier variables as loops and solves the later
    ones from the index equalities, so kernel offsets stay loop variables), unless their
    bounds use output indices (the gradient of a simplified gradient): then after them."""
    axes = y.op.axes
    fresh = [dsl.reduce_axis((0, n), name=ax.name) for ax, n in zip(axes, y.shape)]
    rename: Dict[Var, Expr] = dict(zip(axes, fresh))
    renamed = []
    depends = False
    for r in red_axes:
        lo, hi = substitute(r.lo, rename), substitute(r.hi, rename)
        if lo is r.lo and hi is r.hi:
            renamed.append(r)
            continue
        depends = True
        new = ReduceAxis(r.name, r.dtype, lo, hi)
        rename[r] = new
        renamed.append(new)
    domain = fresh + renamed if depends else renamed + fresh
    conds = []
    for f, (lo, hi), n in zip(fresh, box, y.shape):
        above, below = _inner(lo, hi, n)
        if above:
            conds.append(f >= lo)
        if below:
            conds.append(f < hi)
    return domain, rename, (dsl.all(conds) if conds else None), fresh


def _box_of(x: Tensor, indices: Sequence[Expr], ranges) -> Box:
    """The interval hull of the read ``x[indices]`` over ``ranges``, clipped to ``x``'s shape."""
    out = []
    for g, n in zip(indices, x.shape):
        iv = interval(g, ranges)  # reduce axes range over their bounds; a data-dependent index: None
        if iv is None or not isinstance(n, int):
            out.append((0, n))
        else:
            out.append((max(0, iv[0]), min(n, iv[1] + 1)))
    return tuple(out)


def _contribution(x: Tensor, y: Tensor, indices: Sequence[Expr], value: Expr, domain: List[ReduceAxis],
                  where: Optional[Expr]) -> Tensor:
    """``dX[j] = sum over domain where (where and indices == j) of value``."""
    js = [Var(f"j{d}" if x.ndim > 1 else "j") for d in range(x.ndim)]
    matches = [g == j for g, j in zip(indices, js)]
    cond = dsl.all(([where] if where is not None else []) + matches)
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
        mine = [(c, b) for x, c, b in pending if x is t]
        pending = [(x, c, b) for x, c, b in pending if x is not t]
        if mine:
            adj = sum_contributions(t, [c for c, _ in mine])
            pending.extend(vjp_of_compute(t, adj, hull([b for _, b in mine])))
    return pending


def sum_contributions(x: Tensor, contribs: List[Tensor]) -> Tensor:
    """The adjoint of ``x``: the sum of its contribution tensors, named ``d<name>``."""
    name = f"d{x.name}"
    if len(contribs) == 1:
        c = contribs[0]
        return c if c.is_placeholder else Tensor(name, c.shape, c.dtype, c.op)
    js = [Var(f"j{d}" if x.ndim > 1 else "j") for d in range(x.ndim)]
    total = sum_terms([dsl.cast(x.dtype, Read(c, tuple(js))) for c in contribs])
    return Tensor(name, x.shape, x.dtype, ComputeOp(tuple(js), total))


def zeros_like(x: Tensor, name: str) -> Tensor:
    return dsl.compute(x.shape, lambda *i: dsl.const(0, x.dtype), name=name)


def ones_like(x: Tensor, name: str) -> Tensor:
    return dsl.compute(x.shape, lambda *i: dsl.const(1, x.dtype), name=name)
