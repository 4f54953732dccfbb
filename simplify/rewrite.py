"""Rewrite a tensor graph into its simplified form.

Tensors are processed producers first. For each compute:
1. reads of tensors already rewritten are redirected to their new versions,
   reduce axes pinned by a data equality (``dst[e] == i``) are solved away
   (:mod:`.solve`), and sums whose conditions hold a piecewise-affine index
   (``i + if_then_else(h < 4, w - 4, w)``) are split into their affine pieces
   (:mod:`.piecewise`);
2. each top-level reduction (a summand, possibly under guards) is simplified
   by :mod:`.gather`, or turned into a scatter by :mod:`.scatter`;
3. producers that are cheap to fold in are inlined: constant tensors (the
   ``ones`` head), and tensors read exactly once, at the consumer's own
   index, as a top-level summand (the contributions of an adjoint sum), so
   the contributions to one tensor become one compute;
4. summed reductions over the same loops with the same filter are fused into
   one reduction (softmax's two row sums of its backward become one).
A tensor whose body does not change is kept as the same object.

When isl gives no scan of a reduction that passes translation validation
(:mod:`.validate`), the reduction falls back to a form that is correct by
construction: a scatter when its ``where`` pins every output index, the raw
reduction otherwise. The tensor's op says so (``note``, shown by ``tg.show``),
the caller's ``fallbacks`` list receives it, and a :class:`SimplificationWarning`
names it.
"""
from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Dict, Iterable, List, Optional, Set, Tuple

from te_grad.graph import topo_order
from te_grad.ir import (Cast, ComputeOp, Const, Expr, PlaceholderOp, Read, Reduce, ScatterOp, Select,
                        Tensor)
from te_grad.ir import read_uses, structurally_equal
from te_grad.ops import reduction
from te_grad.transform import replace_tensors, substitute, sum_terms, summands

from te_grad.errors import SimplificationWarning

from .fold import fold
from .gather import simplify_reduction
from .inline import Redirect
from .isl_bridge import Unsupported
from .piecewise import split_pieces
from .scatter import scatter_term, try_scatter
from .solve import solve_reductions
from .zeros import carry_zeros


def _sum(terms: List[Expr]) -> Expr:
    return sum_terms(terms)


def _count_reads(body: Expr, counts: Dict[int, int]):
    """Adds the reads of each tensor (identity) in ``body`` to ``counts``: one per use of a read
    node by a parent (:func:`~te_grad.ir.read_uses`, linear in a DAG)."""
    for r in read_uses(body):
        counts[id(r.tensor)] = counts.get(id(r.tensor), 0) + 1


def _simplify_term(t: Tensor, e: Expr, fallbacks: List[Tuple[str, str]]) -> Expr:
    """Simplify a top-level term of ``t``'s body (a reduction, maybe guarded or cast)."""
    if isinstance(e, Reduce):
        try:
            out = simplify_reduction(e, t.op.axes, t.shape)
        except Unsupported as err:
            return _fallback(t, e, str(err), fallbacks)
        return e if out is None else out
    if isinstance(e, Cast):
        inner = _simplify_term(t, e.a, fallbacks)
        return e if inner is e.a else Cast(e.dtype, inner)
    if isinstance(e, Select) and isinstance(e.f, Const) and e.f.value == 0:
        inner = _simplify_term(t, e.t, fallbacks)
        return e if inner is e.t else Select(e.cond, inner, e.f)
    return e


def _fallback(t: Tensor, red: Reduce, reason: str, fallbacks: List[Tuple[str, str]]) -> Expr:
    """A form of ``red`` (a term of ``t``) that is correct by construction: a scatter, or the
    reduction itself. Recorded in ``fallbacks`` and warned about."""
    scatter = scatter_term(f"{t.name}_scatter", t.shape, red.dtype, red, t.op.axes,
                           f"a scatter: no verified gather ({reason})")
    form = "a scatter (one pass over the forward domain)" if scatter is not None else \
        "the raw reduction (one pass over the forward domain per element)"
    fallbacks.append((t.name, f"{form}: {reason}"))
    warnings.warn(f"te_grad: the simplification of {t.name} could not be verified by isl, so it uses "
                  f"{form}, which is exact but slower ({reason})", SimplificationWarning, stacklevel=4)
    if scatter is None:
        return red
    return Read(scatter, tuple(t.op.axes))


