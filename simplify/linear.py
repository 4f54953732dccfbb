"""Integer index expressions in a canonical linear form, with ``//`` and ``%`` by constants folded.

``normalize(e)`` rewrites every integer sub-expression of ``e`` built from
``+ - *`` as ``c1*x1 + ... + k`` over atoms (variables, and whatever is not
linear), and folds division by a positive constant ``c``:

    (c*Q + R) // c  =  Q + R // c        (c*Q + R) % c  =  R % c

for integer ``Q`` and ``R``; when ``R`` is a constant in ``[0, c)`` the first
is ``Q`` and the second ``R``. So after substituting ``j = 2*a + 1``,
``j // 2`` becomes ``a`` and ``j % 2`` becomes ``1``. Comparisons of
constants, and selects and logical operators on them, fold as well.

``normalize(e, ranges)`` also knows where each variable lies (``ranges[id(v)] = (lo,
hi)``, inclusive): when :func:`~te_grad.intervals.interval` bounds ``R`` within ``[0, c)``
the first is ``Q`` and the second ``R`` whatever ``R`` is. So a view of a view composes:
``(4*b + h) // 4`` is ``b`` and ``(4*b + h) % 4`` is ``h`` for ``0 <= h < 4``.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from te_grad import dsl, dtypes
from te_grad.graph import free_vars
from te_grad.intervals import interval
from te_grad.ir import Binary, Cast, Compare, Const, Expr, Select, Unary, Var
from te_grad.visitor import Mutator

_CMP = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


def coefficient(e: Expr, v: Var) -> Optional[int]:
    """The coefficient of ``v`` in ``e`` if ``e`` is linear in ``v`` (None if not)."""
    if e is v:
        return 1
    if isinstance(e, (Const, Var)):
        return 0
    if isinstance(e, Cast):
        return coefficient(e.a, v)
    if isinstance(e, Unary) and e.op == "neg":
        c = coefficient(e.a, v)
        return None if c is None else -c
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = coefficient(e.a, v), coefficient(e.b, v)
        if a is None or b is None:
            return None
        return a + b if e.op == "add" else a - b
    if isinstance(e, Binary) and e.op == "mul":
        a, b = coefficient(e.a, v), coefficient(e.b, v)
        if a == 0 and isinstance(e.a, Const) and b is not None:
            return int(e.a.value) * b
        if b == 0 and isinstance(e.b, Const) and a is not None:
            return int(e.b.value) * a
        if a == 0 and b == 0:
            return 0
        return None
    return 0 if not any(x is v for x in free_vars(e)) else None


class _Linear:
    """``sum(coef * atom) + const``; atoms are compared structurally, kept in first-seen order."""

    def __init__(self, terms: List[Tuple[Expr, int]] = None, const: int = 0):
        self.terms = [(a, c) for a, c in (terms or []) if c]
        self.const = const

    def scaled(self, k: int) -> "_Linear":
        return _Linear([(a, c * k) for a, c in self.terms], self.const * k)

    def plus(self, other: "_Linear") -> "_Linear":
        terms = list(self.terms)
        for atom, c in other.terms:
            for n, (a, c0) in enumerate(terms):
                if a.same_as(atom):
                    terms[n] = (a, c0 + c)
                    break
            else:
                terms.append((atom, c))
        return _Linear(terms, self.const + other.const)

    def build(self, dtype: str) -> Expr:
        """The expression, constant last (first when every term is negated: ``1 - 2 * h``)."""
        out: Optional[Expr] = None
        lead = self.const > 0 and all(c < 0 for _, c in self.terms)
        if lead:
            out = dsl.const(self.const, dtype)
        for atom, c in self.terms:
            term = atom if c in (1, -1) else dsl.const(abs(c), dtype) * atom
            if out is None:
                out = term if c > 0 else -term
            else:
                out = out + term if c > 0 else out - term
        if out is None:
            return dsl.const(self.const, dtype)
        if self.const and not lead:
            out = out + dsl.const(self.const, dtype) if self.const > 0 else out - dsl.const(-self.const, dtype)
        return out


class _Normalize(Mutator):
    def __init__(self, ranges=None):
        super().__init__()
        self.ranges = ranges

    def linear(self, e: Expr) -> _Linear:
        if isinstance(e, Const):
            return _Linear([], int(e.value))
        if isinstance(e, Binary) and e.op in ("add", "sub"):
            a, b = self.linear(e.a), self.linear(e.b)
            return a.plus(b if e.op == "add" else b.scaled(-1))
        if isinstance(e, Unary) and e.op == "neg":
            return self.linear(e.a).scaled(-1)
        if isinstance(e, Binary) and e.op == "mul":
            a, b = self.linear(e.a), self.linear(e.b)
            if not a.terms:
                return b.scaled(a.const)
            if not b.terms:
                return a.scaled(b.const)
        if (isinstance(e, Binary) and e.op in ("floordiv", "floormod") and isinstance(e.b, Const)
                and int(e.b.value) > 0):
            return self.divmod(e.op, self.linear(e.a), int(e.b.value), e.dtype)
        return _Linear([(self.atom(e), 1)])

    def atom(self, e: Expr) -> Expr:
        if isinstance(e, (Binary, Unary)):  # x * y and the like: only the operands normalize
            return _fold_constant_logic(Mutator.generic_visit(self, e))
        return self.visit(e)

    def divmod(self, op: str, num: _Linear, c: int, dtype: str) -> _Linear:
        whole = _Linear([(a, k // c) for a, k in num.terms if k % c == 0], num.const // c)
        rest = _Linear([(a, k) for a, k in num.terms if k % c], num.const % c)
        if rest.terms and self.ranges:
            bounds = interval(rest.build(dtype), self.ranges)
            if bounds is not None and 0 <= bounds[0] and bounds[1] < c:   # R in [0, c)
                return whole if op == "floordiv" else rest
        if op == "floordiv":
            if not rest.terms:
                return whole  # 0 <= rest.const < c
            return whole.plus(_Linear([(dsl.binary("floordiv", rest.build(dtype), dsl.const(c, dtype)), 1)]))
        if not rest.terms:
            return _Linear([], rest.const)
        return _Linear([(dsl.binary("floormod", rest.build(dtype), dsl.const(c, dtype)), 1)])

    def generic_visit(self, node):
        if dtypes.is_int(node.dtype) and (
                (isinstance(node, Binary) and node.op in ("add", "sub", "mul", "floordiv", "floormod"))
                or (isinstance(node, Unary) and node.op == "neg")):
            return self.linear(node).build(node.dtype)
        new = super().generic_visit(node)
        return _fold_constant_logic(new)


def _in_dtype(c: Const):
    """A constant's value as its dtype holds it (``const(0.1, "float32")`` is float32's 0.1)."""
    return np.asarray(c.value, dtype=np.bool_ if c.dtype == "bool" else c.dtype)[()]


def _fold_constant_logic(e: Expr) -> Expr:
    """One level of constant logic folded: a comparison of two constants (in their dtypes, as
    the evaluator and the kernel compare them), ``and`` / ``or`` / ``not`` with a constant
    operand, a select on a constant."""
    if isinstance(e, Compare) and isinstance(e.a, Const) and isinstance(e.b, Const) and e.op in _CMP:
        return dsl.const(bool(_CMP[e.op](_in_dtype(e.a), _in_dtype(e.b))))
    if isinstance(e, Binary) and e.op in ("and", "or"):
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(x, Const):
                if e.op == "and":
                    return y if x.value else dsl.const(False)
                return dsl.const(True) if x.value else y
    if isinstance(e, Unary) and e.op == "not" and isinstance(e.a, Const):
        return dsl.const(not e.a.value)
    if isinstance(e, Select) and isinstance(e.cond, Const):
        return e.t if e.cond.value else e.f
    return e


def normalize(expr: Expr, ranges=None) -> Expr:
    """``expr`` with its integer index arithmetic in canonical linear form (see the module doc);
    ``ranges`` (``{id(variable): (lo, hi)}``, inclusive) bound the variables it knows."""
    return _Normalize(ranges).visit(expr)
