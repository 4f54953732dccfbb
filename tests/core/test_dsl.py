"""The DSL: every construct, evaluated with the reference evaluator against numpy."""
import math

import numpy as np
import pytest

import te_grad as tg
from te_grad import dtypes, ir

RNG = np.random.default_rng(1234)


def ev(tensor, feed):
    return tg.evaluate([tensor], feed)[0]


def rand(shape, dtype="float32", lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


# ---------------------------------------------------------------------------
# placeholders and compute
# ---------------------------------------------------------------------------


def test_placeholder_defaults():
    A = tg.placeholder((2, 3))
    assert A.dtype == "float32"
    assert A.shape == (2, 3) and A.ndim == 2 and A.size == 6
    assert A.is_placeholder
    assert tg.placeholder(5, name="v").shape == (5,)
    assert tg.placeholder((2,), dtype=np.float64).dtype == "float64"
    assert tg.placeholder((2,), dtype=np.dtype("int32")).dtype == "int32"


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool"])
def test_placeholder_dtypes_round_trip(dtype):
    A = tg.placeholder((2, 3), dtype=dtype, name="A")
    assert A.dtype == dtype
    a = RNG.integers(-5, 5, size=(2, 3)).astype(dtype)
    B = tg.compute((2, 3), lambda i, j: A[i, j], name="B")
    assert B.dtype == dtype
    out = ev(B, {A: a})
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, a)


def test_scalar_placeholder_and_scalar_compute():
    S = tg.placeholder((), name="S")
    assert S.shape == () and S.ndim == 0 and S.size == 1
    T = tg.compute((), lambda: S[()] * 2.0 + 1.0, name="T")
    assert T.shape == ()
    out = ev(T, {S: np.array(3.0, np.float32)})
    assert out.shape == () and out.dtype == np.float32
    assert out == 7.0
    # a Python scalar is accepted as the feed of a 0-d placeholder
    assert ev(T, {S: 0.5}) == 2.0
    # a computed 0-d tensor read by another compute
    X = tg.placeholder((4,), name="X")
    k = tg.reduce_axis(4, "k")
    total = tg.compute((), lambda: tg.sum(X[k], axis=k), name="total")
    N = tg.compute((4,), lambda i: X[i] / total[()], name="N")
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    t, n = tg.evaluate([total, N], {X: x})
    assert t.shape == () and t == 10.0
    np.testing.assert_allclose(n, x / 10.0)


def test_compute_of_every_rank():
    X0 = tg.placeholder((), name="X0")
    X1 = tg.placeholder((3,), name="X1")
    X2 = tg.placeholder((3, 4), name="X2")
    X3 = tg.placeholder((2, 3, 4), name="X3")
    X4 = tg.placeholder((2, 3, 4, 5), name="X4")
    T0 = tg.compute((), lambda: X0[()] - 1.0)
    T1 = tg.compute((3,), lambda i: X1[i] * i)
    T2 = tg.compute((3, 4), lambda i, j: X2[i, j] + i * 10 - j)
    T3 = tg.compute((2, 3, 4), lambda a, b, c: X3[a, b, c] * (a + 1) - c)
    T4 = tg.compute((2, 3, 4, 5), lambda a, b, c, d: X4[a, b, c, d] + a * 1000 + b * 100 + c * 10 + d)
    x = [rand(t.shape) for t in (X0, X1, X2, X3, X4)]
    outs = tg.evaluate([T0, T1, T2, T3, T4], dict(zip((X0, X1, X2, X3, X4), x)))
    g = np.indices
    np.testing.assert_allclose(outs[0], x[0] - 1.0)
    np.testing.assert_allclose(outs[1], x[1] * np.arange(3), rtol=1e-6)
    i, j = g((3, 4))
    np.testing.assert_allclose(outs[2], x[2] + i * 10 - j, rtol=1e-6)
    a, b, c = g((2, 3, 4))
    np.testing.assert_allclose(outs[3], x[3] * (a + 1) - c, rtol=1e-6)
    a, b, c, d = g((2, 3, 4, 5))
    np.testing.assert_allclose(outs[4], x[4] + a * 1000 + b * 100 + c * 10 + d, rtol=1e-6)
    for t, o in zip((T0, T1, T2, T3, T4), outs):
        assert o.shape == t.shape and o.dtype == np.float32


