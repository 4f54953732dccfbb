"""Sizes known only at run time: size variables, size expressions, binding and specializing.

A *size variable* (:class:`te_grad.ir.SizeVar`, made by ``tg.var("n")``) is an integer
unknown when the graph is written. A *size expression* is built from size variables and
integer constants with ``+``, ``-``, multiplication by a constant, and ``//`` / ``%`` by a
positive constant: ``n``, ``n - 2``, ``2 * n``, ``n // 2``, ``n * 64``. (A product of two
size variables, ``m * n``, is a size expression too, but not a quasi-affine one: isl cannot
reason about it, so reads it bounds are checked at run time and reductions it bounds stay
unsimplified.)
Shapes are tuples whose entries are ints or size expressions; reduce-axis bounds and
index expressions may use size variables.

A call binds the variables from the shapes of its arguments (:func:`bind_sizes`): each
dimension ``d`` of an argument whose declared extent is ``e`` gives the equation
``e(sizes) = d``. Equations with one unknown variable that occurs linearly are solved
(``2 * n = 10`` gives ``n = 5``), the others are checked once their variables are known,
and every bound value must lie in its variable's range. Disagreements are errors naming the
variable and the two arguments.

:func:`specialize` substitutes bound values into a whole graph: the result is an ordinary
fixed-shape graph with the same meaning at those sizes. The reference evaluator computes
symbolic graphs that way; compiled kernels bind the sizes at each call instead and keep one
kernel for all of them.
"""
from __future__ import annotations

import numbers
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from . import dtypes
from .errors import UserError
from .ir import _folded, Binary, Cast, ComputeOp, Const, Expr, PlaceholderOp, ReduceAxis, ScatterOp, SizeVar, Tensor
from .visitor import Mutator

#: the operators a size expression may use
SIZE_OPS = ("add", "sub", "mul", "floordiv", "floormod", "max", "min")

Binding = Dict[SizeVar, int]


def var(name: str, min: int = 0, max: Optional[int] = None) -> SizeVar:  # noqa: A002 - user-facing names
    """A size known only at run time: ``n = tg.var("n")``; ``min`` / ``max`` constrain it
    (``tg.var("n", min=1)``). Use it in shapes (``tg.placeholder((n, 64))``, ``(n - 2,)``,
    ``(2 * n,)``), reduce-axis bounds (``tg.reduce_axis((0, n))``) and index expressions; a
    kernel built on it serves every value, bound from its arguments' shapes at each call."""
    if not isinstance(name, str) or not name.isidentifier():
        raise UserError(f"tg.var needs a name that is an identifier, got {name!r}")
    for what, v in (("min", min), ("max", max)):
        if v is not None and (not isinstance(v, numbers.Integral) or isinstance(v, bool)):
            raise UserError(f"tg.var({name!r}): {what} must be an int, got {v!r}")
    if min < 0:
        raise UserError(f"tg.var({name!r}): a size is >= 0, got min={min}")
    if max is not None and max < min:
        raise UserError(f"tg.var({name!r}): max={max} is below min={min}")
    return SizeVar(name, int(min), None if max is None else int(max))


def is_size_expr(e) -> bool:
    """Whether ``e`` is an int or an integer expression of size variables and constants only."""
    if isinstance(e, numbers.Integral) and not isinstance(e, bool):
        return True
    if not isinstance(e, Expr):
        return False
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, SizeVar):
            continue
        if isinstance(x, Const):
            if not dtypes.is_int(x.dtype):
                return False
            continue
        if isinstance(x, Cast) and dtypes.is_int(x.dtype):
            stack.append(x.a)
            continue
        if isinstance(x, Binary) and x.op in SIZE_OPS and dtypes.is_int(x.dtype):
            stack.extend((x.a, x.b))
            continue
        return False
    return True


def size_vars_in(e) -> Tuple[SizeVar, ...]:
    """The size variables an expression (or int) uses, in order of first use."""
    if not isinstance(e, Expr):
        return ()
    seen: Dict[int, SizeVar] = {}
    visited = set()  # a node shared by several parents is walked once
    stack = [e]
    while stack:
        x = stack.pop()
        if id(x) in visited:
            continue
        visited.add(id(x))
        if isinstance(x, SizeVar):
            seen.setdefault(id(x), x)
        elif isinstance(x, ReduceAxis):
            stack.extend((x.hi, x.lo))
        else:
            stack.extend(reversed(x.children()))
    return tuple(seen.values())


