"""Real scatters for data-dependent index maps.

A contribution ``dX[j] = sum over {r : ids(r) == j0, g1(r) == j1, ...} of v(r)``
whose equality is not quasi-affine (``T[ids[i], j]``, argmax-style indices)
would, as a gather, loop over the whole domain for every element of ``dX``:
the O(|dX| x |domain|) cliff. Instead it becomes a :class:`ScatterOp`: one
pass over the domain, accumulating ``dX[ids(r), g1(r), ...] += v(r)``
(``np.add.at`` semantics). The remaining quasi-affine conditions still
tighten the loops through isl.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from te_grad import dsl
from te_grad.graph import free_vars
from te_grad.ir import Compare, ComputeOp, Expr, Reduce, ScatterOp, Tensor
from te_grad.ops import reduction
from te_grad.transform import substitute

from .affine import IslNames, conjuncts, isl_cond, isl_expr
from .gather import lift_guards
from .isl_bridge import Domain, Unsupported
from .validate import scan


def _index_equalities(red: Reduce, axes) -> Optional[Dict[int, Expr]]:
    """``{d: g_d}`` if the where holds ``g_d == axes[d]`` for every output dimension d."""
    found: Dict[int, Expr] = {}
    for c in conjuncts(red.where):
        if not (isinstance(c, Compare) and c.op == "eq"):
            continue
        for lhs, rhs in ((c.a, c.b), (c.b, c.a)):
            for d, ax in enumerate(axes):
                if rhs is ax and d not in found and not any(v is a for v in free_vars(lhs) for a in axes):
                    found[d] = (lhs, c)
    return found if len(found) == len(axes) else None


def try_scatter(t: Tensor) -> Optional[Tensor]:
    """``t`` as a scatter if it is a sum whose index equalities are data-dependent, else None."""
    op = t.op
    red = op.body
    if not isinstance(op, ComputeOp) or not isinstance(red, Reduce) or reduction(red.combiner).lowering != "add" \
            or not op.axes:
        return None
    eqs = _index_equalities(red, op.axes)
    if eqs is None:
        return None
    names = {id(ax): f"r{n}" for n, ax in enumerate(red.axes)}
    if all(isl_expr(g, names) is not None for g, _ in eqs.values()):
        return None  # quasi-affine: a gather is exact and cheaper
    return _scatter(t.name, t.shape, t.dtype, red, op.axes, eqs, None)


def scatter_term(name: str, shape, dtype: str, red: Reduce, out_axes, note: str) -> Optional[Tensor]:
    """The reduction term ``red`` of a compute over ``out_axes`` as a scatter tensor, when its
    ``where`` pins every output index (``g_d(r) == j_d``), else None: one pass over the
    domain instead of one per output element, correct by construction (no isl scan needed
    for the indices). The fallback of a gather that did not pass validation."""
    if reduction(red.combiner).lowering != "add" or not out_axes:
        return None
    outs = {id(a) for a in out_axes}
    if any(id(v) in outs for ax in red.axes for b in (ax.lo, ax.hi) for v in free_vars(b)):
        return None  # bounds that use the output indices: the gather form is the only one
    eqs = _index_equalities(red, out_axes)
    if eqs is None:
        return None
    return _scatter(name, shape, dtype, red, out_axes, eqs, note)


def _scatter(name, shape, dtype, red: Reduce, out_axes, eqs, note) -> Tensor:
    names = IslNames({id(ax): f"r{n}" for n, ax in enumerate(red.axes)})
    used = {id(c) for _, c in eqs.values()}
    to_index = {ax: eqs[d][0] for d, ax in enumerate(out_axes)}
    lifted, value = lift_guards(red.body)
    conds = [c for c in conjuncts(red.where) if id(c) not in used]
    conds += [c for lc in lifted for c in conjuncts(lc)]
    conds = [substitute(c, to_index) for c in conds]
    value = substitute(value, to_index)
    indices = tuple(eqs[d][0] for d in range(len(out_axes)))
    axes, indices, value, where = _tighten(red, indices, value, conds, names)
    return Tensor(name, shape, dtype, ScatterOp(tuple(axes), indices, value, where, note))


def _tighten(red: Reduce, indices, value, conds: List[Expr], names):
    """Let isl tighten the domain by the quasi-affine conditions (a single loop nest only)."""
    affine, residual = [], []
    for c in conds:
        text = isl_cond(c, names)
        (residual if text is None else affine).append(c if text is None else text)
    bounds = []
    for n, ax in enumerate(red.axes):
        lo, hi = isl_expr(ax.lo, names), isl_expr(ax.hi, names)
        if lo is None or hi is None:
            return list(red.axes), indices, value, dsl.all(conds) if conds else None
        bounds.append(f"{lo} <= r{n} < {hi}")
    try:
        nests = scan(Domain([], [(f"r{n}", ax.name) for n, ax in enumerate(red.axes)], bounds + affine,
                            sizes=names.size_vars()))
    except Unsupported:
        nests = None
    if nests is None or len(nests) != 1 or nests[0].guards or not nests[0].axes:
        return list(red.axes), indices, value, dsl.all(conds) if conds else None
    nest = nests[0]
    mapping = dict(zip(red.axes, nest.values))
    filters = nest.filters + [substitute(c, mapping) for c in residual]
    return (nest.axes, tuple(substitute(i, mapping) for i in indices), substitute(value, mapping),
            dsl.all(filters) if filters else None)
