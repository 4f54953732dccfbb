"""The te_grad intermediate representation.

Expressions are immutable dataclasses holding tuples. Equality of expression
nodes is *structural* (``a.same_as(b)``) and hashing is cached, except for the
binders -- :class:`Var` and :class:`ReduceAxis` -- and :class:`Tensor`, which
are compared by identity (two different loops both named ``i`` are different
loops). The Python operators on expressions build IR, as in TVM:
``i == j`` is a :class:`Compare` node. Its truth value (used by dict lookups)
is structural equality of the two sides, so expressions still work as keys.

Nodes are built through the typed make-functions at the end of this module
(:func:`const`, :func:`as_expr`, :func:`cast`, :func:`binary`, :func:`unary`,
:func:`compare`, :func:`read`: they promote dtypes and check arguments; the node
constructors assume well-typed operands). The Python operators call them, and
:mod:`te_grad.dsl` re-exports them beside the user's constructors.

This module is the bottom of the IR core: it imports only :mod:`te_grad.dtypes`,
:mod:`te_grad.ops` and :mod:`te_grad.errors`. The floors above install what they own on
the nodes: :mod:`te_grad.printer` the text form (``repr``), :mod:`te_grad.display` and
:mod:`te_grad.symbolic` the notebook forms (``_repr_html_``, ``_repr_latex_``).
"""
from __future__ import annotations

