"""The tensor-expression DSL: placeholders, compute ops, reductions, scalars.

Every constructor here checks its arguments and promotes dtypes (rules in
:mod:`te_grad.dtypes`), so the IR it returns is well typed: the operands of a
Binary share a dtype, conditions are ``bool``, indices are ``int64``.
"""
from __future__ import annotations

import builtins
import inspect
import numbers
from typing import Callable


from . import dtypes, ops, sizes
from .errors import UserError
from .deep import deep_entry
from .graph import free_vars
from .ir import (Binary, Call, Cast, ComputeOp, Const, Expr, PlaceholderOp, Read, Reduce, ReduceAxis, Select,
                 SizeVar, Tensor, Unary, Var)
# the typed make-functions live beside the nodes (the Python operators call them); re-exported here
from .ir import _operands, as_expr, binary, cast, compare, const, read, unary  # noqa: F401
from .visitor import Visitor

# ---------------------------------------------------------------------------
# conditions, functions, reductions
# ---------------------------------------------------------------------------


def if_then_else(cond, then_value, else_value) -> Expr:
    """``then_value`` where ``cond`` holds, else ``else_value``; the other branch is not evaluated."""
    cond = as_expr(cond)
    if cond.dtype != dtypes.BOOL:
        raise UserError(f"tg.if_then_else needs a condition, got {cond} ({cond.dtype})")
    t, f = _operands(then_value, else_value)
    return Select(cond, t, f)


def all(*conds) -> Expr:  # noqa: A001 - TVM's name
    """Conjunction of conditions (``True`` for none)."""
    conds = _flatten(conds)
    out = as_expr(True)
    for i, c in enumerate(conds):
        out = _condition(c, "tg.all") if i == 0 else binary("and", out, c)
    return out


def any(*conds) -> Expr:  # noqa: A001 - TVM's name
    """Disjunction of conditions (``False`` for none)."""
    conds = _flatten(conds)
    out = as_expr(False)
    for i, c in enumerate(conds):
        out = _condition(c, "tg.any") if i == 0 else binary("or", out, c)
    return out


def _condition(c, who: str) -> Expr:
    c = as_expr(c)
    if c.dtype != dtypes.BOOL:
        raise UserError(f"{who} needs conditions, got {c} ({c.dtype})")
    return c


def _flatten(args):
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        return list(args[0])
    return list(args)


def _intrinsic(name: str, *args) -> Expr:
    op = ops.intrinsic(name)
    if len(args) != op.arity:
        raise UserError(f"tg.{name} takes {op.arity} argument{'s' if op.arity > 1 else ''}, got {len(args)}")
    args = [as_expr(a) for a in args]
    for a in args:
        if a.dtype == dtypes.BOOL:
            raise UserError(f"tg.{name} of the condition {a}; cast it first with tg.cast")
    dt = op.result_dtype([a.dtype for a in args])
    return Call(name, tuple(cast(dt, a) for a in args))


def _function(name: str):
    """The DSL function of intrinsic ``name``: argument checks and dtype rule from its record."""
    op = ops.intrinsic(name)
    params = ", ".join(["y", "x"][:op.arity]) if op.arity == 2 else "x"

    def fn(*args):
        return _intrinsic(name, *args)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"{op.doc}\n\n``tg.{name}({params})``, elementwise on float expressions (integers are "
                  f"converted to float32). Derivative: {op.math}.")
    return fn


exp = _function("exp")
log = _function("log")
sqrt = _function("sqrt")
tanh = _function("tanh")
sigmoid = _function("sigmoid")
sin = _function("sin")
cos = _function("cos")
erf = _function("erf")
asin = _function("asin")
acos = _function("acos")
atan = _function("atan")
atan2 = _function("atan2")
log1p = _function("log1p")
expm1 = _function("expm1")
floor = _function("floor")
ceil = _function("ceil")
trunc = _function("trunc")
round = _function("round")  # noqa: A001 - TVM's name; rounds half to even


def stop_gradient(x):
    """``x``, with a zero derivative (JAX's ``lax.stop_gradient``): for quantities the
    result does not depend on mathematically, such as the shift that keeps a softmax's
    exponentials from overflowing. Integer and boolean values are returned as they are."""
    x = as_expr(x)
    if not dtypes.is_float(x.dtype):
        return x
    return Call("stop_gradient", (x,))