def graph_size_vars(outputs: Sequence[Tensor]) -> Tuple[SizeVar, ...]:
    """Every size variable of the graph computing ``outputs`` (shapes, bounds, bodies), in a
    fixed order: first use, walking the tensors from the inputs up. Two different variables
    of one name are an error (a call binds them by the shapes it is given, a reader by name)."""
    from .graph import topo_order
    seen: Dict[int, SizeVar] = {}
    for t in topo_order(list(outputs)):
        parts: List = list(t.shape)
        op = t.op
        if isinstance(op, ComputeOp):
            parts.append(op.body)
        elif isinstance(op, ScatterOp):
            parts += [a.lo for a in op.axes] + [a.hi for a in op.axes] + list(op.indices) + [op.value]
            if op.where is not None:
                parts.append(op.where)
        for p in parts:
            for v in size_vars_in(p):
                seen.setdefault(id(v), v)
    out = tuple(seen.values())
    names: Dict[str, SizeVar] = {}
    for v in out:
        other = names.setdefault(v.name, v)
        if other is not v:
            raise UserError(f"two different size variables are named {v.name!r}; make one with tg.var "
                            f"and use it everywhere")
    return out


def is_symbolic(outputs: Sequence[Tensor]) -> bool:
    """Whether the graph computing ``outputs`` uses size variables."""
    return bool(graph_size_vars(outputs))


def value(e, sizes: Mapping[SizeVar, int]) -> int:
    """The value of a size expression (or int) at ``sizes``."""
    if isinstance(e, numbers.Integral):
        return int(e)
    got = _eval(e, sizes)
    if got is None:
        missing = [v.name for v in size_vars_in(e) if v not in sizes]
        raise UserError(f"the size {_show(e)} needs the value of {', '.join(missing)}")
    return got


def _eval(e: Expr, sizes) -> Optional[int]:
    if isinstance(e, SizeVar):
        return sizes.get(e)
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Cast):
        return _eval(e.a, sizes)
    if isinstance(e, Binary):
        a, b = _eval(e.a, sizes), _eval(e.b, sizes)
        if a is None or b is None:
            return None
        if e.op == "add":
            return a + b
        if e.op == "sub":
            return a - b
        if e.op == "mul":
            return a * b
        if e.op == "max":
            return max(a, b)
        if e.op == "min":
            return min(a, b)
        if b == 0:
            raise UserError(f"the size {_show(e)} divides by zero")
        return a // b if e.op == "floordiv" else a % b
    raise UserError(f"{_show(e)} is not a size expression (sizes are built from tg.var, ints, + - * // %)")


def _show(e) -> str:
    return str(e)


def _linear_in(e: Expr, v: SizeVar, sizes) -> Optional[Tuple[int, int]]:
    """``(a, b)`` with ``e = a * v + b`` when every other variable of ``e`` is in ``sizes`` and
    ``v`` occurs linearly (not under ``//``, ``%``, ``max``, ``min``); otherwise None."""
    if e is v:
        return (1, 0)
    if isinstance(e, SizeVar):
        got = sizes.get(e)
        return None if got is None else (0, got)
    if isinstance(e, Const):
        return (0, int(e.value))
    if isinstance(e, Cast):
        return _linear_in(e.a, v, sizes)
    if isinstance(e, Binary):
        if e.op in ("add", "sub", "mul"):
            a, b = _linear_in(e.a, v, sizes), _linear_in(e.b, v, sizes)
            if a is None or b is None:
                return None
            if e.op == "add":
                return (a[0] + b[0], a[1] + b[1])
            if e.op == "sub":
                return (a[0] - b[0], a[1] - b[1])
            if a[0] and b[0]:
                return None
            return (a[0] * b[1] + b[0] * a[1], a[1] * b[1])
        if v not in size_vars_in(e):
            got = _eval(e, sizes)
            return None if got is None else (0, got)
    return None


