"""Exactness: the simplified and compiled gradients equal the raw ones, or te_grad says it fell back.

The raw vector-Jacobian product, the simplified form and the compiled kernel are
three independent witnesses; the raw form is checked against float64 finite
differences, the other two against the raw form.
"""
import tracemalloc
import warnings

import numpy as np
import pytest

import te_grad as tg
from simplify import isl_bridge, validate
from te_grad.testing import check_gradients

RNG = np.random.default_rng(10)


def three_witnesses(Y, X, others=None):
    """Raw (against finite differences), simplified and compiled gradients of <H, Y> w.r.t. X;
    ``others`` feeds the other placeholders."""
    others = dict(others or {})
    H = tg.placeholder(Y.shape, name="H", dtype=Y.dtype)
    xv = RNG.standard_normal(X.shape)
    hv = RNG.standard_normal(Y.shape)
    feed = {X: xv, H: hv, **others}
    raw, = tg.differentiate(Y, [X], head=H, simplify=False)
    (want,) = check_gradients(Y, [X], {X: xv, **others}, grads=[raw], head=H, head_value=hv)
    res = tg.differentiate(Y, [X], head=H)
    simp = tg.evaluate([res[0]], feed)[0]
    np.testing.assert_allclose(simp, want, rtol=1e-12, atol=1e-12)
    order = [X, H] + list(others)
    compiled = tg.build([res[0]], order)(*[feed[t] for t in order])
    np.testing.assert_allclose(compiled, want, rtol=1e-12, atol=1e-12)
    return res


