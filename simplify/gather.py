"""Simplify one reduction: tight loops over exactly the points that contribute.

For ``T[j] = R over {r in box : where(j, r)} of body(j, r)``:

1. guards of the body -- ``if_then_else(c, x, 0)`` factors of a sum,
   ``if_then_else(c, x, -inf)`` around a max's body (the reduction's identity) --
   move into the domain, so a branch that adds nothing is never iterated;
2. the quasi-affine conjuncts of the domain (bounds, index equalities
   ``g(r) == j``, padding guards, triangular masks, ``//`` and ``%``) go to isl,
   which scans them into loop nests: dimensions fixed by equalities disappear
   (a single-valued relation leaves no loop at all), congruences become
   strided loops, the remaining bounds are tight;
3. the other conjuncts (data-dependent or float conditions) stay as filters.

If the index equality of some output dimension is data-dependent
(``ids[i] == j``), the gather would loop over the whole domain for every
output element; :mod:`.scatter` handles that case instead.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from te_grad import dsl
from te_grad.ops import identity_of, reduction
from te_grad.ir import Binary, Cast, Const, Expr, Reduce, Select, Unary, Var
from te_grad.transform import substitute

from .affine import IslNames, conjuncts, isl_cond, isl_expr
from .isl_bridge import Domain, LoopNest, Unsupported
from .validate import scan

#: how two pieces of a reduction combine, by the lowering of its record (te_grad.ops.REDUCTIONS)
COMBINE = {"add": lambda red, a, b: a + b, "mul": lambda red, a, b: a * b,
           "select": lambda red, a, b: dsl.maximum(a, b) if red.order == ">" else dsl.minimum(a, b)}


def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0


def lift_guards(e: Expr) -> Tuple[List[Expr], Expr]:
    """Split ``e`` into conditions and a value: ``e == (value if all(conds) else 0)``."""
    if isinstance(e, Select):
        if _is_zero(e.f):
            conds, value = lift_guards(e.t)
            return [e.cond] + conds, value
        if _is_zero(e.t):
            conds, value = lift_guards(e.f)
            return [~e.cond] + conds, value
    if isinstance(e, Binary) and e.op == "mul":
        ca, a = lift_guards(e.a)
        cb, b = lift_guards(e.b)
        if ca or cb:
            return ca + cb, a * b
    if isinstance(e, Binary) and e.op == "div":
        ca, a = lift_guards(e.a)
        if ca:
            return ca, a / e.b
    if isinstance(e, Unary) and e.op == "neg":
        ca, a = lift_guards(e.a)
        if ca:
            return ca, -a
    if isinstance(e, Cast):
        ca, a = lift_guards(e.a)
        if ca:
            return ca, dsl.cast(e.dtype, a)
    return [], e


def lift_identity_guards(e: Expr, identity) -> Tuple[List[Expr], Expr]:
    """Split a max (min) reduction's body into conditions and a value: ``if_then_else(c, x,
    -inf)`` is ``x`` where ``c`` holds and the reduction's identity elsewhere, which the
    reduction ignores."""
    conds: List[Expr] = []
    while isinstance(e, Select):
        if isinstance(e.f, Const) and e.f.value == identity:
            conds.append(e.cond)
            e = e.t
        elif isinstance(e.t, Const) and e.t.value == identity:
            conds.append(~e.cond)
            e = e.f
        else:
            break
    return conds, e


class ReductionParts:
    """A reduction split into what isl sees and what it does not."""

    def __init__(self, red: Reduce, out_axes: Sequence[Var], shape: Sequence[int]):
        self.red = red
        self.body = red.body
        conds = conjuncts(red.where)
        if reduction(red.combiner).lowering == "add":
            lifted, self.body = lift_guards(red.body)
            conds = conds + [c for lc in lifted for c in conjuncts(lc)]
        elif reduction(red.combiner).lowering == "select":
            lifted, self.body = lift_identity_guards(red.body, identity_of(red.combiner, red.dtype))
            conds = conds + [c for lc in lifted for c in conjuncts(lc)]
        self.names: Dict[int, str] = IslNames()
        self.params = []
        self.ok = True
        for d, (ax, n) in enumerate(zip(out_axes, shape)):
            self.names[id(ax)] = f"p{d}"
            self.params.append((f"p{d}", ax, n))
            if isinstance(n, Expr) and isl_expr(n, self.names) is None:
                self.ok = False  # an extent isl cannot represent (a product of two sizes)
        self.dims = []
        for n, ax in enumerate(red.axes):
            self.names[id(ax)] = f"r{n}"
            self.dims.append((f"r{n}", ax.name))
        self.affine: List[str] = []
        self.residual: List[Expr] = []
        if not self.ok:
            return
        for n, ax in enumerate(red.axes):
            lo, hi = isl_expr(ax.lo, self.names), isl_expr(ax.hi, self.names)
            if lo is None or hi is None:
                self.ok = False
                return
            self.affine.append(f"{lo} <= r{n} < {hi}")
        self.affine_conditions = 0
        for c in conds:
            text = isl_cond(c, self.names)
            if text is None:
                self.residual.append(c)
            else:
                self.affine.append(text)
                self.affine_conditions += 1

    def domain(self, order=None) -> Domain:
        return Domain(self.params, self.dims, self.affine, order, sizes=self.names.size_vars())


def simplify_reduction(red: Reduce, out_axes: Sequence[Var], shape: Sequence[int]) -> Optional[Expr]:
    """An exact replacement for ``red`` with tight loops, or None if there is nothing to gain.

    Raises :class:`~simplify.isl_bridge.Unsupported` (or its :class:`Unverified`) when isl
    could not produce a scan that passes translation validation: the caller falls back."""
    if reduction(red.combiner).indexed:
        return None  # its value is the axis's: the pieces' substituted axes would change it
    parts = ReductionParts(red, out_axes, shape)
    if not parts.ok or (not parts.affine_conditions and not parts.residual):
        return None  # a box, or an already simplified nest: nothing to gain
    nests = scan(parts.domain())
    if any(n.strided for n in nests):
        # a strided loop vectorizes and reads badly: see whether solving for the other
        # variables (the reverse loop order) avoids it, as for a strided conv's gradient
        try:
            other = scan(parts.domain(list(reversed(range(len(parts.dims))))))
        except Unsupported:
            other = nests
        if sum(n.strided for n in other) < sum(n.strided for n in nests):
            nests = other
    identity = dsl.const(identity_of(red.combiner, red.dtype), red.dtype)
    terms = [_term(red, parts, nest, identity) for nest in nests]
    if not terms:
        return identity
    out = terms[0]
    for t in terms[1:]:
        out = COMBINE[reduction(red.combiner).lowering](reduction(red.combiner), out, t)
    return out


def _term(red: Reduce, parts: ReductionParts, nest: LoopNest, identity: Expr) -> Expr:
    mapping = {ax: v for ax, v in zip(red.axes, nest.values)}
    body = substitute(parts.body, mapping)
    filters = nest.filters + [substitute(c, mapping) for c in parts.residual]
    if nest.axes:
        value = Reduce(red.combiner, body, tuple(nest.axes), dsl.all(filters) if filters else None)
    elif filters:
        value = dsl.if_then_else(dsl.all(filters), body, identity)
    else:
        value = body
    if nest.guards:
        value = dsl.if_then_else(dsl.all(nest.guards), value, identity)
    return value
