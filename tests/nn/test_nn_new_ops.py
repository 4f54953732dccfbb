"""The reductions and array operations of te_grad.nn against PyTorch (values and gradients)."""
import numpy as np
import pytest

import te_grad as tg
from te_grad import nn

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(4)


def both(build, ref, shapes, int_inputs=()):
    xs = [tg.placeholder(s, dtype="float64", name=f"x{k}") for k, s in enumerate(shapes)]
    values = [RNG.standard_normal(s) for s in shapes]
    extra = {t: v for t, v in int_inputs}
    y = build(*xs, *[t for t, _ in int_inputs])
    head = tg.placeholder(y.shape, dtype=y.dtype, name="H")
    hv = RNG.standard_normal(y.shape)
    feed = {**dict(zip(xs, values)), **extra, head: hv}
    got = tg.evaluate([y] + tg.gradient(y, xs, head=head), feed)
    ts = [torch.tensor(v, requires_grad=True) for v in values]
    out = ref(*ts, *[torch.tensor(v) for _, v in int_inputs])
    out.backward(torch.tensor(hv))
    np.testing.assert_allclose(got[0], out.detach().numpy(), rtol=1e-10, atol=1e-12)
    for g, t in zip(got[1:], ts):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_reductions():
    both(lambda x: nn.sum(x, 1), lambda x: x.sum(1), [(3, 4, 2)])
    both(lambda x: nn.sum(x), lambda x: x.sum(), [(3, 4)])
    both(lambda x: nn.mean(x, (0, 2), keepdims=True), lambda x: x.mean((0, 2), keepdim=True), [(3, 4, 2)])
    both(lambda x: nn.variance(x, -1), lambda x: x.var(-1, unbiased=False), [(3, 5)])
    both(lambda x: nn.variance(x, 0, correction=1), lambda x: x.var(0), [(4, 3)])
    both(lambda x: nn.max(x, 1), lambda x: x.amax(1), [(3, 6)])
    both(lambda x: nn.min(x, (0, 1)), lambda x: x.amin((0, 1)), [(3, 6)])


def test_array_operations():
    both(lambda x: nn.clip(x, -0.3, 0.4), lambda x: x.clamp(-0.3, 0.4), [(4, 5)])
    both(lambda a, b: nn.stack([a, b], 1), lambda a, b: torch.stack([a, b], 1), [(2, 3), (2, 3)])
    both(lambda x: nn.expand_dims(x, -1), lambda x: x.unsqueeze(-1), [(2, 3)])
    both(lambda x: nn.squeeze(x, 1), lambda x: x.squeeze(1), [(2, 1, 3)])
    both(lambda x: nn.cumsum(x, 1), lambda x: x.cumsum(1), [(3, 6)])
    cond = RNG.integers(0, 2, (3, 4)).astype(bool)
    c = tg.placeholder((3, 4), dtype="bool", name="c")
    both(lambda a, b, c: nn.where(c, a, b), lambda a, b, c: torch.where(c, a, b), [(3, 4), (1, 4)],
         int_inputs=[(c, cond)])
    i = tg.placeholder((4,), dtype="int64", name="i")
    both(lambda w, i: nn.multiply(nn.one_hot(i, 5, dtype="float64"), w),
         lambda w, i: torch.nn.functional.one_hot(i, 5).double() * w, [(4, 5)], int_inputs=[(i, np.array([0, 4, 4, 2]))])
    idx = tg.placeholder((3, 2), dtype="int64", name="idx")
    iv = np.array([[1, 2], [0, 0], [1, 2]])
    both(lambda x, idx: nn.gather_nd(x, idx), lambda x, idx: x[idx[:, 0], idx[:, 1]], [(2, 3, 4)],
         int_inputs=[(idx, iv)])
    np.testing.assert_array_equal(tg.evaluate([nn.arange(5)], {})[0], np.arange(5))


def test_batch_matmul_transposed_a_and_dense_cross_entropy():
    both(lambda a, b: nn.batch_matmul(a, b, transpose_a=True), lambda a, b: a.transpose(1, 2) @ b,
         [(2, 4, 3), (2, 4, 5)])
    both(lambda z, t: nn.cross_entropy(z, t), lambda z, t: torch.nn.functional.cross_entropy(z, t),
         [(3, 5), (3, 5)])