import builtins
import numbers
import operator
from dataclasses import dataclass, fields
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from . import dtypes, ops
from .errors import UserError
from .interop import NUMPY_FUNCTIONS, numpy_call_message, numpy_ufunc

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

    def __repr__(self):  # te_grad.printer installs the readable form
        return f"<{type(self).__name__} expression>"

    __str__ = __repr__

    # -- operators build IR (the typed make-functions at the end of this module) ----------------------------------------------------
    def __add__(self, o): return binary("add", self, o)
    def __radd__(self, o): return binary("add", o, self)
    def __sub__(self, o): return binary("sub", self, o)
    def __rsub__(self, o): return binary("sub", o, self)
    def __mul__(self, o): return binary("mul", self, o)
    def __rmul__(self, o): return binary("mul", o, self)
    def __truediv__(self, o): return binary("div", self, o)
    def __rtruediv__(self, o): return binary("div", o, self)
    def __floordiv__(self, o): return binary("floordiv", self, o)
    def __rfloordiv__(self, o): return binary("floordiv", o, self)
    def __mod__(self, o): return binary("floormod", self, o)
    def __rmod__(self, o): return binary("floormod", o, self)
    def __pow__(self, o): return binary("pow", self, o)
    def __rpow__(self, o): return binary("pow", o, self)
    def __neg__(self): return unary("neg", self)
    def __pos__(self): return self
    def __invert__(self): return unary("not", self)
    def __and__(self, o): return binary("and", self, o)
    def __rand__(self, o): return binary("and", o, self)
    def __or__(self, o): return binary("or", self, o)
    def __ror__(self, o): return binary("or", o, self)
    def __lt__(self, o): return compare("lt", self, o)
    def __le__(self, o): return compare("le", self, o)
    def __gt__(self, o): return compare("gt", self, o)
    def __ge__(self, o): return compare("ge", self, o)
    def __eq__(self, o): return compare("eq", self, o)
    def __ne__(self, o): return compare("ne", self, o)

    # -- numpy meets an expression ---------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """``np.float32(2) * x`` builds IR as ``2 * x`` does; ``np.exp(x)`` and a numpy array
        in a formula are a :class:`UserError` saying what to write."""
        return numpy_ufunc(self, ufunc, method, inputs, kwargs, Expr)

    def __array_function__(self, func, types, args, kwargs):
        raise UserError(numpy_call_message(f"np.{func.__name__}", self, NUMPY_FUNCTIONS.get(func.__name__)))

    def __array__(self, dtype=None, copy=None):
        # numpy asks for this when an expression is used as a numpy index (W[i, j] inside
        # tg.compute with W an ndarray) or converted with np.asarray
        raise UserError(
            f"the te_grad expression {self} was handed to numpy as an array or an index (is a numpy "
            "array indexed by te_grad index variables inside tg.compute, as W[i, j]?). A formula reads "
            "te_grad tensors only: make the array a placeholder, W_t = tg.placeholder(W.shape, "
            "dtype=str(W.dtype), name=\"W\"), read W_t[i, j] and feed W when the kernel runs; a single "
            "number is tg.const(float(W[0, 1]))")


_FIELDS = {}


def _field_names(cls) -> Tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in fields(cls))
    return names


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
class SizeVar(Expr):
    """A size known only at run time (``tg.var("n")``): an integer ``>= lo`` (and ``<= hi``
    when set), the same for every point of every op that uses it.

    Shapes and reduce-axis bounds are affine in size variables; index expressions may use
    them. They are compared by identity, like index variables, but are not index variables:
    nothing binds them inside an expression, a call binds them from its arguments' shapes
    (:func:`te_grad.sizes.bind_sizes`)."""
    name: str
    lo: int = 0
    hi: Optional[int] = None
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


# ---------------------------------------------------------------------------
# reads (the graph queries of te_grad.graph build on these)
# ---------------------------------------------------------------------------


def reads_in(expr: Expr) -> List[Read]:
    """Every Read node of ``expr`` in a fixed left-to-right order (repeats kept).

    Iterative (an explicit stack), like the other queries here: depth does not matter."""
    reads: List[Read] = []
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, Read):
            reads.append(node)
        stack.extend(reversed(node.children()))
    return reads


def distinct_nodes(*roots: Expr) -> Iterator[Expr]:
    """Every node under ``roots`` once (by identity), in pre-order, left to right. A node shared
    by several parents (a DAG) is yielded and walked once: linear in the DAG, not the tree.
    Iterative (an explicit stack): depth does not matter."""
    seen = set()
    stack = list(reversed(roots))
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(reversed(node.children()))


def distinct_reads(expr: Expr) -> List[Read]:
    """Every Read node of ``expr`` once, in the order of :func:`reads_in`'s first occurrences
    (linear in the DAG, where :func:`reads_in`, which keeps repeats, is linear in the tree)."""
    return [node for node in distinct_nodes(expr) if isinstance(node, Read)]


def read_uses(expr: Expr) -> List[Read]:
    """The Read nodes of ``expr``, each once per parent node that uses it (``x * x`` with ``x =
    T[i]`` lists it twice; ``expr`` itself once if it is a read): what :func:`reads_in` lists for
    a tree, with every node walked once, so linear in a DAG where a subexpression shared by
    several parents would make the tree exponential."""
    uses: List[Read] = [expr] if isinstance(expr, Read) else []
    for node in distinct_nodes(expr):
        uses.extend(c for c in node.children() if isinstance(c, Read))
    return uses


def tensors_read(expr: Expr) -> Tuple[Tensor, ...]:
    """The distinct tensors read by ``expr``, in order of first read."""
    seen: Dict[int, Tensor] = {}
    for r in distinct_reads(expr):
        seen.setdefault(id(r.tensor), r.tensor)
    return tuple(seen.values())


# ---------------------------------------------------------------------------
# typed make-functions: the Python operators above call these; te_grad.dsl re-exports them
# ---------------------------------------------------------------------------


def const(value, dtype=None) -> Const:
    """A constant. Without ``dtype``: bool -> bool, int -> int64, float -> float32."""
    if isinstance(value, Expr):
        raise UserError(f"tg.const expects a Python number, got the expression {value}")
    if dtype is None:
        if isinstance(value, (bool, np.bool_)):
            dtype = dtypes.BOOL
        elif isinstance(value, numbers.Integral):
            dtype = dtypes.INT64
        elif isinstance(value, numbers.Real):
            dtype = dtypes.DEFAULT_FLOAT
        else:
            raise UserError(f"cannot make a constant from {value!r} of type {type(value).__name__}")
    dtype = dtypes.canonical(dtype)
    if dtypes.is_float(dtype):
        value = float(value)
    elif dtype == dtypes.BOOL:
        value = bool(value)
    else:
        if isinstance(value, float) and not float(value).is_integer():
            raise UserError(f"constant {value!r} is not an integer but dtype {dtype} was asked for")
        value = int(value)
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise UserError(f"constant {value} does not fit in {dtype}")
    return Const(value, dtype)


def _is_scalar(x) -> bool:
    return isinstance(x, (numbers.Number, np.bool_)) and not isinstance(x, Expr)


def as_expr(x, like: str = None) -> Expr:
    """``x`` as an expression; a Python scalar is typed weakly against dtype ``like``."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, Tensor):
        raise UserError(f"tensor {x.name} used as a scalar; read an element with {x.name}[...]")
    if not _is_scalar(x):
        raise UserError(f"cannot use {x!r} (type {type(x).__name__}) in a tensor expression")
    if isinstance(x, (bool, np.bool_)):
        return const(bool(x), dtypes.BOOL)
    if isinstance(x, numbers.Integral):
        if like is None or like == dtypes.BOOL:
            return const(int(x), dtypes.INT64)
        return const(int(x), like)
    if like is not None and dtypes.is_float(like):
        return const(float(x), like)
    return const(float(x), dtypes.DEFAULT_FLOAT)


