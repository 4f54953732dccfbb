"""Select ranges: an element-wise nest cut where its guards on one output loop change value.

The gradient of a tensor read in blocks along an axis (``torch.chunk``, ``split``, the q, k
and v of one attention projection), and ``concat`` itself, is a sum or a chain of selects on
ranges of that axis: ``dX[s, b, j] = if(j >= 256, dV[b, j // 32 - 8, s, j % 32], 0) + if(128 <=
j < 256, dK[...], 0) + if(j < 128, dQ[b, j // 32, s, j % 32], 0)``. Evaluated over the whole
axis, every branch is read in every lane (the reads are safe, so the selects are branch-free)
and, through ``// 32`` and ``% 32``, every lane of a vector is a gather.

:func:`split_select_ranges` cuts the initialization nest's loop over such an axis ``j`` at the
constants its comparisons switch at: on each piece ``[a, b)`` every comparison of ``j`` with a
constant has one value, and the selects fold (``if(true, x, y)`` is ``x``). When the piece's
value still divides ``j`` by one constant ``c``, and ``c`` divides ``a`` and ``b``, the piece's
loop is written ``j = c q + r`` (``q`` in ``[a / c, b / c)``, ``r`` in ``[0, c)``) and the
indices normalized over those ranges (:func:`simplify.linear.normalize`): ``j // 32 - 8`` is
``q - 8`` and ``j % 32`` is ``r``, unit-stride reads along the new innermost loop.

Only selects whose condition is quasi-affine (what the static bounds proof,
:mod:`simplify.bounds`, decides exactly) are folded, and only indices are normalized: a select
on data, or on a condition the proof could not use, stays a select, so a read it guards stays
under a guard the emitter checks it under; integer arithmetic on data keeps its wrap-around.

Promises: the pieces cover the loop's range exactly once, in order; each piece stores, at each
of its points, the value the nest stored there (a quasi-affine select condition is replaced by
its value over the whole piece; ``j`` by ``c q + r``, which takes each value of the piece once;
a normalized index is equal at every point of the ranges). The loop split among threads is
never cut, and every piece keeps the other loops as they were (the parallel one marked).
"""
from __future__ import annotations

from dataclasses import replace
from typing import List, Optional

from simplify.affine import decided
from simplify.linear import coefficient, normalize
from te_grad import dsl
from te_grad.ir import Binary, Compare, Const, Expr, Read, ReduceAxis, Select, Var, distinct_nodes
from te_grad.transform import substitute
from te_grad.visitor import Mutator

from .loopir import If, Nest, Stage, nest, rewrite_nests

#: the most pieces a loop is cut into
MAX_PIECES = 16
#: a divisor ``c`` of the strip-mined loop: at least this (smaller ones are the congruence
#: classes' :mod:`.congruence`), at most :data:`MAX_DIVISOR`
MIN_DIVISOR, MAX_DIVISOR = 8, 1024

_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


def _against_constant(c: Compare, var: Var):
    """``(op, k)`` when ``c`` compares ``var`` with an int constant (``var op k``), else None."""
    a, b, op = c.a, c.b, c.op
    if isinstance(a, Const) and b is var:
        a, b, op = b, a, _FLIP.get(op)
    if a is var and isinstance(b, Const) and isinstance(b.value, int) and not isinstance(b.value, bool) \
            and op in _FLIP:
        return op, int(b.value)
    return None


def _decided_conditions(exprs) -> List[Expr]:
    return [node.cond for e in exprs for node in distinct_nodes(e) if isinstance(node, Select) and decided(node.cond)]


def _cuts(conditions: List[Expr], var: Var, lo: int, hi: int) -> List[int]:
    """The points strictly inside ``(lo, hi)`` where a comparison of ``var`` with a constant in
    one of the quasi-affine select ``conditions`` changes value."""
    cuts = set()
    for e in conditions:
        for node in distinct_nodes(e):
            got = _against_constant(node, var) if isinstance(node, Compare) else None
            if got is None:
                continue
            op, k = got
            cuts.update({"lt": (k,), "ge": (k,), "le": (k + 1,), "gt": (k + 1,),
                         "eq": (k, k + 1), "ne": (k, k + 1)}[op])
    return sorted(c for c in cuts if lo < c < hi)


class _Decide(Mutator):
    """Comparisons of ``var`` with constants replaced by their value on ``[a, b)``."""

    def __init__(self, var: Var, a: int, b: int):
        super().__init__()
        self.var, self.a, self.b = var, a, b

    def visit_Compare(self, node: Compare):
        node = self.generic_visit(node)
        got = _against_constant(node, self.var) if isinstance(node, Compare) else None
        if got is None:
            return node
        op, k = got
        lo, hi = self.a, self.b - 1
        truth = {"lt": (hi < k, lo >= k), "le": (hi <= k, lo > k), "gt": (lo > k, hi <= k),
                 "ge": (lo >= k, hi < k), "eq": (lo == hi == k, k < lo or k > hi),
                 "ne": (k < lo or k > hi, lo == hi == k)}[op]
        if truth[0]:
            return dsl.const(True)
        if truth[1]:
            return dsl.const(False)
        return node


