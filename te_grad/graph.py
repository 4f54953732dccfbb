"""Queries over expressions and tensor graphs: reads, free variables, order."""
from typing import Dict, Iterable, List, Tuple

from .ir import Expr, Reduce, SizeVar, Tensor, Var, ComputeOp
from .ir import reads_in, tensors_read  # noqa: F401 - the walks the nodes themselves need


def free_var_ids(e: Expr, memo: Dict[int, tuple]) -> tuple:
    """Sorted ids of the variables and sizes ``e``'s value depends on: those it uses, less the
    axes its own reductions bind. Memoized in ``memo`` (``id(node) -> (node, ids)``, which the
    caller keeps for as long as its nodes live), bottom-up and iteratively, so a DAG's shared
    node is walked once. Evaluators key their per-node caches by the values bound to these."""
    got = memo.get(id(e))
    if got is not None and got[0] is e:
        return got[1]
    stack = [(e, False)]
    while stack:
        x, done = stack.pop()
        hit = memo.get(id(x))
        if hit is not None and hit[0] is x:
            continue
        kids = [c for c in x.children() if isinstance(c, Expr)]
        if not done:
            stack.append((x, True))
            stack.extend((c, False) for c in kids)
            continue
        ids = {id(x)} if isinstance(x, (Var, SizeVar)) else set()
        for c in kids:
            ids.update(memo[id(c)][1])
        if isinstance(x, Reduce):
            ids -= {id(a) for a in x.axes}
        memo[id(x)] = (x, tuple(sorted(ids)))
    return memo[id(e)][1]


_NOTHING = frozenset()


def free_vars(expr: Expr) -> Tuple[Var, ...]:
    """Variables used in ``expr`` and not bound by a reduction inside it (in order of first use)."""
    free: Dict[int, Var] = {}
    bound: Dict[int, int] = {}
    scope = _NOTHING  # the axes bound here
    # (node, scope) pairs walked: a second walk of a node (a DAG's shared node) with the same
    # axes bound finds no variable the first did not, so it is skipped (linear in the DAG,
    # inside reductions too: a second-order gradient sums a shared DAG over reduce axes)
    walked = set()
    stack = [("visit", expr)]
    while stack:
        action, item = stack.pop()
        if action == "bind" or action == "unbind":
            for ax in item:
                bound[id(ax)] = bound.get(id(ax), 0) + (1 if action == "bind" else -1)
            scope = frozenset(k for k, count in bound.items() if count > 0)
            continue
        node = item
        if (id(node), scope) in walked or (id(node), _NOTHING) in walked:
            continue  # walked with fewer axes bound (none): it found every variable this walk would
        walked.add((id(node), scope))
        if isinstance(node, Var):  # also ReduceAxis: a use of the variable
            if not bound.get(id(node)):
                free.setdefault(id(node), node)
            continue
        if isinstance(node, Reduce):
            # an axis' bounds may use enclosing variables and the earlier axes; the body and
            # the where see every axis
            todo = []
            for k, ax in enumerate(node.axes):
                todo += [("bind", node.axes[:k]), ("visit", ax.lo), ("visit", ax.hi),
                         ("unbind", node.axes[:k])]
            todo += [("bind", node.axes), ("visit", node.body)]
            if node.where is not None:
                todo.append(("visit", node.where))
            todo.append(("unbind", node.axes))
            stack.extend(reversed(todo))
            continue
        stack.extend(("visit", c) for c in reversed(node.children()))
    return tuple(free.values())


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


def _with_reductions(expr: Expr) -> set:
    """Ids of the nodes of ``expr`` that are, or have below them, a reduction (one
    bottom-up pass over the DAG, iterative)."""
    holds = set()
    stack = [(expr, False)]
    done = set()
    while stack:
        e, after = stack.pop()
        if after:
            if isinstance(e, Reduce) or any(id(c) in holds for c in e.children()):
                holds.add(id(e))
            continue
        if id(e) in done:
            continue
        done.add(id(e))
        stack.append((e, True))
        stack.extend((c, False) for c in e.children())
    return holds


def reductions_in(expr: Expr, guards=(), loops=()) -> List[Tuple[Reduce, list, list]]:
    """Every reduction of ``expr`` with the conditions of the ``if_then_else`` branches that
    lead to it (``guards``) and the reduce axes of the reductions around it (``loops``),
    outer reductions first, left to right (iterative: an explicit stack). A node shared by
    several parents (a DAG) is walked once per context (the same guards and loops): a
    reduction reached twice in one context is listed once. Only nodes with a reduction
    below them are walked, so an expression without one costs one pass over its DAG,
    however many contexts its shared nodes have."""
    from .ir import Select
    out = []
    stack = [(expr, list(guards), list(loops))]
    seen = set()
    negated: Dict[int, Expr] = {}  # one ~cond per Select, so that its contexts compare by identity
    holds = _with_reductions(expr)
    while stack:
        e, gs, ls = stack.pop()
        if id(e) not in holds:
            continue
        key = (id(e), tuple(map(id, gs)), tuple(map(id, ls)))
        if key in seen:
            continue
        seen.add(key)
        if isinstance(e, Reduce):
            out.append((e, list(gs), list(ls)))
            stack.append((e.body, gs, ls + list(e.axes)))
        elif isinstance(e, Select):
            if id(e) not in negated:
                negated[id(e)] = ~e.cond
            stack.append((e.f, gs + [negated[id(e)]], ls))
            stack.append((e.t, gs + [e.cond], ls))
            stack.append((e.cond, gs, ls))
        else:
            stack.extend((c, gs, ls) for c in reversed(e.children()))
    return out
