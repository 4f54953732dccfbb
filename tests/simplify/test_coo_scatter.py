"""Data equalities solved: ``where=dst[e] == i`` makes a scatter (forward) and removes pinned
reduce axes (backward), with exact E x F counts, values as the unrewritten form's and as
finite differences, out-of-range data selecting nothing."""
import itertools

import numpy as np
import pytest

import te_grad as tg
from te_grad.graph import topo_order
from te_grad.ir import ComputeOp, Reduce, ScatterOp
from te_grad.testing import check_gradients
from te_grad.visitor import Visitor

F64 = "float64"


def coo(N, E, F, dtype=F64, index="int64", offset=0, flip=False):
    src = tg.placeholder((E,), dtype=index, name="src")
    dst = tg.placeholder((E,), dtype=index, name="dst")
    w = tg.placeholder((E,), dtype=dtype, name="w")
    x = tg.placeholder((N, F), dtype=dtype, name="x")
    e = tg.reduce_axis((0, E), name="e")

    def cond(i):
        target = i + offset if offset else i
        return (target == dst[e]) if flip else (dst[e] == target)

    y = tg.compute((N, F), lambda i, j: tg.sum(w[e] * x[src[e], j], axis=e, where=cond(i)), name="y")
    return src, dst, w, x, y


def graph_values(N, E, F, rng, out_of_range=True, index="int64"):
    """A random graph: repeated destinations, empty rows, destinations outside [0, N)."""
    src = rng.integers(0, N, E)
    dst = rng.integers(0, max(1, N // 2), E) * 2  # odd rows stay empty, even ones repeat
    if out_of_range and E >= 4:
        dst[:4] = [-1, N, N + 7, -N]
    return (src.astype(index), dst.astype(index), rng.standard_normal(E), rng.standard_normal((N, F)))


def reference(N, F, src, dst, w, x, offset=0):
    y = np.zeros((N, F))
    for e in range(len(src)):
        i = dst[e] - offset
        if 0 <= i < N:
            y[i] += w[e] * x[src[e]]
    return y


def brute_count(tensors):
    """Innermost iterations by explicit enumeration of every loop nest (constant bounds only)."""
    total = 0
    for t in topo_order(list(tensors)):
        if isinstance(t.op, ScatterOp):
            ranges = [range(a.lo.value, a.hi.value) for a in t.op.axes]
            total += sum(1 for _ in itertools.product(*ranges))
        elif isinstance(t.op, ComputeOp):
            reds = _reductions(t.op.body)
            if not reds:
                total += int(np.prod(t.shape))
            for r in reds:
                ranges = [range(a.lo.value, a.hi.value) for a in r.axes]
                total += int(np.prod(t.shape)) * sum(1 for _ in itertools.product(*ranges))
    return total


class _Reductions(Visitor):
    def __init__(self):
        self.found = []

    def visit_Reduce(self, node):
        self.found.append(node)
        self.generic_visit(node)


def _reductions(e):
    v = _Reductions()
    v.visit(e)
    return v.found


# ---------------------------------------------------------------------------
# the forward: a scatter over (e, j), E x F work
# ---------------------------------------------------------------------------

def test_forward_becomes_a_scatter_with_exact_counts():
    N, E, F = 40, 120, 5
    *_, y = coo(N, E, F)
    assert tg.iterations(y) == N * E * F  # the guard tested at every (i, j, e)
    s = tg.simplify(y)
    assert isinstance(s.op, ScatterOp)
    assert len(s.op.axes) == 2 and {a.name for a in s.op.axes} == {"e", "j"}
    assert tg.iterations(s) == E * F == brute_count([s])


@pytest.mark.parametrize("offset,flip", [(0, False), (0, True), (1, False), (-2, True)])
def test_forward_values_compiled_and_oracle(offset, flip):
    N, E, F = 13, 60, 3
    rng = np.random.default_rng(offset + 10 * flip)
    src, dst, w, x, y = coo(N, E, F, offset=offset, flip=flip)
    vals = graph_values(N, E, F, rng)
    feed = dict(zip((src, dst, w, x), vals))
    want = reference(N, F, *vals, offset=offset)
    oracle, = tg.evaluate([y], feed)  # the unrewritten form
    np.testing.assert_allclose(oracle, want, rtol=1e-12, atol=1e-12)
    s = tg.simplify(y)
    assert isinstance(s.op, ScatterOp)
    np.testing.assert_allclose(tg.evaluate([s], feed)[0], want, rtol=1e-12, atol=1e-12)
    kernel = tg.build(y, [src, dst, w, x])
    np.testing.assert_allclose(kernel(*vals), want, rtol=1e-12, atol=1e-12)


def test_segment_sum_drops_out_of_range_destinations():
    # every output index pinned: the sum over i selected nothing for dst outside [0, N), so
    # the scatter must skip those points (it used to stop with an out-of-range error)
    N, E = 5, 8
    dst = tg.placeholder((E,), dtype="int64", name="dst")
    w = tg.placeholder((E,), dtype=F64, name="w")
    e = tg.reduce_axis((0, E), name="e")
    y = tg.compute((N,), lambda i: tg.sum(w[e], axis=e, where=dst[e] == i), name="y")
    d = np.array([0, 1, 7, -1, 4, 4, 2, 5])
    wv = np.arange(8.0)
    want = np.zeros(N)
    for k in range(E):
        if 0 <= d[k] < N:
            want[d[k]] += wv[k]
    np.testing.assert_allclose(tg.evaluate([y], {dst: d, w: wv})[0], want)
    np.testing.assert_allclose(tg.build(y, [dst, w])(d, wv), want)


def test_int32_indices_and_extra_conditions():
    N, E, F = 9, 30, 4
    src = tg.placeholder((E,), dtype="int32", name="src")
    dst = tg.placeholder((E,), dtype="int32", name="dst")
    w = tg.placeholder((E,), dtype=F64, name="w")
    x = tg.placeholder((N, F), dtype=F64, name="x")
    e = tg.reduce_axis((0, E), name="e")
    y = tg.compute((N, F), lambda i, j: tg.sum(w[e] * x[src[e], j], axis=e,
                                              where=(w[e] > 0) & (dst[e] == i) & (j < 3)), name="y")
    rng = np.random.default_rng(3)
    vals = graph_values(N, E, F, rng, index="int32")
    feed = dict(zip((src, dst, w, x), vals))
    s = tg.simplify(y)
    assert isinstance(s.op, ScatterOp)
    assert tg.iterations(s) == E * 3 == brute_count([s])  # j < 3 tightens the loop
    want, = tg.evaluate([y], feed)
    np.testing.assert_allclose(tg.evaluate([s], feed)[0], want, rtol=1e-12)
    np.testing.assert_allclose(tg.build(y, [src, dst, w, x])(*vals), want, rtol=1e-12)


# ---------------------------------------------------------------------------
# the backward: dx a scatter, dw a gather, both E x F
# ---------------------------------------------------------------------------

def test_backward_counts_are_e_times_f():
    N, E, F = 40, 120, 5
    src, dst, w, x, y = coo(N, E, F)
    head = tg.placeholder((N, F), dtype=F64, name="head")
    raw = tg.differentiate(y, [x, w], head=head, simplify=False)
    # the raw VJP loops over the forward domain (e, i, j) for every element of dx and dw
    assert tg.iterations(list(raw)) == (N * F + E) * E * N * F == brute_count(list(raw))
    dx, dw = tg.differentiate(y, [x, w], head=head)
    assert isinstance(dx.op, ScatterOp)
    assert tg.iterations(dx) == E * F == brute_count([dx])
    assert tg.iterations(dw) == E * F == brute_count([dw])


@pytest.mark.parametrize("seed", [0, 1])
def test_backward_values_oracle_compiled_and_finite_differences(seed):
    N, E, F = 7, 25, 3
    rng = np.random.default_rng(seed)
    src, dst, w, x, y = coo(N, E, F, offset=seed)
    vals = graph_values(N, E, F, rng)
    feed = dict(zip((src, dst, w, x), vals))
    head = tg.placeholder((N, F), dtype=F64, name="head")
    hv = rng.standard_normal((N, F))
    raw = list(tg.differentiate(y, [x, w], head=head, simplify=False))
    simp = list(tg.differentiate(y, [x, w], head=head))
    feed[head] = hv
    oracle = tg.evaluate(raw, feed)  # the raw VJP: N x E x F guard tests
    for got, want in zip(tg.evaluate(simp, feed), oracle):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    kernel = tg.build(list(tg.differentiate(y, [x, w], head=head, simplify=False)), [src, dst, w, x, head])
    for got, want in zip(kernel(*vals, hv), oracle):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # dw[e] by hand: sum_j head[dst[e] - off, j] * x[src[e], j], zero where dst leaves the rows
    s, d, _, xv = vals
    dw = np.array([hv[d[k] - seed] @ xv[s[k]] if 0 <= d[k] - seed < N else 0.0 for k in range(E)])
    np.testing.assert_allclose(oracle[1], dw, rtol=1e-12, atol=1e-12)
    check_gradients(y, [x, w], feed, head=head, head_value=hv, grads=simp)


# ---------------------------------------------------------------------------
# other combiners and solved reduce axes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("combiner", ["max", "min", "prod", "sum"])
def test_pinned_reduce_axis_is_solved_for_every_combiner(combiner):
    # y[k] = R_i (x[i] where idx[k] == i): one read per k instead of a loop over i
    N, K = 11, 6
    x = tg.placeholder((N,), dtype=F64, name="x")
    idx = tg.placeholder((K,), dtype="int64", name="idx")
    i = tg.reduce_axis((0, N), name="i")
    red = getattr(tg, combiner)
    y = tg.compute((K,), lambda k: red(x[i] * 2.0, axis=i, where=idx[k] == i), name="y")
    s = tg.simplify(y)
    assert not _reductions(s.op.body)
    assert tg.iterations(s) == K
    iv = np.array([0, 3, -1, 10, 11, 3])
    feed = {x: np.random.default_rng(1).standard_normal(N), idx: iv}
    want, = tg.evaluate([y], feed)
    identity = {"sum": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf}[combiner]
    assert want[2] == want[4] == identity  # idx outside [0, N): no point, the identity
    np.testing.assert_array_equal(tg.evaluate([s], feed)[0], want)
    np.testing.assert_array_equal(tg.build(y, [x, idx])(feed[x], iv), want)


@pytest.mark.parametrize("combiner", ["max", "min", "prod", "argmax"])
def test_other_combiners_keep_their_loops_over_outputs(combiner):
    # a scatter accumulates with +: max / min / prod over a pinned output stay gathers (exact,
    # N x E), argmax keeps its axis (its value is the position of the best point)
    N, E = 6, 20
    dst = tg.placeholder((E,), dtype="int64", name="dst")
    w = tg.placeholder((E,), dtype=F64, name="w")
    e = tg.reduce_axis((0, E), name="e")
    y = tg.compute((N,), lambda i: getattr(tg, combiner)(w[e], axis=e, where=dst[e] == i), name="y")
    s = tg.simplify(y)
    assert isinstance(s.op, ComputeOp) and isinstance(s.op.body, Reduce)
    rng = np.random.default_rng(2)
    feed = {dst: rng.integers(-1, N + 1, E), w: rng.standard_normal(E)}
    want, = tg.evaluate([y], feed)
    np.testing.assert_array_equal(tg.build(y, [dst, w])(feed[dst], feed[w]), want)


# ---------------------------------------------------------------------------
# conditions that read at the solved index, nested reductions (found by the fuzzer)
# ---------------------------------------------------------------------------

def test_conditions_reading_at_the_pinned_index_are_tested_after_its_range():
    # mask[i] comes before dst[e] == i: with i := dst[e] it must wait for 0 <= dst[e] < N
    N, E, F = 6, 15, 2
    src, dst, w, x, _ = coo(N, E, F)
    mask = tg.placeholder((N,), dtype=F64, name="mask")
    e = tg.reduce_axis((0, E), name="e")
    y = tg.compute((N, F), lambda i, j: tg.sum(w[e] * x[src[e], j], axis=e,
                                              where=(mask[i] > 0) & (dst[e] == i)), name="y")
    rng = np.random.default_rng(5)
    vals = graph_values(N, E, F, rng)
    feed = dict(zip((src, dst, w, x), vals))
    feed[mask] = rng.standard_normal(N)
    s = tg.simplify(y)
    assert isinstance(s.op, ScatterOp)
    want, = tg.evaluate([y], feed)
    np.testing.assert_allclose(tg.evaluate([s], feed)[0], want, rtol=1e-12)
    np.testing.assert_allclose(tg.build(y, [src, dst, w, x, mask])(*vals, feed[mask]), want, rtol=1e-12)
    # the same for a solved reduce axis: z[k] = sum_i x[i, 0] where mask[i] > 0 and idx[k] == i
    idx = tg.placeholder((E,), dtype="int64", name="idx")
    i = tg.reduce_axis((0, N), name="i")
    z = tg.compute((E,), lambda k: tg.sum(x[i, 0], axis=i, where=(mask[i] > 0) & (idx[k] == i)), name="z")
    sz = tg.simplify(z)
    assert not _reductions(sz.op.body)
    feed[idx] = vals[1]  # destinations outside [0, N) included
    want, = tg.evaluate([z], feed)
    np.testing.assert_allclose(tg.evaluate([sz], feed)[0], want, rtol=1e-12)
    np.testing.assert_allclose(tg.build(z, [x, mask, idx])(vals[3], feed[mask], feed[idx]), want, rtol=1e-12)


def test_a_reduction_inside_the_summand_keeps_the_gather():
    # a scatter's value is computed point by point: the inner max stays a reduction of a compute
    N, E, K = 5, 12, 3
    dst = tg.placeholder((E,), dtype="int64", name="dst")
    x = tg.placeholder((K, E), dtype=F64, name="x")
    e, k = tg.reduce_axis((0, E), name="e"), tg.reduce_axis((0, K), name="k")
    y = tg.compute((N,), lambda i: tg.sum(tg.max(x[k, e], axis=k), axis=e, where=dst[e] == i), name="y")
    rng = np.random.default_rng(6)
    feed = {dst: rng.integers(-2, N + 2, E), x: rng.standard_normal((K, E))}
    want, = tg.evaluate([y], feed)
    np.testing.assert_allclose(tg.build(y, [dst, x])(feed[dst], feed[x]), want, rtol=1e-12)
    check_gradients(y, [x], feed)


def test_an_affine_pin_beside_the_data_one_is_written_only_inside_the_output():
    # k == e + 3 leaves [0, K) for the last edges: they select no k, as in the sum over k
    N, E, K = 4, 10, 8
    dst = tg.placeholder((E,), dtype="int64", name="dst")
    w = tg.placeholder((E,), dtype=F64, name="w")
    e = tg.reduce_axis((0, E), name="e")
    y = tg.compute((N, K), lambda i, k: tg.sum(w[e], axis=e, where=(dst[e] == i) & (e + 3 == k)), name="y")
    s = tg.simplify(y)
    assert isinstance(s.op, ScatterOp)
    assert tg.iterations(s) == K - 3 == brute_count([s])  # isl keeps the e with e + 3 < K
    rng = np.random.default_rng(8)
    feed = {dst: rng.integers(-1, N + 1, E), w: rng.standard_normal(E)}
    want, = tg.evaluate([y], feed)
    np.testing.assert_allclose(tg.evaluate([s], feed)[0], want, rtol=1e-12)
    np.testing.assert_allclose(tg.build(y, [dst, w])(feed[dst], feed[w]), want, rtol=1e-12)
