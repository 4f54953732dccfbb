"""Pictures for notebooks: iteration domains and benchmark ratios (matplotlib).

matplotlib is imported only when a function here is called; install it with
``pip install te_grad[notebooks]``.

- :func:`plot_domain`: the points a reduction visits for one output element,
  and which of them contribute (the filter holds and no zero guard of the
  summand is false), projected on two of its loop variables.
- :func:`plot_raw_vs_simplified`: that picture for the raw vector-Jacobian
  product and for the simplified gradient side by side: zero-summation
  elimination, seen.
- :func:`plot_ratios`: a bar chart of te_grad / other-framework time ratios,
  from ``benchmarks/bench.py --json`` output or a plain ``{op: ratio}``.
"""
from __future__ import annotations

import json
import math
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..errors import UserError
from ..evaluator import expression_evaluator
from ..graph import free_vars, reads_in, reductions_in
from ..ir import Binary, ComputeOp, Const, Expr, ScatterOp, Select, Tensor, Unary

__all__ = ["plot_domain", "plot_raw_vs_simplified", "plot_ratios", "DomainPicture", "RatioPicture"]

#: most points of one output element's domain that plot_domain enumerates
POINT_LIMIT = 2_000_000

GREY = "#b8b8b8"
COLOR = "#d95f02"


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("te_grad.tools.plot needs matplotlib, which is not installed: "
                        "pip install te_grad[notebooks]") from None
    return plt


# -- evaluating index expressions over arrays of points ------------------------------------
class _NeedsData(Exception):
    """The expression reads a tensor: it has no value without data."""


class _Unbound(Exception):
    """The expression uses a variable not bound here (e.g. one of an inner reduction)."""


def _ev(e: Expr, env: Dict[int, np.ndarray]) -> np.ndarray:
    """``e`` at every point: ``env`` maps variables to equally long arrays. Evaluated by the
    reference evaluator (every operation and intrinsic it knows), once ``e`` is known to
    read no tensor (:class:`_NeedsData`) and to use only variables bound here
    (:class:`_Unbound`)."""
    reads = reads_in(e)
    if reads:
        raise _NeedsData(reads[0].tensor.name)
    if reductions_in(e):
        raise _NeedsData("Reduce")
    unbound = [v.name for v in free_vars(e) if id(v) not in env]
    if unbound:
        raise _Unbound(unbound[0])
    return expression_evaluator({}, where="te_grad.plot")(e, env)


def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and not isinstance(e.value, bool) and e.value == 0


def _zero_guards(body: Expr) -> List[Expr]:
    """Conditions under which a summand is structurally zero: ``if_then_else(c, x, 0)`` factors."""
    out = []

    def walk(e):
        if isinstance(e, Binary) and e.op == "mul":
            walk(e.a)
            walk(e.b)
        elif isinstance(e, Binary) and e.op == "div":
            walk(e.a)
        elif isinstance(e, Unary) and e.op == "neg":
            walk(e.a)
        elif isinstance(e, Select) and _is_zero(e.f):
            out.append(e.cond)
            walk(e.t)
        elif isinstance(e, Select) and _is_zero(e.t):
            out.append(~e.cond)
            walk(e.f)
    walk(body)
    return out


def _conjuncts(e: Expr) -> List[Expr]:
    if isinstance(e, Binary) and e.op == "and":
        return _conjuncts(e.a) + _conjuncts(e.b)
    return [e]


def _points(n: int, what: str = "point") -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def _names(axes) -> List[str]:
    seen: Dict[str, int] = {}
    out = []
    for ax in axes:
        n = seen.get(ax.name, 0)
        seen[ax.name] = n + 1
        out.append(ax.name if n == 0 else f"{ax.name}_{n}")
    return out


