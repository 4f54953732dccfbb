"""Means over a symbolic extent keep the tensor's precision: 1 / n in float64 for float64 values."""
import numpy as np
import pytest

import te_grad as tg


@pytest.mark.parametrize("compiled", [False, True])
def test_float64_means_over_a_size_variable_are_exact(compiled):
    b = tg.var("batch", min=1)
    x = tg.placeholder((b, 4), dtype="float64", name="x")
    y = tg.placeholder((b, 4), dtype="float64", name="y")
    outs = [tg.nn.mean(x, (0,)), tg.nn.variance(x, (0,)), tg.nn.mse_loss(x, y)]
    rng = np.random.default_rng(0)
    a, c = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    want = [a.mean(0), a.var(0), np.mean((a - c) ** 2)]
    if compiled:
        got = tg.build(outs, [x, y])(a, c)
    else:
        got = tg.evaluate(outs, {x: a, y: c}, sizes={b: 3})
    for gv, wv in zip(got, want):
        np.testing.assert_allclose(gv, wv, rtol=1e-14, atol=1e-15)