def test_axis_names_come_from_the_lambda():
    A = tg.placeholder((2, 3), name="A")
    T = tg.compute((2, 3), lambda row, col: A[row, col], name="T")
    assert [ax.name for ax in T.op.axes] == ["row", "col"]
    assert all(isinstance(ax, ir.Var) and ax.dtype == "int64" for ax in T.op.axes)
    assert "T[row, col] = A[row, col]" in tg.show(T)

    def named(batch, chan):
        return A[batch, chan] * 2.0
    U = tg.compute((2, 3), named, name="U")
    assert [ax.name for ax in U.op.axes] == ["batch", "chan"]
    V = tg.compute((2, 3), lambda *idx: A[idx], name="V")  # variadic: generated names
    assert [ax.name for ax in V.op.axes] == ["i0", "i1"]
    a = rand((2, 3))
    np.testing.assert_array_equal(ev(V, {A: a}), a)


def test_compute_dtype_argument_casts_the_body():
    A = tg.placeholder((3,), name="A")
    T = tg.compute((3,), lambda i: A[i] * 2, dtype="float64")
    assert T.dtype == "float64"
    a = rand((3,))
    out = ev(T, {A: a})
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, a.astype(np.float64) * 2)


def test_compute_of_index_arithmetic_and_python_scalars():
    T = tg.compute((3, 4), lambda i, j: i * 4 + j)
    assert T.dtype == "int64"
    np.testing.assert_array_equal(ev(T, {}), np.arange(12).reshape(3, 4))
    C = tg.compute((2, 2), lambda i, j: 1.5)
    assert C.dtype == "float32"
    np.testing.assert_array_equal(ev(C, {}), np.full((2, 2), 1.5, np.float32))


def test_zero_size_tensors():
    A = tg.placeholder((0, 3), name="A")
    T = tg.compute((0, 3), lambda i, j: A[i, j] + 1.0)
    out = ev(T, {A: np.zeros((0, 3), np.float32)})
    assert out.shape == (0, 3) and out.dtype == np.float32


# ---------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------


def test_reduce_axis_forms():
    k = tg.reduce_axis(5)
    assert isinstance(k, ir.ReduceAxis) and k.name == "k"
    assert k.lo.value == 0 and k.hi.value == 5 and k.extent == 5 and k.dtype == "int64"
    r = tg.reduce_axis((2, 5), name="r")
    assert r.name == "r" and r.lo.value == 2 and r.hi.value == 5 and r.extent == 3
    assert tg.reduce_axis((3, 3)).extent == 0

    A = tg.placeholder((4, 6), name="A")
    T = tg.compute((4,), lambda i: tg.sum(A[i, r], axis=r))
    a = rand((4, 6))
    np.testing.assert_allclose(ev(T, {A: a}), a[:, 2:5].sum(axis=1), rtol=1e-5)


COMBINERS = [(tg.sum, np.sum), (tg.max, np.max), (tg.min, np.min), (tg.prod, np.prod)]


@pytest.mark.parametrize("tg_fn,np_fn", COMBINERS, ids=["sum", "max", "min", "prod"])
def test_reduction_over_one_axis(tg_fn, np_fn):
    A = tg.placeholder((3, 5), name="A")
    k = tg.reduce_axis(5, "k")
    T = tg.compute((3,), lambda i: tg_fn(A[i, k], axis=k))
    a = rand((3, 5), lo=0.5, hi=1.5)
    np.testing.assert_allclose(ev(T, {A: a}), np_fn(a, axis=1), rtol=1e-5)


@pytest.mark.parametrize("tg_fn,np_fn", COMBINERS, ids=["sum", "max", "min", "prod"])
def test_reduction_over_a_list_of_axes(tg_fn, np_fn):
    A = tg.placeholder((2, 3, 4), name="A")
    k = tg.reduce_axis(3, "k")
    l = tg.reduce_axis(4, "l")
    T = tg.compute((2,), lambda i: tg_fn(A[i, k, l], axis=[k, l]))
    a = rand((2, 3, 4), lo=0.5, hi=1.5)
    np.testing.assert_allclose(ev(T, {A: a}), np_fn(a, axis=(1, 2)), rtol=1e-5)
    # a tuple of axes works too, and the axes may be listed in any order
    U = tg.compute((2,), lambda i: tg_fn(A[i, k, l], axis=(l, k)))
    np.testing.assert_allclose(ev(U, {A: a}), np_fn(a, axis=(1, 2)), rtol=1e-5)


@pytest.mark.parametrize("tg_fn,np_fn,ident", [(tg.sum, np.sum, 0.0), (tg.max, np.max, -np.inf),
                                                (tg.min, np.min, np.inf), (tg.prod, np.prod, 1.0)],
                         ids=["sum", "max", "min", "prod"])
