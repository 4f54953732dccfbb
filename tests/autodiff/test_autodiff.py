"""The differentiator: float64 gradients vs central finite differences, conventions, API."""
import numpy as np
import pytest

import te_grad as tg
from te_grad.testing import check_gradients, random_feed

F64 = "float64"


def ph(shape, name):
    return tg.placeholder(shape, dtype=F64, name=name)


def feed_for(*tensors, seed=0, low=-1.0, high=1.0):
    return random_feed(tensors, np.random.default_rng(seed), low, high)


# ---------------------------------------------------------------------------
# one rule at a time
# ---------------------------------------------------------------------------

UNARY = {
    "exp": tg.exp, "log": tg.log, "sqrt": tg.sqrt, "tanh": tg.tanh, "sigmoid": tg.sigmoid,
    "abs": tg.abs, "sin": tg.sin, "cos": tg.cos, "erf": tg.erf, "neg": lambda x: -x,
    "square": lambda x: x * x, "cube": lambda x: x ** 3, "recip": lambda x: 1.0 / x,
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("top", [True, False], ids=["whole-body", "inside"])
def test_unary_rules(name, top):
    f = UNARY[name]
    X = ph((3, 4), "X")
    if top:
        Y = tg.compute((3, 4), lambda i, j: f(X[i, j]), name="Y")
    else:
        Y = tg.compute((3, 4), lambda i, j: 2.0 * f(X[i, j]) + X[i, j], name="Y")
    check_gradients(Y, [X], feed_for(X, low=0.3, high=1.5))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "maximum", "minimum"])
def test_binary_rules(op):
    fn = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "div": lambda a, b: a / b, "pow": tg.pow, "maximum": tg.maximum, "minimum": tg.minimum}[op]
    A, B = ph((5,), "A"), ph((5,), "B")
    Y = tg.compute((5,), lambda i: fn(A[i], B[i]), name="Y")
    check_gradients(Y, [A, B], feed_for(A, B, low=0.5, high=2.0))


def test_piecewise_constant_intrinsics_have_zero_gradient():
    X = ph((6,), "X")
    Y = tg.compute((6,), lambda i: tg.floor(X[i]) + tg.ceil(X[i]) + tg.trunc(X[i]) + tg.round(X[i])
                   + tg.cast(F64, X[i] > 0.0), name="Y")
    (g,) = tg.evaluate(tg.gradient(Y, [X]), feed_for(X))
    assert np.array_equal(g, np.zeros(6))


def test_select_and_cast_chain():
    X = ph((6,), "X")
    Y = tg.compute((6,), lambda i: tg.if_then_else(X[i] > 0.0, tg.cast(F64, tg.cast("float32", X[i]) * 3.0),
                                                  X[i] * X[i]), name="Y")
    g = tg.evaluate(tg.gradient(Y, [X]), {X: np.array([-2.0, -0.5, 0.25, 1.0, 2.0, -1.0])})[0]
    np.testing.assert_allclose(g, [-4.0, -1.0, 3.0, 3.0, 3.0, -2.0])


# ---------------------------------------------------------------------------
# conventions at kinks and ties
# ---------------------------------------------------------------------------

def test_abs_at_zero_has_zero_derivative():
    X = ph((3,), "X")
    Y = tg.compute((3,), lambda i: tg.abs(X[i]), name="Y")
    g = tg.evaluate(tg.gradient(Y, [X]), {X: np.array([-1.0, 0.0, 2.0])})[0]
    np.testing.assert_array_equal(g, [-1.0, 0.0, 1.0])


def test_elementwise_max_min_split_ties_evenly():
    A, B = ph((3,), "A"), ph((3,), "B")
    Y = tg.compute((3,), lambda i: tg.maximum(A[i], B[i]) + 10.0 * tg.minimum(A[i], B[i]), name="Y")
    da, db = tg.evaluate(tg.gradient(Y, [A, B]), {A: np.array([1.0, 2.0, 3.0]), B: np.array([2.0, 2.0, 1.0])})
    np.testing.assert_array_equal(da, [10.0, 5.5, 1.0])
    np.testing.assert_array_equal(db, [1.0, 5.5, 10.0])