def _operands(a, b):
    """Both operands as expressions of one promoted dtype."""
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        a, b = as_expr(a), as_expr(b)
    a = as_expr(a, b.dtype if isinstance(b, Expr) else None)
    b = as_expr(b, a.dtype)
    dt = dtypes.promote(a.dtype, b.dtype)
    return cast(dt, a), cast(dt, b)


def cast(dtype, x) -> Expr:
    """``x`` converted to ``dtype`` (no node if it already has that dtype): ``tg.cast("int64", e)``.

    Float to integer truncates toward zero; anything to ``bool`` is ``!= 0``."""
    if isinstance(dtype, (Expr, Tensor)) or isinstance(x, (str, np.dtype, type)):
        raise UserError(f"tg.cast(dtype, x) takes the dtype first, then the expression; got "
                        f"tg.cast({dtype!r}, {x!r})")
    dtype = dtypes.canonical(dtype)
    x = as_expr(x, dtype)
    if x.dtype == dtype:
        return x
    if isinstance(x, Const):  # fold: same conversion as the Cast node would do
        return const(np.array(x.value, dtype=x.dtype).astype(dtype).item(), dtype)
    return Cast(dtype, x)


def binary(op: str, a, b) -> Expr:
    """A typed binary node: arithmetic, min/max, pow or logical and/or."""
    a, b = _operands(a, b)
    dt = a.dtype
    if op in ("and", "or"):
        if dt != dtypes.BOOL:
            raise UserError(f"'{op}' needs two conditions, got {a} ({a.dtype}) and {b} ({b.dtype})")
        return Binary(op, a, b)
    if dt == dtypes.BOOL:
        raise UserError(f"arithmetic '{op}' on two conditions ({a}, {b}); "
                        "use & and | to combine conditions or tg.cast to convert them")
    if op == "div" and not dtypes.is_float(dt):
        a, b = cast(dtypes.DEFAULT_FLOAT, a), cast(dtypes.DEFAULT_FLOAT, b)
    if op == "pow" and not dtypes.is_float(dt):
        a, b = cast(dtypes.DEFAULT_FLOAT, a), cast(dtypes.DEFAULT_FLOAT, b)
    if op in ("floordiv", "floormod"):
        if not dtypes.is_int(dt):
            sym = "//" if op == "floordiv" else "%"
            raise UserError(f"'{sym}' needs integer operands, got {a} ({a.dtype}) {sym} {b} ({b.dtype}); "
                            "for floats use tg.floor(a / b)")
        if isinstance(b, Const) and b.value == 0:
            raise UserError(f"integer division by zero in {a} // 0")
    return _folded(op, a, b)


_INT_FOLD = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
             "floormod": operator.mod, "min": builtins.min, "max": builtins.max}


def _is(e: Expr, value) -> bool:
    return isinstance(e, Const) and e.value == value


