"""The Trainer's batch dimension is a size variable: one step kernel serves every batch
size, the ragged last batch of an epoch included. Losses, accuracies and updated
parameters are PyTorch's (float64 reference) at three batch sizes; each test runs with
tg.build's own kernels on size variables ("real") and with the stand-in of
tests/symbolic_builds.py ("stand-in")."""
import numpy as np
import pytest

import te_grad as tg
from te_grad import train
from symbolic_builds import use_builds

KINDS = ["real", "stand-in"]
BATCHES = (8, 5, 3)


def _trainer(loss=tg.nn.mse_loss, classes=None, **kw):
    x = tg.placeholder((8, 5), name="x")
    y = tg.placeholder((8,), dtype="int64", name="y") if classes else tg.placeholder((8, 3), name="y")
    model = train.Sequential(train.Linear(5, 7), train.Tanh(), train.Linear(7, 3))
    return train.Trainer(model, inputs=[x], targets=[y], loss=loss, optimizer=train.SGD(lr=0.1, momentum=0.9),
                         init=train.xavier_normal(seed=1), progress=False, **kw)


def _torch_steps(params, batches, classes):
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.from_numpy(params[name].astype(np.float64)))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    losses, accs = [], []
    for xb, yb in batches:
        opt.zero_grad()
        out = net(torch.from_numpy(xb.astype(np.float64)))
        if classes:
            target = torch.from_numpy(yb)
            loss = torch.nn.functional.cross_entropy(out, target)
            accs.append((out.argmax(1) == target).double().mean().item())
        else:
            loss = torch.nn.functional.mse_loss(out, torch.from_numpy(yb.astype(np.float64)))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, accs, {n: p.detach().numpy() for n, p in net.named_parameters()}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("classes", [False, True])
def test_one_step_kernel_for_every_batch_size_with_pytorchs_values(monkeypatch, kind, classes):
    made = use_builds(monkeypatch, kind)
    loss = tg.nn.softmax_cross_entropy if classes else tg.nn.mse_loss
    trainer = _trainer(loss, classes)
    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((b, 5)).astype(np.float32),
                rng.integers(0, 3, b).astype(np.int64) if classes else rng.standard_normal((b, 3)).astype(np.float32))
               for b in BATCHES]
    want_losses, want_accs, want_params = _torch_steps(trainer.params, batches, classes)
    for step, ((xb, yb), want) in enumerate(zip(batches, want_losses)):
        got = trainer.update(xb, yb)
        np.testing.assert_allclose(got, want, rtol=1e-5)
        if classes:
            assert trainer.last["accuracy"] == pytest.approx(want_accs[step], abs=1e-6)
    for name, value in trainer.params.items():
        np.testing.assert_allclose(value, want_params[name], rtol=1e-4, atol=1e-5)
    assert trainer.static_reason is None
    assert len(trainer.kernels) == 1 and trainer.kernels[0].size_vars
    assert len(made["symbolic"]) == 1 and made["exact"] == [], made  # one step kernel, built once


@pytest.mark.parametrize("kind", KINDS)
def test_fit_with_a_ragged_last_batch_uses_the_one_kernel(monkeypatch, kind):
    made = use_builds(monkeypatch, kind)
    trainer = _trainer()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((21, 5)).astype(np.float32)
    y = (x[:, :3] * 0.5).astype(np.float32)
    losses = trainer.fit(x, y, epochs=3, batch_size=8)  # batches of 8, 8 and 5
    assert losses[-1] < losses[0]
    assert len(trainer.kernels) == 1 and len(made["symbolic"]) == 1 and made["exact"] == []
    seconds = trainer.compile(8, 5, 3)  # nothing left to build
    assert seconds >= 0 and len(made["symbolic"]) == 1


def test_dynamic_batch_false_builds_a_kernel_per_batch_size(monkeypatch):
    made = use_builds(monkeypatch, "stand-in")
    trainer = _trainer(dynamic_batch=False)
    rng = np.random.default_rng(0)
    for b in BATCHES:
        trainer.update(rng.standard_normal((b, 5)).astype(np.float32), rng.standard_normal((b, 3)).astype(np.float32))
    assert len(trainer.kernels) == 3 and len(made["exact"]) == 3 and made["symbolic"] == []
    with pytest.raises(tg.errors.UserError, match="dynamic_batch must be True or False"):
        _trainer(dynamic_batch="yes")


def test_a_model_that_needs_an_int_batch_falls_back_to_kernels_per_batch_size(monkeypatch):
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
    with pytest.warns(RuntimeWarning, match="a kernel per batch size"):
        trainer.update(rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32))
    trainer.update(rng.standard_normal((5, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32))
    assert "TypeError" in trainer.static_reason
    assert len(trainer.kernels) == 2 and len(made["exact"]) == 2
