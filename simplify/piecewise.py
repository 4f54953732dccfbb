"""Piecewise-affine indices split into their affine pieces.

An index chosen by a condition, ``K[b, i + if_then_else(h < H // 2, w - 4, w), h, d]``
(a sliding window whose offset depends on the head), is not quasi-affine: isl cannot
represent ``j == i + if_then_else(c, a, b)``, so the adjoint of such a read, a sum
pinned by that equality, would become a serial scatter, and its guards
(``0 <= i + if_then_else(...) < n``) would stay filters over the whole box. When the
condition ``c`` and both branches ``a`` and ``b`` are quasi-affine in the loop variables,
the sum is the sum of two pieces, each affine::

    sum over {r : P(if_then_else(c, a, b))} of f(if_then_else(c, a, b))
      == sum over {r : c & P(a)} of f(a)  +  sum over {r : ~c & P(b)} of f(b)

(``c`` and ``~c`` partition the domain), and each piece gets the gather treatment
(tight loops, no scatter), exactly as if the formula had been written as two terms, one
per branch. Pieces are split again while a quasi-affine selection remains, up to
:data:`MAX_PIECES` pieces per reduction. A selection whose condition reads data
(``if_then_else(x[i] > 0, a, b)``) or whose branch does is not quasi-affine and is left
alone, and so is a reduction any of whose pieces would still need a scatter (an index
equality that reads data): it stays one scatter.

Only sums are split (their pieces add), and only selections that occur in the sum's
conditions (its ``where`` and the guards of its body, :func:`.gather.lift_guards`): one
that only picks an index of a read of the body costs a select per point either way.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from te_grad import dtypes
from te_grad.ir import Const, Expr, Reduce, Select, Var, structurally_equal
from te_grad.ops import reduction
from te_grad.transform import sum_terms, summands
from te_grad.visitor import Mutator, Visitor

from .affine import IslNames, conjuncts, isl_cond, isl_expr
from .gather import lift_guards

#: a reduction is split into at most this many pieces (each selection doubles them)
MAX_PIECES = 16


class _Selections(Visitor):
    """Integer selections whose condition and branches are quasi-affine in ``names``,
    innermost first."""

    def __init__(self, names):
        self.names = names
        self.found: List[Select] = []

    def visit_Select(self, node: Select):
        self.generic_visit(node)
        if (dtypes.is_int(node.dtype) and isl_cond(node.cond, self.names) is not None
                and isl_expr(node.t, self.names) is not None and isl_expr(node.f, self.names) is not None):
            self.found.append(node)


class _Choose(Mutator):
    """Replaces every occurrence of the selection ``target`` by ``branch``."""

    def __init__(self, target: Select, branch: Expr):
        super().__init__()
        self.target, self.branch = target, branch

    def visit_Select(self, node: Select):
        if node is self.target or structurally_equal(node, self.target):
            return self.branch
        return self.generic_visit(node)


def _selection(red: Reduce, names) -> Optional[Select]:
    """The first quasi-affine integer selection in the conditions of the sum ``red``."""
    lifted, _ = lift_guards(red.body)
    finder = _Selections(names)
    for c in conjuncts(red.where) + lifted:
        finder.visit(c)
        if finder.found:
            return finder.found[0]
    return None


def split_reduction(red: Reduce, out_axes: Sequence[Var]) -> List[Reduce]:
    """The affine pieces of the sum ``red`` (a term of a compute over ``out_axes``):
    ``[red]`` when it has no quasi-affine selection in its conditions or too many."""
    if reduction(red.combiner).lowering != "add" or reduction(red.combiner).indexed:
        return [red]
    names = IslNames({id(ax): f"p{d}" for d, ax in enumerate(out_axes)})
    names.update({id(ax): f"r{n}" for n, ax in enumerate(red.axes)})
    pending, done = [red], []
    while pending:
        piece = pending.pop()
        sel = _selection(piece, names)
        if sel is None:
            done.append(piece)
            continue
        if len(done) + len(pending) + 2 > MAX_PIECES:
            return [red]
        for cond, branch in ((sel.cond, sel.t), (~sel.cond, sel.f)):
            choose = _Choose(sel, branch)
            body = choose.visit(piece.body)
            where = cond if piece.where is None else choose.visit(piece.where) & cond
            pending.append(Reduce(piece.combiner, body, piece.axes, where))
    done.reverse()
    return done


def split_pieces(body: Expr, out_axes: Sequence[Var],
                 keep_whole: Callable[[Reduce], bool] = lambda red: False) -> Expr:
    """``body`` (a compute's) with each top-level sum (maybe guarded or cast) replaced by the
    sum of its affine pieces (:func:`split_reduction`); a sum for which ``keep_whole`` of
    any of its pieces is true is kept whole. The same object when nothing is split."""
    terms = summands(body)
    out = [_split_term(s, out_axes, keep_whole) for s in terms]
    if all(a is b for a, b in zip(out, terms)):
        return body
    return sum_terms(out)


def _split_term(e: Expr, out_axes, keep_whole) -> Expr:
    """``e`` as a sum of pieces: a reduction, or a reduction under zero guards (each piece
    under the same guards). A cast reduction stays whole (a sum of cast pieces would round
    differently)."""
    if isinstance(e, Reduce):
        pieces = split_reduction(e, out_axes)
        if len(pieces) == 1 or any(keep_whole(p) for p in pieces):
            return e
        return sum_terms(pieces)
    if isinstance(e, Select) and isinstance(e.f, Const) and e.f.value == 0:
        inner = _split_term(e.t, out_axes, keep_whole)
        if inner is e.t:
            return e
        return sum_terms([Select(e.cond, piece, e.f) for piece in summands(inner)])
    return e
