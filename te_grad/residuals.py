"""Forward and backward kernels that share saved residuals: :func:`build_vjp`.

A training framework runs the forward pass, keeps what the backward pass will need
(the *residuals*), and later runs the backward pass on them. ``tg.build`` of the
gradients alone recomputes the whole forward from the inputs; ``build_vjp`` splits
the work as PyTorch's autograd and JAX's ``vjp`` do:

- the **forward kernel** maps the inputs to the outputs and the saved residuals;
- the **backward kernel** maps the residuals, the inputs the backward still reads,
  and the heads (the adjoints of the outputs) to the input gradients, computing
  again only what was not saved.

Which forward tensors to save is a policy, as JAX's checkpoint policies are. The
default saves a tensor whose recomputation is expensive, in exact counts: one
with a reduction (more than :data:`RECOMPUTE_PER_ELEMENT` innermost iterations
per element: a row max, a row sum, a matrix product) or a transcendental function
(``exp`` of a softmax, ``tanh``); cheap elementwise values are recomputed from
what they read. ``save=[...]`` forces a list, ``save=[]`` recomputes everything
(the backward kernel then reads only the inputs and the heads). The choice never
changes a value: only where it is computed.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from . import dsl, dtypes, ops
from .errors import UserError
from .graph import topo_order
from .ir import Call, ComputeOp, Expr, Reduce, Tensor
from .transform import replace_tensors

#: a forward tensor costing more innermost iterations per element than this is saved
RECOMPUTE_PER_ELEMENT = 2
#: intrinsics cheap enough to recompute (anything else in a body makes the tensor saved)
#: the intrinsics a backward pass recomputes rather than saves (their records say ``cheap``)
CHEAP_CALLS = tuple(name for name, op in ops.INTRINSICS.items() if op.cheap)


class VJP:
    """Compiled forward and backward kernels sharing saved residuals.

    - ``forward(*inputs)`` returns ``outputs + residuals`` (arrays, in the order of
      ``outputs`` then ``saved``, outputs that are also saved appearing once);
    - ``backward(*residuals, *needed_inputs, *heads)`` returns one gradient per tensor
      of ``wrt``;
    - ``saved``: the forward tensors saved; ``recomputed``: those the backward
      computes again; ``needed_inputs``: the placeholders the backward reads;
      ``residual_bytes``: the memory the saved tensors take.
    """

    def __init__(self, outputs, inputs, wrt, saved, recomputed, needed_inputs, heads, head_used,
                 forward, backward):
        self.head_used = list(head_used)  # per output: whether the backward reads its head
        self.outputs = list(outputs)
        self.inputs = list(inputs)
        self.wrt = list(wrt)
        self.saved = list(saved)
        self.recomputed = list(recomputed)
        self.needed_inputs = list(needed_inputs)
        self.heads = list(heads)
        self.forward = forward
        self.backward = backward

    @property
    def residual_bytes(self):
        """The bytes of the saved tensors: an int, or a size expression when their shapes use
        size variables (``tg.var``)."""
        total = sum(np.dtype(t.dtype).itemsize * t.size for t in self.saved)
        return total if isinstance(total, Expr) else int(total)

    @property
    def residuals(self) -> List[Tensor]:
        """The forward kernel's extra outputs: saved tensors that are not outputs."""
        return [t for t in self.saved if not any(t is y for y in self.outputs)]

    def run_forward(self, *arrays):
        """``(outputs, residual values)``: the outputs, and the saved values in ``saved`` order."""
        got = self.forward(*arrays)
        got = got if isinstance(got, tuple) else (got,)
        values = {id(t): v for t, v in zip(self.outputs + self.residuals, got)}
        return list(got[:len(self.outputs)]), [values[id(t)] for t in self.saved]

    def backward_arguments(self, residual_values, input_values, head_values) -> list:
        """The backward kernel's arguments from the saved values (``saved`` order), the values
        of ``inputs`` (all of them; those the backward needs are picked) and one head per
        output (those it reads are picked): ``vjp.backward(*args)``."""
        residual_values, input_values, head_values = \
            list(residual_values), list(input_values), list(head_values)
        _check_count("residual values (one per saved tensor)", self.saved, residual_values)
        _check_count("input values (one per input, needed or not)", self.inputs, input_values)
        _check_count("heads (one per output)", self.outputs, head_values)
        by_input = {id(x): v for x, v in zip(self.inputs, input_values)}
        needed = [by_input[id(x)] for x in self.needed_inputs]
        used_heads = [h for h, used in zip(head_values, self.head_used) if used]
        return list(residual_values) + needed + used_heads

    def run_backward(self, residual_values, input_values, head_values):
        """The gradients, from the saved values (``saved`` order), the values of ``inputs``
        (all of them; those the backward needs are picked) and one head per output."""
        got = self.backward(*self.backward_arguments(residual_values, input_values, head_values))
        return list(got) if isinstance(got, tuple) else [got]

    def __repr__(self):
        saved = ", ".join(t.name for t in self.saved) or "nothing"
        return (f"VJP(saves {saved}: {self.residual_bytes} bytes; backward reads "
                f"{', '.join(t.name for t in self.needed_inputs) or 'no input'})")


