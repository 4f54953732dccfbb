"""tg.build_vjp: forward and backward kernels sharing saved residuals."""
import numpy as np
import pytest

import te_grad as tg
from te_grad.suite import SUITE

RNG = np.random.default_rng(8)


def _reference(w, head_value, feed):
    H = tg.placeholder(w.output.shape, name="H", dtype=w.output.dtype)
    grads = tg.gradient(w.output, w.inputs, head=H)
    return tg.evaluate(grads, {**feed, H: head_value})


@pytest.mark.parametrize("name", sorted(SUITE))
@pytest.mark.parametrize("save", ["policy", "nothing"])
def test_backward_from_residuals_equals_the_gradient(name, save):
    w = SUITE[name]("float64")
    inputs = w.inputs + list(w.data)
    vjp = tg.build_vjp([w.output], inputs, save=None if save == "policy" else [])
    feed = w.feed(RNG)
    arrays = [feed[x] for x in inputs]
    (y,), residuals = vjp.run_forward(*arrays)
    np.testing.assert_allclose(y, tg.evaluate([w.output], feed)[0], rtol=1e-10, atol=1e-12)
    head = RNG.standard_normal(w.output.shape)
    grads = vjp.run_backward(residuals, arrays, [head])
    for g, want in zip(grads, _reference(w, head, feed)):
        np.testing.assert_allclose(g, want, rtol=1e-9, atol=1e-9)
    if save == "nothing":
        assert vjp.saved == [] and vjp.residual_bytes == 0


def test_the_default_policy_saves_expensive_tensors_and_recomputes_cheap_ones():
    w = SUITE["softmax"]("float32")
    vjp = tg.build_vjp([w.output], w.inputs)
    names = {t.name for t in vjp.saved}
    assert "softmax_sum" in names and "softmax_exp" in names  # a reduction and an exp
    assert vjp.needed_inputs == []  # nothing is recomputed from the input
    assert vjp.residual_bytes == sum(t.size * 4 for t in vjp.saved)
    x = tg.placeholder((64, 32), name="X")
    cheap = tg.compute((64, 32), lambda i, j: x[i, j] * 3.0 + 1.0, name="cheap")
    out = tg.compute((64, 32), lambda i, j: cheap[i, j] * cheap[i, j], name="out")
    vjp = tg.build_vjp([out], [x])
    assert [t.name for t in vjp.recomputed] == ["cheap"] and vjp.saved == []
    assert [t.name for t in vjp.needed_inputs] == ["X"]


def test_a_forced_save_list_is_used():
    w = SUITE["layer_norm"]("float64")
    mean = next(t for t in tg.graph.topo_order([w.output]) if t.name == "layer_norm_mean")
    vjp = tg.build_vjp([w.output], w.inputs, save=[mean])
    assert [t.name for t in vjp.saved] == ["layer_norm_mean"]
    feed = w.feed(RNG)
    arrays = [feed[x] for x in w.inputs]
    _, res = vjp.run_forward(*arrays)
    head = RNG.standard_normal(w.output.shape)
    for g, want in zip(vjp.run_backward(res, arrays, [head]), _reference(w, head, feed)):
        np.testing.assert_allclose(g, want, rtol=1e-9, atol=1e-9)
    with pytest.raises(tg.UserError, match="not a computed tensor"):
        tg.build_vjp([w.output], w.inputs, save=[w.inputs[0]])
