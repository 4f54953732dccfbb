"""The operator table and what every family of rules shares.

:data:`RULES` maps an ATen operator overload (``"aten.relu.default"``) to its rule,
``rule(t, *args, **kwargs)`` of the :class:`~te_grad.frontends.translate.Translator` ``t`` and
the node's arguments with te_grad values substituted; :func:`rule` registers one.
Arithmetic and the float functions (``rule(..., promote=True)``) first cast integer and
boolean tensor operands to the float dtype PyTorch recorded for the result
(:func:`_promoted`): an int64 tensor times a Python float is float64 under
``torch.set_default_dtype(torch.float64)``, not float32 widened after.
"""
from __future__ import annotations

import numbers
from typing import Callable, Dict

from ... import dsl, dtypes, nn
from ...errors import UserError
from ...ir import Tensor
from ..translate import dtype_of


#: operator name -> rule
RULES: Dict[str, Callable] = {}


#: composite operators ``torch.export`` keeps whole (not decomposed) because a rule here covers them
KEEP = ("aten.scaled_dot_product_attention.default", "aten.linear.default", "aten.roll.default",
        "aten.detach.default",  # decomposed, ``detach`` is ``alias``: its gradient's stop lost
        # decomposed above 25 rows, ``sqrt`` of a matrix product: a zero distance's gradient NaN
        "aten.cdist.default", "aten._euclidean_dist.default",
        "aten.std.correction", "aten.std_mean.correction",  # decomposed, sqrt(var): NaN gradient at 0
        "aten.hardswish.default", "aten.hardsigmoid.default",  # decomposed, another gradient at x = +-3
        # decomposed, a NaN gradient where the unselected piece overflows or divides by 0
        "aten.softplus.default", "aten.binary_cross_entropy.default", "aten.sinc.default",
        "aten.xlogy.Tensor", "aten.special_xlog1py.default",  # decomposed, x's gradient 0 at x = 0
        "aten.special_entr.default")  # decomposed, its gradient at 0 is 0 (PyTorch's inf): no rule, refused


def rule(*names: str, promote: bool = False):
    """Register the decorated function as the rule of each operator in ``names``; with
    ``promote`` (arithmetic and the float functions), its integer and boolean tensor operands
    are first cast to the float dtype PyTorch recorded (:func:`_promoted`)."""
    def deco(fn):
        for n in names:
            if n in RULES:
                raise RuntimeError(f"two rules for {n}")
            RULES[n] = _promoted(fn) if promote else fn
        return fn
    return deco


def _promoted(rule_fn: Callable) -> Callable:
    """``rule_fn`` with its integer and boolean tensor operands first cast to the float dtype
    PyTorch recorded for the node's result: PyTorch gives an integer tensor times a Python
    float the default dtype (float64 after ``torch.set_default_dtype``), where te_grad's own
    promotion would compute it in float32 and the result be widened after."""
    def apply(t, *args, **kw):
        val = getattr(getattr(t, "node", None), "meta", {}).get("val")
        want = dtype_of(getattr(val, "dtype", None))
        if want is not None and dtypes.is_float(want):
            args = [dsl.compute(a.shape, lambda *i, a=a: dsl.cast(want, a[i]), name="to_float")
                    if isinstance(a, Tensor) and not dtypes.is_float(a.dtype) else a for a in args]
        return rule_fn(t, *args, **kw)
    return apply


def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _axis(d, ndim: int) -> int:
    if not is_int(d):
        raise UserError(f"dimension {d!r} is not an int")
    d = int(d)
    if not -max(ndim, 1) <= d < max(ndim, 1):
        raise UserError(f"dimension {d} is out of range for a tensor of rank {ndim}")
    return d % max(ndim, 1)


def _axes(dims, ndim: int):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(ndim))
    if is_int(dims):
        dims = [dims]
    return tuple(sorted({_axis(d, ndim) for d in dims}))


def on_a_scalar(rule_fn: Callable) -> Callable:
    """``rule_fn``, a rule over axes of its first operand, applied to a 0-d tensor as PyTorch
    applies it (``dim`` 0 or -1, or none: the one element): the rule runs on the tensor as a
    vector of one element and its results come back 0-d (``keepdim`` keeps no axis there)."""
    def apply(t, x, *args, **kw):
        if not (isinstance(x, Tensor) and x.ndim == 0):
            return rule_fn(t, x, *args, **kw)
        out = rule_fn(t, nn.reshape(x, (1,), name="as_vector"), *args, **kw)

        def scalar(v):
            return nn.reshape(v, (), name="as_scalar") if isinstance(v, Tensor) and v.ndim == 1 else v
        return tuple(scalar(v) for v in out) if isinstance(out, tuple) else scalar(out)
    return apply


def _float(x: Tensor) -> str:
    return x.dtype if dtypes.is_float(x.dtype) else dtypes.FLOAT32


def unary(fn: Callable, name: str, floating: bool = True):
    """A rule applying ``fn`` elementwise (integers converted to float32 first when ``floating``)."""
    def apply(t, x):
        if not isinstance(x, Tensor):
            raise UserError(f"{name}: expected a tensor, got {x!r}")
        if floating and not dtypes.is_float(x.dtype):
            return dsl.compute(x.shape, lambda *i: fn(dsl.cast(dtypes.FLOAT32, x[i])), name=name)
        return dsl.compute(x.shape, lambda *i: fn(x[i]), name=name)
    return apply


def binary(fn: Callable, name: str):
    """A rule applying ``fn`` to two operands (tensors or numbers) under numpy broadcasting."""
    def apply(t, a, b, **kw):
        return nn.elementwise._binary(name, fn, a, b)
    return apply


def _dtype(dtype, default=dtypes.FLOAT32) -> str:
    got = dtype_of(dtype)
    return got if got is not None else default
