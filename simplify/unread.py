"""Points no reader uses: a masked tensor written only where its readers look.

After :mod:`.zeros` has carried a mask across tensors, a masked tensor of the full shape,
``P[i, j] = if_then_else((j <= i) & (i - j < w), e, 0)``, is used only inside the band: by
sums whose domain is the band, and under guards that are the band. Its zeros outside are
written and never used. :func:`written_regions` finds, for each such tensor ``T`` of a
graph, the region ``R(T)`` (the quasi-affine comparisons of its top-level condition) when
every read of ``T`` is used only at points of ``R(T)``; the kernel then writes ``T`` only
there (:func:`codegen.schedule.definition` puts its initialization nest under the guard
``R(T)``, which :mod:`codegen.triangles` and :mod:`codegen.guard_ranges` turn into loop
ranges, and :mod:`codegen.triangles` may run a block of an accumulating nest as a whole box,
storing values no one reads outside ``R(T)``), and :func:`simplify.count.iterations` counts
only the points of ``R(T)``.

Where a read is used. A read ``T[g]`` in a reader ``U``'s body is used only under the
conjunction of:

- ``U``'s axes within its shape, and ``U``'s own region when it has one (``U`` is decided
  first: consumers before producers);
- the condition of each ``if_then_else`` whose taken branch holds the read;
- for a read inside a reduction, the reduction's axes within their bounds and its ``where``.

The read is covered when that conjunction implies ``R(T)[axes := g]`` (isl decides; a
condition isl cannot represent, a test on data, is left out of the conjunction, which only
weakens it). The kernel may still *compute* such a read elsewhere (both branches of a
select evaluated in a vector, a nested reduction lifted into a tensor computed at every
point, :mod:`te_grad.lift`), from a point of ``T`` that holds whatever its buffer held; the
value computed there is then never used. That is harmless only for a value that stays a
float and is never taken to be 0 by a product with a structural zero: so a tensor read in
an index, a loop bound, a reduction's ``where``, by a scatter, or under a cast to an integer
or a bool (an address, a trip count, or LLVM's undefined result of converting a float out of
range) is never a candidate, and :mod:`codegen.packing` sums no term over a padded hull when
a factor reads one, the tensor a copy's readers read instead (:func:`read_through`), or a
lifted reduction (``0 * NaN`` is NaN). A body that shares subexpressions (a DAG) is walked
once per node and context.

Not candidates either: an output or a kept tensor (its every point is returned), and a
tensor that is not a float compute whose body is ``if_then_else(c, e, constant)`` with a
*mask* among ``c``'s conjuncts: a quasi-affine comparison relating two loop variables (a
triangle ``j <= i``, a band ``i - j < w``), which the schedule turns into loop ranges
(:mod:`codegen.triangles`); ``R(T)`` is then ``c``'s quasi-affine comparisons. A border (each
comparison on one axis) or a disjunction would only become a test at every point.

A tensor so narrowed that only copies another one on its region (:func:`read_through`) is
not computed at all: its readers read the other tensor.

Promise: for each ``(T, R)`` returned, no value of the graph's outputs depends on a point of
``T`` outside ``R``. The loop interpreter (:mod:`codegen.interpret`) fills intermediates with
NaN, and the compile option ``poison`` fills the kernel's when they are allocated, so that a
read outside shows in the outputs of a kernel's first call; the tests run with both, the
fuzzer's kernels with ``poison``.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Set

from te_grad import dsl, dtypes
from te_grad.graph import free_vars, topo_order
from te_grad.ir import (Binary, Call, Cast, Compare, ComputeOp, Const, Expr, Read, Reduce,
                        ScatterOp, SizeVar, Select, Tensor, Unary, reads_in, structurally_equal)
from te_grad.transform import substitute

from .affine import conjuncts, decided
from .zeros import implies


def _region(t: Tensor) -> Optional[Expr]:
    """The candidate region of ``t``: the quasi-affine conjuncts of its top-level condition."""
    op = t.op
    if not isinstance(op, ComputeOp) or not dtypes.is_float(t.dtype):
        return None
    body = op.body
    if not isinstance(body, Select) or not isinstance(body.f, Const):
        return None
    kept = [c for c in conjuncts(body.cond) if isinstance(c, Compare) and not reads_in(c) and decided(c)]
    if not any(len({id(v) for v in free_vars(c) if not isinstance(v, SizeVar)}) >= 2 for c in kept):
        return None  # no mask: a border or a disjunction is no loop range, only a test at every point
    return dsl.all(*kept)


class _Reads:
    """Every read of the candidates in a body, with the conjuncts it is used under; a
    candidate read anywhere but in a value is struck."""

    def __init__(self, candidates: Dict[int, Expr]):
        self.candidates = candidates
        self.uses: Dict[int, Dict[tuple, tuple]] = {}  # per tensor: one use per (indices, context)
        self.struck: Set[int] = set()
        self.seen: Set[tuple] = set()  # (node, context) walked: a DAG body is walked once per context
        self.contexts: List[tuple] = []  # kept alive, so that no id in ``seen`` is reused

    def strike(self, e: Optional[Expr]):
        if e is not None:
            for r in reads_in(e):
                self.struck.add(id(r.tensor))

    def walk(self, e: Expr, ctx: tuple):
        key = (id(e),) + tuple(map(id, ctx))
        if key in self.seen:
            return
        self.seen.add(key)
        self.contexts.append(ctx)
        if isinstance(e, Read):
            if id(e.tensor) in self.candidates:
                use = tuple(map(id, e.indices)) + (None,) + key[1:]
                self.uses.setdefault(id(e.tensor), {})[use] = (e.indices, ctx)
            for i in e.indices:
                self.strike(i)
        elif isinstance(e, Select):
            self.walk(e.cond, ctx)
            self.walk(e.t, ctx + tuple(conjuncts(e.cond)))
            self.walk(e.f, ctx)
        elif isinstance(e, Reduce):
            for ax in e.axes:
                self.strike(ax.lo)
                self.strike(ax.hi)
            self.strike(e.where)
            own = tuple(c for ax in e.axes for c in (dsl.compare("ge", ax, ax.lo), dsl.compare("lt", ax, ax.hi)))
            self.walk(e.body, ctx + own + tuple(conjuncts(e.where)))
        elif isinstance(e, Cast):
            if not dtypes.is_float(e.dtype):
                self.strike(e.a)
            else:
                self.walk(e.a, ctx)
        elif isinstance(e, (Binary, Compare)):
            self.walk(e.a, ctx)
            self.walk(e.b, ctx)
        elif isinstance(e, Unary):
            self.walk(e.a, ctx)
        elif isinstance(e, Call):
            for a in e.args:
                self.walk(a, ctx)
        elif reads_in(e):  # a node this walk does not know: its reads are not values it can follow
            self.strike(e)


def _covered(region: Expr, t: Tensor, indices, ctx: tuple) -> bool:
    want = substitute(region, dict(zip(t.op.axes, indices)))
    have = [c for c in ctx if not reads_in(c) and decided(c)]
    return implies(dsl.all(*have) if have else dsl.const(True), want)


def written_regions(outputs: Iterable[Tensor], keep: Iterable[int] = ()) -> Dict[int, Expr]:
    """``{id(T): R}`` for each tensor ``T`` behind ``outputs`` that need only be written at the
    points of ``R`` (see the module docstring); ``keep``: ids of tensors returned too."""
    outputs = list(outputs)
    order = topo_order(outputs)
    returned = {id(t) for t in outputs} | set(keep)
    candidates = {id(t): r for t in order if id(t) not in returned for r in [_region(t)] if r is not None}
    if not candidates:
        return {}
    scattered: Set[int] = set()  # read by a scatter: its indices, value or where
    readers: Dict[int, List[Tensor]] = {}
    for u in order:
        if isinstance(u.op, ScatterOp):
            scattered |= {id(x) for x in u.op.inputs()}
        elif isinstance(u.op, ComputeOp):
            for x in u.op.inputs():
                readers.setdefault(id(x), []).append(u)
    decided_regions: Dict[int, Expr] = {}
    for t in reversed(order):  # consumers first: a reader's own region is known when its producers are judged
        region = candidates.get(id(t))
        if region is None or id(t) in scattered:
            continue
        ok = True
        for u in readers.get(id(t), ()):
            box = tuple(c for ax, n in zip(u.op.axes, u.shape)
                        for c in (dsl.compare("ge", ax, dsl.const(0)),
                                  dsl.compare("lt", ax, n if isinstance(n, Expr) else dsl.const(n))))
            own = tuple(conjuncts(decided_regions.get(id(u))))
            one = _Reads({id(t): region})
            one.walk(u.op.body, box + own)
            uses = one.uses.get(id(t), {}).values()
            if id(t) in one.struck or not all(_covered(region, t, idx, ctx) for idx, ctx in uses):
                ok = False
                break
        if ok:
            decided_regions[id(t)] = region
    return decided_regions


def read_through(outputs: Iterable[Tensor], regions: Dict[int, Expr]) -> Dict[int, Tensor]:
    """``{id(T): X}`` for each tensor ``T`` of ``regions`` whose body is ``if_then_else(c,
    X[axes], constant)`` with ``c`` exactly its region's comparisons and ``X`` of its shape and
    dtype, read at its own point: on its region ``T`` is ``X``, and no reader uses ``T``
    elsewhere, so its readers may read ``X`` and ``T`` need not be computed (a masked copy,
    ``masked = if_then_else(band, scores, 0)`` when ``scores`` is already masked). ``X`` is
    followed through such copies to the first tensor that is none. Its reads stay in its own
    region: the walk that gave ``T`` its region covered ``T``'s read of ``X`` under ``c``."""
    out: Dict[int, Tensor] = {}
    for t in topo_order(list(outputs)):  # producers first: a copy of a copy resolves at once
        region = regions.get(id(t))
        if region is None:
            continue
        body = t.op.body
        want = conjuncts(region)
        have = conjuncts(body.cond)
        if len(have) != len(want) or not all(any(structurally_equal(c, w) for w in want) for c in have):
            continue
        r = body.t
        if not isinstance(r, Read) or r.tensor.shape != t.shape or r.tensor.dtype != t.dtype or \
                tuple(map(id, r.indices)) != tuple(map(id, t.op.axes)):
            continue
        out[id(t)] = out.get(id(r.tensor), r.tensor)
    return out
