"""The bridges' per-op caches are bounded: an op called with ever new shapes keeps at most
``max_shapes`` of them built (least recently used dropped, engines freed), and stays flat
in memory; a dropped shape seen again is rebuilt and computes the same."""
import gc
import os
import weakref

import numpy as np
import pytest

import te_grad as tg
from te_grad.errors import UserError

torch = pytest.importorskip("torch")
import te_grad.torch as tgt  # noqa: E402


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _exp_times(x):
    return tg.compute(x.shape, lambda i: tg.exp(x[i]) * x[i], name="y")


def test_a_torch_op_over_hundreds_of_shapes_stays_flat(monkeypatch):
    monkeypatch.setenv("TE_GRAD_CACHE", "0")
    monkeypatch.setenv("TE_GRAD_JIT_CACHE", "8")
    op = tgt.custom_op("tg_bridge_caches::exp_times", _exp_times)
    op.max_shapes = 8  # an attribute: the steady state comes sooner
    first = None
    samples = []
    for n in range(1, 241):
        x = torch.linspace(-1.0, 1.0, n, dtype=torch.float64)
        y = op(x)
        if n == 1:
            first = weakref.ref(op.spec(x))
        if n in (40, 240):
            np.testing.assert_allclose(y.numpy(), (torch.exp(x) * x).numpy(), rtol=1e-12)
            gc.collect()
            samples.append(_rss_mb())
    assert samples[1] - samples[0] < 12, f"RSS grew from {samples[0]:.0f} MB to {samples[1]:.0f} MB"
    assert len(op._specs) <= 8 and len(op._seen) <= 8
    gc.collect()
    assert first() is None  # the first shape's graph and kernels are gone


def test_a_dropped_torch_shape_is_rebuilt_with_its_gradient(monkeypatch):
    monkeypatch.setenv("TE_GRAD_CACHE", "0")
    op = tgt.custom_op("tg_bridge_caches::exp_times_grad", _exp_times, max_shapes=2)
    assert op.max_shapes == 2
    for n in (3, 4, 5, 3, 6, 3):
        x = torch.linspace(-1.0, 1.0, n, dtype=torch.float64, requires_grad=True)
        op(x).sum().backward()
        ref = x.detach().clone().requires_grad_(True)
        (torch.exp(ref) * ref).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), ref.grad.numpy(), rtol=1e-12)
        assert len(op._specs) <= 2
    assert op._specs.keys() == [(((6,), "float64"),), (((3,), "float64"),)]  # most recent last
    with pytest.raises(UserError, match="max_shapes"):
        op.max_shapes = 0
    with pytest.raises(UserError, match="max_shapes"):
        tgt.custom_op("tg_bridge_caches::bad", _exp_times, max_shapes=2.5)


def test_a_jax_op_keeps_at_most_max_shapes(monkeypatch):
    jax = pytest.importorskip("jax")
    import te_grad.jax as tgj
    monkeypatch.setenv("TE_GRAD_CACHE", "0")
    jax.config.update("jax_enable_x64", True)
    f = tgj.custom_op(_exp_times, max_shapes=3)
    first = None
    for n in (2, 3, 4, 5, 6, 2):
        x = np.linspace(-1.0, 1.0, n)
        np.testing.assert_allclose(np.asarray(f(x)), np.exp(x) * x, rtol=1e-12)
        g = jax.grad(lambda a: f(a).sum())(x)
        np.testing.assert_allclose(np.asarray(g), np.exp(x) * (x + 1.0), rtol=1e-12)
        if first is None:
            first = weakref.ref(f.spec(x))
        assert len(f._specs) <= 3
    gc.collect()
    assert first() is None  # dropped when shape (2,) fell out, rebuilt since
    assert f.max_shapes == 3
    f.max_shapes = 1
    assert len(f._specs) == 1
