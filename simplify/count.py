"""Exact innermost-iteration counts of tensor graphs.

The count of a tensor is the number of points of the iteration domains of its
reductions: for each reduction, the output elements (restricted by quasi-affine
guards around the reduction) times the points of its loops, with loop bounds as
written (a ``where`` filter is evaluated at every point, so it restricts
nothing). A tensor without reductions counts one per element (one per point of its
region when its readers use it only there, :mod:`.unread`: the kernel writes no
more; nothing when it only copies another tensor there); a scatter counts
the points of its domain; a placeholder counts nothing. So a raw VJP, whose
index equality is a filter, shows its full |dX| x |domain| cost.

Counting is exact and symbolic where it can be: every variable with constant
bounds that no other bound or guard mentions contributes a factor; the rest is
enumerated, vectorized, in integer arithmetic on the index expressions
(:func:`te_grad.intervals.index_values`), with the innermost loop's trip count in
closed form. Points are enumerated in blocks of at most :data:`BLOCK` at a time, so
memory stays bounded. (isl's ``count_val`` enumerates points one by one, which is too
slow for the 10^12-point raw domains; the tests check both agree on small domains.)
A guard that reads data or computes in floats restricts nothing here.

A *ragged* loop, whose bounds read data (``range(rowptr[v], rowptr[v + 1])``), has no
count before the data is known: counting it is a :class:`~te_grad.errors.UserError`
naming the loop, unless ``ragged=N`` is given, which counts each ragged loop as ``N``
trips at every point of the loops around it: an estimate, not a bound (``tg.build``
sizes its threading with :data:`RAGGED_TRIPS`). For the exact count of given data,
count it there (for a CSR segment loop over every row: ``rowptr[-1] - rowptr[0]``).

A graph with size variables (``tg.var``) has a count that depends on the sizes:
:func:`iterations` returns a :class:`SizeCount`. Its value at given sizes
(``count.at(n=5)``, ``count({"n": 5})``) is exact: the graph specialized at those sizes,
counted as above. Its closed form (``str(count)``, :meth:`SizeCount.pieces`,
:meth:`SizeCount.leading`), for one size variable, is a piecewise quasi-polynomial in it:
counts of polyhedral domains are polynomials of degree at most the number of loops on
each residue class of the size modulo some period, from some size on. It is *interpolated*
from exact counts (the smallest start, period and degree that reproduce every count on a
window of sizes) and then checked at further sizes, far past the window; the installed isl
has no ``card`` (barvinok), so the closed form is found and checked, not derived.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from te_grad.errors import InternalError, UserError
from te_grad.sizes import graph_size_vars, named_sizes, specialize
from te_grad.graph import free_vars, reads_in, reductions_in, topo_order
from te_grad.intervals import NotAnIndex, index_values, is_index_expr
from te_grad.ir import Expr, PlaceholderOp, ReduceAxis, ScatterOp, Tensor, Var, const
from te_grad.printer import expr_to_str
from te_grad.transform import substitute
from .unread import read_through, written_regions

#: most points enumerated at once
BLOCK = 1 << 22

#: trips a ragged loop is assumed to make per point where an estimate will do (kernels' threading)
RAGGED_TRIPS = 16

Loop = Tuple[Expr, Expr, Expr]  # (variable, lo, hi)


def _estimate_ragged(name: str, loops: Sequence[ReduceAxis], guards: Sequence[Expr],
                     ragged: Optional[int]) -> Tuple[List[ReduceAxis], List[Expr]]:
    """``loops`` with each ragged loop (bounds reading data) made ``range(0, ragged)``, the
    later bounds and the guards following it; a UserError if ``ragged`` is None."""
    mapping = {}
    out = []
    for ax in loops:
        lo, hi = (substitute(b, mapping) if mapping else b for b in (ax.lo, ax.hi))
        if reads_in(lo) or reads_in(hi):
            if ragged is None:
                raise UserError(
                    f"the iterations of {name} depend on data: its ragged loop {ax.name} runs over "
                    f"range({expr_to_str(ax.lo)}, {expr_to_str(ax.hi)}); te_grad counts loops whose bounds "
                    f"are known before the data is; pass ragged=N to count each ragged loop as N trips "
                    f"per point (an estimate)")
            lo, hi = const(0), const(int(ragged))
        if lo is not ax.lo or hi is not ax.hi:
            new = ReduceAxis(ax.name, ax.dtype, lo, hi)
            mapping[ax] = new
            ax = new
        out.append(ax)
    if mapping:
        guards = [substitute(g, mapping) for g in guards]
    return out, list(guards)


def _count_nest(out_axes: Sequence[Var], shape: Sequence[int], loops: Sequence[ReduceAxis],
                guards: Sequence[Expr], name: str = "", ragged: Optional[int] = None) -> int:
    loops, guards = _estimate_ragged(name, loops, guards, ragged)
    # data-dependent (or float) guards restrict nothing here
    guards = [g for g in guards if not reads_in(g) and is_index_expr(g)]
    mentioned = set()
    for ax in loops:
        mentioned |= {id(v) for v in free_vars(ax.lo)} | {id(v) for v in free_vars(ax.hi)}
    for g in guards:
        mentioned |= {id(v) for v in free_vars(g)}
    factor = 1
    rest_out, rest_shape, rest_loops = [], [], []
    for ax, n in zip(out_axes, shape):
        if id(ax) in mentioned:
            rest_out.append(ax)
            rest_shape.append(n)
        else:
            factor *= n
    for ax in loops:
        if id(ax) not in mentioned and ax.extent is not None:
            factor *= ax.extent
        else:
            rest_loops.append(ax)
    if factor == 0:
        return 0
    loop_ids = {id(ax) for ax in rest_loops}
    inner = [g for g in guards if any(id(v) in loop_ids for v in free_vars(g))]
    outer = [g for g in guards if not any(id(v) in loop_ids for v in free_vars(g))]
    try:
        return factor * _enumerate(rest_out, rest_shape, rest_loops, inner, outer)
    except NotAnIndex as err:
        names = ", ".join(ax.name for ax in rest_loops)
        raise InternalError(f"cannot count the iterations of loops ({names}): {err}") from None


def _enumerate(out_axes: Sequence[Var], shape: Sequence[int], loops: Sequence[ReduceAxis],
               inner: Sequence[Expr], outer: Sequence[Expr]) -> int:
    """Points ``(out, loops)`` with ``0 <= out < shape``, every loop within its bounds,
    ``outer`` holding at the output point and ``inner`` at the whole point."""
    total = 0
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    for start in range(0, size, BLOCK):
        flat = np.arange(start, min(size, start + BLOCK), dtype=np.int64)
        coords = np.unravel_index(flat, tuple(shape)) if shape else ()
        env = {id(a): c.astype(np.int64) for a, c in zip(out_axes, coords)}
        n = len(flat)
        if outer:
            keep = _holds(outer, env, n)
            env = {k: v[keep] for k, v in env.items()}
            n = int(keep.sum())
        total += _count_loops(env, n, list(loops), inner)
    return total


def _holds(guards: Sequence[Expr], env: Dict[int, np.ndarray], n: int) -> np.ndarray:
    """Where every guard holds, at each of the ``n`` points of ``env``."""
    keep = np.ones(n, dtype=bool)
    for g in guards:
        keep &= np.broadcast_to(index_values(g, env), (n,))
    return keep


def _column(e: Expr, env: Dict[int, np.ndarray], n: int) -> np.ndarray:
    return np.broadcast_to(index_values(e, env), (n,)).astype(np.int64)


def _count_loops(env: Dict[int, np.ndarray], n: int, loops: List[ReduceAxis], inner: Sequence[Expr]) -> int:
    """Points of ``loops`` (outermost first) at each of the ``n`` points of ``env`` where
    every guard of ``inner`` holds."""
    if n == 0:
        return 0
    if not loops:
        return int(_holds(inner, env, n).sum()) if inner else n
    ax = loops[0]
    lo, hi = _column(ax.lo, env, n), _column(ax.hi, env, n)
    sizes = np.maximum(hi - lo, 0)
    if len(loops) == 1 and not inner:  # the innermost trip count in closed form
        return int(sizes.sum(dtype=np.int64))
    total = 0
    for rows, values in _expand(lo, sizes):
        sub = {k: v[rows] for k, v in env.items()}
        sub[id(ax)] = values
        total += _count_loops(sub, len(rows), loops[1:], inner)
    return total


def _expand(lo: np.ndarray, sizes: np.ndarray) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """``(rows, values)`` blocks listing each point ``k`` once per value of
    ``range(lo[k], lo[k] + sizes[k])``, about :data:`BLOCK` values per block."""
    rows = np.nonzero(sizes > 0)[0]
    lo, sizes = lo[rows], sizes[rows]
    pieces = -(-sizes // BLOCK)  # a range longer than a block is cut into pieces
    if np.any(pieces > 1):
        first = np.repeat(np.cumsum(pieces) - pieces, pieces)
        k = np.arange(int(pieces.sum()), dtype=np.int64) - first
        rows, lo, sizes = np.repeat(rows, pieces), np.repeat(lo, pieces), np.repeat(sizes, pieces)
        lo, sizes = lo + k * BLOCK, np.minimum(sizes - k * BLOCK, BLOCK)
    ends = np.cumsum(sizes)
    group = (ends - sizes) // BLOCK  # each group starts within one block of values
    cuts = np.nonzero(np.diff(group))[0] + 1
    for s, e in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(rows)]])):
        if s == e:
            continue
        size = sizes[s:e]
        at = np.repeat(np.arange(e - s), size)
        offset = np.arange(int(size.sum()), dtype=np.int64) - np.repeat(np.cumsum(size) - size, size)
        yield rows[s:e][at], np.repeat(lo[s:e], size) + offset


def tensor_iterations(t: Tensor, ragged: Optional[int] = None, region: Optional[Expr] = None) -> int:
    """Innermost iterations to compute ``t`` once from its inputs (see the module docstring;
    ``ragged``: the trips assumed for a loop whose bounds read data, else such a loop is an error;
    ``region``: the points of ``t`` that need be written, :func:`.unread.written_regions`)."""
    if isinstance(t.op, PlaceholderOp):
        return 0
    if isinstance(t.op, ScatterOp):
        return _count_nest([], [], t.op.axes, [], t.name, ragged)
    found = reductions_in(t.op.body)
    if not found:
        return t.size if region is None else _count_nest(t.op.axes, t.shape, [], [region], t.name, ragged)
    return sum(_count_nest(t.op.axes, t.shape, loops + list(red.axes), guards, t.name, ragged)
               for red, guards, loops in found)


def iterations(tensors, ragged: Optional[int] = None):
    """Innermost iterations to compute ``tensors`` and everything they need, each tensor once:
    an int for fixed shapes, a :class:`SizeCount` (a function of the sizes) for a graph with
    size variables. A loop whose bounds read data (a ragged loop) is a UserError, or counts
    ``ragged`` trips per point when that estimate is given."""
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    tensors = list(tensors)
    variables = graph_size_vars(tensors)
    if variables:
        return SizeCount(tensors, variables, ragged)
    return _graph_iterations(tensors, ragged)


def _graph_iterations(tensors: List[Tensor], ragged: Optional[int]) -> int:
    regions = written_regions(tensors)
    through = read_through(tensors, regions)  # copies the kernel does not make
    return sum(tensor_iterations(t, ragged, regions.get(id(t))) for t in topo_order(tensors) if id(t) not in through)


#: the largest period, degree and start of a closed form searched for
MAX_PERIOD, MAX_DEGREE, MAX_START = 6, 6, 8
#: sizes past the interpolation window at which a closed form is checked (offsets from its end)
CHECK_AT = (1, 2, 3, 17, 40, 101)


class SizeCount:
    """The exact iteration count of a graph with size variables, as a function of them.

    ``count.at(n=5)`` and ``count({"n": 5})`` (names or :class:`~te_grad.ir.SizeVar` keys)
    give the int at those sizes; ``str(count)`` the closed form (one size variable:
    ``8 * n + 32``, or pieces by range and residue); :meth:`pieces` and :meth:`leading` the
    polynomials (see the module docstring for how they are found and checked)."""

    def __init__(self, tensors: Sequence[Tensor], variables, ragged: Optional[int] = None):
        self.tensors = list(tensors)
        self.variables = tuple(variables)
        self.ragged = ragged
        self._values: Dict[Tuple[int, ...], int] = {}
        self._form = None

    # -- values -------------------------------------------------------------------------
    def at(self, **sizes) -> int:
        """The count at ``sizes`` given by name: ``count.at(n=5)``."""
        return self(sizes)

    def __call__(self, sizes: Mapping) -> int:
        bound = named_sizes(self.variables, sizes)
        missing = [v.name for v in self.variables if v not in bound]
        if missing:
            raise UserError(f"the count needs the value of {', '.join(missing)}")
        key = tuple(bound[v] for v in self.variables)
        got = self._values.get(key)
        if got is None:
            outs, _ = specialize(self.tensors, bound)
            got = self._values[key] = _graph_iterations(outs, self.ragged)
        return got

    def _at1(self, n: int) -> int:
        return self({self.variables[0]: n})

    # -- closed form ----------------------------------------------------------------------
    def pieces(self):
        """``(table, start, period, polys)`` for one size variable ``n``: the count is
        ``table[n]`` for ``lo <= n < start`` and ``sum(c * n**k for k, c in
        enumerate(polys[n % period]))`` from ``start`` on (coefficients are Fractions).
        None when no closed form was found (several variables, or none reproduces the
        counts)."""
        if self._form is None:
            self._form = self._fit() or False
        return self._form or None

    def leading(self) -> Tuple[int, Fraction]:
        """``(degree, coefficient)`` of the highest power of the closed form (the same on
        every residue class, else an error)."""
        form = self.pieces()
        if form is None:
            raise UserError(f"no closed form of the count in {self._names()}")
        tops = set()
        for poly in form[3]:
            deg = max((k for k, c in enumerate(poly) if c), default=0)
            tops.add((deg, poly[deg] if poly else Fraction(0)))
        if len(tops) != 1:
            raise UserError(f"the count's leading term depends on the residue of the size: {self}")
        return tops.pop()

    def closed_form_at(self, n: int) -> int:
        """The closed form (:meth:`pieces`) at ``n``, without counting."""
        form = self.pieces()
        if form is None:
            raise UserError(f"no closed form of the count in {self._names()}")
        table, start, period, polys = form
        v = self.variables[0]
        if n < v.lo or (v.hi is not None and n > v.hi):
            raise UserError(f"size {v.name} = {n} is outside its range")
        if n < start:
            return table[n]
        got = _poly_at(polys, period, start, n)
        if got.denominator != 1:  # pragma: no cover - a fitted count is an integer at every size
            raise InternalError(f"the closed form {self} is not an integer at {n}")
        return int(got)

    def _names(self) -> str:
        return ", ".join(v.name for v in self.variables)

    def _fit(self):
        if len(self.variables) != 1:
            return None
        v = self.variables[0]
        lo, hi = v.lo, v.hi
        for start in range(lo, lo + MAX_START + 1):
            for period in range(1, MAX_PERIOD + 1):
                points = MAX_DEGREE + 2  # per residue class: one more than a degree-MAX_DEGREE fit needs
                end = start + period * points
                if hi is not None and end > hi + 1:
                    continue
                polys = []
                for r in range(period):
                    ns = [start + r + period * k for k in range(points)]
                    poly = _interpolate(ns, [self._at1(n) for n in ns])
                    if poly is None:
                        break
                    polys.append(poly)
                else:
                    checks = [end - 1 + d for d in CHECK_AT]
                    if hi is not None:
                        checks = [n for n in checks if n <= hi]
                    if all(_poly_at(polys, period, start, n) == self._at1(n) for n in checks):
                        table = {n: self._at1(n) for n in range(lo, start)}
                        return table, start, period, polys
        return None

    def __str__(self):
        form = self.pieces()
        if form is None:
            return f"iterations({self._names()}): evaluate with .at({self._names()}=...)"
        (name,) = [v.name for v in self.variables]
        table, start, period, polys = form
        parts = [f"{name} = {n}: {c}" for n, c in table.items()]
        cond = f"{name} >= {start}" if start > self.variables[0].lo else ""
        for r, poly in enumerate(polys):
            where = [cond] if cond else []
            if period > 1:
                where.append(f"{name} % {period} = {(start + r) % period}")
            text = _poly_text(poly, name)
            parts.append(f"{' and '.join(where)}: {text}" if where else text)
        return parts[0] if len(parts) == 1 else "; ".join(parts)

    def __repr__(self):
        return f"SizeCount({self})"

    def __format__(self, spec: str) -> str:  # "{:,}" as for an int count: the closed form
        return str(self)

    def __int__(self):
        raise UserError(f"the count depends on {self._names()}: evaluate it with .at({self._names()}=...)")


def _interpolate(ns: Sequence[int], values: Sequence[int]) -> Optional[List[Fraction]]:
    """Coefficients (lowest power first) of the polynomial through ``(ns, values)``, of
    degree at most ``len(ns) - 2`` (the last point checks it), or None."""
    pts = list(zip(ns, values))
    fit, check = pts[:-1], pts[-1]
    coeffs = [Fraction(0)] * len(fit)
    for k, (xk, yk) in enumerate(fit):  # Lagrange, expanded
        basis = [Fraction(1)]
        denom = Fraction(1)
        for j, (xj, _) in enumerate(fit):
            if j == k:
                continue
            basis = [Fraction(0)] + basis  # times x
            for q in range(len(basis) - 1):
                basis[q] -= xj * basis[q + 1]
            denom *= xk - xj
        for q, c in enumerate(basis):
            coeffs[q] += yk * c / denom
    while len(coeffs) > 1 and coeffs[-1] == 0:
        coeffs.pop()
    if _eval_poly(coeffs, check[0]) != check[1]:
        return None
    return coeffs


def _eval_poly(coeffs, n) -> Fraction:
    return sum((c * Fraction(n) ** k for k, c in enumerate(coeffs)), Fraction(0))


def _poly_at(polys, period: int, start: int, n: int) -> Fraction:
    return _eval_poly(polys[(n - start) % period], n)


def _poly_text(coeffs, name: str) -> str:
    terms = []
    for k in range(len(coeffs) - 1, -1, -1):
        c = coeffs[k]
        if c == 0:
            continue
        mag = abs(c)
        power = "" if k == 0 else (name if k == 1 else f"{name}**{k}")
        if k == 0:
            body = str(mag)
        elif mag == 1:
            body = power
        elif mag.denominator == 1:
            body = f"{mag} * {power}"
        else:
            body = (power if mag.numerator == 1 else f"{mag.numerator} * {power}") + f" / {mag.denominator}"
        terms.append(("- " if c < 0 else "+ ") + body)
    if not terms:
        return "0"
    text = " ".join(terms)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]
