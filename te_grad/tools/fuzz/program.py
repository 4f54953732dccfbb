"""Random valid te_grad programs, written as Python source.

:func:`generate` draws every decision from ``draw(n)`` (an integer in ``[0, n)``),
so the same choices give the same program: a seeded generator gives reproducible
programs, and a shrinker (:mod:`.shrink`, or hypothesis) makes a failing program
smaller by making the choices smaller. Small choices mean simple programs: the
first option of every decision is the simplest one, and a draw past the end of
a choice sequence is 0.

A program is 1 to 4 stages (``tg.compute``) over float placeholders of rank 0 to
3, integer id tensors (data-dependent reads) and earlier stages. Bodies use
every intrinsic (each applied where it is smooth, or under a guard that makes
it so: ``if_then_else(x > 0, sqrt(x), ...)``), ``+ - * / **``, ``maximum`` and
``minimum``, ``if_then_else`` on data and on indices, and sum / max / min / prod
reductions, some with an empty domain or a ``where``. Index maps are sums and
constant multiples of variables, transposes and diagonals, clamps (``minimum`` /
``maximum``), ``//`` and ``%`` by small constants, and reads through ids; an
index that could leave its tensor is wrapped (``% n``), clamped or guarded.

Four more constructs are drawn last (so the earlier choices keep their meaning): a
*gather stage*, whose reads mostly go through ids (its gradient is a scatter; products
and maxima through it have second-order terms of their own); ``SECOND = True``, which
asks for the second order as well (the gradient of ``<V, gradient>``, through the
simplified first-order gradient's scatters and folded forms); and an *invalid* last stage
(``INVALID``), a read that leaves its tensor at some point of the domain under a condition
on data, which every stage must refuse where the data take it. A valid program may instead
end in a *sized stage* (``SIZE``, a ``tg.var``, and ``SIZES``, the 2 or 3 values it is
checked at, its smallest allowed one first): a last stage over a shape in the size (``(n,)``,
``(n - 1,)``, ``(n, 3)``) reading a placeholder whose shape is a size expression
(``(n + 2,)``, ``(2 * n + 1,)``) by a shift, a stride, a window or a reduction over
``(0, n)`` (a sum or a product, ``SIZED_PRODUCT``; also as a weight gradient: ``(0, n)`` and
a constant axis, a read independent of an output axis), or under a guard on the size, times
the previous output read at fixed indices;
in a *ragged stage*: a sum, max or min over CSR segments ``range(R0[i0], R0[i0 + 1])`` of a
row pointer ``R0`` (listed in ``ROWPTRS``, fed sorted), with empty segments; or in a *COO
stage*, a reduction whose ``where`` pins the first output variable by data (``I[e] == i0 + c``,
either side), the form simplified into a scatter (:mod:`simplify.solve`); or in a *shift
stage*, a softmax, log-softmax or logsumexp of the previous stage with its max shift written
by hand, without ``stop_gradient`` (the shift's gradient is proven zero and dropped,
:mod:`te_grad.autodiff.shift`); or in a *window stage*, a read at a conditional index
``i0 + if_then_else(c, a, b)`` (a sliding window whose offset depends on a condition on the
loop variables, piecewise affine, or on data), guarded, maybe summed over the window; or in
a *mask stage*, a square matrix masked by a causal or band relation of its two axes (with
``-inf`` before a softmax, or with ``0``), times a matrix summed over the masked axis (the
mask's zeros carried across tensors, :mod:`simplify.zeros`); or in a *shared stage* (a
subexpression shared level after level, a DAG); or in a *blocks stage* (blocks of one axis
read apart, then a concat); or in a *panel stage*, a linear layer over 32 or 48 columns
(``W[k, i1]`` or ``W[i1, k]``: the kernel built with every copy reads it from a copy in
panels, :mod:`codegen.packing`) and a product reading panels written by hand,
``P[i1 // 8, q, i1 % 8]``, over columns that may end inside a panel, through an identity copy
of the layer (read through by its readers, :mod:`simplify.inline`).

Conventions excluded by construction: a ``max`` / ``min`` reduction that may be
empty (its value is -inf / inf) is combined with a finite constant, so no
program differentiates through an infinite value; tied elements of a max, where
te_grad (like JAX) splits the gradient, only arise between reads of the same
element, which every convention agrees on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

from ... import ops

Draw = Callable[[int], int]

#: intrinsics and how an argument is brought into the region where each is smooth
_SAFE_ARG = {
    "log": "{a} * {a} + 0.5", "sqrt": "{a} * {a} + 0.25", "asin": "0.9 * tg.tanh({a})",
    "acos": "0.9 * tg.tanh({a})", "log1p": "{a} * {a}", "exp": "tg.tanh({a})",
    "expm1": "tg.tanh({a})",
}
_PIECEWISE = ("floor", "ceil", "trunc", "round")


@dataclass
class Program:
    """The source of a random program and what its checks need.

    Executing ``source`` (with ``DT`` bound to a float dtype) defines ``OUT`` (the last
    stage), ``INPUTS`` (float placeholders), ``IDS`` (``{id placeholder: high}``: values
    in ``[0, high)``) and ``STAGES``; ``SECOND = True`` where the second order is to be
    checked too, ``INVALID`` (the stage that reads out of bounds) where every stage must
    refuse the program."""
    source: str
    choices: List[int] = field(default_factory=list)

    def build(self, dtype: str = "float64") -> Dict[str, object]:
        import te_grad as tg
        namespace: Dict[str, object] = {"tg": tg, "DT": dtype}
        exec(compile(self.source, "<te_grad fuzz program>", "exec"), namespace)  # noqa: S102
        return namespace


class _Gen:
    def __init__(self, draw: Draw):
        self.draw = draw
        self.lines: List[str] = []
        self.sources: List[Tuple[str, Tuple[int, ...]]] = []  # (name, shape) of float tensors
        self.ids: List[Tuple[str, Tuple[int, ...], int]] = []  # (name, shape, high)
        self.n_axes = 0
        self.in_argmax = False
        self.prefer_ids = False  # the gather stage: most indices read through ids
        self.extra_inputs: List[str] = []
        self.rowptrs: List[str] = []  # id tensors fed sorted: the row pointers of ragged stages
        self.flat = False  # no nested reduction (the body of a ragged loop)

    def pick(self, options):
        return options[self.draw(len(options))]

    def chance(self, k: int) -> bool:
        """True with probability about 1/k (False is the simple choice)."""
        return self.draw(k) == k - 1

    def shape(self, max_rank: int = 3) -> Tuple[int, ...]:
        rank = self.draw(max_rank + 1)
        return tuple(1 + self.draw(5 if rank < 3 else 4) for _ in range(rank))

    # -- index expressions -------------------------------------------------------------
    def index(self, vars_: List[Tuple[str, int, int]], n: int) -> str:
        """An index into a dimension of extent ``n``, in range at every point of ``vars_``
        (``(name, lo, hi)``: the variable takes values in ``[lo, hi)``)."""
        prefer = self.prefer_ids and self.ids and vars_ and self.chance(2)
        if not prefer and (not vars_ or self.chance(8)):
            return str(self.draw(n))
        v, lo, hi = self.pick(vars_)
        kind = 8 if prefer else self.draw(10)
        if kind == 9 and not self.in_argmax and not self.flat:  # the winner of an argmax / argmin over a fresh axis
            name = f"k{self.n_axes}"
            self.n_axes += 1
            m = 1 + self.draw(n)  # the winner lies in [0, m): in range
            self.lines.append(f"{name} = tg.reduce_axis((0, {m}), name={name!r})")
            self.in_argmax = True  # no argmax inside the argmax's own body
            body = self.expr(vars_ + [(name, 0, m)], 1)
            self.in_argmax = False
            return f"tg.{self.pick(['argmax', 'argmin'])}({body}, axis={name})"
        if kind == 0:
            e, elo, ehi = v, lo, hi - 1
        elif kind == 1:
            c = self.draw(5) - 2
            e, elo, ehi = f"({v} + {c})", lo + c, hi - 1 + c
        elif kind == 2:
            c = self.draw(4)
            e, elo, ehi = f"({c} - {v})", c - (hi - 1), c - lo
        elif kind == 3:
            m, c = 2 + self.draw(2), self.draw(3)
            e, elo, ehi = f"({m} * {v} + {c})", m * lo + c, m * (hi - 1) + c
        elif kind == 4:
            d = 2 + self.draw(3)
            e, elo, ehi = f"({v} // {d})", lo // d, (hi - 1) // d
        elif kind == 5:  # a modulus: often the extent itself (a cyclic shift)
            d = self.pick([n, 2, 3, 4, 5]) if n > 1 else 2 + self.draw(4)
            c = self.draw(3)
            e, elo, ehi = (f"({v} % {d})" if not c else f"(({v} + {c}) % {d})"), 0, d - 1
        elif kind == 6 and len(vars_) > 1:
            w, wlo, whi = self.pick(vars_)
            a, b, c = 1 + self.draw(3), 1 + self.draw(2), self.draw(3)
            d = self.pick([n, 2, 3, 4]) if n > 1 else 2 + self.draw(3)
            if self.chance(2):
                e, elo, ehi = f"(({a} * {v} + {b} * {w} + {c}) % {d})", 0, d - 1
            else:
                e = f"(({a} * {v} + {b} * {w} + {c}) // {d})"
                elo, ehi = (a * lo + b * wlo + c) // d, (a * (hi - 1) + b * (whi - 1) + c) // d
        elif kind == 7:  # a clamp
            c = self.draw(5) - 2
            return f"tg.minimum(tg.maximum({v} + {c}, 0), {n - 1})"
        elif kind == 8 and self.ids:  # a data-dependent index: ids hold values in [0, high)
            name, shape, high = self.pick(self.ids)
            e = f"{name}[{self.index([x for x in vars_], shape[0])}]"
            return e if high <= n else f"{e} % {n}"
        else:
            e, elo, ehi = v, lo, hi - 1
        if 0 <= elo and ehi < n:
            return e
        return f"({e}) % {n}"  # wrapped into range (Python's floor modulo)

    def read(self, vars_, guards: List[str]) -> str:
        """A read of a float source (placeholder or earlier stage), maybe padded by a guard."""
        name, shape = self.pick(self.sources)
        if not shape:
            return f"{name}[()]"
        if vars_ and self.chance(5):  # a padded read: the index may leave the tensor, a guard says where
            v, lo, hi = self.pick(vars_)
            d = self.draw(len(shape))
            c = self.draw(3) - 1
            idx = [self.index(vars_, n) for n in shape]
            idx[d] = f"{v} + {c}"
            guard = f"tg.all({v} + {c} >= 0, {v} + {c} < {shape[d]})"
            return f"tg.if_then_else({guard}, {name}[{', '.join(idx)}], {self.const()})"
        return f"{name}[{', '.join(self.index(vars_, n) for n in shape)}]"

    def const(self) -> str:
        """A constant of the program's dtype (a bare Python float would make a float32
        sub-expression of constants in a float64 program)."""
        return f"C({self.pick(['0.5', '1.5', '-0.75', '2.0', '0.25'])})"

    # -- scalar expressions --------------------------------------------------------------
    def expr(self, vars_, depth: int) -> str:
        if depth <= 0 or self.chance(3) and depth < 3:
            return self.read(vars_, []) if not self.chance(6) else self.const()
        kind = self.draw(8)
        if kind == 0:
            return self.read(vars_, [])
        if kind == 1:
            a, b = self.expr(vars_, depth - 1), self.expr(vars_, depth - 1)
            op = self.pick(["+", "-", "*", "/", "**", "max", "min"])
            if op == "/":
                return f"({a} / ({b} * {b} + 0.5))"
            if op == "**":
                return f"tg.pow({a} * {a} + 0.5, {self.pick(['2.0', '0.5', '1.5', b])})"
            if op in ("max", "min"):
                return f"tg.{'maximum' if op == 'max' else 'minimum'}({a}, {b})"
            return f"({a} {op} {b})"
        if kind == 2:
            return self.intrinsic(vars_, depth)
        if kind == 3:
            return self.select(vars_, depth)
        if kind in (4, 5):
            return self.reduction(vars_, depth) if not self.flat else self.read(vars_, [])
        if kind == 6:
            return f"(-{self.expr(vars_, depth - 1)})"
        return f"({self.const()} * {self.expr(vars_, depth - 1)})"

    def intrinsic(self, vars_, depth) -> str:
        name = self.pick(list(ops.INTRINSICS))
        a = self.expr(vars_, depth - 1)
        if name == "atan2":
            b = self.expr(vars_, depth - 1)
            return f"tg.atan2({a}, {b} * {b} + 0.3)"
        if name in _PIECEWISE:  # piecewise constant: applied to a coarse value, away from its jumps
            return f"tg.{name}(tg.tanh({a}) * 0.25 + 0.5)"
        if name == "stop_gradient":  # as softmax uses it: a shift the value does not depend on
            b = f"tg.tanh({self.expr(vars_, depth - 1)})"
            return f"(tg.exp(tg.tanh({a}) - tg.stop_gradient({b})) * tg.exp(tg.stop_gradient({b})))"
        if name in ("sqrt", "log") and self.chance(2):  # guarded: 0 * inf must not appear
            if name == "sqrt":
                return f"tg.if_then_else({a} > 0.0, tg.sqrt({a}), 3.0 * {a})"
            return f"tg.if_then_else({a} > 0.0, {a} * tg.log({a}), 0.0)"
        if name in _SAFE_ARG:
            return f"tg.{name}({_SAFE_ARG[name].format(a=a)})"
        return f"tg.{name}({a})"

    def condition(self, vars_, depth) -> str:
        if vars_ and self.chance(2):
            v, lo, hi = self.pick(vars_)
            form = self.draw(3)
            if form == 0:
                return f"{v} < {lo + self.draw(max(1, hi - lo))}"
            if form == 1:
                return f"({v} % 2) == {self.draw(2)}"
            w, _, _ = self.pick(vars_)
            return f"{v} <= {w}"
        a, b = self.expr(vars_, depth - 1), self.expr(vars_, depth - 1)
        return f"{a} > {b}"

    def select(self, vars_, depth) -> str:
        cond = self.condition(vars_, depth)
        return f"tg.if_then_else({cond}, {self.expr(vars_, depth - 1)}, {self.expr(vars_, depth - 1)})"

    def reduction(self, vars_, depth) -> str:
        combiner = self.pick(["sum", "max", "min", "prod"])
        axes = []
        for _ in range(1 + self.chance(3)):
            name = f"k{self.n_axes}"
            self.n_axes += 1
            lo = self.draw(2)
            extent = self.draw(4)  # 0: an empty domain
            self.lines.append(f"{name} = tg.reduce_axis(({lo}, {lo + extent}), name={name!r})")
            axes.append((name, lo, lo + extent))
        inner = vars_ + [a for a in axes if a[2] > a[1]]
        body = self.expr(inner, depth - 1)
        if combiner == "prod":
            body = f"tg.tanh({body}) * 0.5 + 1.0"  # factors near 1: products stay moderate
        where = ""
        if self.chance(3):
            where = f", where={self.condition(inner, 1) if inner else 'True'}"
        axis_list = ", ".join(a[0] for a in axes)
        red = f"tg.{combiner}({body}, axis=[{axis_list}]{where})"
        may_be_empty = any(a[2] <= a[1] for a in axes) or where
        if combiner in ("max", "min") and may_be_empty:  # -inf / inf over an empty domain
            red = f"tg.{'maximum' if combiner == 'max' else 'minimum'}({red}, {self.const()})"
        return red

    # -- the program ---------------------------------------------------------------------------
    def program(self) -> str:
        self.lines.append("# a random te_grad program (te_grad.tools.fuzz); DT is the float dtype")
        self.lines.append("C = lambda value: tg.const(value, DT)")
        n_inputs = 1 + self.draw(3)
        for k in range(n_inputs):
            shape = self.shape()
            self.lines.append(f"X{k} = tg.placeholder({shape!r}, dtype=DT, name='X{k}')")
            self.sources.append((f"X{k}", shape))
        if self.chance(3):
            n = 1 + self.draw(4)
            high = 1 + self.draw(4)
            self.lines.append(f"I0 = tg.placeholder(({n},), dtype='int64', name='I0')")
            self.ids.append(("I0", (n,), high))
        stages = []
        for s in range(1 + self.draw(4)):
            shape = self.shape()
            names = [f"i{d}" for d in range(len(shape))]
            vars_ = [(v, 0, n) for v, n in zip(names, shape)]
            body = self.expr(vars_, 1 + self.draw(4))
            params = ", ".join(names)
            self.lines.append(f"S{s} = tg.compute({shape!r}, lambda {params}: tg.cast(DT, {body}), name='S{s}')")
            self.sources.append((f"S{s}", shape))
            stages.append(f"S{s}")
        if self.chance(3):  # a gather stage: products, maxima and chains through data-dependent reads
            stages.append(self.gather_stage(len(stages)))
        second = self.chance(2)
        invalid = self.chance(8)
        if invalid:  # the last stage reads out of bounds, under a condition on data
            stages.append(self.out_of_bounds_stage(len(stages)))
        elif self.chance(4):  # a last stage whose shape is a size known only at run time
            stages.append(self.sized_stage(len(stages), stages[-1]))
            second = False
        elif self.chance(4):  # a ragged last stage: a reduction over CSR segments
            stages.append(self.ragged_stage(len(stages)))
        elif self.chance(3):  # a COO aggregation: where=ids[e] == i0 (a scatter, solved reduce axes)
            stages.append(self.coo_stage(len(stages)))
        elif self.chance(3):  # a softmax / log-softmax / logsumexp with its max shift written by hand
            stages.append(self.shift_stage(len(stages), stages[-1]))
        elif self.chance(3):  # a read at a conditional index: if_then_else(c, a, b) of affine offsets
            stages.append(self.window_stage(len(stages)))
        elif self.chance(3):  # a causal or band mask on a square matrix: zeros carried across tensors
            stages.append(self.mask_stage(len(stages), stages[-1]))
        elif self.chance(3):  # a subexpression shared by several parents, level after level (a DAG)
            stages.append(self.shared_stage(len(stages), stages[-1]))
        elif self.chance(3):  # blocks of one axis read apart, and a concat: selects on ranges of an axis
            stages.append(self.blocks_stage(len(stages), stages[-1]))
        elif self.chance(3):  # products over long weight rows: operands copied in panels, panels read by hand
            stages.append(self.panel_stage(len(stages), stages[-1]))
        self.lines.append(f"OUT = {stages[-1]}")
        self.lines.append(f"STAGES = [{', '.join(stages)}]")
        self.lines.append(f"INPUTS = [{', '.join([f'X{k}' for k in range(n_inputs)] + self.extra_inputs)}]")
        self.lines.append("IDS = {" + ", ".join(f"{n}: {h}" for n, _, h in self.ids) + "}")
        if second and not invalid:
            self.lines.append("SECOND = True  # check second order too: the gradient of <V, gradient>")
        if invalid:
            self.lines.append(f"INVALID = {stages[-1]}  # reads out of bounds: every stage must refuse it")
        if self.rowptrs:
            self.lines.append("ROWPTRS = [" + ", ".join(self.rowptrs) + "]  # fed sorted: CSR row pointers")
        return "\n".join(self.lines) + "\n"

    def ragged_stage(self, s: int) -> str:
        """A last stage reducing the rows of a source over CSR segments: ``out[i0, ...] =
        R(f(k) for k in range(R0[i0], R0[i0 + 1]))`` with a row pointer ``R0`` (an id tensor
        listed in ``ROWPTRS``, fed sorted in ``[0, E]``), the body reading the source at row
        ``k`` and maybe more (a ragged loop: its gradient is a scatter over the edges)."""
        name, shape = self.pick([src for src in self.sources if src[1]] or [("X0", ())])
        if not shape:
            self.lines.append("XR = tg.placeholder((5,), dtype=DT, name='XR')")
            self.extra_inputs.append("XR")
            name, shape = "XR", (5,)
        E, n_seg = shape[0], 1 + self.draw(4)
        rp = f"R{len(self.rowptrs)}"
        self.lines.append(f"{rp} = tg.placeholder(({n_seg + 1},), dtype='int64', name={rp!r})")
        self.ids.append((rp, (n_seg + 1,), E + 1))
        self.rowptrs.append(rp)
        out_shape = (n_seg,) + tuple(shape[1:])
        names = [f"i{d}" for d in range(len(out_shape))]
        k = f"k{self.n_axes}"
        self.n_axes += 1
        vars_ = [(v, 0, n) for v, n in zip(names, out_shape)]
        row = f"{name}[{', '.join([k] + names[1:])}]"
        self.flat = True  # a reduction nested in a ragged loop is not differentiated (lift)
        other = self.expr(vars_ + [(k, 0, E)], 1 + self.draw(2))
        self.flat = False
        body = self.pick([row, f"{row} * {other}", f"tg.tanh({other}) + {row}"])
        combiner = self.pick(["sum", "max", "min"])
        red = f"tg.{combiner}({body}, axis={k})"
        if combiner != "sum":  # an empty segment's -inf / inf combined with a finite constant
            red = f"tg.{'maximum' if combiner == 'max' else 'minimum'}({red}, {self.const()})"
        self.lines.append(f"def _S{s}({', '.join(names)}):")
        self.lines.append(f"    {k} = tg.reduce_axis(({rp}[i0], {rp}[i0 + 1]), name={k!r})")
        self.lines.append(f"    return tg.cast(DT, {red})")
        self.lines.append(f"S{s} = tg.compute({out_shape!r}, _S{s}, name='S{s}')")
        return f"S{s}"

    def out_of_bounds_stage(self, s: int) -> str:
        """An invalid last stage: a read whose index leaves its tensor at some point of the
        domain, under a condition on data (``if_then_else(X[..] > c, .., X[i + n])``), so no
        analysis of the indices alone can show that the read is never taken."""
        name, shape = self.pick([src for src in self.sources if src[1]] or [("X0", ())])
        if not shape:
            self.lines.append("XB = tg.placeholder((3,), dtype=DT, name='XB')")
            self.extra_inputs.append("XB")
            name, shape = "XB", (3,)
        out_shape = tuple(shape[:1]) + self.shape(1)
        names = [f"i{d}" for d in range(len(out_shape))]
        vars_ = [(v, 0, n) for v, n in zip(names, out_shape)]
        d = self.draw(len(shape))
        idx = [self.index(vars_[:1], n) for n in shape]
        over = self.draw(3)  # how far past the end (or before the start) the index goes
        idx[d] = self.pick([f"i0 + {shape[d] - out_shape[0] + 1 + over}", f"i0 - {1 + over}"])
        bad = f"{name}[{', '.join(idx)}]"
        cond = f"{self.expr(vars_, 1)} > {self.const()}"
        other = self.expr(vars_, 1)
        body = f"tg.if_then_else({cond}, {other}, {bad})" if self.chance(2) else \
            f"tg.if_then_else({cond}, {bad}, {other})"
        params = ", ".join(names)
        self.lines.append(f"S{s} = tg.compute({out_shape!r}, lambda {params}: tg.cast(DT, {body}), name='S{s}')")
        return f"S{s}"

    def sized_stage(self, s: int, prev: str) -> str:
        """A last stage over a shape in the size variable ``n`` (see the module docstring)."""
        name, pshape = prev, dict(self.sources)[prev]
        lo = 1 + self.draw(2)
        kind = self.draw(5)
        c = self.draw(3)
        w = 1 + self.draw(3)
        self.lines.append(f"SIZE = n = tg.var('n', min={lo})")
        self.lines.append(f"kN = tg.reduce_axis((0, {w}), name='kN')")
        if kind == 0:  # a window: XN[i + k], k < c + 1
            xshape, oshape, read = f"(n + {c},)", "(n,)", "XN[i0 + kN]"
            self.lines[-1] = f"kN = tg.reduce_axis((0, {c + 1}), name='kN')"
        elif kind == 1:  # a stride: XN[2 i + k]
            xshape, oshape, read = f"(2 * n + {c},)", "(n,)", "XN[2 * i0 + kN]"
            self.lines[-1] = f"kN = tg.reduce_axis((0, {c + 1}), name='kN')"
        elif kind == 2:  # a shift: out has one element less
            xshape, oshape, read = "(n, 3)", "(n - 1, 3)", f"XN[i0 + 1, i1] * XN[i0, (i1 + {c}) % 3]"
            self.lines[-1] = "kN = tg.reduce_axis((0, 1), name='kN')"
        elif kind == 3:  # a reduction over (0, n)
            xshape, oshape, read = f"(n + {c}, 2)", "(2,)", f"XN[kN + {c}, i0]"
            self.lines[-1] = "kN = tg.reduce_axis((0, n), name='kN')"
        else:  # a guard on the size: a padded read
            xshape, oshape = "(n,)", "(n,)"
            read = "tg.if_then_else(i0 + kN < n, XN[i0 + kN], C(0.5))"
        scale = f"tg.tanh({name}[{', '.join(str(self.draw(e)) for e in pshape)}])" if pshape else f"tg.tanh({name}[()])"
        params = "i0, i1" if kind == 2 else "i0"
        body = f"tg.sum(tg.sin({read}) * {scale}, axis=kN)"
        product = kind == 3 and c < 2  # a product over (0, n) (no draw of its own: later choices keep their meaning)
        if product:
            body = f"tg.prod(tg.tanh(tg.sin({read}) * {scale}) * 0.5 + 1.0, axis=kN)"
        if kind == 3 and self.chance(2):  # a weight gradient: rows of run-time number, w steps each
            xshape, oshape, params = f"(n + {c}, {w}, 8)", "(8, 8)", "i0, i1"
            self.lines.append(f"kM = tg.reduce_axis((0, {w}), name='kM')")
            body = f"tg.sum(tg.sin(XN[kN + {c}, kM, i1]) * XN[kN, kM, i0] * {scale}, axis=[kN, kM])"
            product = False
        self.lines.append(f"XN = tg.placeholder({xshape}, dtype=DT, name='XN')")
        self.extra_inputs.append("XN")
        self.lines.append(f"S{s} = tg.compute({oshape}, lambda {params}: tg.cast(DT, {body}), name='S{s}')")
        sizes = [lo] + sorted({lo + 1 + self.draw(3), lo + 4 + self.draw(3)})
        self.lines.append(f"SIZES = {sizes!r}  # the sizes it is checked at, the smallest allowed first")
        self.lines.append(f"SIZED_PRODUCT = {product}  # the stage multiplies over (0, n)")
        return f"S{s}"

    def gather_stage(self, s: int) -> str:
        """A last stage whose reads mostly go through ids (declared here if the program has
        none): its gradient is a scatter, its second order the gradient of a scatter."""
        if not self.ids:
            n, high = 1 + self.draw(4), 1 + self.draw(4)
            self.lines.append(f"I1 = tg.placeholder(({n},), dtype='int64', name='I1')")
            self.ids.append(("I1", (n,), high))
        shape = self.shape(2)
        names = [f"i{d}" for d in range(len(shape))]
        vars_ = [(v, 0, n) for v, n in zip(names, shape)]
        self.prefer_ids = True
        a = self.expr(vars_, 1 + self.draw(2))
        b = self.expr(vars_, 1 + self.draw(2))
        self.prefer_ids = False
        body = self.pick([f"({a} * {b})", f"tg.maximum({a}, {b})", f"tg.tanh({a}) * {b}", a])
        params = ", ".join(names)
        self.lines.append(f"S{s} = tg.compute({shape!r}, lambda {params}: tg.cast(DT, {body}), name='S{s}')")
        self.sources.append((f"S{s}", shape))
        return f"S{s}"


    def coo_stage(self, s: int) -> str:
        """A last stage ``S[i0, ...] = R_e(body where I[e] == i0 + c)`` (either side): the output
        variable pinned by data, as a COO aggregation writes it; ids may leave the output
        (their values reach ``high``, the offset shifts them), where they select nothing."""
        if not self.ids:
            n, high = 1 + self.draw(4), 1 + self.draw(4)
            self.lines.append(f"I2 = tg.placeholder(({n},), dtype='int64', name='I2')")
            self.ids.append(("I2", (n,), high))
        ids, ids_shape, _ = self.pick(self.ids)
        shape = (1 + self.draw(4),) + self.shape(1)
        names = [f"i{d}" for d in range(len(shape))]
        vars_ = [(v, 0, n) for v, n in zip(names, shape)]
        e = f"k{self.n_axes}"
        self.n_axes += 1
        self.lines.append(f"{e} = tg.reduce_axis((0, {ids_shape[0]}), name={e!r})")
        body = self.expr(vars_ + [(e, 0, ids_shape[0])], 1 + self.draw(2))
        c = self.draw(3) - 1
        target = "i0" if c == 0 else f"i0 {'+' if c > 0 else '-'} {abs(c)}"
        where = self.pick([f"{ids}[{e}] == {target}", f"{target} == {ids}[{e}]"])
        if self.chance(3):
            where = f"({where}) & ({self.condition(vars_ + [(e, 0, ids_shape[0])], 1)})"
        combiner = self.pick(["sum", "sum", "max", "min", "prod"])
        if combiner == "prod":
            body = f"tg.tanh({body}) * 0.5 + 1.0"
        red = f"tg.{combiner}({body}, axis={e}, where={where})"
        if combiner in ("max", "min"):  # empty for rows no id reaches: -inf / inf
            red = f"tg.{'maximum' if combiner == 'max' else 'minimum'}({red}, {self.const()})"
        params = ", ".join(names)
        self.lines.append(f"S{s} = tg.compute({shape!r}, lambda {params}: tg.cast(DT, {red}), name='S{s}')")
        self.sources.append((f"S{s}", shape))
        return f"S{s}"

    def shift_stage(self, s: int, prev: str) -> str:
        """A last stage normalizing ``prev`` along its last axis with the max shift written by
        hand, no ``stop_gradient`` (:mod:`te_grad.autodiff.shift` proves the shift's gradient
        zero): ``M = max_k P[.., k]``, ``E = exp(P - M)``, ``Z = sum_k E`` and the softmax
        ``E / Z``, the log-softmax ``P - M - log(Z)`` or the logsumexp ``M + log(Z)``; ties in
        the max are frequent (the previous stage often repeats values)."""
        shape = next(sh for name, sh in reversed(self.sources) if name == prev)
        if not shape:  # a scalar: normalize a one-element row of it
            self.lines.append(f"P{s} = tg.compute((1,), lambda i0: {prev}[()], name='P{s}')")
            prev, shape = f"P{s}", (1,)
        lead = [f"i{d}" for d in range(len(shape) - 1)]
        names = lead + [f"i{len(shape) - 1}"]
        k = f"k{self.n_axes}"
        self.n_axes += 1
        at = ", ".join(lead + [k])
        row = f"[{', '.join(lead)}]" if lead else "[()]"
        self.lines.append(f"{k} = tg.reduce_axis((0, {shape[-1]}), name={k!r})")
        lp, ap = ", ".join(lead), ", ".join(names)
        self.lines.append(f"M{s} = tg.compute({tuple(shape[:-1])!r}, lambda {lp}: tg.max({prev}[{at}], axis={k}), "
                          f"name='M{s}')")
        self.lines.append(f"E{s} = tg.compute({tuple(shape)!r}, lambda {ap}: tg.exp({prev}[{ap}] - M{s}{row}), "
                          f"name='E{s}')")
        self.lines.append(f"Z{s} = tg.compute({tuple(shape[:-1])!r}, lambda {lp}: tg.sum(E{s}[{at}], axis={k}), "
                          f"name='Z{s}')")
        form = self.draw(3)
        if form == 0:
            out_shape, body = tuple(shape), f"E{s}[{ap}] / Z{s}{row}"
        elif form == 1:
            out_shape, body = tuple(shape), f"{prev}[{ap}] - M{s}{row} - tg.log(Z{s}{row})"
        else:
            out_shape, body = tuple(shape[:-1]), f"M{s}{row} + tg.log(Z{s}{row})"
        params = ap if form < 2 else lp
        self.lines.append(f"S{s} = tg.compute({out_shape!r}, lambda {params}: {body}, name='S{s}')")
        self.sources.append((f"S{s}", out_shape))
        return f"S{s}"

    def mask_stage(self, s: int, prev: str) -> str:
        """Last stages masking a square matrix ``A[i0, i1] = XM[i0, i1] * <prev>`` by a relation
        between its two axes (causal ``i1 <= i0``, its transpose, or a band of width ``w``; the
        diagonal always kept, so no row is all masked), then: a softmax of
        ``if_then_else(mask, A, -inf)`` (``tg.nn.softmax``, or with the max shift written by
        hand) or ``if_then_else(mask, A, 0)`` maybe through ``exp`` (which is not zero where the
        mask is, so nothing may be carried), and a product with ``VM`` summed over the masked
        axis. The structural zeros are carried across the tensors (:mod:`simplify.zeros`) and,
        with 33 rows or more, the triangle or band cut into blocks (:mod:`codegen.triangles`)."""
        n, w = 3 + self.draw(4), 1 + self.draw(2)
        if self.chance(3):  # rows enough for codegen.triangles to cut blocks
            n += 30
        mask = self.pick(["i1 <= i0", "i1 >= i0", f"tg.all(i1 <= i0, i0 - i1 <= {w})",
                          f"tg.all(i1 >= i0, i1 - i0 < {w} + 1)"])
        self.lines.append(f"XM = tg.placeholder(({n}, {n}), dtype=DT, name='XM')")
        self.lines.append(f"VM = tg.placeholder(({n}, 2), dtype=DT, name='VM')")
        self.extra_inputs += ["XM", "VM"]
        shape = next(sh for name, sh in reversed(self.sources) if name == prev)
        scale = f"{prev}[{', '.join('0' for _ in shape)}]" if shape else f"{prev}[()]"
        self.lines.append(f"A{s} = tg.compute(({n}, {n}), lambda i0, i1: XM[i0, i1] * (C(0.5) + tg.tanh({scale})), "
                          f"name='A{s}')")
        form = self.draw(4)
        if form == 0:
            self.lines.append(f"B{s} = tg.compute(({n}, {n}), lambda i0, i1: tg.if_then_else({mask}, A{s}[i0, i1], "
                              f"C(-float('inf'))), name='B{s}')")
            self.lines.append(f"P{s} = tg.nn.softmax(B{s}, axis=1)")
        elif form == 1:  # the shift by hand
            self.lines.append(f"B{s} = tg.compute(({n}, {n}), lambda i0, i1: tg.if_then_else({mask}, A{s}[i0, i1], "
                              f"C(-float('inf'))), name='B{s}')")
            self.lines.append(f"km{s} = tg.reduce_axis((0, {n}), name='km{s}')")
            self.lines.append(f"M{s} = tg.compute(({n},), lambda i0: tg.max(B{s}[i0, km{s}], axis=km{s}), name='M{s}')")
            self.lines.append(f"E{s} = tg.compute(({n}, {n}), lambda i0, i1: tg.exp(B{s}[i0, i1] - M{s}[i0]), "
                              f"name='E{s}')")
            self.lines.append(f"Z{s} = tg.compute(({n},), lambda i0: tg.sum(E{s}[i0, km{s}], axis=km{s}), "
                              f"name='Z{s}')")
            self.lines.append(f"P{s} = tg.compute(({n}, {n}), lambda i0, i1: E{s}[i0, i1] / Z{s}[i0], name='P{s}')")
        else:
            through = "tg.exp({})" if form == 3 else "{}"
            self.lines.append(f"P{s} = tg.compute(({n}, {n}), lambda i0, i1: "
                              + through.format(f"tg.if_then_else({mask}, A{s}[i0, i1], C(0.0))") + f", name='P{s}')")
        self.lines.append(f"ke{s} = tg.reduce_axis((0, {n}), name='ke{s}')")
        self.lines.append(f"S{s} = tg.compute(({n}, 2), lambda i0, i1: tg.sum(P{s}[i0, ke{s}] * VM[ke{s}, i1], "
                          f"axis=ke{s}), name='S{s}')")
        self.sources.append((f"S{s}", (n, 2)))
        return f"S{s}"

    def shared_stage(self, s: int, prev: str) -> str:
        """A last stage whose body reuses one Python value several times, level after level
        (``e = f(e, e, e)``, 2 to 8 levels): a DAG whose tree grows as ``3 ** levels``, as
        second-order gradients are. Every stage must walk it as a DAG, and the LLVM emitter's
        shared values (one per block and per binding of their variables) must stay right in
        vector loops and register blocks: with 16 columns or more the stage is vectorized. Some
        levels use ``e`` inside and outside the branches of a data-dependent ``if_then_else``, so
        that reverse mode reaches it in several guard contexts (which it merges), one nests two
        guards in both orders, one of them dividing by zero off its paths (contexts that merge
        only when their guards come in the same order), and one may sum a row under a guard it
        needs, testing the sum against ``e`` under that guard."""
        n, m = 2 + self.draw(3), (3 + self.draw(4)) if not self.chance(2) else 16 + self.draw(20)
        self.lines.append(f"XS = tg.placeholder(({n}, {m}), dtype=DT, name='XS')")
        self.extra_inputs.append("XS")
        shape = next(sh for name, sh in reversed(self.sources) if name == prev)
        scale = f"{prev}[{', '.join('0' for _ in shape)}]" if shape else f"{prev}[()]"
        self.lines.append(f"def _S{s}(i0, i1):")
        self.lines.append(f"    e = XS[i0, i1] * (C(0.5) + tg.tanh({scale}))")
        c, q = "(e > C(0.0))", "(e > C(1.0))"
        p = f"(7 // tg.if_then_else({c} | {q}, 1, 0) > 0)"
        nested = 0
        for _ in range(2 + self.draw(7)):
            step = self.pick(["tg.tanh(e) * e + e * C(0.5)", "tg.maximum(e, C(0.0)) * e - e * C(0.25)",
                              "tg.if_then_else(e > C(0.0), e * C(0.5), -e) + tg.sigmoid(e)",
                              "e * tg.exp(-(e * e)) + e", "tg.log(e * e + C(1.0)) - e * C(0.5)",
                              "tg.tanh(e) * e + tg.if_then_else(e > C(0.0), e * C(0.5), -e * C(0.25))",
                              "tg.if_then_else(tg.sin(e) > C(0.0), tg.tanh(e), e * C(0.5))",
                              # the same two guards nested in both orders, one (p) dividing by 0
                              # where neither c nor q holds: the branches of c must not merge
                              f"tg.if_then_else({c}, tg.if_then_else({p}, tg.if_then_else({q}, tg.tanh(e), "
                              f"e * C(0.5)), e), tg.if_then_else({q}, tg.if_then_else({p}, e * e, C(0.0)), "
                              f"e * C(0.5) + C(0.1)))",
                              "REDUCTION"])
            if step == "REDUCTION":
                # a row sum that divides by zero off its guard, tested against itself under that
                # guard: lifted to a tensor filtered by the guard (not by the test of itself)
                guard = "(XS[i0, i1] > C(0.0))"
                k = f"k{self.n_axes}"
                self.n_axes += 1
                self.lines.append(f"    {k} = tg.reduce_axis((0, {m}), name={k!r})")
                self.lines.append(f"    r = tg.sum(XS[i0, {k}] * tg.cast(DT, 7 // tg.if_then_else({guard}, 1, 0)) "
                                  f"* C(0.1), axis={k})")
                step = f"tg.if_then_else({guard}, tg.if_then_else(r > e, r * e, e), e * C(0.5))"
            if "//" in step:
                # one such level per program: the branches of a second-order gradient through
                # several repeat values that may divide by zero, which the emitter cannot
                # compute ahead of the branches (see codegen/llvm_emit.hoist_safe_parts)
                nested += 1
                if nested > 1:
                    step = "tg.if_then_else(tg.sin(e) > C(0.0), tg.tanh(e), e * C(0.5))"
            self.lines.append(f"    e = {step}")
        self.lines.append("    return tg.cast(DT, e)")
        self.lines.append(f"S{s} = tg.compute(({n}, {m}), _S{s}, name='S{s}')")
        self.sources.append((f"S{s}", (n, m)))
        return f"S{s}"

    def window_stage(self, s: int) -> str:
        """A last stage reading a source at a *conditional* index: row ``i0 + if_then_else(c,
        a, b)`` (a sliding window whose offset depends on a condition), guarded where it leaves
        the rows, summed over a window axis ``w`` or not. ``c`` is quasi-affine in the loop
        variables (``i1 < 1``, ``w % 2 == 0``, ``i1 <= w``), or reads data (then the index is
        not piecewise affine), and ``a`` may itself be conditional (nested): the gradient of a
        piecewise-affine index is split into one gather per piece (:mod:`simplify.piecewise`),
        that of a data condition stays a scatter."""
        name, shape = self.pick([src for src in self.sources if src[1]] or [("X0", ())])
        if not shape:
            self.lines.append("XW = tg.placeholder((6, 2), dtype=DT, name='XW')")
            self.extra_inputs.append("XW")
            name, shape = "XW", (6, 2)
        n, heads, width = shape[0], 1 + self.draw(3), 1 + self.draw(4)
        out_shape = (n, heads) + tuple(shape[1:])
        names = [f"i{d}" for d in range(len(out_shape))]
        summed = not self.chance(2)  # the simple choice: summed over the window
        w = f"w{self.n_axes}" if summed else "i1"
        vars_ = [(v, 0, m) for v, m in zip(names, out_shape)]
        if summed:
            self.n_axes += 1
            vars_ = vars_ + [(w, 0, width)]

        def offset():
            return self.pick([f"{w} - {self.draw(3)}", f"{self.draw(3)} - {w}", f"2 * {w} - {self.draw(3)}",
                              f"{w} // 2", f"{self.draw(3) - 1}"])
        cond = self.pick([f"i1 < {1 + self.draw(2)}", f"{w} % 2 == {self.draw(2)}", f"i1 <= {w}",
                          f"{self.read(vars_, [])} > 0.0"])
        a = offset() if not self.chance(4) else f"tg.if_then_else({w} < 1, {offset()}, {offset()})"
        j = f"i0 + tg.if_then_else({cond}, {a}, {offset()})"
        row = f"{name}[{', '.join([j] + names[2:])}]"
        read = f"tg.if_then_else(tg.all({j} >= 0, {j} < {n}), {row}, {self.const()})"
        body = self.pick([read, f"{read} * {self.expr(vars_, 1)}"])
        self.lines.append(f"def _S{s}({', '.join(names)}):")
        if summed:
            self.lines.append(f"    {w} = tg.reduce_axis((0, {width}), name={w!r})")
            body = f"tg.sum({body}, axis={w})"
        self.lines.append(f"    return tg.cast(DT, {body})")
        self.lines.append(f"S{s} = tg.compute({out_shape!r}, _S{s}, name='S{s}')")
        self.sources.append((f"S{s}", out_shape))
        return f"S{s}"

    def blocks_stage(self, s: int, prev: str) -> str:
        """Last stages reading an input ``XK`` (rows, ``parts * heads * 8``) in ``parts`` blocks
        of its last axis, each split into heads of 8 (attention's q, k and v from one
        projection), combined with ``prev``, then a concat along that axis of the blocks' product
        and ``XK`` (one of its first columns doubled, an equality on the axis): the gradient of
        ``XK`` is a sum of selects on ranges of its last axis whose indices divide it by 8
        (:mod:`codegen.select_ranges`)."""
        rows, parts, heads = 2 + self.draw(3), 2 + self.draw(2), 1 + self.draw(2)
        width = parts * heads * 8
        self.lines.append(f"XK = tg.placeholder(({rows}, {width}), dtype=DT, name='XK')")
        self.extra_inputs.append("XK")
        scale = self.first_element(prev)
        blocks = [f"XK[i0, {o * heads * 8} + i1 * 8 + i2]" for o in range(parts)]
        body = f"{blocks[0]} * {blocks[1]}" + (f" + tg.tanh({blocks[2]}) * {scale}" if parts > 2 else f" * {scale}")
        self.lines.append(f"B{s} = tg.compute(({rows}, {heads}, 8), lambda i0, i1, i2: tg.cast(DT, {body}), "
                          f"name='B{s}')")
        cat = (f"tg.if_then_else(i1 < {heads * 8}, B{s}[i0, i1 // 8, i1 % 8], "
               f"tg.if_then_else(i1 == {heads * 8 + self.draw(3)}, C(2.0), C(1.0)) * XK[i0, i1 - {heads * 8}])")
        self.lines.append(f"S{s} = tg.compute(({rows}, {heads * 8 + width}), lambda i0, i1: {cat}, name='S{s}')")
        self.sources.append((f"S{s}", (rows, heads * 8 + width)))
        return f"S{s}"

    def first_element(self, name: str) -> str:
        """The read of source ``name`` at its first element (``name[0, ..]``, or ``name[()]``)."""
        shape = next(sh for n, sh in reversed(self.sources) if n == name)
        return f"{name}[{', '.join(['0'] * len(shape))}]" if shape else f"{name}[()]"

    def panel_stage(self, s: int, prev: str) -> str:
        """A linear layer ``L[i0, i1] = sum_k A[i0, k] * W[k, i1]`` (or ``W[i1, k]``) whose
        ``16 * m`` output columns let the packing read ``W`` from a copy in panels of a cache line
        (:mod:`codegen.packing`; the fuzzer builds with every copy), then a product reading a
        layout in panels of 8 written by hand, ``P[i1 // 8, q, i1 % 8]``, over ``8 * m + r``
        columns (in the default build, register blocks whose last block may start inside a panel
        and gather) through an identity copy of the layer (read through, :mod:`simplify.inline`),
        scaled by ``prev``."""
        rows, red, cols = 2 + self.draw(4), 2 + self.draw(4), 16 * (2 + self.draw(2))
        transposed = self.chance(2)
        self.lines.append(f"A{s} = tg.placeholder(({rows}, {red}), dtype=DT, name='A{s}')")
        shape = (cols, red) if transposed else (red, cols)
        self.lines.append(f"W{s} = tg.placeholder({shape!r}, dtype=DT, name='W{s}')")
        hand = 8 * (2 + self.draw(3)) + self.draw(8)
        panels = (hand + 7) // 8
        self.lines.append(f"P{s} = tg.placeholder(({panels}, {cols}, 8), dtype=DT, name='P{s}')")
        self.extra_inputs.extend([f"A{s}", f"W{s}", f"P{s}"])
        w = f"W{s}[i1, k]" if transposed else f"W{s}[k, i1]"
        self.lines.append(f"K{s} = tg.reduce_axis({red}, 'k')")
        self.lines.append(f"L{s} = tg.compute(({rows}, {cols}), lambda i0, i1: tg.sum(A{s}[i0, K{s}] * "
                          f"{w.replace('k', f'K{s}')}, axis=K{s}), name='L{s}')")
        scale = self.first_element(prev)
        # an identity copy of the layer, read by the product (the layer read directly as well,
        # so that it is not fused into the copy): read through (simplify.inline)
        self.lines.append(f"LC{s} = tg.compute(({rows}, {cols}), lambda i0, i1: L{s}[i0, i1], name='LC{s}')")
        self.lines.append(f"Q{s} = tg.reduce_axis({cols}, 'q')")
        self.lines.append(f"S{s} = tg.compute(({rows}, {hand}), lambda i0, i1: tg.sum(LC{s}[i0, Q{s}] * "
                          f"P{s}[i1 // 8, Q{s}, i1 % 8], axis=Q{s}) * tg.cast(DT, {scale}) + L{s}[i0, 0], "
                          f"name='S{s}')")
        self.sources.append((f"S{s}", (rows, hand)))
        return f"S{s}"


def generate(draw: Draw) -> Program:
    """A random valid program from the choices ``draw`` makes (see the module docstring)."""
    record: List[int] = []

    def recording(n: int) -> int:
        if n <= 1:  # no decision: nothing drawn, nothing recorded
            return 0
        v = draw(n)
        record.append(v)
        return v

    return Program(_Gen(recording).program(), record)


def from_choices(choices: List[int]) -> Program:
    """The program a choice sequence describes (each entry taken modulo its range; 0 past the end)."""
    pos = [0]

    def draw(n: int) -> int:
        k = pos[0]
        pos[0] += 1
        return choices[k] % n if k < len(choices) else 0

    return generate(draw)


def from_seed(seed: int) -> Program:
    """The program of uniformly random choices seeded by ``seed`` (what ``python -m te_grad
    fuzz`` runs)."""
    import random
    rng = random.Random(seed)
    return generate(lambda n: rng.randrange(n))