MODULAR = [
    # (X shape, Y shape, index map): the cases that lost a summand, and their neighbours
    ((3, 5), (4, 5), lambda X, i, j: X[(i + j) % 3, (j + 1) % 5]),
    ((3, 5), (4, 5), lambda X, i, j: X[(i + j) % 3, 2 * j % 5]),
    ((3, 5), (4, 5), lambda X, i, j: X[(i + j) % 3, j]),
    ((3, 5), (4, 5), lambda X, i, j: X[i % 3, 2 * j % 5]),
    ((3, 6), (4, 5), lambda X, i, j: X[(i + j) % 3, 2 * j % 6]),
    ((4, 3), (4, 3), lambda X, i, j: X[(j + 2) % 4, ((3 * i + 2 * j + 2) // 2) % 3]),
    ((5, 7), (6, 7), lambda X, i, j: X[(i + 2 * j) % 5, (j + 3) % 7]),          # more residues
    ((2, 3), (5, 4), lambda X, i, j: X[(i + j) % 2, (i + 2 * j + 1) % 3]),      # three-way
    ((3, 4), (5, 4), lambda X, i, j: X[(i - j + 9) % 3, (j - 1) % 4]),          # negative offsets
    ((3, 4), (6, 4), lambda X, i, j: X[(i // 2 + j) % 3, (i % 2 + j) % 4]),     # // and % on one variable
    ((4, 2), (5, 6), lambda X, i, j: X[(i + j) % 4, (i + j // 3) % 2]),
]


@pytest.mark.parametrize("case", range(len(MODULAR)))
def test_modular_index_maps(case):
    xs, ys, fn = MODULAR[case]
    X = tg.placeholder(xs, name="X", dtype="float64")
    Y = tg.compute(ys, lambda i, j: fn(X, i, j), name="Y")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tg.SimplificationWarning)
        three_witnesses(Y, X)


def test_modular_read_inside_a_graph():
    W = tg.placeholder((2, 3), name="W", dtype="float64")
    A = tg.placeholder((4, 5), name="A", dtype="float64")
    k = tg.reduce_axis(3, "k")
    S = tg.compute((4, 5), lambda i, j: tg.sum(A[i, j] * W[(i + k + j) % 2, 2 * j % 3], axis=k), name="S")
    Z = tg.compute((4, 5), lambda i, j: tg.tanh(S[i, j]) * A[(i + 1) % 4, j], name="Z")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tg.SimplificationWarning)
        three_witnesses(Z, W, {A: RNG.standard_normal((4, 5))})


def test_the_defect_of_the_first_example_is_in_isls_ast_and_is_caught():
    """isl's AST generator returns a single statement for this domain, although two values of
    i reach some output: validation rejects that scan, and te_grad finds one that passes."""
    dom = isl_bridge.Domain([("p0", tg.ir.Var("j0"), 3), ("p1", tg.ir.Var("j1"), 5)],
                            [("r0", "i"), ("r1", "j")],
                            ["0 <= r0 < 4", "0 <= r1 < 5", "((r0 + r1) mod 3) = p0", "((r1 + 1) mod 5) = p1"])
    plain = dom.scan_in([0, 1])
    assert validate.check_nests(dom, plain) is not None  # isl's own scan misses points
    nests = validate.scan(dom)
    assert validate.check_nests(dom, nests) is None


def test_second_order_through_a_clamped_conv():
    X = tg.placeholder((7,), name="X", dtype="float64")
    K = tg.placeholder((3,), name="K", dtype="float64")
    T = tg.placeholder((6,), name="T", dtype="float64")
    r, l = tg.reduce_axis(3, "r"), tg.reduce_axis(6, "l")

    def clamp(e, lo, hi):
        return tg.minimum(tg.maximum(e, lo), hi)
    conv = tg.compute((7,), lambda i: tg.sum(X[clamp(i + r - 1, 0, 6)] * K[r], axis=r), name="conv")
    loss0 = tg.compute((), lambda: tg.sum((conv[l] - T[l]) * (conv[l] - T[l]), axis=l), name="loss0")
    feed = {X: RNG.standard_normal(7), K: RNG.standard_normal(3), T: RNG.standard_normal(6)}
    for inner in (True, False):
        dX, = tg.differentiate(loss0, [X], simplify=inner)
        dd = tg.compute((7,), lambda i: dX[i] * dX[i], name="dd")
        for outer in (True, False):
            check_gradients(dd, [X, K], feed, simplify=outer)
        H = tg.placeholder((7,), name="H", dtype="float64")
        grads = tg.gradient(dd, [X, K], head=H)
        hv = RNG.standard_normal(7)
        compiled = tg.build(grads, [X, K, T, H])(feed[X], feed[K], feed[T], hv)
        want = tg.evaluate(tg.gradient(dd, [X, K], head=H, simplify=False), {**feed, H: hv})
        for c, w in zip(compiled, want):
            np.testing.assert_allclose(c, w, rtol=1e-10, atol=1e-10)


def test_hessian_vector_product_through_conv2d_and_cross_entropy():
    X = tg.placeholder((2, 2, 5, 5), name="X", dtype="float64")
    W = tg.placeholder((3, 2, 3, 3), name="W", dtype="float64")
    y = tg.placeholder((2,), name="y", dtype="int64")
    Y = tg.nn.conv2d(X, W, stride=2, padding=1)
    logits = tg.nn.flatten(Y)
    V = tg.placeholder((3 * 3 * 3, ), name="V", dtype="float64")
    L = tg.nn.softmax_cross_entropy(tg.nn.dense(logits, tg.compute((1, 27), lambda a, b: V[b], name="Vm")), y)
    dW, = tg.differentiate(L, [W])
    U = tg.placeholder(W.shape, name="U", dtype="float64")
    k = [tg.reduce_axis(n, f"k{d}") for d, n in enumerate(W.shape)]
    gv = tg.compute((), lambda: tg.sum(dW[k[0], k[1], k[2], k[3]] * U[k[0], k[1], k[2], k[3]], axis=k), name="gv")
    feed = {X: RNG.standard_normal(X.shape), W: RNG.standard_normal(W.shape), V: RNG.standard_normal(27),
            U: RNG.standard_normal(W.shape), y: np.array([0, 0])}
    check_gradients(gv, [W], feed, full_limit=0, directions=3)


def test_nan_free_branch_gradients_in_every_stage():
    x = tg.placeholder((2,), name="x", dtype="float64")
    y = tg.compute((2,), lambda i: tg.if_then_else(x[i] > 0.0, tg.sqrt(x[i]), 3.0 * x[i]), name="y")
    xv = np.array([0.0, 1.0])
    for simplify in (False, True):
        g, = tg.gradient(y, [x], simplify=simplify)
        np.testing.assert_array_equal(tg.evaluate([g], {x: xv})[0], [3.0, 0.5])
        np.testing.assert_array_equal(tg.build([g], [x])(xv), [3.0, 0.5])
    p = tg.placeholder((3,), name="p", dtype="float64")
    k = tg.reduce_axis(3, "k")
    H = tg.compute((), lambda: -tg.sum(tg.if_then_else(p[k] > 0.0, p[k] * tg.log(p[k]), 0.0), axis=k), name="H")
    pv = np.array([0.0, 0.25, 0.75])
    want = [0.0, -(np.log(0.25) + 1), -(np.log(0.75) + 1)]
    for simplify in (False, True):
        g, = tg.gradient(H, [p], simplify=simplify)
        np.testing.assert_allclose(tg.evaluate([g], {p: pv})[0], want)
        np.testing.assert_allclose(tg.build([g], [p])(pv), want)


def test_structural_zero_adjoints_never_meet_infinite_partials():
    x3 = tg.placeholder((3,), name="x3", dtype="float64")
    s = tg.compute((3,), lambda i: tg.sqrt(x3[i]), name="s")
    k = tg.reduce_axis((1, 3), "k")
    L = tg.compute((), lambda: tg.sum(s[k], axis=k), name="L")
    xv = np.array([0.0, 1.0, 4.0])
    for simplify in (False, True):
        g, = tg.gradient(L, [x3], simplify=simplify)
        np.testing.assert_array_equal(tg.evaluate([g], {x3: xv})[0], [0.0, 0.5, 0.25])
        np.testing.assert_array_equal(tg.build([g], [x3])(xv), [0.0, 0.5, 0.25])


def test_raw_form_of_a_65k_elementwise_op_stays_in_a_bounded_memory():
    X = tg.placeholder((1, 16, 64, 64), name="X")
    Y = tg.compute(X.shape, lambda a, b, c, d: tg.log(X[a, b, c, d]), name="Y")
    raw, = tg.differentiate(Y, [X], simplify=False)
    x = RNG.uniform(0.5, 2.0, X.shape).astype(np.float32)
    tracemalloc.start()
    g, = tg.evaluate([raw], {X: x})
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    np.testing.assert_allclose(g, 1.0 / x, rtol=1e-6)
    assert peak < 64 << 20, peak


def test_raw_form_that_must_enumerate_is_chunked(monkeypatch):
    import te_grad.evaluator as evaluator
    X = tg.placeholder((40, 30), name="X", dtype="float64")
    Y = tg.compute((20, 30), lambda i, j: X[2 * i, j] * X[2 * i + 1, (j + 1) % 30], name="Y")
    raw, = tg.differentiate(Y, [X], simplify=False)
    simp, = tg.differentiate(Y, [X])
    x = RNG.standard_normal(X.shape)
    want = tg.evaluate([simp], {X: x})[0]
    monkeypatch.setattr(evaluator, "CHUNK_ELEMENTS", 64)
    np.testing.assert_allclose(tg.evaluate([raw], {X: x})[0], want, rtol=1e-12)


def test_cast_with_swapped_arguments_names_the_signature():
    X = tg.placeholder((3,), name="X")
    i = tg.ir.Var("i")
    with pytest.raises(tg.UserError, match=r"tg.cast\(dtype, x\)"):
        tg.cast(X[i], "int64")


def test_compute_index_arguments_are_those_without_defaults():
    X = tg.placeholder((3, 4), name="X")
    M = 2.0
    Y = tg.compute((3, 4), lambda i, j, M=M: X[i, j] * M, name="Y")
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(tg.evaluate([Y], {X: x})[0], 2 * x)
    with pytest.raises(tg.UserError, match="2 dimensions.*1 index"):
        tg.compute((3, 4), lambda i, M=M: X[i, 0], name="Z")


# ---------------------------------------------------------------------------------------------
# translation validation: a wrong simplification cannot be returned
# ---------------------------------------------------------------------------------------------


def test_validation_runs_on_every_scan(monkeypatch):
    calls = []
    real = validate.check_nests

    def counting(domain, nests):
        calls.append(1)
        return real(domain, nests)
    monkeypatch.setattr(validate, "check_nests", counting)
    X = tg.placeholder((4, 8, 8, 8), name="X")
    W = tg.placeholder((8, 8, 3, 3), name="W")
    Y = tg.nn.conv2d(X, W, stride=2, padding=1)
    tg.gradient(Y, [X, W])
    assert len(calls) >= 2


def test_a_bad_scan_falls_back_and_says_so(monkeypatch):
    """Drop one loop nest from every scan isl returns: validation must refuse each of them,
    and the gradient must come back exact, through a form correct by construction."""
    real_scan = isl_bridge.Domain.scan_in

    def lossy(self, order, option=None):  # every nest loses its points where dimension 0 is 0
        return [isl_bridge.LoopNest(n.guards, n.axes, n.filters + [n.values[0] != 0], n.values, n.strided)
                for n in real_scan(self, order, option)]
    monkeypatch.setattr(isl_bridge.Domain, "scan_in", lossy)
    X = tg.placeholder((6,), name="X", dtype="float64")
    Y = tg.compute((4,), lambda i: X[i] * X[i + 2], name="Y")
    H = tg.placeholder((4,), name="H", dtype="float64")
    with pytest.warns(tg.SimplificationWarning, match="dX"):
        res = tg.differentiate(Y, [X], head=H)
    assert res.fallbacks and all("verif" in reason or "miss" in reason for _, reason in res.fallbacks)
    assert "fallback" in tg.show(res[0])
    raw, = tg.differentiate(Y, [X], head=H, simplify=False)
    feed = {X: RNG.standard_normal(6), H: RNG.standard_normal(4)}
    got, want = tg.evaluate([res[0], raw], feed)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    kern = tg.build([res[0]], [X, H])  # the fallback form compiles as it is
    np.testing.assert_allclose(kern(feed[X], feed[H]), want, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# deep expressions
# ---------------------------------------------------------------------------------------------


def _chain(op: str, n: int):
    X = tg.placeholder((8,), name="X", dtype="float64")

    def body(i):
        acc = X[i]
        for k in range(n):
            if op == "add":
                acc = acc + X[(i + k) % 8] * 0.001
            else:
                acc = acc * (1.0 + 0.0001 * X[(i + k) % 8])
        return acc
    return X, tg.compute((8,), body, name="Y")


@pytest.mark.parametrize("op,compiled", [("add", 5000), ("mul", 1000)])
def test_a_chain_of_5000_operations_goes_through_every_stage(op, compiled):
    """Differentiated (raw and simplified), evaluated and compiled at 5,000; the gradient of a
    product chain compiles one kernel stage per piece of the chain, so its compiled gradient is
    checked on a chain of 1,000 (a 5,000 one compiles too, in about two minutes)."""
    X, Y = _chain(op, 5000)
    assert Y.op.body.depth > 5000
    x = RNG.uniform(0.5, 1.0, 8)
    y, = tg.evaluate([Y], {X: x})
    assert np.all(np.isfinite(y))
    g, = tg.gradient(Y, [X])
    gv = tg.evaluate([g], {X: x})[0]
    raw, = tg.gradient(Y, [X], simplify=False)
    np.testing.assert_allclose(tg.evaluate([raw], {X: x})[0], gv, rtol=1e-10)
    np.testing.assert_allclose(tg.build([Y], [X])(x), y, rtol=1e-10)
    assert "Y[i]" in tg.show(Y)
    X, Y = _chain(op, compiled)
    g, = tg.gradient(Y, [X])
    yc, gc = tg.build([Y, g], [X])(x)
    y, gv = tg.evaluate([Y, g], {X: x})
    np.testing.assert_allclose(yc, y, rtol=1e-10)
    np.testing.assert_allclose(gc, gv, rtol=1e-10)


def test_expressions_deeper_than_the_limit_are_a_user_error():
    X = tg.placeholder((2,), name="X")
    i = tg.ir.Var("i")
    acc = X[i]
    with pytest.raises(tg.UserError, match="too deep.*limit"):
        for _ in range(tg.ir.MAX_DEPTH + 1):
            acc = acc + 1.0


# ---------------------------------------------------------------------------------------------
# the IR verifier
# ---------------------------------------------------------------------------------------------


def test_verifier_names_the_stage_and_the_problem():
    X = tg.placeholder((3,), name="X")
    stray = tg.ir.Var("j")
    bad = tg.Tensor("bad", (3,), "float32", tg.ir.ComputeOp((tg.ir.Var("i"),), X[stray]))
    with pytest.raises(tg.InternalError, match="after my pass.*bad.*variable j"):
        tg.verify([bad], "my pass")
    k = tg.reduce_axis(3, "k")
    i = tg.ir.Var("i")
    wrong_dtype = tg.Tensor("w", (3,), "float64", tg.ir.ComputeOp((i,), tg.sum(X[k], axis=k)))
    with pytest.raises(tg.InternalError, match="dtype float32, the tensor float64"):
        tg.verify(wrong_dtype)
    good = tg.compute((3,), lambda i: tg.sum(X[k] * X[i], axis=k))
    tg.verify(good)
    for t in tg.gradient(good, [X]) + tg.gradient(good, [X], simplify=False):
        tg.verify(t)


def test_a_reduction_under_a_guard_is_never_evaluated_where_the_guard_is_false():
    """Lifting ``sum(...)`` out of ``if_then_else(j <= 2, exp(sum(X[2 - j, k])), 0)`` into a
    tensor of its own keeps ``j <= 2`` as its filter: the tensor never reads ``X[-1, k]``
    (an out-of-bounds error when differentiating, a wild read in the kernel), and the
    gradient is exact in every stage."""
    X = tg.placeholder((3, 5), name="X", dtype="float64")
    ids = tg.placeholder((4,), name="ids", dtype="int64")
    k = tg.reduce_axis((0, 5), "k")
    Y = tg.compute((4,), lambda j: tg.if_then_else(j <= 2, tg.exp(tg.sum(X[2 - j, k], axis=k)), 0.0), name="Y")
    three_witnesses(Y, X)
    # the same through a data-dependent read: ids[3] = -1 is never used
    Z = tg.compute((4,), lambda j: tg.if_then_else(j <= 2, tg.sqrt(1.0 + tg.sum(X[ids[j], k] * X[ids[j], k], axis=k)),
                                                   0.0), name="Z")
    three_witnesses(Z, X, {ids: np.array([2, 0, 1, -1])})
