"""te_grad ops as JAX functions: a ``jax.custom_vjp`` whose passes call te_grad's kernels.

::

    import jax, te_grad.jax as tgj
    f = tgj.custom_op(causal_conv1d)       # te_grad tensors in and out, as for te_grad.torch
    y = f(x, w)                            # jax arrays in and out
    jax.jit(jax.grad(lambda x, w: (f(x, w) ** 2).sum()))(x, w)

The forward pass runs te_grad's forward kernel, which also returns the residuals the
backward needs; the backward pass runs the backward kernel on them
(:func:`te_grad.build_vjp`). Both are host callbacks (``jax.pure_callback``), so they
work under ``jax.jit``, ``jax.grad``, ``jax.value_and_grad`` and ``jax.vmap`` (which
calls the kernels once per element of the mapped axis). Kernels are built per
combination of input shapes and dtypes, at trace time, and cached (at most
``max_shapes`` combinations, least recently used dropped first, as in te_grad.torch). Shapes and dtypes
follow the inputs (float64 needs ``jax.config.update("jax_enable_x64", True)``);
integer inputs (ids) get no gradient.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import jax

from . import dsl, dtypes
from .errors import UserError
from .ir import Tensor
from .bridge import MAX_SHAPES, ShapeBounded, SpecCache, tensor_params

_SUPPORTED = ("float32", "float64", "int32", "int64", "bool")


class _Spec:
    """The te_grad graph and kernels of the op for one combination of input shapes and dtypes."""

    def __init__(self, fn, names, attrs, key, save, threads):
        from .residuals import build_vjp
        self.inputs = [dsl.placeholder(shape, dtype=dt, name=n) for n, (shape, dt) in zip(names, key)]
        out = fn(*self.inputs, **attrs)
        self.single = isinstance(out, Tensor)
        self.outputs = [out] if self.single else list(out)
        for y in self.outputs:
            if not isinstance(y, Tensor):
                raise UserError(f"{getattr(fn, '__name__', 'the op')} must return te_grad tensors, got {y!r}")
        self.differentiable = [dtypes.is_float(x.dtype) for x in self.inputs]
        wrt = [x for x, d in zip(self.inputs, self.differentiable) if d]
        options = {} if threads is None else {"threads": threads}
        self.vjp = build_vjp(self.outputs, self.inputs, wrt=wrt, save=save, **options)

    def shapes(self, tensors):
        return [jax.ShapeDtypeStruct(t.shape, np.dtype(t.dtype)) for t in tensors]


class JaxOp(ShapeBounded):
    """A te_grad op as a JAX function with a custom VJP (see the module docstring); at most
    ``max_shapes`` combinations of input shapes and dtypes stay built (an attribute too)."""

    def __init__(self, fn: Callable, save=None, threads: Optional[int] = None, max_shapes: int = MAX_SHAPES,
                 **attrs):
        self.fn = fn
        self.names, defaults = tensor_params(fn)
        unknown = set(attrs) - set(defaults)
        if unknown:
            raise UserError(f"{sorted(unknown)} are not attributes of {fn.__name__} (its attributes: "
                            f"{sorted(defaults)})")
        self.attrs = {**defaults, **attrs}
        self.save = save
        self.threads = threads
        self._specs = SpecCache(max_shapes)
        self._call = self._make()

    def spec(self, *args) -> _Spec:
        key = []
        for name, a in zip(self.names, args):
            dt = np.dtype(a.dtype).name
            if dt not in _SUPPORTED:
                raise UserError(f"argument {name} has dtype {dt}; te_grad supports {', '.join(_SUPPORTED)}")
            key.append((tuple(a.shape), dt))
        key = tuple(key)
        return self._specs.get(key, lambda: _Spec(self.fn, self.names, self.attrs, key, self.save, self.threads))

    def __call__(self, *args):
        if len(args) != len(self.names):
            raise UserError(f"{getattr(self.fn, '__name__', 'the op')} takes {len(self.names)} arrays "
                            f"({', '.join(self.names)}), got {len(args)}")
        out = self._call(*args)
        return out[0] if len(out) == 1 else tuple(out)

    def _make(self):
        op = self

        def forward_host(*arrays):
            spec = op.spec(*arrays)
            got = spec.vjp.forward(*[np.asarray(a) for a in arrays])
            return list(got) if isinstance(got, tuple) else [got]

        def backward_host(*arrays):
            spec = op.spec(*arrays[:len(op.names)])
            vjp = spec.vjp
            rest = arrays[len(op.names):]
            residuals, heads = rest[:len(vjp.saved)], rest[len(vjp.saved):]
            grads = vjp.run_backward([np.asarray(r) for r in residuals], [np.asarray(a) for a in
                                                                          arrays[:len(op.names)]],
                                     [np.asarray(h) for h in heads])
            return grads

        def run_forward(args):
            spec = op.spec(*args)
            kern = spec.vjp.forward
            return jax.pure_callback(forward_host, spec.shapes(kern.outputs), *args, vmap_method="sequential"), spec

        @jax.custom_vjp
        def call(*args):
            results, spec = run_forward(args)
            return tuple(results[:len(spec.outputs)])

        def call_fwd(*args):
            results, spec = run_forward(args)
            n_out = len(spec.outputs)
            # the forward kernel returns vjp.outputs then vjp.residuals (its own outputs may be
            # other objects: simplified, or loaded from the build cache)
            by_id = {id(t): r for t, r in zip(spec.vjp.outputs + spec.vjp.residuals, results)}
            residuals = tuple(by_id[id(t)] for t in spec.vjp.saved)
            return tuple(results[:n_out]), (tuple(args), residuals)

        def call_bwd(saved, grads):
            args, residuals = saved
            spec = op.spec(*args)
            if spec.vjp.backward is None:
                return tuple(None for _ in args)
            got = jax.pure_callback(backward_host, spec.shapes(spec.vjp.wrt), *args, *residuals, *grads,
                                    vmap_method="sequential")
            got = iter(got)
            return tuple(next(got) if d else None for d in spec.differentiable)

        call.defvjp(call_fwd, call_bwd)
        return call


def custom_op(fn: Callable, *, save=None, threads: Optional[int] = None, max_shapes: int = MAX_SHAPES,
              **attrs) -> JaxOp:
    """The te_grad op ``fn`` as a JAX function with a custom VJP (see the module docstring).

    ``save`` picks the residuals (see :func:`te_grad.build_vjp`); ``threads`` the kernels'
    threads; ``max_shapes`` how many combinations of input shapes and dtypes stay built
    (least recently used dropped first); other keywords override attributes of ``fn``
    (parameters with a default)."""
    return JaxOp(fn, save=save, threads=threads, max_shapes=max_shapes, **attrs)
