"""Bring compute bodies to the form the VJP works on: at most one reduction, at the top.

``Y[i] = exp(sum(X[i, k] for k ...))`` becomes ``Y[i] = exp(Y_sum[i])`` with a
new tensor ``Y_sum[i] = sum(X[i, k] for k ...)``. A lifted reduction keeps only
the variables it uses (a row sum is computed once per row), and a reduction
nested inside another reduction's body becomes a tensor over the enclosing
reduce axes it uses: over their bounds, or the hull of their bounds where these
vary (filtered back to them where the reduction cannot be evaluated on the hull).

With ``max_depth``, sub-expressions are lifted the same way so that no piece is
deeper than that: the adjoint of a read at the bottom of a chain of ``n``
multiplications is a product of ``n - 1`` factors, so differentiating one deep
body would build ``n^2`` nodes; through pieces of depth ``d`` it builds about
``n d``, and the pieces' adjoints are tensors computed once.

A lifted tensor is computed at every point of its domain, also where the body
would not have evaluated it: under the untaken branch of an ``if_then_else``,
the right operand of ``and`` / ``or`` whose left one decides, or a point a
``where`` filters out. When the lifted expression cannot be evaluated
everywhere (a read that may leave its tensor there, a data-dependent index, a
division by a variable), it keeps the conditions under which the body reached
it, as a filter: ``Y[j] = if_then_else(j <= 2, exp(sum(X[2 - j, k] ...)), 0)``
lifts to ``Y_sum[j] = sum(X[2 - j, k] ... if j <= 2)``, never reading
``X[-1, k]``; such a piece of a deep body is not lifted.

The filter is the disjunction, over the paths that reach the expression, of the conditions
on each path (:func:`guard_paths`), with two widenings, both supersets of the points where
the body evaluates it: an expression reached by more than :data:`MAX_PATHS` paths is taken
as reached by conditions they all share, and a condition that contains the expression
itself (``if_then_else(D[i] != 0, if_then_else(r > 0, r, -r), 0)`` for a reduction ``r``
dividing by ``D[i]``), or a reduction whose filter is being built, is left out of the paths
that pass it (the test is evaluated, so ``r`` too, wherever ``D[i] != 0``: there the filter
is unchanged). A condition stays in a widened path only where it is still evaluated under
the conditions that held before it in the body, or may be evaluated anywhere. The widened
filter can let the lifted tensor run where its body fails (a division by zero there): the
build then raises that error, it never computes a wrong value.
"""
import numbers
from typing import Dict, List, Tuple

from . import dsl, dtypes
from .errors import InternalError, UserError
from .graph import free_vars, reductions_in
from .sizes import is_size_expr
from .intervals import interval, speculatable
from .deep import run_deep
from .ir import Binary, ComputeOp, Const, Expr, Read, Reduce, ReduceAxis, Select, Tensor, Var, distinct_nodes
from .transform import substitute
from .visitor import Mutator

#: a path's guards: (id of a condition, the value it has on the path), outermost first
Path = Tuple[Tuple[int, bool], ...]
#: distinct paths kept per node before it is taken as reached unguarded (see guard_paths)
MAX_PATHS = 32
#: how many wider paths a node may have (each narrower than the last) before it is taken as
#: reached unguarded
MAX_WIDENINGS = 6


