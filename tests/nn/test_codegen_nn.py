"""Every te_grad.nn operator compiled: forward and all gradients in one kernel == the evaluator.

The cases are those of ``test_nn_gradients`` (small shapes, feeds that avoid
kinks and ties). Each kernel computes the forward output and the simplified
gradients with respect to every float input, taking the head as an extra
input. Float64 must match to 1e-9; a representative subset is also compiled
in float32 and must match to 1e-4 (relative, with an absolute tolerance
scaled by the magnitude of the result).
"""
import numpy as np
import pytest

import te_grad as tg
import test_nn_gradients as nn_cases
from test_codegen import assert_same, as_list
from test_nn_gradients import CASES, OPTIONS, prepared


def _kernel_inputs(inputs, feed, head):
    """Float inputs, then the integer data placeholders of the case, then the head."""
    data = [t for t in feed if t is not head and not any(t is x for x in inputs)]
    return list(inputs) + sorted(data, key=lambda t: t.name) + [head]


def _params(names):
    return [pytest.param(n, id=n, marks=list(OPTIONS[n]["marks"])) for n in names]


@pytest.mark.parametrize("name", _params(sorted(CASES)))
def test_nn_forward_and_gradients_compiled_float64(name):
    out, inputs, feed, head, _, simp = prepared(name)
    outputs = [out] + list(simp)
    kin = _kernel_inputs(inputs, feed, head)
    kern = tg.build(outputs, inputs=kin)
    got = as_list(kern(*[feed[t] for t in kin]))
    want = tg.evaluate(outputs, feed)
    for t, g, w in zip(outputs, got, want):
        assert_same(g, w, rtol=1e-9, atol=1e-12, what=f"{name}: compiled {t.name} vs evaluator")
    text = kern.loops
    for cs in kern.stages:
        assert cs.stage.tensor.name in text


FLOAT32_SUBSET = [
    "dense_bias", "batch_matmul_bcast_a", "matmul_ta1_tb1",
    "conv2d_stride2_pad1_dil2", "conv2d_groups2_stride2_pad1", "conv2d_bias",
    "conv2d_transpose_stride2_pad1_outpad1", "conv2d_transpose_groups2",
    "max_pool2d_k3_s2_pad1_dil2", "avg_pool2d_k3_s2_pad1_exclude_pad", "global_avg_pool2d",
    "global_max_pool2d", "relu", "gelu", "sigmoid", "tanh", "softmax_axis1", "log_softmax_axis-1",
    "layer_norm_gamma_beta", "batch_norm_4d_affine", "reshape_mixed", "transpose_perm",
    "concat_axis1_three", "pad_per_axis", "strided_slice_neg_stride", "divide_both", "power_rank",
    "maximum_same", "embedding", "take_axis1_2d_indices", "mse_loss", "binary_cross_entropy",
    "softmax_cross_entropy_int32", "network_cnn_cross_entropy", "network_attention",
    "network_embedding_bag",
]


def test_float32_subset_names_exist():
    assert set(FLOAT32_SUBSET) <= set(CASES)


def _float32_case(name, monkeypatch):
    """The case rebuilt with float32 placeholders (the registry's builders read ``F64`` when called)."""
    monkeypatch.setattr(nn_cases, "F64", "float32")
    rng = np.random.default_rng(sum(map(ord, name)))
    out, inputs, feed = CASES[name](rng)
    monkeypatch.undo()
    assert out.dtype == "float32" and all(x.dtype == "float32" for x in inputs)
    feed = {t: np.asarray(v).astype(t.dtype) for t, v in feed.items()}
    head = tg.placeholder(out.shape, dtype="float32", name="head")
    feed[head] = rng.standard_normal(out.shape).astype(np.float32)
    grads = list(tg.differentiate(out, inputs, head=head))
    return out, inputs, feed, head, grads


@pytest.mark.parametrize("name", _params(FLOAT32_SUBSET))
def test_nn_forward_and_gradients_compiled_float32(name, monkeypatch):
    out, inputs, feed, head, grads = _float32_case(name, monkeypatch)
    outputs = [out] + grads
    kin = _kernel_inputs(inputs, feed, head)
    got = as_list(tg.build(outputs, inputs=kin)(*[feed[t] for t in kin]))
    want = tg.evaluate(outputs, feed)
    for t, g, w in zip(outputs, got, want):
        assert g.dtype == np.float32
        assert_same(g, w, rtol=1e-4, atol=1e-4, scaled=True, what=f"{name}: compiled {t.name} vs evaluator")
