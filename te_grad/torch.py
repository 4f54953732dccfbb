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
``NAME_bwd``. Calling ``op(...)`` runs ``NAME_fwd`` and returns the outputs; a plain
eager call (strided CPU tensors, no subclass, no dispatch or function mode, no
``torch.func`` transform, no tracing) skips torch's dispatcher and does the same work
directly: the forward kernel, and an ``autograd.Function`` whose backward runs the backward
kernel from the saved residuals with the spec its forward used (a backward that builds a
graph, ``create_graph=True``, still runs ``NAME_bwd``). The key, the shapes of the results
and where each kernel argument comes from are worked out on the first call of a shape; a
call with the shapes, dtypes and device of the op's previous call reuses its spec without
re-keying: the fixed cost of a call is what ``benchmarks/bridge_overhead.py`` measures.

Registering a name again (re-running a notebook cell) works as it does with
``torch.library``: the newer op takes the name, and ``torch.ops.NS.NAME_fwd`` runs its
code. The earlier :class:`TorchOp` object keeps its own behaviour: called, it runs its
own kernels (eagerly, through a ``torch.autograd.Function``, since its operators now
belong to the newer op).

Dynamic shapes: a dimension declared in ``dynamic_dims`` (``{"x": 0}``), or made symbolic
by ``torch.compile`` (default settings once it changes, ``dynamic=True``,
``torch._dynamo.mark_dynamic``), gets a size variable: the op's graph and its two kernels are
built once on it and serve every extent, the fake implementations return symbolic output
shapes (the graph's size expressions evaluated on the ``SymInt``s), and the op keeps the
dimension dynamic for its later calls, eager ones included. Other dimensions keep exact
kernels per shape (see :mod:`te_grad.frontends.base`).

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

from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from .errors import UserError
from .frontends.base import MAX_SHAPES, NO_SIZES, FrontendOp, dtype_table

_TO_TE = dtype_table(lambda name: getattr(torch, name))
_TO_TORCH = {v: k for k, v in _TO_TE.items()}


def check_device(name: str, device) -> None:
    """te_grad kernels run on the CPU ("meta" tensors are fine: torch.compile traces with them)."""
    if device.type not in ("cpu", "meta"):
        raise UserError(f"argument {name} is on {device}: te_grad kernels run on the CPU; move it with .cpu()")


def _numpy(a: torch.Tensor) -> np.ndarray:
    a = a.detach()
    if not a.is_contiguous():
        a = a.contiguous()
    return a.numpy()


def _empty(shape, dtype, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=_TO_TORCH[dtype], device=like.device)


class TorchOp(FrontendOp):
    """A te_grad op registered with ``torch.library`` (see the module docstring).

    Calling it runs the op on torch tensors; ``fwd`` and ``bwd`` are the registered
    operators (``torch.ops.NS.NAME_fwd`` / ``_bwd``); ``spec(*tensors)`` the te_grad
    graph and kernels for those shapes and dtypes. At most ``max_shapes`` of those are
    kept (an attribute too; the least recently used are dropped and rebuilt when seen
    again), so a run over ever new shapes stays flat in memory."""

    framework = "PyTorch"
    noun = "tensors"
    dtypes = _TO_TE

    def __init__(self, name: str, fn: Callable, save=None, threads: Optional[int] = None,
                 max_shapes: int = MAX_SHAPES, dynamic_dims=None, **attrs):
        if "::" not in name:
            raise UserError(f"custom_op name {name!r} must be 'namespace::name'")
        self.name = name
        super().__init__(fn, save=save, threads=threads, max_shapes=max_shapes, label=name,
                         dynamic_dims=dynamic_dims, **attrs)
        self._register()

    def shape_dtype(self, name, a):
        if not isinstance(a, torch.Tensor):
            raise UserError(f"argument {name} must be a torch.Tensor, got {type(a).__name__}")
        check_device(name, a.device)
        return a.shape, a.dtype

    def fast_key(self, args):
        return tuple([(a.shape, a.dtype, a.device) for a in args])  # torch's own shapes, dtypes and device

    def symbolic_size(self, n):
        if isinstance(n, torch.SymInt):
            expr = n.node.expr
            return None if getattr(expr, "is_number", False) else str(expr)
        return None

    def __call__(self, *args):
        self.check_arity(args)
        if _REGISTERED.get(self.name) is not self:
            # another op took this name since: torch.ops and self.fwd run that one's code
            # now, this object keeps running its own (eagerly, as an autograd.Function)
            results = _Superseded.apply(self, *args)
            return results[0] if len(results) == 1 else results
        eager = _plain_eager(args)
        if eager is not None:  # nothing for torch's dispatcher to do: te_grad's kernels directly
            spec = self.recent(args, eager[0])
            if spec is None:
                spec, sizes = self.bind(*args)
            else:
                sizes = NO_SIZES
            n_out = len(spec.outputs)
            lean = _lean(spec)
            if eager[1] and torch.is_grad_enabled():
                results = _apply_eager((self, spec, sizes, lean), *args)
            elif lean is not None:
                results = lean.run_forward(args)[:n_out]
            else:
                results = self._run_forward(spec, sizes, args)[:n_out]
            return results[0] if n_out == 1 else tuple(results)
        n_out = _output_count(self, *args)
        results = self.fwd(*args)
        return results[0] if n_out == 1 else tuple(results[:n_out])

    def _run_forward(self, spec, sizes, args) -> list:
        """The forward kernel of ``spec`` on ``args`` (bound to ``sizes``): the outputs, then
        the residuals, as new torch tensors."""
        kern = spec.vjp.forward
        if spec.symbolic and not spec.plain_outputs:  # one kernel for every size: it binds them
            results = [torch.empty(sizes.shape(t.shape), dtype=_TO_TORCH[t.dtype]) for t in kern.outputs]
            kern(*[_numpy(a) for a in args], out=[r.numpy() for r in results])
            return results
        if not spec.plain_outputs:  # an output that is an input, or twice the same tensor
            got = kern(*[_numpy(a) for a in args])
            got = got if isinstance(got, tuple) else (got,)
            return [torch.from_numpy(np.array(g)) for g in got]
        args = [a if a.is_contiguous() else a.contiguous() for a in args]
        if spec.symbolic:  # the sizes bound from the arguments' shapes, by variable name
            results = [torch.empty(sizes.shape(t.shape), dtype=_TO_TORCH[t.dtype]) for t in kern.outputs]
            kern.run_pointers([a.data_ptr() for a in args], [r.data_ptr() for r in results], sizes=sizes.by_name)
            return results
        results = [torch.empty(shape, dtype=dt) for shape, dt in _torch_results(spec, kern)]
        kern.run_pointers([a.data_ptr() for a in args], [r.data_ptr() for r in results])
        return results

    def _run_backward(self, spec, sizes, inputs, residuals, grads, needs) -> list:
        """The gradients of the inputs in ``needs`` (a tuple of bools, one per input), from
        the inputs, the residuals of ``spec``'s forward and the outputs' gradients."""
        vjp = spec.backward_for(needs)
        if vjp.backward is None:
            return []
        args = spec.backward_arguments(vjp, inputs, residuals, grads)
        kern = vjp.backward
        args = [a if a.is_contiguous() else a.contiguous() for a in args]
        if spec.symbolic:
            results = [torch.empty(sizes.shape(t.shape), dtype=_TO_TORCH[t.dtype]) for t in kern.outputs]
            kern.run_pointers([a.data_ptr() for a in args], [r.data_ptr() for r in results], sizes=sizes.by_name)
            return results
        results = [torch.empty(shape, dtype=dt) for shape, dt in _torch_results(spec, kern)]
        kern.run_pointers([a.data_ptr() for a in args], [r.data_ptr() for r in results])
        return results

    # -- registration ------------------------------------------------------------------------
    def _register(self):
        ns, base = self.name.split("::", 1)
        arglist = ", ".join(f"Tensor {n}" for n in self.names)
        n_in = len(self.names)
        op = self

        def forward_impl(*args):
            spec, sizes = op.bind(*args)
            return op._run_forward(spec, sizes, args)

        def forward_fake(*args):
            spec, sizes = op.bind(*args)  # symbolic sizes give symbolic output shapes
            return [_empty(shape, dt, args[0]) for shape, dt in spec.forward_results(sizes)]

        self.fwd = torch.library.custom_op(f"{ns}::{base}_fwd", mutates_args=(),
                                           schema=f"({arglist}) -> Tensor[]")(forward_impl)
        self.fwd.register_fake(forward_fake)

        def backward_impl(inputs: List[torch.Tensor], residuals: List[torch.Tensor], grads: List[torch.Tensor],
                          needs: List[bool]):
            spec, sizes = op.bind(*inputs)
            return op._run_backward(spec, sizes, inputs, residuals, grads, tuple(needs))

        def backward_fake(inputs, residuals, grads, needs):
            spec, sizes = op.bind(*inputs)
            return [_empty(sizes.shape(x.shape), x.dtype, inputs[0]) for x, n in zip(spec.inputs, needs) if n]

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


def _input_gradients(op: "TorchOp", ctx, needs_input_grad, grads, run_backward, spec=None, sizes=None):
    """The gradients of the inputs saved in ``ctx`` from those of the outputs, by
    ``run_backward(inputs, residuals, output gradients, needs)``; ``spec`` and ``sizes``
    those of the forward call (bound again from the inputs when not given)."""
    tensors = ctx.saved_tensors
    inputs, saved = list(tensors[:ctx.n_in]), list(tensors[ctx.n_in:])
    if spec is None:
        spec, sizes = op.bind(*inputs)
    needs = spec.needs(needs_input_grad)
    if not any(needs):
        return tuple([None] * ctx.n_in)
    heads = []
    for g, y in zip(list(grads)[:ctx.n_out], spec.outputs):
        heads.append(g if g is not None else torch.zeros(sizes.shape(y.shape), dtype=_TO_TORCH[y.dtype]))
    return spec.spread(run_backward(inputs, saved, heads, list(needs)), needs)


def _torch_results(spec, kern) -> list:
    """``(shape, torch dtype)`` of the outputs of ``kern``, a kernel of the exact (not
    symbolic) ``spec``: worked out once per kernel and kept with the spec."""
    got = spec.frontend_cache.get(id(kern))
    if got is None or got[0] is not kern:
        got = spec.frontend_cache[id(kern)] = (kern, [(tuple(int(n) for n in t.shape), _TO_TORCH[t.dtype])
                                                     for t in kern.outputs])
    return got[1]


#: the argument types a call can hand to te_grad's kernels without torch's dispatcher
#: (a ``Parameter`` disables ``__torch_function__``); any other type goes through it
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_C = torch._C


def _plain_eager(args) -> Optional[tuple]:
    """For a call that is plain eager PyTorch on plain CPU tensors, ``(its fast key, whether an
    argument requires gradients)``; ``None`` for any other. Running the kernels directly
    (:class:`_Eager`) does what torch's dispatcher would when the call is not traced by
    ``torch.compile`` or ``torch.jit``, no ``TorchDispatchMode`` / ``TorchFunctionMode`` and no
    ``torch.func`` transform (vmap, grad) is active, and every argument is a strided CPU tensor
    whose type is ``torch.Tensor`` (or ``Parameter``: no subclass, ``FakeTensor``, meta tensor).
    Anything else goes through ``torch.ops`` as before."""
    if torch.compiler.is_compiling():  # first: Dynamo reads it as True and traces nothing below
        return None
    if _C._len_torch_dispatch_stack() or _C._len_torch_function_stack() \
            or _C._are_functorch_transforms_active() or _C._get_tracing_state() is not None:
        return None
    key, grad = [], False
    for a in args:
        if type(a) not in _PLAIN_TYPES or not a.is_cpu or a.layout is not torch.strided:
            return None
        key.append((a.shape, a.dtype, _CPU))  # TorchOp.fast_key, the device known
        grad = grad or a.requires_grad
    return tuple(key), grad


_CPU = torch.device("cpu")


def _allocator(shape: tuple, dtype):
    """A function of no argument that returns a new ``torch.empty(shape, dtype=dtype)``: the
    extents passed one by one, which torch parses faster than a tuple (a 0-d shape as ``()``)."""
    if not shape:
        return lambda: torch.empty((), dtype=dtype)
    if len(shape) == 1:
        n = shape[0]
        return lambda: torch.empty(n, dtype=dtype)
    return lambda: torch.empty(*shape, dtype=dtype)


class _Lean:
    """What an eager call of an exact spec whose forward kernel writes distinct outputs
    (``Spec.plain_outputs``) works out once and reuses: the kernels, the shapes and torch dtypes
    of their results, where each saved value sits among the forward's results and, per
    backward mask, where each argument of the backward kernel comes from."""

    def __init__(self, spec):  # kept by the spec: holds no reference to it (no cycle through the kernels)
        self.forward = spec.vjp.forward
        self.results = _torch_results(spec, self.forward)
        self.new_results = [_allocator(shape, dt) for shape, dt in self.results]
        self.n_out = len(spec.outputs)
        self.n_saved = len(spec.vjp.saved)
        n_res = len(self.results) - self.n_out
        self.saved = spec.saved_from(range(self.n_out), range(self.n_out, self.n_out + n_res))
        self._backward = {}  # ctx.needs_input_grad -> (needs, kernel, argument positions, allocators)

    def run_forward(self, args) -> list:
        pointers = [a.data_ptr() for a in args if a.is_contiguous()]
        if len(pointers) < len(args):
            args = [a.contiguous() for a in args]  # kept until the kernel has run
            pointers = [a.data_ptr() for a in args]
        results = [new() for new in self.new_results]
        self.forward.run_pointers(pointers, [r.data_ptr() for r in results])
        return results

    def backward_plan(self, spec, requested: tuple) -> tuple:
        """``(needs, kernel, positions, allocators, spread)`` for ``_Eager``'s
        ``ctx.needs_input_grad`` ``requested`` (its call, then the inputs):
        the kernel's arguments are ``(ctx.saved_tensors + grads)[k]`` for ``k`` in
        ``positions`` (the forward's inputs, then its saved results, then the output
        gradients), its results made by ``allocators``; ``spread`` whether they must be spread
        over the inputs (some input needs no gradient)."""
        got = self._backward.get(requested)
        if got is None:
            needs = spec.needs(requested[1:])  # the first is _Eager's call
            vjp = spec.backward_for(needs) if any(needs) else None
            kern = None if vjp is None else vjp.backward
            if kern is None:
                got = (needs, None, (), (), True)
            else:
                n_in, n_saved = len(spec.inputs), self.n_saved
                positions = tuple(spec.backward_arguments(vjp, range(n_in), range(n_in, n_in + n_saved),
                                                          range(n_in + n_saved, n_in + n_saved + self.n_out)))
                got = (needs, kern, positions,
                       [_allocator(shape, dt) for shape, dt in _torch_results(spec, kern)], not all(needs))
            self._backward[requested] = got
        return got

    def run_backward(self, spec, ctx, grads) -> tuple:
        """The input gradients of :meth:`torch.autograd.Function.backward` (``None`` for the
        inputs that need none), from the tensors saved in ``ctx`` (inputs, then residuals)."""
        requested = ctx.needs_input_grad
        needs, kern, positions, allocators, spread = self._backward.get(requested) or \
            self.backward_plan(spec, requested)
        if kern is None:
            return tuple([None] * len(needs))
        # no gradient is None: autograd materializes them (ctx.materialize_grads, on by default:
        # zeros for an output with no gradient)
        values = ctx.saved_tensors + grads
        args = [values[k] for k in positions]
        pointers = [a.data_ptr() for a in args if a.is_contiguous()]
        if len(pointers) < len(args):
            args = [a.contiguous() for a in args]  # kept until the kernel has run
            pointers = [a.data_ptr() for a in args]
        results = [new() for new in allocators]
        kern.run_pointers(pointers, [r.data_ptr() for r in results])
        return spec.spread(results, needs) if spread else tuple(results)


def _lean(spec):
    """The :class:`_Lean` of ``spec`` (made once), or ``None`` when it has size variables or
    a forward kernel whose outputs are not distinct new tensors."""
    got = spec.frontend_cache.get(_Lean)
    if got is None:
        got = spec.frontend_cache[_Lean] = _Lean(spec) if not spec.symbolic and spec.plain_outputs else False
    return got or None


class _Eager(torch.autograd.Function):
    """A plain eager call (:func:`_plain_eager`) that needs gradients: the forward kernel run
    directly (the spec and sizes bound once, by the call), and the backward kernel from the
    residuals it saved, with the same spec. A backward that builds a graph itself
    (``create_graph=True``) goes through ``NAME_bwd``, as a call through the dispatcher does."""

    @staticmethod
    def forward(ctx, call, *args):
        op, spec, sizes, lean = call
        n_out = len(spec.outputs)
        if lean is None:
            results = op._run_forward(spec, sizes, args)
            ctx.save_for_backward(*args, *spec.saved_from(results[:n_out], results[n_out:]))
        else:
            results = lean.run_forward(args)
            ctx.save_for_backward(*args, *[results[k] for k in lean.saved])
        ctx.call, ctx.n_in, ctx.n_out = call, len(args), n_out
        return tuple(results[:n_out])

    @staticmethod
    def backward(ctx, *grads):
        op, spec, sizes, lean = ctx.call
        if torch.is_grad_enabled() and _REGISTERED.get(op.name) is op:  # create_graph: as the dispatcher does
            run = op.bwd
        elif lean is not None:
            return (None,) + lean.run_backward(spec, ctx, grads)
        else:
            def run(inputs, residuals, heads, needs):
                return op._run_backward(spec, sizes, inputs, residuals, heads, tuple(needs))
        return (None,) + _input_gradients(op, ctx, ctx.needs_input_grad[1:], grads, run, spec, sizes)


def _apply_eager(call, *args):
    """``_Eager.apply(call, *args)``. ``Function.apply`` binds default arguments for a
    ``setup_context`` (``_Eager`` has none), hands over to ``torch.func`` when a transform is
    active (:func:`_plain_eager` saw none) and otherwise unwraps dead ``torch.func`` wrappers
    and calls the C++ ``apply``: that last step is all that is left to do here."""
    return _C_APPLY(call, *[_UNWRAP(a) for a in args])


try:
    _C_APPLY = torch._C._FunctionBase.__dict__["apply"].__get__(None, _Eager)
    _UNWRAP = torch._C._functorch.unwrap_if_dead
except (AttributeError, KeyError):  # a PyTorch without them: the public path
    _apply_eager = _Eager.apply  # noqa: F811


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
              max_shapes: int = MAX_SHAPES, dynamic_dims=None, **attrs) -> TorchOp:
    """Register the te_grad op ``fn`` as the PyTorch operator ``name`` (``"namespace::name"``).

    ``save`` picks the residuals (see :func:`te_grad.build_vjp`); ``threads`` the kernels'
    threads (default: ``TE_GRAD_NUM_THREADS`` or all CPUs); ``max_shapes`` how many
    combinations of input shapes and dtypes stay built (least recently used dropped first);
    ``dynamic_dims`` declares dimensions whose extent changes between calls
    (``{"x": 0, "labels": 0}``, ``{"x": (0, 1)}``, or ``["x", "labels"]`` for dimension 0):
    one kernel built on size variables serves them all, eager or compiled (dimensions
    torch.compile makes symbolic become dynamic by themselves); other keywords override
    attributes of ``fn`` (its parameters with a default value)."""
    return TorchOp(name, fn, save=save, threads=threads, max_shapes=max_shapes, dynamic_dims=dynamic_dims,
                   **attrs)


from .torch_import import ImportedModel, coverage, import_model  # noqa: E402 - needs the names above
from . import torch_dynamo as _dynamo  # noqa: E402
from .torch_dynamo import FallbackWarning  # noqa: E402,F401


class Backend(_dynamo.Backend):
    """A ``torch.compile`` backend: supported subgraphs as te_grad ops, the rest in PyTorch
    (see :mod:`te_grad.torch_dynamo`); ``stats``, ``ops`` and ``notes`` are its own."""

    make_op = staticmethod(custom_op)


#: ``torch.compile(model, backend=te_grad.torch.backend)`` (see :mod:`te_grad.torch_dynamo`)
backend = Backend()
