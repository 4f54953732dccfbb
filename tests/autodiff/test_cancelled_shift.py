"""Cancelled shifts (te_grad.autodiff.shift): a max shift written by hand without stop_gradient.

The softmax family does not depend on its shift ``m``, so the VJP passes ``m`` no gradient and
never differentiates the max. Gradients are checked against float64 central differences of the
forward formulas in numpy and through the oracle; that the dropped term is zero is checked by
feeding ``m`` as an independent input and differencing the output with respect to it. Shifts
that do not cancel keep their gradient.
"""
import numpy as np
import pytest

import te_grad as tg
from te_grad import nn
from te_grad.autodiff.shift import cancelled_shifts, tangent_class

R, C = 3, 5
EPS = 1e-6


def _max(x, name="m"):
    k = tg.reduce_axis(x.shape[1], "k")
    return tg.compute((x.shape[0],), lambda i: tg.max(x[i, k], axis=k), name=name)


def softmax_staged(x, m):
    d = tg.compute(x.shape, lambda i, j: x[i, j] - m[i], name="d")
    e = tg.compute(x.shape, lambda i, j: tg.exp(d[i, j]), name="e")
    k = tg.reduce_axis(x.shape[1], "k2")
    s = tg.compute((x.shape[0],), lambda i: tg.sum(e[i, k], axis=k), name="s")
    return tg.compute(x.shape, lambda i, j: e[i, j] / s[i], name="y")


def softmax_fused(x, m):
    e = tg.compute(x.shape, lambda i, j: tg.exp(x[i, j] - m[i]), name="e")
    k = tg.reduce_axis(x.shape[1], "k2")
    s = tg.compute((x.shape[0],), lambda i: tg.sum(e[i, k], axis=k), name="s")
    return tg.compute(x.shape, lambda i, j: e[i, j] / s[i], name="y")


def _sum_exp(x, m):
    k = tg.reduce_axis(x.shape[1], "k2")
    return tg.compute((x.shape[0],), lambda i: tg.sum(tg.exp(x[i, k] - m[i]), axis=k), name="s")


def log_softmax(x, m):
    s = _sum_exp(x, m)
    return tg.compute(x.shape, lambda i, j: x[i, j] - m[i] - tg.log(s[i]), name="y")


def logsumexp(x, m):
    s = _sum_exp(x, m)
    return tg.compute((x.shape[0],), lambda i: m[i] + tg.log(s[i]), name="y")


def logsumexp_one_stage(x, m):
    k = tg.reduce_axis(x.shape[1], "k2")
    return tg.compute((x.shape[0],), lambda i: m[i] + tg.log(tg.sum(tg.exp(x[i, k] - m[i]), axis=k)), name="y")


def np_softmax(x, m):
    e = np.exp(x - m[:, None])
    return e / e.sum(1, keepdims=True)


def np_log_softmax(x, m):
    return x - m[:, None] - np.log(np.exp(x - m[:, None]).sum(1, keepdims=True))


def np_logsumexp(x, m):
    return m + np.log(np.exp(x - m[:, None]).sum(1))


CANCELLING = {
    "softmax_staged": (softmax_staged, np_softmax),
    "softmax_fused": (softmax_fused, np_softmax),
    "log_softmax": (log_softmax, np_log_softmax),
    "logsumexp": (logsumexp, np_logsumexp),
    "logsumexp_one_stage": (logsumexp_one_stage, np_logsumexp),
}


def _inputs(ties: bool, seed=0):
    rng = np.random.default_rng(seed)
    xv = rng.standard_normal((R, C))
    if ties:  # the max reached two or three times per row
        xv[0, 1] = xv[0, 3] = xv[0].max() + 0.5
        xv[1, :3] = xv[1].max() + 0.25
        xv[2, 4] = xv[2, 0] = xv[2].max() + 1.0
    return xv


def _fd(f, xv, hv, eps=EPS):
    """Central differences of ``sum(h * f(x))``."""
    g = np.zeros_like(xv)
    for idx in np.ndindex(*xv.shape):
        xp, xm = xv.copy(), xv.copy()
        xp[idx] += eps
        xm[idx] -= eps
        g[idx] = (np.sum(hv * f(xp)) - np.sum(hv * f(xm))) / (2 * eps)
    return g


