"""Queries over expressions and tensor graphs: reads, free variables, order."""
from typing import Dict, Iterable, List, Tuple

from .ir import Expr, Read, Reduce, Tensor, Var, ComputeOp
from .visitor import Visitor


class _ReadCollector(Visitor):
    def __init__(self):
        self.reads: List[Read] = []

    def visit_Read(self, node: Read):
        self.reads.append(node)
        for ix in node.indices:
            self.visit(ix)


def reads_in(expr: Expr) -> List[Read]:
    """Every Read node of ``expr`` in a fixed left-to-right order (repeats kept)."""
    c = _ReadCollector()
    c.visit(expr)
    return c.reads


def tensors_read(expr: Expr) -> Tuple[Tensor, ...]:
    """The distinct tensors read by ``expr``, in order of first read."""
    seen: Dict[int, Tensor] = {}
    for r in reads_in(expr):
        seen.setdefault(id(r.tensor), r.tensor)
    return tuple(seen.values())


class _FreeVars(Visitor):
    def __init__(self):
        self.bound = []
        self.free: Dict[int, Var] = {}

    def visit_Var(self, node):
        if not any(node is b for b in self.bound):
            self.free.setdefault(id(node), node)

    def visit_ReduceAxis(self, node):
        self.visit_Var(node)

    def visit_Reduce(self, node: Reduce):
        n = len(self.bound)
        for ax in node.axes:  # an axis' bounds may use enclosing variables and the earlier axes
            self.visit(ax.lo)
            self.visit(ax.hi)
            self.bound.append(ax)
        self.visit(node.body)
        if node.where is not None:
            self.visit(node.where)
        del self.bound[n:]


def free_vars(expr: Expr) -> Tuple[Var, ...]:
    """Variables used in ``expr`` and not bound by a reduction inside it."""
    c = _FreeVars()
    c.visit(expr)
    return tuple(c.free.values())


def topo_order(outputs: Iterable[Tensor]) -> List[Tensor]:
    """All tensors ``outputs`` depend on (themselves included), producers first."""
    order: List[Tensor] = []
    state: Dict[int, int] = {}
    for root in outputs:
        stack = [(root, False)]
        while stack:
            t, done = stack.pop()
            if done:
                if state.get(id(t)) != 2:
                    state[id(t)] = 2
                    order.append(t)
                continue
            if state.get(id(t)):
                continue
            state[id(t)] = 1
            stack.append((t, True))
            for dep in reversed(t.op.inputs()):
                if not state.get(id(dep)):
                    stack.append((dep, False))
    return order


def placeholders_of(outputs: Iterable[Tensor]) -> List[Tensor]:
    """Placeholders the outputs depend on, in topological order."""
    return [t for t in topo_order(outputs) if t.is_placeholder]


def consumers(order: List[Tensor]) -> Dict[int, List[Tensor]]:
    """Map id(tensor) -> compute tensors in ``order`` that read it."""
    out: Dict[int, List[Tensor]] = {id(t): [] for t in order}
    for t in order:
        if isinstance(t.op, ComputeOp):
            for dep in t.op.inputs():
                out.setdefault(id(dep), []).append(t)
    return out


def reductions_in(expr: Expr, guards=(), loops=()) -> List[Tuple[Reduce, list, list]]:
    """Every reduction of ``expr`` with the conditions of the ``if_then_else`` branches that
    lead to it (``guards``) and the reduce axes of the reductions around it (``loops``)."""
    from .ir import Select
    out = []
    if isinstance(expr, Reduce):
        out.append((expr, list(guards), list(loops)))
        out += reductions_in(expr.body, guards, list(loops) + list(expr.axes))
        return out
    if isinstance(expr, Select):
        out += reductions_in(expr.cond, guards, loops)
        out += reductions_in(expr.t, list(guards) + [expr.cond], loops)
        out += reductions_in(expr.f, list(guards) + [~expr.cond], loops)
        return out
    for c in expr.children():
        out += reductions_in(c, guards, loops)
    return out
