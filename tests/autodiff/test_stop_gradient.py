"""tg.stop_gradient: the value of its argument, a zero derivative.

Finite differences see the true function, so the gradient through a
stop_gradient is checked against its analytic value; the softmax family,
which stops the gradient of its max shift, is checked against finite
differences by the nn gradient tests (the shift's total derivative is zero).
"""
import numpy as np

import te_grad as tg
from te_grad import nn


def test_value_is_the_argument_evaluated_and_compiled():
    x = tg.placeholder((5,), dtype="float64", name="x")
    y = tg.compute((5,), lambda i: tg.stop_gradient(x[i] * 2.0) + 1.0, name="y")
    xv = np.linspace(-1, 1, 5)
    np.testing.assert_allclose(tg.evaluate([y], {x: xv})[0], 2 * xv + 1)
    np.testing.assert_allclose(tg.build([y], [x])(xv), 2 * xv + 1)


def test_gradient_treats_it_as_a_constant():
    x = tg.placeholder((4,), dtype="float64", name="x")
    y = tg.compute((4,), lambda i: x[i] * tg.stop_gradient(x[i] * x[i]), name="y")
    xv = np.array([0.5, -1.0, 2.0, 3.0])
    (dx,) = tg.gradient(y, [x])  # d/dx [x * c] with c = x^2 held constant: c
    np.testing.assert_allclose(tg.evaluate([dx], {x: xv})[0], xv ** 2)
    np.testing.assert_allclose(tg.build([dx], [x])(xv), xv ** 2)


def test_integer_arguments_are_returned_unchanged():
    i = tg.placeholder((3,), dtype="int64", name="i")
    e = i[0] + 1
    assert tg.stop_gradient(e) is e


def test_softmax_gradient_does_not_differentiate_its_max():
    x = tg.placeholder((3, 7), dtype="float64", name="X")
    (dx,) = tg.gradient(nn.softmax(x), [x])
    text = tg.show(dx)
    assert "softmax_max_ties" not in text and "dsoftmax_max" not in text
