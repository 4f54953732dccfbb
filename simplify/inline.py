"""Element-wise chains fused: a producer computed where its one reader uses it.

``E[i, j] = H[i, j] / s[i] + d[i]`` read once, by ``dX[i, j] = E[i, j] * e[i, j]``, at
``dX``'s own index: ``dX[i, j] = (H[i, j] / s[i] + d[i]) * e[i, j]``. Each element of
``E`` is computed exactly once either way, with the same operations in the same order,
so the values are unchanged; the compiled kernel no longer stores ``E`` and loads it
back (one pass over memory fewer: softmax's backward, a layer norm's, an activation
after a bias).

Promises: only tensors that are not protected (outputs, kept forward tensors), have
no reduction, are read exactly once in the whole graph, by a compute without
reductions, at exactly that compute's own indices with the same shape, are inlined,
and a fused body stays shallower than :data:`INLINE_DEPTH`.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Set, Tuple

from te_grad.graph import reads_in, reductions_in, topo_order
from te_grad.ir import ComputeOp, PlaceholderOp, Read, ScatterOp, Tensor
from te_grad.transform import replace_tensors, substitute
from te_grad.visitor import Mutator

#: a fused body is never deeper than this (expressions are emitted recursively)
INLINE_DEPTH = 48


class Redirect(Mutator):
    """Redirects reads to rewritten tensors (``new``: by id of the old tensor) and replaces
    reads of the tensors in ``inline`` (by id) with their bodies at the read's indices."""

    def __init__(self, new: Dict[int, Tensor], inline: Dict[int, Tensor]):
        super().__init__()
        self.new, self.inline = new, inline

    def visit_Read(self, node: Read):
        node = self.generic_visit(node)
        target = self.new.get(id(node.tensor), node.tensor)
        producer = self.inline.get(id(target))
        if producer is not None:
            return substitute(producer.op.body, dict(zip(producer.op.axes, node.indices)))
        return node if target is node.tensor else Read(target, node.indices)


def _readers(order: List[Tensor]) -> Tuple[Dict[int, int], Dict[int, Tuple[Tensor, Read]]]:
    """Reads of each tensor across the graph, and its first reader with that read."""
    counts: Dict[int, int] = {}
    first: Dict[int, Tuple[Tensor, Read]] = {}
    for c in order:
        if isinstance(c.op, ComputeOp):
            exprs = [c.op.body]
        elif isinstance(c.op, ScatterOp):
            exprs = [c.op.value] + list(c.op.indices) + ([c.op.where] if c.op.where is not None else [])
            exprs += [b for r in c.op.axes for b in (r.lo, r.hi)]
        else:
            continue
        for e in exprs:
            for r in reads_in(e):
                counts[id(r.tensor)] = counts.get(id(r.tensor), 0) + 1
                first.setdefault(id(r.tensor), (c, r))
    return counts, first


def _fusable(p: Tensor, counts, first) -> bool:
    if not isinstance(p.op, ComputeOp) or counts.get(id(p), 0) != 1 or reductions_in(p.op.body):
        return False
    c, read = first[id(p)]
    return (isinstance(c.op, ComputeOp) and not reductions_in(c.op.body) and c.shape == p.shape
            and len(read.indices) == len(c.op.axes) and all(i is a for i, a in zip(read.indices, c.op.axes)))


def inline_elementwise(roots: Iterable[Tensor], protected: Set[int] = frozenset()) -> Dict[int, Tensor]:
    """``{id(old): new}`` for every tensor behind ``roots``, element-wise producers fused
    into their readers (see the module docstring). Tensors in ``protected`` (by id) and
    the roots are never inlined; a tensor that reads nothing rewritten stays the same object."""
    roots = list(roots)
    order = topo_order(roots)
    protected = set(protected) | {id(t) for t in roots}
    counts, first = _readers(order)
    candidates = {id(p) for p in order if id(p) not in protected and _fusable(p, counts, first)}
    new: Dict[int, Tensor] = {}
    inline: Dict[int, Tensor] = {}
    if not candidates:
        return {id(t): t for t in order}
    for t in order:
        if isinstance(t.op, PlaceholderOp):
            new[id(t)] = t
            continue
        if isinstance(t.op, ScatterOp):
            new[id(t)] = replace_tensors([t], {k: v for k, v in new.items() if v is not None})[id(t)]
            continue
        body = Redirect(new, inline).visit(t.op.body)
        out = t if body is t.op.body else Tensor(t.name, t.shape, t.dtype, ComputeOp(t.op.axes, body, t.op.note))
        new[id(t)] = out
        if id(t) in candidates:
            reader = first[id(t)][0]
            if out.op.body.depth + reader.op.body.depth <= INLINE_DEPTH:
                inline[id(out)] = out
    return new
