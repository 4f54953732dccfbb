"""te_grad ops as JAX functions (te_grad.jax): jit, grad, value_and_grad, vmap.

Skipped only where JAX is not installed; CI installs it and fails on skips."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import te_grad.jax as tgj  # noqa: E402
from bridge_ops import causal_conv1d, embedding, layer_norm, two_outputs  # noqa: E402

RNG = np.random.default_rng(5)
CONV = tgj.custom_op(causal_conv1d)
LN = tgj.custom_op(layer_norm)
EMB = tgj.custom_op(embedding)
TWO = tgj.custom_op(two_outputs)


def jax_causal_conv1d(x, w, dilation=2):
    pad = (w.shape[2] - 1) * dilation
    return jax.lax.conv_general_dilated(jnp.pad(x, ((0, 0), (0, 0), (pad, 0))), w, (1,), "VALID",
                                        rhs_dilation=(dilation,))


def jax_layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * g + b


def arr(*shape, dtype=jnp.float64):
    return jnp.asarray(RNG.standard_normal(shape), dtype)


CASES = {
    "conv": (CONV, jax_causal_conv1d, lambda: (arr(2, 3, 9), arr(4, 3, 3)), (0, 1)),
    "layer_norm": (LN, jax_layer_norm, lambda: (arr(4, 8), arr(8), arr(8)), (0, 1, 2)),
    "embedding": (EMB, lambda t, i: t[i], lambda: (arr(6, 3), jnp.array([1, 5, 5, 0])), (0,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_jit_grad_and_value_and_grad_match_jax(name, dtype):
    op, ref, make, argnums = CASES[name]
    args = tuple(a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a for a in make())
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == jnp.float32 else dict(rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(op(*args), ref(*args), **tol)
    loss = lambda *a: (op(*a) ** 2).sum()  # noqa: E731
    rloss = lambda *a: (ref(*a) ** 2).sum()  # noqa: E731
    got = jax.jit(jax.grad(loss, argnums=argnums))(*args)
    want = jax.grad(rloss, argnums=argnums)(*args)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g, w, **tol)
    value, grads = jax.value_and_grad(loss, argnums=argnums)(*args)
    np.testing.assert_allclose(value, rloss(*args), **tol)


def test_vmap_works():
    w = arr(4, 3, 3)
    xs = arr(5, 2, 3, 9)
    got = jax.vmap(lambda x: CONV(x, w))(xs)
    np.testing.assert_allclose(got, jnp.stack([jax_causal_conv1d(x, w) for x in xs]), rtol=1e-10)
    g = jax.grad(lambda xs: (jax.vmap(lambda x: CONV(x, w))(xs) ** 2).sum())(xs)
    want = jax.grad(lambda xs: (jnp.stack([jax_causal_conv1d(x, w) for x in xs]) ** 2).sum())(xs)
    np.testing.assert_allclose(g, want, rtol=1e-10)


def test_two_outputs_and_numerical_gradients():
    from jax.test_util import check_grads
    x = arr(3, 4)
    s, t = TWO(x)
    np.testing.assert_allclose(s, (x * x).sum(1))
    np.testing.assert_allclose(t, jnp.tanh(x))
    check_grads(lambda x: TWO(x)[0] + TWO(x)[1].sum(1), (x,), order=1, modes=["rev"])
    check_grads(CONV, (arr(2, 3, 7), arr(2, 3, 3)), order=1, modes=["rev"])


def test_an_op_whose_kernels_come_from_the_build_cache(tmp_path, monkeypatch):
    """A second op over the same function finds its kernels in the disk build cache, whose
    output tensors are other objects than the op's own: the residuals are still found."""
    monkeypatch.setenv("TE_GRAD_CACHE_DIR", str(tmp_path))
    args = (arr(5, 8), arr(8), arr(8))
    grads = []
    for _ in range(2):  # the first op fills the cache, the second reads it
        op = tgj.custom_op(layer_norm)
        loss = lambda *a, op=op: (op(*a) ** 2).sum()  # noqa: E731
        grads.append(jax.grad(loss, argnums=(0, 1, 2))(*args))
    want = jax.grad(lambda *a: (jax_layer_norm(*a) ** 2).sum(), argnums=(0, 1, 2))(*args)
    for got in grads:
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
