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

The rules of the intrinsic functions (``exp``, ``atan2``, ...) are part of their
records in :mod:`te_grad.ops`; the operators' rules are here.

Branches: a read inside a branch of ``if_then_else(c, t, f)`` happens only where
its branch is taken, so its adjoint, *every* partial along the way included, is
returned with the branch conditions as guards, and its contribution sums only over
the points where they hold. A partial that is infinite where the branch is not
taken (``sqrt`` at 0 under ``x > 0``, ``log`` under ``p > 0``) is never multiplied
by the zero of the other branch, so the gradient stays finite, as the function's
is; and an index valid only under the guard (a padded read) is never used outside it.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

from .. import dsl, dtypes, ops
from ..errors import InternalError
from ..ir import Binary, Call, Cast, Compare, Const, Expr, Read, Reduce, Select, Unary, Var
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
        partials = ops.intrinsic(n.name).partials(n.args, y)
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
    its contribution, exists only where they hold) and its adjoint there, in order
    of first visit (depth first, left to right); reads of the same element under
    the same guards are merged. The walk keeps an explicit stack (no recursion), so
    deep expressions are fine.
    """
    found: Dict[Tuple[Read, Tuple[Expr, ...]], Expr] = {}
    stack = [(expr, seed, ())]
    while stack:
        n, g, guards = stack.pop()
        if not _differentiable(n):
            continue
        if isinstance(n, Read):
            key = (n, guards)
            prev = found.get(key)
            found[key] = g if prev is None else add(prev, g)
            continue
        if isinstance(n, Select):
            # d select(c, t, f) = select(c, dt, 0) + select(c, 0, df)
            stack.append((n.f, g, guards + (dsl.logical_not(n.cond),)))
            stack.append((n.t, g, guards + (n.cond,)))
            continue
        y = top_value if (top_value is not None and n is expr) else n
        for child, child_adj in reversed(local_partials(n, g, y)):
            if isinstance(child_adj, Const) and child_adj.value == 0:
                continue
            stack.append((child, child_adj, guards))
    return [(read, guards, adj) for (read, guards), adj in found.items()]
