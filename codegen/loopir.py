"""A small loop IR between te_grad tensors and LLVM: immutable statements, annotated loops.

A :class:`Stage` computes one tensor: statements run for a range of its parallel
loop. There are three statements: :class:`Loop`, :class:`If` and :class:`Store`;
the expressions inside them are ordinary te_grad expressions without reductions
(a ``Read`` is a load from a buffer). Every node is immutable: a transformation
builds new statements (:class:`StmtMutator` returns the same node when nothing
below it changed), and :class:`StmtVisitor` walks them.

A loop's *kind* says how the loop is lowered, never what it computes: the body of
every loop is the plain meaning of the nest, so :func:`plain` (every kind made
serial) computes exactly the same values, and any interpreter of plain loops is a
witness for any schedule. The kinds:

- :data:`SERIAL`;
- :class:`Parallel`: split among threads (in blocks of ``scale`` indices);
- :class:`RegisterBlocked`: the outermost loop of a register block, a nest
  ``for jams: for reduce loops: for lanes: [if cond:] store``; ``width`` lanes at a
  time of the store's row stay in vector registers across the loops inside
  (:class:`RegisterBlock` reads the nest back);
- :class:`Transposed`: ``for u in 8: for v in 8: store`` whose store is unit-stride in
  ``v`` and one read unit-stride in ``u``: eight rows of the read are transposed in
  registers (:class:`TransposeBlock`);
- :class:`Carried`: a scan step ``for u: T[at] = carried; for r: [if cond:] T[at] op= value``
  whose running value stays in a register from one ``u`` to the next (:class:`Scan`).

The kinds are chosen by the scheduling passes (:mod:`.schedule` and the modules it
calls), the last of which keeps a register block or a transpose only where it has a
vector form (:func:`.register_blocking.decide_blocks`); the emitter (:mod:`.llvm_emit`)
lowers each kind by one routine, never falling back to the plain loops.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

from te_grad import dsl
from te_grad.graph import reads_in
from te_grad.ir import Const, Expr, Read, ReduceAxis, Tensor, Var, distinct_reads
from te_grad.ops import reduction
from te_grad.printer import ExprPrinter, Namer
from te_grad.sizes import is_size_expr


# -- loop kinds -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Serial:
    """An ordinary loop."""


SERIAL = Serial()


@dataclass(frozen=True)
class Parallel:
    """Split among threads: each gets a range of the loop (in blocks of ``scale`` indices)."""
    scale: int = 1


@dataclass(frozen=True)
class Jam:
    """An output variable ``var`` unrolled by ``factor`` and jammed into a register block:
    the loop around the block runs over ``outer`` in ``[0, n / factor)`` and the block
    computes ``var = base + outer * factor + offset`` for each ``offset < factor``."""
    var: Var
    outer: Var
    factor: int
    base: int = 0

    @property
    def first(self) -> Expr:
        return self.outer * self.factor + self.base if self.base else self.outer * self.factor

    def var_range(self, outer_range: Tuple[int, int]) -> Tuple[int, int]:
        """The inclusive range of ``var`` when ``outer`` lies in ``outer_range``."""
        return (self.base + outer_range[0] * self.factor, self.base + outer_range[1] * self.factor + self.factor - 1)


@dataclass(frozen=True)
class RegisterBlocked:
    """The outermost loop of a register block whose vector lanes run along ``lanes``."""
    lanes: Var
    #: unroll-and-jam: the block also covers ``factor`` consecutive values of each jammed
    #: output variable; the first varies slowest among the copies
    jams: Tuple[Jam, ...] = ()
    #: the lanes run along a reduce axis: the vector accumulates over all the loops and
    #: its lanes are combined once at the end
    reduce_lanes: bool = False
    #: bits of one vector register (the emitter uses 1, 2, 4 or 8 registers per copy)
    vector_bits: int = 256
    #: vector registers the accumulators of all the jammed copies may take together
    accumulators: int = 12


@dataclass(frozen=True)
class Transposed:
    """``for u in 8: for v in 8: store`` with ``read`` (a Read of the store's value)
    unit-stride in ``u``: eight vector loads of it are transposed in registers."""
    read: Read


@dataclass(frozen=True)
class Carried:
    """A scan step: the value the body accumulates into ``T[at]`` stays in a register
    from one iteration to the next (the body's first statement, which copies the
    previous element in the plain meaning, is that register)."""


LoopKind = Union[Serial, Parallel, RegisterBlocked, Transposed, Carried]


# -- statements -------------------------------------------------------------------------------
def _tuple(body) -> Tuple["Stmt", ...]:
    return body if isinstance(body, tuple) else tuple(body)


@dataclass(frozen=True, eq=False)
class Loop:
    """``for var in range(lo, hi): body``, lowered as its ``kind`` says."""
    var: Var
    lo: Expr
    hi: Expr
    body: Tuple["Stmt", ...]
    kind: LoopKind = SERIAL

    def __post_init__(self):
        object.__setattr__(self, "body", _tuple(self.body))

    @property
    def parallel(self) -> bool:
        return isinstance(self.kind, Parallel)

    @property
    def scale(self) -> int:
        """Threads get ranges of whole blocks of this many indices (1 unless parallel)."""
        return self.kind.scale if isinstance(self.kind, Parallel) else 1


@dataclass(frozen=True, eq=False)
class If:
    """``if cond: body``."""
    cond: Expr
    body: Tuple["Stmt", ...]

    def __post_init__(self):
        object.__setattr__(self, "body", _tuple(self.body))


@dataclass(frozen=True, eq=False)
class Store:
    """``tensor[indices] = value``, or ``= combine(tensor[indices], value)`` when ``combine`` is set.

    ``checked`` stores (scatters with data-dependent indices) verify the indices at run time.
    ``index`` is set for an indexed reduction (argmax, see :class:`te_grad.ops.Reduction`): the
    reduce axis whose value is the candidate stored, ``value`` the candidate's value (the stored
    winner's value is ``value`` evaluated again with ``index`` bound to the stored index).
    """
    tensor: Tensor
    indices: Tuple[Expr, ...]
    value: Expr
    combine: Optional[str] = None
    checked: bool = False
    index: Optional[Expr] = None

    def __post_init__(self):
        object.__setattr__(self, "indices", tuple(self.indices))


Stmt = Union[Loop, If, Store]


@dataclass(frozen=True, eq=False)
class Stage:
    """The statements that compute ``tensor``; ``parallel_extent`` > 0 if its outer loop may be split."""
    tensor: Tensor
    body: Tuple[Stmt, ...]
    parallel_extent: int = 0
    #: the output axis split among threads, when the parallel loop runs over one (not a tile index)
    parallel_axis: Optional[Var] = None
    #: innermost iterations, when they differ from the tensor's own count (a scatter's zero-fill)
    work: Optional[int] = None
    #: a row pointer whose rows the parallel loops run over: threads get ranges of rows
    #: holding about equal numbers of its edges (:mod:`.ragged_split`), not equal rows
    balance: Optional[Tensor] = None
    #: the points of ``tensor`` its readers use, over its axes (:mod:`simplify.unread`): the
    #: stage must store the tensor's values there, and may store anything at other points of
    #: its buffer (None: every point)
    region: Optional[Expr] = None

    def __post_init__(self):
        object.__setattr__(self, "body", _tuple(self.body))

    @property
    def parallel_granule(self) -> int:
        """Threads must get ranges of the split axis that are multiples of this: the least
        common multiple of the block sizes of the parallel loops."""
        return math.lcm(1, *[lp.scale for lp in loops(self.body) if lp.parallel])


# -- one visitor and one mutator -------------------------------------------------------------
class StmtVisitor:
    """Walks statements: ``visit_Loop``, ``visit_If``, ``visit_Store`` (each recursing by
    default); ``visit_expr`` sees every expression (bounds, guards, indices, values)."""

    def visit(self, s: Stmt):
        return getattr(self, "visit_" + type(s).__name__)(s)

    def visit_body(self, body: Sequence[Stmt]):
        for s in body:
            self.visit(s)

    def visit_Loop(self, s: Loop):
        self.visit_expr(s.lo)
        self.visit_expr(s.hi)
        self.visit_body(s.body)

    def visit_If(self, s: If):
        self.visit_expr(s.cond)
        self.visit_body(s.body)

    def visit_Store(self, s: Store):
        for i in s.indices:
            self.visit_expr(i)
        self.visit_expr(s.value)
        if s.index is not None:
            self.visit_expr(s.index)

    def visit_expr(self, e: Expr):
        pass


class StmtMutator:
    """Rebuilds statements bottom-up; a statement none of whose parts changed is returned
    as it was. ``visit_expr`` maps every expression, ``visit_kind`` every loop kind."""

    def visit(self, s: Stmt) -> Stmt:
        return getattr(self, "visit_" + type(s).__name__)(s)

    def visit_body(self, body: Sequence[Stmt]) -> Tuple[Stmt, ...]:
        new = tuple(self.visit(s) for s in body)
        return body if isinstance(body, tuple) and all(a is b for a, b in zip(new, body)) else new

    def visit_Loop(self, s: Loop) -> Stmt:
        lo, hi, body, kind = self.visit_expr(s.lo), self.visit_expr(s.hi), self.visit_body(s.body), \
            self.visit_kind(s.kind)
        if lo is s.lo and hi is s.hi and body is s.body and kind is s.kind:
            return s
        return Loop(s.var, lo, hi, body, kind)

    def visit_If(self, s: If) -> Stmt:
        cond, body = self.visit_expr(s.cond), self.visit_body(s.body)
        return s if cond is s.cond and body is s.body else If(cond, body)

    def visit_Store(self, s: Store) -> Stmt:
        idx = tuple(self.visit_expr(i) for i in s.indices)
        value = self.visit_expr(s.value)
        index = None if s.index is None else self.visit_expr(s.index)
        if value is s.value and index is s.index and all(a is b for a, b in zip(idx, s.indices)):
            return s
        return replace(s, indices=idx, value=value, index=index)

    def visit_expr(self, e: Expr) -> Expr:
        return e

    def visit_kind(self, kind: LoopKind) -> LoopKind:
        return kind


def map_exprs(stmts: Sequence[Stmt], fn: Callable[[Expr], Expr]) -> Tuple[Stmt, ...]:
    """``stmts`` with ``fn`` applied to every expression."""
    class Mapped(StmtMutator):
        def visit_expr(self, e):
            return fn(e)
    return Mapped().visit_body(tuple(stmts))


def plain(stmts: Sequence[Stmt]) -> Tuple[Stmt, ...]:
    """``stmts`` with every loop serial: the same values, computed in the same order."""
    class Plain(StmtMutator):
        def visit_kind(self, kind):
            return SERIAL
    return Plain().visit_body(tuple(stmts))


# -- walkers ----------------------------------------------------------------------------------
class _Collect(StmtVisitor):
    def __init__(self, want: Callable[[object], bool], exprs: bool = False):
        self.want, self.exprs, self.found = want, exprs, []

    def visit(self, s):
        if not self.exprs and self.want(s):
            self.found.append(s)
        return super().visit(s)

    def visit_expr(self, e):
        if self.exprs:
            self.found.append(e)


def stmt_exprs(stmts: Sequence[Stmt]) -> List[Expr]:
    """Every expression in ``stmts`` (loop bounds, guards, indices and values), in program order."""
    c = _Collect(None, exprs=True)
    c.visit_body(stmts)
    return c.found


def stmt_reads(stmts: Sequence[Stmt]) -> Iterator[Read]:
    """Every read node in ``stmts`` (loop bounds, guards, indices and values), in program
    order; a node shared within an expression once."""
    for e in stmt_exprs(stmts):
        yield from distinct_reads(e)


def stmt_stores(stmts: Sequence[Stmt]) -> List[Store]:
    """Every store in ``stmts``."""
    c = _Collect(lambda s: isinstance(s, Store))
    c.visit_body(stmts)
    return c.found


def loops(stmts: Sequence[Stmt]) -> List[Loop]:
    """Every loop in ``stmts``, outer before inner."""
    c = _Collect(lambda s: isinstance(s, Loop))
    c.visit_body(stmts)
    return c.found


def ragged_loop_vars(stmts: Sequence[Stmt]) -> List[Var]:
    """The variables of the loops in ``stmts`` whose bounds read data (ragged loops,
    ``range(rowptr[v], rowptr[v + 1])``), outer before inner: a kernel's error record names
    such a loop by its position here."""
    return [lp.var for lp in loops(stmts) if reads_in(lp.lo) or reads_in(lp.hi)]


def loops_of_kind(stmts: Sequence[Stmt], kind: type) -> List[Loop]:
    """Every loop of ``stmts`` whose kind is an instance of ``kind``."""
    return [lp for lp in loops(stmts) if isinstance(lp.kind, kind)]


def tensors_of(stage: Stage) -> List[Tensor]:
    """The buffers a stage touches: its output first, then what it reads, in order."""
    seen = {id(stage.tensor): stage.tensor}
    for r in stmt_reads(stage.body):
        seen.setdefault(id(r.tensor), r.tensor)
    return list(seen.values())


def nest(order: Sequence[Var], bounds, inner: Sequence[Stmt], parallel: Optional[Var] = None) -> List[Stmt]:
    """Loops over ``order`` (outermost first, ``bounds[id(var)] = (lo, hi)``) around ``inner``;
    the loop over ``parallel`` is split among threads."""
    body = tuple(inner)
    for v in reversed(list(order)):
        lo, hi = bounds[id(v)]
        body = (Loop(v, lo, hi, body, Parallel() if v is parallel else SERIAL),)
    return list(body)


def guarded(cond: Optional[Expr], store: Store) -> Tuple[Stmt, ...]:
    """``store``, under ``if cond`` when there is one."""
    return (If(cond, (store,)),) if cond is not None else (store,)


# -- perfect nests: the form the scheduling passes rewrite ------------------------------------
@dataclass(frozen=True, eq=False)
class Nest:
    """A perfect nest: ``loops`` (outer first), each the only statement of the one before,
    around ``[if cond:] store``. A tensor's definition is written as such nests (an
    initialization nest, ``store.combine`` unset, then one accumulating nest per reduction
    term), and the scheduling passes rewrite them one by one. Loops over reduce axes
    (``ReduceAxis`` variables, which a store never indexes by) are the nest's reductions,
    the others its outputs."""
    loops: Tuple[Loop, ...]
    cond: Optional[Expr]
    store: Store

    @staticmethod
    def of(s: Stmt) -> Optional["Nest"]:
        """``s`` read as a perfect nest of serial or parallel loops, or None."""
        chain = []
        while isinstance(s, Loop) and len(s.body) == 1 and isinstance(s.kind, (Serial, Parallel)):
            chain.append(s)
            s = s.body[0]
        if isinstance(s, If) and len(s.body) == 1 and isinstance(s.body[0], Store):
            return Nest(tuple(chain), s.cond, s.body[0])
        if isinstance(s, Store):
            return Nest(tuple(chain), None, s)
        return None

    @property
    def order(self) -> List[Var]:
        return [lp.var for lp in self.loops]

    @property
    def bounds(self):
        """``{id(var): (lo, hi)}`` of every loop."""
        return {id(lp.var): (lp.lo, lp.hi) for lp in self.loops}

    @property
    def outputs(self) -> List[Var]:
        return [lp.var for lp in self.loops if not isinstance(lp.var, ReduceAxis)]

    @property
    def reductions(self) -> List[ReduceAxis]:
        return [lp.var for lp in self.loops if isinstance(lp.var, ReduceAxis)]

    @property
    def parallel(self) -> Optional[Var]:
        """The variable of the loop split among threads, if any."""
        return next((lp.var for lp in self.loops if lp.parallel), None)

    @property
    def accumulates(self) -> bool:
        return self.store.combine is not None

    def whole_outputs(self, sizes: bool = False) -> Optional[Tuple[List[Var], list]]:
        """``(axes, extents)`` of the output loops when each runs over ``[0, extent)`` (a whole
        output domain, before it is cut into pieces), else None. With ``sizes`` an extent may
        be a size expression (known at run time), returned as that expression."""
        outs = [lp for lp in self.loops if not isinstance(lp.var, ReduceAxis)]
        if any(not (isinstance(lp.lo, Const) and lp.lo.value == 0 and
                    (isinstance(lp.hi, Const) or (sizes and is_size_expr(lp.hi)))) for lp in outs):
            return None
        return [lp.var for lp in outs], [int(lp.hi.value) if isinstance(lp.hi, Const) else lp.hi for lp in outs]

    def stmt(self, order: Optional[Sequence[Var]] = None, bounds=None, parallel: Optional[Var] = None) -> Stmt:
        """The nest as one statement: its loops in ``order`` (default: as they are) with
        ``bounds`` (default: their own), the loop over ``parallel`` split among threads."""
        body = nest(self.order if order is None else order, self.bounds if bounds is None else bounds,
                    guarded(self.cond, self.store), parallel)
        return body[0]


def rewrite_nests(stage: Stage, fn: Callable[[Nest], Optional[Sequence[Stmt]]]) -> Stage:
    """``stage`` with each top-level statement that is a perfect nest replaced by
    ``fn(nest)`` (several statements, or None to keep it)."""
    body: List[Stmt] = []
    changed = False
    for s in stage.body:
        n = Nest.of(s)
        new = fn(n) if n is not None else None
        if new is None:
            body.append(s)
        else:
            body.extend(new)
            changed = True
    return replace(stage, body=tuple(body)) if changed else stage


# -- views of the annotated nests: what the emitter and the passes read -----------------------
@dataclass(frozen=True, eq=False)
class RegisterBlock:
    """A register block read back from its annotated nest (:class:`RegisterBlocked`):
    ``for jams: for loops: for var in [lo, hi): [if cond:] store``."""
    var: Var
    lo: Expr
    hi: Expr
    loops: Tuple[Loop, ...]  # the reduce loops, outer first (their bodies are the rest of the nest)
    cond: Optional[Expr]
    store: Store
    jams: Tuple[Jam, ...] = ()
    reduce_lanes: bool = False
    vector_bits: int = 256
    accumulators: int = 12

    @staticmethod
    def of(loop: Loop) -> "RegisterBlock":
        kind: RegisterBlocked = loop.kind
        chain, s = [], loop
        while s.var is not kind.lanes:
            chain.append(s)
            s = s.body[0]
        inner = s.body[0]
        cond, store = (inner.cond, inner.body[0]) if isinstance(inner, If) else (None, inner)
        return RegisterBlock(s.var, s.lo, s.hi, tuple(chain[len(kind.jams):]), cond, store, kind.jams,
                             kind.reduce_lanes, kind.vector_bits, kind.accumulators)

    @property
    def jam(self) -> int:
        """How many jammed copies the block computes."""
        n = 1
        for j in self.jams:
            n *= j.factor
        return n

    def jam_values(self, copy: int) -> List[Tuple[Jam, int]]:
        """``[(jam, offset)]``: copy ``copy`` computes ``jam.var = jam.first + offset``."""
        out = []
        for j in reversed(self.jams):
            out.append((j, copy % j.factor))
            copy //= j.factor
        return list(reversed(out))

    def loop(self) -> Loop:
        """The annotated nest (the inverse of :meth:`of`)."""
        body = guarded(self.cond, self.store)
        body = (Loop(self.var, self.lo, self.hi, body),)
        for lp in reversed(self.loops):
            body = (Loop(lp.var, lp.lo, lp.hi, body),)
        for j in reversed(self.jams):
            body = (Loop(j.var, j.first, j.first + j.factor, body),)
        top = body[0]
        kind = RegisterBlocked(self.var, tuple(self.jams), self.reduce_lanes, self.vector_bits, self.accumulators)
        return Loop(top.var, top.lo, top.hi, top.body, kind)

    def plain(self) -> Tuple[Stmt, ...]:
        return plain((self.loop(),))


def register_blocks(stmts: Sequence[Stmt]) -> List[RegisterBlock]:
    """Every register block in ``stmts``, read back from its annotated nest."""
    return [RegisterBlock.of(lp) for lp in loops_of_kind(stmts, RegisterBlocked)]


def register_block(var: Var, lo: Expr, hi: Expr, reduce_loops: Sequence[Loop], cond: Optional[Expr], store: Store,
                   jams: Sequence[Jam] = (), reduce_lanes: bool = False, vector_bits: int = 256,
                   accumulators: int = 12) -> Loop:
    """The annotated nest of a register block (see :class:`RegisterBlock`)."""
    return RegisterBlock(var, lo, hi, tuple(reduce_loops), cond, store, tuple(jams), reduce_lanes, vector_bits,
                         accumulators).loop()


@dataclass(frozen=True, eq=False)
class TransposeBlock:
    """An 8 x 8 transposing nest read back from its annotated loop (:class:`Transposed`)."""
    u: Var
    v: Var
    u0: Expr
    v0: Expr
    store: Store
    read: Read

    @staticmethod
    def of(loop: Loop) -> "TransposeBlock":
        inner = loop.body[0]
        return TransposeBlock(loop.var, inner.var, loop.lo, inner.lo, inner.body[0], loop.kind.read)

    def plain(self) -> Tuple[Stmt, ...]:
        return (Loop(self.u, self.u0, self.u0 + 8, (Loop(self.v, self.v0, self.v0 + 8, (self.store,)),)),)


def transpose_block(u: Var, v: Var, u0: Expr, v0: Expr, store: Store, read: Read) -> Loop:
    """The annotated nest of an 8 x 8 transposing block (see :class:`Transposed`)."""
    return Loop(u, u0, u0 + 8, (Loop(v, v0, v0 + 8, (store,)),), Transposed(read))


@dataclass(frozen=True, eq=False)
class Scan:
    """A running reduction read back from its annotated loop (:class:`Carried`)::

        acc = identity
        for var in range(n):
            for axis in range(lo, hi): [if cond:] acc = combine(acc, store.value)
            store.tensor[store.indices] = acc
    """
    var: Var
    n: int
    axis: Var
    lo: Expr
    hi: Expr
    cond: Optional[Expr]
    store: Store  # its ``combine`` is the running combiner

    @staticmethod
    def of(loop: Loop) -> "Scan":
        acc = loop.body[1]
        inner = acc.body[0]
        cond, store = (inner.cond, inner.body[0]) if isinstance(inner, If) else (None, inner)
        return Scan(loop.var, int(loop.hi.value), acc.var, acc.lo, acc.hi, cond, store)


def carried_scan(var: Var, n: int, axis: Var, lo: Expr, hi: Expr, cond: Optional[Expr], store: Store,
                 carried: Expr) -> Loop:
    """The annotated loop of a scan: ``for var in [0, n): T[at] = carried; for axis in
    [lo, hi): [if cond:] T[at] op= value``, ``carried`` being the identity at the first
    step and the previous element after."""
    copy = Store(store.tensor, store.indices, carried)
    accumulate = Loop(axis, lo, hi, guarded(cond, store))
    return Loop(var, dsl.const(0), dsl.const(n), (copy, accumulate), Carried())


# -- printing ---------------------------------------------------------------------------------
#: the printed operator of an accumulating store, by the reduction's lowering (else ``name=``)
_COMBINE_SYM = {"add": "+=", "mul": "*="}


def stage_text(stage: Stage, tensor_names: Namer) -> str:
    """The stage as C-like text: the plain loops, each annotated loop under a comment."""
    p = ExprPrinter(Namer(), tensor_names)
    out: List[str] = [f"// {tensor_names.name(stage.tensor, stage.tensor.name)}: "
                      f"{stage.tensor.dtype}{list(stage.tensor.shape)}"]
    if stage.balance is not None:
        out.append(f"// threads split the rows by the edges of {tensor_names.name(stage.balance, stage.balance.name)}")

    def note(s: Loop) -> Optional[str]:
        k = s.kind
        if isinstance(k, RegisterBlocked):
            what = "lanes of a vector accumulator" if k.reduce_lanes else "in vector registers across the loops below"
            return f"{p(k.lanes)}: {what}"
        if isinstance(k, Transposed):
            return f"8 x 8: rows of {p(k.read)} transposed in vector registers"
        if isinstance(k, Carried):
            return f"acc: a register carried along {p(s.var)}"
        return None

    def emit(stmts, depth):
        pad = "  " * depth
        for s in stmts:
            if isinstance(s, Loop):
                comment = note(s)
                if comment:
                    out.append(f"{pad}// {comment}")
                v = p(s.var)
                tag = "parallel " if s.parallel else ""
                out.append(f"{pad}{tag}for ({v} = {p(s.lo)}; {v} < {p(s.hi)}; ++{v}) {{")
                emit(s.body, depth + 1)
                out.append(f"{pad}}}")
            elif isinstance(s, If):
                out.append(f"{pad}if ({p(s.cond)}) {{")
                emit(s.body, depth + 1)
                out.append(f"{pad}}}")
            else:
                name = tensor_names.name(s.tensor, s.tensor.name)
                idx = "".join(f"[{p(i)}]" for i in s.indices)
                op = "=" if s.combine is None else \
                    _COMBINE_SYM.get(reduction(s.combine).lowering, f"{s.combine}=")
                value = p(s.value) if s.index is None else f"({p(s.value)}, {p(s.index)})"
                out.append(f"{pad}{name}{idx} {op} {value};")

    emit(stage.body, 0)
    return "\n".join(out)


def program_text(stages: Sequence[Stage]) -> str:
    names = Namer()
    return "\n\n".join(stage_text(s, names) for s in stages)
