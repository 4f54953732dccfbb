"""Real scatters for data-dependent index maps.

A contribution ``dX[j] = sum over {r : ids(r) == j0, g1(r) == j1, ...} of v(r)``
whose equality is not quasi-affine (``T[ids[i], j]``, argmax-style indices)
would, as a gather, loop over the whole domain for every element of ``dX``:
the O(|dX| x |domain|) cliff. Instead it becomes a :class:`ScatterOp`: one
pass over the domain, accumulating ``dX[ids(r), g1(r), ...] += v(r)``
(``np.add.at`` semantics). The remaining quasi-affine conditions still
tighten the loops through isl. A sum over a ragged loop (bounds reading data,
``range(rowptr[v], rowptr[v + 1])``), which isl cannot represent, pinned by an
affine equality (``e == j``, a per-edge weight's adjoint) is a scatter too: its
loops and bounds are kept as written.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from te_grad import dsl, dtypes
from te_grad.graph import free_vars, reductions_in
from te_grad.ir import Compare, ComputeOp, Expr, Reduce, ReduceAxis, ScatterOp, Tensor, structurally_equal
from te_grad.ops import reduction
from te_grad.transform import substitute

from .affine import IslNames, conjuncts, isl_cond, isl_expr
from .gather import lift_guards
from .isl_bridge import Domain, Unsupported
from .solve import in_range, pinned_value, place_ranges
from .validate import scan


def _index_equalities(red: Reduce, axes, partial: bool = False) -> Optional[Dict[int, Expr]]:
    """``{d: (g_d, conjunct)}`` if the where holds ``g_d == axes[d]`` for every output dimension d
    (with ``partial``, for those it pins; also ``data == axes[d] + c``, :func:`.solve.pinned_value`)."""
    found: Dict[int, Expr] = {}
    for c in conjuncts(red.where):
        if not (isinstance(c, Compare) and c.op == "eq"):
            continue
        for d, ax in enumerate(axes):
            if d in found:
                continue
            for lhs, rhs in ((c.a, c.b), (c.b, c.a)):
                if rhs is ax and not any(v is a for v in free_vars(lhs) for a in axes):
                    found[d] = (lhs, c)
                    break
            else:
                value = pinned_value(c, ax) if partial else None
                if value is not None and not any(v is a for v in free_vars(value) for a in axes):
                    found[d] = (value, c)
    if partial:
        return found or None
    return found if len(found) == len(axes) else None


def try_scatter(t: Tensor) -> Optional[Tensor]:
    """``t`` as a scatter if it is a sum whose index equalities are data-dependent, else None.

    The ``where`` may pin only some output dimensions (``y[i, j] = sum_e(w[e] * x[src[e], j]
    where dst[e] == i)``, a COO aggregation) as long as one is pinned by a value read from a
    tensor: the others become loops of the scatter (``for e, j: y[dst[e], j] += ...``)."""
    op = t.op
    if not isinstance(op, ComputeOp) or not op.axes:
        return None
    red = op.body
    if not isinstance(red, Reduce) or reduction(red.combiner).lowering != "add":
        return None
    if any(reductions_in(part) for part in (red.body, red.where) if part is not None):
        return None  # a scatter's value is computed point by point: no reduction inside
    eqs = _index_equalities(red, op.axes, partial=True)
    if eqs is None:
        return None
    names = {id(ax): f"r{n}" for n, ax in enumerate(red.axes)}
    ragged = any(isl_expr(b, names) is None for ax in red.axes for b in (ax.lo, ax.hi))
    if not ragged and all(isl_expr(g, names) is not None for g, _ in eqs.values()):
        return None  # quasi-affine: a gather is exact and cheaper
    pinned = {id(op.axes[d]) for d in eqs}
    if any(id(v) in pinned for ax in red.axes for b in (ax.lo, ax.hi) for v in free_vars(b)):
        return None  # bounds that use a pinned output index: the gather form is the only one
    outs = {id(a) for a in op.axes}
    if ragged and any(id(v) in outs for ax in red.axes for b in (ax.lo, ax.hi) for v in free_vars(b)):
        return None  # ragged bounds that use the output indices: the gather form is the only one
    # bounds isl cannot represent (a ragged loop, range(rowptr[v], rowptr[v + 1])) leave no
    # gather to build: the scatter visits each point once, e.g. each edge of a CSR segment
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


def _scatter(name, shape, dtype, red: Reduce, out_axes, eqs, note) -> Optional[Tensor]:
    """The scatter of ``red`` (a term of a compute over ``out_axes``): the pinned output
    dimensions take their index expressions (written only where they lie in the output, as
    the sum over the output variable meant), the others become leading loops.
    None when the range cannot be tested before the conditions that read at the index."""
    shape = tuple(shape)
    used = {id(c) for _, c in eqs.values()}
    outer = [ReduceAxis(ax.name, dtypes.INDEX, dsl.const(0), n if isinstance(n, Expr) else dsl.const(n))
             for d, (ax, n) in enumerate(zip(out_axes, shape)) if d not in eqs]
    free = [ax for d, ax in enumerate(out_axes) if d not in eqs]
    to_index = {ax: eqs[d][0] for d, ax in enumerate(out_axes) if d in eqs}
    to_index.update(zip(free, outer))
    axes = list(outer)
    for ax in red.axes:  # the reduce axes, renamed where their bounds use a free output index
        lo, hi = substitute(ax.lo, to_index), substitute(ax.hi, to_index)
        if lo is not ax.lo or hi is not ax.hi:
            new = ReduceAxis(ax.name, ax.dtype, lo, hi)
            to_index[ax] = new
            ax = new
        axes.append(ax)
    names = IslNames({id(ax): f"r{n}" for n, ax in enumerate(axes)})
    lifted, value = lift_guards(red.body)
    indices = tuple(substitute(eqs[d][0], to_index) if d in eqs else to_index[ax]
                    for d, ax in enumerate(out_axes))
    conds = conjuncts(red.where) + [c for lc in lifted for c in conjuncts(lc)]
    pinned = {id(out_axes[d]) for d in eqs}
    data = sorted((d for d in eqs if isl_expr(indices[d], names) is None),
                  key=lambda d: next(n for n, c in enumerate(conds) if c is eqs[d][1]))
    for d in data:  # a data-dependent index is written only inside the output
        ranges = in_range(eqs[d][0], 0, shape[d])
        ranges = [r for r in ranges if not any(structurally_equal(r, c) for c in conds)]
        k = next(n for n, c in enumerate(conds) if c is eqs[d][1])
        conds = place_ranges(conds, k, pinned, ranges, eqs[d][0], used)
        if conds is None:
            return None
    # a quasi-affine index that may leave the output is written only inside it (no reads:
    # first); over a ragged loop (bounds read from data) no range is added: the scatter's
    # store checks its indices at run time, so a row pointer leaving the edges is an error
    ragged = any(isl_expr(b, names) is None for ax in axes for b in (ax.lo, ax.hi))
    affine = [c for d in eqs if d not in data and not ragged and _may_leave(indices[d], shape[d], axes, names)
              for c in in_range(indices[d], 0, shape[d])]
    conds = affine + [substitute(c, to_index) for c in conds if id(c) not in used]
    value = substitute(value, to_index)
    axes, indices, value, where = _tighten(axes, indices, value, conds, names)
    return Tensor(name, shape, dtype, ScatterOp(tuple(axes), indices, value, where, note))


def _may_leave(index: Expr, n: int, axes, names) -> bool:
    """Whether the quasi-affine ``index`` can leave ``[0, n)`` at some point of the box of
    ``axes`` (True when isl cannot tell)."""
    text = isl_expr(index, names)
    extent = isl_expr(n, names) if isinstance(n, Expr) else str(n)
    bounds = []
    for k, ax in enumerate(axes):
        lo, hi = isl_expr(ax.lo, names), isl_expr(ax.hi, names)
        if text is None or lo is None or hi is None or extent is None:
            return True
        bounds.append(f"{lo} <= r{k} < {hi}")
    try:
        dom = Domain([], [(f"r{k}", ax.name) for k, ax in enumerate(axes)],
                      bounds + [f"({text} < 0 or {text} >= {extent})"], sizes=names.size_vars())
        return dom.sample() is not None
    except Unsupported:
        return True


def _tighten(red_axes, indices, value, conds: List[Expr], names):
    """Let isl tighten the domain by the quasi-affine conditions (a single loop nest only)."""
    affine, residual = [], []
    for c in conds:
        text = isl_cond(c, names)
        (residual if text is None else affine).append(c if text is None else text)
    bounds = []
    for n, ax in enumerate(red_axes):
        lo, hi = isl_expr(ax.lo, names), isl_expr(ax.hi, names)
        if lo is None or hi is None:
            return _pin_box_axes(list(red_axes), indices, value, conds)
        bounds.append(f"{lo} <= r{n} < {hi}")
    try:
        nests = scan(Domain([], [(f"r{n}", ax.name) for n, ax in enumerate(red_axes)], bounds + affine,
                            sizes=names.size_vars()))
    except Unsupported:
        nests = None
    if nests is None or len(nests) != 1 or nests[0].guards or not nests[0].axes:
        return list(red_axes), indices, value, dsl.all(conds) if conds else None
    nest = nests[0]
    mapping = dict(zip(red_axes, nest.values))
    filters = nest.filters + [substitute(c, mapping) for c in residual]
    return (nest.axes, tuple(substitute(i, mapping) for i in indices), substitute(value, mapping),
            dsl.all(filters) if filters else None)


def _pin_box_axes(axes, indices, value, conds: List[Expr]):
    """A domain isl cannot represent (a ragged loop): an axis with constant bounds that no
    bound uses and that a condition ``axis == g`` pins is not looped over; it becomes ``g``,
    with ``lo <= g < hi`` as a filter (``sum over i of [k == i] f(i)`` is ``[0 <= k < n] f(k)``):
    a softmax written per segment and pinned to its edge scatters in one pass over the edges."""
    mapping = {}
    changed = True
    while changed:
        changed = False
        used = {id(v) for ax in axes for b in (ax.lo, ax.hi) for v in free_vars(b)}
        for c in conds:
            if not (isinstance(c, Compare) and c.op == "eq"):
                continue
            for r, g in ((c.a, c.b), (c.b, c.a)):
                if not (isinstance(r, ReduceAxis) and any(r is a for a in axes) and r.extent is not None
                        and id(r) not in used and not any(v is r for v in free_vars(g))):
                    continue
                rest = [x for x in conds if x is not c]
                conds = [substitute(x, {r: g}) for x in rest] + [g >= r.lo, g < r.hi]
                axes = [a for a in axes if a is not r]
                mapping = {k: substitute(v, {r: g}) for k, v in mapping.items()}
                mapping[r] = g
                changed = True
                break
            if changed:
                break
    if mapping:
        indices = tuple(substitute(i, mapping) for i in indices)
        value = substitute(value, mapping)
    return axes, indices, value, dsl.all(conds) if conds else None
