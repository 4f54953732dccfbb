"""Piecewise-affine indices (``K[b, i + if_then_else(h < H // 2, w - 4, w), h, d]``) split
into their affine pieces (simplify/piecewise.py): the gradient is exact (float64 finite
differences, the unsimplified VJP evaluated by the oracle, compiled kernels), has no
scatter, and costs exactly the iterations of the same formula split by hand; conditions
or branches that read data are left alone (a scatter, still exact)."""
import numpy as np
import pytest

import te_grad as tg
from te_grad.formulations import longformer_conditional, longformer_split
from te_grad.graph import topo_order
from te_grad.ir import ScatterOp
from te_grad.testing import check_gradients

F64 = "float64"
B, N, H, D, W = 2, 11, 4, 3, 5


def _guarded(k, b, j, h, d):
    return tg.if_then_else(tg.all(j >= 0, j < N), k[b, j, h, d], 0.0)


def window_scores(form, dtype=F64):
    """``S[b, h, i, w] = sum_d Q[b, i, h, d] * K[b, j, h, d]`` (0 where ``j`` leaves the
    sequence), ``j`` the window's key: an ``if_then_else`` of affine offsets inside the index
    (``form`` "head", "parity", "nested"), or ``"split"``: "head" written as two sums, one per
    branch."""
    q = tg.placeholder((B, N, H, D), dtype=dtype, name="Q")
    k = tg.placeholder((B, N, H, D), dtype=dtype, name="K")
    d = tg.reduce_axis(D, "d")
    offsets = {
        "head": lambda h, w: tg.if_then_else(h < H // 2, w - 4, w),
        "parity": lambda h, w: tg.if_then_else(h % 2 == 0, w - (W - 1), 2 * w - 3),
        "nested": lambda h, w: tg.if_then_else(h < 1, w - 4, tg.if_then_else(w < 2, w + 1, 4 - w)),
    }
    if form == "split":
        def body(b, h, i, w):
            return (tg.sum(q[b, i, h, d] * _guarded(k, b, i + w - 4, h, d), axis=d, where=h < H // 2)
                    + tg.sum(q[b, i, h, d] * _guarded(k, b, i + w, h, d), axis=d, where=h >= H // 2))
    else:
        def body(b, h, i, w):
            return tg.sum(q[b, i, h, d] * _guarded(k, b, i + offsets[form](h, w), h, d), axis=d)
    return q, k, tg.compute((B, H, N, W), body, name="S")


def _scatters(tensors):
    return [t.name for t in topo_order(list(tensors)) if isinstance(t.op, ScatterOp)]


def _kernel_scatters(kernel):
    return [s.stage.tensor.name for s in kernel.stages if isinstance(s.stage.tensor.op, ScatterOp)]


def _check(y, xs, extra_inputs=(), extra_values=(), seed=0, compiled=True):
    """The simplified gradient against the unsimplified VJP (oracle), finite differences and
    the compiled kernel; returns the simplified gradients."""
    rng = np.random.default_rng(seed)
    head = tg.placeholder(y.shape, dtype=F64, name="head")
    feed = {x: rng.standard_normal(x.shape) for x in xs}
    feed.update(zip(extra_inputs, extra_values))
    feed[head] = rng.standard_normal(y.shape)
    raw = list(tg.differentiate(y, list(xs), head=head, simplify=False))
    simp = list(tg.differentiate(y, list(xs), head=head))
    want = tg.evaluate(raw, feed)
    for got, w in zip(tg.evaluate(simp, feed), want):
        np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-12)
    check_gradients(y, list(xs), {x: feed[x] for x in list(xs) + list(extra_inputs)}, head=head,
                    head_value=feed[head], grads=simp, full_limit=40)
    if compiled:
        order = list(xs) + list(extra_inputs) + [head]
        kernel = tg.build(simp, order, threads=2)
        got = kernel(*[feed[t] for t in order])
        for g, w in zip(got if len(simp) > 1 else [got], want):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
        return simp, kernel
    return simp, None


@pytest.mark.parametrize("form", ["head", "parity", "nested"])
def test_conditional_offsets_are_exact_and_gather(form):
    q, k, s = window_scores(form)
    grads, kernel = _check(s, [q, k])
    # dK was a serial scatter over (d, h, i, w) with the index i + if_then_else(...)
    assert _scatters(grads) == []
    assert _kernel_scatters(kernel) == []


def _own_iterations(t):
    """The iterations of ``t`` alone (those of the graph behind it less its producers')."""
    producers = [p for p in topo_order([t]) if p is not t and not isinstance(p.op, tg.ir.PlaceholderOp)]
    return tg.iterations(t) - (tg.iterations(producers) if producers else 0)


def test_iterations_equal_the_hand_split_form():
    q, k, s = window_scores("head")
    q2, k2, s2 = window_scores("split")
    head, head2 = tg.placeholder(s.shape, dtype=F64, name="head"), tg.placeholder(s2.shape, dtype=F64, name="head")
    grads = list(tg.differentiate(s, [q, k], head=head))
    hand = list(tg.differentiate(s2, [q2, k2], head=head2))
    assert _scatters(grads) == [] and _scatters(hand) == []
    # dQ and dK: exactly the loops of the hand-split sums (a gather per branch, tight bounds)
    for g, h in zip(grads, hand):
        assert _own_iterations(g) == _own_iterations(h)
    # the hand-split form also copies the head once per term (an element-wise stage each,
    # made by the adjoint of the sum of two terms): the conditional form has nothing more
    copies = [t for t in topo_order(hand) if all(t is not g for g in hand) and not isinstance(t.op, tg.ir.PlaceholderOp)]
    assert tg.iterations(grads) == tg.iterations(hand) - tg.iterations(copies)
    # and the two forms compute the same gradients
    rng = np.random.default_rng(3)
    vals = [rng.standard_normal(t.shape) for t in (q, k, head)]
    for g, h in zip(tg.evaluate(grads, dict(zip((q, k, head), vals))),
                    tg.evaluate(hand, dict(zip((q2, k2, head2), vals)))):
        np.testing.assert_allclose(g, h, rtol=1e-12, atol=1e-12)


def test_a_read_at_a_conditional_index_without_reduction():
    # y[i] = x[i // 2] for even i, x[n - 1 - i // 2] for odd i: its adjoint pins x's index
    n = 9
    x = tg.placeholder((n,), dtype=F64, name="x")
    y = tg.compute((n,), lambda i: 2.0 * x[tg.if_then_else(i % 2 == 0, i // 2, n - 1 - i // 2)], name="y")
    (dx,), kernel = _check(y, [x])
    assert _scatters([dx]) == [] and _kernel_scatters(kernel) == []
    # each element of y is visited once by the gradient, never n times per element of dx
    assert tg.iterations(dx) == n


def test_a_data_dependent_condition_stays_a_scatter_and_exact():
    m = tg.placeholder((N,), dtype=F64, name="m")
    x = tg.placeholder((N,), dtype=F64, name="x")
    y = tg.compute((N,), lambda i: x[tg.if_then_else(m[i] > 0.0, i, N - 1 - i)] * m[i], name="y")
    (dx, dm), _ = _check(y, [x, m])
    assert _scatters([dx]) == ["dx"]


def test_a_data_dependent_branch_stays_a_scatter_and_exact():
    ids = tg.placeholder((N,), dtype="int64", name="ids")
    x = tg.placeholder((N, 2), dtype=F64, name="x")
    y = tg.compute((N, 2), lambda i, j: x[tg.if_then_else(i < 4, ids[i], N - 1 - i), j] * 3.0, name="y")
    ids_v = np.random.default_rng(5).integers(0, N, N).astype("int64")
    (dx,), _ = _check(y, [x], [ids], [ids_v])
    assert _scatters([dx]) == ["dx"]


def test_many_selections_stay_whole_and_exact():
    # five selections would make 32 pieces (more than MAX_PIECES): the sum is kept whole
    n = 12
    x = tg.placeholder((n,), dtype=F64, name="x")
    r = tg.reduce_axis(n, "r")

    def index(i, j):
        e = j
        for c in range(5):
            e = e + tg.if_then_else(i % (c + 2) == 0, 1, 0)
        return e
    y = tg.compute((n,), lambda i: tg.sum(tg.if_then_else(index(i, r) < n, x[index(i, r) % n], 0.0), axis=r),
                   name="y")
    _check(y, [x], compiled=True)


def test_longformer_with_a_conditional_window_gathers_like_the_split_one():
    cond, split = longformer_conditional(F64, small=True), longformer_split(F64, small=True)
    grads, kernel = _check(cond.output, cond.inputs)
    assert _scatters(grads) == [] and _kernel_scatters(kernel) == []
    head = tg.placeholder(split.output.shape, dtype=F64, name="head")
    hand = list(tg.differentiate(split.output, split.inputs, head=head))
    # dQ, dK and dV: the same pieces as the split form's (which also has two copies of the
    # head and of the scores' adjoint, one per term, that the conditional form does not)
    assert tg.iterations(grads) <= tg.iterations(hand)


def test_the_fuzzer_draws_conditional_indices():
    """The fuzzer's window stages read at ``i0 + if_then_else(c, a, b)``: conditions on the
    loop variables (piecewise affine) and on data, nested offsets, summed or not; they pass
    every check (compiled, simplified, raw, finite differences)."""
    from te_grad.tools.fuzz import Program, check, from_seed
    sources = [(s, from_seed(s).source) for s in range(300)]
    window = [(s, src) for s, src in sources if "i0 + tg.if_then_else(" in src]
    assert len(window) > 10
    texts = [src for _, src in window]
    assert any("i0 + tg.if_then_else(i1 < " in src for src in texts)
    assert any("] > 0.0, " in src.split("def _S")[-1] for src in texts)  # a condition on data
    assert any("tg.sum(" in src.split("def _S")[-1] for src in texts)
    for seed, src in window[:4]:
        outcome = check(Program(src), seed=seed)
        assert not outcome.failed, f"{outcome.kind}: {outcome.detail}\n{src}"
        assert "a conditional index (if_then_else inside an index)" in outcome.notes