def _fuse(terms: List[Expr]) -> List[Expr]:
    """Merge summed reductions that share loops and filter into one reduction (the bodies of
    many, an adjoint gathering thousands of contributions, are summed as a balanced tree)."""
    out: List[Expr] = []
    groups: List[Tuple[int, List[Expr]]] = []  # (position in out, bodies) of each sum reduction
    for term in terms:
        if isinstance(term, Reduce) and reduction(term.combiner).lowering == "add":
            for n, bodies in groups:
                body = _merge(out[n], term)
                if body is not None:
                    bodies.append(body)
                    break
            else:
                groups.append((len(out), [term.body]))
                out.append(term)
        else:
            out.append(term)
    for n, bodies in groups:
        if len(bodies) > 1:
            first = out[n]
            out[n] = Reduce("sum", sum_terms(bodies), first.axes, first.where)
    return out


def _merge(a: Expr, b: Expr) -> Optional[Expr]:
    """The body of ``b`` over the axes of ``a`` when the two sum reductions share loops and
    filter (so that their sum is one reduction), else None."""
    if not (isinstance(a, Reduce) and isinstance(b, Reduce)):
        return None
    if reduction(a.combiner).lowering != "add" or b.combiner != a.combiner or len(a.axes) != len(b.axes) or a.dtype != b.dtype:
        return None
    rename = dict(zip(b.axes, a.axes))
    for ax_a, ax_b in zip(a.axes, b.axes):
        if not (structurally_equal(ax_a.lo, substitute(ax_b.lo, rename))
                and structurally_equal(ax_a.hi, substitute(ax_b.hi, rename))):
            return None
    where_b = None if b.where is None else substitute(b.where, rename)
    if not structurally_equal(a.where, where_b):
        return None
    return substitute(b.body, rename)


def _inlinable(original: Tensor, p: Tensor, reads: Dict[int, int], outputs: Set[int]) -> bool:
    """``p`` (the simplified ``original``) may be folded into its readers."""
    if not isinstance(p.op, ComputeOp):
        return False
    if isinstance(p.op.body, Const):
        return True
    return reads.get(id(original), 0) == 1 and id(original) not in outputs


def simplify_graph(tensors: Iterable[Tensor], keep: Set[int] = frozenset(),
                   fallbacks: Optional[List[Tuple[str, str]]] = None) -> Dict[int, Tensor]:
    """Simplified versions of every tensor behind ``tensors``: ``{id(old): new}``.

    Structural zeros are first carried across tensors (:mod:`.zeros`: a masked score
    matrix's zeros become the domains of the tensors that read it); a tensor read only in
    a branch that can no longer be taken is then in no graph, and not in the result.

    Tensors whose id is in ``keep`` are neither rewritten nor inlined; their reads follow
    the rewrites of their producers (a kept tensor whose producers are all kept stays the
    same object).
    ``fallbacks`` (a list) receives ``(tensor name, reason)`` for each reduction that
    kept a form correct by construction because no simplification passed validation.
    """
    tensors = list(tensors)
    carried = carry_zeros(tensors, set(keep))
    if not carried:
        return _simplify_graph(tensors, keep, fallbacks)
    new = _simplify_graph([carried.get(id(t), t) for t in tensors],
                          {id(carried[k]) if k in carried else k for k in keep}, fallbacks)
    for old, moved in carried.items():  # a tensor only a dropped branch read is in no graph any more
        if id(moved) in new:
            new[old] = new[id(moved)]
    return new