def _check_count(what: str, tensors: Sequence[Tensor], values: list) -> None:
    """A :class:`UserError` unless ``values`` has one entry per tensor, naming the
    tensors missing (too few) or how many are extra (too many)."""
    if len(values) == len(tensors):
        return
    names = ", ".join(t.name for t in tensors) or "none"
    if len(values) < len(tensors):
        missing = ", ".join(t.name for t in tensors[len(values):])
        raise UserError(f"VJP.run_backward: {len(tensors)} {what} expected ({names}), "
                        f"{len(values)} given: missing {missing}")
    raise UserError(f"VJP.run_backward: {len(tensors)} {what} expected ({names}), "
                    f"{len(values)} given: {len(values) - len(tensors)} too many")


#: the value of each size variable at which a symbolic tensor's cost per element is judged
#: (clamped to the variable's range); the choice of residuals never changes a value
REPRESENTATIVE_SIZE = 64


def _cost_is_high(t: Tensor) -> bool:
    from simplify.count import RAGGED_TRIPS, tensor_iterations
    from .sizes import clamped, graph_size_vars, specialize
    judged = t
    variables = graph_size_vars([t])
    if variables:  # the cost per element at a representative size
        judged = specialize([t], clamped(variables, REPRESENTATIVE_SIZE))[0][0]
    if tensor_iterations(judged, RAGGED_TRIPS) > RECOMPUTE_PER_ELEMENT * max(1, judged.size):
        return True
    stack = [t.op.body] if isinstance(t.op, ComputeOp) else []
    while stack:
        e = stack.pop()
        if isinstance(e, Reduce) or (isinstance(e, Call) and e.name not in CHEAP_CALLS):
            return True
        stack.extend(e.children())
    return False


def _policy(backward_roots: List[Tensor], forward: Dict[int, Tensor], outputs: Sequence[Tensor]):
    """``(saved, recomputed)``: walk from the backward graph into the forward graph, saving
    expensive tensors and outputs and recomputing the others (whose own inputs are then
    needed in turn)."""
    saved: Dict[int, Tensor] = {}
    recomputed: Dict[int, Tensor] = {}
    output_ids = {id(y) for y in outputs}
    frontier = []
    for t in topo_order(backward_roots):
        if id(t) in forward:
            continue
        for x in t.op.inputs():
            if id(x) in forward and not x.is_placeholder:
                frontier.append(x)
    while frontier:
        t = frontier.pop()
        if id(t) in saved or id(t) in recomputed:
            continue
        if id(t) in output_ids or _cost_is_high(t):
            saved[id(t)] = t
        else:
            recomputed[id(t)] = t
            frontier.extend(x for x in t.op.inputs() if not x.is_placeholder)
    order = {id(t): n for n, t in enumerate(topo_order(list(forward.values())))}
    return (sorted(saved.values(), key=lambda t: order[id(t)]),
            sorted(recomputed.values(), key=lambda t: order[id(t)]))


def build_vjp(outputs, inputs, wrt=None, save=None, **build_options) -> VJP:
    """Forward and backward kernels of ``outputs`` (functions of the placeholders ``inputs``)
    that share saved residuals; gradients with respect to ``wrt`` (default: the float inputs).

    ``save``: ``None`` for the default policy (see the module docstring), or a list of
    forward tensors to save (``[]``: recompute everything). ``build_options`` go to
    ``tg.build`` (``threads``, ``fast_math``)."""
    from codegen import build
    from .autodiff import differentiate
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = list(inputs)
    for t in inputs:
        if not isinstance(t, Tensor) or not t.is_placeholder:
            raise UserError(f"build_vjp: inputs must be placeholders, got {t!r}")
    wrt = [x for x in inputs if dtypes.is_float(x.dtype)] if wrt is None else list(wrt)
    for x in wrt:
        if not any(x is i for i in inputs):
            raise UserError(f"build_vjp: {x.name} in wrt is not among the inputs")
    heads = [dsl.placeholder(y.shape, dtype=y.dtype, name=f"d{y.name}") for y in outs]
    grads = list(differentiate(outs, wrt, head=heads)) if wrt else []
    forward = {id(t): t for t in topo_order(outs)}
    if save is None:
        saved, recomputed = _policy(grads, forward, outs)
    else:
        saved = []
        for t in save:
            if not isinstance(t, Tensor) or id(t) not in forward or t.is_placeholder:
                raise UserError(f"build_vjp: save= lists {t!r}, which is not a computed tensor of the forward graph")
            saved.append(t)
        recomputed = [t for t in topo_order(grads) if id(t) in forward and not t.is_placeholder
                      and not any(t is s for s in saved)]
    stand_in = {id(t): dsl.placeholder(t.shape, dtype=t.dtype, name=t.name) for t in saved}
    rebuilt = replace_tensors(grads, stand_in)
    backward_grads = [rebuilt[id(g)] for g in grads]
    read = {id(t) for t in topo_order(backward_grads) if t.is_placeholder}
    residual_inputs = [stand_in[id(t)] for t in saved]
    # a forced save the backward never reads is not saved (it would only cost memory)
    saved = [t for t in saved if id(stand_in[id(t)]) in read]
    residual_inputs = [stand_in[id(t)] for t in saved]
    needed = [x for x in topo_order(outs) if x.is_placeholder and id(x) in read]
    needed = [x for x in inputs if any(x is n for n in needed)]
    used_heads = [h for h in heads if id(h) in read]
    extra = [t for t in saved if not any(t is y for y in outs)]
    forward_kernel = build(outs + extra, inputs, **build_options)
    backward_kernel = build(backward_grads, residual_inputs + needed + used_heads, **build_options) \
        if backward_grads else None
    return VJP(outs, inputs, wrt, saved, [t for t in recomputed if id(t) not in {id(s) for s in saved}],
               needed, used_heads, [id(h) in read for h in heads], forward_kernel, backward_kernel)
