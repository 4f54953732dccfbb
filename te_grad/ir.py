"""The te_grad intermediate representation.

Expressions are immutable dataclasses holding tuples. Equality of expression
nodes is *structural* (``a.same_as(b)``) and hashing is cached, except for the
binders -- :class:`Var` and :class:`ReduceAxis` -- and :class:`Tensor`, which
are compared by identity (two different loops both named ``i`` are different
loops). The Python operators on expressions build IR, as in TVM:
``i == j`` is a :class:`Compare` node. Its truth value (used by dict lookups)
is structural equality of the two sides, so expressions still work as keys.

Nodes are built through :mod:`te_grad.dsl`, which promotes dtypes and checks
arguments; constructors here assume well-typed operands.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional, Tuple

from . import dtypes, ops
from .errors import UserError

ARITH_OPS = tuple(ops.BINARY_OPS)
LOGIC_OPS = ("and", "or")
COMPARE_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
UNARY_OPS = ("neg", "not")
COMBINERS = tuple(ops.COMBINERS)
INTRINSICS = tuple(ops.INTRINSICS)

#: the deepest expression te_grad builds: every stage handles this depth (a chain of this many
#: additions), deeper ones are a UserError where they are built
MAX_DEPTH = 20_000


class Expr:
    """Base of every scalar expression node.

    Each node's structural hash and depth are computed once, when it is built, from
    its children's (so neither hashing nor comparing a deep expression recurses)."""

    __slots__ = ()

    def __post_init__(self):
        h = [type(self).__name__]
        depth = 0
        kids = []
        for name in _field_names(type(self)):
            v = getattr(self, name)
            if isinstance(v, tuple):
                for x in v:
                    h.append(x)
                    if isinstance(x, Expr):
                        kids.append(x)
                        depth = max(depth, x.__dict__["_depth"])
            else:
                h.append(v)
                if isinstance(v, Expr):
                    kids.append(v)
                    depth = max(depth, v.__dict__["_depth"])
        depth += 1
        if depth > MAX_DEPTH:
            raise UserError(f"expression too deep: {depth} nested operations, te_grad's limit is "
                            f"{MAX_DEPTH}; split it into several tg.compute stages or use a reduction "
                            "(tg.sum over an axis) instead of a long chain")
        object.__setattr__(self, "_depth", depth)
        object.__setattr__(self, "_children", tuple(kids))
        object.__setattr__(self, "_hash", self._own_hash(h))
        derived = getattr(self, "_derived_dtype", None)
        if derived is not None:  # children's dtypes are cached: no recursion
            object.__setattr__(self, "_dtype", derived())

    def _own_hash(self, parts):
        return hash(tuple(parts))

    @property
    def depth(self) -> int:
        """The number of nodes on the longest path from this node to a leaf."""
        return self.__dict__["_depth"]

    # -- structural identity -------------------------------------------------
    def same_as(self, other) -> bool:
        """Structural equality (identity for variables and tensors)."""
        return structurally_equal(self, other)

    def __hash__(self):
        return self.__dict__["_hash"]

    def children(self) -> Tuple["Expr", ...]:
        """The direct sub-expressions, in a fixed order (found once, when the node is built)."""
        return self.__dict__["_children"]

    def __bool__(self):
        raise UserError(
            f"the symbolic expression {self} has no Python truth value; "
            "use tg.if_then_else, tg.all / tg.any, or & | ~ to combine conditions")

    def __repr__(self):
        from .printer import expr_to_str
        return expr_to_str(self)

    __str__ = __repr__

    # -- operators build IR ----------------------------------------------------
    def _dsl(self):
        from . import dsl
        return dsl

    def __add__(self, o): return self._dsl().binary("add", self, o)
    def __radd__(self, o): return self._dsl().binary("add", o, self)
    def __sub__(self, o): return self._dsl().binary("sub", self, o)
    def __rsub__(self, o): return self._dsl().binary("sub", o, self)
    def __mul__(self, o): return self._dsl().binary("mul", self, o)
    def __rmul__(self, o): return self._dsl().binary("mul", o, self)
    def __truediv__(self, o): return self._dsl().binary("div", self, o)
    def __rtruediv__(self, o): return self._dsl().binary("div", o, self)
    def __floordiv__(self, o): return self._dsl().binary("floordiv", self, o)
    def __rfloordiv__(self, o): return self._dsl().binary("floordiv", o, self)
    def __mod__(self, o): return self._dsl().binary("floormod", self, o)
    def __rmod__(self, o): return self._dsl().binary("floormod", o, self)
    def __pow__(self, o): return self._dsl().binary("pow", self, o)
    def __rpow__(self, o): return self._dsl().binary("pow", o, self)
    def __neg__(self): return self._dsl().unary("neg", self)
    def __pos__(self): return self
    def __invert__(self): return self._dsl().unary("not", self)
    def __and__(self, o): return self._dsl().binary("and", self, o)
    def __rand__(self, o): return self._dsl().binary("and", o, self)
    def __or__(self, o): return self._dsl().binary("or", self, o)
    def __ror__(self, o): return self._dsl().binary("or", o, self)
    def __lt__(self, o): return self._dsl().compare("lt", self, o)
    def __le__(self, o): return self._dsl().compare("le", self, o)
    def __gt__(self, o): return self._dsl().compare("gt", self, o)
    def __ge__(self, o): return self._dsl().compare("ge", self, o)
    def __eq__(self, o): return self._dsl().compare("eq", self, o)
    def __ne__(self, o): return self._dsl().compare("ne", self, o)

    # -- numpy meets an expression ---------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """``np.float32(2) * x`` builds IR as ``2 * x`` does; ``np.exp(x)`` and a numpy array
        in a formula are a :class:`UserError` saying what to write."""
        return _numpy_ufunc(self, ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        raise UserError(_numpy_call_message(f"np.{func.__name__}", self, _NUMPY_FUNCTIONS.get(func.__name__)))

    def __array__(self, dtype=None, copy=None):
        # numpy asks for this when an expression is used as a numpy index (W[i, j] inside
        # tg.compute with W an ndarray) or converted with np.asarray
        raise UserError(
            f"the te_grad expression {self} was handed to numpy as an array or an index (is a numpy "
            "array indexed by te_grad index variables inside tg.compute, as W[i, j]?). A formula reads "
            "te_grad tensors only: make the array a placeholder, W_t = tg.placeholder(W.shape, "
            "dtype=str(W.dtype), name=\"W\"), read W_t[i, j] and feed W when the kernel runs; a single "
            "number is tg.const(float(W[0, 1]))")


#: numpy ufuncs that are Python operators: (method when the expression is first, when second)
_UFUNC_OPERATORS = {
    "add": ("__add__", "__radd__"), "subtract": ("__sub__", "__rsub__"), "multiply": ("__mul__", "__rmul__"),
    "true_divide": ("__truediv__", "__rtruediv__"), "divide": ("__truediv__", "__rtruediv__"),
    "floor_divide": ("__floordiv__", "__rfloordiv__"), "remainder": ("__mod__", "__rmod__"),
    "power": ("__pow__", "__rpow__"), "bitwise_and": ("__and__", "__rand__"),
    "bitwise_or": ("__or__", "__ror__"), "less": ("__lt__", "__gt__"), "less_equal": ("__le__", "__ge__"),
    "greater": ("__gt__", "__lt__"), "greater_equal": ("__ge__", "__le__"), "equal": ("__eq__", "__eq__"),
    "not_equal": ("__ne__", "__ne__"), "negative": ("__neg__", None), "positive": ("__pos__", None),
    "invert": ("__invert__", None),
}
#: what to write for a numpy function on an expression
_NUMPY_FUNCTIONS = {
    "exp": "tg.exp(x)", "log": "tg.log(x)", "sqrt": "tg.sqrt(x)", "tanh": "tg.tanh(x)", "sin": "tg.sin(x)",
    "cos": "tg.cos(x)", "arcsin": "tg.asin(x)", "arccos": "tg.acos(x)", "arctan": "tg.atan(x)",
    "arctan2": "tg.atan2(y, x)", "log1p": "tg.log1p(x)", "expm1": "tg.expm1(x)", "absolute": "tg.abs(x)",
    "fabs": "tg.abs(x)", "abs": "tg.abs(x)", "maximum": "tg.maximum(a, b)", "fmax": "tg.maximum(a, b)",
    "minimum": "tg.minimum(a, b)", "fmin": "tg.minimum(a, b)", "floor": "tg.floor(x)", "ceil": "tg.ceil(x)",
    "trunc": "tg.trunc(x)", "rint": "tg.round(x)", "round": "tg.round(x)", "around": "tg.round(x)",
    "logical_not": "tg.logical_not(c) or ~c", "logical_and": "tg.all(a, b) or a & b",
    "logical_or": "tg.any(a, b) or a | b", "where": "tg.if_then_else(cond, a, b)",
    "clip": "tg.minimum(tg.maximum(x, low), high)", "square": "x * x", "reciprocal": "1.0 / x",
    "sum": "tg.sum(expr, axis=k) over a k = tg.reduce_axis((0, n))", "max": "tg.max(expr, axis=k)",
    "amax": "tg.max(expr, axis=k)", "min": "tg.min(expr, axis=k)", "amin": "tg.min(expr, axis=k)",
    "prod": "tg.prod(expr, axis=k)", "float_power": "tg.pow(a, b)", "sign": "tg.if_then_else(x > 0, 1.0, "
    "tg.if_then_else(x < 0, -1.0, 0.0))",
}


def _numpy_call_message(what: str, expr, write: Optional[str]) -> str:
    hint = f"write {write}" if write else \
        "use te_grad's functions (tg.exp, tg.log, tg.sqrt, tg.maximum, tg.sum, ...: docs/API.md)"
    return (f"{what} on the te_grad expression {expr}: numpy functions compute on arrays and do not "
            f"build formulas; {hint}")


def _numpy_ufunc(expr, ufunc, method, inputs, kwargs):
    """A numpy ufunc with an expression among its operands (see ``Expr.__array_ufunc__``)."""
    import numpy as np
    name = ufunc.__name__
    # numpy hands a numpy scalar over as a 0-d array for some operators (np.float32(2) < x)
    inputs = tuple(x[()] if isinstance(x, np.ndarray) and x.ndim == 0 else x for x in inputs)
    arrays = [x for x in inputs if isinstance(x, np.ndarray)]
    if arrays:
        a = arrays[0]
        raise UserError(
            f"np.{name} of a numpy array (shape {list(a.shape)}) and the te_grad expression {expr}: a "
            "formula reads te_grad tensors only; make the array a placeholder fed when the kernel runs "
            "(tg.placeholder(a.shape, name=...)) and read it element-wise, or a single number "
            "tg.const(float(value))")
    ops = _UFUNC_OPERATORS.get(name)
    plain = all(isinstance(x, (Expr, int, float, bool, np.generic)) for x in inputs)
    if method == "__call__" and ops is not None and not kwargs and plain:
        if isinstance(inputs[0], Expr):
            return getattr(inputs[0], ops[0])(*inputs[1:])
        return getattr(inputs[1], ops[1])(inputs[0])
    what = f"np.{name}" if method == "__call__" else f"np.{name}.{method}"
    raise UserError(_numpy_call_message(what, expr, _NUMPY_FUNCTIONS.get(name)))


_FIELDS = {}


def _field_names(cls) -> Tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in fields(cls))
    return names


def _child_fields(node):
    for name in _field_names(type(node)):
        v = getattr(node, name)
        if isinstance(v, tuple):
            yield from v
        else:
            yield v


def structurally_equal(a, b) -> bool:
    """True if ``a`` and ``b`` are the same expression tree (binders by identity).

    Iterative (an explicit stack), so the depth of the trees does not matter."""
    stack = [(a, b)]
    while stack:
        a, b = stack.pop()
        if a is b:
            continue
        if type(a) is not type(b) or isinstance(a, (Var, Tensor)):
            return False
        if isinstance(a, tuple):
            if len(a) != len(b):
                return False
            stack.extend(zip(a, b))
            continue
        if not isinstance(a, Expr):
            if a != b:
                return False
            continue
        if hash(a) != hash(b):
            return False
        stack.extend((getattr(a, n), getattr(b, n)) for n in _field_names(type(a)))
    return True


@dataclass(frozen=True, eq=False, repr=False)
class Const(Expr):
    """A literal of a given dtype."""
    value: object
    dtype: str

    def _own_hash(self, parts):
        return hash(("Const", self.value, self.dtype))


@dataclass(frozen=True, eq=False, repr=False)
class Var(Expr):
    """An index variable bound by a compute op (one per output dimension)."""
    name: str
    dtype: str = dtypes.INDEX

    def _own_hash(self, parts):
        return id(self)

    def children(self):
        return ()


@dataclass(frozen=True, eq=False, repr=False)
class ReduceAxis(Var):
    """A reduction variable ranging over ``lo <= axis < hi``.

    ``lo`` and ``hi`` are integer expressions; they are constants when the user
    writes ``tg.reduce_axis((lo, hi))`` and may depend on enclosing variables
    in simplified gradients.
    """
    lo: Expr = None
    hi: Expr = None

    def _own_hash(self, parts):
        return id(self)

    def children(self):
        return (self.lo, self.hi)

    @property
    def extent(self):
        """The number of values as an int, when both bounds are constants."""
        if isinstance(self.lo, Const) and isinstance(self.hi, Const):
            return max(0, self.hi.value - self.lo.value)
        return None


@dataclass(frozen=True, eq=False, repr=False)
class Binary(Expr):
    """``a op b`` for arithmetic (``ARITH_OPS``) and logic (``LOGIC_OPS``); operands share a dtype."""
    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self):
        return self.__dict__["_dtype"]

    def _derived_dtype(self):
        return self.a.dtype


@dataclass(frozen=True, eq=False, repr=False)
class Unary(Expr):
    """``-a`` (``neg``) or logical ``not a`` (``not``)."""
    op: str
    a: Expr

    @property
    def dtype(self):
        return self.__dict__["_dtype"]

    def _derived_dtype(self):
        return self.a.dtype


@dataclass(frozen=True, eq=False, repr=False)
class Compare(Expr):
    """``a op b`` for ``COMPARE_OPS``; a ``bool`` condition."""
    op: str
    a: Expr
    b: Expr
    dtype = dtypes.BOOL

    def __bool__(self):
        # Lets expressions serve as dict keys and makes ``x == y`` usable in
        # Python conditionals for structural equality, as TVM does.
        if self.op == "eq":
            return structurally_equal(self.a, self.b)
        if self.op == "ne":
            return not structurally_equal(self.a, self.b)
        return Expr.__bool__(self)


@dataclass(frozen=True, eq=False, repr=False)
class Select(Expr):
    """``t if cond else f``; only the chosen branch is evaluated."""
    cond: Expr
    t: Expr
    f: Expr

    @property
    def dtype(self):
        return self.__dict__["_dtype"]

    def _derived_dtype(self):
        return self.t.dtype


@dataclass(frozen=True, eq=False, repr=False)
class Call(Expr):
    """An intrinsic function (``INTRINSICS``) of float arguments."""
    name: str
    args: Tuple[Expr, ...]

    @property
    def dtype(self):
        return self.__dict__["_dtype"]

    def _derived_dtype(self):
        return self.args[0].dtype


@dataclass(frozen=True, eq=False, repr=False)
class Cast(Expr):
    """Conversion of ``a`` to ``dtype`` (float to int truncates toward zero)."""
    dtype: str
    a: Expr


@dataclass(frozen=True, eq=False, repr=False)
class Read(Expr):
    """``tensor[indices]``: one element of a tensor."""
    tensor: "Tensor"
    indices: Tuple[Expr, ...]

    @property
    def dtype(self):
        return self.__dict__["_dtype"]

    def _derived_dtype(self):
        return self.tensor.dtype


@dataclass(frozen=True, eq=False, repr=False)
class Reduce(Expr):
    """``combiner`` of ``body`` over the points of ``axes`` where ``where`` holds.

    An empty domain gives the combiner's identity (0, 1, -inf, +inf; -1 for argmax / argmin).
    ``combiner`` names a record of :data:`te_grad.ops.REDUCTIONS`.
    """
    combiner: str
    body: Expr
    axes: Tuple[ReduceAxis, ...]
    where: Optional[Expr] = None

    @property
    def dtype(self):
        return self.__dict__["_dtype"]

    def _derived_dtype(self):
        return ops.reduction(self.combiner).result_dtype(self.body.dtype)


# ---------------------------------------------------------------------------
# Tensors and the operations that define them
# ---------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class PlaceholderOp:
    """An input: its values come from the caller."""

    def inputs(self):
        return ()


@dataclass(frozen=True, eq=False)
class ComputeOp:
    """``T[axes] = body`` over the rectangular domain of the tensor's shape.

    ``note`` (optional) says how a pass produced the op when that matters to a reader,
    e.g. a simplification that fell back to a form correct by construction."""
    axes: Tuple[Var, ...]
    body: Expr
    note: Optional[str] = None

    def inputs(self):
        got = self.__dict__.get("_inputs")
        if got is None:  # computed once: graph walks ask every op for its inputs, often
            from .graph import tensors_read
            got = tensors_read(self.body)
            object.__setattr__(self, "_inputs", got)
        return got

    def __getstate__(self):  # pickled without the cached inputs
        return {k: v for k, v in self.__dict__.items() if k != "_inputs"}


@dataclass(frozen=True, eq=False)
class ScatterOp:
    """``T = 0; for each point of axes where where: T[indices] += value``.

    The accumulating form of a gradient whose index map is data-dependent
    (``np.add.at`` semantics: repeated indices add up). ``axes`` are reduce
    axes; a later axis's bounds may use earlier ones.
    """
    axes: Tuple[ReduceAxis, ...]
    indices: Tuple[Expr, ...]
    value: Expr
    where: Optional[Expr] = None
    note: Optional[str] = None

    def inputs(self):
        got = self.__dict__.get("_inputs")
        if got is not None:
            return got
        from .graph import tensors_read
        parts = [ax.lo for ax in self.axes] + [ax.hi for ax in self.axes] + list(self.indices) + [self.value]
        if self.where is not None:
            parts.append(self.where)
        seen = {}
        for p in parts:
            for t in tensors_read(p):
                seen.setdefault(id(t), t)
        got = tuple(seen.values())
        object.__setattr__(self, "_inputs", got)
        return got

    def __getstate__(self):  # pickled without the cached inputs
        return {k: v for k, v in self.__dict__.items() if k != "_inputs"}


class Tensor:
    """A named, typed, statically shaped array defined by an op.

    Tensors are compared by identity. ``T[i, j]`` builds a :class:`Read`.
    """

    __slots__ = ("name", "shape", "dtype", "op")

    def __init__(self, name: str, shape: Tuple[int, ...], dtype: str, op):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "op", op)

    def __setattr__(self, key, value):
        raise AttributeError("te_grad tensors are immutable")

    def __reduce__(self):  # pickling: rebuilt through __init__
        return Tensor, (self.name, self.shape, self.dtype, self.op)

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def is_placeholder(self) -> bool:
        """Whether the tensor is an input (``tg.placeholder``) rather than computed."""
        return isinstance(self.op, PlaceholderOp)

    def __getitem__(self, indices):
        from .dsl import read
        return read(self, indices)

    def __repr__(self):
        kind = "placeholder" if self.is_placeholder else type(self.op).__name__.replace("Op", "").lower()
        return f"Tensor({self.name}: {self.dtype}{list(self.shape)}, {kind})"

    def __bool__(self):
        return True

    def __iter__(self):
        raise UserError(f"tensor {self.name} is not iterable; index it with {self.name}[i, ...]")

    def _no_arithmetic(self, *_):
        raise UserError(f"arithmetic on the whole tensor {self.name}: write it element-wise inside "
                        f"tg.compute (e.g. {self.name}[i] + 1), or use tg.nn.add / tg.nn.multiply / ...")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _no_arithmetic
    __truediv__ = __rtruediv__ = __pow__ = __neg__ = __matmul__ = _no_arithmetic

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        raise UserError(f"np.{ufunc.__name__} on the whole tensor {self.name}: numpy computes on arrays; "
                        f"write the formula element-wise inside tg.compute (e.g. tg.compute({self.name}.shape, "
                        f"lambda *i: tg.exp({self.name}[i]))) or use tg.nn's operations")

    def __array_function__(self, func, types, args, kwargs):
        raise UserError(f"np.{func.__name__} on the tensor {self.name}: numpy computes on arrays; write the "
                        f"formula with te_grad (tg.compute, tg.sum over a tg.reduce_axis, tg.nn) or evaluate "
                        f"the tensor first (tg.evaluate / tg.build)")

    def _repr_html_(self):
        from .display import tensor_html
        return tensor_html(self)

    def _repr_latex_(self):
        """The tensor's own formula as a LaTeX equation (sympy renders it)."""
        from .symbolic import latex
        if self.is_placeholder:
            return None
        return "$$" + latex(self, dependencies=False) + "$$"
