"""Congruence classes: output axes whose values enter ``//`` and ``%`` by small constants.

The input gradient of a stride-2 convolution reads ``head[h, w]`` for
``h`` from ``j // 2`` to ``(j + 1) // 2``: its bounds alternate with the
parity of the output index ``j``, so no loop order vectorizes it. Writing
``j = 2*a + p`` for each class ``p`` in ``{0, 1}`` makes every bound a plain
function of ``a`` (``(2*a + 1) // 2 = a``, see :mod:`simplify.linear`); each
class is then an ordinary dense loop nest over ``a`` whose store is strided.
A max-pooling gradient ``dX[j] = ... M[j // 2] ...`` is split the same way,
with the classes of its innermost axis as consecutive statements of one loop,
so the vectorizer sees unit-stride reads and interleaved stores.

The passes: :func:`split_classes` (a stage's reduction terms) and
:func:`interleave_classes` (its initialization nest).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence

from simplify.linear import coefficient, normalize
from te_grad import dsl
from te_grad.graph import free_vars
from te_grad.ir import Binary, Const, Expr, ReduceAxis, Var
from te_grad.transform import substitute
from te_grad.intervals import interval
from te_grad.visitor import Mutator, Visitor

from .loopir import Loop, Nest, Stage, nest, rewrite_nests
from .pieces import constant_share

#: the largest modulus split into classes, and the most classes a term is split into
MAX_MODULUS = 4
MAX_CLASSES = 16


class _DivisorUses(Visitor):
    """For each output axis, the moduli it enters through ``// c`` and ``% c``."""

    def __init__(self, axes: Sequence[Var]):
        self.axes = list(axes)
        self.found: Dict[int, List[int]] = {}

    def visit_Binary(self, node: Binary):
        if node.op in ("floordiv", "floormod") and isinstance(node.b, Const) and int(node.b.value) > 1:
            c = int(node.b.value)
            for a in self.axes:
                k = coefficient(node.a, a)
                if k:
                    self.found.setdefault(id(a), []).append(c // math.gcd(abs(k), c))
        self.generic_visit(node)

    def visit_ReduceAxis(self, node):
        pass  # its bounds are looked at only when passed explicitly


def moduli(axes: Sequence[Var], shape: Sequence[int], exprs: Sequence[Optional[Expr]],
           exclude: Sequence[Var] = ()) -> Dict[int, int]:
    """``{id(axis): m}`` for the axes of ``axes`` worth splitting into ``m`` classes for ``exprs``.

    ``m`` is the least common multiple of what the axis is divided by (its
    coefficient taken out), at most :data:`MAX_MODULUS`, dividing the axis extent;
    the axes in ``exclude`` (the parallel one) are never split."""
    uses = _DivisorUses(axes)
    for e in exprs:
        if e is not None:
            uses.visit(e)
    out: Dict[int, int] = {}
    total = 1
    for a, n in zip(axes, shape):
        ms = uses.found.get(id(a))
        if not ms or any(a is x for x in exclude):
            continue
        m = math.lcm(*ms)
        if isinstance(n, Expr):  # an extent known at run time is never split into classes
            continue
        if 1 < m <= MAX_MODULUS and n % m == 0 and total * m <= MAX_CLASSES:
            out[id(a)] = m
            total *= m
    return out


@dataclass
class ClassView:
    """One congruence class: loops over ``axes`` (extents ``shape``) store to ``store``."""
    axes: List[Var]
    shape: List[int]
    store: List[Expr]
    mapping: Dict[Var, Expr]  # original axis -> m * a + p


def class_views(axes: Sequence[Var], shape: Sequence[int], mods: Dict[int, int]) -> List[ClassView]:
    """Every combination of residues of the axes in ``mods`` (one view if ``mods`` is empty)."""
    split = [(a, mods[id(a)]) for a in axes if id(a) in mods]
    new_axes = {id(a): Var(a.name + "c") for a, _ in split}
    views = []
    for residues in itertools.product(*[range(m) for _, m in split]):
        mapping = {a: new_axes[id(a)] * m + p if m > 1 else a for (a, m), p in zip(split, residues)}
        mapping = {a: normalize(e) for a, e in mapping.items()}
        views.append(ClassView(
            [new_axes.get(id(a), a) for a in axes],
            [n // mods[id(a)] if id(a) in mods else n for a, n in zip(axes, shape)],
            [mapping.get(a, a) for a in axes],
            mapping))
    return views


def in_class(e: Optional[Expr], view: ClassView) -> Optional[Expr]:
    """``e`` restricted to the class of ``view``, its index arithmetic folded."""
    if e is None:
        return None
    return normalize(substitute(e, view.mapping)) if view.mapping else e


def reduce_axes_in_class(red_axes: Sequence[ReduceAxis], value: Expr, cond: Optional[Expr],
                         view: ClassView):
    """The reduction ``(axes, value, cond)`` of one class, each axis whose lower bound is a
    linear function of the output loops shifted to start at 0 (so that reads step with
    the output loops and the bounds become constant inside the domain)."""
    loop_ids = {id(a) for a in view.axes}
    # a run-time extent has no range: what it decides stays as written
    ranges = {id(a): (0, n - 1) for a, n in zip(view.axes, view.shape) if not isinstance(n, Expr)}
    rename: Dict[Var, Expr] = dict(view.mapping)
    axes: List[ReduceAxis] = []
    for r in red_axes:
        lo = _decided(normalize(substitute(r.lo, rename)), ranges)
        hi = _decided(normalize(substitute(r.hi, rename)), ranges)
        if not isinstance(lo, Const) and _linear_in(lo, loop_ids):
            shifted = ReduceAxis(r.name, r.dtype, dsl.const(0, r.lo.dtype), normalize(hi - lo))
            rename[r] = lo + shifted
            axes.append(shifted)
        elif lo is r.lo and hi is r.hi:
            axes.append(r)
        else:
            new = ReduceAxis(r.name, r.dtype, lo, hi)
            rename[r] = new
            axes.append(new)
    value = normalize(substitute(value, rename))
    cond = normalize(substitute(cond, rename)) if cond is not None else None
    return axes, value, cond


class _Decided(Mutator):
    """``maximum``/``minimum`` replaced by the operand that wins wherever the loops run."""

    def __init__(self, ranges):
        super().__init__()
        self.ranges = ranges

    def visit_Binary(self, node: Binary):
        node = self.generic_visit(node)
        if node.op not in ("max", "min"):
            return node
        a, b = interval(node.a, self.ranges), interval(node.b, self.ranges)
        if a is None or b is None:
            return node
        if node.op == "max":
            return node.a if a[0] >= b[1] else node.b if b[0] >= a[1] else node
        return node.a if a[1] <= b[0] else node.b if b[1] <= a[0] else node


def _decided(e: Expr, ranges) -> Expr:
    """``e`` with each ``maximum``/``minimum`` whose winner the output ``ranges`` decide
    replaced by that operand (a padded convolution's bounds, once a copy of its gradient
    is inlined, keep ``maximum(0, a)`` with ``a >= 0`` everywhere: linear, in fact)."""
    return _Decided(ranges).visit(e)


def _linear_in(e: Expr, loop_ids) -> bool:
    """True if ``e`` is ``+``, ``-`` and constant multiples of the output loop variables."""
    vars_ = free_vars(e)
    if not vars_ or any(id(v) not in loop_ids for v in vars_):
        return False
    return all(coefficient(e, v) is not None for v in vars_)


# -- the passes -------------------------------------------------------------------------------
def class_moduli(axes, shape, red_axes: Sequence[ReduceAxis], body: Expr, cond: Optional[Expr],
                 parallel: Optional[Var]) -> Dict[int, int]:
    """The congruence classes to split a reduction term into: axes entering ``//`` or ``%``
    in its body or guard, and in its reduce bounds when cutting the output domain into
    pieces leaves most of it without constant bounds (they alternate with a parity)."""
    used = [cond, body]
    if constant_share(axes, shape, red_axes) < 0.5:
        used += [b for r in red_axes for b in (r.lo, r.hi)]
    return moduli(axes, shape, used, exclude=[parallel] if parallel is not None else [])


def split_classes(stage: Stage) -> Stage:
    """Each accumulating nest over a whole output domain as one nest per congruence class of
    :func:`class_moduli` (the stage's parallel axis never split), reduce axes shifted by
    :func:`reduce_axes_in_class`; a class its guard excludes gets no nest.

    Promises: the classes partition the output domain and each element's terms are the
    same (``j = m*a + p`` substituted and folded exactly, see :mod:`simplify.linear`)."""
    def split(n: Nest):
        full = n.whole_outputs(sizes=True) if n.accumulates else None
        if full is None:
            return None
        axes, shape = full
        red_axes, value, cond = n.reductions, n.store.value, n.cond
        mods = class_moduli(axes, shape, red_axes, value, cond, stage.parallel_axis)
        if not mods and any(isinstance(e, Expr) for e in shape):
            return None  # extents known at run time and no classes: the nest stays as it is
        out = []
        for view in class_views(axes, shape, mods):
            if view.mapping:
                axes_c, value_c, cond_c = reduce_axes_in_class(red_axes, value, cond, view)
            else:
                axes_c, value_c, cond_c = list(red_axes), value, cond
            if isinstance(cond_c, Const):
                if not cond_c.value:
                    continue  # the class receives nothing from this term
                cond_c = None
            loops = tuple(Loop(a, dsl.const(0), m if isinstance(m, Expr) else dsl.const(m), ())
                          for a, m in zip(view.axes, view.shape)) + \
                tuple(Loop(r, r.lo, r.hi, ()) for r in axes_c)
            out.append(Nest(loops, cond_c, replace(n.store, indices=tuple(view.store), value=value_c)).stmt())
        return out
    return rewrite_nests(stage, split)


def interleave_classes(stage: Stage) -> Stage:
    """The initialization nest, when its innermost loop enters ``// m`` or ``% m`` (a pooling
    gradient, an upsampling), run over ``m`` times fewer values with one store per class in
    its body: unit-stride reads, interleaved stores (which LLVM vectorizes).

    Promises: each element is stored once, with its own value (the class stores of one
    iteration write distinct elements)."""
    done = []

    def split(n: Nest):
        if done or n.accumulates or n.reductions or not n.loops or n.cond is not None:
            return None
        done.append(True)
        inner = n.loops[-1]
        if not (isinstance(inner.lo, Const) and inner.lo.value == 0 and isinstance(inner.hi, Const)):
            return None
        extent = [int(inner.hi.value)]
        par = stage.parallel_axis
        mods = moduli([inner.var], extent, [n.store.value], exclude=[par] if par is not None else [])
        if not mods:
            return None
        views = class_views([inner.var], extent, mods)
        stores = [replace(n.store, indices=tuple(v.mapping.get(i, i) if isinstance(i, Var) else i
                                                  for i in n.store.indices),
                          value=in_class(n.store.value, v)) for v in views]
        bounds = dict(n.bounds)
        bounds[id(views[0].axes[0])] = (dsl.const(0), dsl.const(views[0].shape[0]))
        return nest(n.order[:-1] + views[0].axes, bounds, stores, n.parallel)
    return rewrite_nests(stage, split)
