"""Bring compute bodies to the form the VJP works on: at most one reduction, at the top.

``Y[i] = exp(sum(X[i, k] for k ...))`` becomes ``Y[i] = exp(Y_sum[i])`` with a
new tensor ``Y_sum[i] = sum(X[i, k] for k ...)``. A lifted reduction keeps only
the variables it uses (a row sum is computed once per row), and a reduction
nested inside another reduction's body becomes a tensor over the enclosing
reduce axes it uses, which must have constant bounds.
"""
from typing import List, Tuple

from . import dsl
from .errors import UserError
from .graph import free_vars
from .ir import ComputeOp, Const, Expr, Read, Reduce, ReduceAxis, Tensor, Var
from .transform import substitute
from .visitor import Mutator

class _Lifter(Mutator):
    def __init__(self, tensor: Tensor):
        super().__init__()
        self.tensor = tensor
        self.top = tensor.op.body
        self.lifted: List[Tensor] = []

    def visit_Reduce(self, node: Reduce):
        return self._lift(super().visit_Reduce(node))

    def run(self) -> Expr:
        top = self.top
        if isinstance(top, Reduce):
            # the top reduction stays; only reductions inside it are lifted
            body = self.visit(top.body)
            where = None if top.where is None else self.visit(top.where)
            if body is top.body and where is top.where:
                return top
            return Reduce(top.combiner, body, top.axes, where)
        return self.visit(top)

    def _lift(self, red: Reduce) -> Expr:
        op: ComputeOp = self.tensor.op
        used = free_vars(red)
        dims, shape, index = [], [], []
        for d, ax in enumerate(op.axes):
            if any(v is ax for v in used):
                dims.append(ax)
                shape.append(self.tensor.shape[d])
                index.append(ax)
        for v in used:
            if isinstance(v, ReduceAxis):
                if not (isinstance(v.lo, Const) and isinstance(v.hi, Const)):
                    raise UserError(f"cannot differentiate {self.tensor.name}: the reduction {red} is nested "
                                    f"in a reduction over {v.name}, whose bounds are not constant")
                dims.append(v)
                shape.append(v.extent)
                index.append(v - v.lo.value if v.lo.value else v)
        name = f"{self.tensor.name}_{red.combiner}"
        new_axes = [Var(v.name) for v in dims]
        mapping = {}
        for v, nv in zip(dims, new_axes):
            mapping[v] = nv + v.lo.value if isinstance(v, ReduceAxis) and v.lo.value else nv
        body = substitute(red, mapping)
        lifted = Tensor(name, tuple(shape), body.dtype, ComputeOp(tuple(new_axes), body))
        self.lifted.append(lifted)
        return Read(lifted, tuple(dsl.cast("int64", i) for i in index))


def normalized_body(tensor: Tensor) -> Tuple[Expr, List[Tensor]]:
    """The body of ``tensor`` with nested reductions lifted, and the lifted tensors (producers first)."""
    lifter = _Lifter(tensor)
    body = lifter.run()
    return body, lifter.lifted
