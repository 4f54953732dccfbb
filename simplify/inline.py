"""Producers computed where their one reader uses them: element-wise chains, and copies.

``E[i, j] = H[i, j] / s[i] + d[i]`` read once, by ``dX[i, j] = E[i, j] * e[i, j]``, at
``dX``'s own index: ``dX[i, j] = (H[i, j] / s[i] + d[i]) * e[i, j]``. Each element of
``E`` is computed exactly once either way, with the same operations in the same order,
so the values are unchanged; the compiled kernel no longer stores ``E`` and loads it
back (one pass over memory fewer: softmax's backward, a layer norm's, an activation
after a bias).

A producer of any kind (a reduction too) read once by a *copy*, a reader whose body is
that one read at an index that takes each reader axis once with coefficient 1 (a slice,
a shift, a transpose: pure data movement), is computed in the copy:
``dP[y, v] = sum(...)`` over a padded domain and ``dX[i, j] = dP[i + 1, j + 1]`` become
``dX[i, j] = sum(...)[y = i + 1, v = j + 1]``. Each element the copy reads is computed
once, by the same expression; the elements it does not read (a padding border) are not
computed at all, and nothing is stored and loaded back.

A *cheap* element-wise producer (no function call, no division by a variable, at most
:data:`CHEAP_NODES` nodes: a centering ``x[i, j] - mu[i]``, a scaling) read up to :data:`CHEAP_READS` times, each read
touching each of its elements once (its indices distinct loop variables of the reader,
reduce axes included, plus constants), is computed in every reader: a layer norm written
in stages reads its centered input twice, and recomputing one subtraction per read costs
less than storing the tensor and loading it back twice.

An *identity copy*, a tensor whose body is the read of another tensor of its shape and
dtype at its own axes in order (an adjoint passed through a reshape that keeps the shape, a
linear layer's gradient handed on), read only by computes, is read in its place by every
reader, however many (reductions too): each such read loads the same element at the same
indices (a read the copy's readers could not prove in bounds is refused there as it was),
and the copy's pass over memory disappears. A copy read by a scatter is kept, and so is one
whose own producer was fused into it (read once by it, the usual case of a copy with one
reader): it then computes, it no longer copies.

Promises: only tensors that are not protected (outputs, kept forward tensors) are
inlined: element-wise ones (no reduction) read exactly once in the whole graph by a
compute without reductions at exactly its own indices with the same shape, any read
exactly once by a copy as above, cheap ones as above, identity copies as above; and a fused body stays shallower
than :data:`INLINE_DEPTH`. The values are unchanged: each inlined read computes the
element it read, with the same expression.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Set, Tuple

from te_grad.graph import free_vars, reductions_in, topo_order
from te_grad.ir import Binary, Call, Cast, ComputeOp, Const, PlaceholderOp, Read, Reduce, ScatterOp, Tensor, read_uses

from .linear import coefficient
from te_grad.transform import replace_tensors, substitute
from te_grad.visitor import Mutator

#: a fused body is never deeper than this (expressions are emitted recursively)
INLINE_DEPTH = 48
#: an element-wise body of at most this many nodes, without calls, is cheap to recompute
CHEAP_NODES = 8
#: the most reads of a cheap producer that are each given its body
CHEAP_READS = 3


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


def _readers(order: List[Tensor]) -> Dict[int, List[Tuple[Tensor, Read]]]:
    """Every read of each tensor across the graph, with its reader, in order (by tensor id)."""
    every: Dict[int, List[Tuple[Tensor, Read]]] = {}
    for c in order:
        if isinstance(c.op, ComputeOp):
            exprs = [c.op.body]
        elif isinstance(c.op, ScatterOp):
            exprs = [c.op.value] + list(c.op.indices) + ([c.op.where] if c.op.where is not None else [])
            exprs += [b for r in c.op.axes for b in (r.lo, r.hi)]
        else:
            continue
        for e in exprs:
            for r in read_uses(e):  # linear in a DAG; a read node once per parent using it
                every.setdefault(id(r.tensor), []).append((c, r))
    return every


#: operators too slow to repeat in a reader's inner loop (a division only by a variable)
_COSTLY = ("div", "pow", "floordiv", "floormod")


def _cheap(p: Tensor) -> bool:
    """True if ``p``'s body is small, without reductions, calls or divisions by a variable
    (softmax's ``exp / sum`` in a contraction's inner loop would cost a division per
    multiply-add)."""
    nodes = 0
    pending = [p.op.body]
    while pending:
        e = pending.pop()
        nodes += 1
        if nodes > CHEAP_NODES or isinstance(e, (Call, Reduce)):
            return False
        if isinstance(e, Binary) and e.op in _COSTLY and not (e.op == "div" and isinstance(e.b, Const)):
            return False
        pending.extend(e.children())
    return True


def _body_reductions(t: Tensor, cache: Dict[int, list]) -> list:
    """``reductions_in(t.op.body)``, computed once per tensor of a pass (``cache``): a reader
    of thousands of producers, an adjoint summing the contributions of thousands of stages,
    is asked about each of them."""
    got = cache.get(id(t))
    if got is None:
        got = cache[id(t)] = reductions_in(t.op.body)
    return got


def _each_element_once(c: Tensor, read: Read, cache: Dict[int, list]) -> bool:
    """True if ``read``'s indices are each one loop variable of ``c`` plus a constant (or a
    constant), every loop variable of ``c`` (its axes and the axes of its reductions) used
    exactly once: each iteration of ``c`` reads another element."""
    loop_vars = {id(a) for a in c.op.axes} | {id(r) for red, _, _ in _body_reductions(c, cache) for r in red.axes}
    seen = set()
    for ix in read.indices:
        vars_ = free_vars(ix)
        if len(vars_) > 1 or (vars_ and (coefficient(ix, vars_[0]) != 1 or id(vars_[0]) in seen)):
            return False
        seen.update(id(v) for v in vars_)
    return seen == loop_vars


def _recomputable(p: Tensor, reads: List[Tuple[Tensor, Read]], cache: Dict[int, list]) -> bool:
    """A cheap element-wise producer read at most CHEAP_READS times, each read touching each
    element once, by computes."""
    return (isinstance(p.op, ComputeOp) and 1 < len(reads) <= CHEAP_READS and _cheap(p)
            and all(isinstance(c.op, ComputeOp) and _each_element_once(c, r, cache) for c, r in reads))


def _fusable(p: Tensor, reads: List[Tuple[Tensor, Read]], cache: Dict[int, list]) -> bool:
    """Read once, by a copy or element-wise at the reader's own indices."""
    if not isinstance(p.op, ComputeOp) or len(reads) != 1:
        return False
    c, read = reads[0]
    if not isinstance(c.op, ComputeOp):
        return False
    if _copies(c, read, cache):
        return True
    return (not _body_reductions(p, cache) and not _body_reductions(c, cache) and c.shape == p.shape
            and len(read.indices) == len(c.op.axes) and all(i is a for i, a in zip(read.indices, c.op.axes)))


