"""Helpers shared by the operators of :mod:`te_grad.nn`: argument checks and named computes."""
from __future__ import annotations

import inspect
import numbers
from typing import Callable, Sequence, Tuple

from .. import dsl, dtypes
from ..errors import UserError
from ..ir import Tensor

#: axis names used for ranks where no better names are given
_GENERIC = ("i", "j", "l", "m", "p", "q")


def axis_names(ndim: int, names: Sequence[str] = None) -> Tuple[str, ...]:
    """Readable, distinct names for ``ndim`` output axes (``names`` if it fits)."""
    if names is not None and len(names) == ndim:
        return tuple(names)
    if ndim <= len(_GENERIC):
        return _GENERIC[:ndim]
    return tuple(f"i{d}" for d in range(ndim))


def compute(shape, fcompute: Callable, name: str, names: Sequence[str] = None) -> Tensor:
    """``tg.compute`` whose function receives the tuple of index variables.

    This lets rank-generic ops build their bodies while still giving the axes
    readable names (``names`` or ``i, j, l, ...``) in printed formulas.
    """
    shape = tuple(shape)
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
              for n in axis_names(len(shape), names)]

    def fn(*idx):
        return fcompute(tuple(idx))

    fn.__signature__ = inspect.Signature(params)
    return dsl.compute(shape, fn, name=name)