def test_reduction_with_where(tg_fn, np_fn, ident):
    A = tg.placeholder((4, 6), name="A")
    k = tg.reduce_axis(6, "k")
    # row i keeps the columns k < i: row 0 is empty and gives the identity
    T = tg.compute((4,), lambda i: tg_fn(A[i, k], axis=k, where=k < i))
    a = rand((4, 6), lo=0.5, hi=1.5)
    want = [ident if i == 0 else np_fn(a[i, :i]) for i in range(4)]
    np.testing.assert_allclose(ev(T, {A: a}), np.array(want, np.float32), rtol=1e-5)
    # a data-dependent condition
    U = tg.compute((4,), lambda i: tg_fn(A[i, k], axis=k, where=A[i, k] > 1.0))
    want = [np_fn(row[row > 1.0]) if (row > 1.0).any() else ident for row in a]
    np.testing.assert_allclose(ev(U, {A: a}), np.array(want, np.float32), rtol=1e-5)


@pytest.mark.parametrize("combiner,dtype,want", [
    ("sum", "float32", 0.0), ("prod", "float32", 1.0),
    ("max", "float32", -np.inf), ("min", "float32", np.inf),
    ("max", "float64", -np.inf), ("min", "float64", np.inf),
    ("sum", "int32", 0), ("prod", "int64", 1),
    ("max", "int32", np.iinfo(np.int32).min), ("min", "int32", np.iinfo(np.int32).max),
    ("max", "int64", np.iinfo(np.int64).min), ("min", "int64", np.iinfo(np.int64).max),
])
def test_empty_reduction_gives_the_identity(combiner, dtype, want):
    A = tg.placeholder((3, 4), dtype=dtype, name="A")
    fn = getattr(tg, combiner)
    empty = tg.reduce_axis((2, 2), "e")
    T = tg.compute((3,), lambda i: fn(A[i, empty], axis=empty))
    full = tg.reduce_axis(4, "f")
    U = tg.compute((3,), lambda i: fn(A[i, full], axis=full, where=full > 10))
    a = RNG.integers(1, 5, size=(3, 4)).astype(dtype)
    t, u = tg.evaluate([T, U], {A: a})
    for out in (t, u):
        assert out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(out, np.full(3, want, dtype))


def test_nested_reductions_with_different_axes():
    A = tg.placeholder((3, 4), name="A")
    B = tg.placeholder((4, 5), name="B")
    k = tg.reduce_axis(4, "k")
    l = tg.reduce_axis(5, "l")
    # the inner reduction depends on the outer reduce axis k
    T = tg.compute((3,), lambda i: tg.sum(A[i, k] * tg.max(B[k, l] + k, axis=l), axis=k))
    a, b = rand((3, 4)), rand((4, 5))
    inner = (b + np.arange(4)[:, None]).max(axis=1)
    np.testing.assert_allclose(ev(T, {A: a, B: b}), (a * inner[None, :]).sum(axis=1), rtol=1e-5)
    # a reduction in the where= of another
    m = tg.reduce_axis(5, "m")
    U = tg.compute((3,), lambda i: tg.sum(A[i, k], axis=k, where=tg.min(B[k, m], axis=m) > -1.0))
    keep = b.min(axis=1) > -1.0
    np.testing.assert_allclose(ev(U, {A: a, B: b}), (a * keep[None, :]).sum(axis=1), rtol=1e-5)