@pytest.mark.parametrize("combiner", ["max", "min"])
def test_max_min_reduction_split_ties_evenly(combiner):
    X = ph((2, 4), "X")
    k = tg.reduce_axis(4, "k")
    red = tg.max if combiner == "max" else tg.min
    Y = tg.compute((2,), lambda i: red(X[i, k], axis=k), name="Y")
    x = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0]]) * (1 if combiner == "max" else -1)
    (g,) = tg.evaluate(tg.gradient(Y, [X]), {X: x})
    np.testing.assert_allclose(g, [[0, 0.5, 0.5, 0], [0.25, 0.25, 0.25, 0.25]])
    check_gradients(Y, [X], feed_for(X))


def test_prod_reduction_is_exact_with_zeros():
    X = ph((3, 4), "X")
    k = tg.reduce_axis(4, "k")
    Y = tg.compute((3,), lambda i: tg.prod(X[i, k], axis=k), name="Y")
    x = np.array([[1.0, 2.0, 3.0, 4.0], [0.0, 2.0, 3.0, 4.0], [0.0, 2.0, 0.0, 4.0]])
    (g,) = tg.evaluate(tg.gradient(Y, [X]), {X: x})
    want = np.array([[24.0, 12.0, 8.0, 6.0], [24.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(g, want)
    check_gradients(Y, [X], {X: x})


def test_prod_reduction_over_a_size_variable_is_exact_with_zeros_at_every_size():
    """A product over an axis whose extent is a size variable (a batch known at run time) is
    differentiated once, for every size: the product of the other elements, exact where some
    are zero, against finite differences and the numpy product, evaluated and compiled."""
    n = tg.var("n", min=1)
    X = ph((n, 3), "X")
    k = tg.reduce_axis((0, n), "k")
    Y = tg.compute((3,), lambda j: tg.prod(X[k, j], axis=k), name="Y")
    grads = tg.gradient(Y, [X])
    kern = tg.build(grads, [X])
    rng = np.random.default_rng(5)
    for rows in (1, 2, 5):
        x = rng.uniform(0.5, 1.5, (rows, 3))
        x[0, 1] = 0.0                    # one zero in column 1
        if rows > 2:
            x[1:3, 2] = 0.0              # two zeros in column 2
        want = np.array([[np.prod(np.delete(x[:, j], r)) for j in range(3)] for r in range(rows)])
        (got,) = tg.evaluate(grads, {X: x})
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
        np.testing.assert_allclose(kern(x), want, rtol=1e-12, atol=0)
        eps, fd = 1e-6, np.zeros_like(x)    # central differences of sum(Y), evaluated
        for at in np.ndindex(*x.shape):
            hi, lo = x.copy(), x.copy()
            hi[at] += eps
            lo[at] -= eps
            fd[at] = (tg.evaluate([Y], {X: hi})[0].sum() - tg.evaluate([Y], {X: lo})[0].sum()) / (2 * eps)
        np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("bounds", ["(n - 2, n)", "(m, n)"])
def test_prod_reduction_from_a_bound_known_at_run_time(bounds):
    """A product whose reduce axis starts at a size expression (the last two rows, or rows m to
    n, empty when m >= n): the gradient against the product of the others, evaluated and
    compiled, at several sizes."""
    n, m = tg.var("n", min=2), tg.var("m", min=0)
    X = ph((n, 3), "X")
    M = ph((m,), "M")
    k = tg.reduce_axis(eval(bounds), "k")
    Y = tg.compute((3,), lambda j: tg.prod(X[k, j], axis=k), name="Y")
    grads = list(tg.gradient(Y, [X]))
    # m's value comes from M's extent: an output copying M makes M an input
    outs = grads + [tg.compute((m,), lambda i: M[i], name="M_copy")] if bounds == "(m, n)" else grads
    ins = [X, M] if bounds == "(m, n)" else [X]
    kern = tg.build(outs, ins)
    rng = np.random.default_rng(7)
    for rows, start in ((2, 0), (4, 1), (5, 3), (3, 4)):
        x = rng.uniform(0.5, 1.5, (rows, 3))
        x[rows - 1, 0] = 0.0
        lo = rows - 2 if bounds == "(n - 2, n)" else start
        want = np.zeros_like(x)
        for r in range(lo, rows):
            want[r] = np.prod(np.delete(x[lo:rows], r - lo, axis=0), axis=0)
        args = [x, np.zeros(start)][:len(ins)]
        got = tg.evaluate(outs, dict(zip(ins, args)))[0]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
        compiled = kern(*args)
        np.testing.assert_allclose(compiled[0] if isinstance(compiled, tuple) else compiled, want,
                                   rtol=1e-12, atol=0)


def test_reductions_with_where_and_offset_axes():
    X = ph((5, 6), "X")
    k = tg.reduce_axis((1, 5), "k")
    for red in (tg.sum, tg.max, tg.min, tg.prod):
        Y = tg.compute((5,), lambda i: red(X[i, k] * X[i, k - 1], axis=k, where=k <= i + 1), name="Y")
        check_gradients(Y, [X], feed_for(X, seed=3), full_limit=0)


# ---------------------------------------------------------------------------
# the classic hard cases
# ---------------------------------------------------------------------------

def test_tensor_read_twice_transposed():
    X = ph((4, 4), "X")
    Y = tg.compute((4, 4), lambda i, j: X[i, j] * 2.0 + X[j, i] * X[i, j], name="Y")
    check_gradients(Y, [X], feed_for(X))


def test_diagonal_reads():
    X = ph((5, 5), "X")
    diag = tg.compute((5,), lambda i: X[i, i], name="diag")
    k = tg.reduce_axis(5, "k")
    trace = tg.compute((), lambda: tg.sum(X[k, k] * X[k, k], axis=k), name="trace")
    check_gradients(diag, [X], feed_for(X))
    check_gradients(trace, [X], feed_for(X))
    (g,) = tg.evaluate(tg.gradient(diag, [X]), feed_for(X))
    np.testing.assert_array_equal(g, np.eye(5))


def test_clamped_index():
    X = ph((10, 4), "X")
    k = tg.reduce_axis(6, "k")
    Y = tg.compute((4, 8), lambda j, i: tg.sum(X[tg.minimum(i + k, 9), j], axis=k), name="Y")
    check_gradients(Y, [X], feed_for(X), full_limit=0)


def _conv_inline(X, W, stride, dilation, pad):
    n, c, h, w = X.shape
    f, _, kh, kw = W.shape
    oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    ow = (w + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    P = tg.compute((n, c, h + 2 * pad, w + 2 * pad), lambda b, ch, y, x: tg.if_then_else(
        tg.all(y >= pad, y < h + pad, x >= pad, x < w + pad), X[b, ch, y - pad, x - pad], 0.0), name="pad")
    rc, ry, rx = tg.reduce_axis(c, "rc"), tg.reduce_axis(kh, "ry"), tg.reduce_axis(kw, "rx")
    return tg.compute((n, f, oh, ow), lambda b, o, y, x: tg.sum(
        P[b, rc, y * stride + ry * dilation, x * stride + rx * dilation] * W[o, rc, ry, rx],
        axis=[rc, ry, rx]), name="conv")


@pytest.mark.parametrize("stride,dilation,pad", [(1, 1, 1), (2, 1, 1), (1, 2, 2), (2, 2, 0)])
def test_strided_dilated_conv(stride, dilation, pad):
    X, W = ph((1, 2, 6, 6), "X"), ph((2, 2, 3, 3), "W")
    Y = _conv_inline(X, W, stride, dilation, pad)
    check_gradients(Y, [X, W], feed_for(X, W), full_limit=0, directions=3)


def test_reshape_that_drops_elements():
    X = ph((4, 5), "X")
    Y = tg.compute((3, 4), lambda i, j: X[(i * 4 + j) // 5, (i * 4 + j) % 5], name="Y")
    (g,) = tg.evaluate(tg.gradient(Y, [X]), feed_for(X))
    want = np.zeros(20)
    want[:12] = 1.0
    np.testing.assert_array_equal(g, want.reshape(4, 5))
    check_gradients(Y, [X], feed_for(X))


def test_concat_and_split_via_if_then_else():
    A, B = ph((2, 3), "A"), ph((2, 2), "B")
    C = tg.compute((2, 5), lambda i, j: tg.if_then_else(j < 3, A[i, j], B[i, j - 3]), name="concat")
    left = tg.compute((2, 1), lambda i, j: C[i, j] * C[i, j + 4], name="left")
    right = tg.compute((2, 4), lambda i, j: tg.sin(C[i, j + 1]), name="right")
    total = tg.compute((2,), lambda i: left[i, 0] + right[i, 0] * right[i, 3], name="total")
    check_gradients(total, [A, B], feed_for(A, B))


def test_residual_block_sharing_one_weight():
    X, W = ph((3, 4), "X"), ph((4, 4), "W")
    k = tg.reduce_axis(4, "k")
    H = tg.compute((3, 4), lambda i, j: tg.tanh(tg.sum(X[i, k] * W[k, j], axis=k)), name="H")
    k2 = tg.reduce_axis(4, "k2")
    H2 = tg.compute((3, 4), lambda i, j: tg.sum(H[i, k2] * W[k2, j], axis=k2), name="H2")
    Y = tg.compute((3, 4), lambda i, j: X[i, j] + H2[i, j], name="Y")
    check_gradients(Y, [X, W], feed_for(X, W), directions=3)


def _softmax(X, log):
    n, c = X.shape
    k = tg.reduce_axis(c, "k")
    M = tg.compute((n,), lambda i: tg.max(X[i, k], axis=k), name="rowmax")
    k2 = tg.reduce_axis(c, "k2")
    S = tg.compute((n,), lambda i: tg.sum(tg.exp(X[i, k2] - M[i]), axis=k2), name="rowsum")
    if log:
        return tg.compute((n, c), lambda i, j: X[i, j] - M[i] - tg.log(S[i]), name="log_softmax")
    return tg.compute((n, c), lambda i, j: tg.exp(X[i, j] - M[i]) / S[i], name="softmax")


@pytest.mark.parametrize("log", [False, True])
def test_softmax_via_max_reduction(log):
    X = ph((3, 5), "X")
    check_gradients(_softmax(X, log), [X], feed_for(X))


def test_data_dependent_gather():
    T = ph((6, 3), "T")
    ids = tg.placeholder((5,), dtype="int64", name="ids")
    Y = tg.compute((5, 3), lambda i, j: T[ids[i], j] * T[ids[i], j], name="Y")
    feed = feed_for(T)
    feed[ids] = np.array([0, 3, 3, 5, 0])
    check_gradients(Y, [T], feed)
    (g,) = tg.evaluate(tg.gradient(Y, [T]), feed)
    want = np.zeros((6, 3))
    np.add.at(want, feed[ids], 2 * feed[T][feed[ids]])
    np.testing.assert_allclose(g, want)


def test_nested_reductions_are_lifted():
    X = ph((3, 4), "X")
    k, k2 = tg.reduce_axis(4, "k"), tg.reduce_axis(4, "k2")
    Y = tg.compute((3,), lambda i: tg.exp(tg.sum(X[i, k] * tg.max(X[i, k2] + X[i, k], axis=k2), axis=k))
                   + tg.log(tg.sum(X[i, k] * X[i, k], axis=k)), name="Y")
    check_gradients(Y, [X], feed_for(X, low=0.2, high=1.0), full_limit=0, directions=3)


def test_zero_dim_output_and_scalar_input():
    X, s = ph((4,), "X"), ph((), "s")
    k = tg.reduce_axis(4, "k")
    L = tg.compute((), lambda: tg.sum((X[k] - s[()]) ** 2, axis=k), name="L")
    check_gradients(L, [X, s], feed_for(X, s))
    Z = tg.compute((), lambda: X[2] * s[()], name="Z")
    check_gradients(Z, [X, s], feed_for(X, s))


# ---------------------------------------------------------------------------
# the API: heads, several outputs, zeros, errors, overrides, higher order
# ---------------------------------------------------------------------------

def test_head_none_means_ones_and_result_api():
    X = ph((3,), "X")
    Y = tg.compute((3,), lambda i: X[i] * X[i], name="Y")
    res = tg.differentiate(Y, [X])
    assert len(res) == 1 and res[0] is res.gradients[0]
    (dx,) = res
    x = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(tg.evaluate([dx], {X: x})[0], 2 * x)
    np.testing.assert_allclose(tg.evaluate([res.adjoints[Y]], {})[0], np.ones(3))
    assert tg.gradient(Y, [X])[0].shape == (3,)


def test_intermediate_adjoints():
    X = ph((3,), "X")
    H = tg.compute((3,), lambda i: tg.exp(X[i]), name="H")
    Y = tg.compute((3,), lambda i: H[i] * 3.0, name="Y")
    res = tg.differentiate(Y, [X])
    np.testing.assert_allclose(tg.evaluate([res.adjoints[H]], {X: np.zeros(3)})[0], [3.0, 3.0, 3.0])


def test_several_outputs_with_heads():
    X = ph((4,), "X")
    Y1 = tg.compute((4,), lambda i: X[i] * X[i], name="Y1")
    Y2 = tg.compute((2,), lambda i: tg.sin(X[2 * i + 1]), name="Y2")
    H1, H2 = ph((4,), "H1"), ph((2,), "H2")
    (dx,) = tg.differentiate([Y1, Y2], [X], head=[H1, H2])
    x, h1, h2 = np.arange(4.0), np.array([1.0, -1.0, 2.0, 0.5]), np.array([3.0, -2.0])
    want = 2 * x * h1
    want[[1, 3]] += np.cos(x[[1, 3]]) * h2
    np.testing.assert_allclose(tg.evaluate([dx], {X: x, H1: h1, H2: h2})[0], want)


def test_unrelated_input_gets_explicit_zero():
    X, U = ph((3,), "X"), ph((2, 2), "U")
    Y = tg.compute((3,), lambda i: X[i] * 2.0, name="Y")
    dx, du = tg.gradient(Y, [X, U])
    np.testing.assert_array_equal(tg.evaluate([du], {})[0], np.zeros((2, 2)))


def test_gradient_errors():
    X = ph((3,), "X")
    ids = tg.placeholder((3,), dtype="int32", name="ids")
    Y = tg.compute((3,), lambda i: X[ids[i]], name="Y")
    with pytest.raises(tg.TeGradError, match="ids.*int32"):
        tg.differentiate(Y, [ids])
    with pytest.raises(tg.TeGradError, match="shape"):
        tg.differentiate(Y, [X], head=ph((4,), "H"))
    with pytest.raises(tg.TeGradError, match="heads"):
        tg.differentiate(Y, [X], head=[ph((3,), "H"), ph((3,), "H2")])
    with pytest.raises(tg.TeGradError, match="int32 output"):
        tg.differentiate(tg.compute((3,), lambda i: ids[i] + 1, name="Z"), [X])
    with pytest.raises(tg.TeGradError, match="must be tensors"):
        tg.differentiate(Y, [np.zeros(3)])


def test_override_with_fused_softmax_backward():
    X = ph((3, 5), "X")
    S = _softmax(X, log=False)
    Y = tg.compute((3, 5), lambda i, j: S[i, j] * S[i, j] * tg.cast(F64, j + 1), name="Y")
    calls = []

    def fused(dS):
        calls.append(dS)
        k = tg.reduce_axis(5, "k")
        dot = tg.compute((3,), lambda i: tg.sum(dS[i, k] * S[i, k], axis=k), name="dot")
        return {X: tg.compute((3, 5), lambda i, j: S[i, j] * (dS[i, j] - dot[i]), name="dX_fused")}

    res = tg.differentiate(Y, [X], override={S: fused})
    assert calls and "dsoftmax[i, j] - dot[i]" in tg.show(res[0])
    plain = tg.differentiate(Y, [X])
    feed = feed_for(X)
    np.testing.assert_allclose(tg.evaluate([res[0]], feed)[0], tg.evaluate([plain[0]], feed)[0], atol=1e-12)
    with pytest.raises(tg.TeGradError, match="does not depend"):
        tg.differentiate(Y, [X], override={S: lambda dS: {ph((3, 5), "other"): dS}})


def test_hessian_vector_product():
    X, V = ph((4,), "X"), ph((4,), "V")
    k = tg.reduce_axis(4, "k")
    f = tg.compute((), lambda: tg.sum(tg.exp(X[k]) * X[(k + 1) % 4] * X[k], axis=k), name="f")
    (g,) = tg.gradient(f, [X])
    k2 = tg.reduce_axis(4, "k2")
    gv = tg.compute((), lambda: tg.sum(g[k2] * V[k2], axis=k2), name="gv")
    (hv,) = tg.gradient(gv, [X])
    feed = feed_for(X, V)
    got = tg.evaluate([hv], feed)[0]
    eps = 1e-5
    plus, minus = dict(feed), dict(feed)
    plus[X] = feed[X] + eps * feed[V]
    minus[X] = feed[X] - eps * feed[V]
    want = (tg.evaluate([g], plus)[0] - tg.evaluate([g], minus)[0]) / (2 * eps)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    check_gradients(gv, [X, V], feed)


def test_raw_gradient_is_readable_and_uses_domain_constraints():
    A, B = ph((4, 3), "A"), ph((3, 2), "B")
    k = tg.reduce_axis(3, "k")
    C = tg.compute((4, 2), lambda i, j: tg.sum(A[i, k] * B[k, j], axis=k), name="C")
    dA, dB = tg.differentiate(C, [A, B], simplify=False)
    text = tg.show(dA)
    assert "dA[j0, j1] = sum(dC[i, j] * B[k, j] for k in range(3) for i in range(4) for j in range(2) " \
           "if (i == j0) & (k == j1))" in text
    assert "if_then_else" not in text
