"""Small IR rewrites shared by the passes: substitution of variables, sums of many terms."""
from typing import Dict, List

from .ir import Binary, Expr, Tensor, Var
from .visitor import Mutator


class _Substitute(Mutator):
    def __init__(self, mapping: Dict[Var, Expr]):
        super().__init__()
        self.mapping = {id(k): v for k, v in mapping.items()}

    def visit_Var(self, node):
        return self.mapping.get(id(node), node)

    def visit_ReduceAxis(self, node):
        got = self.mapping.get(id(node))
        return got if got is not None else super().visit_ReduceAxis(node)


def substitute(expr: Expr, mapping: Dict[Var, Expr]) -> Expr:
    """``expr`` with every free occurrence of each variable in ``mapping`` replaced."""
    if not mapping:
        return expr
    return _Substitute(mapping).visit(expr)


class _RetargetReads(Mutator):
    def __init__(self, new: Dict[int, "Tensor"]):
        super().__init__()
        self.new = new

    def visit_Read(self, node):
        node = self.generic_visit(node)
        target = self.new.get(id(node.tensor))
        return node if target is None or target is node.tensor else type(node)(target, node.indices)


def replace_tensors(roots, mapping: Dict[int, "Tensor"]) -> Dict[int, "Tensor"]:
    """Rebuild the graph behind ``roots`` with each tensor ``t`` whose id is in ``mapping``
    replaced by ``mapping[id(t)]`` (a placeholder standing for a saved value, say).

    Returns ``{id(old): new}`` for every tensor of the graph; a tensor none of whose
    inputs changed is kept as the same object."""
    from dataclasses import replace
    from .graph import topo_order
    from .ir import ComputeOp, ScatterOp, Tensor
    new: Dict[int, Tensor] = dict(mapping)
    for t in topo_order(list(roots)):
        if id(t) in new:
            continue
        op = t.op
        if not any(id(x) in new and new[id(x)] is not x for x in op.inputs()):
            new[id(t)] = t
            continue
        retarget = _RetargetReads(new)
        if isinstance(op, ComputeOp):
            op = replace(op, body=retarget.visit(op.body))
        elif isinstance(op, ScatterOp):
            op = replace(op, indices=tuple(retarget.visit(i) for i in op.indices), value=retarget.visit(op.value),
                         where=None if op.where is None else retarget.visit(op.where),
                         axes=tuple(retarget.visit(a) for a in op.axes))
        new[id(t)] = Tensor(t.name, t.shape, t.dtype, op)
    return new


#: a sum of at most this many terms is built left to right; longer ones as a balanced tree
#: of such runs, so that its depth grows with the log of the number of terms
SUM_RUN = 16


def sum_terms(terms) -> Expr:
    """``terms[0] + terms[1] + ...``: left to right for up to :data:`SUM_RUN` terms, a balanced
    tree of left-to-right runs beyond (the adjoint of a tensor read by thousands of stages
    stays a shallow expression; :func:`summands` reads the terms back in order either
    way)."""
    terms = list(terms)
    level = []
    for k in range(0, len(terms), SUM_RUN):
        run = terms[k]
        for t in terms[k + 1:k + SUM_RUN]:
            run = run + t
        level.append(run)
    while len(level) > 1:
        level = [level[k] + level[k + 1] if k + 1 < len(level) else level[k] for k in range(0, len(level), 2)]
    return level[0]


def summands(e: Expr) -> List[Expr]:
    """The operands of a tree of ``+``, left to right (iterative: sums may be long)."""
    out: List[Expr] = []
    stack = [e]
    while stack:
        node = stack.pop()
        if isinstance(node, Binary) and node.op == "add":
            stack.append(node.b)
            stack.append(node.a)
        else:
            out.append(node)
    return out
