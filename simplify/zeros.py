"""Structural zeros carried across tensors: a masked region's work disappears.

Attention written as users write it builds the full score matrix and masks it,
``M[i, j] = if_then_else(j <= i, S[i, j], -inf)``, then takes a softmax. Within one
tensor the simplifier already never sums a zero (:mod:`.gather` lifts ``if_then_else(c,
x, 0)`` factors into the domain); this pass carries the zeros *between* tensors, so that
the masked region is neither computed nor summed anywhere, forward or backward.

Two facts per float compute ``T`` (conditions over ``T``'s axes, quasi-affine, so isl can
scan them; ``None`` means "no structure known"):

- the **support** ``nz(T)``: outside it ``T`` is exactly ``0``;
- the **finite region** ``fin(T)``: outside it ``T`` is exactly ``-inf``.

They follow the expression (producers first)::

    nz(0) = false                      fin(-inf) = false
    nz(T[g]) = nz(T)[axes := g]        fin(T[g]) = fin(T)[axes := g]
    nz(if_then_else(c, a, 0)) = c & nz(a)   (and symmetrically; the same for fin and -inf;
                                            c's quasi-affine conjuncts only: a test on data
                                            is nothing isl can scan, and kept, it would grow
                                            with every nested branch of a gradient)
    nz(a * b) = nz(a) & nz(b)          fin(a + b) = fin(a) & fin(b)
    nz(a / b) = nz(a)                  fin(a - b) = fin(a)     (b never -inf by structure)
    nz(a + b) = nz(a) | nz(b)          fin(max_k a) = fin(a) when it does not use k
    nz(exp(a)) = fin(a)                nz(-a) = nz(f(a)) = nz(a) for f(0) = 0 (tanh, sin, ...)
    nz(sum_k a) = nz(a) when it does not use k

and the **demand** ``D(T)`` (consumers first): the points of ``T`` some reader's value
depends on. A read ``T[v1, ..., vn]`` at distinct loop variables contributes the
condition under which its value matters, renamed to ``T``'s axes: the branch condition of
an ``if_then_else`` around it, the supports of the factors it is multiplied by, the domain
of the reduction it is summed in, and the reader's own ``nz & D``. Any other read (an
output, a kept tensor, a scatter, a shifted index) demands every point.

The rewrite: each float compute that is neither an output nor kept becomes
``if_then_else(nz(T) & D(T), body, 0)``; each sum reduction's body ``b`` becomes
``if_then_else(nz(b), b, 0)`` and each max reduction's ``if_then_else(fin(b), b, -inf)``,
guards that :mod:`.gather` moves into the domain. Only *masks* are carried: a condition
at least one of whose conjuncts relates two loop variables (a triangle ``j <= i``, a band
``i - j < w``). A tensor so guarded is then written only on its guard when every reader uses
it only there (:mod:`.unread`, applied to the graph a kernel is built from). A border, each conjunct on one axis (a padding stage), stays where it is:
its zeros are few and a conv's loops are faster as a box.

Exactness. A replaced value is one that is 0 (or ``-inf``) by the rules, or one no
reader's value depends on. The rules hold under the simplifier's convention that a
summed zero is never computed (``0 * x == 0``): values other than a literal ``-inf`` are
taken to be finite, so ``exp(-inf - y) == 0``. A value that only matters through a product
is replaced by ``0``, so the walk stops narrowing the demand below an operation that may
turn a ``0`` into a non-finite number (a ``log``, a divisor, ``pow``): there only the
conditions under which the expression is evaluated at all (``if_then_else`` branches,
the reader's own guard) narrow it.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Set

from te_grad import dtypes
from te_grad.graph import free_vars, topo_order
from te_grad.ir import (Binary, Call, Cast, ComputeOp, Const, Expr, Read, Reduce, ScatterOp,
                        Select, SizeVar, Tensor, Unary, Var, const, reads_in,
                        structurally_equal)
from te_grad.ops import reduction
from te_grad.transform import replace_tensors, substitute
from te_grad.visitor import Mutator

from .affine import IslNames, conjuncts, isl_cond
from .isl_bridge import implies as isl_implies

FALSE = Const(False, dtypes.BOOL)
#: functions with f(0) == 0: a zero argument gives a zero value
_ZERO_AT_ZERO = {"tanh", "sin", "sqrt", "erf", "expm1", "log1p", "atan", "asin", "abs", "stop_gradient"}
#: functions finite at every finite argument, 0 included: a zero in place of an unused value stays harmless
_FINITE_AT_ZERO = _ZERO_AT_ZERO | {"exp", "sigmoid", "cos", "acos", "atan2"}


def _is_false(c: Optional[Expr]) -> bool:
    return isinstance(c, Const) and c.dtype == dtypes.BOOL and not c.value


def implies(a: Expr, b: Expr) -> bool:
    """True if ``a`` provably implies ``b`` (both quasi-affine: isl decides; else only when
    every conjunct of ``b`` is one of ``a``)."""
    if structurally_equal(a, b) or _is_false(a):
        return True
    have = conjuncts(a)
    if all(any(structurally_equal(c, h) for h in have) for c in conjuncts(b)):
        return True
    names = IslNames()
    variables = {id(v): v for v in _vars(a) + _vars(b)}
    for k, v in enumerate(variables.values()):
        names[id(v)] = f"v{k}"
    ta, tb = isl_cond(a, names), isl_cond(b, names)
    if ta is None or tb is None:
        return False
    sizes = ", ".join(names.sizes)
    ranges = " and ".join([f"{v.lo} <= {n}" + (f" <= {v.hi}" if v.hi is not None else "")
                           for n, v in names.sizes.items()]) or "0 = 0"
    dims = ", ".join(f"v{k}" for k in range(len(variables)))
    return isl_implies(f"[{sizes}] -> {{ [{dims}] : {ranges} }}", ta, tb)


def _and(a: Optional[Expr], b: Optional[Expr]) -> Optional[Expr]:
    if a is None:
        return b
    if b is None:
        return a
    if _is_false(a) or _is_false(b):
        return FALSE
    if implies(a, b):
        return a
    if implies(b, a):
        return b
    have = conjuncts(a)
    extra = [c for c in conjuncts(b) if not any(structurally_equal(c, h) for h in have)]
    for c in extra:
        a = a & c
    return a


def _or(a: Optional[Expr], b: Optional[Expr]) -> Optional[Expr]:
    if a is None or b is None:
        return None
    if _is_false(a):
        return b
    if _is_false(b) or implies(b, a):
        return a
    if implies(a, b):
        return b
    return a | b


def _same(a: Optional[Expr], b: Optional[Expr]) -> bool:
    return a is b or (a is not None and b is not None and structurally_equal(a, b))


def _vars(c: Expr) -> List[Var]:
    return [v for v in free_vars(c) if not isinstance(v, SizeVar)]


def _affine(c: Expr) -> bool:
    """True if isl can represent ``c`` (loop variables and sizes, no data)."""
    names = IslNames()
    for k, v in enumerate(_vars(c)):
        names[id(v)] = f"v{k}"
    return isl_cond(c, names) is not None


def _usable(c: Optional[Expr], allowed: Optional[Set[int]]) -> Optional[Expr]:
    """``c`` less its conjuncts isl cannot represent or that use a variable outside
    ``allowed`` (any variable when ``allowed`` is None; a superset of ``c``: always sound);
    ``None`` when nothing is left."""
    if c is None or _is_false(c):
        return c
    out = None
    for part in conjuncts(c):
        if (allowed is None or all(id(v) in allowed for v in _vars(part))) and _affine(part):
            out = _and(out, part)
    return out


def is_mask(c: Optional[Expr]) -> bool:
    """True if ``c`` is all-false or has a conjunct relating two loop variables (a triangle, a
    band), not only bounds of single axes (a border)."""
    if c is None:
        return False
    if _is_false(c):
        return True
    return any(len(_vars(part)) >= 2 for part in conjuncts(c))


def _is_const(e: Expr, value) -> bool:
    if not isinstance(e, Const) or e.dtype == dtypes.BOOL:
        return False
    if isinstance(value, float) and math.isinf(value):
        return dtypes.is_float(e.dtype) and e.value == value
    return e.value == value


class Structure:
    """``nz`` and ``fin`` of expressions, given those of the tensors (``{id(tensor): cond over
    its axes}``; a missing tensor has no structure known)."""

    def __init__(self):
        self.nz_of: Dict[int, Expr] = {}
        self.fin_of: Dict[int, Expr] = {}
        self._nz: Dict[int, tuple] = {}
        self._fin: Dict[int, tuple] = {}

    def _at(self, table: Dict[int, Expr], r: Read) -> Optional[Expr]:
        c = table.get(id(r.tensor))
        if c is None or _is_false(c):
            return c
        return substitute(c, dict(zip(r.tensor.op.axes, r.indices)))

    def nz(self, e: Expr) -> Optional[Expr]:
        hit = self._nz.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        out = self._nz_of(e)
        self._nz[id(e)] = (e, out)
        return out

    def _nz_of(self, e: Expr) -> Optional[Expr]:
        if isinstance(e, Const):
            return FALSE if _is_const(e, 0) else None
        if isinstance(e, Read):
            return self._at(self.nz_of, e)
        if isinstance(e, Select):
            a, b = self.nz(e.t), self.nz(e.f)
            if _is_false(b):
                return _and(_usable(e.cond, None), a)
            if _is_false(a):
                return _and(_usable(~e.cond, None), b)
            return None
        if isinstance(e, Binary):
            if e.op == "mul":
                return _and(self.nz(e.a), self.nz(e.b))
            if e.op == "div":
                return self.nz(e.a)
            if e.op in ("add", "sub"):
                return _or(self.nz(e.a), self.nz(e.b))
            return None
        if isinstance(e, Unary) and e.op == "neg":
            return self.nz(e.a)
        if isinstance(e, Cast) and e.dtype != dtypes.BOOL:
            return self.nz(e.a)
        if isinstance(e, Call) and len(e.args) == 1:
            if e.name == "exp":
                return self.fin(e.args[0])
            if e.name in _ZERO_AT_ZERO:
                return self.nz(e.args[0])
            return None
        if isinstance(e, Reduce) and reduction(e.combiner).lowering == "add":
            c = _and(self.nz(e.body), e.where)
            return c if c is not None and not _uses(c, e.axes) else None
        return None

    def fin(self, e: Expr) -> Optional[Expr]:
        hit = self._fin.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        out = self._fin_of(e)
        self._fin[id(e)] = (e, out)
        return out

    def _fin_of(self, e: Expr) -> Optional[Expr]:
        if isinstance(e, Const):
            return FALSE if _is_const(e, -math.inf) else None
        if isinstance(e, Read):
            return self._at(self.fin_of, e)
        if isinstance(e, Select):
            a, b = self.fin(e.t), self.fin(e.f)
            if _is_false(b):
                return _and(_usable(e.cond, None), a)
            if _is_false(a):
                return _and(_usable(~e.cond, None), b)
            return None
        if isinstance(e, Binary):
            if e.op == "add":
                return _and(self.fin(e.a), self.fin(e.b))
            if e.op == "sub" and self.fin(e.b) is None:
                return self.fin(e.a)
            return None
        if isinstance(e, Cast) and dtypes.is_float(e.dtype) and dtypes.is_float(e.a.dtype):
            return self.fin(e.a)
        if isinstance(e, Call) and e.name == "stop_gradient":
            return self.fin(e.args[0])
        if isinstance(e, Reduce) and e.combiner == "max":
            c = _and(self.fin(e.body), e.where)
            return c if c is not None and not _uses(c, e.axes) else None
        return None


def _uses(c: Expr, axes) -> bool:
    ids = {id(a) for a in axes}
    return any(id(v) in ids for v in _vars(c))


def _float_compute(t: Tensor) -> bool:
    return isinstance(t.op, ComputeOp) and dtypes.is_float(t.dtype)


def _tensor_fact(c: Optional[Expr], t: Tensor) -> Optional[Expr]:
    """``c`` as a fact of ``t``: quasi-affine in its axes, and a mask (:func:`is_mask`)."""
    c = _usable(c, {id(a) for a in t.op.axes})
    return c if is_mask(c) else None


class _Demand:
    """Walks a reader's body collecting, for each read, the condition under which its value
    matters (``need``) and under which it is evaluated at all (``guard``)."""

    #: distinct (guard, need) pairs a shared subexpression is walked under before it is
    #: walked once for "evaluated and needed everywhere" (a superset: always sound), so that
    #: a DAG with heavy sharing (a second-order gradient) costs a few walks per node, not one
    #: per path
    MAX_VISITS = 4

    def __init__(self, structure: Structure, demand: Dict[int, list]):
        self.s = structure
        self.demand = demand
        self._seen: Dict[int, list] = {}

    def walk(self, e: Expr, guard: Optional[Expr], need: Optional[Expr]):
        entry = self._seen.get(id(e))
        if entry is None or entry[0] is not e:
            entry = self._seen[id(e)] = [e, []]
        visits = entry[1]
        if visits is None:  # already walked as evaluated and needed everywhere
            return
        if any(_same(g, guard) and _same(n, need) for g, n in visits):
            return
        if (guard is None and need is None) or len(visits) >= self.MAX_VISITS:
            entry[1] = None
            guard = need = None
        else:
            visits.append((guard, need))
        self._walk(e, guard, need)

    def _walk(self, e: Expr, guard: Optional[Expr], need: Optional[Expr]):
        if isinstance(e, Read):
            for i in e.indices:
                self.walk(i, guard, guard)
            self.contribute(e, need)
            return
        if isinstance(e, Select):
            self.walk(e.cond, guard, guard)
            g_t, g_f = _and(guard, e.cond), _and(guard, ~e.cond)
            self.walk(e.t, g_t, _and(need, e.cond))
            self.walk(e.f, g_f, _and(need, ~e.cond))
            return
        if isinstance(e, Binary) and e.op == "mul":
            self.walk(e.a, guard, _and(need, self.s.nz(e.b)))
            self.walk(e.b, guard, _and(need, self.s.nz(e.a)))
            return
        if isinstance(e, Binary) and e.op in ("add", "sub", "min", "max"):
            self.walk(e.a, guard, need)
            self.walk(e.b, guard, need)
            return
        if isinstance(e, Binary) and e.op == "div":
            self.walk(e.a, guard, need)
            self.walk(e.b, guard, guard)  # a divisor of 0 is no harmless stand-in
            return
        if (isinstance(e, Unary) and e.op == "neg") or (isinstance(e, Cast) and dtypes.is_float(e.dtype)):
            self.walk(e.a, guard, need)
            return
        if isinstance(e, Call) and e.name in _FINITE_AT_ZERO:
            for a in e.args:
                self.walk(a, guard, need)
            return
        if isinstance(e, Reduce):
            for ax in e.axes:
                self.walk(ax.lo, guard, guard)
                self.walk(ax.hi, guard, guard)
            if e.where is not None:
                self.walk(e.where, guard, guard)
            inner = _body_guard(self.s, e)
            g = _and(_and(guard, e.where), inner)
            n = _and(_and(need, e.where), inner)
            self.walk(e.body, g, n)
            return
        for child in e.children():  # anything else: its operands matter wherever it is evaluated
            self.walk(child, guard, guard)

    def contribute(self, r: Read, need: Optional[Expr]):
        t = r.tensor
        if not _float_compute(t):
            return
        plain = all(isinstance(i, Var) and not isinstance(i, SizeVar) for i in r.indices) and \
            len({id(i) for i in r.indices}) == len(r.indices)
        c = _usable(need, {id(i) for i in r.indices}) if plain else None
        if c is not None:
            c = substitute(c, dict(zip(r.indices, t.op.axes)))
        self.demand.setdefault(id(t), []).append(c)


def _body_guard(s: Structure, red: Reduce) -> Optional[Expr]:
    """The guard a reduction's body gets: its support (a sum) or its finite region (a max),
    when that is a mask isl can scan."""
    lowering = reduction(red.combiner).lowering
    if lowering == "add":
        c = s.nz(red.body)
    elif red.combiner == "max":
        c = s.fin(red.body)
    else:
        return None
    c = _usable(c, None)
    return c if is_mask(c) else None


class _GuardReductions(Mutator):
    """Gives each sum (max) reduction whose body has a mask support (finite region) that guard."""

    def __init__(self, structure: Structure, new: Dict[int, Tensor]):
        super().__init__()
        self.s = structure
        self.new = new

    def visit_Read(self, node: Read):
        node = self.generic_visit(node)
        target = self.new.get(id(node.tensor), node.tensor)
        return node if target is node.tensor else Read(target, node.indices)

    def visit_Reduce(self, node: Reduce):
        node = super().visit_Reduce(node)
        guard = _body_guard(self.s, node)
        if guard is None:
            return node
        other = const(0.0 if reduction(node.combiner).lowering == "add" else -math.inf, node.dtype)
        body = _guarded(node.body, guard, other)
        return node if structurally_equal(body, node.body) else Reduce(node.combiner, body, node.axes, node.where)


def _guarded(body: Expr, guard: Expr, other: Const) -> Expr:
    """``if_then_else(guard, body, other)``, merged with the guards ``body`` already has (a
    branch ``guard`` rules out is dropped); ``body`` itself when its guard implies ``guard``
    and its other branch is ``other``."""
    inner = body
    while isinstance(inner, Select):
        if implies(guard, inner.cond):
            inner = inner.t
        elif _is_const(inner.f, other.value) and implies(inner.cond, guard):
            return body if inner is body else Select(guard, inner, other)
        else:
            break
    return Select(guard, inner, other)


def carry_zeros(tensors: List[Tensor], keep: Set[int] = frozenset()) -> Dict[int, Tensor]:
    """``{id(old): new}`` for the tensors behind ``tensors`` that change (empty when the graph
    has no mask). Tensors in ``tensors`` and those whose id is in ``keep`` keep their values
    everywhere; their reads follow the rewrites."""
    order = topo_order(tensors)
    s = Structure()
    for t in order:
        if _float_compute(t):
            nz, fin = _tensor_fact(s.nz(t.op.body), t), _tensor_fact(s.fin(t.op.body), t)
            if nz is not None:
                s.nz_of[id(t)] = nz
            if fin is not None:
                s.fin_of[id(t)] = fin
    if not s.nz_of and not s.fin_of:
        return {}
    roots = {id(t) for t in tensors}
    kept = set(keep)
    demand_parts: Dict[int, list] = {}
    walker = _Demand(s, demand_parts)
    wrap: Dict[int, Expr] = {}
    for t in reversed(order):
        if isinstance(t.op, ScatterOp):
            for r in _scatter_reads(t):
                walker.contribute(r, None)
            continue
        if not isinstance(t.op, ComputeOp):
            continue
        d = None
        if id(t) not in roots and id(t) not in kept and dtypes.is_float(t.dtype):
            parts = demand_parts.get(id(t), [None])
            for k, c in enumerate(parts):
                d = c if k == 0 else _or(d, c)
            d = _tensor_fact(d, t)
            own = _and(s.nz_of.get(id(t)), d)
            if own is not None:
                # computed only where it is nonzero and needed: its body is evaluated nowhere else
                wrap[id(t)] = own
                walker.walk(t.op.body, own, own)
                continue
        # computed everywhere: only the points no reader needs may change
        walker.walk(t.op.body, None, d)
    new: Dict[int, Tensor] = {}
    for t in order:
        if not isinstance(t.op, (ComputeOp, ScatterOp)):
            continue
        if isinstance(t.op, ScatterOp) or id(t) in kept:  # as it is, reading the new producers
            if any(new.get(id(x), x) is not x for x in t.op.inputs()):
                new[id(t)] = replace_tensors([t], new)[id(t)]
            continue
        guard = wrap.get(id(t))
        body = _GuardReductions(s, new).visit(t.op.body)
        if guard is not None:
            body = _guarded(body, guard, const(0.0, t.dtype))
        if body is t.op.body or structurally_equal(body, t.op.body):
            continue
        moved = Tensor(t.name, t.shape, t.dtype, ComputeOp(t.op.axes, body, t.op.note))
        for table in (s.nz_of, s.fin_of):
            if id(t) in table:
                table[id(moved)] = table[id(t)]
        if guard is not None:
            s.nz_of[id(moved)] = guard
        new[id(t)] = moved
    return new


def _scatter_reads(t: Tensor) -> List[Read]:
    op = t.op
    exprs = [op.value] + list(op.indices) + ([op.where] if op.where is not None else [])
    exprs += [b for r in op.axes for b in (r.lo, r.hi)]
    return [r for e in exprs for r in reads_in(e)]