def abs(x):  # noqa: A001 - TVM's name
    """Absolute value; keeps integer dtypes. Derivative: sign(x), with sign(0) = 0."""
    x = as_expr(x)
    if dtypes.is_int(x.dtype):
        return maximum(x, -x)
    return _intrinsic("abs", x)


def pow(a, b):  # noqa: A001
    """``a ** b``; integers are converted to float32. Derivative: ``b a^(b-1) da + log(a) a^b db``."""
    return binary("pow", a, b)


def maximum(a, b):
    """The larger of ``a`` and ``b``, elementwise (NaN if either is NaN). At a tie the
    derivative goes half to each operand."""
    return binary("max", a, b)


def minimum(a, b):
    """The smaller of ``a`` and ``b``, elementwise (NaN if either is NaN). At a tie the
    derivative goes half to each operand."""
    return binary("min", a, b)


def logical_not(c):
    """The negation of condition ``c`` (also written ``~c``)."""
    return unary("not", c)


def call(name: str, *args) -> Expr:
    """An intrinsic by name: ``tg.call("exp", x)``, ``tg.call("atan2", y, x)``."""
    op = ops.intrinsic(name)
    if name == "abs" and len(args) == op.arity:
        return abs(*args)
    if name == "stop_gradient" and len(args) == op.arity:
        return stop_gradient(*args)
    return _intrinsic(name, *args)


# ---------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------


def reduce_axis(dom, name: str = "k") -> ReduceAxis:
    """A reduction variable over ``range(lo, hi)``; ``dom`` is ``(lo, hi)`` or an extent ``n``.

    The bounds are ints, sizes known at run time (``tg.reduce_axis((0, n))`` with
    ``n = tg.var("n")``), or integer index expressions (a *ragged* loop): the enclosing
    compute's variables, integer tensor reads and ``+ - * // % min max`` of them, as the
    CSR segment ``tg.reduce_axis((rowptr[v], rowptr[v + 1]))`` of row ``v``. A bound may use
    the compute's variables, enclosing reductions' axes and the axes listed before this one
    in its own reduction. Int bounds with ``hi < lo`` are an error; a ragged range with
    ``hi <= lo`` at some point is empty there. Compiled kernels check at run time that a
    ragged loop stays inside the tensors it indexes (see README.md, "Ragged loops")."""
    if isinstance(dom, (numbers.Integral, Expr)):
        lo, hi = 0, dom
    else:
        try:
            lo, hi = dom
        except (TypeError, ValueError):
            raise UserError(f"reduce_axis domain must be (lo, hi) or an extent, got {dom!r}") from None
    if builtins.all(isinstance(v, numbers.Integral) for v in (lo, hi)):
        if hi < lo:
            raise UserError(f"reduce_axis {name!r} has an empty range [{lo}, {hi})")
        return ReduceAxis(name, dtypes.INDEX, const(int(lo)), const(int(hi)))
    return ReduceAxis(name, dtypes.INDEX, _ragged_bound(lo, name, "lower"), _ragged_bound(hi, name, "upper"))


def _ragged_bound(v, name: str, which: str) -> Expr:
    """A bound of a reduce axis that is not an int: a size expression (``n``, ``n - 1``:
    :mod:`te_grad.sizes`), or a ragged bound, an integer index expression (a CSR row pointer
    ``rowptr[v]``) in the enclosing compute's variables, sizes and integer tensors' values."""
    if not isinstance(v, (numbers.Integral, Expr)):
        raise UserError(f"reduce_axis {name!r}: the {which} bound must be an int or an integer index "
                        f"expression (e.g. rowptr[v] of an int64 tensor rowptr), got {v!r}")
    e = as_expr(int(v)) if isinstance(v, numbers.Integral) else v
    if not dtypes.is_int(e.dtype):
        raise UserError(f"reduce_axis {name!r}: the {which} bound {e} is {e.dtype}; a bound must be an "
                        "integer (read an integer tensor, e.g. an int64 row pointer)")
    stack = [e]
    while stack:
        node = stack.pop()
        if isinstance(node, Read):
            if not dtypes.is_int(node.tensor.dtype):
                raise UserError(f"reduce_axis {name!r}: the {which} bound {e} reads the {node.tensor.dtype} "
                                f"tensor {node.tensor.name}; bounds read integer tensors only")
        elif isinstance(node, Binary):
            if node.op not in _BOUND_OPS:
                raise UserError(f"reduce_axis {name!r}: the {which} bound {e} uses {node.op!r}; a bound is "
                                "built from ints, index variables, integer tensor reads, + - * // % min max")
        elif isinstance(node, Cast):
            if not dtypes.is_int(node.a.dtype):
                raise UserError(f"reduce_axis {name!r}: the {which} bound {e} converts a {node.a.dtype} "
                                "value; bounds are integer index expressions (no floats)")
        elif not isinstance(node, (Const, Var, SizeVar, Unary)):
            raise UserError(f"reduce_axis {name!r}: the {which} bound {e} holds a {type(node).__name__}; "
                            "a bound is built from ints, sizes, index variables, integer tensor reads, + - * // % "
                            "min max (compute anything else into an integer tensor first)")
        stack.extend(node.children())
    return cast(dtypes.INDEX, e)


