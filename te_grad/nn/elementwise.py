"""Elementwise arithmetic with numpy broadcasting, and ``bias_add``.

Each binary op takes two operands, each a tensor or a Python number (at least
one must be a tensor). Shapes broadcast as in numpy: they are aligned on the
right, and a dimension of size 1 stretches to the other operand's size. A
stretched dimension is read at the constant index 0. Python numbers are weakly
typed (they take the tensor's dtype); two tensors promote along
``int32 < int64 < float32 < float64``.
"""
from __future__ import annotations

import numbers
from typing import Tuple

from .. import dsl
from ..errors import UserError
from ..ir import Tensor
from ..sizes import same_shape
from ._util import check_tensor, compute, is_int, normalize_axis

__all__ = ["broadcast_shape", "add", "subtract", "multiply", "divide", "maximum", "minimum",
           "power", "bias_add"]


def broadcast_shape(op: str, *shapes) -> Tuple[int, ...]:
    """The numpy broadcast of ``shapes``; a UserError naming ``op`` if they do not broadcast.

    A size expression (``tg.var``) is never taken for 1: it broadcasts against 1 and must
    otherwise be the same expression (``n`` with ``n``, not ``n`` with ``m`` or ``3``)."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(ndim):
        size = 1
        for s in shapes:
            k = d - (ndim - len(s))
            if k < 0 or _is_one(s[k]):
                continue
            if not _is_one(size) and not same_shape((s[k],), (size,)):
                why = "" if is_int(s[k]) and is_int(size) else " for every value of the sizes"
                raise UserError(f"{op}: shapes {' and '.join(str(list(x)) for x in shapes)} "
                                f"do not broadcast (dimension {d}: {size} vs {s[k]}){why}")
            size = s[k]
        out.append(size)
    return tuple(out)


def _is_one(s) -> bool:
    return is_int(s) and s == 1


def broadcast_read(x, idx):
    """``x`` read at output index ``idx`` under numpy broadcasting (a number is returned as is)."""
    if not isinstance(x, Tensor):
        return x
    offset = len(idx) - x.ndim
    return x[tuple(0 if _is_one(x.shape[d]) else idx[offset + d] for d in range(x.ndim))]


def _operand(op: str, x, what: str):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, numbers.Number) and not isinstance(x, complex):
        return x
    raise UserError(f"{op}: {what} must be a tensor or a Python number, got {x!r}")


def _binary(op: str, fn, a, b, name=None) -> Tensor:
    a, b = _operand(op, a, "first operand"), _operand(op, b, "second operand")
    tensors = [t for t in (a, b) if isinstance(t, Tensor)]
    if not tensors:
        raise UserError(f"{op}: at least one operand must be a tensor, got {a!r} and {b!r}")
    shape = broadcast_shape(op, *[t.shape for t in tensors])
    return compute(shape, lambda idx: fn(broadcast_read(a, idx), broadcast_read(b, idx)),
                   name=name or op)


def add(a, b) -> Tensor:
    """``a + b`` elementwise, broadcast as in numpy; the result has the broadcast shape."""
    return _binary("add", lambda x, y: x + y, a, b)


def subtract(a, b) -> Tensor:
    """``a - b`` elementwise, broadcast as in numpy; the result has the broadcast shape."""
    return _binary("subtract", lambda x, y: x - y, a, b)


def multiply(a, b) -> Tensor:
    """``a * b`` elementwise, broadcast as in numpy; the result has the broadcast shape."""
    return _binary("multiply", lambda x, y: x * y, a, b)


def divide(a, b) -> Tensor:
    """``a / b`` elementwise (true division: integers give float32), broadcast as in numpy."""
    return _binary("divide", lambda x, y: x / y, a, b)


def maximum(a, b) -> Tensor:
    """The elementwise larger of ``a`` and ``b``, broadcast as in numpy."""
    return _binary("maximum", dsl.maximum, a, b)


def minimum(a, b) -> Tensor:
    """The elementwise smaller of ``a`` and ``b``, broadcast as in numpy."""
    return _binary("minimum", dsl.minimum, a, b)


def power(a, b) -> Tensor:
    """``a ** b`` elementwise (float result), broadcast as in numpy."""
    return _binary("power", dsl.pow, a, b)


def bias_add(x: Tensor, b: Tensor, axis: int = 1, name: str = "bias_add") -> Tensor:
    """``x + b`` with the 1-D ``b`` (length ``x.shape[axis]``) laid along ``axis`` of ``x``.

    ``out[..., c, ...] = x[..., c, ...] + b[c]`` where ``c`` is the index along
    ``axis`` (default 1, the channel axis of NCHW and the feature axis of (N, M)).
    The result has the shape of ``x``; ``name`` names the tensor.
    """
    check_tensor("bias_add", x, "x")
    check_tensor("bias_add", b, "bias", ndim=1)
    axis = normalize_axis("bias_add", axis, x.ndim)
    if b.shape[0] != x.shape[axis]:
        raise UserError(f"bias_add: bias {b.name} has length {b.shape[0]} but axis {axis} of "
                        f"{x.name} has size {x.shape[axis]} (shape {list(x.shape)})")
    return compute(x.shape, lambda idx: x[idx] + b[idx[axis]], name=name)
