"""Helpers shared by the te_grad.nn tests: placeholders, random data, evaluation, comparison."""
import numpy as np

import te_grad as tg


def ph(shape, name, dtype="float64"):
    return tg.placeholder(shape, dtype, name)


def random_arrays(seed: int):
    """``rand(shape, dtype)``: standard normal arrays from a generator seeded with ``seed``."""
    rng = np.random.default_rng(seed)

    def rand(shape, dtype="float64"):
        return rng.standard_normal(shape).astype(dtype)
    return rand


def ev(t, feed):
    """``t`` through the reference evaluator, checking its dtype and shape."""
    out = tg.evaluate([t], feed)[0]
    assert out.dtype == np.dtype(t.dtype) and out.shape == t.shape
    return out


def close(got, want, dtype="float64"):
    tol = 1e-10 if dtype == "float64" else 2e-5
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
