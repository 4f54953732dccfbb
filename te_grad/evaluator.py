"""The numpy reference evaluator: the oracle every other stage is checked against.

Each tensor of the graph is computed whole, vectorized over its domain: an
index variable is an ``arange`` laid along its own array dimension, so an
expression evaluates to an array that broadcasts to the domain. A reduction
prepends one dimension per reduce axis (numpy broadcasting aligns on the right,
so everything outside the reduction stays valid) and reduces them away.

Memory stays bounded (about :data:`CHUNK_ELEMENTS` elements per array): a
tensor whose reductions are large is computed in boxes of its output domain,
and a reduction domain is cut into boxes along as many of its axes as needed.
A reduce axis that its ``where`` pins to a value (a conjunct ``k == e`` or
``k + c == e`` where ``e`` uses only enclosing variables and earlier axes, as in
every raw vector-Jacobian product) is not enumerated: it is bound to ``e``, and
``lo <= e < hi`` joins the mask. That is exact, and it makes the raw form of an
elementwise op linear in its size instead of quadratic. Each axis's value and
bounds are evaluated under the mask of the earlier axes' ranges, also when the
enumerated ranges are first sized: ``r := I[k]`` after ``k := i`` with
``0 <= k < 3`` never reads ``I`` at ``k = 3``.

Guards are exact: every expression is evaluated under a *mask* of the points
where it is actually needed (the branch of a select that is taken, the points
of a reduction domain that satisfy ``where``, the right operand of ``&`` where
the left holds). A read outside its tensor at a needed point is a
:class:`~te_grad.errors.UserError` naming the read and the point; at other
points the index is clamped, so memory is never touched out of bounds.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import dtypes, ops
from .deep import deep_entry
from .errors import InternalError, UserError
from . import sizes as size_vars
from .argcheck import check_feed  # the kernels' own check
from .graph import free_var_ids, free_vars, reads_in, topo_order
from .ir import (Binary, Call, Cast, Compare, ComputeOp, Const, Expr, PlaceholderOp, Read, Reduce,
                 ScatterOp, Select, SizeVar, Tensor, Unary, Var)
from .printer import expr_to_str

#: elements of one intermediate array above which work is cut into boxes
CHUNK_ELEMENTS = 1 << 23

_COMPARE = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
            "eq": np.equal, "ne": np.not_equal}


def identity_of(combiner: str, dtype: str):
    """The value of a reduction over an empty domain (see :mod:`te_grad.ops`)."""
    return ops.identity_of(combiner, dtype)


def _and(mask, cond):
    if mask is None:
        return cond
    return np.logical_and(mask, cond)


def _conjuncts(cond: Optional[Expr]) -> List[Expr]:
    if cond is None:
        return []
    if isinstance(cond, Binary) and cond.op == "and":
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


def _signed_terms(e: Expr, sign: int, out: list):
    """``e`` as a signed sum of terms (through integer ``+``, ``-`` and unary ``-``)."""
    if isinstance(e, Binary) and e.op in ("add", "sub") and dtypes.is_int(e.dtype):
        _signed_terms(e.a, sign, out)
        _signed_terms(e.b, sign if e.op == "add" else -sign, out)
    elif isinstance(e, Unary) and e.op == "neg" and dtypes.is_int(e.dtype):
        _signed_terms(e.a, -sign, out)
    else:
        out.append((sign, e))
    return out


def solve_for(axis: Var, cond: Expr) -> Optional[Expr]:
    """``e`` if the condition ``cond`` is ``axis == e`` up to moving terms (``axis`` appearing
    once, with coefficient +1 or -1, and nowhere inside another term), else None."""
    if not (isinstance(cond, Compare) and cond.op == "eq" and dtypes.is_int(cond.a.dtype)):
        return None
    terms = _signed_terms(cond.a, 1, []) + _signed_terms(cond.b, -1, [])  # sum(terms) == 0
    mine = [t for t in terms if t[1] is axis]
    if len(mine) != 1 or any(any(v is axis for v in free_vars(e)) for s, e in terms if e is not axis):
        return None
    sign = mine[0][0]
    value = None
    for s, e in terms:
        if e is axis:
            continue
        part = -s * sign  # axis = -sign * sum(others)
        if value is None:
            value = e if part > 0 else -e
        else:
            value = value + e if part > 0 else value - e
    return value if value is not None else Const(0, axis.dtype)


def plan_reduction(axes: Sequence[Var], where: Optional[Expr]):
    """``(solutions, rest)``: for each axis the expression its ``where`` pins it to (or None, to
    enumerate it), and the conjuncts of ``where`` left to check. An axis is pinned only by an
    expression of enclosing variables and earlier axes."""
    rest = _conjuncts(where)
    solutions: List[Optional[Expr]] = []
    for t, ax in enumerate(axes):
        later = {id(a) for a in axes[t:]}
        found = None
        for c in rest:
            e = solve_for(ax, c)
            if e is not None and not any(id(v) in later for v in free_vars(e)):
                found = (c, e)
                break
        if found is None:
            solutions.append(None)
        else:
            rest = [c for c in rest if c is not found[0]]
            solutions.append(found[1])
    return solutions, rest


def _boxes(ranges: Sequence[Tuple[int, int]], limit: int):
    """Sub-boxes of ``ranges`` covering it once, each of at most ``limit`` points (or one point)."""
    sizes = [hi - lo for lo, hi in ranges]
    if any(n <= 0 for n in sizes):
        return
    t = 0  # the first axis whose suffix fits: earlier axes go one value at a time
    while t < len(sizes) and int(np.prod(sizes[t:], dtype=np.int64)) > limit:
        t += 1
    if t == len(sizes):
        t = len(sizes) - 1
        step = 1
    else:
        t = max(t - 1, 0)
        step = max(1, limit // max(1, int(np.prod(sizes[t + 1:], dtype=np.int64))))
    if not sizes:
        yield []
        return
    heads = [range(lo, hi) for lo, hi in ranges[:t]]
    lo_t, hi_t = ranges[t]
    for head in np.ndindex(*[len(r) for r in heads]) if heads else [()]:
        fixed = [(r[k], r[k] + 1) for r, k in zip(heads, head)]
        for start in range(lo_t, hi_t, step):
            yield fixed + [(start, min(hi_t, start + step))] + list(ranges[t + 1:])


def _work_per_element(e: Expr) -> int:
    """Points the reductions of ``e`` enumerate per element of the enclosing domain (constant
    bounds only; pinned axes count one), the deepest nesting's product."""
    best = 1
    stack = [(e, 1)]
    seen = set()  # (node, factor): a node shared by several parents is walked once per factor
    while stack:
        node, factor = stack.pop()
        if (id(node), factor) in seen:
            continue
        seen.add((id(node), factor))
        if isinstance(node, Reduce):
            solutions, _ = plan_reduction(node.axes, node.where)
            for ax, sol in zip(node.axes, solutions):
                if sol is None and ax.extent is not None:
                    factor *= max(1, ax.extent)
            best = max(best, factor)
        stack.extend((c, factor) for c in node.children())
    return best