#: the integer operations a ragged reduce-axis bound may use
_BOUND_OPS = ("add", "sub", "mul", "floordiv", "floormod", "min", "max")


def _reduction(combiner: str, expr, axis, where) -> Reduce:
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    if not axes:
        raise UserError(f"tg.{combiner} needs at least one reduce axis")
    if ops.reduction(combiner).indexed and len(axes) != 1:
        raise UserError(f"tg.{combiner} runs over one reduce axis (its result is that axis's value), "
                        f"got {len(axes)}")
    for ax in axes:
        if not isinstance(ax, ReduceAxis):
            raise UserError(f"tg.{combiner} axis must be made by tg.reduce_axis, got {ax!r}")
    if len({id(a) for a in axes}) != len(axes):
        raise UserError(f"tg.{combiner} lists the same axis twice: {[a.name for a in axes]}")
    body = as_expr(expr)
    if body.dtype == dtypes.BOOL:
        raise UserError(f"tg.{combiner} of the condition {body}; cast it to a number first")
    if where is not None:
        where = as_expr(where)
        if where.dtype != dtypes.BOOL:
            raise UserError(f"where= of tg.{combiner} must be a condition, got {where} ({where.dtype})")
    return Reduce(combiner, body, axes, where)


def sum(expr, axis, where=None) -> Reduce:  # noqa: A001 - TVM's name
    """Sum of ``expr`` over the reduce axes ``axis`` (one or a list), where ``where`` holds."""
    return _reduction("sum", expr, axis, where)


def prod(expr, axis, where=None) -> Reduce:
    """Product of ``expr`` over ``axis``; 1 for an empty domain."""
    return _reduction("prod", expr, axis, where)


def max(expr, axis, where=None) -> Reduce:  # noqa: A001 - TVM's name
    """Maximum of ``expr`` over ``axis``; -inf (or the dtype's minimum) for an empty domain."""
    return _reduction("max", expr, axis, where)


def min(expr, axis, where=None) -> Reduce:  # noqa: A001 - TVM's name
    """Minimum of ``expr`` over ``axis``; +inf (or the dtype's maximum) for an empty domain."""
    return _reduction("min", expr, axis, where)


def argmax(expr, axis, where=None) -> Reduce:
    """The value of the reduce axis ``axis`` where ``expr`` is largest (int64), where ``where``
    holds: the first (smallest) on ties, the first NaN if there is one, as numpy's argmax; -1
    for an empty domain. Its derivative is zero; indexing a tensor with it differentiates
    through the read (``X[i, tg.argmax(...)]``)."""
    return _reduction("argmax", expr, axis, where)


def argmin(expr, axis, where=None) -> Reduce:
    """The value of the reduce axis ``axis`` where ``expr`` is smallest (int64): as :func:`argmax`."""
    return _reduction("argmin", expr, axis, where)


# ---------------------------------------------------------------------------
# tensors
# ---------------------------------------------------------------------------


def _shape(shape, what: str):
    if isinstance(shape, numbers.Integral) or isinstance(shape, Expr):
        shape = (shape,)
    try:
        shape = tuple(shape)
    except TypeError:
        raise UserError(f"shape of {what} must be a tuple of ints or sizes (tg.var), got {shape!r}") from None
    out = []
    for s in shape:
        if isinstance(s, Expr):
            s = _size_expr(s, f"shape of {what}")
            if isinstance(s, Expr):
                out.append(s)
                continue
        if not isinstance(s, numbers.Integral) or isinstance(s, bool) or s < 0:
            raise UserError(f"shape of {what} must hold non-negative ints or sizes (tg.var), got {shape!r}")
        out.append(int(s))
    return tuple(out)


