"""The reference evaluator's guarantees: vectorized, exact guards, chunking, dynamic bounds."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import te_grad as tg
import te_grad.evaluator as evaluator
from te_grad import ir

RNG = np.random.default_rng(7)


def ev(tensor, feed):
    return tg.evaluate([tensor], feed)[0]


def rand(shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------
# a realistic op evaluates vectorized
# ---------------------------------------------------------------------------


def test_inline_conv2d_matches_numpy():
    N, C, H, W, F = 4, 32, 32, 32, 32
    X = tg.placeholder((N, C, H, W), name="X")
    K = tg.placeholder((F, C, 3, 3), name="K")
    rc, ry, rx = tg.reduce_axis(C, "rc"), tg.reduce_axis(3, "ry"), tg.reduce_axis(3, "rx")

    def body(n, f, y, x):
        yy, xx = y + ry - 1, x + rx - 1
        inside = tg.all(yy >= 0, yy < H, xx >= 0, xx < W)
        return tg.sum(tg.if_then_else(inside, X[n, rc, yy, xx], 0.0) * K[f, rc, ry, rx],
                      axis=[rc, ry, rx])
    Y = tg.compute((N, F, H, W), body, name="Y")
    x, k = rand((N, C, H, W)), rand((F, C, 3, 3))
    y = ev(Y, {X: x, K: k})
    assert y.shape == (N, F, H, W) and y.dtype == np.float32
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
    ref = np.einsum("ncyxij,fcij->nfyx", win, k.astype(np.float64))
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# guards are exact
# ---------------------------------------------------------------------------


def test_read_under_a_false_guard_never_errors():
    X = tg.placeholder((5,), name="X")
    x = rand((5,))
    shift = tg.compute((5,), lambda i: tg.if_then_else(i > 0, X[i - 1], 0.0))
    np.testing.assert_array_equal(ev(shift, {X: x}), np.concatenate([[0.0], x[:-1]]).astype(np.float32))
    back = tg.compute((5,), lambda i: tg.if_then_else(i + 1 >= 5, -1.0, X[i + 1]))
    np.testing.assert_array_equal(ev(back, {X: x}), np.concatenate([x[1:], [-1.0]]).astype(np.float32))
    # far out of bounds, negative and positive
    far = tg.compute((5,), lambda i: tg.if_then_else(i < 0, X[i - 100], X[i]) +
                     tg.if_then_else(i > 10, X[i * 1000], 0.0))
    np.testing.assert_array_equal(ev(far, {X: x}), x)


def test_and_or_short_circuit():
    X = tg.placeholder((5,), name="X")
    x = np.array([1.0, -2.0, 3.0, 4.0, -5.0], np.float32)
    A = tg.compute((5,), lambda i: (i > 0) & (X[i - 1] > 0))
    np.testing.assert_array_equal(ev(A, {X: x}), [False, True, False, True, True])
    O = tg.compute((5,), lambda i: (i == 0) | (X[i - 1] > 0))
    np.testing.assert_array_equal(ev(O, {X: x}), [True, True, False, True, True])
    # nested: the third operand is only needed where both first ones hold
    N = tg.compute((5,), lambda i: tg.all(i > 1, X[i - 1] > 0, X[i - 2] > 0))
    np.testing.assert_array_equal(ev(N, {X: x}), [False, False, False, False, True])
    # a guard used in a select
    S = tg.compute((5,), lambda i: tg.if_then_else((i < 4) & (X[i + 1] > 0), 1.0, 0.0))
    np.testing.assert_array_equal(ev(S, {X: x}), [0, 1, 1, 0, 0])


def test_where_of_a_reduction_guards_its_body():
    X = tg.placeholder((6,), name="X")
    x = rand((6,))
    k = tg.reduce_axis(3, "k")
    causal = tg.compute((6,), lambda i: tg.sum(X[i - k], axis=k, where=i - k >= 0))
    want = [x[max(0, i - 2):i + 1].sum() for i in range(6)]
    np.testing.assert_allclose(ev(causal, {X: x}), want, rtol=1e-5, atol=1e-6)
    mx = tg.compute((6,), lambda i: tg.max(X[i + k], axis=k, where=i + k < 6))
    want = [x[i:i + 3].max() for i in range(6)]
    np.testing.assert_array_equal(ev(mx, {X: x}), np.array(want, np.float32))


def test_data_dependent_read_under_a_guard():
    W = tg.placeholder((5, 2), name="W")
    ids = tg.placeholder((4,), dtype="int32", name="ids")
    w = rand((5, 2))
    idv = np.array([1, 7, -3, 4], np.int32)
    E = tg.compute((4, 2), lambda i, j: tg.if_then_else((ids[i] >= 0) & (ids[i] < 5), W[ids[i], j], 0.0))
    want = np.stack([w[v] if 0 <= v < 5 else np.zeros(2, np.float32) for v in idv])
    np.testing.assert_array_equal(ev(E, {W: w, ids: idv}), want)


def test_unguarded_out_of_bounds_read_raises():
    X = tg.placeholder((4,), name="X")
    T = tg.compute((4,), lambda i: X[i + 1], name="T")
    with pytest.raises(tg.TeGradError, match=r"outside tensor X of shape \[4\]") as err:
        ev(T, {X: rand((4,))})
    assert isinstance(err.value, tg.UserError) and not isinstance(err.value, tg.InternalError)
    assert "[4]" in str(err.value) and "compute T" in str(err.value)
    L = tg.compute((4,), lambda i: X[i - 1], name="L")
    with pytest.raises(tg.UserError, match=r"index \[-1\] outside tensor X"):
        ev(L, {X: rand((4,))})
    k = tg.reduce_axis(3, "k")
    R = tg.compute((4,), lambda i: tg.sum(X[i + k], axis=k), name="R")
    with pytest.raises(tg.UserError, match="outside tensor X"):
        ev(R, {X: rand((4,))})
    # the guard has to cover the read: the wrong guard still raises
    G = tg.compute((4,), lambda i: tg.if_then_else(i > 0, X[i + 1], 0.0), name="G")
    with pytest.raises(tg.UserError, match="outside tensor X"):
        ev(G, {X: rand((4,))})


def test_data_dependent_out_of_range_id_raises():
    W = tg.placeholder((5, 2), name="W")
    ids = tg.placeholder((3,), dtype="int64", name="ids")
    E = tg.compute((3, 2), lambda i, j: W[ids[i], j], name="E")
    for bad in (5, -1):
        with pytest.raises(tg.UserError, match="outside tensor W") as err:
            ev(E, {W: rand((5, 2)), ids: np.array([0, bad, 2])})
        assert f"[{bad}, 0]" in str(err.value)


def test_integer_division_by_zero():
    A = tg.placeholder((4,), dtype="int32", name="A")
    B = tg.placeholder((4,), dtype="int32", name="B")
    a = np.array([7, -7, 3, 9], np.int32)
    b = np.array([2, 0, -2, 4], np.int32)
    for f in (lambda i: A[i] // B[i], lambda i: A[i] % B[i]):
        T = tg.compute((4,), f, name="T")
        with pytest.raises(tg.UserError, match="division by zero"):
            ev(T, {A: a, B: b})
    G = tg.compute((4,), lambda i: tg.if_then_else(B[i] != 0, A[i] // B[i] + A[i] % B[i], -100))
    assert ev(G, {A: a, B: b}).tolist() == [7 // 2 + 7 % 2, -100, 3 // -2 + 3 % -2, 9 // 4 + 9 % 4]
    k = tg.reduce_axis(4, "k")
    S = tg.compute((), lambda: tg.sum(A[k] // B[k], axis=k, where=B[k] != 0))
    assert ev(S, {A: a, B: b}) == 7 // 2 + 3 // -2 + 9 // 4
    # an index variable divisor that is zero at one point
    V = tg.compute((3,), lambda i: 6 // (i - 1))
    with pytest.raises(tg.UserError, match="division by zero"):
        ev(V, {})


def test_float_division_by_zero_follows_ieee():
    A = tg.placeholder((3,), name="A")
    T = tg.compute((3,), lambda i: A[i] / 0.0)
    with np.errstate(all="raise"):  # the evaluator silences numpy's warnings itself
        out = ev(T, {A: np.array([1.0, -1.0, 0.0], np.float32)})
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])


# ---------------------------------------------------------------------------
# chunking of big reductions
# ---------------------------------------------------------------------------


def _count_parts(monkeypatch):
    calls = []
    orig = evaluator._ExprEvaluator._enter

    def spy(self, *args, **kwargs):
        calls.append(1)
        return orig(self, *args, **kwargs)
    monkeypatch.setattr(evaluator._ExprEvaluator, "_enter", spy)
    return calls


@pytest.mark.parametrize("combiner", ["sum", "max", "min", "prod"])
def test_chunked_reductions_give_the_same_result(monkeypatch, combiner):
    A = tg.placeholder((6, 50, 7), name="A")
    I = tg.placeholder((6, 50, 7), dtype="int64", name="I")
    k, l = tg.reduce_axis(50, "k"), tg.reduce_axis(7, "l")
    fn = getattr(tg, combiner)
    TF = tg.compute((6,), lambda i: fn(A[i, k, l], axis=[k, l]), name="TF")
    TW = tg.compute((6,), lambda i: fn(A[i, k, l], axis=[k, l], where=(k + l) % 3 != i % 3), name="TW")
    TI = tg.compute((6,), lambda i: fn(I[i, k, l], axis=[k, l]), name="TI")
    rng = np.random.default_rng(11)
    a = rng.uniform(0.98, 1.02, size=(6, 50, 7)).astype(np.float32)
    iv = rng.integers(-3, 4, size=(6, 50, 7))
    if combiner == "prod":
        iv = rng.choice([-1, 1], size=(6, 50, 7))
    feed = {A: a, I: iv}
    calls = _count_parts(monkeypatch)
    full = tg.evaluate([TF, TW, TI], feed)
    assert len(calls) == 3  # one part each
    for chunk in (1, 7, 100, 7 * 6 * 3):
        monkeypatch.setattr(evaluator, "CHUNK_ELEMENTS", chunk)
        calls.clear()
        parts = tg.evaluate([TF, TW, TI], feed)
        assert len(calls) > 3
        for f, p in zip(full, parts):
            assert p.dtype == f.dtype
            if combiner in ("max", "min") or p.dtype == np.int64:
                np.testing.assert_array_equal(p, f)
            else:
                np.testing.assert_allclose(p, f, rtol=1e-5)
    np_fn = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[combiner]
    np.testing.assert_allclose(full[0], np_fn(a.astype(np.float64), axis=(1, 2)), rtol=1e-4)
    np.testing.assert_array_equal(full[2], np_fn(iv, axis=(1, 2)))


def test_chunked_nested_and_guarded_reduction(monkeypatch):
    X = tg.placeholder((8, 9), name="X")
    k, l = tg.reduce_axis(9, "k"), tg.reduce_axis(9, "l")
    T = tg.compute((8,), lambda i: tg.sum(tg.if_then_else(k > 0, X[i, k - 1], 0.0)
                                          * tg.max(X[i, l] - X[i, k], axis=l), axis=k))
    x = rand((8, 9))
    full = ev(T, {X: x})
    monkeypatch.setattr(evaluator, "CHUNK_ELEMENTS", 3)
    np.testing.assert_allclose(ev(T, {X: x}), full, rtol=1e-5, atol=1e-6)
    shifted = np.concatenate([np.zeros((8, 1), np.float32), x[:, :-1]], axis=1)
    inner = x.max(axis=1, keepdims=True) - x
    np.testing.assert_allclose(full, (shifted * inner).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_big_reduction_is_chunked_by_default():
    X = tg.placeholder((256, 256), name="X")
    k = tg.reduce_axis(256, "k")
    n = tg.reduce_axis(256, "n")
    # domain of 256**3 = 16.7M points, above the default chunk size
    T = tg.compute((256,), lambda i: tg.sum(X[i, k] * X[k, n], axis=[k, n]))
    x = RNG.integers(-2, 3, size=(256, 256)).astype(np.float32)
    np.testing.assert_array_equal(ev(T, {X: x}), (x @ x).sum(axis=1))


# ---------------------------------------------------------------------------
# reduce axes whose bounds depend on outer variables
# ---------------------------------------------------------------------------


def axis(name, lo, hi):
    return ir.ReduceAxis(name, "int64", tg.const(lo) if isinstance(lo, int) else lo,
                         tg.const(hi) if isinstance(hi, int) else hi)


def test_triangular_sum(monkeypatch):
    X = tg.placeholder((6,), name="X")
    x = rand((6,))
    T = tg.compute((6,), lambda i: (lambda k: tg.sum(X[k], axis=k))(axis("k", 0, i + 1)))
    np.testing.assert_allclose(ev(T, {X: x}), np.cumsum(x), rtol=1e-5, atol=1e-6)
    R = tg.compute((6,), lambda i: (lambda k: tg.sum(X[k], axis=k))(axis("k", i, 6)))
    np.testing.assert_allclose(ev(R, {X: x}), np.cumsum(x[::-1])[::-1], rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(evaluator, "CHUNK_ELEMENTS", 2)
    np.testing.assert_allclose(ev(T, {X: x}), np.cumsum(x), rtol=1e-5, atol=1e-6)


def test_window_bounds_and_empty_rows():
    X = tg.placeholder((7,), name="X")
    x = rand((7,))

    def win(i):
        k = axis("k", tg.maximum(i - 1, 0), tg.minimum(i + 2, 7))
        return tg.max(X[k], axis=k)
    T = tg.compute((7,), win)
    np.testing.assert_array_equal(ev(T, {X: x}), [x[max(i - 1, 0):i + 2].max() for i in range(7)])
    # hi = i: row 0 is empty and gives the identity; the read X[k] never sees k = 7
    M = tg.compute((7,), lambda i: (lambda k: tg.min(X[k], axis=k))(axis("k", 0, i)))
    out = ev(M, {X: x})
    assert out[0] == np.inf
    np.testing.assert_array_equal(out[1:], np.minimum.accumulate(x)[:-1])
    P = tg.compute((7,), lambda i: (lambda k: tg.prod(2.0 + 0.0 * k, axis=k))(axis("k", i, 2 * i)))
    np.testing.assert_array_equal(ev(P, {X: x}), [2.0 ** i for i in range(7)])


def test_bounds_depending_on_two_outer_variables():
    X = tg.placeholder((5, 5), name="X")
    x = rand((5, 5))
    B = tg.compute((5, 5), lambda i, j: (lambda k: tg.sum(X[i, k], axis=k))(
        axis("k", tg.minimum(i, j), tg.maximum(i, j) + 1)))
    want = np.array([[x[i, min(i, j):max(i, j) + 1].sum() for j in range(5)] for i in range(5)])
    np.testing.assert_allclose(ev(B, {X: x}), want, rtol=1e-5, atol=1e-6)


def test_bound_of_a_later_axis_uses_an_earlier_one(monkeypatch):
    X = tg.placeholder((5, 5), name="X")
    x = rand((5, 5))
    k1 = tg.reduce_axis(5, "k1")
    k2 = axis("k2", k1, 5)
    T = tg.compute((), lambda: tg.sum(X[k1, k2], axis=[k1, k2]))
    np.testing.assert_allclose(ev(T, {X: x}), np.triu(x).sum(), rtol=1e-5)
    monkeypatch.setattr(evaluator, "CHUNK_ELEMENTS", 1)
    np.testing.assert_allclose(ev(T, {X: x}), np.triu(x).sum(), rtol=1e-5)


def test_inner_reduction_bounds_use_the_outer_reduce_axis(monkeypatch):
    X = tg.placeholder((4, 5), name="X")
    k = tg.reduce_axis(4, "k")

    def body(i):
        l = axis("l", 0, k + 1)
        return tg.sum(X[k, i] * tg.sum(X[l, i], axis=l), axis=k)
    T = tg.compute((5,), body)
    x = rand((4, 5))
    want = (x.astype(np.float64) * np.cumsum(x, axis=0)).sum(axis=0)
    np.testing.assert_allclose(ev(T, {X: x}), want, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(evaluator, "CHUNK_ELEMENTS", 1)
    np.testing.assert_allclose(ev(T, {X: x}), want, rtol=1e-5, atol=1e-5)


def test_data_dependent_bound():
    X = tg.placeholder((4, 5), name="X")
    n = tg.placeholder((5,), dtype="int32", name="n")
    T = tg.compute((5,), lambda i: (lambda k: tg.sum(X[k, i], axis=k))(axis("k", 0, n[i])))
    x = rand((4, 5))
    nv = np.array([0, 4, 2, 1, 3], np.int32)
    want = [x[:nv[i], i].sum() for i in range(5)]
    np.testing.assert_allclose(ev(T, {X: x, n: nv}), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(tg.UserError, match="outside tensor X"):
        ev(T, {X: x, n: np.array([0, 5, 0, 0, 0], np.int32)})


def test_guarded_read_of_an_empty_tensor():
    E = tg.placeholder((0, 3), name="E")
    T = tg.compute((3,), lambda i: tg.if_then_else(i < 0, E[i, i], 1.0))
    assert ev(T, {E: np.zeros((0, 3), np.float32)}).tolist() == [1.0, 1.0, 1.0]
    U = tg.compute((3,), lambda i: E[0 * i, i] + 1.0)
    with pytest.raises(tg.UserError, match="outside tensor E"):
        ev(U, {E: np.zeros((0, 3), np.float32)})
    k = tg.reduce_axis(0, "k")
    S = tg.compute((3,), lambda i: tg.sum(E[k, i], axis=k))
    assert ev(S, {E: np.zeros((0, 3), np.float32)}).tolist() == [0.0, 0.0, 0.0]


def test_identity_values():
    assert evaluator.identity_of("sum", "float32") == 0
    assert evaluator.identity_of("prod", "int32") == 1
    assert evaluator.identity_of("max", "float64") == -np.inf
    assert evaluator.identity_of("min", "float32") == np.inf
    assert evaluator.identity_of("max", "int32") == np.iinfo(np.int32).min
    assert evaluator.identity_of("min", "int64") == np.iinfo(np.int64).max


# ---------------------------------------------------------------------------
# the evaluate() contract
# ---------------------------------------------------------------------------


def test_evaluate_returns_fresh_arrays_in_order():
    A = tg.placeholder((3,), name="A")
    B = tg.compute((3,), lambda i: A[i] + 1.0, name="B")
    C = tg.compute((3,), lambda i: B[i] * 2.0, name="C")
    a = np.array([1.0, 2.0, 3.0], np.float32)
    c, b, a_out = tg.evaluate([C, B, A], {A: a})
    assert c.tolist() == [4.0, 6.0, 8.0] and b.tolist() == [2.0, 3.0, 4.0]
    np.testing.assert_array_equal(a_out, a)
    a_out[0] = 100.0
    b[0] = 100.0
    assert a[0] == 1.0
    assert tg.evaluate([C], {A: a})[0].tolist() == [4.0, 6.0, 8.0]
    assert tg.evaluate((B,), {A: a})[0].tolist() == [2.0, 3.0, 4.0]
    assert tg.evaluate([], {}) == []


def test_feed_values_are_converted():
    A = tg.placeholder((2, 2), dtype="float64", name="A")
    S = tg.placeholder((), dtype="int32", name="S")
    T = tg.compute((2, 2), lambda i, j: A[i, j] * S[()])
    out = ev(T, {A: [[1, 2], [3, 4]], S: 3})
    assert out.dtype == np.float64 and out.tolist() == [[3, 6], [9, 12]]


def test_unused_placeholders_in_the_feed_are_ignored():
    A = tg.placeholder((2,), name="A")
    U = tg.placeholder((5,), name="U")
    T = tg.compute((2,), lambda i: A[i] + 1.0)
    # even a value that would not fit U is fine: U is not needed
    out = ev(T, {A: np.zeros(2, np.float32), U: np.zeros((3, 3), np.int64)})
    assert out.tolist() == [1.0, 1.0]


def test_outputs_without_inputs():
    T = tg.compute((2, 3), lambda i, j: tg.cast("float32", i - j))
    assert ev(T, {}).tolist() == [[0, -1, -2], [1, 0, -1]]


# ---------------------------------------------------------------------------
# property: integer index arithmetic agrees with Python
# ---------------------------------------------------------------------------

N_I, N_J = 5, 4


def _leaves():
    return st.one_of(st.sampled_from(["i", "j"]), st.integers(-6, 6))


def _trees():
    ops = st.sampled_from(["+", "-", "*", "//", "%", "min", "max", "neg"])
    return st.recursive(
        _leaves(),
        lambda sub: st.one_of(st.tuples(ops, sub, sub)),
        max_leaves=8)


def _build(t, i, j, lift=lambda v: v):
    """The tree as a Python int (``lift`` identity) or as a te_grad expression (``lift=tg.const``)."""
    if t == "i":
        return i
    if t == "j":
        return j
    if isinstance(t, int):
        return lift(t)
    op, a, b = t
    x = _build(a, i, j, lift)
    if op == "neg":  # unary: the second subtree is not used
        return -x
    y = _build(b, i, j, lift)
    symbolic = isinstance(x, ir.Expr)
    if op == "min":
        return tg.minimum(x, y) if symbolic else min(x, y)
    if op == "max":
        return tg.maximum(x, y) if symbolic else max(x, y)
    return {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y,
            "//": lambda: x // y, "%": lambda: x % y}[op]()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_trees())
def test_random_integer_expressions_match_python(tree):
    want, python_error = [], False
    try:
        for i in range(N_I):
            want.append([_build(tree, i, j) for j in range(N_J)])
    except ZeroDivisionError:
        python_error = True
    try:
        T = tg.compute((N_I, N_J), lambda i, j: _build(tree, i, j, tg.const), name="T")
        got = ev(T, {})
    except tg.UserError as err:
        assert python_error, f"te_grad raised {err} but Python did not"
        assert "division by zero" in str(err)
        return
    assert not python_error, "Python divided by zero but te_grad did not complain"
    assert got.dtype == np.int64
    assert got.tolist() == want


# ---------------------------------------------------------------------------------------------
# pinned axes: a solution is evaluated only where the earlier axes lie in their ranges
# ---------------------------------------------------------------------------------------------

def _pinned_gather(n_index):
    """Y[i] = sum(2 X[r] for k in range(3) for r in range(5) if (k == i) & (I[k] == r)), Y of
    shape (4,): k is pinned to i, r to I[k]; at i = 3 the domain is empty (k < 3)."""
    X = tg.placeholder((5,), name="X", dtype="float64")
    I = tg.placeholder((n_index,), name="I", dtype="int32")
    k, r = tg.reduce_axis((0, 3), "k"), tg.reduce_axis((0, 5), "r")
    Y = tg.compute((4,), lambda i: tg.sum(2.0 * X[r], axis=[k, r], where=(k == i) & (I[k] == r)), name="Y")
    return X, I, Y


def test_pinned_solution_is_not_read_outside_the_domain():
    X, I, Y = _pinned_gather(3)
    x = RNG.uniform(-1, 1, 5)
    for iv in (np.array([4, 0, 2], np.int32), np.array([1, 7, -2], np.int32)):  # 7, -2: r's range masks them
        want = np.zeros(4)
        for i in range(4):
            for k in range(3):
                for r in range(5):
                    if k == i and iv[k] == r:
                        want[i] += 2 * x[r]
        np.testing.assert_allclose(tg.evaluate([Y], {X: x, I: iv})[0], want, rtol=1e-15)
        np.testing.assert_allclose(tg.build([Y], [X, I])(x, iv), want, rtol=1e-15)


def test_pinned_solution_out_of_bounds_inside_the_domain_is_still_an_error():
    X, I, Y = _pinned_gather(2)  # k = 2 (at i = 2) is in the domain and reads I[2]
    with pytest.raises(tg.UserError, match=r"read I\[k\].*reaches index \[2\].*shape \[2\]"):
        tg.evaluate([Y], {X: RNG.uniform(-1, 1, 5), I: np.array([0, 1], np.int32)})


def test_enumerated_axis_bounds_are_not_read_where_an_earlier_range_is_empty():
    """k in (0, i) is empty at i = 0, so r in (0, P[i - 1]) is never entered there."""
    P = tg.placeholder((3,), name="P", dtype="int32")
    X = tg.placeholder((4,), name="X", dtype="float64")

    def body(i):  # bounds that depend on i: built from the IR (the DSL's axes have constant bounds)
        k = ir.ReduceAxis("k", "int64", tg.const(0), i)
        r = ir.ReduceAxis("r", "int64", tg.const(0), ir.Cast("int64", P[i - 1]))
        return ir.Reduce("sum", X[r] + 0.0 * ir.Cast("float64", k), (k, r), None)
    Y = tg.compute((4,), body, name="Y")
    x, pv = RNG.uniform(-1, 1, 4), np.array([2, 0, 4], np.int32)
    want = [sum(x[r] for k in range(i) for r in range(pv[i - 1])) if i else 0.0 for i in range(4)]
    np.testing.assert_allclose(tg.evaluate([Y], {P: pv, X: x})[0], want, rtol=1e-14)


def test_raw_second_order_gradient_of_a_gather():
    """Z[i] = X[i] X[J[i]] with Z shorter than X: the raw second-order gradient pins i to j
    (i < 2 masks j) and j_1 to J[i]."""
    J = tg.placeholder((3,), name="J", dtype="int32")
    X = tg.placeholder((5,), name="X", dtype="float64")
    V = tg.placeholder((5,), name="V", dtype="float64")
    for name, f in (("mul", lambda a, b: a * b), ("tanh", lambda a, b: tg.tanh(b) * a)):
        Z = tg.compute((2,), lambda i: f(X[i], X[J[i]]), name="Z")
        dX = tg.differentiate(Z, [X], simplify=False)[0]
        kk = tg.reduce_axis(5, "kk")
        S = tg.compute((), lambda: tg.sum(dX[kk] * V[kk], axis=kk), name="S")
        d2 = tg.differentiate(S, [X], simplify=False)[0]
        x, jv, v = RNG.uniform(-1, 1, 5), np.array([4, 0, 3], np.int32), RNG.uniform(-1, 1, 5)
        feed = {X: x, J: jv, V: v}
        got = tg.evaluate([d2], feed)[0]
        # S = sum_i V[i] dZ/da(x_i, x_J[i]) + V[J[i]] dZ/db(...): its gradient by hand
        want = np.zeros(5)
        for i in range(2):
            a, b, j = x[i], x[jv[i]], jv[i]
            if name == "mul":  # a * b: S = sum_i V[i] b + V[j] a
                want[j] += v[i]
                want[i] += v[j]
            else:  # tanh(b) a: S = sum_i V[i] tanh(b) + V[j] a (1 - tanh(b)^2)
                t = np.tanh(b)
                want[j] += v[i] * (1 - t * t) - v[j] * a * 2 * t * (1 - t * t)
                want[i] += v[j] * (1 - t * t)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(tg.build([d2], [X, J, V])(x, jv, v), want, rtol=1e-12, atol=1e-14)
