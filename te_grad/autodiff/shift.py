"""Cancelled shifts: tensors whose adjoint is identically zero, found before the VJP runs.

A softmax written by hand with the max shift,

    m[i] = max_k x[i, k];  e[i, j] = exp(x[i, j] - m[i]);  s[i] = sum_j e[i, j];  y[i, j] = e[i, j] / s[i]

does not depend on ``m``: adding ``c[i]`` to ``m[i]`` scales ``e[i, :]`` and ``s[i]`` by the same
``exp(-c[i])``, which cancels in the ratio (likewise ``x - m - log(s)`` and ``m + log(s)``). So
the adjoint of ``m`` is exactly zero, but the plain VJP computes it as the sum of contributions
that cancel only numerically, and then differentiates the max (a tie count, a pass over the
winners). :func:`cancelled_shifts` proves that cancellation and :func:`te_grad.autodiff.differentiate`
then passes nothing to such a tensor, as if every read of it were ``stop_gradient``.

The proof is a forward-mode (tangent) analysis, not a match on names or shapes. Perturb a
candidate tensor ``m`` by ``dm[r] = c[r]`` (``c`` arbitrary) and classify the tangent ``dT`` of
every expression and tensor downstream, as the VJP linearizes it (the rules of
:mod:`.rules`: ``stop_gradient``, conditions, comparisons and integer expressions have zero
derivative, ties of ``max`` split evenly), into one of

- ``Z``: ``dT = 0``;
- ``A(k, p)``: ``dT = k c[p]`` (an additive shift; ``p`` the index of ``m`` it follows);
- ``M(k, p)``: ``dT = k c[p] T`` (a multiplicative one: ``T`` scales by ``exp(k c[p])``);
- unknown (anything else).

with ``k`` an exact rational and ``p`` a tuple of index expressions in the variables of the
expression's scope (two classes combine only when their ``p`` are structurally equal). The
rules are identities of the linearization:

    read m[g]           A(1, g)                 read T[g]        T's class, p with T's axes := g
    A(a) + A(b)         A(a + b)                A(a) + Z         A(a)            (likewise -)
    M(a) + M(a)         M(a)                    -A(a), -M(a)     A(-a), M(a)
    M(a) * M(b)         M(a + b)                M(a) * Z         M(a)
    M(a) / M(b)         M(a - b)                Z / M(b)         M(-b)
    A(a) * const q      A(q a)                  A(a) / const q   A(a / q)
    exp(A(k))           M(k)                    log(M(k))        A(k)
    sqrt(M(k))          M(k / 2)                M(k) ** q        M(q k)
    select(cond, t, f), max(t, f), min(t, f) with t, f of one class: that class
    sum_R of M(k, p)    M(k, p)     max_R / min_R of A or M:     the same class
                                    (``p`` free of the reduced axes ``R``: the tangent is
                                    the same at every point reduced, so it factors out)

and a class whose ``k`` is 0 is ``Z``. Every other combination is unknown. If every output
of the differentiation is ``Z`` for ``m`` then the linear map ``c -> d(outputs)`` the VJP
transposes is zero, so the adjoint the VJP would give ``m`` is exactly zero (in exact
arithmetic; in floating point it is rounding noise, or NaN where the forward overflowed)
for any head: dropping it changes no gradient. For the softmax above: ``x - m`` is
``A(-1)``, ``e`` is ``M(-1)``, ``s`` is ``M(-1)``, ``e / s`` is ``M(0) = Z``.

Anything unknown, a scatter or an overridden VJP downstream of ``m``, keeps ``m``'s gradient:
the rule only ever drops a term it has proven zero. Only computed tensors read directly as an
operand of ``+`` or ``-`` somewhere are candidates (a shift is always such a read), which
keeps the analysis linear in practice.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from .. import dtypes
from ..graph import free_vars, topo_order
from ..ir import (Binary, Call, Cast, Compare, ComputeOp, Const, Expr, Read, Reduce, Select, Tensor, Unary,
                  Var)
from ..transform import substitute

__all__ = ["cancelled_shifts", "tangent_class"]

#: a tangent class: ``("Z",)``, ``("A", k, p)`` or ``("M", k, p)``; None is unknown
Class = Optional[tuple]
ZERO: tuple = ("Z",)

#: expressions deeper than this are not analysed (their tensors keep their gradients)
MAX_DEPTH = 400


def _make(kind: str, k: Fraction, p) -> tuple:
    return ZERO if k == 0 else (kind, k, p)


def _same_p(p, q) -> bool:
    return len(p) == len(q) and all(a.same_as(b) for a, b in zip(p, q))


def _same(a: tuple, b: tuple) -> bool:
    if a[0] != b[0]:
        return False
    return a[0] == "Z" or (a[1] == b[1] and _same_p(a[2], b[2]))


def _const(e: Expr) -> Optional[Fraction]:
    """The exact value of a finite numeric constant, else None."""
    if not isinstance(e, Const) or isinstance(e.value, bool) or not isinstance(e.value, (int, float)):
        return None
    try:
        return Fraction(e.value)
    except (ValueError, OverflowError):  # inf, nan
        return None


def _add(a: tuple, b: tuple, sign: int) -> Class:
    if b[0] == "Z":
        return a if a[0] in ("Z", "A") else None  # M(k) + Z is no multiple of the sum
    if a[0] == "Z":
        return _make("A", sign * b[1], b[2]) if b[0] == "A" else None
    if a[0] == b[0] == "A" and _same_p(a[2], b[2]):
        return _make("A", a[1] + sign * b[1], a[2])
    if a[0] == b[0] == "M" and _same(a, b):
        return a
    return None


def _mul(n: Binary, a: tuple, b: tuple) -> Class:
    if a[0] == "Z" and b[0] == "Z":
        return ZERO
    if a[0] == "A" and b[0] == "Z" or a[0] == "Z" and b[0] == "A":
        c, q = (a, _const(n.b)) if a[0] == "A" else (b, _const(n.a))
        return None if q is None else _make("A", c[1] * q, c[2])
    if a[0] == "Z":
        return b if b[0] == "M" else None
    if b[0] == "Z":
        return a if a[0] == "M" else None
    if a[0] == b[0] == "M" and _same_p(a[2], b[2]):
        return _make("M", a[1] + b[1], a[2])
    return None


def _div(n: Binary, a: tuple, b: tuple) -> Class:
    if b[0] == "Z":
        if a[0] in ("Z", "M"):
            return a
        q = _const(n.b)
        return None if not q else _make("A", a[1] / q, a[2])
    if b[0] != "M":
        return None
    if a[0] == "Z":
        return _make("M", -b[1], b[2])
    if a[0] == "M" and _same_p(a[2], b[2]):
        return _make("M", a[1] - b[1], a[2])
    return None


class _Analysis:
    """The tangent classes of the tensors downstream of ``m`` for a perturbation of ``m``."""

    def __init__(self, m: Tensor):
        self.m = m
        #: id(tensor) -> (tensor, class with ``p`` in the tensor's own axes)
        self.tensors: Dict[int, Tuple[Tensor, tuple]] = {}

    def read(self, r: Read) -> Class:
        if not dtypes.is_float(r.dtype):
            return ZERO
        if r.tensor is self.m:
            return ("A", Fraction(1), tuple(r.indices))
        got = self.tensors.get(id(r.tensor))
        if got is None:
            return ZERO  # not downstream of m
        t, c = got
        if c[0] == "Z":
            return ZERO
        mapping = dict(zip(t.op.axes, r.indices))
        return (c[0], c[1], tuple(substitute(e, mapping) for e in c[2]))

    def expr(self, e: Expr, memo: Dict[int, Class]) -> Class:
        key = id(e)
        if key in memo:
            return memo[key]
        memo[key] = out = self._expr(e, memo)
        return out

    def _expr(self, e: Expr, memo) -> Class:
        if not dtypes.is_float(e.dtype) or isinstance(e, (Const, Var, Compare)):
            return ZERO  # integers, conditions and constants have zero derivative
        if e.depth > MAX_DEPTH:
            return None
        if isinstance(e, Read):
            return self.read(e)
        if isinstance(e, Cast):
            return self.expr(e.a, memo) if dtypes.is_float(e.a.dtype) else ZERO
        if isinstance(e, Unary):
            a = self.expr(e.a, memo)
            if a is None or e.op != "neg":
                return None if a is None else ZERO
            return _make("A", -a[1], a[2]) if a[0] == "A" else a
        if isinstance(e, Select):  # the condition is not differentiated
            t, f = self.expr(e.t, memo), self.expr(e.f, memo)
            return t if t is not None and f is not None and _same(t, f) else None
        if isinstance(e, Binary):
            a, b = self.expr(e.a, memo), self.expr(e.b, memo)
            if a is None or b is None:
                return None
            if e.op in ("add", "sub"):
                return _add(a, b, 1 if e.op == "add" else -1)
            if e.op == "mul":
                return _mul(e, a, b)
            if e.op == "div":
                return _div(e, a, b)
            if e.op in ("max", "min"):
                return a if _same(a, b) else None
            if e.op == "pow":
                q = _const(e.b)
                if b[0] != "Z":
                    return None
                if a[0] == "Z":
                    return ZERO
                return _make("M", a[1] * q, a[2]) if a[0] == "M" and q is not None else None
            return ZERO if a[0] == b[0] == "Z" else None
        if isinstance(e, Call):
            if e.name == "stop_gradient":
                return ZERO
            args = [self.expr(a, memo) for a in e.args]
            if any(a is None for a in args):
                return None
            if all(a[0] == "Z" for a in args):
                return ZERO
            if len(args) != 1:
                return None
            a = args[0]
            if e.name == "exp" and a[0] == "A":
                return ("M", a[1], a[2])
            if e.name == "log" and a[0] == "M":
                return ("A", a[1], a[2])
            if e.name == "sqrt" and a[0] == "M":
                return ("M", a[1] / 2, a[2])
            return None
        if isinstance(e, Reduce):
            body = self.expr(e.body, memo)
            if body is None or body[0] == "Z":
                return body
            reduced = {id(ax) for ax in e.axes}
            if any(id(v) in reduced for ix in body[2] for v in free_vars(ix)):
                return None  # the shift differs along the reduced axes: it does not factor out
            if e.combiner in ("max", "min"):
                return body
            if e.combiner == "sum" and body[0] == "M":
                return body
            return None
        return None

    def tensor(self, t: Tensor) -> Class:
        """The class of ``t`` (downstream of ``m``), ``p`` in ``t``'s axes; None if unknown."""
        if not isinstance(t.op, ComputeOp):
            return None  # a scatter (or anything else) downstream: not analysed
        c = self.expr(t.op.body, {})
        if c is None or c[0] == "Z":
            return c
        own = {id(a) for a in t.op.axes}
        if any(id(v) not in own for ix in c[2] for v in free_vars(ix)):
            return None
        return c


