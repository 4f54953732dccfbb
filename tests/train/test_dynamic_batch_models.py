"""The example models train with one step kernel for every batch size: the digits CNN
(Conv2d, ReLU, MaxPool2d, Flatten, Linear) and MLPs (Linear, GELU, LayerNorm, Tanh,
BatchNorm through a reshape), the ragged last batch included. Their losses, parameters and
predictions equal the fixed-shape Trainer's (``dynamic_batch=False``) on the same data, and
``predict`` runs one kernel for every batch size too."""
import numpy as np
import pytest

import te_grad as tg
from te_grad import train
from te_grad.train import digits
from symbolic_builds import use_builds

KINDS = ["real", "stand-in"]


def _cnn():
    return digits.model(), (1, 8, 8), 10


def _mlp():
    return train.Sequential(train.Flatten(), train.Linear(12, 16), train.GELU(), train.LayerNorm(16),
                            train.Linear(16, 8), train.Tanh(), train.Linear(8, 3)), (3, 4), 3


MODELS = {"digits_cnn": _cnn, "mlp": _mlp}


def _trainer(name, dynamic):
    model, feature_shape, classes = MODELS[name]()
    x = tg.placeholder((16,) + feature_shape, name="x")
    y = tg.placeholder((16,), dtype="int64", name="y")
    return train.Trainer(model, inputs=[x], targets=[y], loss=tg.nn.softmax_cross_entropy,
                         optimizer=train.Adam(lr=1e-2), init=train.xavier_uniform(seed=0), progress=False,
                         dynamic_batch=dynamic), feature_shape, classes


def _data(feature_shape, classes, n=39, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n,) + feature_shape, dtype=np.float32), rng.integers(0, classes, n).astype(np.int64)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_one_step_kernel_for_every_batch_size_equals_the_fixed_shape_trainer(monkeypatch, kind, name):
    made = use_builds(monkeypatch, kind)
    ours, feature_shape, classes = _trainer(name, dynamic=True)
    x, y = _data(feature_shape, classes)
    batches = [slice(k, k + 16) for k in range(0, len(x), 16)]  # 16, 16 and a ragged 7
    got = [ours.update(x[b], y[b]) for _ in range(2) for b in batches]
    assert ours.static_reason is None
    assert len(ours.kernels) == 1 and ours.kernels[0].size_vars
    assert len(made["symbolic"]) == 1 and made["exact"] == [], made  # one step kernel, built once
    fixed, _, _ = _trainer(name, dynamic=False)
    want = [fixed.update(x[b], y[b]) for _ in range(2) for b in batches]
    assert len(made["exact"]) == 2  # the fixed-shape trainer: one kernel per batch size (16 and 7)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    for key, value in ours.params.items():
        np.testing.assert_allclose(value, fixed.params[key], rtol=1e-4, atol=1e-5, err_msg=key)
    assert np.mean(got[3:]) < np.mean(got[:3])  # the second epoch fits better


@pytest.mark.parametrize("kind", KINDS)
def test_predict_uses_one_kernel_for_every_batch_size(monkeypatch, kind):
    made = use_builds(monkeypatch, kind)
    ours, feature_shape, classes = _trainer("digits_cnn", dynamic=True)
    fixed, _, _ = _trainer("digits_cnn", dynamic=False)
    x, _ = _data(feature_shape, classes, n=23, seed=1)
    for n in (23, 5, 1):
        got = ours.predict(x[:n])
        np.testing.assert_allclose(got, fixed.predict(x[:n]), rtol=1e-5, atol=1e-6)
    assert len(made["symbolic"]) == 1, made  # ours: one forward kernel; fixed: one per batch size
    assert len(made["exact"]) == 3, made


def test_a_model_the_batch_variable_does_not_fit_predicts_with_a_kernel_per_batch_size(monkeypatch):
    made = use_builds(monkeypatch, "stand-in")
    x, y = tg.placeholder((8, 5), name="x"), tg.placeholder((8, 3), name="y")
    w = tg.placeholder((5, 3), name="w")

    def model(x):
        rows = int(x.shape[0])  # a Python int: cannot be a size variable
        k = tg.reduce_axis((0, 5), "k")
        return tg.compute((rows, 3), lambda i, j: tg.sum(x[i, k] * w[k, j], axis=k), name="out")
    trainer = train.Trainer(model, inputs=[x], targets=[y], loss=tg.nn.mse_loss, optimizer=train.SGD(lr=0.1),
                            params=[w], progress=False)
    rng = np.random.default_rng(0)
    for n in (4, 2):
        a = rng.standard_normal((n, 5)).astype(np.float32)
        np.testing.assert_allclose(trainer.predict(a), a @ trainer.params["w"], rtol=1e-5, atol=1e-6)
    assert len(made["exact"]) == 2 and made["symbolic"] == []