class _Fold(Mutator):
    """Quasi-affine selects whose condition ``decide`` folds to a constant replaced by their
    branch; every read's indices normalized over ``ranges``. Nothing else changes."""

    def __init__(self, decide: Optional[_Decide], ranges):
        super().__init__()
        self.decide, self.ranges = decide, ranges

    def visit_Select(self, node: Select):
        if self.decide is not None and decided(node.cond):
            c = normalize(self.decide.visit(node.cond))
            if isinstance(c, Const):
                return self.visit(node.t if c.value else node.f)
        return self.generic_visit(node)

    def visit_Read(self, node: Read):
        node = self.generic_visit(node)
        return Read(node.tensor, tuple(normalize(i, self.ranges) for i in node.indices))


def _divisors(exprs, var: Var) -> set:
    """The constants ``var`` is divided by (``//`` and ``%``) in ``exprs``, with coefficient 1."""
    found = set()
    for e in exprs:
        for node in distinct_nodes(e):
            if isinstance(node, Binary) and node.op in ("floordiv", "floormod") and isinstance(node.b, Const) \
                    and coefficient(node.a, var) == 1:
                found.add(int(node.b.value))
    return found


def _exprs(n: Nest) -> List[Expr]:
    return [n.store.value, *n.store.indices] + ([n.cond] if n.cond is not None else [])


def _piece(n: Nest, k: int, a: int, b: int) -> List:
    """The nest on ``loops[k].var`` in ``[a, b)``, its comparisons decided, strip-mined by the
    one constant it still divides the variable by when that constant divides ``a`` and ``b``."""
    var = n.loops[k].var
    decide = _Decide(var, a, b)
    ranges = {id(lp.var): (int(lp.lo.value), int(lp.hi.value) - 1) for lp in n.loops
              if isinstance(lp.lo, Const) and isinstance(lp.hi, Const)}
    ranges[id(var)] = (a, b - 1)

    fold = _Fold(decide, ranges)
    store = replace(n.store, value=fold.visit(n.store.value),
                    indices=tuple(normalize(i, ranges) for i in n.store.indices))
    cond = n.cond
    if cond is not None and decided(cond):
        cond = normalize(decide.visit(cond), ranges)
    if isinstance(cond, Const):
        if not cond.value:
            return []
        cond = None
    bounds = dict(n.bounds)
    bounds[id(var)] = (dsl.const(a), dsl.const(b))
    order = list(n.order)
    divs = _divisors([store.value, *store.indices] + ([cond] if cond is not None else []), var)
    if len(divs) == 1:
        c = next(iter(divs))
        if MIN_DIVISOR <= c <= MAX_DIVISOR and a % c == 0 and b % c == 0 and b - a >= c:
            q, r = Var(var.name + "q"), Var(var.name + "r")
            split_ranges = dict(ranges)
            del split_ranges[id(var)]
            split_ranges[id(q)], split_ranges[id(r)] = (a // c, b // c - 1), (0, c - 1)
            at = {var: dsl.const(c) * q + r}

            reads = _Fold(None, split_ranges)
            store = replace(store, value=reads.visit(substitute(store.value, at)),
                            indices=tuple(normalize(substitute(i, at), split_ranges) for i in store.indices))
            cond = reads.visit(substitute(cond, at)) if cond is not None else None
            bounds[id(q)], bounds[id(r)] = (dsl.const(a // c), dsl.const(b // c)), (dsl.const(0), dsl.const(c))
            order = order[:k] + [q, r] + order[k + 1:]
    return nest(order, bounds, [store] if cond is None else [If(cond, (store,))], n.parallel)


def split_select_ranges(stage: Stage) -> Stage:
    """The initialization nest cut into pieces along the innermost output loop whose
    comparisons with constants switch inside its range (see the module docstring)."""
    done = []

    def cut(n: Nest) -> Optional[List]:
        if done or n.accumulates or n.reductions or not n.loops:
            return None
        done.append(True)
        conditions = _decided_conditions(_exprs(n))
        for k in range(len(n.loops) - 1, -1, -1):
            lp = n.loops[k]
            if lp.parallel or isinstance(lp.var, ReduceAxis) or not isinstance(lp.lo, Const) \
                    or not isinstance(lp.hi, Const):
                continue
            lo, hi = int(lp.lo.value), int(lp.hi.value)
            points = _cuts(conditions, lp.var, lo, hi)
            if not points or len(points) + 1 > MAX_PIECES:
                continue
            edges = [lo] + points + [hi]
            out: List = []
            for a, b in zip(edges, edges[1:]):
                out.extend(_piece(n, k, a, b))
            return out
        return None
    return rewrite_nests(stage, cut)