def bind_sizes(declared: Sequence[Tuple[str, Tuple, Tuple[int, ...]]],
               known: Optional[Mapping[SizeVar, int]] = None) -> Binding:
    """Bind the size variables from argument shapes.

    ``declared`` lists ``(argument name, declared shape, actual shape)``. Returns the value of
    every variable the declared shapes use; raises a :class:`UserError` naming the variable (or
    dimension) and the two arguments that disagree, or the constraint a value breaks."""
    sizes: Binding = dict(known or {})
    source: Dict[SizeVar, str] = {v: "the given sizes" for v in sizes}
    pending = []
    for name, shape, actual in declared:
        shape, actual = tuple(shape), tuple(actual)
        if len(shape) != len(actual):
            raise UserError(f"argument {name} has {len(actual)} dimensions {list(actual)}, expected "
                            f"{len(shape)} {_shape_text(shape)}")
        for d, (e, n) in enumerate(zip(shape, actual)):
            pending.append((name, d, e, int(n)))
    progress = True
    while pending and progress:
        progress = False
        rest = []
        for name, d, e, n in pending:
            unknown = [v for v in size_vars_in(e) if v not in sizes]
            if not unknown:
                got = value(e, sizes)
                if got != n:
                    vs = size_vars_in(e)
                    why = ", ".join(f"{v.name} = {sizes[v]} (from {source[v]})" for v in vs)
                    raise UserError(f"argument {name} has extent {n} in dimension {d}, but its declared "
                                    f"extent {_show(e)} is {got} with {why}")
                progress = True
                continue
            if len(unknown) == 1:
                lin = _linear_in(e, unknown[0], sizes)
                if lin is not None and lin[0] != 0:
                    a, b = lin
                    v = unknown[0]
                    if (n - b) % a:
                        raise UserError(f"argument {name} has extent {n} in dimension {d}, which is not "
                                        f"{_show(e)} for any integer {v.name}")
                    sizes[v] = (n - b) // a
                    source[v] = f"argument {name}, dimension {d}"
                    _check_range(v, sizes[v], source[v])
                    progress = True
                    continue
            rest.append((name, d, e, n))
        pending = rest
    if pending:
        name, d, e, n = pending[0]
        unknown = [v.name for v in size_vars_in(e) if v not in sizes]
        raise UserError(f"cannot bind {', '.join(unknown)} from argument {name} (dimension {d} is "
                        f"{_show(e)}): give an argument whose shape states it alone, e.g. (n, ...)")
    return sizes


def named_sizes(variables: Sequence[SizeVar], given) -> Binding:
    """``given`` (a dict from size variables or their names to ints, or None) as a binding of
    ``variables``; unknown names and values out of range are errors."""
    if not given:
        return {}
    if not isinstance(given, Mapping):
        raise UserError(f"sizes must be a dict from size variables (or their names) to ints, got {given!r}")
    by_name = {v.name: v for v in variables}
    out: Binding = {}
    for k, n in given.items():
        v = by_name.get(k) if isinstance(k, str) else (k if isinstance(k, SizeVar) else None)
        if v is None or by_name.get(v.name) is not v:
            names = ", ".join(sorted(by_name)) or "none"
            raise UserError(f"sizes names {k if isinstance(k, str) else k!r}, which the graph does not use "
                            f"(its size variables: {names})")
        if not isinstance(n, numbers.Integral) or isinstance(n, bool):
            raise UserError(f"size {v.name} must be an int, got {n!r}")
        _check_range(v, int(n), "sizes=")
        out[v] = int(n)
    return out


def _check_range(v: SizeVar, n: int, where: str):
    if n < v.lo or (v.hi is not None and n > v.hi):
        rng = f">= {v.lo}" if v.hi is None else f"in [{v.lo}, {v.hi}]"
        raise UserError(f"size {v.name} = {n} (from {where}) must be {rng}")


