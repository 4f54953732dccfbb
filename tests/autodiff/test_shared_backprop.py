"""Reverse mode over an expression DAG: a node shared by several parents gets the sum of
their contributions and passes it on once (``te_grad/autodiff/rules.backprop``), so the
gradient of ``e = f(e, e, e)`` over 14 levels (a tree of 3**14 nodes, whose adjoint summed
path by path was once deeper than te_grad's expression limit) is derived, simplified and
compiled at once, and it is right: against float64 finite differences of the reference
evaluator and against the evaluator's value of the raw (unsimplified) VJP."""
import signal

import numpy as np
import pytest

import te_grad as tg
from te_grad.evaluator import evaluate

DEPTH = 14


def _chain(e):
    for _ in range(DEPTH):
        e = tg.tanh(e) * e + e * 0.5
    return e


def _chain_np(e):
    for _ in range(DEPTH):
        e = np.tanh(e) * e + e * 0.5
    return e


def test_the_gradient_of_a_deep_dag_is_derived_once_per_node():
    def ring(*_):
        raise TimeoutError
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(120)
    try:
        X = tg.placeholder((6,), dtype="float64", name="X")
        Y = tg.compute((6,), lambda i: _chain(X[i] * 0.1), name="Y")
        k = tg.reduce_axis((0, 6), name="k")
        L = tg.compute((), lambda: tg.sum(Y[k], axis=k), name="L")
        raw, = tg.differentiate(L, [X], simplify=False)
        grad, = tg.differentiate(L, [X])
        kernel = tg.build([grad], inputs=[X])
    except TimeoutError:
        pytest.fail("reverse mode followed every path of a shared expression")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    x = np.linspace(-2.0, 2.5, 6)
    assert np.allclose(evaluate([Y], {X: x})[0], _chain_np(x * 0.1), rtol=1e-12, atol=1e-12)
    eps = 1e-6
    fd = np.array([(evaluate([L], {X: x + eps * u})[0] - evaluate([L], {X: x - eps * u})[0]) / (2 * eps)
                   for u in np.eye(6)])
    raw_value = evaluate([raw], {X: x})[0]
    np.testing.assert_allclose(raw_value, fd, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(evaluate([grad], {X: x})[0], raw_value, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(kernel(x), raw_value, rtol=1e-10, atol=1e-12)
