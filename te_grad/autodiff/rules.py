"""Derivative rules: one per operator and intrinsic, with its math beside it.

:func:`backprop` runs reverse mode over one scalar expression: given the
adjoint ``g`` of the whole expression it returns, for every tensor read in a
differentiable (float) position, the adjoint of that read. Reads of the same
element (structurally equal) are merged.

Conventions (the kinks):
- ``maximum(a, b)`` / ``minimum(a, b)`` at a tie ``a == b`` send half of the
  adjoint to each operand (as JAX and PyTorch do), so the rule is symmetric.
- ``abs`` at 0 has derivative 0 (the sign function, as JAX and PyTorch).
- ``floor``, ``ceil``, ``trunc``, ``round``, comparisons, conditions, casts
  to integers and all integer arithmetic have zero derivative.
Each rule receives the node ``n``, the node's adjoint ``g`` and ``y``, an
expression for the node's forward value (a read of the forward tensor when
the node is a whole compute body, so ``exp``, ``tanh``, ``sigmoid``, ``sqrt``
and ``/`` reuse the stored result instead of recomputing it).

Every derivative rule is here, keyed by the name of its record in :mod:`te_grad.ops`:
``BINARY_RULES`` (the operators), ``INTRINSIC_RULES`` (the functions ``exp``, ``atan2``,
...: ``(args, y) -> partials``, one per argument, ``None`` for an argument the function
does not depend on differentiably; a record without a rule has zero derivative:
``floor``, ``stop_gradient``) and ``REDUCTION_RULES`` (the seed of each reduction kind,
see :mod:`.vjp`). The completeness test (``tests/test_ops.py``) checks the tables
against the records.

Branches: a read inside a branch of ``if_then_else(c, t, f)`` happens only where
its branch is taken, so its adjoint, *every* partial along the way included, is
returned with the branch conditions as guards, and its contribution sums only over
the points where they hold. A partial that is infinite where the branch is not
taken (``sqrt`` at 0 under ``x > 0``, ``log`` under ``p > 0``) is never multiplied
by the zero of the other branch, so the gradient stays finite, as the function's
is; and an index valid only under the guard (a padded read) is never used outside it.
A node shared by paths with different guards is evaluated wherever any of them holds: a
context whose guards include another's merges into it, and the two branches of one select
into the context around them (:func:`_merge_contexts`); contexts that still differ on
data join into one guarded by their lazy disjunction (:func:`_join_contexts`). None of
these changes a point at which anything is evaluated.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Tuple

from .. import dsl, dtypes, ops
from ..errors import InternalError, UserError
from ..intervals import interval
from ..sizes import is_size_expr
from ..ir import (Binary, Call, Cast, Compare, ComputeOp, Const, Expr, Read, Reduce, ReduceAxis, Select, Tensor,
                  Unary, Var, distinct_nodes)
from ..transform import substitute
from .algebra import add, div, mul, neg, sub

Partials = List[Tuple[Expr, Expr]]


def _zero(n):
    return dsl.const(0, n.dtype)


def _tie_split(g, wins, ties):
    """``g`` where ``wins``, ``g / 2`` where ``ties``, else 0."""
    return dsl.if_then_else(wins, g, dsl.if_then_else(ties, mul(g, 0.5), _zero(g)))


BINARY_RULES: Dict[str, Callable[[Binary, Expr, Expr], Partials]] = {
    # d(a + b) = da + db
    "add": lambda n, g, y: [(n.a, g), (n.b, g)],
    # d(a - b) = da - db
    "sub": lambda n, g, y: [(n.a, g), (n.b, neg(g))],
    # d(a b) = b da + a db
    "mul": lambda n, g, y: [(n.a, mul(g, n.b)), (n.b, mul(g, n.a))],
    # d(a / b) = da / b - (a / b) / b db
    "div": lambda n, g, y: [(n.a, div(g, n.b)), (n.b, neg(div(mul(g, y), n.b)))],
    # d max(a, b) = [a > b] da + [b > a] db, ties split evenly
    "max": lambda n, g, y: [(n.a, _tie_split(g, n.a > n.b, n.a == n.b)),
                            (n.b, _tie_split(g, n.b > n.a, n.a == n.b))],
    # d min(a, b) = [a < b] da + [b < a] db, ties split evenly
    "min": lambda n, g, y: [(n.a, _tie_split(g, n.a < n.b, n.a == n.b)),
                            (n.b, _tie_split(g, n.b < n.a, n.a == n.b))],
    # d a^b = b a^(b-1) da + log(a) a^b db  (the db term only when b depends on a tensor)
    "pow": lambda n, g, y: _pow_rule(n, g, y),
}


def _pow_rule(n: Binary, g: Expr, y: Expr) -> Partials:
    b = n.b
    if isinstance(b, Const):
        if b.value == 0:
            return []
        if b.value == 1:
            return [(n.a, g)]
        da = mul(g, b.value * n.a) if b.value == 2 else mul(g, mul(b, dsl.pow(n.a, b.value - 1)))
        return [(n.a, da)]
    return [(n.a, mul(g, mul(b, dsl.pow(n.a, sub(b, 1))))), (b, mul(g, mul(dsl.log(n.a), y)))]


def _sign(x, y):
    return dsl.if_then_else(x > 0, 1.0, dsl.if_then_else(x < 0, -1.0, 0.0))


#: the derivative of each intrinsic (its ``math`` in :mod:`te_grad.ops` says it in words);
#: an intrinsic absent here has zero derivative everywhere it exists
INTRINSIC_RULES: Dict[str, Callable] = {
    "exp": lambda x, y: y,
    "log": lambda x, y: 1.0 / x,
    "sqrt": lambda x, y: 0.5 / y,
    "tanh": lambda x, y: 1.0 - y * y,
    "sigmoid": lambda x, y: y * (1.0 - y),
    "abs": _sign,
    "sin": lambda x, y: dsl.cos(x),
    "cos": lambda x, y: -dsl.sin(x),
    "erf": lambda x, y: (2.0 / math.sqrt(math.pi)) * dsl.exp(-(x * x)),
    "asin": lambda x, y: 1.0 / dsl.sqrt(1.0 - x * x),
    "acos": lambda x, y: -1.0 / dsl.sqrt(1.0 - x * x),
    "atan": lambda x, y: 1.0 / (1.0 + x * x),
    "atan2": lambda a, b, y: [b / (a * a + b * b), -a / (a * a + b * b)],
    "log1p": lambda x, y: 1.0 / (1.0 + x),
    "expm1": lambda x, y: y + 1.0,
}


def intrinsic_partials(name: str, args, y) -> list:
    """The partial derivative of intrinsic ``name`` with respect to each argument (``None``: zero)."""
    op = ops.intrinsic(name)
    rule = INTRINSIC_RULES.get(name)
    if rule is None:
        return [None] * op.arity
    out = rule(*args, y)
    out = list(out) if isinstance(out, (list, tuple)) else [out]
    if len(out) != op.arity:
        raise InternalError(f"the derivative rule of {name} gives {len(out)} partials for {op.arity} arguments")
    return out


def _differentiable(e: Expr) -> bool:
    return dtypes.is_float(e.dtype)


def local_partials(n: Expr, g: Expr, y: Expr) -> Partials:
    """The adjoints of ``n``'s operands, given the adjoint ``g`` of ``n``."""
    if isinstance(n, Binary):
        if n.op in ("and", "or") or not _differentiable(n):
            return []
        return BINARY_RULES[n.op](n, g, y)
    if isinstance(n, Unary):
        # d(-a) = -da ; logical not has none
        return [(n.a, neg(g))] if n.op == "neg" and _differentiable(n) else []
    if isinstance(n, Call):
        partials = intrinsic_partials(n.name, n.args, y)
        return [(a, mul(g, p)) for a, p in zip(n.args, partials) if p is not None]
    if isinstance(n, Select):
        # d select(c, t, f) = select(c, dt, 0) + select(c, 0, df); backprop keeps the
        # condition as a guard around everything below the branch (see the module doc)
        raise InternalError("if_then_else reached the local rules; backprop guards its branches")
    if isinstance(n, Cast):
        # a float-to-float cast passes the adjoint back in the operand's precision
        return [(n.a, dsl.cast(n.a.dtype, g))] if _differentiable(n) and _differentiable(n.a) else []
    if isinstance(n, (Const, Var, Compare)):
        return []
    if isinstance(n, Reduce):
        raise InternalError(f"reduction {n} reached the scalar rules; bodies must be normalized first")
    raise InternalError(f"no derivative rule for {type(n).__name__}")


