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

    An empty domain gives the combiner's identity (0, 1, -inf, +inf).
    """
    combiner: str
    body: Expr
    axes: Tuple[ReduceAxis, ...]
    where: Optional[Expr] = None

    @property
    def dtype(self):
        return self.__dict__["_dtype"]

    def _derived_dtype(self):
        return self.body.dtype


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

    def __reduce__(self):  # pickling (the persistent kernel cache): rebuilt through __init__
        return Tensor, (self.name, self.shape, self.dtype, self.op)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def is_placeholder(self) -> bool:
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

    def _repr_html_(self):
        from .display import tensor_html
        return tensor_html(self)

    def _repr_latex_(self):
        """The tensor's own formula as a LaTeX equation (sympy renders it)."""
        from .symbolic import latex
        if self.is_placeholder:
            return None
        return "$$" + latex(self, dependencies=False) + "$$"