def guard_paths(top: Expr, safe=None) -> Tuple[Dict[int, List[Path]], Dict[int, Expr], set]:
    """For every node below ``top``, the guards of each path by which evaluation reaches it
    (``if_then_else`` branches, the right operand of ``and`` / ``or``, a reduction's body
    under its ``where``), the conditions by id, and the ids of the nodes taken as reached by
    wider paths than their own. A node reached by a path without guards is evaluated wherever
    ``top`` is. One reached by more than :data:`MAX_PATHS` paths is taken as reached by one
    wider path (:func:`_shared_guards`: guards that all its paths share, each safe to evaluate
    where the ones before it hold, ``safe(condition)`` telling which conditions may be
    evaluated anywhere), and once that path has narrowed :data:`MAX_WIDENINGS` times, by none:
    a superset of where it is evaluated, so that a DAG costs a bounded number of paths per
    node, not one per path of its tree; the nodes below it are reached through that path.
    Such a node is marked approximate unless a real unguarded path reaches it as well."""
    paths: Dict[int, List[Path]] = {}
    conds: Dict[int, Expr] = {}
    approximate: set = set()
    seen = set()
    widened: Dict[int, Path] = {}  # node -> the guards all its paths share, once it has too many
    widenings: Dict[int, int] = {}  # node -> how many wider paths it has had
    stack = [(top, (), False)]
    while stack:
        node, path, approx = stack.pop()
        if (id(node), path, approx) in seen:
            continue
        mine = paths.setdefault(id(node), [])
        if mine and mine[-1] == () and path:
            continue  # reached unguarded already: a guarded path adds nothing below it either
        if path and (id(node) in widened or len(mine) >= MAX_PATHS):
            # a DAG whose shared nodes sit under many selections has exponentially many
            # paths: this node (and so everything below it) is taken as reached by the guards
            # its paths share, a superset of its paths (they shrink as more paths come in)
            shared = _shared_guards([widened[id(node)], path] if id(node) in widened else mine + [path],
                                    conds, safe)
            if widened.get(id(node)) == shared:
                continue  # nothing new: gone below already
            widenings[id(node)] = widenings.get(id(node), 0) + 1
            if widenings[id(node)] > MAX_WIDENINGS:
                shared = ()
            path, approx = shared, True
            widened[id(node)] = shared
            mine[:] = [shared]
        if approx and (id(node), (), False) in seen or (id(node), path, approx) in seen:
            continue  # reached unguarded for real already, or this way already
        seen.add((id(node), path, approx))
        if approx:
            approximate.add(id(node))
        if path == ():
            mine[:] = [()]
            if not approx:
                approximate.discard(id(node))
        elif id(node) not in widened or mine != [path]:
            mine.append(path)
        if isinstance(node, Select):
            conds[id(node.cond)] = node.cond
            stack += [(node.cond, path, approx), (node.t, path + ((id(node.cond), True),), approx),
                      (node.f, path + ((id(node.cond), False),), approx)]
        elif isinstance(node, Binary) and node.op in ("and", "or"):
            conds[id(node.a)] = node.a
            stack += [(node.a, path, approx), (node.b, path + ((id(node.a), node.op == "and"),), approx)]
        elif isinstance(node, Reduce):
            inner = path
            if node.where is not None:
                conds[id(node.where)] = node.where
                stack.append((node.where, path, approx))
                inner = path + ((id(node.where), True),)
            stack.append((node.body, inner, approx))
            stack += [(b, path, approx) for ax in node.axes for b in (ax.lo, ax.hi)]
        else:
            stack += [(c, path, approx) for c in node.children()]
    return paths, conds, approximate


def _shared_guards(paths: List[Path], conds: Dict[int, Expr], safe) -> Path:
    """Guards that every one of ``paths`` has, in the order of the first: its guards up to the
    first one another path lacks (evaluated where the ones before them hold, as in the
    body), then the shared ones that ``safe`` says may be evaluated anywhere."""
    rest = [set(p) for p in paths[1:]]
    kept, prefix = [], True
    for g in paths[0]:
        if all(g in r for r in rest):
            if prefix or (safe is not None and safe(conds[g[0]])):
                kept.append(g)
        else:
            prefix = False
    return tuple(kept)