def backprop(expr: Expr, seed: Expr, top_value: Expr = None) -> List[Tuple[Read, Tuple[Expr, ...], Expr]]:
    """Adjoints of the float reads in ``expr`` when ``expr`` has adjoint ``seed``.

    ``top_value`` (optional) stands for the value of ``expr`` itself in rules
    that reuse the forward result. Returns ``(read, guards, adjoint)``: the
    conditions of the ``if_then_else`` branches the read is under (the read, and so
    its contribution, exists only where they hold) and its adjoint there, in the
    order the reads are reached (parents first, left to right); reads of the same
    element under the same guards are merged.

    Reverse mode over the expression as a DAG: the nodes are taken in a topological
    order, parents first (the reverse of a post-order that visits children right to
    left, which for a tree is the depth-first, left-to-right order), so a node shared
    by several parents gets the sum of their contributions and passes it on once: the
    work and the size of the adjoints follow the DAG, not its tree (``e = f(e, e, e)``
    level after level has a tree of ``3 ** levels`` nodes). Explicit stacks (no
    recursion), so deep expressions are fine.

    A node reached along paths with different guards (its *contexts*) keeps one adjoint
    per context, except where contexts merge without changing where anything is
    evaluated (:func:`_merge_contexts`): a context whose guards include another's is
    folded into it, and the two branches of one ``if_then_else`` into the context around
    it; the contexts of an inner node that still differ, on guards that test data, join into
    one (:func:`_join_contexts`). A shared node under data-dependent branches would otherwise
    have contexts that multiply level after level. A read's contexts stay apart: each is a
    contribution of its own, whose guards on indices become its domain.
    """
    negation: Dict[int, Expr] = {}  # one logical_not per select: contexts compare by identity
    negated: Dict[int, Expr] = {}  # id(logical_not) -> the condition it negates

    def below(n: Expr, guards: tuple):
        if isinstance(n, Read) or not _differentiable(n):
            return []
        if isinstance(n, Select):
            # d select(c, t, f) = select(c, dt, 0) + select(c, 0, df)
            neg = negation.get(id(n))
            if neg is None:
                neg = negation[id(n)] = dsl.logical_not(n.cond)
                negated[id(neg)] = n.cond
            return [(n.t, guards + (n.cond,)), (n.f, guards + (neg,))]
        return [(c, guards) for c in n.children() if isinstance(c, Expr)]

    order = []  # post-order of the distinct nodes, children right to left
    walked = set()
    stack = [(expr, False)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if id(n) in walked:
            continue
        walked.add(id(n))
        stack.append((n, True))
        stack.extend((c, False) for c, _ in below(n, ()))
    # id(node) -> {guard ids: (guards, adjoint)}, in the order the contexts arrive
    contexts: Dict[int, Dict[tuple, Tuple[tuple, Expr]]] = {id(expr): {(): ((), seed)}}

    def give(n: Expr, guards: tuple, g: Expr):
        mine = contexts.setdefault(id(n), {})
        k = tuple(map(id, guards))
        prev = mine.get(k)
        mine[k] = (guards, g if prev is None else add(prev[1], g))

    tests_data: Dict[int, bool] = {}

    def on_data(guard: Expr) -> bool:
        k = id(guard)
        if k not in tests_data:
            tests_data[k] = any(isinstance(m, Read) for m in distinct_nodes(guard))
        return tests_data[k]

    found: Dict[Tuple[Read, Tuple[Expr, ...]], Expr] = {}
    for n in reversed(order):
        mine = contexts.pop(id(n), None)
        if not mine or not _differentiable(n):
            continue
        merged = _merge_contexts(list(mine.values()), negated)
        if len(merged) > 1 and not isinstance(n, Read) and any(on_data(c) for gs, _ in merged for c in gs):
            merged = [_join_contexts(merged)]
        for guards, g in merged:
            if isinstance(n, Read):
                k = (n, guards)
                prev = found.get(k)
                found[k] = g if prev is None else add(prev, g)
                continue
            if isinstance(n, Select):
                for c, cg in below(n, guards):
                    give(c, cg, g)
                continue
            y = top_value if (top_value is not None and n is expr) else n
            for child, child_adj in local_partials(n, g, y):
                if isinstance(child_adj, Const) and child_adj.value == 0:
                    continue
                give(child, guards, child_adj)
    if contexts:  # a contribution to a node the walk did not reach: never silently dropped
        raise InternalError(f"backprop left {len(contexts)} adjoint(s) undelivered in {expr}")
    return [(read, guards, adj) for (read, guards), adj in found.items()]


def _merge_contexts(ctx: List[Tuple[tuple, Expr]], negated: Dict[int, Expr]) -> List[Tuple[tuple, Expr]]:
    """The contexts ``(guards, adjoint)`` of one node, merged where that changes no point at
    which anything is evaluated, until none merges:

    - guards ``G`` and ``G' ⊇ G``: one context ``(G, g + if_then_else(G' - G, g', 0))``. The
      node is evaluated wherever ``G`` holds, and the partials below it, linear in the
      adjoint, give ``g p + (g' p where G')``, as the two contexts did (a partial that is
      infinite outside ``G'`` is multiplied there by ``g``, as before, never by a 0 of its own);
    - ``P + (c,)`` and ``P + (not c,)``, the two branches of one ``if_then_else``, the rest
      ``P`` in the same order on both (guards are tested in order, each only where those
      before it hold): ``(P, if_then_else(c, g1, g2))``, the node being evaluated on both
      sides of ``c``.

    A single context is returned as it is, so a tree's adjoints are unchanged."""
    if len(ctx) < 2:
        return ctx
    merged = True
    while merged and len(ctx) > 1:
        merged = False
        ids = [frozenset(map(id, guards)) for guards, _ in ctx]
        for a in range(len(ctx)):
            for b in range(len(ctx)):
                if a == b:
                    continue
                (ga, xa), (gb, xb) = ctx[a], ctx[b]
                if ids[a] <= ids[b]:  # b's guards include a's: b folds into a
                    extra = [c for c in gb if id(c) not in ids[a]]
                    ctx[a] = (ga, add(xa, dsl.if_then_else(dsl.all(*extra), xb, _zero(xb)) if extra else xb))
                elif len(ids[a]) == len(ids[b]) and len(ids[a] - ids[b]) == 1:
                    (ca,), (cb,) = ids[a] - ids[b], ids[b] - ids[a]
                    cond = next(c for c in ga if id(c) == ca)
                    rest = tuple(c for c in ga if id(c) != ca)
                    # the rest in the same order: a guard is evaluated only where those before
                    # it hold, so another order could test one where neither path does
                    if negated.get(cb) is not cond or \
                            tuple(map(id, rest)) != tuple(id(c) for c in gb if id(c) != cb):
                        continue
                    ctx[a] = (rest, dsl.if_then_else(cond, xa, xb))
                else:
                    continue
                del ctx[b]
                merged = True
                break
            if merged:
                break
    return ctx


def _join_contexts(ctx: List[Tuple[tuple, Expr]]) -> Tuple[tuple, Expr]:
    """Contexts ``(P + R_i, g_i)`` that :func:`_merge_contexts` left apart (``P`` their longest
    common prefix), joined into one: ``(P + (D,), sum_i if_then_else(all(R_i), g_i, 0))`` with
    ``D = any(all(R_1), all(R_2), ...)``. ``and``/``or`` and ``if_then_else`` evaluate their
    operands in order, each only where those before it decide nothing, so every guard is still
    tested only where the guards before it on its own path hold; the node's partials are
    evaluated where some ``P + R_i`` holds, as before; and the partials below it, linear in the
    adjoint, give ``sum_i (g_i p where R_i)``. Used where the guards test data (contexts under
    unrelated data-dependent branches would otherwise multiply level after level); contexts on
    indices alone stay apart, as affine domains of their own."""
    first = ctx[0][0]
    k = 0
    while k < len(first) and all(len(gs) > k and gs[k] is first[k] for gs, _ in ctx):
        k += 1
    rests = [dsl.all(*gs[k:]) for gs, _ in ctx]
    adjoint = None
    for rest, (_, g) in zip(rests, ctx):
        term = dsl.if_then_else(rest, g, _zero(g))
        adjoint = term if adjoint is None else add(adjoint, term)
    return first[:k] + (dsl.any(*rests),), adjoint


# ---------------------------------------------------------------------------------------------
# reductions: the seed ``dY[i]`` is scaled per reduction kind (see :mod:`.vjp`)
# ---------------------------------------------------------------------------------------------

def _sum_seed(y: Tensor, axes, red: Reduce, adj_read: Expr):
    # d sum_k f(i, k) = sum_k df(i, k)
    return adj_read, None


def _selection_seed(y: Tensor, axes, red: Reduce, adj_read: Expr):
    """d max_k f(i, k) = sum over the winners k of df(i, k) / (the number of winners)."""
    y_read = Read(y, tuple(axes))
    # adjoint split evenly among the elements equal to the result. The test is exact
    # equality, so both sides must come from one computation of the body: y itself when
    # its body is a plain read, else the result recomputed here from the body as the
    # gradient computes it (a nested reduction lifted, a product evaluated in another
    # stage may differ from the forward's in the last bit)
    if not (red is y.op.body and isinstance(red.body, Read)):
        again = Tensor(f"{y.name}_{red.combiner}", y.shape, y.dtype,
                       ComputeOp(axes, Reduce(red.combiner, red.body, red.axes, red.where)))
        y_read = Read(again, tuple(axes))
    is_winner = red.body == y_read
    where = is_winner if red.where is None else dsl.all(red.where, is_winner)
    ties = Tensor(f"{y.name}_ties", y.shape, y.dtype, ComputeOp(
        axes, dsl.sum(dsl.const(1.0, y.dtype), list(red.axes), where=where)))
    return adj_read / Read(ties, tuple(axes)), is_winner


def _prod_seed(y: Tensor, axes, red: Reduce, adj_read: Expr):
    """d prod_k f(i, k) = sum_k (prod over k' != k of f(i, k')) df(i, k)."""
    others, starts = _product_of_others(y, axes, red)
    index = tuple(axes) + tuple(k if not isinstance(lo, Expr) and lo == 0 else k - lo
                                for k, lo in zip(red.axes, starts))
    return adj_read * Read(others, index), None


def _index_seed(y: Tensor, axes, red: Reduce, adj_read: Expr):
    raise UserError(f"cannot differentiate {y.name} = {red.combiner}(...): its value is an integer index, "
                    f"piecewise constant in the values it compares (zero derivative); use it to index a "
                    f"float tensor, whose gradient flows through the read")


#: ``(y, axes, red, adj_read) -> (seed, extra where)`` per reduction kind
REDUCTION_RULES: Dict[str, Callable] = {
    "sum": _sum_seed,
    "prod": _prod_seed,
    "max": _selection_seed,
    "min": _selection_seed,
    "argmax": _index_seed,
    "argmin": _index_seed,
}


def _product_of_others(y: Tensor, axes, red: Reduce) -> Tuple[Tensor, list]:
    """``(others, starts)``: ``others[i, k - start] = prod over k' != k of f(i, k')`` (the where of
    ``red`` kept), each reduce axis ``k`` stored from its ``start`` (an int, or a size expression).

    ``k`` runs over the range its bounds cover anywhere in the output domain (bounds may
    depend on the output indices: a running product), or over its own bounds when they are
    size expressions (a product over a batch known at run time)."""
    ranges = {id(a): (0, n - 1) for a, n in zip(axes, y.shape)}
    spans = []
    for k in red.axes:
        lo, hi = interval(k.lo, ranges), interval(k.hi, ranges)
        if lo is not None and hi is not None:
            spans.append((lo[0], max(lo[0], hi[1])))
            ranges[id(k)] = (lo[0], max(lo[0], hi[1]) - 1)
        elif is_size_expr(k.lo) and is_size_expr(k.hi):
            spans.append((k.lo, dsl.maximum(k.lo, k.hi)))
        else:
            raise UserError(f"cannot differentiate the product reduction of {y.name}: the bounds of "
                            f"axis {k.name} ({k.lo}, {k.hi}) are not affine in its output indices")
    own = [Var(ax.name) for ax in axes]
    at = [Var(k.name) for k in red.axes]
    mapping: Dict[Var, Expr] = dict(zip(axes, own))
    other = []
    for k in red.axes:
        new = ReduceAxis(k.name + "_", k.dtype, substitute(k.lo, mapping), substitute(k.hi, mapping))
        mapping[k] = new
        other.append(new)
    body = substitute(red.body, mapping)
    differs = dsl.any([o != a + lo for o, a, (lo, _) in zip(other, at, spans)])
    where = differs if red.where is None else dsl.all(substitute(red.where, mapping), differs)
    shape = y.shape + tuple(hi - lo for lo, hi in spans)
    return Tensor(f"{y.name}_others", shape, y.dtype,
                  ComputeOp(tuple(own + at), dsl.prod(body, other, where=where))), [lo for lo, _ in spans]


