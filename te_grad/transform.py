"""Small IR rewrites shared by the passes: substitution of variables."""
from typing import Dict

from .ir import Expr, Var
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