def _simplify_graph(tensors: List[Tensor], keep: Set[int], fallbacks: Optional[List[Tuple[str, str]]]):
    fallbacks = [] if fallbacks is None else fallbacks
    order = topo_order(tensors)
    reads: Dict[int, int] = {}
    for t in order:
        if isinstance(t.op, ComputeOp):
            _count_reads(t.op.body, reads)
    outputs = {id(t) for t in tensors} | set(keep)
    new: Dict[int, Tensor] = {}
    inline: Dict[int, Tensor] = {}
    summand_readers = _summand_readers(order)
    for t in order:
        if isinstance(t.op, PlaceholderOp):
            new[id(t)] = t
            continue
        if id(t) in keep:  # not rewritten nor inlined, but it reads its producers' new forms
            new[id(t)] = _redirected(t, new)
            continue
        if isinstance(t.op, ScatterOp):  # already in its final form: only its reads follow the rewrites
            new[id(t)] = _redirected(t, new)
            continue
        redirected = solve_reductions(Redirect(new, {}).visit(t.op.body))
        redirected = split_pieces(redirected, t.op.axes, lambda piece, t=t: try_scatter(
            Tensor(t.name, t.shape, t.dtype, ComputeOp(t.op.axes, piece))) is not None)
        if redirected is not t.op.body:
            t_read = Tensor(t.name, t.shape, t.dtype, ComputeOp(t.op.axes, redirected))
        else:
            t_read = t
        scatter = try_scatter(t_read)
        if scatter is not None:
            new[id(t)] = scatter
            continue
        before = len(fallbacks)
        own = [_simplify_term(t, s, fallbacks) for s in summands(redirected)]
        note = "; ".join(r for _, r in fallbacks[before:]) or None
        body = _sum(own)
        body = Redirect({}, inline).visit(body) if inline else body
        body = fold(_sum(_fuse(summands(body))))
        if body is t.op.body and note is None:
            out = t
        else:
            out = Tensor(t.name, t.shape, t.dtype, ComputeOp(t.op.axes, body, note))
        new[id(t)] = out
        if _inlinable(t, out, reads, outputs) and _single_summand_reader(t, summand_readers):
            inline[id(out)] = out
    return new


def _redirected(t: Tensor, new: Dict[int, Tensor]) -> Tensor:
    """``t`` with its reads retargeted to the rewritten forms of its producers (the same object
    when none changed). A kept tensor that went on reading the old forms would keep the whole
    unsimplified graph behind it alive: a model's forward computed twice, once with its guards."""
    if not any(new.get(id(x), x) is not x for x in t.op.inputs()):
        return t
    if isinstance(t.op, ScatterOp):
        return replace_tensors([t], {k: v for k, v in new.items() if v is not None})[id(t)]
    return Tensor(t.name, t.shape, t.dtype, replace(t.op, body=Redirect(new, {}).visit(t.op.body)))


def _summand_readers(order: List[Tensor]) -> Dict[int, Tuple[Tensor, Read]]:
    """For each tensor, the first compute (in ``order``) with a top-level summand that reads
    it, and that read."""
    out: Dict[int, Tuple[Tensor, Read]] = {}
    for c in order:
        if not isinstance(c.op, ComputeOp):
            continue
        for s in summands(c.op.body):
            s_inner = s.a if isinstance(s, Cast) else s
            if isinstance(s_inner, Read):
                out.setdefault(id(s_inner.tensor), (c, s_inner))
    return out


def _single_summand_reader(p: Tensor, readers: Dict[int, Tuple[Tensor, Read]]) -> bool:
    """True if ``p``'s one reader reads it as a top-level summand at its own index, or p is elementwise."""
    if isinstance(p.op.body, Const):
        return True
    found = readers.get(id(p))
    if found is None:
        return False
    c, read = found
    return len(read.indices) == len(c.op.axes) and all(
        i is a for i, a in zip(read.indices, c.op.axes)) and c.shape == p.shape