def test_reductions_inside_arithmetic():
    X = tg.placeholder((3, 5), name="X")
    k = tg.reduce_axis(5, "k")
    k2 = tg.reduce_axis(5, "k2")
    # a softmax written inline: two different reductions in one body
    S = tg.compute((3, 5), lambda i, j: tg.exp(X[i, j] - tg.max(X[i, k], axis=k))
                   / tg.sum(tg.exp(X[i, k2] - tg.max(X[i, k], axis=k)), axis=k2))
    x = rand((3, 5))
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(ev(S, {X: x}), e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    # the same axis object in two sibling reductions
    R = tg.compute((3,), lambda i: tg.sum(X[i, k], axis=k) * 2.0 - tg.min(X[i, k], axis=k) + 1.0)
    np.testing.assert_allclose(ev(R, {X: x}), x.sum(1) * 2 - x.min(1) + 1, rtol=1e-5)


def test_sum_of_a_constant_counts_the_domain():
    k = tg.reduce_axis(7, "k")
    T = tg.compute((3,), lambda i: tg.sum(1, axis=k, where=k <= i))
    assert T.dtype == "int64"
    np.testing.assert_array_equal(ev(T, {}), [1, 2, 3])


def test_integer_reductions_keep_their_dtype():
    A = tg.placeholder((3, 4), dtype="int32", name="A")
    k = tg.reduce_axis(4, "k")
    T = tg.compute((3,), lambda i: tg.sum(A[i, k], axis=k))
    M = tg.compute((3,), lambda i: tg.max(A[i, k], axis=k))
    a = RNG.integers(-100, 100, size=(3, 4)).astype(np.int32)
    t, m = tg.evaluate([T, M], {A: a})
    assert t.dtype == np.int32 and m.dtype == np.int32
    np.testing.assert_array_equal(t, a.sum(axis=1))
    np.testing.assert_array_equal(m, a.max(axis=1))


# ---------------------------------------------------------------------------
# scalar operations
# ---------------------------------------------------------------------------


def test_arithmetic_operators():
    A = tg.placeholder((6,), name="A")
    B = tg.placeholder((6,), name="B")
    a = rand((6,), lo=0.5, hi=2.0)
    b = rand((6,), lo=0.5, hi=2.0)
    cases = [
        (lambda i: A[i] + B[i], a + b),
        (lambda i: A[i] - B[i], a - b),
        (lambda i: A[i] * B[i], a * b),
        (lambda i: A[i] / B[i], a / b),
        (lambda i: A[i] ** B[i], a ** b),
        (lambda i: -A[i], -a),
        (lambda i: +A[i], a),
        (lambda i: 2.0 - A[i], 2.0 - a),
        (lambda i: 3 / A[i], 3 / a),
        (lambda i: 2 ** A[i], 2.0 ** a),
        (lambda i: A[i] ** 2, a ** 2),
        (lambda i: A[i] - B[i] - A[i] * B[i] / (A[i] + 1), a - b - a * b / (a + 1)),
    ]
    for f, want in cases:
        T = tg.compute((6,), f)
        assert T.dtype == "float32"
        np.testing.assert_allclose(ev(T, {A: a, B: b}), want, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_floordiv_and_mod_follow_python_for_negative_operands(dtype):
    vals = list(range(-7, 8))
    divs = [d for d in range(-4, 5) if d != 0]
    pairs = [(x, d) for x in vals for d in divs]
    A = tg.placeholder((len(pairs),), dtype=dtype, name="A")
    B = tg.placeholder((len(pairs),), dtype=dtype, name="B")
    a = np.array([p[0] for p in pairs], dtype)
    b = np.array([p[1] for p in pairs], dtype)
    Q = tg.compute(A.shape, lambda i: A[i] // B[i])
    R = tg.compute(A.shape, lambda i: A[i] % B[i])
    Q3 = tg.compute(A.shape, lambda i: A[i] // -3)
    R3 = tg.compute(A.shape, lambda i: A[i] % -3)
    L = tg.compute(A.shape, lambda i: 7 // B[i] + (-7) % B[i])
    q, r, q3, r3, lo = tg.evaluate([Q, R, Q3, R3, L], {A: a, B: b})
    assert q.dtype == np.dtype(dtype) and r.dtype == np.dtype(dtype)
    assert q.tolist() == [x // d for x, d in pairs]
    assert r.tolist() == [x % d for x, d in pairs]
    assert q3.tolist() == [x // -3 for x, _ in pairs]
    assert r3.tolist() == [x % -3 for x, _ in pairs]
    assert lo.tolist() == [7 // d + (-7) % d for _, d in pairs]


def test_floordiv_and_mod_of_index_variables():
    T = tg.compute((12,), lambda i: (i - 6) // 4 * 100 + (i - 6) % 4)
    assert ev(T, {}).tolist() == [(i - 6) // 4 * 100 + (i - 6) % 4 for i in range(12)]


INTRINSICS = [
    ("exp", tg.exp, np.exp, (-2, 2)),
    ("log", tg.log, np.log, (0.1, 3)),
    ("sqrt", tg.sqrt, np.sqrt, (0, 4)),
    ("tanh", tg.tanh, np.tanh, (-3, 3)),
    ("sigmoid", tg.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-5, 5)),
    ("abs", tg.abs, np.abs, (-2, 2)),
    ("sin", tg.sin, np.sin, (-3, 3)),
    ("cos", tg.cos, np.cos, (-3, 3)),
    ("erf", tg.erf, np.vectorize(math.erf), (-2, 2)),
    ("floor", tg.floor, np.floor, (-3, 3)),
    ("ceil", tg.ceil, np.ceil, (-3, 3)),
    ("trunc", tg.trunc, np.trunc, (-3, 3)),
]


@pytest.mark.parametrize("name,tg_fn,np_fn,dom", INTRINSICS, ids=[c[0] for c in INTRINSICS])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_intrinsics(name, tg_fn, np_fn, dom, dtype):
    X = tg.placeholder((11,), dtype=dtype, name="X")
    x = np.linspace(dom[0], dom[1], 11).astype(dtype)
    T = tg.compute((11,), lambda i: tg_fn(X[i]))
    assert T.dtype == dtype
    out = ev(T, {X: x})
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(out, np_fn(x.astype(np.float64)), rtol=1e-5, atol=1e-6)
    # tg.call by name builds the same thing
    U = tg.compute((11,), lambda i: tg.call(name, X[i]))
    np.testing.assert_array_equal(ev(U, {X: x}), out)


@pytest.mark.parametrize("name,tg_fn,np_fn,dom", INTRINSICS, ids=[c[0] for c in INTRINSICS])
def test_intrinsics_of_a_scalar(name, tg_fn, np_fn, dom):
    """0-d operands (a constant, a read at a constant index) evaluate too."""
    X = tg.placeholder((3,), name="X")
    x = np.array([dom[0], (dom[0] + dom[1]) / 2, dom[1]], np.float32)
    T = tg.compute((), lambda: tg_fn(X[1]))
    C = tg.compute((2,), lambda i: tg_fn(tg.const(0.5)) + X[i])
    t, c = tg.evaluate([T, C], {X: x})
    np.testing.assert_allclose(t, np_fn(np.float64(x[1])), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c, np_fn(0.5) + x[:2], rtol=1e-5, atol=1e-6)


def test_sigmoid_does_not_overflow():
    X = tg.placeholder((4,), name="X")
    T = tg.compute((4,), lambda i: tg.sigmoid(X[i]))
    out = ev(T, {X: np.array([-1000, -100, 100, 1000], np.float32)})
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, [0, 0, 1, 1], atol=1e-30)


def test_round_is_half_to_even():
    vals = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.4, -0.6, 2.51]
    X = tg.placeholder((len(vals),), name="X")
    T = tg.compute(X.shape, lambda i: tg.round(X[i]))
    out = ev(T, {X: np.array(vals, np.float32)})
    assert out.tolist() == [float(round(v)) for v in vals]
    assert out.tolist()[:7] == [-2.0, -2.0, -0.0, 0.0, 2.0, 2.0, 4.0]


def test_abs_keeps_integer_dtypes():
    A = tg.placeholder((5,), dtype="int32", name="A")
    T = tg.compute((5,), lambda i: tg.abs(A[i]))
    assert T.dtype == "int32"
    a = np.array([-3, -1, 0, 2, 7], np.int32)
    np.testing.assert_array_equal(ev(T, {A: a}), np.abs(a))
    assert tg.compute((3,), lambda i: tg.abs(i - 1)).dtype == "int64"


def test_pow_maximum_minimum():
    A = tg.placeholder((5,), name="A")
    B = tg.placeholder((5,), name="B")
    a, b = rand((5,), lo=0.5, hi=2), rand((5,), lo=-2, hi=2)
    P = tg.compute((5,), lambda i: tg.pow(A[i], B[i]))
    M = tg.compute((5,), lambda i: tg.maximum(A[i], B[i]) + tg.minimum(B[i], 0))
    p, m = tg.evaluate([P, M], {A: a, B: b})
    np.testing.assert_allclose(p, a ** b, rtol=1e-5)
    np.testing.assert_allclose(m, np.maximum(a, b) + np.minimum(b, 0), rtol=1e-6)
    Q = tg.compute((5,), lambda i: i ** 2 + tg.pow(2, i))
    assert Q.dtype == "float32"
    assert ev(Q, {}).tolist() == [i ** 2 + 2.0 ** i for i in range(5)]
    I = tg.compute((7,), lambda i: tg.maximum(i - 3, 0) * 10 + tg.minimum(i, 2))
    assert I.dtype == "int64"
    assert ev(I, {}).tolist() == [max(i - 3, 0) * 10 + min(i, 2) for i in range(7)]


def test_if_then_else():
    A = tg.placeholder((6,), name="A")
    a = rand((6,))
    T = tg.compute((6,), lambda i: tg.if_then_else(A[i] > 0, A[i], 0.1 * A[i]))
    np.testing.assert_allclose(ev(T, {A: a}), np.where(a > 0, a, np.float32(0.1) * a), rtol=1e-6)
    # branches of different dtypes are promoted
    U = tg.compute((6,), lambda i: tg.if_then_else(i < 3, i, 0.5))
    assert U.dtype == "float32"
    assert ev(U, {}).tolist() == [0, 1, 2, 0.5, 0.5, 0.5]
    # a Python bool is a constant condition
    V = tg.compute((2,), lambda i: tg.if_then_else(True, 1, 2))
    assert ev(V, {}).tolist() == [1, 1]


def test_tvm_style_equality_conditions():
    X = tg.placeholder((4, 4), name="X")
    x = rand((4, 4))
    D = tg.compute((4, 4), lambda i, j: tg.if_then_else(i == j, X[i, j], 0.0))
    np.testing.assert_array_equal(ev(D, {X: x}), np.diag(np.diag(x)))
    O = tg.compute((4, 4), lambda i, j: tg.if_then_else(i != j, X[i, j], 0.0))
    np.testing.assert_array_equal(ev(O, {X: x}), x - np.diag(np.diag(x)))
    E = tg.compute((4, 4), lambda i, j: tg.if_then_else(i == 2, 1.0, 0.0) + tg.if_then_else(1 == j, 10.0, 0.0))
    want = np.zeros((4, 4), np.float32)
    want[2, :] += 1
    want[:, 1] += 10
    np.testing.assert_array_equal(ev(E, {X: x}), want)


def test_const_and_cast():
    c = tg.const(3, "int32")
    assert isinstance(c, ir.Const) and c.dtype == "int32" and c.value == 3
    assert tg.const(7).dtype == "int64"
    assert tg.const(2.5).dtype == "float32"
    assert tg.const(True).dtype == "bool"
    assert tg.const(2, "float64").value == 2.0 and tg.const(2, "float64").dtype == "float64"
    assert tg.const(np.int32(4)).dtype == "int64"
    T = tg.compute((3,), lambda i: tg.const(2, "float64") * i)
    assert T.dtype == "float64"
    np.testing.assert_array_equal(ev(T, {}), [0.0, 2.0, 4.0])


def test_cast_float_to_int_truncates_toward_zero():
    vals = [-2.7, -2.5, -1.0, -0.5, 0.0, 0.5, 0.99, 2.5, 2.7, 100.9]
    X = tg.placeholder((len(vals),), dtype="float64", name="X")
    for dt in ("int32", "int64"):
        T = tg.compute(X.shape, lambda i: tg.cast(dt, X[i]))
        assert T.dtype == dt
        out = ev(T, {X: np.array(vals)})
        assert out.dtype == np.dtype(dt)
        assert out.tolist() == [int(v) for v in vals]
    # constants fold with the same rule
    assert tg.cast("int32", -2.7).value == -2
    assert tg.cast("int64", tg.const(2.7)).value == 2


def test_casts_between_other_dtypes():
    A = tg.placeholder((4,), dtype="int32", name="A")
    B = tg.placeholder((4,), dtype="bool", name="B")
    a = np.array([-2, 0, 1, 3], np.int32)
    b = np.array([True, False, True, False])
    F = tg.compute((4,), lambda i: tg.cast("float64", A[i]) / 4)
    assert F.dtype == "float64"
    C = tg.compute((4,), lambda i: tg.cast("int32", B[i]) + A[i])
    Z = tg.compute((4,), lambda i: tg.cast("bool", A[i]))
    f, c, z = tg.evaluate([F, C, Z], {A: a, B: b})
    np.testing.assert_array_equal(f, a / 4.0)
    np.testing.assert_array_equal(c, b.astype(np.int32) + a)
    np.testing.assert_array_equal(z, a != 0)
    # casting to the same dtype builds no node
    x = A[0]
    assert tg.cast("int32", x) is x


def test_comparisons():
    A = tg.placeholder((5,), name="A")
    a = np.array([-1.0, 0.0, 0.5, 1.0, 2.0], np.float32)
    ops = [(lambda x: x < 0.5, lambda x: x < 0.5), (lambda x: x <= 0.5, lambda x: x <= 0.5),
           (lambda x: x > 0.5, lambda x: x > 0.5), (lambda x: x >= 0.5, lambda x: x >= 0.5),
           (lambda x: x == 0.5, lambda x: x == 0.5), (lambda x: x != 0.5, lambda x: x != 0.5),
           (lambda x: 0.5 < x, lambda x: 0.5 < x)]
    for f_tg, f_np in ops:
        T = tg.compute((5,), lambda i: f_tg(A[i]))
        assert T.dtype == "bool"
        out = ev(T, {A: a})
        assert out.dtype == np.bool_
        np.testing.assert_array_equal(out, f_np(a))


def test_logic_operators_and_all_any():
    T = tg.compute((6,), lambda i: (i > 1) & (i < 4))
    np.testing.assert_array_equal(ev(T, {}), [False, False, True, True, False, False])
    U = tg.compute((6,), lambda i: (i < 1) | (i >= 4))
    np.testing.assert_array_equal(ev(U, {}), [True, False, False, False, True, True])
    V = tg.compute((6,), lambda i: ~(i < 2))
    np.testing.assert_array_equal(ev(V, {}), [False, False, True, True, True, True])
    W = tg.compute((6,), lambda i: tg.logical_not(i == 3))
    np.testing.assert_array_equal(ev(W, {}), [True, True, True, False, True, True])
    A1 = tg.compute((6,), lambda i: tg.all(i > 0, i < 5, i != 2))
    np.testing.assert_array_equal(ev(A1, {}), [False, True, False, True, True, False])
    A2 = tg.compute((6,), lambda i: tg.any([i == 0, i == 5]))
    np.testing.assert_array_equal(ev(A2, {}), [True, False, False, False, False, True])
    A3 = tg.compute((2,), lambda i: tg.all(i >= 0))
    np.testing.assert_array_equal(ev(A3, {}), [True, True])
    E1 = tg.compute((2,), lambda i: tg.all())
    E2 = tg.compute((2,), lambda i: tg.any())
    np.testing.assert_array_equal(ev(E1, {}), [True, True])
    np.testing.assert_array_equal(ev(E2, {}), [False, False])
    # conditions mix with Python bools
    M = tg.compute((3,), lambda i: (i > 0) & True)
    np.testing.assert_array_equal(ev(M, {}), [False, True, True])


def test_bool_placeholders_in_conditions():
    M = tg.placeholder((4,), dtype="bool", name="M")
    X = tg.placeholder((4,), name="X")
    T = tg.compute((4,), lambda i: tg.if_then_else(M[i] & (X[i] > 0), X[i], -1.0))
    m = np.array([True, True, False, False])
    x = np.array([1.0, -1.0, 2.0, -2.0], np.float32)
    np.testing.assert_array_equal(ev(T, {M: m, X: x}), [1.0, -1.0, -1.0, -1.0])


# ---------------------------------------------------------------------------
# indexing
# ---------------------------------------------------------------------------


def test_indexing_with_tuples_and_lists():
    X = tg.placeholder((3, 4), name="X")
    x = rand((3, 4))
    T = tg.compute((4, 3), lambda i, j: X[(j, i)])
    np.testing.assert_array_equal(ev(T, {X: x}), x.T)

    def through_tuple(i, j):
        idx = (j, i)
        return X[idx]
    U = tg.compute((4, 3), through_tuple)
    np.testing.assert_array_equal(ev(U, {X: x}), x.T)
    V = tg.compute((4, 3), lambda i, j: X[[j, i]])
    np.testing.assert_array_equal(ev(V, {X: x}), x.T)
    V2 = tg.compute((4, 3), lambda i, j: X[(j, i), ])
    np.testing.assert_array_equal(ev(V2, {X: x}), x.T)
    # constant and mixed indices, strided and reversed accesses
    W = tg.compute((2,), lambda i: X[2, i * 2 + 1] + X[2 - i, 0])
    np.testing.assert_allclose(ev(W, {X: x}), [x[2, 1] + x[2, 0], x[2, 3] + x[1, 0]])
    assert (X[1, 2]).same_as(X[(1, 2)])


def test_integer_tensors_inside_index_expressions():
    W = tg.placeholder((5, 3), name="W")
    w = rand((5, 3))
    for dt in ("int32", "int64"):
        ids = tg.placeholder((4,), dtype=dt, name="ids")
        idv = np.array([4, 0, 2, 2], dt)
        E = tg.compute((4, 3), lambda i, j: W[ids[i], j], name="E")
        np.testing.assert_array_equal(ev(E, {W: w, ids: idv}), w[idv])
        F = tg.compute((4, 3), lambda i, j: W[(ids[i] + 1) % 5, 2 - j])
        np.testing.assert_array_equal(ev(F, {W: w, ids: idv}), w[(idv + 1) % 5][:, ::-1])
    # a computed integer tensor used as an index
    P = tg.placeholder((4,), dtype="int64", name="P")
    Q = tg.compute((4,), lambda i: P[i] * 2, name="Q")
    G = tg.compute((4,), lambda i: W[Q[i] % 5, 0])
    p = np.array([0, 1, 2, 3])
    np.testing.assert_array_equal(ev(G, {W: w, P: p}), w[(p * 2) % 5, 0])


def test_multi_stage_graph():
    A = tg.placeholder((4, 3), name="A")
    B = tg.placeholder((3, 2), name="B")
    k = tg.reduce_axis(3, "k")
    C = tg.compute((4, 2), lambda i, j: tg.sum(A[i, k] * B[k, j], axis=k), name="C")
    R = tg.compute((4, 2), lambda i, j: tg.maximum(C[i, j], 0.0), name="R")
    D = tg.compute((2, 4), lambda i, j: R[j, i] + C[j, i], name="D")
    a, b = rand((4, 3)), rand((3, 2))
    c, r, d = tg.evaluate([C, R, D], {A: a, B: b})
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d, (np.maximum(a @ b, 0) + a @ b).T, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# dtype promotion (rules of te_grad/dtypes.py)
# ---------------------------------------------------------------------------


def _ph(dtype):
    return tg.placeholder((3,), dtype=dtype, name=f"P_{dtype}")


def test_promotion_lattice():
    order = ["bool", "int32", "int64", "float32", "float64"]
    for a in order:
        for b in order:
            want = order[max(order.index(a), order.index(b))]
            assert dtypes.promote(a, b) == want
    assert dtypes.canonical(np.float32) == "float32"
    assert dtypes.canonical("int64") == "int64"
    assert dtypes.canonical(np.dtype(bool)) == "bool"
    assert dtypes.is_float("float64") and not dtypes.is_float("int32")
    assert dtypes.is_int("int32") and not dtypes.is_int("bool")


def test_promotion_of_expressions():
    b, i32, i64, f32, f64 = (_ph(d)[0] for d in ("bool", "int32", "int64", "float32", "float64"))
    i = ir.Var("i")
    cases = [
        (i32 + 1, "int32"),            # a Python int is weak
        (i64 * 2, "int64"),
        (i32 + 1.5, "float32"),        # a Python float next to an int gives float32
        (f64 + 1.5, "float64"),        # ... and keeps a float operand's dtype
        (1.5 * f64, "float64"),
        (2 * f32, "float32"),
        (b + 1, "int64"),              # int64 next to a bool
        (i32 / i32, "float32"),        # true division always gives a float
        (i64 / 2, "float32"),
        (i / 2, "float32"),
        (f64 / 2, "float64"),
        (i32 + i64, "int64"),
        (i64 + f32, "float32"),        # as in JAX
        (i32 * f32, "float32"),
        (f32 + f64, "float64"),
        (i + 1, "int64"),
        (i32 // 2, "int32"),
        (i32 % i64, "int64"),
        (f32 ** 2, "float32"),
        (i ** 2, "float32"),           # pow, like /, works in floats
        (f64 ** i32, "float64"),
        (tg.exp(i32), "float32"),
        (tg.sqrt(f64), "float64"),
        (tg.maximum(i32, 0), "int32"),
        (tg.maximum(i32, 0.5), "float32"),
        (tg.if_then_else(b, i32, f64), "float64"),
        (-i32, "int32"),
        (i32 < 2.5, "bool"),
    ]
    for e, want in cases:
        assert e.dtype == want, (str(e), e.dtype, want)


def test_promotion_in_evaluated_values():
    I32 = tg.placeholder((4,), dtype="int32", name="I32")
    F64 = tg.placeholder((4,), dtype="float64", name="F64")
    i32 = np.array([1, 2, 3, 7], np.int32)
    f64 = np.array([0.1, 0.2, 0.3, 0.4])
    D = tg.compute((4,), lambda i: I32[i] / 2)          # int / int -> float32
    S = tg.compute((4,), lambda i: I32[i] + F64[i])     # int32 + float64 -> float64
    W = tg.compute((4,), lambda i: F64[i] * 0.1)        # weak float keeps float64
    d, s, w = tg.evaluate([D, S, W], {I32: i32, F64: f64})
    assert d.dtype == np.float32 and d.tolist() == [0.5, 1.0, 1.5, 3.5]
    assert s.dtype == np.float64
    np.testing.assert_array_equal(s, i32 + f64)
    assert w.dtype == np.float64
    np.testing.assert_array_equal(w, f64 * 0.1)   # computed in float64, not float32
