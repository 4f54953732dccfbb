"""Iteration domains as isl sets, for inspection (``tg.domain``)."""
from __future__ import annotations

from typing import List

from te_grad.errors import UserError
from te_grad.graph import reductions_in
from te_grad.ir import ComputeOp, Expr, Reduce, Tensor

from .affine import IslNames, conjuncts, isl_cond, isl_expr
from .isl_bridge import Domain


class IterationDomain:
    """The points ``(output indices, reduce indices)`` of one reduction of a tensor.

    ``isl`` is the set in isl notation (bounds and the quasi-affine part of the
    filter, as isl normalizes it); ``filters`` lists the conditions isl cannot
    represent (checked at every point); ``loops`` the reduce variables.
    """

    def __init__(self, tensor: Tensor, red: Reduce, text: str, filters: List[str]):
        self.tensor = tensor
        self.reduction = red
        self.isl = text
        self.filters = filters

    def __repr__(self):
        extra = f"\n  filtered by: {' and '.join(self.filters)}" if self.filters else ""
        return f"iteration domain of {self.tensor.name}: {self.isl}{extra}"


def domains(tensor: Tensor) -> List[IterationDomain]:
    """The iteration domain of every reduction in ``tensor``'s body."""
    if not isinstance(tensor.op, ComputeOp):
        raise UserError(f"{tensor.name} is not a compute tensor; it has no iteration domain")
    from te_grad.printer import expr_to_str
    found = reductions_in(tensor.op.body)
    out = []
    for red, _guards, loops in found:
        names, params = IslNames(), []
        for d, (ax, n) in enumerate(zip(tensor.op.axes, tensor.shape)):
            names[id(ax)] = ax.name if ax.name.isidentifier() else f"i{d}"
            params.append((names[id(ax)], ax, n))
        dims, cons = [], []
        for r in list(loops) + list(red.axes):
            names[id(r)] = r.name
            dims.append((r.name, r.name))
            lo, hi = isl_expr(r.lo, names), isl_expr(r.hi, names)
            if lo is not None and hi is not None:
                cons.append(f"{lo} <= {r.name} < {hi}")
        filters = []
        for c in conjuncts(red.where):
            text = isl_cond(c, names)
            if text is None:
                filters.append(expr_to_str(c))
            else:
                cons.append(text)
        box = []
        for p in params:
            hi = isl_expr(p[2], names) if isinstance(p[2], Expr) else p[2]
            box.append(f"0 <= {p[0]}" if hi is None else f"0 <= {p[0]} < {hi}")
        dom = Domain([], [(p[0], p[0]) for p in params] + dims, box + cons, sizes=names.size_vars())
        out.append(IterationDomain(tensor, red, str(dom.set.coalesce()), filters))
    return out