def _masked_extreme(v: np.ndarray, mask, fn) -> Optional[int]:
    """``fn`` (np.min or np.max) of ``v`` over the points where ``mask`` holds (None if none),
    without materializing more than ``v`` and ``mask`` themselves."""
    if mask is None or np.ndim(mask) == 0:
        if mask is not None and not bool(mask):
            return None
        return int(fn(v)) if v.size else None
    mask = np.asarray(mask)
    nd = max(v.ndim, mask.ndim)
    v = v.reshape((1,) * (nd - v.ndim) + v.shape)
    mask = mask.reshape((1,) * (nd - mask.ndim) + mask.shape)
    spread = tuple(d for d in range(nd) if v.shape[d] == 1 and mask.shape[d] > 1)
    if spread:  # a dimension v does not vary along: any point of the mask there will do
        mask = np.any(mask, axis=spread, keepdims=True)
    full = np.broadcast_shapes(v.shape, mask.shape)
    picked = np.broadcast_to(v, full)[np.broadcast_to(mask, full)]
    return int(fn(picked)) if picked.size else None


class _ExprEvaluator:
    """Evaluates one compute body; ``shape`` is the shape of all dimensions in play."""

    def __init__(self, values: Dict[int, np.ndarray], tensor: Tensor):
        self.values = values
        self.tensor = tensor
        self.env: Dict[int, np.ndarray] = {}
        self.shape: tuple = tensor.shape
        # the last value of each shared node: a DAG (second-order gradients share heavily) is
        # evaluated once per node and context, not once per path (see eval)
        self.memo: Dict[int, tuple] = {}
        self.collected: Dict[int, tuple] = {}  # id -> (node, shape, env, value, error points)
        self.collecting = False  # evaluating a reduction-free node for its value and error points
        self.errors = None  # while collecting: where the node evaluated so far would fail
        self.reduce_free: Dict[int, tuple] = {}  # id -> (node, no reduction below it)
        self.free: Dict[int, tuple] = {}

    def run(self) -> np.ndarray:
        op: ComputeOp = self.tensor.op
        shape = self.tensor.shape
        out = np.empty(shape, dtype=self.tensor.dtype)
        if out.size == 0:
            return out
        limit = max(1, CHUNK_ELEMENTS // _work_per_element(op.body))
        for box in _boxes([(0, n) for n in shape], limit):
            nd = len(op.axes)
            for d, ax in enumerate(op.axes):
                lo, hi = box[d]
                self.env[id(ax)] = np.arange(lo, hi, dtype=np.int64).reshape(
                    [hi - lo if e == d else 1 for e in range(nd)])
            self.shape = tuple(hi - lo for lo, hi in box)
            self.memo.clear()
            self.collected.clear()
            value = self.eval(op.body, None)
            out[tuple(slice(lo, hi) for lo, hi in box)] = np.broadcast_to(value, self.shape)
        for ax in op.axes:
            self.env.pop(id(ax), None)
        self.memo.clear()
        self.collected.clear()
        return out

    def eval(self, e: Expr, mask) -> np.ndarray:
        """The value of ``e`` where ``mask`` holds (an error where it fails there).

        Below a reduction the value depends on the mask (the reduction's domain follows it,
        the points outside get its identity): such a node met again (a DAG's shared node)
        gives its last value only under the same mask object and values of its free variables.

        Everything else is evaluated at every point regardless of the mask (numpy computes
        whole arrays; a zero divisor is replaced by 1, an index out of bounds by 0), so its
        value does not depend on the mask, and neither does *where* it fails: a node
        evaluated on all points gives its value and the points ``E`` where it would fail (a
        division by zero or a read out of bounds, each under the conditions of the branches,
        ``and``/``or`` operands and reductions inside the node that lead to it), and under a
        mask ``M`` it fails exactly on ``M & E``. So it is computed once per shape and values
        of its free variables (:meth:`collect`) and reused under every mask: a node under
        nested data-dependent branches is met under many masks. Where ``M & E`` is not empty
        the node is evaluated again under ``M``, which raises the error as it is found."""
        leaf = isinstance(e, (Const, Var, SizeVar))
        if leaf:
            return self.node(e, mask)
        if self.collecting:
            value, errors = self.collect(e)
            if errors is not None:
                here = _and(mask, errors)
                if np.any(here):
                    self.errors = here if self.errors is None else np.logical_or(self.errors, here)
            return value
        if self.reduction_free(e):
            value, errors = self.collect(e)
            if errors is None or not np.any(_and(mask, errors)):
                return value
            return self.node(e, mask)  # it fails under this mask: raise the error found first
        env = tuple(self.env.get(v) for v in free_var_ids(e, self.free))
        hit = self.memo.get(id(e))
        if hit is not None and hit[0] is e and hit[1] is mask and hit[2] == self.shape and \
                all(a is b for a, b in zip(hit[3], env)):
            return hit[4]
        out = self.node(e, mask)
        self.memo[id(e)] = (e, mask, self.shape, env, out)
        return out

    def node(self, e: Expr, mask) -> np.ndarray:
        """``e`` evaluated by its own rule (its children through :meth:`eval`)."""
        method = getattr(self, "e_" + type(e).__name__, None)
        if method is None:
            raise InternalError(f"the evaluator does not know the node {type(e).__name__} "
                                f"(in {self.tensor.name})")
        out = method(e, mask)
        if out.dtype != np.dtype(e.dtype):
            out = out.astype(e.dtype)
        return out

    def collect(self, e: Expr):
        """``(value, E)`` of reduction-free ``e`` on every point: its value and where it would
        fail (None: nowhere), computed once per shape and values of its free variables."""
        env = tuple(self.env.get(v) for v in free_var_ids(e, self.free))
        hit = self.collected.get(id(e))
        if hit is not None and hit[0] is e and hit[1] == self.shape and all(a is b for a, b in zip(hit[2], env)):
            return hit[3], hit[4]
        outer, outer_errors = self.collecting, self.errors
        self.collecting, self.errors = True, None
        try:
            value = self.node(e, None)
            errors = self.errors
        finally:
            self.collecting, self.errors = outer, outer_errors
        self.collected[id(e)] = (e, self.shape, env, value, errors)
        return value, errors

    def failing(self, bad, raise_error) -> None:
        """A division by zero or a read out of bounds at the points ``bad`` (already under the
        mask): recorded while collecting, raised otherwise."""
        if not np.any(bad):
            return
        if self.collecting:
            self.errors = bad if self.errors is None else np.logical_or(self.errors, bad)
            return
        raise_error()

    def reduction_free(self, e: Expr) -> bool:
        """Whether no reduction is at or below ``e`` (each node decided once)."""
        known = self.reduce_free
        hit = known.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        stack = [(e, False)]
        while stack:
            n, done = stack.pop()
            hit = known.get(id(n))
            if hit is not None and hit[0] is n:
                continue
            kids = [c for c in n.children() if isinstance(c, Expr)]
            if done:
                known[id(n)] = (n, not isinstance(n, Reduce) and all(known[id(c)][1] for c in kids))
            else:
                stack.append((n, True))
                stack.extend((c, False) for c in kids)
        return known[id(e)][1]

    # -- leaves ---------------------------------------------------------------
    def e_Const(self, e: Const, mask):
        return np.array(e.value, dtype=e.dtype)

    def e_Var(self, e: Var, mask):
        try:
            return self.env[id(e)]
        except KeyError:
            raise InternalError(f"variable {e.name} is not bound while evaluating "
                                f"{self.tensor.name}") from None

    e_ReduceAxis = e_Var
    e_SizeVar = e_Var  # bound in env by a loop program's interpreter (graphs are specialized first)

    # -- arithmetic and logic -------------------------------------------------------
    def e_Binary(self, e: Binary, mask):
        a = self.eval(e.a, mask)
        if e.op in ("and", "or"):
            b_mask = _and(mask, a if e.op == "and" else np.logical_not(a))
            b = self.eval(e.b, b_mask)
            return np.logical_and(a, b) if e.op == "and" else np.logical_or(a, b)
        b = self.eval(e.b, mask)
        if e.op in ("floordiv", "floormod"):
            zero = b == 0
            if np.any(zero):
                def fail():
                    raise UserError(f"integer division by zero in {expr_to_str(e)} "
                                    f"(compute {self.tensor.name})")
                self.failing(_and(mask, zero), fail)
                b = np.where(zero, 1, b)
        return ops.BINARY_OPS[e.op].numpy(a, b)

    def e_Unary(self, e: Unary, mask):
        a = self.eval(e.a, mask)
        return np.negative(a) if e.op == "neg" else np.logical_not(a)

    def e_Compare(self, e: Compare, mask):
        return _COMPARE[e.op](self.eval(e.a, mask), self.eval(e.b, mask))

    def e_Select(self, e: Select, mask):
        cond = self.eval(e.cond, mask)
        t = self.eval(e.t, _and(mask, cond))
        f = self.eval(e.f, _and(mask, np.logical_not(cond)))
        return np.where(cond, t, f)

    def e_Call(self, e: Call, mask):
        args = [self.eval(a, mask) for a in e.args]
        return ops.intrinsic(e.name).numpy(*args)

    def e_Cast(self, e: Cast, mask):
        a = self.eval(e.a, mask)
        if dtypes.is_int(e.dtype) and dtypes.is_float(e.a.dtype):
            a = np.trunc(a)
        return a.astype(e.dtype)

    # -- memory -----------------------------------------------------------------
    def e_Read(self, e: Read, mask):
        arr = self.values.get(id(e.tensor))
        if arr is None:
            raise InternalError(f"tensor {e.tensor.name} read before it was computed")
        idx = [self.eval(i, mask) for i in e.indices]
        safe = []
        bad = None
        for d, ix in enumerate(idx):
            n = arr.shape[d]  # the tensor's extent (bound, when it is a size expression)
            if ix.size and (ix.min() < 0 or ix.max() >= n):
                ok = (ix >= 0) & (ix < n)
                miss = _and(mask, np.logical_not(ok))
                if np.any(miss):
                    bad = miss if bad is None else bad | miss
                ix = np.where(ok, ix, 0)
            elif ix.size == 0 and n == 0:
                ix = np.zeros_like(ix)
            safe.append(ix)
        if bad is not None:
            self.failing(bad, lambda: self._out_of_bounds(e, idx, bad))
        if not safe:
            return np.asarray(arr[()])
        if arr.size == 0:  # an empty tensor: every point of this read was guarded off
            return np.zeros(np.broadcast_shapes(*[ix.shape for ix in safe]), dtype=arr.dtype)
        return arr[tuple(safe)]

    def _out_of_bounds(self, e: Read, idx, bad):
        full = np.broadcast_shapes(bad.shape, *[i.shape for i in idx])
        point = tuple(np.argwhere(np.broadcast_to(bad, full))[0])
        at = tuple(int(np.broadcast_to(i, full)[point]) for i in idx)
        raise UserError(f"read {expr_to_str(e)} in compute {self.tensor.name} reaches index "
                        f"{list(at)} outside tensor {e.tensor.name} of shape {list(e.tensor.shape)}")

    # -- reductions ------------------------------------------------------------------
    def e_Reduce(self, e: Reduce, mask):
        outer_shape = self.shape
        solutions, rest = plan_reduction(e.axes, e.where)
        where = None
        for c in rest:
            where = c if where is None else Binary("and", where, c)
        ranges, varying = self._axis_ranges(e.axes, solutions, mask, outer_shape)
        comb = ops.reduction(e.combiner)
        if comb.indexed:
            return self._indexed_reduce(e, comb, solutions, where, ranges, varying, mask, outer_shape)
        ident = np.array(comb.identity(e.dtype), dtype=e.dtype)
        result = None
        limit = max(1, CHUNK_ELEMENTS // max(1, int(np.prod(outer_shape, dtype=np.int64))))
        for box in _boxes(ranges, limit):
            inner_mask, sizes = self._enter(e.axes, solutions, box, varying, where, mask, outer_shape)
            body = self.eval(e.body, inner_mask)
            full = np.broadcast_shapes(body.shape, sizes + (1,) * len(outer_shape),
                                       () if inner_mask is None else np.shape(inner_mask))
            body = np.broadcast_to(body, full)
            if inner_mask is not None:
                body = np.where(np.broadcast_to(inner_mask, full), body, ident)
            part = np.asarray(comb.ufunc.reduce(body, axis=tuple(range(len(e.axes)))), dtype=e.dtype)
            self._leave(e.axes, outer_shape)
            result = part if result is None else comb.ufunc(result, part)
        return ident if result is None else result

    def _indexed_reduce(self, e: Reduce, comb, solutions, where, ranges, varying, mask, outer_shape):
        """A (value, index) reduction (argmax): the pairs ``(body, axis)`` of each box reduced
        by the record, the boxes' winners combined by it."""
        axes = tuple(range(len(e.axes)))
        best = None
        limit = max(1, CHUNK_ELEMENTS // max(1, int(np.prod(outer_shape, dtype=np.int64))))
        for box in _boxes(ranges, limit):
            inner_mask, sizes = self._enter(e.axes, solutions, box, varying, where, mask, outer_shape)
            body = np.asarray(self.eval(e.body, inner_mask))
            index = np.asarray(self.eval(e.axes[0], inner_mask))
            full = np.broadcast_shapes(body.shape, index.shape, sizes + (1,) * len(outer_shape),
                                       () if inner_mask is None else np.shape(inner_mask))
            valid = np.ones(full, bool) if inner_mask is None else np.broadcast_to(inner_mask, full)
            part = comb.reduce_pairs(np.broadcast_to(body, full), np.broadcast_to(index, full), valid, axes)
            self._leave(e.axes, outer_shape)
            best = part if best is None else comb.combine(best, part)
        if best is None:
            return np.array(comb.identity(e.dtype), dtype=e.dtype)
        return np.asarray(best[1], dtype=e.dtype)

    def run_scatter(self) -> np.ndarray:
        """``T = 0; T[indices] += value`` over the scatter's domain (np.add.at semantics)."""
        op: ScatterOp = self.tensor.op
        out = np.zeros(self.tensor.shape, dtype=self.tensor.dtype)
        self.shape = ()
        solutions = [None] * len(op.axes)
        ranges, varying = self._axis_ranges(op.axes, solutions, None, ())
        for box in _boxes(ranges, CHUNK_ELEMENTS):
            mask, sizes = self._enter(op.axes, solutions, box, varying, op.where, None, ())
            full = np.broadcast_shapes(sizes, () if mask is None else np.shape(mask))
            sel = np.ones(full, dtype=bool) if mask is None else np.broadcast_to(mask, full)
            idx = [np.broadcast_to(self.eval(i, mask), full)[sel] for i in op.indices]
            for d, ix in enumerate(idx):
                bad = (ix < 0) | (ix >= self.tensor.shape[d])
                if np.any(bad):
                    raise UserError(f"scatter into {self.tensor.name}: index {d} takes the value "
                                    f"{int(ix[bad][0])}, outside [0, {self.tensor.shape[d]}) "
                                    f"({expr_to_str(op.indices[d])})")
            vals = np.broadcast_to(self.eval(op.value, mask), full)[sel]
            np.add.at(out, tuple(idx), vals)
            self._leave(op.axes, ())
        return out

    # -- iteration domains shared by reductions and scatters -----------------------
    def _axis_ranges(self, axes, solutions, mask, outer_shape):
        """The bounding range of each enumerated axis ((0, 1) for a pinned one), and which
        axes have bounds that vary (checked per point).

        Like :meth:`_enter`, each axis's value and bounds are evaluated only where the earlier
        axes lie in their ranges: a pinned axis's solution (``r := I[k]`` after ``k := i``
        with ``0 <= k < 3``) may read out of bounds at points outside the domain, and that is
        not an error. The ranges are the extremes of the bounds over those points."""
        m = len(axes)
        ranges, varying = [], []
        inner = mask
        for t, ax in enumerate(axes):
            # bounds may depend on outer variables and on earlier axes of this domain
            self.shape = tuple(hi - lo for lo, hi in ranges) + (1,) * (m - t) + tuple(outer_shape)
            if solutions[t] is not None:
                ranges.append((0, 1))
                value = self.eval(solutions[t], inner)
                self.env[id(ax)] = value
                lo, hi = self.eval(ax.lo, inner), self.eval(ax.hi, inner)
                self._check_ragged(ax, lo, hi, inner)
                inner = _and(inner, (value >= lo) & (value < hi))
                continue
            lo, hi = self.eval(ax.lo, inner), self.eval(ax.hi, inner)
            self._check_ragged(ax, lo, hi, inner)
            lo_min, hi_max = _masked_extreme(lo, inner, np.min), _masked_extreme(hi, inner, np.max)
            if lo_min is None or hi_max is None:  # no point of the domain: nothing to enumerate
                lo_min = hi_max = 0
            ranges.append((lo_min, max(lo_min, hi_max)))
            self._bind_axis(ax, t, m, ranges[t], outer_shape)
            if lo.ndim or hi.ndim:
                varying.append(t)
                later = [e for a, sol in zip(axes[t + 1:], solutions[t + 1:])
                         for e in ((a.lo, a.hi) if sol is None else (a.lo, a.hi, sol))]
                if any(v is ax for e in later for v in free_vars(e)):
                    value = self.env[id(ax)]  # later axes see this one's value: only its range
                    inner = _and(inner, (value >= lo) & (value < hi))
                else:  # only whether the range is empty matters (and stays small)
                    inner = _and(inner, lo < hi)
        self._unbind(axes)
        self.shape = outer_shape
        return ranges, varying

    def _check_ragged(self, ax, lo, hi, mask):
        """A ragged axis (a bound reads a tensor: ``range(rowptr[v], rowptr[v + 1])``) must not
        run backwards at a point of the domain: a decreasing row pointer is an error."""
        if not (reads_in(ax.lo) or reads_in(ax.hi)):
            return
        bad = _and(mask, lo > hi)
        if bad is None or not np.any(bad):
            return
        full = np.broadcast_shapes(np.shape(bad), np.shape(lo), np.shape(hi))
        point = tuple(np.argwhere(np.broadcast_to(bad, full))[0])
        a, b = int(np.broadcast_to(lo, full)[point]), int(np.broadcast_to(hi, full)[point])
        raise UserError(f"in compute {self.tensor.name}: the ragged range of reduce axis {ax.name}, "
                        f"range({expr_to_str(ax.lo)}, {expr_to_str(ax.hi)}), runs backwards from {a} to "
                        f"{b}: its bounds must not decrease (is the row pointer sorted?)")

    def _enter(self, axes, solutions, ranges, varying, where, mask, outer_shape):
        """Bind ``axes`` to ``ranges`` (pinned ones to their values); return the mask of the
        domain's points and its sizes."""
        m = len(axes)
        sizes = tuple(hi - lo for lo, hi in ranges)
        self.shape = sizes + tuple(outer_shape)
        inner_mask = mask
        for t, ax in enumerate(axes):
            if solutions[t] is None:
                self._bind_axis(ax, t, m, ranges[t], outer_shape)
                if t in varying:
                    value = self.env[id(ax)]
                    lo, hi = self.eval(ax.lo, inner_mask), self.eval(ax.hi, inner_mask)
                    inner_mask = _and(inner_mask, (value >= lo) & (value < hi))
            else:
                value = self.eval(solutions[t], inner_mask)
                self.env[id(ax)] = value
                lo, hi = self.eval(ax.lo, inner_mask), self.eval(ax.hi, inner_mask)
                inner_mask = _and(inner_mask, (value >= lo) & (value < hi))
        if where is not None:
            inner_mask = _and(inner_mask, self.eval(where, inner_mask))
        return inner_mask, sizes

    def _leave(self, axes, outer_shape):
        self._unbind(axes)
        self.shape = tuple(outer_shape)

    def _bind_axis(self, ax, t, m, rng, outer_shape):
        shape = [1] * (m + len(outer_shape))
        shape[t] = rng[1] - rng[0]
        self.env[id(ax)] = np.arange(rng[0], rng[1], dtype=np.int64).reshape(shape)

    def _unbind(self, axes):
        for ax in axes:
            self.env.pop(id(ax), None)


@deep_entry
def evaluate(tensors: Sequence[Tensor], feed: Dict[Tensor, object], sizes=None) -> List[np.ndarray]:
    """Compute ``tensors`` with numpy from the placeholder values in ``feed``.

    Returns one new array per tensor. Placeholders the tensors do not need may
    be present in ``feed`` and are ignored; missing ones raise a UserError.
    Size variables (``tg.var``) are bound from the shapes of the fed arrays;
    ``sizes`` (a dict from a size variable or its name to an int) gives those
    no input shape states.
    """
    single = isinstance(tensors, Tensor)
    if single:
        raise UserError("tg.evaluate takes a list of tensors: tg.evaluate([T], feed)")
    tensors = list(tensors)
    for t in tensors:
        if not isinstance(t, Tensor):
            raise UserError(f"tg.evaluate expects tensors, got {t!r}")
    if not isinstance(feed, dict):
        raise UserError(f"feed must be a dict from placeholder tensors to arrays, got {type(feed).__name__}")
    for key in feed:
        if not isinstance(key, Tensor):
            raise UserError(f"feed keys must be placeholder tensors, got {key!r}")
        if not key.is_placeholder:
            raise UserError(f"feed key {key.name} is not a placeholder; it is computed from other tensors")
    values: Dict[int, np.ndarray] = {}
    order = topo_order(tensors)
    missing = [t.name for t in order if t.is_placeholder and t not in feed]
    if missing:
        raise UserError(f"no value in the feed for placeholder(s) {', '.join(missing)}")
    symbolic = size_vars.graph_size_vars(tensors)
    if symbolic:
        return _evaluate_at_sizes(tensors, feed, order, symbolic, sizes)
    with np.errstate(all="ignore"):
        for t in order:
            if isinstance(t.op, PlaceholderOp):
                values[id(t)] = check_feed(t, feed[t])
            elif isinstance(t.op, ComputeOp):
                values[id(t)] = _ExprEvaluator(values, t).run()
            elif isinstance(t.op, ScatterOp):
                values[id(t)] = _ExprEvaluator(values, t).run_scatter()
            else:
                raise InternalError(f"the evaluator does not know the op of {t.name}: {type(t.op).__name__}")
    return [np.array(values[id(t)], copy=True) for t in tensors]


def _evaluate_at_sizes(tensors, feed, order, symbolic, given) -> List[np.ndarray]:
    """A symbolic graph: bind its sizes from the fed shapes, then evaluate the fixed-shape graph."""
    known = size_vars.named_sizes(symbolic, given)
    arrays = {}
    declared = []
    for t in order:
        if t.is_placeholder:
            v = feed[t]
            arrays[id(t)] = v if isinstance(v, np.ndarray) else np.asarray(v)
            declared.append((t.name, t.shape, arrays[id(t)].shape))
    bound = size_vars.bind_sizes(declared, known)
    unbound = [v.name for v in symbolic if v not in bound]
    if unbound:
        raise UserError(f"no input shape states the size(s) {', '.join(unbound)}: give them with "
                        f"sizes={{{', '.join(repr(n) + ': ...' for n in unbound)}}}")
    outs, new = size_vars.specialize(tensors, bound)
    fixed_feed = {new[id(t)]: (feed[t] if isinstance(feed[t], np.ndarray) else arrays[id(t)])
                  for t in order if t.is_placeholder}
    return evaluate(outs, fixed_feed)


def expression_evaluator(values: Dict[int, np.ndarray], where: str = "an expression"):
    """A function ``value(e, env)`` giving expression ``e`` (reductions included) with the
    evaluator's own semantics, ``env`` binding variables (``id(var)`` to a numpy integer or
    an array that broadcasts) and ``values`` tensors (``id(tensor)`` to its array, read when
    the function runs). Used to check loop programs against the evaluator's meaning of
    every operation; ``where`` names the context in errors."""
    ev = _ExprEvaluator(values, Tensor(where, (), "bool", ComputeOp((), Const(True, "bool"))))

    def value(e: Expr, env: Dict[int, object]):
        ev.env = env
        ev.shape = ()
        return ev.eval(e, None)
    return value
