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

from .frontends.base import MAX_SHAPES, FrontendOp


def _shapes(tensors):
    return [jax.ShapeDtypeStruct(t.shape, np.dtype(t.dtype)) for t in tensors]


class JaxOp(FrontendOp):
    """A te_grad op as a JAX function with a custom VJP (see the module docstring); at most
    ``max_shapes`` combinations of input shapes and dtypes stay built (an attribute too)."""

    framework = "JAX"
    noun = "arrays"

    def __init__(self, fn: Callable, save=None, threads: Optional[int] = None, max_shapes: int = MAX_SHAPES,
                 **attrs):
        super().__init__(fn, save=save, threads=threads, max_shapes=max_shapes, **attrs)
        self._call = self._make()

    def shape_dtype(self, name, a):
        return a.shape, np.dtype(a.dtype).name

    def __call__(self, *args):
        self.check_arity(args)
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
            values = [np.asarray(a) for a in arrays]
            inputs, rest = values[:len(op.names)], values[len(op.names):]
            return vjp.run_backward(rest[:len(vjp.saved)], inputs, rest[len(vjp.saved):])

        def run_forward(args):
            spec = op.spec(*args)
            kern = spec.vjp.forward
            return jax.pure_callback(forward_host, _shapes(kern.outputs), *args, vmap_method="sequential"), spec

        @jax.custom_vjp
        def call(*args):
            results, spec = run_forward(args)
            return tuple(results[:len(spec.outputs)])

        def call_fwd(*args):
            results, spec = run_forward(args)
            n_out = len(spec.outputs)
            # the forward kernel returns the outputs then the residuals (its own outputs may be
            # other objects: simplified, or loaded from the build cache)
            residuals = tuple(spec.saved_from(results[:n_out], results[n_out:]))
            return tuple(results[:n_out]), (tuple(args), residuals)

        def call_bwd(saved, grads):
            args, residuals = saved
            spec = op.spec(*args)
            if spec.vjp.backward is None:
                return tuple(None for _ in args)
            got = jax.pure_callback(backward_host, _shapes(spec.vjp.wrt), *args, *residuals, *grads,
                                    vmap_method="sequential")
            return spec.spread(got, spec.differentiable)

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
