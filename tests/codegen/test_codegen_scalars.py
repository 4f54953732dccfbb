"""Every scalar construct of the DSL compiled vs the reference evaluator.

Integer division and modulo floor like Python, casts truncate toward zero,
``round`` rounds half to even, guards (``if_then_else``, ``&``, ``|``, ``where=``)
keep out-of-bounds reads from ever running, empty reductions give their
identity, and reduce bounds may depend on outer variables.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import te_grad as tg
from te_grad import ir
from test_codegen import assert_kernel_matches, assert_same

F64 = "float64"
INTS = ["int32", "int64"]
FLOATS = ["float32", "float64"]


def ph(shape, name, dtype=F64):
    return tg.placeholder(shape, dtype=dtype, name=name)


def float_tol(dtype):
    return dict(rtol=1e-9, atol=1e-12) if dtype == "float64" else dict(rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# integer arithmetic
# ---------------------------------------------------------------------------

SIGNED_PAIRS = [(7, 2), (-7, 2), (7, -2), (-7, -2), (6, 3), (-6, 3), (6, -3), (-6, -3), (0, 5), (0, -5),
                (1, 7), (-1, 7), (1, -7), (-1, -7), (1000, 7), (-1000, 7), (13, 13), (-13, 13), (5, 1),
                (-5, -1)]


@pytest.mark.parametrize("dtype", INTS)
def test_floordiv_and_mod_of_tensors_follow_python(dtype):
    n = len(SIGNED_PAIRS)
    A, B = ph((n,), "A", dtype), ph((n,), "B", dtype)
    a = np.array([p[0] for p in SIGNED_PAIRS], dtype)
    b = np.array([p[1] for p in SIGNED_PAIRS], dtype)
    D = tg.compute((n,), lambda i: A[i] // B[i], name="D")
    M = tg.compute((n,), lambda i: A[i] % B[i], name="M")
    _, (d, m) = assert_kernel_matches([D, M], [A, B], {A: a, B: b})
    assert d.tolist() == [x // y for x, y in SIGNED_PAIRS]
    assert m.tolist() == [x % y for x, y in SIGNED_PAIRS]


@pytest.mark.parametrize("dtype", INTS)
def test_floordiv_and_mod_by_constants_follow_python(dtype):
    A = ph((31,), "A", dtype)
    a = np.arange(-15, 16).astype(dtype) * 37
    outs = []
    for c in (1, 2, 3, 4, 7, 8, 16, -1, -2, -3, -4, -7):
        tag = f"{'m' if c < 0 else ''}{abs(c)}"
        outs.append(tg.compute((31,), (lambda c: lambda i: A[i] // c)(c), name=f"D{tag}"))
        outs.append(tg.compute((31,), (lambda c: lambda i: A[i] % c)(c), name=f"M{tag}"))
        outs.append(tg.compute((31,), (lambda c: lambda i: (A[i] - 5) // c * c + (A[i] - 5) % c)(c), name=f"R{tag}"))
    _, got = assert_kernel_matches(outs, [A], {A: a})
    for t, g in zip(outs[2::3], got[2::3]):
        np.testing.assert_array_equal(g, a - 5, err_msg=t.name)


@pytest.mark.parametrize("dtype", INTS)
def test_index_floordiv_and_mod_with_negative_operands(dtype):
    """Index expressions (int64) mixing loop variables and negative constants."""
    T = tg.compute((7, 5), lambda i, j: tg.cast(dtype, (i - 3) // tg.if_then_else(j == 2, 3, j - 2) * 100
                                                + (3 - i * j) % (j + 1) - (i - 5) // 3 + (2 - j) % -3),
                   name="T")
    assert_kernel_matches([T], [], {})


@pytest.mark.parametrize("dtype", INTS)
def test_floordiv_and_mod_by_constants_at_the_extremes(dtype):
    info = np.iinfo(dtype)
    A = ph((6,), "A", dtype)
    a = np.array([info.min, info.min + 1, info.min + 5, info.max, info.max - 1, -1], dtype)
    outs = []
    for c in (2, 3, 7, 8, -3):
        tag = f"{'m' if c < 0 else ''}{abs(c)}"
        outs.append(tg.compute((6,), (lambda c: lambda i: A[i] // c)(c), name=f"D{tag}"))
        outs.append(tg.compute((6,), (lambda c: lambda i: A[i] % c)(c), name=f"M{tag}"))
    assert_kernel_matches(outs, [A], {A: a})


@pytest.mark.parametrize("dtype", INTS)
def test_floordiv_of_tensors_at_the_extremes(dtype):
    info = np.iinfo(dtype)
    A, B = ph((6,), "A", dtype), ph((6,), "B", dtype)
    a = np.array([info.min, info.min, info.max, info.max, info.min + 1, -1], dtype)
    b = np.array([2, -3, 7, -7, info.max, info.min], dtype)
    outs = [tg.compute((6,), lambda i: A[i] // B[i], name="D"), tg.compute((6,), lambda i: A[i] % B[i], name="M")]
    assert_kernel_matches(outs, [A, B], {A: a, B: b})


_MIN_DIV_MINUS_ONE = textwrap.dedent("""
    import numpy as np, te_grad as tg
    dtype = {dtype!r}
    A = tg.placeholder((3,), dtype=dtype, name="A")
    B = tg.placeholder((3,), dtype=dtype, name="B")
    D = tg.compute((3,), lambda i: A[i] // B[i], name="D")
    M = tg.compute((3,), lambda i: A[i] % B[i], name="M")
    feed = {{A: np.array([np.iinfo(dtype).min, 5, -5], dtype), B: np.array([-1, -1, -1], dtype)}}
    try:
        got = tg.build([D, M], inputs=[A, B])(feed[A], feed[B])
    except tg.TeGradError as err:
        print("error:", err)
    else:
        want = tg.evaluate([D, M], feed)
        assert all(np.array_equal(g, w) for g, w in zip(got, want)), (got, want)
        print("ok")
""")


@pytest.mark.parametrize("dtype", INTS)
def test_min_int_divided_by_minus_one_does_not_crash(dtype):
    proc = subprocess.run([sys.executable, "-c", _MIN_DIV_MINUS_ONE.format(dtype=dtype)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"the process died with code {proc.returncode}: {proc.stderr[-2000:]}"


@pytest.mark.parametrize("dtype", INTS)
def test_integer_outputs_min_max_and_reductions(dtype):
    A = ph((4, 5), "A", dtype)
    a = np.array([[3, -7, 0, 12, -1], [5, 5, 5, 5, 5], [-9, 2, 8, -3, 4], [1, 0, -1, 0, 1]], dtype)
    k = tg.reduce_axis(5, "k")
    outs = [
        tg.compute((4, 5), lambda i, j: tg.maximum(A[i, j], 2) - tg.minimum(A[i, j], -i) * 3, name="mm"),
        tg.compute((4, 5), lambda i, j: tg.maximum(A[i, j], A[3 - i, 4 - j]), name="mx"),
        tg.compute((4,), lambda i: tg.sum(A[i, k] * (k + 1), axis=k), name="isum"),
        tg.compute((4,), lambda i: tg.max(A[i, k], axis=k), name="imax"),
        tg.compute((4,), lambda i: tg.min(A[i, k], axis=k), name="imin"),
        tg.compute((4,), lambda i: tg.prod(A[i, k], axis=k, where=A[i, k] != 0), name="iprod"),
        tg.compute((4,), lambda i: tg.max(A[i, k], axis=k, where=A[i, k] > 100), name="imax_empty"),
        tg.compute((4,), lambda i: tg.min(A[i, k], axis=k, where=k > 7), name="imin_empty"),
        tg.compute((4, 5), lambda i, j: -A[i, j] + tg.const(2 ** 20, dtype) * (A[i, j] % 3), name="neg"),
    ]
    kern, got = assert_kernel_matches(outs, [A], {A: a})
    assert all(g.dtype == np.dtype(dtype) for g in got[3:8])
    info = np.iinfo(dtype)
    assert got[6].tolist() == [info.min] * 4 and got[7].tolist() == [info.max] * 4


def test_int64_constants_beyond_int32():
    A = ph((3,), "A", "int64")
    T = tg.compute((3,), lambda i: A[i] * (2 ** 40) + 2 ** 33 - i * 3_000_000_000, name="T")
    assert_kernel_matches([T], [A], {A: np.array([-3, 0, 5])})


# ---------------------------------------------------------------------------
# casts and booleans
# ---------------------------------------------------------------------------

CAST_VALUES = [-2.7, -2.5, -2.0, -0.7, -0.5, -0.0, 0.0, 0.3, 0.5, 1.5, 2.5, 2.7, 99.99, -99.99, 1e6, -1e6]


@pytest.mark.parametrize("src", FLOATS)
def test_float_to_int_casts_truncate_toward_zero(src):
    n = len(CAST_VALUES)
    X = ph((n,), "X", src)
    x = np.array(CAST_VALUES, src)
    outs = [tg.compute((n,), (lambda d: lambda i: tg.cast(d, X[i]))(d), name=f"to_{d}") for d in INTS]
    outs.append(tg.compute((n,), lambda i: tg.cast("bool", X[i]), name="to_bool"))
    outs.append(tg.compute((n,), lambda i: tg.cast("float32" if src == F64 else F64, X[i]), name="to_other"))
    _, got = assert_kernel_matches(outs, [X], {X: x})
    assert got[0].tolist() == [int(v) for v in x]  # Python's int() truncates toward zero


@pytest.mark.parametrize("src", INTS)
def test_int_casts(src):
    A = ph((7,), "A", src)
    a = np.array([np.iinfo(src).min, -70000, -1, 0, 1, 70000, np.iinfo(src).max], src)
    outs = [tg.compute((7,), (lambda d: lambda i: tg.cast(d, A[i]))(d), name=f"to_{d}")
            for d in ("int32", "int64", "float32", "float64", "bool")]
    assert_kernel_matches(outs, [A], {A: a})


def test_bool_tensors_in_and_out():
    P, Q = ph((6,), "P", "bool"), ph((6,), "Q", "bool")
    X = ph((6,), "X")
    p = np.array([1, 0, 1, 0, 1, 0], bool)
    q = np.array([1, 1, 0, 0, 1, 0], bool)
    x = np.array([1.0, np.nan, -2.0, 0.0, 3.0, -0.0])
    outs = [
        tg.compute((6,), lambda i: P[i] & Q[i], name="and_"),
        tg.compute((6,), lambda i: P[i] | Q[i], name="or_"),
        tg.compute((6,), lambda i: tg.logical_not(P[i]) | (i > 3), name="not_"),
        tg.compute((6,), lambda i: P[i] == Q[i], name="eq_"),
        tg.compute((6,), lambda i: P[i] != Q[5 - i], name="ne_"),
        tg.compute((6,), lambda i: tg.all(P[i], Q[i], X[i] > 0.0), name="all_"),
        tg.compute((6,), lambda i: tg.any(P[i], X[i] != X[i]), name="any_nan"),
        tg.compute((6,), lambda i: X[i] < 0.0, name="lt"),
        tg.compute((6,), lambda i: X[i] >= X[5 - i], name="ge"),
        tg.compute((6,), lambda i: tg.if_then_else(P[i], X[i], -X[i]), name="select"),
        tg.compute((6,), lambda i: tg.cast(F64, P[i]) + tg.cast("int32", Q[i]) * 2.0, name="arith"),
        tg.compute((6,), lambda i: tg.cast("int64", P[i]) + tg.cast("int64", Q[i]), name="count"),
        tg.compute((6,), lambda i: P[i], name="copy"),
    ]
    kern, got = assert_kernel_matches(outs, [P, Q, X], {P: p, Q: q, X: x})
    assert got[0].dtype == np.bool_ and got[-1].dtype == np.bool_
    assert set(np.unique(got[0].view(np.uint8)).tolist()) <= {0, 1}  # proper numpy bools
    k = tg.reduce_axis(6, "k")
    counts = tg.compute((), lambda: tg.sum(tg.cast("int64", P[k]), axis=k, where=Q[k]), name="counts")
    assert_kernel_matches([counts], [P, Q], {P: p, Q: q})


@pytest.mark.parametrize("dtype", FLOATS)
def test_rounding_intrinsics(dtype):
    vals = [k + 0.5 for k in range(-5, 5)] + [-2.7, -0.2, -0.0, 0.0, 0.2, 2.7, 1e7 + 0.5, -1e7 - 0.5]
    if dtype == F64:
        vals += [2.0 ** 52 + 1, 0.49999999999999994]
    n = len(vals)
    X = ph((n,), "X", dtype)
    x = np.array(vals, dtype)
    outs = [tg.compute((n,), (lambda f: lambda i: f(X[i]))(f), name=f.__name__ + "_")
            for f in (tg.round, tg.floor, tg.ceil, tg.trunc)]
    _, got = assert_kernel_matches(outs, [X], {X: x}, rtol=0, atol=0)
    np.testing.assert_array_equal(got[0][:10], [-4, -4, -2, -2, 0, 0, 2, 2, 4, 4])


@pytest.mark.parametrize("dtype", FLOATS)
def test_transcendental_intrinsics(dtype):
    vals = [-1000.0, -100.0, -30.0, -20.0, -5.0, -1.0, -0.5, -1e-8, 0.0, 1e-8, 0.5, 1.0, 5.0, 20.0, 30.0,
            100.0, 1000.0]
    n = len(vals)
    X = ph((n,), "X", dtype)
    x = np.array(vals, dtype)
    fns = {"sigmoid": tg.sigmoid, "erf": tg.erf, "tanh": tg.tanh, "sin": tg.sin, "cos": tg.cos,
           "abs": tg.abs, "neg": lambda v: -v}
    outs = [tg.compute((n,), (lambda f: lambda i: f(X[i]))(f), name=name) for name, f in fns.items()]
    outs.append(tg.compute((n,), lambda i: tg.exp(X[i] * 0.01), name="exp"))
    outs.append(tg.compute((n,), lambda i: tg.log(tg.abs(X[i]) + 0.5), name="log"))
    outs.append(tg.compute((n,), lambda i: tg.sqrt(tg.abs(X[i])), name="sqrt"))
    outs.append(tg.compute((n,), lambda i: tg.pow(tg.abs(X[i]) + 0.5, X[i] * 0.01), name="pow"))
    _, got = assert_kernel_matches(outs, [X], {X: x}, **float_tol(dtype))
    sig = got[0]
    assert sig[0] == 0.0 and sig[-1] == 1.0 and np.all(np.diff(sig) >= 0)


def test_float_special_values():
    X = ph((6,), "X")
    x = np.array([1.0, -1.0, 0.0, np.inf, -np.inf, np.nan])
    outs = [tg.compute((6,), lambda i: X[i] / 0.0, name="div0"),
            tg.compute((6,), lambda i: tg.exp(X[i]), name="exp"),
            tg.compute((6,), lambda i: tg.maximum(X[i], 0.0), name="relu"),
            tg.compute((6,), lambda i: tg.sigmoid(X[i]), name="sigmoid"),
            tg.compute((6,), lambda i: tg.tanh(X[i]), name="tanh"),
            tg.compute((6,), lambda i: tg.log(X[i]), name="log")]
    assert_kernel_matches(outs, [X], {X: x}, fast_math=False)


# ---------------------------------------------------------------------------
# guards: the untaken side never runs
# ---------------------------------------------------------------------------

def test_if_then_else_untaken_branch_out_of_bounds():
    X = ph((5,), "X")
    x = np.arange(1.0, 6.0)
    outs = [
        tg.compute((5,), lambda i: tg.if_then_else(i > 0, X[i - 1], 0.0), name="shift"),
        tg.compute((5,), lambda i: tg.if_then_else(i + 1 >= 5, -1.0, X[i + 1]), name="back"),
        tg.compute((5,), lambda i: tg.if_then_else(i < 0, X[i - 100], X[i])
                   + tg.if_then_else(i > 10, X[i * 100000000], 0.0), name="far"),
        tg.compute((5,), lambda i: tg.if_then_else(X[i] > 2.5, X[tg.minimum(i + 1, 4)], X[i] * 2.0), name="data"),
    ]
    assert_kernel_matches(outs, [X], {X: x})


def test_guarded_read_inside_a_reduction():
    X = ph((6,), "X")
    k = tg.reduce_axis(3, "k")
    causal = tg.compute((6,), lambda i: tg.sum(tg.if_then_else(i - k >= 0, X[i - k], 0.0), axis=k), name="causal")
    where = tg.compute((6,), lambda i: tg.max(X[i + k], axis=k, where=i + k < 6), name="where")
    assert_kernel_matches([causal, where], [X], {X: np.random.default_rng(0).standard_normal(6)})


def test_and_or_short_circuit_guard_reads():
    X = ph((5,), "X")
    x = np.array([1.0, -2.0, 3.0, 4.0, -5.0])
    outs = [
        tg.compute((5,), lambda i: (i > 0) & (X[i - 1] > 0), name="A"),
        tg.compute((5,), lambda i: (i == 0) | (X[i - 1] > 0), name="O"),
        tg.compute((5,), lambda i: tg.all(i > 1, X[i - 1] > 0, X[i - 2] > 0), name="N"),
        tg.compute((5,), lambda i: tg.if_then_else((i < 4) & (X[i + 1] > 0), 1.0, 0.0), name="S"),
        tg.compute((5,), lambda i: tg.if_then_else((i >= 4) | (X[i + 1] < 0), X[i], -X[i]), name="T"),
        tg.compute((5,), lambda i: tg.any(i < 1, (i < 4) & (X[i + 1] > X[i - 1])), name="U"),
    ]
    _, got = assert_kernel_matches(outs, [X], {X: x})
    assert got[0].tolist() == [False, True, False, True, True]
    assert got[1].tolist() == [True, True, False, True, True]


def test_short_circuit_guards_data_dependent_ids():
    W, ids = ph((5, 2), "W"), ph((4,), "ids", "int64")
    E = tg.compute((4,), lambda i: (ids[i] >= 0) & (ids[i] < 5) & (W[ids[i], 0] > 0.0), name="E")
    F = tg.compute((4,), lambda i: (ids[i] < 0) | (ids[i] >= 5) | (W[ids[i], 1] > 0.0), name="F")
    feed = {W: np.array([[1.0, -1.0], [-1.0, 1.0]] * 2 + [[1.0, 1.0]]), ids: np.array([1, 9, -4, 4])}
    assert_kernel_matches([E, F], [W, ids], feed)


# ---------------------------------------------------------------------------
# reductions: empty domains, bounds that depend on outer variables
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
def test_empty_reduction_domains_give_the_identity(dtype):
    X = ph((4,), "X", dtype)
    k0 = tg.reduce_axis(0, "k0")
    k = tg.reduce_axis(4, "k")
    outs = [tg.compute((3,), (lambda f: lambda i: f(X[k0] * 2.0, axis=k0))(f), name=f"{f.__name__}_empty")
            for f in (tg.sum, tg.prod, tg.max, tg.min)]
    outs += [tg.compute((3,), (lambda f: lambda i: f(X[k], axis=k, where=k < i))(f), name=f"{f.__name__}_rows")
             for f in (tg.sum, tg.prod, tg.max, tg.min)]
    outs += [tg.compute((), (lambda f: lambda: f(X[k], axis=k, where=X[k] > 100.0))(f), name=f"{f.__name__}_data")
             for f in (tg.sum, tg.prod, tg.max, tg.min)]
    _, got = assert_kernel_matches(outs, [X], {X: np.array([0.5, -1.0, 2.0, 3.0], dtype)}, **float_tol(dtype))
    assert [g[0] for g in got[:4]] == [0.0, 1.0, -np.inf, np.inf]
    assert [g[0] for g in got[4:8]] == [0.0, 1.0, -np.inf, np.inf]
    assert [float(g) for g in got[8:]] == [0.0, 1.0, -np.inf, np.inf]


def axis(name, lo, hi):
    """A reduce axis whose bounds are expressions (as the simplifier makes them)."""
    return ir.ReduceAxis(name, "int64", tg.const(lo) if isinstance(lo, int) else lo,
                         tg.const(hi) if isinstance(hi, int) else hi)


def test_simplified_cumsum_has_bounds_from_outer_variables():
    X = ph((6, 7), "X")
    k = tg.reduce_axis(7, "k")
    fwd = tg.compute((6, 7), lambda i, j: tg.sum(X[i, k], axis=k, where=k <= j), name="cumsum")
    rev = tg.compute((6, 7), lambda i, j: tg.max(X[i, k], axis=k, where=k >= j), name="revmax")
    band = tg.compute((6, 7), lambda i, j: tg.min(X[i, k], axis=k, where=(k - j <= 1) & (j - k <= 1)),
                      name="band")
    tri = tg.compute((6, 7), lambda i, j: tg.sum(X[i, k] * X[i, k], axis=k, where=(k >= i) & (k < j)),
                     name="tri")  # empty when j <= i
    simplified = tg.simplify([fwd, rev, band, tri])
    for t in simplified:  # the where= became bounds that use i and j
        assert "where" not in tg.show(t) and " if " not in tg.show(t), tg.show(t)
    feed = {X: np.random.default_rng(1).standard_normal(X.shape)}
    _, got = assert_kernel_matches(simplified, [X], feed)
    assert_kernel_matches([fwd, rev, band, tri], [X], feed)
    np.testing.assert_allclose(got[0], np.cumsum(feed[X], axis=1), rtol=1e-12)


def test_reduce_bounds_that_are_expressions():
    X = ph((5, 5), "X")
    Y = ph((7,), "Y")
    outs = [
        tg.compute((5,), lambda i: (lambda k: tg.sum(X[i, k], axis=k))(axis("k", 0, i + 1)), name="tri"),
        tg.compute((5,), lambda i: (lambda k: tg.sum(X[k, i], axis=k))(axis("k", i, 5)), name="rtri"),
        tg.compute((7,), lambda i: (lambda k: tg.max(Y[k], axis=k))(
            axis("k", tg.maximum(i - 1, 0), tg.minimum(i + 2, 7))), name="window"),
        tg.compute((7,), lambda i: (lambda k: tg.min(Y[k], axis=k))(axis("k", 0, i)), name="prefix_min"),
        tg.compute((7,), lambda i: (lambda k: tg.prod(2.0 + 0.0 * tg.cast(F64, k), axis=k))(
            axis("k", i, 2 * i)), name="powers"),
        tg.compute((5, 5), lambda i, j: (lambda k: tg.sum(X[i, k], axis=k))(
            axis("k", tg.minimum(i, j), tg.maximum(i, j) + 1)), name="two_vars"),
    ]
    k1 = tg.reduce_axis(5, "k1")
    k2 = axis("k2", k1, 5)
    outs.append(tg.compute((), lambda: tg.sum(X[k1, k2], axis=[k1, k2]), name="upper"))
    kk = tg.reduce_axis(5, "kk")

    def nested(i):
        l = axis("l", 0, kk + 1)
        return tg.sum(X[kk, i] * tg.sum(X[l, i], axis=l), axis=kk)
    outs.append(tg.compute((5,), nested, name="nested"))
    feed = {X: np.random.default_rng(2).standard_normal(X.shape), Y: np.random.default_rng(3).standard_normal(7)}
    _, got = assert_kernel_matches(outs, [X, Y], feed)
    assert got[3][0] == np.inf
    np.testing.assert_allclose(got[6], np.triu(feed[X]).sum(), rtol=1e-12)


def test_reduce_bounds_that_alternate_with_the_output_index():
    X = ph((3,), "X")
    k = tg.reduce_axis(3, "k")
    Y = tg.compute((6,), lambda i: tg.sum(X[k], axis=k, where=(i + k) % 2 == 0), name="Y")
    assert_kernel_matches([Y], [X], {X: np.array([1.0, 10.0, 100.0])})


def test_data_dependent_where_bound():
    X, n = ph((4, 5), "X"), ph((5,), "n", "int32")
    k = tg.reduce_axis(4, "k")
    T = tg.compute((5,), lambda i: tg.sum(X[k, i], axis=k, where=k < n[i]), name="T")
    feed = {X: np.random.default_rng(0).standard_normal((4, 5)), n: np.array([0, 4, 2, 1, 9], np.int32)}
    assert_kernel_matches([T], [X, n], feed)


# ---------------------------------------------------------------------------
# property: random integer index expressions, compiled == evaluated == Python
# ---------------------------------------------------------------------------

N_I, N_J = 5, 4


def _trees():
    leaves = st.one_of(st.sampled_from(["i", "j"]), st.integers(-6, 6))
    ops = st.sampled_from(["+", "-", "*", "//", "%", "min", "max", "neg"])
    return st.recursive(leaves, lambda sub: st.tuples(ops, sub, sub), max_leaves=8)


def _build(t, i, j, lift=lambda v: v):
    """The tree as a Python int (``lift`` identity) or as a te_grad expression."""
    if t == "i":
        return i
    if t == "j":
        return j
    if isinstance(t, int):
        return lift(t)
    op, a, b = t
    x = _build(a, i, j, lift)
    if op == "neg":
        return -x
    y = _build(b, i, j, lift)
    if op in ("min", "max"):
        if isinstance(x, ir.Expr) or isinstance(y, ir.Expr):
            return (tg.minimum if op == "min" else tg.maximum)(x, y)
        return min(x, y) if op == "min" else max(x, y)
    return {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y,
            "//": lambda: x // y, "%": lambda: x % y}[op]()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_trees(), st.sampled_from(INTS))
def test_random_integer_expressions_compiled(tree, dtype):
    want, python_error = [], False
    try:
        for i in range(N_I):
            want.append([_build(tree, i, j) for j in range(N_J)])
    except ZeroDivisionError:
        python_error = True
    lift = (lambda v: tg.const(v, dtype))
    try:
        T = tg.compute((N_I, N_J), lambda i, j: tg.cast(dtype, _build(tree, tg.cast(dtype, i), tg.cast(dtype, j),
                                                                      lift)), name="T")
    except tg.UserError as err:  # a constant zero divisor is refused when the expression is made
        assert python_error and "division by zero" in str(err)
        return
    kern = tg.build([T], inputs=[])
    try:
        got = kern()
    except tg.TeGradError as err:
        assert python_error, f"the kernel raised {err} but Python did not"
        assert "division by zero" in str(err)
        assert not isinstance(err, tg.InternalError)
        return
    assert not python_error, "Python divided by zero but the kernel did not complain"
    assert got.dtype == np.dtype(dtype)
    assert got.tolist() == want
    assert_same(got, tg.evaluate([T], {})[0])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_trees(), _trees())
@example(row=("//", "i", ("-", "i", "i")), col="j")  # a divisor that folds to 0 in codegen
def test_random_index_expressions_as_read_indices(row, col):
    """``X[row % 5, col % 4]``: any integer expression, wrapped into range, used as an index."""
    X = ph((N_I, N_J), "X")
    try:
        T = tg.compute((N_I, N_J), lambda i, j: X[_build(row, i, j, tg.const) % N_I,
                                                  _build(col, i, j, tg.const) % N_J] * 2.0 + X[i, j], name="T")
    except tg.UserError as err:
        assert "division by zero" in str(err)
        return
    x = np.arange(N_I * N_J, dtype=np.float64).reshape(N_I, N_J)
    kern = tg.build([T], inputs=[X])
    try:
        got = kern(x)
    except tg.TeGradError as err:
        assert "division by zero" in str(err) and not isinstance(err, tg.InternalError)
        with pytest.raises(tg.TeGradError, match="division by zero"):
            tg.evaluate([T], {X: x})
        return
    assert_same(got, tg.evaluate([T], {X: x})[0])