def _check(y, x, xv, fwd, rng):
    hv = rng.standard_normal(y.shape)
    h = tg.placeholder(y.shape, dtype="float64", name="H")
    res = tg.differentiate(y, [x], head=h)
    want = _fd(fwd, xv, hv)
    oracle = tg.evaluate([res[0]], {x: xv, h: hv})[0]
    np.testing.assert_allclose(oracle, want, rtol=1e-6, atol=1e-7)
    compiled = tg.build([res[0]], [x, h])(xv, hv)
    np.testing.assert_allclose(compiled, want, rtol=1e-6, atol=1e-7)
    return res


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("form", sorted(CANCELLING))
def test_hand_written_forms_drop_the_max_and_match_finite_differences(form, ties):
    build, np_fwd = CANCELLING[form]
    x = tg.placeholder((R, C), dtype="float64", name="X")
    m = _max(x)
    y = build(x, m)
    xv = _inputs(ties)
    res = _check(y, x, xv, lambda v: np_fwd(v, v.max(1)), np.random.default_rng(1))
    assert m not in res.adjoints
    text = tg.show(res[0])
    assert "m_ties" not in text and "dm[" not in text and "m_max" not in text


@pytest.mark.parametrize("form", sorted(CANCELLING))
def test_the_dropped_term_is_zero(form):
    """With ``m`` an independent input, the output does not move when ``m`` does, and the
    analysis says so for exactly these forms."""
    build, np_fwd = CANCELLING[form]
    x = tg.placeholder((R, C), dtype="float64", name="X")
    mp = tg.placeholder((R,), dtype="float64", name="M")
    y = build(x, mp)
    xv = _inputs(False)
    mv = xv.max(1) + np.array([0.3, -0.7, 1.1])  # any shift, not only the max
    hv = np.random.default_rng(2).standard_normal(y.shape)
    dm = _fd(lambda v: np_fwd(xv, v), mv, hv)
    np.testing.assert_allclose(dm, 0.0, atol=1e-8)
    assert tangent_class(mp, [y]) == [("Z",)]
    # the te_grad gradient with respect to the input m (computed, not dropped: m is an input)
    h = tg.placeholder(y.shape, dtype="float64", name="H")
    (g,) = tg.gradient(y, [mp], head=h)
    np.testing.assert_allclose(tg.evaluate([g], {x: xv, mp: mv, h: hv})[0], 0.0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# shifts that do not cancel keep m's gradient, and stay correct
# ---------------------------------------------------------------------------------------------

def unnormalized(x, m):  # exp(x - m) alone depends on m
    return tg.compute(x.shape, lambda i, j: tg.exp(x[i, j] - m[i]), name="y")


def also_used(x, m):  # a softmax plus m itself
    sm = softmax_fused(x, m)
    return tg.compute(x.shape, lambda i, j: sm[i, j] + 0.5 * m[i], name="y2")


def wrong_coefficient(x, m):  # x - 2 m - log(sum exp(x - m))
    s = _sum_exp(x, m)
    return tg.compute(x.shape, lambda i, j: x[i, j] - 2.0 * m[i] - tg.log(s[i]), name="y")


def normalized_over_the_other_axis(x, m):  # shift along rows, normalization along columns
    e = tg.compute(x.shape, lambda i, j: tg.exp(x[i, j] - m[i]), name="e")
    k = tg.reduce_axis(x.shape[0], "k2")
    s = tg.compute((x.shape[1],), lambda j: tg.sum(e[k, j], axis=k), name="s")
    return tg.compute(x.shape, lambda i, j: e[i, j] / s[j], name="y")


def centred_square(x, m):  # (x - m)^2 summed: a variance around m
    k = tg.reduce_axis(x.shape[1], "k2")
    return tg.compute((x.shape[0],), lambda i: tg.sum((x[i, k] - m[i]) * (x[i, k] - m[i]), axis=k), name="y")


def sum_of_shifted(x, m):  # sum_j (x - m): the shift does not factor out of a sum
    k = tg.reduce_axis(x.shape[1], "k2")
    return tg.compute((x.shape[0],), lambda i: tg.sum(x[i, k] - m[i], axis=k), name="y")


def plus_constant(x, m):  # exp(x - m) / (sum exp(x - m) + 1)
    s = _sum_exp(x, m)
    return tg.compute(x.shape, lambda i, j: tg.exp(x[i, j] - m[i]) / (s[i] + 1.0), name="y")


NOT_CANCELLING = {
    "unnormalized": (unnormalized, lambda x, m: np.exp(x - m[:, None])),
    "also_used": (also_used, lambda x, m: np_softmax(x, m) + 0.5 * m[:, None]),
    "wrong_coefficient": (wrong_coefficient, lambda x, m: np_log_softmax(x, m) - m[:, None]),
    "other_axis": (normalized_over_the_other_axis,
                   lambda x, m: np.exp(x - m[:, None]) / np.exp(x - m[:, None]).sum(0, keepdims=True)),
    "centred_square": (centred_square, lambda x, m: ((x - m[:, None]) ** 2).sum(1)),
    "sum_of_shifted": (sum_of_shifted, lambda x, m: (x - m[:, None]).sum(1)),
    "plus_constant": (plus_constant,
                      lambda x, m: np.exp(x - m[:, None]) / (np.exp(x - m[:, None]).sum(1, keepdims=True) + 1)),
}


@pytest.mark.parametrize("form", sorted(NOT_CANCELLING))
def test_shifts_that_do_not_cancel_keep_the_gradient(form):
    build, np_fwd = NOT_CANCELLING[form]
    x = tg.placeholder((R, C), dtype="float64", name="X")
    m = _max(x)
    y = build(x, m)
    xv = _inputs(False, seed=3)  # no ties: the max is differentiable
    res = _check(y, x, xv, lambda v: np_fwd(v, v.max(1)), np.random.default_rng(4))
    assert m in res.adjoints
    assert id(m) not in cancelled_shifts([y])
    # and m really matters: the output moves when m (as an input) does
    mp = tg.placeholder((R,), dtype="float64", name="M")
    assert tangent_class(mp, [build(x, mp)]) != [("Z",)]
    hv = np.random.default_rng(5).standard_normal(y.shape)
    assert np.abs(_fd(lambda v: np_fwd(xv, v), xv.max(1), hv)).max() > 1e-3


def test_a_second_output_that_depends_on_m_keeps_it():
    x = tg.placeholder((R, C), dtype="float64", name="X")
    m = _max(x)
    y = softmax_fused(x, m)
    other = tg.compute((R,), lambda i: m[i] * 2.0, name="other")
    res = tg.differentiate([y, other], [x])
    assert m in res.adjoints
    xv = _inputs(False, seed=6)
    want = _fd(lambda v: np_softmax(v, v.max(1)), xv, np.ones((R, C))) + _fd(lambda v: 2 * v.max(1), xv, np.ones(R))
    np.testing.assert_allclose(tg.evaluate([res[0]], {x: xv})[0], want, rtol=1e-6, atol=1e-7)


def test_an_override_below_keeps_it():
    x = tg.placeholder((R, C), dtype="float64", name="X")
    m = _max(x)
    y = softmax_fused(x, m)
    e = y.op.inputs()[0] if y.op.inputs()[0].name == "e" else y.op.inputs()[1]
    assert id(m) in cancelled_shifts([y])
    assert id(m) not in cancelled_shifts([y], [e])


# ---------------------------------------------------------------------------------------------
# the cost: the hand-written gradient is the stop_gradient one
# ---------------------------------------------------------------------------------------------

def _staged_with_stop_gradient(x):
    """The staged softmax with its shift wrapped in stop_gradient (te_grad.formulations)."""
    from te_grad.formulations import softmax_stages
    work = softmax_stages("float32", small=True)
    return work.output, work.inputs[0]


@pytest.mark.parametrize("hand, library", [(softmax_fused, nn.softmax), (log_softmax, nn.log_softmax)])
def test_iterations_match_the_library_softmax(hand, library):
    x = tg.placeholder((8, 32), name="X")
    (g_hand,) = tg.gradient(hand(x, _max(x)), [x])
    (g_lib,) = tg.gradient(library(x), [x])
    assert tg.iterations(g_hand) == tg.iterations(g_lib)


def test_iterations_of_the_staged_softmax_match_its_stop_gradient_form():
    y_sg, x_sg = _staged_with_stop_gradient(None)
    x = tg.placeholder(x_sg.shape, name="X")
    (g_hand,) = tg.gradient(softmax_staged(x, _max(x)), [x])
    (g_sg,) = tg.gradient(y_sg, [x_sg])
    assert tg.iterations(g_hand) == tg.iterations(g_sg)