def _shape_text(shape) -> str:
    return "(" + ", ".join(_show(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def concrete_shape(shape, sizes: Mapping[SizeVar, int]) -> Tuple[int, ...]:
    """``shape`` with its size expressions evaluated at ``sizes``."""
    return tuple(value(s, sizes) for s in shape)


def check_extents(t: Tensor, sizes: Mapping[SizeVar, int]) -> Tuple[int, ...]:
    """``t``'s shape at ``sizes``; an extent that comes out negative is a UserError naming
    the sizes, the tensor and the dimension."""
    shape = tuple(value(s, sizes) if isinstance(s, Expr) else s for s in t.shape)
    for d, (e, got) in enumerate(zip(t.shape, shape)):
        if got < 0:
            at = ", ".join(f"{v.name} = {sizes[v]}" for v in size_vars_in(e) if v in sizes)
            raise UserError(f"at {at} the extent {_show(e)} of {t.name} (dimension {d}) is {got}: "
                            f"constrain the size with tg.var(..., min=...)")
    return shape


def clamped(variables: Sequence[SizeVar], at: int) -> Binding:
    """Each variable at ``at`` clamped to its range: the sizes a choice that needs ints (a
    loop order, a cost per element) is made at, for every value the sizes may take."""
    return {v: max(v.lo, at if v.hi is None else min(v.hi, at)) for v in variables}


def same_shape(a, b) -> bool:
    """Whether two shapes are the same: equal ints, structurally equal size expressions."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, Expr) or isinstance(y, Expr):
            if not (isinstance(x, Expr) and isinstance(y, Expr) and x.same_as(y)):
                return False
        elif x != y:
            return False
    return True


def shape_is_concrete(shape) -> bool:
    """Whether every extent of ``shape`` is an int."""
    return all(isinstance(s, numbers.Integral) for s in shape)


class _Substitute(Mutator):
    def __init__(self, sizes, tensors):
        super().__init__()
        self.sizes, self.tensors = sizes, tensors

    def visit_SizeVar(self, node):
        got = self.sizes.get(node)
        return node if got is None else Const(int(got), node.dtype)

    def visit_Binary(self, node):
        a, b = self.visit(node.a), self.visit(node.b)
        if a is node.a and b is node.b:
            return node
        return _folded(node.op, a, b)

    def visit_Read(self, node):
        new_idx = tuple(self.visit(i) for i in node.indices)
        t = self.tensors.get(id(node.tensor), node.tensor)
        if t is node.tensor and all(a is b for a, b in zip(new_idx, node.indices)):
            return node
        from .ir import Read
        return Read(t, new_idx)


def specialize(outputs: Sequence[Tensor], sizes: Mapping[SizeVar, int]) -> Tuple[List[Tensor], Dict[int, Tensor]]:
    """The graph computing ``outputs`` with every size variable replaced by its value.

    Returns the new outputs and a map from ``id(old tensor)`` to the new tensor (inputs
    included): a tensor none of whose parts changed is kept as it is."""
    from .graph import topo_order
    new: Dict[int, Tensor] = {}
    for t in topo_order(list(outputs)):
        sub = _Substitute(sizes, new)
        shape = check_extents(t, sizes)
        op = t.op
        if isinstance(op, PlaceholderOp):
            nt = t if same_shape(shape, t.shape) else Tensor(t.name, shape, t.dtype, op)
        elif isinstance(op, ComputeOp):
            body = (sub.visit(op.body))
            nt = t if (same_shape(shape, t.shape) and body is op.body) else \
                Tensor(t.name, shape, t.dtype, ComputeOp(op.axes, body, op.note))
        elif isinstance(op, ScatterOp):
            axes = []
            amap = {}
            for ax in op.axes:  # a later axis's bounds may use an earlier one (rowptr[i]): renamed as it goes
                lo, hi = (sub.visit(ax.lo)), (sub.visit(ax.hi))
                if lo is ax.lo and hi is ax.hi:
                    axes.append(ax)
                else:
                    fresh = ReduceAxis(ax.name, ax.dtype, lo, hi)
                    amap[ax] = fresh
                    sub._axis_map[ax] = fresh
                    sub._memo.clear()
                    axes.append(fresh)
            idx = tuple((sub.visit(i)) for i in op.indices)
            val = (sub.visit(op.value))
            where = None if op.where is None else (sub.visit(op.where))
            same = same_shape(shape, t.shape) and not amap and val is op.value and where is op.where and \
                all(a is b for a, b in zip(idx, op.indices))
            nt = t if same else Tensor(t.name, shape, t.dtype,
                                       ScatterOp(tuple(axes), idx, val, where, op.note))
        else:  # pragma: no cover - every op kind is listed above
            raise TypeError(f"unknown op {type(op).__name__}")
        new[id(t)] = nt
    return [new[id(t)] for t in outputs], new


def uses_sizes(t: Tensor) -> bool:
    """Whether ``t``'s own definition needs the sizes: its shape, its bounds or body, or the
    shape of a tensor it reads, uses a size variable (its producers may, it need not)."""
    from .ir import distinct_reads
    op = t.op
    parts: List = list(t.shape)
    if isinstance(op, ComputeOp):
        parts.append(op.body)
    elif isinstance(op, ScatterOp):
        parts += [b for ax in op.axes for b in (ax.lo, ax.hi)] + list(op.indices) + [op.value]
        parts += [op.where] if op.where is not None else []
    exprs = [p for p in parts if isinstance(p, Expr)]
    if any(size_vars_in(p) for p in exprs):
        return True
    read = {id(r.tensor): r.tensor for p in exprs for r in distinct_reads(p)}
    return any(size_vars_in(n) for x in read.values() for n in x.shape)


__all__ = ["var", "uses_sizes", "is_size_expr", "size_vars_in", "graph_size_vars", "is_symbolic", "value",
           "bind_sizes", "named_sizes", "check_extents", "clamped", "concrete_shape", "same_shape", "shape_is_concrete", "specialize", "Binding", "SIZE_OPS"]
