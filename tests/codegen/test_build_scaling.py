"""What building costs does not grow with the extents of the tensors (nothing of that size
is allocated by a build: a register block's plan is a closed form, not a list of blocks)."""
import tracemalloc

import numpy as np

import te_grad as tg


def _sum_and_gradient(n):
    X = tg.placeholder((n,), name="X")
    k = tg.reduce_axis((0, n), name="k")
    S = tg.compute((), lambda: tg.sum(X[k], axis=k), name="S")
    dX, = tg.gradient(S, [X])
    return X, S, dX


def test_building_for_three_billion_elements_takes_little_memory(monkeypatch):
    monkeypatch.setenv("TE_GRAD_CACHE", "0")
    X, S, dX = _sum_and_gradient(3_000_000_000)
    tracemalloc.start()
    try:
        kernel = tg.build([S, dX], inputs=[X])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200e6, f"building took {peak / 1e6:.0f} MB"
    assert kernel.outputs[1].shape == (3_000_000_000,)


def test_the_same_plan_still_computes_the_sum():
    for n in (1, 7, 8, 9, 33, 1000, 100_003):  # full blocks, a narrower or an overlapping tail
        X, S, dX = _sum_and_gradient(n)
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        s, dx = tg.build([S, dX], inputs=[X])(x)
        np.testing.assert_allclose(s, x.astype(np.float64).sum(), rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(dx, np.ones(n, np.float32))