def _size_expr(e: Expr, what: str):
    """``e``, a size expression (:mod:`te_grad.sizes`), or its value when it is a constant."""
    if not sizes.is_size_expr(e):
        raise UserError(f"{what}: {e} is not a size (sizes are ints, tg.var variables and + - * // % of them)")
    if isinstance(e, Const):
        return int(e.value)
    return e


def placeholder(shape, dtype="float32", name: str = "placeholder") -> Tensor:
    """An input tensor of ``shape``: a tuple of ints and sizes known at run time (``tg.var``);
    ``()`` for a scalar."""
    shape = _shape(shape, f"placeholder {name!r}")
    return Tensor(name, shape, dtypes.canonical(dtype), PlaceholderOp())


def _axis_names(fcompute: Callable, ndim: int, name: str):
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        params = []
    if params and params[0].kind == inspect.Parameter.VAR_POSITIONAL:
        return [f"i{d}" for d in range(ndim)], True
    # index arguments are the positional parameters without a default: ``lambda i, j, M=M: ...``
    # (the usual way to bind a value in a Python lambda) has two
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.default is inspect.Parameter.empty]
    if len(positional) != ndim:
        raise UserError(f"compute {name!r} has {ndim} dimensions but its function takes "
                        f"{len(positional)} index arguments (parameters without a default value)")
    return [p.name for p in positional], False


def compute(shape, fcompute: Callable, name: str = "compute", dtype=None) -> Tensor:
    """``T[i, ...] = fcompute(i, ...)`` over the rectangular domain of ``shape``.

    The function's parameters without a default value are the index variables, one per
    dimension, and name the axes (``lambda i, j, M=M: ...`` binds ``M`` as Python does).
    ``dtype`` casts the body.
    """
    shape = _shape(shape, f"compute {name!r}")
    names, _ = _axis_names(fcompute, len(shape), name)
    axes = tuple(Var(n, dtypes.INDEX) for n in names)
    body = fcompute(*axes)
    if isinstance(body, (tuple, list)):
        raise UserError(f"compute {name!r} returned {len(body)} values; te_grad ops have one output")
    body = as_expr(body)
    if dtype is not None:
        body = cast(dtype, body)
    check_scopes(body, axes, name)
    return Tensor(name, shape, body.dtype, ComputeOp(axes, body))


class _ScopeChecker(Visitor):
    def __init__(self, name):
        self.name = name
        self.bound = []
        self.seen = set()  # (node, the axes bound there): a shared node is checked once per scope

    def visit(self, node):
        key = (id(node), tuple(id(b) for b in self.bound))
        if key not in self.seen:
            self.seen.add(key)
            self.dispatch(node)

    def visit_Reduce(self, node: Reduce):
        for ax in node.axes:
            if builtins.any(ax is b for b in self.bound):
                raise UserError(f"in compute {self.name!r}: reduce axis {ax.name!r} is reduced over "
                                "twice in nested reductions; give the inner reduction its own axis")
        for k, ax in enumerate(node.axes):
            later = {id(a): a for a in node.axes[k:]}
            for v in free_vars(ax.lo) + free_vars(ax.hi):
                if id(v) in later:
                    how = "itself" if v is ax else f"the axis {v.name!r} listed after it"
                    raise UserError(f"in compute {self.name!r}: the bounds of reduce axis {ax.name!r} use "
                                    f"{how}; a bound may use the compute's variables, enclosing reductions' "
                                    "axes and the axes listed before it in the same reduction")
        self.bound.extend(node.axes)
        self.generic_visit(node)
        del self.bound[len(self.bound) - len(node.axes):]


@deep_entry
def check_scopes(body: Expr, axes, name: str):
    """Raise if ``body`` uses a variable that is not one of ``axes`` or bound by a reduction."""
    _ScopeChecker(name).visit(body)
    for v in free_vars(body):
        if isinstance(v, ReduceAxis):
            raise UserError(f"in compute {name!r}: reduce axis {v.name!r} is used outside a "
                            f"reduction over it (wrap the expression in tg.sum(..., axis={v.name}))")
        if not builtins.any(v is a for a in axes):
            raise UserError(f"in compute {name!r}: index variable {v.name!r} belongs to another compute")
