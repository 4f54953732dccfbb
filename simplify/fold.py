"""Constant folding after rewrites: rebuild arithmetic through the DSL, which folds."""
from te_grad import dsl
from te_grad.ir import Binary, Const, Select
from te_grad.visitor import Mutator


class Fold(Mutator):
    """Folds integer constants, ``x * 1``-style identities and selects on constant conditions."""

    def visit_Binary(self, node: Binary):
        new = self.generic_visit(node)
        if not isinstance(new, Binary):
            return new
        folded = dsl.binary(new.op, new.a, new.b)
        unchanged = isinstance(folded, Binary) and folded.a is new.a and folded.b is new.b
        return new if unchanged else folded

    def visit_Select(self, node: Select):
        new = self.generic_visit(node)
        if isinstance(new, Select) and isinstance(new.cond, Const):
            return new.t if new.cond.value else new.f
        return new


def fold(expr):
    """``expr`` with constants folded (the same node if nothing folds)."""
    return Fold().visit(expr)
