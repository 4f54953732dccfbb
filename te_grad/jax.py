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

Dynamic shapes: ``custom_op(fn, dynamic_dims={"x": 0})`` declares dimensions whose extent
changes between calls (a batch). The op's graph is then built once on a size variable
(``tg.var``) for them and its kernels serve every extent: ``jax.jit`` still traces each new
shape (JAX's own rule), but every trace finds the same te_grad graph and kernels, so no
LLVM build happens after the first. Shape polymorphism (``jax.export`` with
``jax.export.symbolic_shape``) is refused with a ``UserError``: JAX cannot lower the host
callbacks the op runs in with symbolic result shapes.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import jax

from .errors import UserError
from .frontends.base import MAX_SHAPES, FrontendOp


def _shapes(tensors, sizes):
    """The result shapes of a callback: the tensors' shapes at the call's ``sizes``."""
    for name, n in sizes.by_name.items():
        if not isinstance(n, (int, np.integer)):
            raise UserError(f"the size {name} is the symbolic dimension {n}: JAX cannot run host callbacks "
                            "(which run te_grad's kernels) on symbolic shapes (jax.export shape "
                            "polymorphism); use jax.jit, which traces each shape and reuses one te_grad "
                            "kernel for dynamic_dims")
    return [jax.ShapeDtypeStruct(sizes.shape(t.shape), np.dtype(t.dtype)) for t in tensors]


class JaxOp(FrontendOp):
    """A te_grad op as a JAX function with a custom VJP (see the module docstring); at most
    ``max_shapes`` combinations of input shapes and dtypes stay built (an attribute too)."""

    framework = "JAX"
    noun = "arrays"

    def __init__(self, fn: Callable, save=None, threads: Optional[int] = None, max_shapes: int = MAX_SHAPES,
                 dynamic_dims=None, **attrs):
        super().__init__(fn, save=save, threads=threads, max_shapes=max_shapes, dynamic_dims=dynamic_dims,
                         **attrs)
        self._call = self._make()

    def shape_dtype(self, name, a):
        return a.shape, np.dtype(a.dtype).name

    def symbolic_size(self, n):
        if isinstance(n, (int, np.integer)):
            return None
        return str(n)  # a symbolic dimension of shape polymorphism

    def __call__(self, *args):
        self.check_arity(args)
        out = self._call(*args)
        return out[0] if len(out) == 1 else tuple(out)

    def _make(self):
        op = self

        def forward_host(*arrays):
            spec = op.spec(*arrays)  # a kernel on size variables binds them from the arrays
            got = spec.vjp.forward(*[np.asarray(a) for a in arrays])
            return list(got) if isinstance(got, tuple) else [got]

        def backward_host(*arrays):
            spec = op.spec(*arrays[:len(op.names)])
            vjp = spec.vjp
            values = [np.asarray(a) for a in arrays]
            inputs, rest = values[:len(op.names)], values[len(op.names):]
            return vjp.run_backward(rest[:len(vjp.saved)], inputs, rest[len(vjp.saved):])

        def run_forward(args):
            spec, sizes = op.bind(*args)
            kern = spec.vjp.forward
            return jax.pure_callback(forward_host, _shapes(kern.outputs, sizes), *args,
                                     vmap_method="sequential"), spec

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
            spec, sizes = op.bind(*args)
            if spec.vjp.backward is None:
                return tuple(None for _ in args)
            got = jax.pure_callback(backward_host, _shapes(spec.vjp.wrt, sizes), *args, *residuals, *grads,
                                    vmap_method="sequential")
            return spec.spread(got, spec.differentiable)

        call.defvjp(call_fwd, call_bwd)
        return call


def custom_op(fn: Callable, *, save=None, threads: Optional[int] = None, max_shapes: int = MAX_SHAPES,
              dynamic_dims=None, **attrs) -> JaxOp:
    """The te_grad op ``fn`` as a JAX function with a custom VJP (see the module docstring).

    ``save`` picks the residuals (see :func:`te_grad.build_vjp`); ``threads`` the kernels'
    threads; ``max_shapes`` how many combinations of input shapes and dtypes stay built
    (least recently used dropped first); ``dynamic_dims`` declares dimensions whose extent
    changes (``{"x": 0}``, ``{"x": (0, 1)}``, ``["x"]`` for dimension 0): one kernel on size
    variables serves them all; other keywords override attributes of ``fn`` (parameters
    with a default)."""
    return JaxOp(fn, save=save, threads=threads, max_shapes=max_shapes, dynamic_dims=dynamic_dims, **attrs)