class _Domain:
    """Every point of one output element's reduction domain, and which points contribute."""

    def __init__(self, tensor: Tensor, at: Tuple[int, ...], reduction: int, limit: int):
        self.tensor, self.at = tensor, at
        op = tensor.op
        env = {}
        filters: List[Expr] = []
        restrict: List[Expr] = []
        if isinstance(op, ScatterOp):
            loops = list(op.axes)
            filters = [op.where] if op.where is not None else []
            filters += [ix == v for ix, v in zip(op.indices, at)]
            filters += _zero_guards(op.value)
            self.kind = "scatter"
        elif isinstance(op, ComputeOp):
            for ax, v in zip(op.axes, at):
                env[id(ax)] = np.full(1, v, dtype=np.int64)
            found = reductions_in(op.body)
            if not found:
                self.kind = "elementwise"
                loops = []
            else:
                if not 0 <= reduction < len(found):
                    raise UserError(f"{tensor.name} has {len(found)} reduction(s); reduction="
                                    f"{reduction} is out of range")
                red, guards, outer = found[reduction]
                loops = outer + list(red.axes)
                restrict = guards
                filters = ([red.where] if red.where is not None else []) + _zero_guards(red.body)
                self.kind = "reduction"
        else:
            raise UserError(f"{tensor.name} is a placeholder; it has no iteration domain")
        self.loops = loops
        self.names = _names(loops)
        n = 1
        for ax in loops:
            try:
                lo = np.broadcast_to(_ev(ax.lo, env), (n,)).astype(np.int64)
                hi = np.broadcast_to(_ev(ax.hi, env), (n,)).astype(np.int64)
            except (_NeedsData, _Unbound) as err:
                raise UserError(f"the bounds of loop {ax.name} of {tensor.name} cannot be evaluated "
                                f"without data ({err})") from None
            trip = np.maximum(hi - lo, 0)
            total = int(trip.sum())
            if total > limit:
                raise UserError(f"the domain of {tensor.name}{list(at)} has more than {limit:,} points; "
                                "plot a smaller instance of the operator")
            rep = np.repeat(np.arange(n), trip)
            start = np.repeat(np.cumsum(trip) - trip, trip)
            env = {k: v[rep] for k, v in env.items()}
            env[id(ax)] = lo[rep] + (np.arange(total, dtype=np.int64) - start)
            n = total
        keep = np.ones(n, dtype=bool)
        for g in restrict:  # quasi-affine guards around the reduction restrict what is iterated
            try:
                keep &= np.broadcast_to(_ev(g, env), (n,)).astype(bool)
            except (_NeedsData, _Unbound):
                pass  # a data-dependent guard restricts nothing (as in tg.iterations)
        self.points = np.stack([env[id(ax)][keep] for ax in loops], axis=1) if loops \
            else np.zeros((int(keep.sum()), 0), dtype=np.int64)
        env = {k: v[keep] for k, v in env.items()}
        n = int(keep.sum())
        contributes = np.ones(n, dtype=bool)
        self.data_dependent = []
        for c in [c for f in filters for c in _conjuncts(f)]:
            try:
                contributes &= np.broadcast_to(_ev(c, env), (n,)).astype(bool)
            except _NeedsData as err:
                self.data_dependent.append(str(err))
            except _Unbound:
                pass
        self.contributes = contributes


