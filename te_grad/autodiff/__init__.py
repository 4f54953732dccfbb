"""Reverse-mode differentiation of te_grad tensor graphs (vector-Jacobian products).

See :func:`differentiate`. The derivative of every operator lives in
:mod:`.rules`; the graph-level VJP in :mod:`.vjp`.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .. import dtypes
from ..collector import during_build
from ..deep import deep_entry
from ..verify import verify_if_enabled
from ..errors import InternalError, UserError
from ..graph import topo_order
from ..ir import ComputeOp, PlaceholderOp, ScatterOp, Tensor
from ..sizes import same_shape
from .shift import cancelled_shifts
from .vjp import (full_box, hull, ones_like, sum_contributions, vjp_of_compute, vjp_of_scatter,
                  zeros_like)

__all__ = ["differentiate", "gradient", "DifferentiationResult"]

Override = Callable[[Tensor], Dict[Tensor, Tensor]]


class DifferentiationResult(Sequence):
    """The gradients of ``inputs`` (a sequence, in order) plus every adjoint.

    ``res[0]``, ``dX, dW = res``, ``len(res)``; ``res.adjoints[T]`` is the
    adjoint of any tensor ``T`` the outputs depend on (a KeyError names tensors
    that do not influence the outputs).
    """

    def __init__(self, outputs, inputs, gradients, adjoints, simplified: bool, raw=None, fallbacks=()):
        #: ``(tensor name, reason)`` for each reduction the simplifier left in a form correct by
        #: construction (a scatter or the raw sum) because no simplification passed validation
        self.fallbacks = list(fallbacks)
        self.outputs = tuple(outputs)
        self.inputs = tuple(inputs)
        self.gradients = tuple(gradients)
        #: the raw vector-Jacobian products, before simplification
        self.raw = tuple(raw) if raw is not None else self.gradients
        self.adjoints: Dict[Tensor, Tensor] = adjoints
        self.simplified = simplified

    def __getitem__(self, i):
        return self.gradients[i]

    def __len__(self):
        return len(self.gradients)

    def __repr__(self):
        pairs = ", ".join(f"{x.name} -> {g.name}" for x, g in zip(self.inputs, self.gradients))
        return f"DifferentiationResult({pairs})"


def _as_list(x, what: str) -> List:
    if isinstance(x, Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        for t in x:
            if not isinstance(t, Tensor):
                raise UserError(f"{what} must be tensors, got {t!r}")
        return list(x)
    raise UserError(f"{what} must be a tensor or a list of tensors, got {x!r}")


def _heads(outputs: List[Tensor], head) -> List[Tensor]:
    if head is None:
        heads = [None] * len(outputs)
    elif isinstance(head, Tensor):
        heads = [head]
    else:
        heads = list(head)
    if len(heads) != len(outputs):
        raise UserError(f"{len(outputs)} outputs but {len(heads)} heads were given")
    out = []
    for y, h in zip(outputs, heads):
        if h is None:
            h = ones_like(y, f"d{y.name}")
        elif not isinstance(h, Tensor):
            raise UserError(f"the head of {y.name} must be a tensor shaped like it, got {h!r}")
        elif not same_shape(h.shape, y.shape):
            raise UserError(f"the head {h.name} has shape {list(h.shape)} but output {y.name} has "
                            f"shape {list(y.shape)}")
        elif h.dtype != y.dtype:
            raise UserError(f"the head {h.name} has dtype {h.dtype} but output {y.name} has {y.dtype}")
        out.append(h)
    return out


def _apply_override(y: Tensor, adj: Tensor, rule: Override, ancestors) -> Dict[Tensor, Tensor]:
    got = rule(adj)
    if not isinstance(got, dict):
        raise UserError(f"the override for {y.name} must return a dict {{tensor: adjoint contribution}}, "
                        f"got {type(got).__name__}")
    for x, c in got.items():
        if not isinstance(x, Tensor) or id(x) not in ancestors:
            raise UserError(f"the override for {y.name} gives an adjoint to {x!r}, which {y.name} "
                            "does not depend on")
        if not isinstance(c, Tensor) or not same_shape(c.shape, x.shape):
            raise UserError(f"the override for {y.name} must give {x.name} a tensor of shape "
                            f"{list(x.shape)}, got {c!r}")
    return got


#: the reverse rule of each kind of tensor op: ``rule(t, adjoint of t, box) -> contributions``.
#: A placeholder is a leaf. Every op class of :mod:`te_grad.ir` must have an entry: an op
#: without one would silently pass nothing back, so :func:`vjp_of_op` refuses it.
VJP_RULES = {
    PlaceholderOp: lambda t, adj, box: [],
    ComputeOp: vjp_of_compute,
    ScatterOp: vjp_of_scatter,
}


def vjp_of_op(t: Tensor, adj: Tensor, box=None):
    """The raw contributions of ``t``'s op, given ``t``'s adjoint (zero outside ``box``), to the
    tensors it reads: ``[(tensor, contribution, box)]``."""
    rule = VJP_RULES.get(type(t.op))
    if rule is None:
        raise InternalError(f"no reverse rule for {t.name}, defined by a {type(t.op).__name__}: "
                            "its inputs would get no gradient")
    return rule(t, adj, box)


@during_build
@deep_entry
def differentiate(outputs: Union[Tensor, Sequence[Tensor]], inputs: Sequence[Tensor],
                  head=None, override: Optional[Dict[Tensor, Override]] = None,
                  simplify: bool = True) -> DifferentiationResult:
    """Gradients of ``outputs`` with respect to ``inputs``, as new tensors.

    ``head`` is the adjoint seeded at each output (a tensor shaped like it, a
    list of them for several outputs; ``None`` means ones), so the results are
    vector-Jacobian products ``head^T J``. Inputs the outputs do not depend
    on get an explicit zero gradient; an integer input is an error.

    ``override`` maps a tensor ``T`` to ``rule(dT) -> {X: contribution}``,
    which replaces te_grad's VJP of ``T``'s op: the contributions go to any
    tensors ``T`` depends on (e.g. a fused softmax backward to the logits).

    ``simplify=False`` returns the raw VJP: each contribution is a reduction
    over its consumer's whole iteration domain, constrained by the index
    equality. ``simplify=True`` (the default) proves the reads of the forward
    graph in bounds and returns the isl-simplified gradients and adjoints
    (see :func:`te_grad.simplify`); forward tensors are kept as they are.

    A tensor the outputs provably do not depend on to first order, such as the max
    shift of a softmax written by hand (``exp(x - m) / sum(exp(x - m))``), passes
    no gradient on (:mod:`te_grad.autodiff.shift`): its adjoint is exactly zero, so
    it has none in ``adjoints`` and the max is not differentiated.
    """
    outputs = _as_list(outputs, "outputs")
    inputs = _as_list(inputs, "inputs")
    override = dict(override or {})
    for y in outputs:
        if not dtypes.is_float(y.dtype):
            raise UserError(f"cannot differentiate the {y.dtype} output {y.name}; outputs must be float")
    for x in inputs:
        if not dtypes.is_float(x.dtype):
            raise UserError(f"cannot take the gradient with respect to {x.name} of dtype {x.dtype}: "
                            "integer and bool tensors have no gradient")
    order = topo_order(outputs)
    # tensors whose adjoint is provably zero (a cancelled shift, :mod:`.shift`) get nothing
    dropped = cancelled_shifts(outputs, override)
    # contributions waiting for each tensor, with the boxes outside which they are zero
    pending: Dict[int, List[Tuple[Tensor, tuple]]] = {}
    for y, h in zip(outputs, _heads(outputs, head)):
        pending.setdefault(id(y), []).append((h, full_box(y)))
    adjoints: Dict[Tensor, Tensor] = {}
    for t in reversed(order):
        contribs = pending.pop(id(t), None)
        if not contribs:
            continue
        adj = sum_contributions(t, [c for c, _ in contribs])
        adjoints[t] = adj
        if t in override:
            anc = {id(a) for a in topo_order([t]) if a is not t}
            for x, c in _apply_override(t, adj, override[t], anc).items():
                pending.setdefault(id(x), []).append((c, full_box(x)))
        else:
            for x, c, box in vjp_of_op(t, adj, hull([b for _, b in contribs])):
                if id(x) in dropped:
                    continue
                pending.setdefault(id(x), []).append((c, box))
    grads = [adjoints[x] if x in adjoints else zeros_like(x, f"d{x.name}") for x in inputs]
    raw = list(grads)
    verify_if_enabled(raw + list(adjoints.values()), "autodiff (the raw vector-Jacobian products)")
    fallbacks: List = []
    if simplify:
        grads, adjoints = _simplified(outputs, grads, adjoints, override, fallbacks)
        verify_if_enabled(list(grads) + list(adjoints.values()), "simplify (the simplified gradients)")
    return DifferentiationResult(outputs, inputs, grads, adjoints, simplified=simplify, raw=raw,
                                 fallbacks=fallbacks)


def _simplified(outputs, grads, adjoints, override, fallbacks):
    """Gradients and adjoints through the isl simplifier, forward tensors untouched."""
    from simplify import check_bounds, simplify_graph
    check_bounds(outputs)
    keep = {id(t) for t in topo_order(outputs)}
    for y in outputs:  # user-given heads are kept too
        if adjoints.get(y) is not None and y not in override:
            keep |= {id(t) for t in topo_order([adjoints[y]]) if t.is_placeholder}
    new = simplify_graph(list(grads) + list(adjoints.values()), keep, fallbacks)
    return [new[id(g)] for g in grads], {t: new[id(a)] for t, a in adjoints.items()}


def gradient(outputs, inputs, head=None, override=None, simplify: bool = True) -> List[Tensor]:
    """``list(differentiate(outputs, inputs, ...))``."""
    return list(differentiate(outputs, inputs, head=head, override=override, simplify=simplify))