def _copies(c: Tensor, read: Read, cache: Dict[int, list]) -> bool:
    """True if ``c``'s body is ``read`` alone (maybe cast) and each index of the read is one
    of ``c``'s axes plus a constant, each axis used once: a slice, a shift or a transpose."""
    body = c.op.body
    while isinstance(body, Cast):
        body = body.a
    return body is read and _each_element_once(c, read, cache)


def identity_copy(t: Tensor) -> bool:
    """True if ``t``'s body is a read of another tensor of ``t``'s shape and dtype at ``t``'s own
    axes, in order."""
    body = t.op.body if isinstance(t.op, ComputeOp) else None
    return (isinstance(body, Read) and body.tensor is not t and body.tensor.shape == t.shape
            and body.tensor.dtype == t.dtype and len(body.indices) == len(t.op.axes)
            and all(i is a for i, a in zip(body.indices, t.op.axes)))


def _forwardable(p: Tensor, reads: List[Tuple[Tensor, Read]]) -> bool:
    """An identity copy read only by computes: they read what it copies instead."""
    return bool(reads) and identity_copy(p) and all(isinstance(c.op, ComputeOp) for c, _ in reads)


def inline_elementwise(roots: Iterable[Tensor], protected: Set[int] = frozenset()) -> Dict[int, Tensor]:
    """``{id(old): new}`` for every tensor behind ``roots``, element-wise producers fused
    into their readers (see the module docstring). Tensors in ``protected`` (by id) and
    the roots are never inlined; a tensor that reads nothing rewritten stays the same object."""
    roots = list(roots)
    order = topo_order(roots)
    protected = set(protected) | {id(t) for t in roots}
    reads = _readers(order)
    cache: Dict[int, list] = {}
    fused = {id(p) for p in order if id(p) not in protected and _fusable(p, reads.get(id(p), []), cache)}
    recomputed = {id(p) for p in order if id(p) not in protected and id(p) not in fused
                  and _recomputable(p, reads.get(id(p), []), cache)}
    forwarded = {id(p) for p in order if id(p) not in protected and id(p) not in fused
                 and _forwardable(p, reads.get(id(p), []))}
    candidates = fused | recomputed | forwarded
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
            readers = [c for c, _ in reads.get(id(t), [])]
            if id(t) in recomputed and not _cheap(out):
                continue  # cheap as written, not once its own producers were fused into it
            if id(t) in forwarded and id(t) not in recomputed and not identity_copy(out):
                continue  # its producer was fused into it: a copy no more
            if all(out.op.body.depth + reader.op.body.depth <= INLINE_DEPTH for reader in readers):
                inline[id(out)] = out
    return new