class DomainPicture:
    """What :func:`plot_domain` drew.

    ``points``: every point iterated for the element (one row per point, one
    column per loop variable, named by ``loops``); ``contributes``: which of
    them contribute; ``filter_evaluated``: False when the filter reads tensors
    (then every iterated point counts as a candidate). ``dims``: the two loop
    variables drawn; ``cells``: the distinct (dims) positions drawn, with
    ``cell_points`` and ``cell_contributing`` counts per cell; ``artists``:
    the matplotlib collections (grey: no contributing point; colored: some).
    """

    def __init__(self, dom: _Domain, dims, ax, artists, cells, cell_points, cell_contributing):
        self.tensor = dom.tensor
        self.at = dom.at
        self.loops = tuple(dom.names)
        self.points = dom.points
        self.contributes = dom.contributes
        self.filter_evaluated = not dom.data_dependent
        self.dims = tuple(dims)
        self.ax = ax
        self.artists = artists
        self.cells = cells
        self.cell_points = cell_points
        self.cell_contributing = cell_contributing

    @property
    def n_iterated(self) -> int:
        """Points of the domain for this element (1 for an element without a reduction)."""
        return len(self.points) if self.loops else 1

    @property
    def n_contributing(self) -> int:
        return int(self.contributes.sum()) if self.loops else 1

    @property
    def n_drawn(self) -> int:
        """Markers drawn (one per distinct position on the two dims)."""
        return len(self.cells)

    def __repr__(self):
        verb = "contribute" if self.filter_evaluated else "candidates (the filter reads data)"
        return (f"DomainPicture({self.tensor.name}{list(self.at)}: {_points(self.n_iterated)} iterated, "
                f"{self.n_contributing:,} {verb}; drawn on {', '.join(self.dims) or '-'})")