def tangent_class(m: Tensor, outputs: Sequence[Tensor], order: Optional[List[Tensor]] = None) -> List[Class]:
    """The tangent class of each of ``outputs`` for a perturbation of ``m`` (see the module doc):
    ``("Z",)`` when it does not depend on ``m`` to first order, None when unknown. ``order``:
    ``topo_order(outputs)`` when the caller has it."""
    order = topo_order(list(outputs)) if order is None else order
    down = {id(m)}
    an = _Analysis(m)
    unknown: Set[int] = set()
    for t in order:
        if t is m or t.is_placeholder:
            continue
        if not any(id(x) in down for x in t.op.inputs()):
            continue
        down.add(id(t))
        if any(id(x) in unknown for x in t.op.inputs()):
            unknown.add(id(t))
            continue
        c = an.tensor(t)
        if c is None:
            unknown.add(id(t))
        else:
            an.tensors[id(t)] = (t, c)
    out: List[Class] = []
    for y in outputs:
        if y is m:
            out.append(None)
        elif id(y) in unknown:
            out.append(None)
        elif id(y) in an.tensors:
            out.append(an.tensors[id(y)][1])
        else:
            out.append(ZERO)
    return out


def _shift_operands(order: Iterable[Tensor]) -> Set[int]:
    """Ids of the tensors read directly as an operand of ``+`` or ``-`` in some body."""
    found: Set[int] = set()
    for t in order:
        op = t.op
        if not isinstance(op, ComputeOp):
            continue
        stack, seen = [op.body], set()
        while stack:
            e = stack.pop()
            if id(e) in seen:
                continue
            seen.add(id(e))
            if isinstance(e, Binary) and e.op in ("add", "sub"):
                for side in (e.a, e.b):
                    if isinstance(side, Read):
                        found.add(id(side.tensor))
            stack.extend(c for c in e.children() if isinstance(c, Expr))
    return found


def cancelled_shifts(outputs: Sequence[Tensor], overridden: Iterable[Tensor] = ()) -> Set[int]:
    """Ids of the computed tensors whose adjoint is provably zero for every head: every output
    is ``Z`` for a perturbation of the tensor (see the module doc). A tensor with an overridden
    VJP at or below it (a rule the analysis cannot see) is never among them."""
    order = topo_order(list(outputs))
    operands = _shift_operands(order)
    overridden = list(overridden)
    below = {id(a) for a in topo_order(overridden)} if overridden else set()
    out: Set[int] = set()
    for m in order:
        if m.is_placeholder or id(m) not in operands or not dtypes.is_float(m.dtype):
            continue
        if any(m is o for o in outputs):
            continue
        if id(m) in below:
            continue
        if all(c is not None and c[0] == "Z" for c in tangent_class(m, outputs, order)):
            out.add(id(m))
    return out
