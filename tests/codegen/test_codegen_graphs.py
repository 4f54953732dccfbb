"""The graphs of the differentiator and simplifier tests, compiled: kernel == evaluator.

Each graph is compiled with its forward outputs and its gradients (with a
head placeholder as an input) in one kernel, in float64, and compared with the
reference evaluator to 1e-9.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import te_grad as tg
from te_grad import nn
from te_grad.testing import random_feed
from test_codegen import assert_kernel_matches

F64 = "float64"


def ph(shape, name, dtype=F64):
    return tg.placeholder(shape, dtype=dtype, name=name)


def feed_for(*tensors, seed=0, low=-1.0, high=1.0):
    return random_feed(tensors, np.random.default_rng(seed), low, high)


def check_with_gradients(outputs, wrt, feed, *, extra_inputs=(), simplify=True, seed=1, **tol):
    """Compile ``outputs`` and their gradients w.r.t. ``wrt`` (heads as inputs); compare with the evaluator."""
    outputs = list(outputs)
    heads = [ph(o.shape, f"head{n}", o.dtype) for n, o in enumerate(outputs)]
    grads = list(tg.differentiate(outputs, list(wrt), head=heads, simplify=simplify))
    rng = np.random.default_rng(seed)
    feed = dict(feed)
    for h in heads:
        feed[h] = rng.standard_normal(h.shape).astype(h.dtype)
    inputs = list(wrt) + list(extra_inputs) + heads
    return assert_kernel_matches(outputs + grads, inputs, feed, **tol)


# ---------------------------------------------------------------------------
# one rule at a time
# ---------------------------------------------------------------------------

UNARY = {
    "exp": tg.exp, "log": tg.log, "sqrt": tg.sqrt, "tanh": tg.tanh, "sigmoid": tg.sigmoid,
    "abs": tg.abs, "sin": tg.sin, "cos": tg.cos, "erf": tg.erf, "neg": lambda x: -x,
    "square": lambda x: x * x, "cube": lambda x: x ** 3, "recip": lambda x: 1.0 / x,
}


def test_unary_rules_compiled():
    X = ph((3, 4), "X")
    outs = []
    for name in sorted(UNARY):
        f = UNARY[name]
        outs.append(tg.compute((3, 4), lambda i, j: f(X[i, j]), name=f"{name}_top"))
        outs.append(tg.compute((3, 4), lambda i, j: 2.0 * f(X[i, j]) + X[i, j], name=f"{name}_inside"))
    check_with_gradients(outs, [X], feed_for(X, low=0.3, high=1.5))


def test_unary_rules_compiled_at_negative_and_zero_inputs():
    X = ph((8,), "X")
    outs = [tg.compute((8,), lambda i: f(X[i]), name=f"{name}_y") for name, f in sorted(UNARY.items())
            if name not in ("log", "sqrt", "recip")]
    x = np.array([-3.0, -1.0, -0.25, 0.0, 0.25, 1.0, 3.0, -0.0])
    check_with_gradients(outs, [X], {X: x})


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_binary_rules_compiled(ties):
    A, B = ph((6,), "A"), ph((6,), "B")
    fns = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "div": lambda a, b: a / b, "pow": tg.pow, "maximum": tg.maximum, "minimum": tg.minimum}
    outs = [tg.compute((6,), lambda i: f(A[i], B[i]), name=name) for name, f in fns.items()]
    feed = feed_for(A, B, low=0.5, high=2.0)
    if ties:
        feed[B][::2] = feed[A][::2]
    check_with_gradients(outs, [A, B], feed)


def test_piecewise_constant_intrinsics_and_casts():
    X = ph((8,), "X")
    Y = tg.compute((8,), lambda i: tg.floor(X[i]) + tg.ceil(X[i]) + tg.trunc(X[i]) + tg.round(X[i])
                   + tg.cast(F64, X[i] > 0.0), name="Y")
    Z = tg.compute((8,), lambda i: tg.if_then_else(X[i] > 0.0, tg.cast(F64, tg.cast("float32", X[i]) * 3.0),
                                                  X[i] * X[i]), name="Z")
    A = tg.compute((8,), lambda i: tg.abs(X[i]), name="absX")
    x = np.array([-2.5, -0.5, 0.0, 0.25, 0.5, 1.5, 2.5, -1.0])
    _, got = check_with_gradients([Y, Z, A], [X], {X: x})
    assert np.all(np.isfinite(got[3]))


def test_elementwise_max_min_ties():
    A, B = ph((3,), "A"), ph((3,), "B")
    Y = tg.compute((3,), lambda i: tg.maximum(A[i], B[i]) + 10.0 * tg.minimum(A[i], B[i]), name="Y")
    check_with_gradients([Y], [A, B], {A: np.array([1.0, 2.0, 3.0]), B: np.array([2.0, 2.0, 1.0])})


@pytest.mark.parametrize("combiner", ["max", "min"])
def test_max_min_reduction_with_ties(combiner):
    X = ph((3, 4), "X")
    k = tg.reduce_axis(4, "k")
    red = tg.max if combiner == "max" else tg.min
    Y = tg.compute((3,), lambda i: red(X[i, k], axis=k), name="Y")
    x = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0], [-1.0, 0.0, -2.0, 0.5]])
    sign = 1 if combiner == "max" else -1
    _, (y, dx) = check_with_gradients([Y], [X], {X: x * sign})
    # with a head of ones the tie rule splits evenly
    kern = tg.build(tg.gradient(Y, [X]), inputs=[X])
    np.testing.assert_allclose(kern(x * sign)[:2], [[0, 0.5, 0.5, 0], [0.25] * 4])


def test_prod_reduction_with_zeros():
    X = ph((4, 4), "X")
    k = tg.reduce_axis(4, "k")
    Y = tg.compute((4,), lambda i: tg.prod(X[i, k], axis=k), name="Y")
    x = np.array([[1.0, 2.0, 3.0, 4.0], [0.0, 2.0, 3.0, 4.0], [0.0, 2.0, 0.0, 4.0], [-1.0, 0.5, 2.0, -0.0]])
    check_with_gradients([Y], [X], {X: x})
    (dx,) = tg.gradient(Y, [X])
    np.testing.assert_array_equal(tg.build([dx], inputs=[X])(x)[:3],
                                  [[24.0, 12.0, 8.0, 6.0], [24.0, 0.0, 0.0, 0.0], [0.0] * 4])


@pytest.mark.parametrize("combiner", ["sum", "max", "min", "prod"])
def test_reductions_with_where_and_offset_axes(combiner):
    X = ph((5, 6), "X")
    k = tg.reduce_axis((1, 5), "k")
    red = getattr(tg, combiner)
    Y = tg.compute((5,), lambda i: red(X[i, k] * X[i, k - 1], axis=k, where=k <= i + 1), name="Y")
    # an empty row (where never holds) gives the identity
    E = tg.compute((5,), lambda i: red(X[i, k], axis=k, where=k > i + 10), name="E")
    check_with_gradients([Y, E], [X], feed_for(X, seed=3))


def test_raw_gradients_compile_too():
    X = ph((5, 6), "X")
    k = tg.reduce_axis((1, 5), "k")
    Y = tg.compute((5,), lambda i: tg.max(X[i, k] * X[i, k - 1], axis=k, where=k <= i + 1), name="Y")
    check_with_gradients([Y], [X], feed_for(X, seed=3), simplify=False)


# ---------------------------------------------------------------------------
# the classic hard cases
# ---------------------------------------------------------------------------

def test_tensor_read_twice_transposed():
    X = ph((4, 4), "X")
    Y = tg.compute((4, 4), lambda i, j: X[i, j] * 2.0 + X[j, i] * X[i, j], name="Y")
    check_with_gradients([Y], [X], feed_for(X))


def test_diagonal_and_trace():
    X = ph((5, 5), "X")
    diag = tg.compute((5,), lambda i: X[i, i] * 3.0, name="diag")
    k = tg.reduce_axis(5, "k")
    trace = tg.compute((), lambda: tg.sum(X[k, k] * X[k, k], axis=k), name="trace")
    check_with_gradients([diag, trace], [X], feed_for(X))


def test_clamped_index():
    X = ph((10, 4), "X")
    k = tg.reduce_axis(6, "k")
    Y = tg.compute((4, 8), lambda j, i: tg.sum(X[tg.minimum(i + k, 9), j], axis=k), name="Y")
    check_with_gradients([Y], [X], feed_for(X))


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
def test_strided_dilated_inline_conv(stride, dilation, pad):
    X, W = ph((1, 2, 6, 6), "X"), ph((2, 2, 3, 3), "W")
    Y = _conv_inline(X, W, stride, dilation, pad)
    check_with_gradients([Y], [X, W], feed_for(X, W))


def test_reshape_that_drops_elements():
    X = ph((4, 5), "X")
    Y = tg.compute((3, 4), lambda i, j: X[(i * 4 + j) // 5, (i * 4 + j) % 5], name="Y")
    check_with_gradients([Y], [X], feed_for(X))


def test_concat_and_split_via_if_then_else():
    A, B = ph((2, 3), "A"), ph((2, 2), "B")
    C = tg.compute((2, 5), lambda i, j: tg.if_then_else(j < 3, A[i, j], B[i, j - 3]), name="concat")
    left = tg.compute((2, 1), lambda i, j: C[i, j] * C[i, j + 4], name="left")
    right = tg.compute((2, 4), lambda i, j: tg.sin(C[i, j + 1]), name="right")
    total = tg.compute((2,), lambda i: left[i, 0] + right[i, 0] * right[i, 3], name="total")
    check_with_gradients([total, C], [A, B], feed_for(A, B))


def test_residual_block_sharing_one_weight():
    X, W = ph((3, 4), "X"), ph((4, 4), "W")
    k = tg.reduce_axis(4, "k")
    H = tg.compute((3, 4), lambda i, j: tg.tanh(tg.sum(X[i, k] * W[k, j], axis=k)), name="H")
    k2 = tg.reduce_axis(4, "k2")
    H2 = tg.compute((3, 4), lambda i, j: tg.sum(H[i, k2] * W[k2, j], axis=k2), name="H2")
    Y = tg.compute((3, 4), lambda i, j: X[i, j] + H2[i, j], name="Y")
    check_with_gradients([Y], [X, W], feed_for(X, W))


def _softmax(X, log):
    n, c = X.shape
    k = tg.reduce_axis(c, "k")
    M = tg.compute((n,), lambda i: tg.max(X[i, k], axis=k), name="rowmax")
    k2 = tg.reduce_axis(c, "k2")
    S = tg.compute((n,), lambda i: tg.sum(tg.exp(X[i, k2] - M[i]), axis=k2), name="rowsum")
    if log:
        return tg.compute((n, c), lambda i, j: X[i, j] - M[i] - tg.log(S[i]), name="log_softmax")
    return tg.compute((n, c), lambda i, j: tg.exp(X[i, j] - M[i]) / S[i], name="softmax")


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_via_max_reduction(log):
    X = ph((3, 5), "X")
    feed = feed_for(X)
    feed[X][1, 1] = feed[X][1, 3] = feed[X][1].max() + 0.5  # a tie for the row max
    check_with_gradients([_softmax(X, log)], [X], feed)


def test_override_with_fused_softmax_backward():
    X = ph((3, 5), "X")
    S = _softmax(X, log=False)
    Y = tg.compute((3, 5), lambda i, j: S[i, j] * S[i, j] * tg.cast(F64, j + 1), name="Y")

    def fused(dS):
        k = tg.reduce_axis(5, "k")
        dot = tg.compute((3,), lambda i: tg.sum(dS[i, k] * S[i, k], axis=k), name="dot")
        return {X: tg.compute((3, 5), lambda i, j: S[i, j] * (dS[i, j] - dot[i]), name="dX_fused")}

    (dx,) = tg.differentiate(Y, [X], override={S: fused})
    (plain,) = tg.differentiate(Y, [X])
    feed = feed_for(X)
    _, (a, b) = assert_kernel_matches([dx, plain], [X], feed)
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_data_dependent_gather():
    T = ph((6, 3), "T")
    ids = tg.placeholder((5,), dtype="int64", name="ids")
    Y = tg.compute((5, 3), lambda i, j: T[ids[i], j] * T[ids[i], j], name="Y")
    feed = feed_for(T)
    feed[ids] = np.array([0, 3, 3, 5, 0])
    check_with_gradients([Y], [T], feed, extra_inputs=[ids])


def test_nested_reductions_are_lifted():
    X = ph((3, 4), "X")
    k, k2 = tg.reduce_axis(4, "k"), tg.reduce_axis(4, "k2")
    Y = tg.compute((3,), lambda i: tg.exp(tg.sum(X[i, k] * tg.max(X[i, k2] + X[i, k], axis=k2), axis=k))
                   + tg.log(tg.sum(X[i, k] * X[i, k], axis=k)), name="Y")
    check_with_gradients([Y], [X], feed_for(X, low=0.2, high=1.0))


def test_zero_dim_outputs_and_scalar_input():
    X, s = ph((4,), "X"), ph((), "s")
    k = tg.reduce_axis(4, "k")
    L = tg.compute((), lambda: tg.sum((X[k] - s[()]) ** 2, axis=k), name="L")
    Z = tg.compute((), lambda: X[2] * s[()], name="Z")
    _, got = check_with_gradients([L, Z], [X, s], feed_for(X, s))
    assert got[0].shape == () and got[1].shape == () and got[3].shape == ()


def test_several_outputs_with_heads():
    X = ph((4,), "X")
    Y1 = tg.compute((4,), lambda i: X[i] * X[i], name="Y1")
    Y2 = tg.compute((2,), lambda i: tg.sin(X[2 * i + 1]), name="Y2")
    check_with_gradients([Y1, Y2], [X], feed_for(X))


def test_unrelated_input_gets_explicit_zero():
    X, U = ph((3,), "X"), ph((2, 2), "U")
    Y = tg.compute((3,), lambda i: X[i] * 2.0, name="Y")
    _, got = check_with_gradients([Y], [X, U], feed_for(X, U))
    np.testing.assert_array_equal(got[2], np.zeros((2, 2)))


def test_hessian_vector_product():
    X, V = ph((4,), "X"), ph((4,), "V")
    k = tg.reduce_axis(4, "k")
    f = tg.compute((), lambda: tg.sum(tg.exp(X[k]) * X[(k + 1) % 4] * X[k], axis=k), name="f")
    (g,) = tg.gradient(f, [X])
    k2 = tg.reduce_axis(4, "k2")
    gv = tg.compute((), lambda: tg.sum(g[k2] * V[k2], axis=k2), name="gv")
    (hv,) = tg.gradient(gv, [X])
    feed = feed_for(X, V)
    assert_kernel_matches([f, g, gv, hv], [X, V], feed)
    check_with_gradients([gv], [X, V], feed)


# ---------------------------------------------------------------------------
# the simplifier's graphs
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda x: tg.nn.transpose(x, (1, 0)),
    lambda x: tg.nn.reshape(x, (3, 8)),
    lambda x: tg.nn.flatten(tg.nn.reshape(x, (2, 3, 4))),
    lambda x: tg.nn.strided_slice(x, (1, 0), (6, 4), (2, 1)),
    lambda x: tg.nn.pad(x, ((1, 2), (0, 1))),
    lambda x: tg.compute((6, 4), lambda i, j: tg.exp(x[i, j]), name="e"),
], ids=["transpose", "reshape", "flatten", "slice", "pad", "elementwise"])
def test_single_valued_maps(make):
    x = ph((6, 4), "X")
    check_with_gradients([make(x)], [x], feed_for(x))


def test_strided_conv_gather():
    x, w = ph((1, 2, 9, 9), "X"), ph((3, 2, 3, 3), "W")
    check_with_gradients([nn.conv2d(x, w, stride=2, padding=1)], [x, w], feed_for(x, w))


def test_cumsum_where_and_triangle():
    x = ph((16, 16), "X")
    k = tg.reduce_axis(16, "k")
    y = tg.compute((16, 16), lambda i, j: tg.sum(x[i, k], axis=k, where=k <= j), name="cumsum")
    xx = ph((1, 1, 7, 7), "XX")
    k9 = tg.reduce_axis(9, "k9")
    tri = tg.compute((9, 9), lambda i, j: tg.sum(xx[0, 0, k9 % 7, j % 7], axis=k9, where=(k9 >= i) & (k9 <= j)),
                     name="tri")
    feed = feed_for(x, xx)
    _, got = check_with_gradients([y, tri], [x, xx], feed)
    np.testing.assert_allclose(got[0], np.cumsum(feed[x], axis=1), rtol=1e-12)


def test_softmax_contributions_merged():
    x = ph((8, 10), "X")
    check_with_gradients([nn.softmax(x)], [x], feed_for(x, seed=1))


def test_embedding_scatter():
    table, ids = ph((50, 4), "table"), tg.placeholder((7,), dtype="int64", name="ids")
    feed = feed_for(table)
    feed[ids] = np.array([3, 3, 49, 0, 7, 3, 0])
    check_with_gradients([nn.embedding(table, ids)], [table], feed, extra_inputs=[ids])


def test_guarded_reads():
    x = ph((8,), "X")
    ids = tg.placeholder((8,), dtype="int64", name="ids")
    y = tg.compute((8,), lambda i: tg.if_then_else(i < 7, x[i + 1], 0.0) + x[ids[i]]
                   + tg.if_then_else((i > 0) & (x[i] > 0.0), x[i - 1], 0.0), name="y")
    feed = feed_for(x)
    feed[ids] = np.array([7, 0, 3, 3, 1, 0, 6, 2])
    check_with_gradients([y], [x], feed, extra_inputs=[ids])


def _self_guarded(i, X, D):  # |r| where D[i] != 0: r guarded by a test of r itself
    k = tg.reduce_axis((0, 3), "k")
    r = tg.sum(X[i, k] // D[i], axis=k)
    return tg.if_then_else(D[i] != 0, tg.if_then_else(r > 0, r, -r), 0)


def _mutually_guarded(i, X, D):  # r1 guarded by a test of r2 and r2 by a test of r1
    k, m = tg.reduce_axis((0, 3), "k"), tg.reduce_axis((0, 3), "m")
    r1 = tg.sum(X[i, k] // D[i], axis=k)
    r2 = tg.sum(X[i, m] // D[i] - 1, axis=m)
    return tg.if_then_else(D[i] != 0, tg.if_then_else(D[i] > 1, tg.if_then_else(r1 > 3, r2, 0),
                                                      tg.if_then_else(r2 > 3, r1, 0)), 0)


@pytest.mark.parametrize("body", [_self_guarded, _mutually_guarded])
def test_reductions_guarded_by_tests_of_themselves_or_each_other(body):
    """A reduction guarded by a division it needs (``D[i] != 0``) and by a test of itself, or
    of another such reduction whose guard tests it: lifting builds each guard from the
    conditions that do not lead back to the reduction (a test of the reduction itself is
    evaluated wherever the guards before it hold). Before, building recursed without end."""
    X = tg.placeholder((4, 3), dtype="int64", name="X")
    D = tg.placeholder((4,), dtype="int64", name="D")
    Y = tg.compute((4,), lambda i: body(i, X, D), name="Y")
    x, d = np.arange(12).reshape(4, 3), np.array([2, 0, 3, 1])
    want = tg.evaluate([Y], {X: x, D: d})[0]
    np.testing.assert_array_equal(want, [1, 0, 6, 30] if body is _self_guarded else [0, 0, 3, 30])
    np.testing.assert_array_equal(tg.build([Y], [X, D])(x, d), want)


def test_a_reduction_reached_by_too_many_paths_keeps_a_safe_guard_they_share_after_different_ones():
    """As below, but the paths begin differently (``D[i] > 0``, or ``D[i] <= 0`` and ``D[i] <
    0``) and then all pass ``X[i, 0] > 3``, a test that may be evaluated anywhere: the lifted
    sum is filtered by it, which excludes the row where ``D[i]`` is 0."""
    X = tg.placeholder((4, 3), dtype="int64", name="X")
    D = tg.placeholder((4,), dtype="int64", name="D")

    def body(i):
        k = tg.reduce_axis((0, 3), "k")
        e = tg.sum(X[i, k] // D[i], axis=k)
        for _ in range(6):
            e = tg.if_then_else(e > 1, e - 1, e * 2 + 1)
        s = tg.if_then_else(X[i, 0] > 3, e, 0)
        return tg.if_then_else(D[i] > 0, s, tg.if_then_else(D[i] < 0, s, 0))
    Y = tg.compute((4,), body, name="Y")
    x, d = np.arange(12).reshape(4, 3) + 1, np.array([2, 0, -3, 1])
    x[1] = 0
    want = tg.evaluate([Y], {X: x, D: d})[0]
    np.testing.assert_array_equal(want, [0, 0, -513, 27])
    np.testing.assert_array_equal(tg.build([Y], [X, D])(x, d), want)


def test_a_reduction_reached_by_too_many_paths_keeps_the_guard_they_share():
    """A reduction that divides by ``D[i]``, under ``D[i] != 0``, then read through six levels
    of selections (3^6 paths, more than lifting enumerates): it is taken as reached by the
    guard all its paths share, so the lifted sum is still filtered by ``D[i] != 0``. Before,
    it was taken as reached unguarded and the kernel divided by zero."""
    from te_grad.lift import MAX_PATHS
    X = tg.placeholder((4, 3), dtype="int64", name="X")
    D = tg.placeholder((4,), dtype="int64", name="D")

    def body(i):
        k = tg.reduce_axis((0, 3), "k")
        e = tg.if_then_else(D[i] != 0, tg.sum(X[i, k] // D[i], axis=k), 0)
        for _ in range(6):
            e = tg.if_then_else(e > 1, e - 1, e * 2 + 1)
        return e
    assert 3 ** 6 > MAX_PATHS
    Y = tg.compute((4,), body, name="Y")
    x, d = np.arange(12).reshape(4, 3), np.array([2, 0, 3, 1])
    want = tg.evaluate([Y], {X: x, D: d})[0]
    np.testing.assert_array_equal(want, [1, 2, 3, 24])
    np.testing.assert_array_equal(tg.build([Y], [X, D])(x, d), want)


@pytest.mark.parametrize("name", ["bias_add", "row_sum", "exp_tanh_sigmoid", "embedding", "transpose"])
def test_suite_workloads_at_full_size(name):
    """A few reference workloads at their real sizes, float32 (threads split these)."""
    from te_grad.suite import workload
    w = workload(name)
    rng = np.random.default_rng(0)
    feed = w.feed(rng)
    head = tg.placeholder(w.output.shape, dtype=w.output.dtype, name="head")
    feed[head] = rng.standard_normal(head.shape).astype(head.dtype)
    grads = list(tg.differentiate(w.output, w.inputs, head=head))
    data = sorted(w.data, key=lambda t: t.name)
    assert_kernel_matches([w.output] + grads, list(w.inputs) + data + [head], feed,
                          rtol=1e-4, atol=1e-4, scaled=True)


# ---------------------------------------------------------------------------
# property: random reductions with quasi-affine where= conditions
# ---------------------------------------------------------------------------

N_I, N_J, N_K = 6, 5, 8


def _constraints():
    coef = st.integers(-2, 2)
    affine = st.tuples(st.just("ge"), coef, coef, coef, st.integers(-4, 6))
    modular = st.tuples(st.just("mod"), coef, coef, st.integers(-1, 2), st.integers(2, 3), st.integers(0, 2))
    return st.lists(st.one_of(affine, modular), min_size=0, max_size=3)


def _condition(c, i, j, k):
    if c[0] == "ge":
        _, a, b, e, d = c
        return a * i + b * j + e * k + d >= 0
    _, a, b, e, m, r = c
    return (a * i + b * j + e * k) % m == r % m


READS = {
    "row": lambda X, i, j, k: X[k, j],
    "col": lambda X, i, j, k: X[i, k],
    "strided": lambda X, i, j, k: X[(i + 2 * k) % N_K, j] * X[k, (j + k) % N_K],
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_constraints(), st.sampled_from(["sum", "max", "min", "prod"]), st.sampled_from(sorted(READS)),
       st.integers(0, 2 ** 16))
def test_random_guarded_reductions(constraints, combiner, read, seed):
    """Integer-valued data, so every order of summation is exact: compiled == evaluated exactly."""
    X = ph((N_K, N_K), "X")
    k = tg.reduce_axis(N_K, "k")
    red = getattr(tg, combiner)

    def body(i, j):
        conds = [_condition(c, i, j, k) for c in constraints]
        where = tg.all(*conds) if conds else None
        return red(READS[read](X, i, j, k), axis=k, where=where)
    Y = tg.compute((N_I, N_J), body, name="Y")
    rng = np.random.default_rng(seed)
    values = [-1.0, 1.0, 2.0] if combiner == "prod" else [-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0]
    feed = {X: rng.choice(values, size=X.shape)}
    outputs, inputs = [Y], [X]
    if combiner == "sum":
        head = ph(Y.shape, "head")
        feed[head] = rng.integers(-3, 4, size=Y.shape).astype(F64)
        outputs += list(tg.differentiate(Y, [X], head=head))
        inputs.append(head)
    assert_kernel_matches(outputs + [tg.simplify(Y)], inputs, feed, rtol=0, atol=0)
