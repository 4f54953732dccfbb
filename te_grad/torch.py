"""te_grad ops as PyTorch operators: ``torch.library`` custom ops with derived backward passes.

::

    import torch, te_grad as tg, te_grad.torch as tgt

    def causal_conv1d(x, w, dilation=2):      # te_grad tensors in, a te_grad tensor out
        ...
    op = tgt.custom_op("mylib::causal_conv1d", causal_conv1d)
    y = op(x, w)                               # torch tensors in and out
    y.square().sum().backward()                # the derived backward, from saved residuals

``fn``'s parameters without a default are the op's tensor arguments; those with a
default are fixed attributes (``custom_op(..., dilation=4)`` overrides one). For each
combination of input shapes and dtypes, te_grad builds the graph once (placeholders
of those shapes and dtypes, ``fn``), and compiles, on first use, a forward kernel that
also returns the residuals the backward needs and a backward kernel that reads them
(:func:`te_grad.build_vjp`); both are cached on the op, for the ``max_shapes``
(default 64) most recently used combinations: the others are dropped, their kernels
freed, and rebuilt if seen again, so memory stays flat over ever new shapes.

Two operators are registered: ``NAME_fwd`` (inputs -> outputs + residuals) and
``NAME_bwd`` (inputs, residuals, output gradients -> input gradients), each with a
fake implementation from te_grad's shape inference, so the op works under
``torch.compile(fullgraph=True)``; the autograd formula of ``NAME_fwd`` calls
``NAME_bwd``. Calling ``op(...)`` runs ``NAME_fwd`` and returns the outputs.

Registering a name again (re-running a notebook cell) works as it does with
``torch.library``: the newer op takes the name, and ``torch.ops.NS.NAME_fwd`` runs its
code. The earlier :class:`TorchOp` object keeps its own behaviour: called, it runs its
own kernels (eagerly, through a ``torch.autograd.Function``, since its operators now
belong to the newer op).

Conventions:
- CPU tensors only (a CUDA tensor is a ``UserError``); contiguous inputs and the
  outputs are shared with the kernels without a copy, non-contiguous inputs are
  copied once.
- The kernels follow the dtypes given: float32 inputs get float32 kernels, float64
  inputs float64 ones (never a silent conversion); integer inputs (ids) pass
  through and get no gradient; other dtypes are a ``UserError``.
- Gradients are computed only for the inputs that need them (``needs_input_grad``):
  one backward kernel per set of inputs.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from . import dsl, dtypes
from .bridge import MAX_SHAPES, ShapeBounded, SpecCache, tensor_params
from .errors import UserError
from .ir import Tensor

_TO_TE = {torch.float32: "float32", torch.float64: "float64", torch.int32: "int32", torch.int64: "int64",
          torch.bool: "bool"}
_TO_TORCH = {v: k for k, v in _TO_TE.items()}


class _Spec:
    """The te_grad graph of an op for one combination of input shapes and dtypes, and its kernels."""

    def __init__(self, fn, names, attrs, key, save, threads):
        self.key = key
        self.save = save
        self.threads = threads
        self.inputs = [dsl.placeholder(shape, dtype=dt, name=n) for n, (shape, dt) in zip(names, key)]
        out = fn(*self.inputs, **attrs)
        self.single = isinstance(out, Tensor)
        self.outputs = [out] if self.single else list(out)
        for y in self.outputs:
            if not isinstance(y, Tensor):
                raise UserError(f"{getattr(fn, '__name__', 'the op')} must return te_grad tensors, got {y!r}")
            if y.dtype not in _TO_TORCH:
                raise UserError(f"output {y.name} has dtype {y.dtype}, which PyTorch cannot receive")
        self.differentiable = [dtypes.is_float(x.dtype) for x in self.inputs]
        self.plain_outputs = None  # outputs distinct computed tensors: the kernel writes torch's memory
        self._vjp = None
        self._backward: Dict[tuple, object] = {}
        self._lock = threading.Lock()

    @property
    def vjp(self):
        """The forward kernel and the residual choice (compiled on first use)."""
        with self._lock:
            if self._vjp is None:
                from .residuals import build_vjp
                wrt = [x for x, d in zip(self.inputs, self.differentiable) if d]
                options = {} if self.threads is None else {"threads": self.threads}
                self._vjp = build_vjp(self.outputs, self.inputs, wrt=wrt, save=self.save, **options)
            return self._vjp

    def residual_shapes(self):
        return [(t.shape, t.dtype) for t in self.vjp.residuals]

    def saved_from(self, outputs, residuals):
        """The saved values in the VJP's ``saved`` order, from the forward op's results."""
        by_id = {id(t): v for t, v in zip(self.outputs + self.vjp.residuals, list(outputs) + list(residuals))}
        return [by_id[id(t)] for t in self.vjp.saved]

    def backward_for(self, needs: Tuple[bool, ...]):
        """The VJP whose backward kernel computes the gradients of the inputs in ``needs``
        from the residuals of :attr:`vjp` (its ``saved`` are some of those)."""
        with self._lock:
            got = self._backward.get(needs)
        if got is not None:
            return got
        vjp = self.vjp
        if all(needs[k] == self.differentiable[k] for k in range(len(needs))):
            got = vjp
        else:
            from .residuals import build_vjp
            wrt = [x for x, n in zip(self.inputs, needs) if n]
            options = {} if self.threads is None else {"threads": self.threads}
            got = build_vjp(self.outputs, self.inputs, wrt=wrt, save=vjp.saved, **options)
        with self._lock:
            self._backward[needs] = got
        return got


def check_device(name: str, device) -> None:
    """te_grad kernels run on the CPU ("meta" tensors are fine: torch.compile traces with them)."""
    if device.type not in ("cpu", "meta"):
        raise UserError(f"argument {name} is on {device}: te_grad kernels run on the CPU; move it with .cpu()")


def _key(args, names) -> tuple:
    key = []
    for name, a in zip(names, args):
        if not isinstance(a, torch.Tensor):
            raise UserError(f"argument {name} must be a torch.Tensor, got {type(a).__name__}")
        check_device(name, a.device)
        dt = _TO_TE.get(a.dtype)
        if dt is None:
            raise UserError(f"argument {name} has dtype {a.dtype}; te_grad supports "
                            f"{', '.join(str(d) for d in _TO_TORCH.values())}")
        key.append((tuple(int(n) for n in a.shape), dt))  # a symbolic size is specialized: one build per shape
    return tuple(key)


def _numpy(a: torch.Tensor) -> np.ndarray:
    a = a.detach()
    if not a.is_contiguous():
        a = a.contiguous()
    return a.numpy()


def _empty(shape, dtype, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=_TO_TORCH[dtype], device=like.device)


class TorchOp(ShapeBounded):
    """A te_grad op registered with ``torch.library`` (see the module docstring).

    Calling it runs the op on torch tensors; ``fwd`` and ``bwd`` are the registered
    operators (``torch.ops.NS.NAME_fwd`` / ``_bwd``); ``spec(*tensors)`` the te_grad
    graph and kernels for those shapes and dtypes. At most ``max_shapes`` of those are
    kept (an attribute too; the least recently used are dropped and rebuilt when seen
    again), so a run over ever new shapes stays flat in memory."""

    def __init__(self, name: str, fn: Callable, save=None, threads: Optional[int] = None,
                 max_shapes: int = MAX_SHAPES, **attrs):
        if "::" not in name:
            raise UserError(f"custom_op name {name!r} must be 'namespace::name'")
        self.name = name
        self.fn = fn
        self.names, defaults = tensor_params(fn)
        unknown = set(attrs) - set(defaults)
        if unknown:
            raise UserError(f"{name}: {sorted(unknown)} are not attributes of {fn.__name__} "
                            f"(its attributes: {sorted(defaults)})")
        self.attrs = {**defaults, **attrs}
        self.save = save
        self.threads = threads
        self._specs = SpecCache(max_shapes, on_evict=self._forget)
        self._seen: Dict[tuple, _Spec] = {}  # torch's own shapes, dtypes and device: the fast path
        self._register()

    def _forget(self, spec: _Spec):
        for k in [k for k, v in list(self._seen.items()) if v is spec]:
            self._seen.pop(k, None)

    def spec(self, *args) -> _Spec:
        try:  # the common case: shapes, dtypes and device seen before
            spec = self._seen[tuple((a.shape, a.dtype, a.device) for a in args)]
        except (KeyError, AttributeError, TypeError):
            spec = None
        key = spec.key if spec is not None else _key(args, self.names)
        with self._specs.lock:  # refreshed in the LRU order (or made); the fast key points to it
            spec = self._specs.get(key, lambda: _Spec(self.fn, self.names, self.attrs, key, self.save,
                                                      self.threads))
            self._seen[tuple((a.shape, a.dtype, a.device) for a in args)] = spec
        return spec

    def __call__(self, *args):
        if len(args) != len(self.names):
            raise UserError(f"{self.name} takes {len(self.names)} tensors ({', '.join(self.names)}), "
                            f"got {len(args)}")
        if _REGISTERED.get(self.name) is not self:
            # another op took this name since: torch.ops and self.fwd run that one's code
            # now, this object keeps running its own (eagerly, as an autograd.Function)
            results = _Superseded.apply(self, *args)
            return results[0] if len(results) == 1 else results
        n_out = _output_count(self, *args)
        results = self.fwd(*args)
        return results[0] if n_out == 1 else tuple(results[:n_out])

    # -- registration ------------------------------------------------------------------------
    def _register(self):
        ns, base = self.name.split("::", 1)
        arglist = ", ".join(f"Tensor {n}" for n in self.names)
        n_in = len(self.names)
        op = self

        def forward_impl(*args):
            spec = op.spec(*args)
            kern = spec.vjp.forward
            if spec.plain_outputs is None:
                spec.plain_outputs = not any(t.is_placeholder for t in kern.outputs) and \
                    len({id(t) for t in kern.outputs}) == len(kern.outputs)
            if not spec.plain_outputs:  # an output that is an input, or twice the same tensor
                got = kern(*[_numpy(a) for a in args])
                got = got if isinstance(got, tuple) else (got,)
                return [torch.from_numpy(np.array(g)) for g in got]
            args = [a if a.is_contiguous() else a.contiguous() for a in args]
            results = [torch.empty(t.shape, dtype=_TO_TORCH[t.dtype]) for t in kern.outputs]
            kern.run_pointers([a.data_ptr() for a in args], [r.data_ptr() for r in results])
            return results

        def forward_fake(*args):
            spec = op.spec(*args)
            return [_empty(t.shape, t.dtype, args[0]) for t in spec.outputs] + \
                   [_empty(shape, dt, args[0]) for shape, dt in spec.residual_shapes()]

        self.fwd = torch.library.custom_op(f"{ns}::{base}_fwd", mutates_args=(),
                                           schema=f"({arglist}) -> Tensor[]")(forward_impl)
        self.fwd.register_fake(forward_fake)

        def backward_impl(inputs: List[torch.Tensor], residuals: List[torch.Tensor], grads: List[torch.Tensor],
                          needs: List[bool]):
            spec = op.spec(*inputs)
            vjp = spec.backward_for(tuple(needs))
            if vjp.backward is None:
                return []
            by_input = {id(x): a for x, a in zip(spec.inputs, inputs)}
            by_tensor = {id(t): r for t, r in zip(spec.vjp.saved, residuals)}
            args = [by_tensor[id(t)] for t in vjp.saved] + [by_input[id(x)] for x in vjp.needed_inputs] + \
                [g for g, used in zip(grads, vjp.head_used) if used]
            args = [a if a.is_contiguous() else a.contiguous() for a in args]
            kern = vjp.backward
            results = [torch.empty(t.shape, dtype=_TO_TORCH[t.dtype]) for t in kern.outputs]
            kern.run_pointers([a.data_ptr() for a in args], [r.data_ptr() for r in results])
            return results

        def backward_fake(inputs, residuals, grads, needs):
            spec = op.spec(*inputs)
            return [_empty(x.shape, x.dtype, inputs[0]) for x, n in zip(spec.inputs, needs) if n]

        self.bwd = torch.library.custom_op(
            f"{ns}::{base}_bwd", mutates_args=(),
            schema="(Tensor[] inputs, Tensor[] residuals, Tensor[] grads, bool[] needs) -> Tensor[]")(backward_impl)
        self.bwd.register_fake(backward_fake)

        def setup_context(ctx, inputs, output):
            spec = op.spec(*inputs)
            n_out = len(spec.outputs)
            saved = spec.saved_from(output[:n_out], output[n_out:])
            ctx.save_for_backward(*inputs, *saved)
            ctx.n_in = n_in
            ctx.n_out = n_out

        def backward(ctx, grads):
            return _input_gradients(op, ctx, ctx.needs_input_grad, grads, op.bwd)

        self.fwd.register_autograd(backward, setup_context=setup_context)
        self._forward_impl, self._backward_impl = forward_impl, backward_impl
        _REGISTERED[self.name] = self


#: the op that holds each name now (a name registered again goes to the newer op)
_REGISTERED: Dict[str, "TorchOp"] = {}


def _input_gradients(op: "TorchOp", ctx, needs_input_grad, grads, run_backward):
    """The gradients of the inputs saved in ``ctx`` from those of the outputs, by
    ``run_backward(inputs, residuals, output gradients, needs)``."""
    tensors = ctx.saved_tensors
    inputs, saved = list(tensors[:ctx.n_in]), list(tensors[ctx.n_in:])
    spec = op.spec(*inputs)
    needs = [bool(n) and d for n, d in zip(needs_input_grad, spec.differentiable)]
    if not any(needs):
        return tuple([None] * ctx.n_in)
    heads = []
    for g, y in zip(list(grads)[:ctx.n_out], spec.outputs):
        heads.append(g if g is not None else torch.zeros(y.shape, dtype=_TO_TORCH[y.dtype]))
    got = iter(run_backward(inputs, saved, heads, needs))
    return tuple(next(got) if n else None for n in needs)


class _Superseded(torch.autograd.Function):
    """An op whose name was registered again by another op: its own forward and backward
    implementations, called directly instead of through torch's dispatcher."""

    @staticmethod
    def forward(ctx, op, *args):
        results = op._forward_impl(*args)
        spec = op.spec(*args)
        n_out = len(spec.outputs)
        ctx.save_for_backward(*args, *spec.saved_from(results[:n_out], results[n_out:]))
        ctx.op, ctx.n_in, ctx.n_out = op, len(args), n_out
        return tuple(results[:n_out])

    @staticmethod
    def backward(ctx, *grads):
        return (None,) + _input_gradients(ctx.op, ctx, ctx.needs_input_grad[1:], grads, ctx.op._backward_impl)


@torch._dynamo.assume_constant_result
def _output_count(op: "TorchOp", *args) -> int:
    """How many of the forward operator's results are outputs (the rest are residuals); run as
    plain Python when torch.compile traces a call (te_grad's graph building is not traced)."""
    return len(op.spec(*args).outputs)


def custom_op(name: str, fn: Callable, *, save=None, threads: Optional[int] = None,
              max_shapes: int = MAX_SHAPES, **attrs) -> TorchOp:
    """Register the te_grad op ``fn`` as the PyTorch operator ``name`` (``"namespace::name"``).

    ``save`` picks the residuals (see :func:`te_grad.build_vjp`); ``threads`` the kernels'
    threads (default: ``TE_GRAD_NUM_THREADS`` or all CPUs); ``max_shapes`` how many
    combinations of input shapes and dtypes stay built (least recently used dropped first);
    other keywords override attributes of ``fn`` (its parameters with a default value)."""
    return TorchOp(name, fn, save=save, threads=threads, max_shapes=max_shapes, **attrs)