def check_tensor(op: str, x, what: str = "input", ndim=None) -> Tensor:
    """Raise unless ``x`` is a tensor (of rank ``ndim``: an int or a tuple of allowed ranks)."""
    if not isinstance(x, Tensor):
        raise UserError(f"{op}: {what} must be a tensor, got {x!r}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.ndim not in allowed:
            want = " or ".join(f"{n}-D" for n in allowed)
            raise UserError(f"{op}: {what} {x.name} must be {want}, got shape {list(x.shape)}")
    return x


def check_float(op: str, x: Tensor, what: str = "input") -> Tensor:
    if not dtypes.is_float(x.dtype):
        raise UserError(f"{op}: {what} {x.name} must have a float dtype, got {x.dtype}")
    return x


def check_int_dtype(op: str, x: Tensor, what: str) -> Tensor:
    if not dtypes.is_int(x.dtype):
        raise UserError(f"{op}: {what} {x.name} must have dtype int32 or int64, got {x.dtype}")
    return x


def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def int_tuple(op: str, what: str, value, n: int, minimum: int = None) -> Tuple[int, ...]:
    """``value`` (an int or a sequence of ``n`` ints) as a tuple of ``n`` ints ``>= minimum``."""
    if is_int(value):
        out = (int(value),) * n
    else:
        try:
            out = tuple(value)
        except TypeError:
            raise UserError(f"{op}: {what} must be an int or {n} ints, got {value!r}") from None
        if len(out) != n or not all(is_int(v) for v in out):
            raise UserError(f"{op}: {what} must be an int or {n} ints, got {value!r}")
        out = tuple(int(v) for v in out)
    if minimum is not None and any(v < minimum for v in out):
        raise UserError(f"{op}: {what} must be >= {minimum}, got {value!r}")
    return out


def padding4(op: str, padding) -> Tuple[int, int, int, int]:
    """2-D padding as ``(top, left, bottom, right)``.

    Accepts an int (all sides), ``(ph, pw)`` (symmetric) or ``(top, left, bottom, right)``.
    """
    form = "an int, (ph, pw) or (top, left, bottom, right)"
    if is_int(padding):
        p = (int(padding),) * 4
    else:
        try:
            vals = tuple(padding)
        except TypeError:
            raise UserError(f"{op}: padding must be {form}, got {padding!r}") from None
        if not all(is_int(v) for v in vals) or len(vals) not in (2, 4):
            raise UserError(f"{op}: padding must be {form}, got {padding!r}")
        vals = tuple(int(v) for v in vals)
        p = vals + vals if len(vals) == 2 else vals
    if any(v < 0 for v in p):
        raise UserError(f"{op}: padding must be non-negative, got {padding!r}")
    return p


def normalize_axis(op: str, axis, ndim: int) -> int:
    """``axis`` in ``[-ndim, ndim)`` as a non-negative int."""
    if not is_int(axis):
        raise UserError(f"{op}: axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise UserError(f"{op}: axis {axis} is out of range for a tensor of rank {ndim}")
    return int(axis) % ndim


def reciprocal(count, dtype: str):
    """``1 / count`` for scaling values of ``dtype``: a float for an int count; for a size
    expression, the count converted to ``dtype`` first (a float literal divided by a size
    expression would be a float32 quotient, rounding a float64 mean)."""
    from ..ir import Expr
    if isinstance(count, Expr):
        return dsl.const(1.0, dtype) / dsl.cast(dtype, count)
    return 1.0 / count


def prod(values):
    """The product of extents: an int, or a size expression where one is (``tg.var``)."""
    from ..ir import Expr
    out = 1
    for v in values:
        out = out * v if isinstance(v, Expr) else out * int(v)
    return out


def affine(var, scale: int = 1, offset: int = 0):
    """``var * scale + offset`` without building multiplications by 1 or additions of 0."""
    e = var if scale == 1 else var * scale
    if not is_int(offset):  # a size expression (tg.var)
        return e + offset
    if offset == 0:
        return e
    return e + offset if offset > 0 else e - (-offset)


def smallest(e) -> int:
    """The value of an extent at the smallest sizes its variables allow (their ``min``): the
    least value of an output extent that grows with its input's (windows, convolutions)."""
    from ..sizes import size_vars_in, value
    return value(e, {v: v.lo for v in size_vars_in(e)}) if not is_int(e) else int(e)


def may_reach(a, b) -> bool:
    """Whether ``a >= b`` may hold: decided on ints, assumed (a guard kept) with size expressions."""
    return a >= b if is_int(a) and is_int(b) else True


def reduce_axes(extents, names):
    """One reduce axis per extent; an extent of 1 gives the constant 0 instead of an axis.

    Returns ``(indices, axes)``: the index expressions to use in the body and the
    list of real axes to reduce over.
    """
    idx, axes = [], []
    for ext, nm in zip(extents, names):
        if ext == 1:
            idx.append(0)
        else:
            ax = dsl.reduce_axis((0, ext), name=nm)
            idx.append(ax)
            axes.append(ax)
    return idx, axes


def reduce(combiner: str, expr, axes):
    """``combiner`` of ``expr`` over ``axes``, or ``expr`` itself when there are no axes."""
    if not axes:
        return expr
    return getattr(dsl, combiner)(expr, axis=list(axes))


def tap(base, r, scale):
    """``base + r * scale`` where ``r`` is a reduce axis or the constant 0."""
    if isinstance(r, int):
        return base
    term = r if abs(scale) == 1 else r * abs(scale)
    return base + term if scale > 0 else base - term


def floordiv(e, d: int):
    """``e // d`` (no node when ``d`` is 1)."""
    return e if d == 1 else e // d


def guard(conds):
    """The conjunction of the conditions that are not None, or None if there are none."""
    conds = [c for c in conds if c is not None]
    return dsl.all(*conds) if conds else None


# -- extents that may be size expressions (tg.var) ------------------------------------------------
def is_size(v) -> bool:
    """An int or a size expression (``n``, ``n - 1``, ``64 * n``: :func:`te_grad.sizes.is_size_expr`)."""
    from ..sizes import is_size_expr
    return not isinstance(v, bool) and is_size_expr(v)


def monomial(e):
    """A size as ``(coefficient, factors)``: an int times a product of size expressions that are
    not products (``n * 16 * 4`` is ``(64, (n,))``), so products compare and divide structurally."""
    from ..ir import Binary, Const, Expr
    if is_int(e):
        return (int(e), ())
    if isinstance(e, Const):
        return (int(e.value), ())
    if isinstance(e, Binary) and e.op == "mul":
        return monomial_mul(monomial(e.a), monomial(e.b))
    if isinstance(e, Expr):
        return (1, (e,))
    raise UserError(f"{e!r} is not a size (an int or a size expression of tg.var)")


def monomial_mul(a, b):
    return (a[0] * b[0], a[1] + b[1])


def monomial_prod(values):
    out = (1, ())
    for v in values:
        out = monomial_mul(out, monomial(v))
    return out


def _remove_factors(have, take):
    rest = list(have)
    for f in take:
        k = next((k for k, g in enumerate(rest) if g.same_as(f)), None)
        if k is None:
            return None
        del rest[k]
    return tuple(rest)


def monomial_div(a, b):
    """``a / b`` when ``b`` divides ``a`` structurally (its factors among ``a``'s, its coefficient
    dividing ``a``'s), else None."""
    if b[0] == 0 or a[0] % b[0]:
        return None
    rest = _remove_factors(a[1], b[1])
    return None if rest is None else (a[0] // b[0], rest)


def monomial_equal(a, b) -> bool:
    if a[0] == 0 and b[0] == 0:
        return True
    return a[0] == b[0] and len(a[1]) == len(b[1]) and _remove_factors(a[1], b[1]) == ()


def monomial_expr(m):
    """The size a monomial stands for: an int, or ``factors * coefficient`` as a size expression."""
    coef, factors = m
    if coef == 0 or not factors:
        return coef
    out = factors[0]
    for f in factors[1:]:
        out = out * f
    return out if coef == 1 else out * coef


def size_text(shape) -> str:
    """A shape as text (size expressions printed by name)."""
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