def _check_at(tensor: Tensor, at) -> Tuple[int, ...]:
    if at is None:
        return tuple(s // 2 for s in tensor.shape)
    if isinstance(at, (int, np.integer)):
        at = (at,)
    try:
        at = tuple(int(v) for v in at)
    except (TypeError, ValueError):
        raise UserError(f"at must be a tuple of ints (an element of {tensor.name}), got {at!r}") from None
    if len(at) != tensor.ndim or any(not 0 <= v < s for v, s in zip(at, tensor.shape)):
        raise UserError(f"at={list(at)} is not an element of {tensor.name} (shape {list(tensor.shape)})")
    return at


def _varying(dom: _Domain) -> List[str]:
    return [nm for d, nm in enumerate(dom.names) if len(np.unique(dom.points[:, d])) > 1]


def _pick_dims(dom: _Domain, dims) -> List[int]:
    names = dom.names
    if dims is None:
        chosen = _varying(dom)
        chosen += [nm for nm in names if nm not in chosen]
        dims = chosen[:2]
    if isinstance(dims, str):
        dims = [dims]
    dims = list(dims)
    if not 1 <= len(dims) <= 2 and names:
        raise UserError(f"dims must name one or two loop variables of {dom.tensor.name}, got {dims!r}")
    out = []
    for d in dims:
        if isinstance(d, (int, np.integer)) and 0 <= d < len(names):
            out.append(int(d))
        elif d in names:
            out.append(names.index(d))
        else:
            raise UserError(f"{d!r} is not a loop variable of {dom.tensor.name}; its loops are "
                            f"{', '.join(names) or '(none)'}")
    return out


def _draw(dom: _Domain, dims, ax, title_extra: str = "") -> DomainPicture:
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(4.6, 4.2))
    name = f"{dom.tensor.name}{list(dom.at)}"
    if not dom.loops:
        ax.text(0.5, 0.5, "no reduction:\none iteration for this element", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{name}{title_extra}\n1 point iterated", fontsize=10)
        return DomainPicture(dom, [], ax, [], np.zeros((0, 2), np.int64), np.zeros(0, np.int64),
                             np.zeros(0, np.int64))
    idx = _pick_dims(dom, dims)
    coords = dom.points[:, idx]
    if coords.shape[1] == 1:
        coords = np.concatenate([coords, np.zeros_like(coords)], axis=1)
    if len(coords):
        cells, inverse = np.unique(coords, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
    else:
        cells, inverse = np.zeros((0, 2), np.int64), np.zeros(0, np.int64)
    cell_points = np.bincount(inverse, minlength=len(cells))
    cell_contrib = np.bincount(inverse, weights=dom.contributes.astype(np.int64),
                               minlength=len(cells)).astype(np.int64)
    hit = cell_contrib > 0
    size = 48 if len(cells) < 400 else 14
    grey = ax.scatter(cells[~hit, 0], cells[~hit, 1], s=size, c=GREY, marker="s", linewidths=0,
                      label="iterated, contributes nothing" if not dom.data_dependent else "iterated")
    colored = ax.scatter(cells[hit, 0], cells[hit, 1], s=size, c=COLOR, marker="s", linewidths=0,
                         label="contributes" if not dom.data_dependent else "candidate (needs data)")
    names = [dom.names[i] for i in idx]
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1] if len(names) > 1 else "")
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if len(names) == 1:
        ax.set_yticks([])
    if not len(cells):
        ax.text(0.5, 0.5, "empty domain:\nno iteration for this element", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    ax.grid(True, color="#eeeeee", linewidth=0.6)
    ax.set_axisbelow(True)
    n_it, n_c = len(dom.points), int(dom.contributes.sum())
    iterated = f"{_points(n_it)} iterated" + (f" (for all of {dom.tensor.name})"
                                              if dom.kind == "scatter" else "")
    title = f"{name}{title_extra}\n{iterated}, {n_c:,} contribute"
    if dom.data_dependent:
        title = (f"{name}{title_extra}\n{iterated}, {n_c:,} candidates\n(the filter reads "
                 f"{', '.join(sorted(set(dom.data_dependent)))}: not evaluated without data)")
    ax.set_title(title, fontsize=10)
    mult = int(cell_points.max()) if len(cell_points) else 0
    if mult > 1:
        others = [nm for d, nm in enumerate(dom.names) if d not in idx]
        ax.annotate(f"a square stands for up to {mult:,} points (over {', '.join(others)})",
                    (0.0, -0.2), xycoords="axes fraction", fontsize=8, color="#555555", va="top")
    return DomainPicture(dom, names, ax, [grey, colored], cells, cell_points, cell_contrib)


def plot_domain(tensor: Tensor, at=None, dims=None, ax=None, reduction: int = 0,
                limit: int = POINT_LIMIT) -> DomainPicture:
    """Draw the reduction domain of one output element ``at`` of ``tensor``.

    Every point of the reduction's loops (bounds evaluated with the output
    indices fixed to ``at``; by default the middle element) is iterated (grey);
    the points where the filter holds and no ``if_then_else(c, x, 0)`` factor of
    the summand is zero contribute (colored). The points are projected on two
    loop variables ``dims`` (names; by default the first two that vary); a
    square stands for all points with that position. A filter that reads
    tensors cannot be evaluated without data: then every iterated point is a
    candidate, and the title says so. ``reduction`` picks one when the body
    has several. Returns a :class:`DomainPicture` (the points, the counts and
    the matplotlib artists).
    """
    if not isinstance(tensor, Tensor):
        raise UserError(f"plot_domain expects a tensor, got {tensor!r}")
    at = _check_at(tensor, at)
    dom = _Domain(tensor, at, reduction, limit)
    return _draw(dom, dims, ax)


def plot_raw_vs_simplified(result, input_index: int = 0, at=None, dims=None, reduction: int = 0,
                           limit: int = POINT_LIMIT, figsize=(9.5, 4.4)):
    """The raw VJP's domain next to the simplified gradient's, for one element of the gradient.

    ``result`` is a :func:`te_grad.differentiate` result; ``input_index``
    picks the gradient; ``at`` the element (default: the middle one); ``dims``
    two loop variables (default: the first two the simplified form iterates
    that the raw form also has; a variable the simplified form no longer loops
    over is left out of its panel). The panels share the range of the
    variables both draw. Returns the two :class:`DomainPicture` objects (raw,
    simplified).
    """
    from ..autodiff import DifferentiationResult
    if not isinstance(result, DifferentiationResult):
        raise UserError(f"plot_raw_vs_simplified expects the result of tg.differentiate, got {result!r}")
    if not 0 <= input_index < len(result.gradients):
        raise UserError(f"input_index={input_index} is out of range: the result has "
                        f"{len(result.gradients)} gradient(s)")
    raw, simp = result.raw[input_index], result.gradients[input_index]
    if raw is simp:
        raise UserError("this result was not simplified (simplify=False): there is nothing to compare")
    at = _check_at(simp, at)
    d_raw = _Domain(raw, at, reduction, limit)
    d_simp = _Domain(simp, at, reduction if reduction < _count_reductions(simp) else 0, limit)
    dims_raw = dims_simp = dims
    if isinstance(dims, (str, tuple, list)) and all(isinstance(d, str) for d in
                                                    ([dims] if isinstance(dims, str) else dims)):
        # a raw loop the simplified form solved away is left out of its panel
        dims_simp = [d for d in ([dims] if isinstance(dims, str) else dims) if d in d_simp.names] or None
    if dims is None and d_raw.loops:
        common = [nm for nm in _varying(d_simp) if nm in d_raw.names]
        common += [nm for nm in d_simp.names if nm in d_raw.names and nm not in common]
        if common:
            common += [nm for nm in _varying(d_raw) if nm not in common]
            dims_raw = common[:2]
            dims_simp = [nm for nm in dims_raw if nm in d_simp.names] or None
    plt = _pyplot()
    fig, (a0, a1) = plt.subplots(1, 2, figsize=figsize)
    left = _draw(d_raw, dims_raw, a0, " raw VJP")
    right = _draw(d_simp, dims_simp, a1, " simplified")
    if left.dims and right.dims:
        _same_limits(a0, a1, "x" if left.dims[0] == right.dims[0] else None)
        if len(left.dims) == 2 and len(right.dims) == 2 and left.dims[1] == right.dims[1]:
            _same_limits(a0, a1, "y")
        elif len(left.dims) == 2 and len(right.dims) == 1:
            a1.set_ylabel(f"({left.dims[1]}: no loop, solved by isl)")
    handles = [h for h in left.artists + right.artists if len(h.get_offsets())]
    labels = {}
    for h in handles:
        labels.setdefault(h.get_label(), h)
    if labels:
        fig.legend(list(labels.values()), list(labels.keys()), loc="lower center", ncol=len(labels),
                   frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return left, right


def _same_limits(a0, a1, which):
    if which is None:
        return
    get, set_ = f"get_{which}lim", f"set_{which}lim"
    (l0, h0), (l1, h1) = getattr(a0, get)(), getattr(a1, get)()
    lim = (min(l0, l1), max(h0, h1))
    getattr(a0, set_)(lim)
    getattr(a1, set_)(lim)


def _count_reductions(t: Tensor) -> int:
    if not isinstance(t.op, ComputeOp):
        return 1
    return len(reductions_in(t.op.body))


# -- benchmark ratios ---------------------------------------------------------------------
class RatioPicture:
    """What :func:`plot_ratios` drew: ``ratios`` maps op -> {column: ratio}; ``ax`` the axes."""

    def __init__(self, ratios: Dict[str, Dict[str, float]], ax, against: str):
        self.ratios = ratios
        self.ax = ax
        self.against = against

    def __repr__(self):
        return f"RatioPicture({len(self.ratios)} ops, te_grad / {self.against})"


def _bench_ratios(recs, against: str) -> Dict[str, Dict[str, float]]:
    out: Dict[str, Dict[str, float]] = {}
    for rec in recs:
        if not isinstance(rec, dict) or "op" not in rec:
            raise UserError(f"each entry of the table needs an 'op' key, got {rec!r}")
        row = {}
        if isinstance(rec.get("te_grad"), dict):  # benchmarks/bench.py --json format
            mine, other = rec["te_grad"], rec.get(against) or {}
            for what in ("fwd", "bwd"):
                # like with like, as bench reports: PyTorch's backward reuses what its forward
                # saved, so it is compared with te_grad's backward from residuals when timed
                key = "res_ms" if what == "bwd" and against == "torch" and "res_ms" in mine else f"{what}_ms"
                a, b = mine.get(key), other.get(f"{what}_ms")
                if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 and b > 0:
                    row[what] = a / b
        else:
            for key, v in rec.items():
                if key != "op" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    row[key] = float(v)
        if row:
            out[str(rec["op"])] = row
    return out


def _parse_table(table, against: str) -> Dict[str, Dict[str, float]]:
    if isinstance(table, (str, os.PathLike)):
        try:
            with open(table) as f:
                table = json.load(f)
        except (OSError, ValueError) as err:
            raise UserError(f"cannot read the benchmark table {str(table)!r}: {err}") from None
    if isinstance(table, dict) and isinstance(table.get("ops"), list):
        return _bench_ratios(table["ops"], against)
    if isinstance(table, dict):
        out = {}
        for op, v in table.items():
            if isinstance(v, dict):
                row = {k: float(x) for k, x in v.items() if isinstance(x, (int, float))}
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                row = {"ratio": float(v)}
            else:
                raise UserError(f"the ratio of {op!r} must be a number, got {v!r}")
            if row:
                out[str(op)] = row
        return out
    if isinstance(table, (list, tuple)):
        return _bench_ratios(list(table), against)
    raise UserError("plot_ratios takes the JSON written by benchmarks/bench.py --json (a dict, or its "
                    f"path), a list of dicts with an 'op' key, or {{op: ratio}}; got {type(table).__name__}")


_FRAMEWORK = {"torch": "PyTorch", "jax": "JAX"}


def plot_ratios(table, against: str = "torch", ax=None, title: Optional[str] = None) -> RatioPicture:
    """A bar chart of time ratios te_grad / ``against`` per op (log scale, a line at 1).

    ``table``: what ``benchmarks/bench.py --json PATH`` writes (the dict or the
    path; forward and backward ratios are computed from its ``fwd_ms`` and
    ``bwd_ms``, te_grad's ``res_ms`` against PyTorch's ``bwd_ms`` where it was timed), a list of such per-op records or of dicts like ``{"op":
    "dense", "fwd": 0.8, "bwd": 1.2}``, or a dict ``{op: ratio}``. Below the
    line, te_grad is faster.
    """
    ratios = _parse_table(table, against)
    if not ratios:
        raise UserError(f"no te_grad / {against} ratio found in the table")
    for op, row in ratios.items():
        for k, v in row.items():
            if not (v > 0 and math.isfinite(v)):
                raise UserError(f"the {k} ratio of {op} is {v!r}; ratios must be positive numbers")
    plt = _pyplot()
    ops = list(ratios)
    columns: List[str] = []
    for row in ratios.values():
        columns += [k for k in row if k not in columns]
    if ax is None:
        _, ax = plt.subplots(figsize=(max(5.0, 0.55 * len(ops) * max(1, len(columns)) + 1.5), 4.0))
    width = 0.8 / len(columns)
    x = np.arange(len(ops))
    colors = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a"]
    for n, col in enumerate(columns):
        vals = [ratios[op].get(col, np.nan) for op in ops]
        bars = ax.bar(x + (n - (len(columns) - 1) / 2) * width, vals, width, label=col,
                      color=colors[n % len(colors)])
        if len(ops) * len(columns) <= 60:
            ax.bar_label(bars, labels=["" if np.isnan(v) else f"{v:.2g}" for v in vals], fontsize=7,
                         padding=1)
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks(x)
    ax.set_xticklabels(ops, rotation=45, ha="right")
    who = _FRAMEWORK.get(against, against)
    ax.set_ylabel(f"time te_grad / {who}")
    ax.set_title(title or f"te_grad / {who} (below 1: te_grad is faster)", fontsize=10)
    if len(columns) > 1 or columns != ["ratio"]:
        ax.legend(frameon=False, fontsize=9)
    ax.figure.tight_layout()
    return RatioPicture(ratios, ax, against)