class _Lifter(Mutator):
    def __init__(self, tensor: Tensor, max_depth: int = None):
        super().__init__()
        self.tensor = tensor
        self.top = tensor.op.body
        self.lifted: List[Tensor] = []
        self.max_depth = max_depth
        self._pieces_decided = set()  # ids of the nodes whose lifting as a piece is decided
        self._guarding = set()  # ids of the nodes whose guard is being built
        self._inside: Dict[int, set] = {}  # id of a condition -> ids of the nodes in it
        self._safe: Dict[int, bool] = {}  # id of a condition -> whether it may be evaluated anywhere
        self.paths, self.conds, self.approximate = guard_paths(self.top, self._safe_condition)

    def visit_Reduce(self, node: Reduce):
        return self._lift(node, super().visit_Reduce(node), node.combiner)

    def forget(self):
        super().forget()
        self._pieces_decided.clear()  # the nodes are built again, and their pieces decided again

    def visit(self, node):
        out = super().visit(node)
        if self.max_depth is None or id(node) in self._pieces_decided:
            return out
        # decided once per node: the guard of a piece visits conditions, which may reach back
        # into nodes whose visit is under way; deciding again at each return would never end
        self._pieces_decided.add(id(node))
        if (out is not self.top and isinstance(out, Expr) and out.depth >= self.max_depth
                and self._liftable(out) and self._guard(node, out) is None  # a guarded piece stays
                # taken as unguarded only by approximation: lifted only if it may run everywhere
                and (id(node) not in self.approximate or self._evaluable_everywhere(out))):
            out = self._lift(node, out, "part")
            self._memo[id(node)] = (node, out)
        return out

    def _liftable(self, e: Expr) -> bool:
        """A float expression of the output indices only (a piece over reduce axes would be
        a tensor as large as the reduction's domain)."""
        if isinstance(e, (Var, Const, Read)) or not dtypes.is_float(e.dtype):
            return False
        return not any(isinstance(v, ReduceAxis) for v in free_vars(e))

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

    def _guard(self, original: Expr, red: Expr):
        """The condition under which the body evaluates ``original`` (now ``red``), when the
        lifted tensor needs it: ``red`` is guarded on every path and cannot be evaluated at
        every point of its domain. None otherwise."""
        paths = self.paths.get(id(original), [()])
        if not all(paths):
            return None
        if self._evaluable_everywhere(red):
            return None

        paths = self._own_paths(original, paths)
        if not all(paths):
            return None
        if id(original) in self._guarding:
            raise InternalError(f"lifting {self.tensor.name}: a guard reached back to its own reduction")
        self._guarding.add(id(original))

        def condition(cid, value):
            c = self.visit(self.conds[cid])
            return c if value else dsl.logical_not(c)
        try:
            return dsl.any(*[dsl.all(*[condition(cid, value) for cid, value in path]) for path in paths])
        finally:
            self._guarding.discard(id(original))

    def _own_paths(self, original: Expr, paths: List[Path]) -> List[Path]:
        """``paths`` without the conditions that contain ``original`` or a node whose guard is
        being built (whose guard would then need this one), and without a path that extends
        another (the other holds wherever it does). Dropping a condition widens a path: the
        lifted tensor is computed at more points, never fewer. A later condition on the path
        may have been safe to evaluate only where the dropped one held: after a drop, a path
        keeps only the conditions that may be evaluated anywhere and ends at the first other
        one. A test of ``original`` itself (``if_then_else(D != 0, if_then_else(r > 0, r,
        -r), 0)``) is evaluated on a path of its own without the test (``D != 0``), which
        absorbs the widened one, so the guard is unchanged there; two reductions each guarded
        by a test of the other: the one whose guard is built second is computed wherever the
        guards before that test hold."""
        kept = []
        for path in paths:
            own, dropped = [], False
            for cid, value in path:
                inside = self._inside.get(cid)
                if inside is None:
                    inside = self._inside[cid] = {id(n) for n in distinct_nodes(self.conds[cid])}
                if id(original) in inside or not self._guarding.isdisjoint(inside):
                    dropped = True
                elif not dropped or self._safe_condition(self.conds[cid]):
                    own.append((cid, value))
                else:
                    break
            kept.append(tuple(own))
        kept = list(dict.fromkeys(kept))
        return [p for p in kept if not any(len(q) < len(p) and p[:len(q)] == q for q in kept)]

    def _safe_condition(self, cond: Expr) -> bool:
        """Whether ``cond`` may be evaluated at every point of the body's domain (memoized)."""
        got = self._safe.get(id(cond))
        if got is None:
            got = self._safe[id(cond)] = self._evaluable_everywhere(cond)
        return got

    def _lift(self, original: Expr, red: Expr, suffix: str) -> Expr:
        op: ComputeOp = self.tensor.op
        guard = self._guard(original, red) if isinstance(red, Reduce) else None
        if guard is not None:  # the guard filters the reduction (its value there is never read)
            red = Reduce(red.combiner, red.body, red.axes,
                         guard if red.where is None else dsl.all(guard, red.where))
        if isinstance(red, Reduce):
            bounds = self._bounds_to_keep(red)
            if bounds:  # enclosing axes with varying bounds: filtered to their own range
                red = Reduce(red.combiner, red.body, red.axes,
                             dsl.all(*bounds) if red.where is None else dsl.all(*bounds, red.where))
        used = free_vars(red)
        dims, shape, index = [], [], []
        for d, ax in enumerate(op.axes):
            if any(v is ax for v in used):
                dims.append(ax)
                shape.append(self.tensor.shape[d])
                index.append(ax)
        starts = {}
        for v in used:
            if isinstance(v, ReduceAxis):
                lo, hi = self._span(v, red)
                dims.append(v)
                shape.append(hi if _is_zero(lo) else hi - lo)
                index.append(v if _is_zero(lo) else v - lo)
                starts[id(v)] = lo
        name = f"{self.tensor.name}_{suffix}"
        new_axes = [Var(v.name) for v in dims]
        mapping = {}
        for v, nv in zip(dims, new_axes):
            mapping[v] = nv if _is_zero(starts.get(id(v), 0)) else nv + starts[id(v)]
        body = substitute(red, mapping)
        lifted = Tensor(name, tuple(shape), body.dtype, ComputeOp(tuple(new_axes), body))
        self.lifted.append(lifted)
        return Read(lifted, tuple(dsl.cast("int64", i) for i in index))


    def _bounds_to_keep(self, red: Reduce) -> List[Expr]:
        """``lo <= v < hi`` for each enclosing reduce axis ``v`` of ``red`` whose bounds vary,
        when ``red`` cannot be evaluated on the whole hull of ``v``'s values (the lifted
        tensor spans the hull: see :meth:`_span`)."""
        varying = [v for v in free_vars(red) if isinstance(v, ReduceAxis)
                   and not (isinstance(v.lo, Const) and isinstance(v.hi, Const))]
        if not varying:
            return []
        if self._evaluable_everywhere(red):
            return []
        return [c for v in varying for c in (v >= v.lo, v < v.hi)]

    def _evaluable_everywhere(self, red: Expr) -> bool:
        """True if ``red`` can be evaluated at every point of the domain its lifted tensor
        spans (reads provably in bounds, no division by a variable)."""
        inner = [a for r, _, _ in reductions_in(red) for a in r.axes]
        return speculatable(red, self._hulls(list(free_vars(red)) + inner))

    def _span(self, v: ReduceAxis, red: Expr) -> Tuple[int, int]:
        """``[lo, hi)`` covering every value of enclosing reduce axis ``v``: its bounds when
        constant, else their hull over the domain (where ``red`` cannot be evaluated on all
        of it, :meth:`_bounds_to_keep` has filtered it to ``v``'s own bounds)."""
        if isinstance(v.lo, Const) and isinstance(v.hi, Const):
            return v.lo.value, v.hi.value
        if is_size_expr(v.lo) and is_size_expr(v.hi):  # sizes known at run time (tg.var): the span is symbolic
            return tuple(b.value if isinstance(b, Const) else b for b in (v.lo, v.hi))
        span = self._hulls([v] + list(free_vars(red))).get(id(v))
        if span is None:
            raise UserError(f"cannot differentiate {self.tensor.name}: the reduction {red} is nested "
                            f"in a reduction over {v.name}, whose bounds have no known range")
        return span[0], span[1] + 1

    def _hulls(self, variables) -> dict:
        """Inclusive ranges of the given variables (output axes: the tensor's shape; reduce
        axes: the hull of their bounds), for those whose range is known."""
        ranges = {id(a): (0, n - 1) for a, n in zip(self.tensor.op.axes, self.tensor.shape)}
        pending = [v for v in variables if isinstance(v, ReduceAxis)]
        for _ in range(len(pending) + 1):  # bounds use axes that are resolved in earlier rounds
            rest = []
            for v in pending:
                if id(v) in ranges:
                    continue
                lo, hi = interval(v.lo, ranges), interval(v.hi, ranges)
                if lo is None or hi is None:
                    rest.append(v)
                elif hi[1] > lo[0]:
                    ranges[id(v)] = (lo[0], hi[1] - 1)
            pending = rest
        return ranges


def _is_zero(b) -> bool:
    """Whether a bound (an int or a size expression) is the int 0."""
    return isinstance(b, numbers.Integral) and b == 0


#: bodies deeper than this are cut into pieces when a piece depth is asked for
DEEP_BODY = 64


def normalized_body(tensor: Tensor, max_depth: int = None) -> Tuple[Expr, List[Tensor]]:
    """The body of ``tensor`` with nested reductions lifted (and, when the body is deeper than
    :data:`DEEP_BODY`, sub-expressions of depth ``max_depth``: see the module docstring), and
    the lifted tensors (producers first)."""
    if max_depth is not None and tensor.op.body.depth <= DEEP_BODY:
        max_depth = None
    lifter = _Lifter(tensor, max_depth)
    if max_depth is None:
        body = lifter.run()
    else:
        # a piece's guard visits conditions from inside the walk, so the walk's stack is bounded
        # by the number of distinct nodes (each on it at most once: the memo), not the depth
        body = run_deep(sum(1 for _ in distinct_nodes(tensor.op.body)), lifter.run)
    return body, lifter.lifted
