"""One visitor base and one mutator base for the expression IR.

Subclasses override ``visit_<NodeClass>`` for the nodes they care about; every
other node is walked (Visitor) or rebuilt from its visited children (Mutator).
A Mutator returns the very same node when nothing below it changed, and
visits each distinct node object once (results are memoized by identity); a Visitor
walks each distinct node once too.
"""
from .ir import Expr, Reduce, ReduceAxis, _field_names


class Visitor:
    """Walks an expression, children before nothing: override visit_X to act.

    Each distinct node object is visited once per visitor (a node shared by several parents,
    a DAG, is not walked again: second-order gradients share so much that their trees are
    exponentially larger). A visitor whose visits depend on where the node is (the scopes
    around it) overrides ``visit`` with its own memo and calls :meth:`dispatch`."""

    def visit(self, node):
        walked = self.__dict__.get("_walked")
        if walked is None:
            walked = self.__dict__["_walked"] = set()
        if id(node) in walked:
            return None
        walked.add(id(node))
        return self.dispatch(node)

    def dispatch(self, node):
        method = getattr(self, "visit_" + type(node).__name__, None)
        if method is not None:
            return method(node)
        return self.generic_visit(node)

    def generic_visit(self, node):
        for child in node.children():
            self.visit(child)


class Mutator:
    """Rebuilds an expression bottom-up; returns the same node when unchanged.

    Reduce axes whose bounds change are replaced by fresh axes, and every use
    of the old axis inside the reduction is renamed to the new one.
    """

    def __init__(self):
        self._memo = {}
        self._axis_map = {}

    def visit(self, node):
        key = id(node)
        hit = self._memo.get(key)
        if hit is not None and hit[0] is node:
            return hit[1]
        method = getattr(self, "visit_" + type(node).__name__, None)
        out = method(node) if method is not None else self.generic_visit(node)
        self._memo[key] = (node, out)
        return out

    def forget(self):
        """Drop what was built so far (an axis was renamed: its uses must be rebuilt)."""
        self._memo.clear()

    def visit_Var(self, node):
        return node

    def visit_ReduceAxis(self, node):
        return self._axis_map.get(node, node)

    def visit_Reduce(self, node: Reduce):
        new_axes = []
        for ax in node.axes:
            lo, hi = self.visit(ax.lo), self.visit(ax.hi)
            if lo is ax.lo and hi is ax.hi:
                new_axes.append(ax)
            else:
                fresh = ReduceAxis(ax.name, ax.dtype, lo, hi)
                self._axis_map[ax] = fresh
                new_axes.append(fresh)
        if any(a is not b for a, b in zip(new_axes, node.axes)):
            self.forget()  # uses of renamed axes must be revisited
        body = self.visit(node.body)
        where = None if node.where is None else self.visit(node.where)
        for ax in node.axes:
            if self._axis_map.pop(ax, None) is not None:
                self.forget()
        if body is node.body and where is node.where and all(a is b for a, b in zip(new_axes, node.axes)):
            return node
        return Reduce(node.combiner, body, tuple(new_axes), where)

    def generic_visit(self, node):
        names = _field_names(type(node))
        values = [getattr(node, n) for n in names]
        changed = False
        for k, value in enumerate(values):
            if isinstance(value, Expr):
                new = self.visit(value)
            elif isinstance(value, tuple) and value and isinstance(value[0], Expr):
                new = tuple([self.visit(v) for v in value])
                if all(a is b for a, b in zip(new, value)):
                    new = value
            else:
                continue
            if new is not value:
                values[k] = new
                changed = True
        return type(node)(*values) if changed else node