def _folded(op: str, a: Expr, b: Expr) -> Expr:
    """``Binary(op, a, b)`` without exact identities: integer constants are folded, and
    ``x * 1``, ``x / 1``, ``x + 0``, ``x - 0`` are ``x`` (for floats up to the sign of a zero)."""
    if isinstance(a, Const) and isinstance(b, Const) and dtypes.is_int(a.dtype) and op in _INT_FOLD:
        return const(_INT_FOLD[op](a.value, b.value), a.dtype)
    if (op == "mul" and _is(b, 1)) or (op in ("add", "sub") and _is(b, 0)) or (op == "div" and _is(b, 1)):
        return a
    if (op == "mul" and _is(a, 1)) or (op == "add" and _is(a, 0)):
        return b
    if op in ("floordiv",) and _is(b, 1) and dtypes.is_int(a.dtype):
        return a
    if op == "add" and dtypes.is_int(a.dtype):
        whole = _undo_divmod(a, b)
        if whole is None:
            whole = _undo_divmod(b, a)
        if whole is not None:
            return whole
    return Binary(op, a, b)


def _undo_divmod(q: Expr, r: Expr):
    """``x`` if ``q + r`` is ``(x // c) * c + x % c`` (an identity for integers), else None."""
    if not (isinstance(r, Binary) and r.op == "floormod" and isinstance(r.b, Const)):
        return None
    if isinstance(q, Binary) and q.op == "mul":
        for div, c in ((q.a, q.b), (q.b, q.a)):
            if (isinstance(div, Binary) and div.op == "floordiv" and isinstance(c, Const)
                    and isinstance(div.b, Const) and c.value == div.b.value == r.b.value
                    and div.a.same_as(r.a)):
                return r.a
    return None


def unary(op: str, a) -> Expr:
    a = as_expr(a)
    if op == "not":
        if a.dtype != dtypes.BOOL:
            raise UserError(f"'~' / tg.logical_not needs a condition, got {a} ({a.dtype})")
    elif a.dtype == dtypes.BOOL:
        raise UserError(f"cannot negate the condition {a}; use ~ for logical not")
    return Unary(op, a)


def compare(op: str, a, b) -> Compare:
    a, b = _operands(a, b)
    if a.dtype == dtypes.BOOL and op not in ("eq", "ne"):
        raise UserError(f"ordering comparison '{op}' between conditions {a} and {b}")
    return Compare(op, a, b)


def read(tensor: Tensor, indices) -> Read:
    """``tensor[indices]``: checks the number of indices and that they are integers."""
    if not isinstance(indices, tuple):
        indices = tuple(indices) if isinstance(indices, list) else (indices,)
    if len(indices) == 1 and isinstance(indices[0], (tuple, list)):
        indices = tuple(indices[0])
    if len(indices) != tensor.ndim:
        raise UserError(f"tensor {tensor.name} has {tensor.ndim} dimensions {list(tensor.shape)} "
                        f"but was indexed with {len(indices)} indices")
    out = []
    for d, ix in enumerate(indices):
        if isinstance(ix, (slice, type(None), type(Ellipsis))):
            raise UserError(f"tensor {tensor.name} index {d} is {ix!r}; te_grad reads one element at "
                            "a time: use index variables")
        if isinstance(ix, Tensor):
            raise UserError(f"tensor {ix.name} used as index {d} of {tensor.name}; read one element "
                            f"of it, e.g. {ix.name}[i]")
        e = as_expr(ix, dtypes.INDEX)
        if not dtypes.is_int(e.dtype):
            raise UserError(f"index {d} of tensor {tensor.name} is {e} of dtype {e.dtype}; "
                            "indices must be integers (a float tensor cannot be used as an index)")
        e = cast(dtypes.INDEX, e)
        n = tensor.shape[d]
        if isinstance(e, Const) and (e.value < 0 or (isinstance(n, int) and e.value >= n)):
            raise UserError(f"constant index {e.value} is out of bounds for dimension {d} of "
                            f"tensor {tensor.name} with shape {list(tensor.shape)}")
        out.append(e)
    return Read(tensor, tuple(out))
