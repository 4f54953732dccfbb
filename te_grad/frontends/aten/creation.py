"""Rules that make tensors or sizes from nothing: ``full``, ``empty``, ``arange``, ``sym_size``.

- ``empty`` is zeros (a program that reads it before writing has no defined value in PyTorch).
- ``arange(start, end, step)`` has ``ceil((end - start) / step)`` elements
  ``start + i * step``; an end known only at run time (a size expression) takes step 1.
"""
from __future__ import annotations

import math
import numbers

from ... import dsl, dtypes
from ...errors import UserError
from .table import _axis, _dtype, is_int, rule


@rule("aten.sym_size.int")
def _sym_size(t, x, dim):
    return x.shape[_axis(dim, x.ndim)]


@rule("aten.sym_numel.default")
def _sym_numel(t, x):
    n = 1
    for s in x.shape:
        n = n * s
    return n


@rule("aten.full.default")
def _full(t, size, value, dtype=None, layout=None, device=None, pin_memory=None):
    dt = _dtype(dtype, dtypes.FLOAT32 if isinstance(value, float) else dtypes.INT64)
    return dsl.compute(tuple(size), lambda *i: dsl.const(value, dt), name="full")


@rule("aten.empty.memory_format")
def _empty(t, size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """A tensor whose values PyTorch leaves undefined (``Dropout2d`` draws its mask into one):
    zeros here."""
    return _full(t, size, 0.0 if dtype is None or dtype.is_floating_point else 0, dtype)


@rule("aten.scalar_tensor.default")
def _scalar_tensor(t, value, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(t, (), value, dtype)


@rule("aten.full_like.default")
def _full_like(t, x, value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _full(t, x.shape, value, dtype if dtype is not None else x.dtype)


def _arange_length(start, end, step):
    if not is_int(step) and not isinstance(step, float):
        raise UserError(f"arange: step must be a number, got {step!r}")
    if step == 0:
        raise UserError("arange: step must not be 0")
    if all(is_int(v) for v in (start, end, step)):
        return max(-(-(end - start) // step), 0)
    if all(isinstance(v, numbers.Real) for v in (start, end, step)):
        return max(int(math.ceil((end - start) / step)), 0)
    if step == 1:   # a size expression as the end (a run-time length)
        return end - start
    raise UserError(f"arange({start!r}, {end!r}, {step!r}): a run-time bound with a step other than 1 "
                    "is not translated")


@rule("aten.arange.start_step", "aten.arange.start", "aten.arange.default")
def _arange(t, *args, dtype=None, layout=None, device=None, pin_memory=None):
    if len(args) == 1:
        start, end, step = 0, args[0], 1
    elif len(args) == 2:
        (start, end), step = args, 1
    elif len(args) == 3:
        start, end, step = args
    else:
        raise UserError(f"arange: expected 1 to 3 bounds, got {len(args)}")
    floats = any(isinstance(v, float) for v in (start, end, step))
    dt = _dtype(dtype, dtypes.FLOAT32 if floats else dtypes.INT64)
    n = _arange_length(start, end, step)
    if dtypes.is_float(dt):
        return dsl.compute((n,), lambda i: dsl.cast(dt, i) * float(step) + float(start), name="arange")
    return dsl.compute((n,), lambda i: dsl.cast(dt, i * step + start), name="arange")
