"""Guard ranges: a guard that bounds one output loop by constants narrows that loop instead.

A reduction term whose guard includes ``j == 63`` or ``j >= 1`` (the clamped tap of a
resize gradient, the border terms of a stencil) would otherwise run its whole output
domain and test the guard at every point, and the loop order and register blocks would
be chosen for a domain most of which does nothing (a one-row term blocked along a
64-wide axis). :func:`narrow_guarded_loops` moves each such conjunct of a guarded nest's
guard (an accumulating nest's, or the initialization nest's of a tensor written only on
its region, :mod:`simplify.unread`) into the bounds of its output loop, after the pieces are cut
(:mod:`.pieces`), so each piece is narrowed to where the term contributes; a nest whose
range becomes empty is dropped.

Promises: the nest visits exactly the points where the conjuncts moved hold, and tests
the others as before, so each element receives the same terms (is stored the same value).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, Optional, Tuple

from simplify.affine import conjuncts
from te_grad import dsl
from te_grad.ir import Compare, Const, Expr, ReduceAxis, Var

from .loopir import Loop, Nest, Stage, rewrite_nests

_FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq"}


def _bound(c: Expr, loops: Dict[int, Loop]) -> Optional[Tuple[int, str, int]]:
    """``(id(var), op, k)`` when ``c`` compares an output loop's variable with a constant."""
    if not isinstance(c, Compare) or c.op not in _FLIPPED:
        return None
    a, b, op = c.a, c.b, c.op
    if isinstance(a, Const) and isinstance(b, Var):
        a, b, op = b, a, _FLIPPED[op]
    if isinstance(a, Var) and id(a) in loops and isinstance(b, Const) and isinstance(b.value, int):
        return id(a), op, int(b.value)
    return None


def narrow_guarded_loops(stage: Stage) -> Stage:
    """Each guarded nest with its guard's constant bounds on output loops moved into
    their ranges (see the module docstring)."""
    def narrow(n: Nest):
        if n.cond is None:
            return None
        outs = {id(lp.var): lp for lp in n.loops if not isinstance(lp.var, ReduceAxis)
                and isinstance(lp.lo, Const) and isinstance(lp.hi, Const)}
        ranges = {k: (int(lp.lo.value), int(lp.hi.value)) for k, lp in outs.items()}
        rest, every = [], conjuncts(n.cond)
        for c in every:
            b = _bound(c, outs)
            if b is None:
                rest.append(c)
                continue
            var, op, k = b
            lo, hi = ranges[var]
            lo = max(lo, k) if op in ("eq", "ge") else max(lo, k + 1) if op == "gt" else lo
            hi = min(hi, k + 1) if op in ("eq", "le") else min(hi, k) if op == "lt" else hi
            ranges[var] = (lo, hi)
        if len(rest) == len(every):
            return None
        if any(lo >= hi for lo, hi in ranges.values()):
            return []  # the guard holds nowhere in this piece
        loops = tuple(replace(lp, lo=dsl.const(ranges[id(lp.var)][0]), hi=dsl.const(ranges[id(lp.var)][1]))
                      if id(lp.var) in ranges else lp for lp in n.loops)
        return [Nest(loops, dsl.all(rest) if rest else None, n.store).stmt(parallel=n.parallel)]
    return rewrite_nests(stage, narrow)
