"""te_grad.train: optimizers, layers and the one-kernel training step, against formulas,
the reference evaluator and (where installed; always in CI) PyTorch."""
import numpy as np
import pytest

import te_grad as tg
from te_grad import train

RNG = np.random.default_rng(12)


def _numpy_opt(kind, opts, p, grads, lr=0.1):
    """The update formulas written out with numpy, step after step."""
    p = p.astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        if kind == "sgd":
            mom, nes, wd = opts.get("momentum", 0.0), opts.get("nesterov", False), opts.get("weight_decay", 0.0)
            g = g + wd * p
            if mom:
                m = g if t == 1 else mom * m + g
                g = g + mom * m if nes else m
            p = p - lr * g
        else:
            b1, b2, eps, wd = 0.9, 0.999, 1e-8, opts.get("weight_decay", 0.0)
            if kind == "adamw":
                p = p * (1 - lr * wd)
            elif wd:
                g = g + wd * p
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            p = p - (lr / (1 - b1 ** t)) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps)
    return p


OPTIMIZERS = [
    ("sgd", train.SGD, {}),
    ("sgd", train.SGD, {"momentum": 0.9}),
    ("sgd", train.SGD, {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("adam", train.Adam, {}),
    ("adam", train.Adam, {"weight_decay": 0.05}),
    ("adamw", train.AdamW, {"weight_decay": 0.05}),
]


def _run_optimizer(cls, opts, start, grads, dtype="float64"):
    p = tg.placeholder(start.shape, name="p", dtype=dtype)
    g = tg.placeholder(start.shape, name="g", dtype=dtype)
    opt = cls(lr=0.1, **opts)
    states = [tg.placeholder(start.shape, name=f"s{k}", dtype=dtype) for k in range(len(opt.states()))]
    lr, t = tg.placeholder((), name="lr"), tg.placeholder((), name="t")
    new_p, new_states = opt.update(p, g, states, train.Hyper(lr, t))
    kern = tg.build([new_p] + new_states, [p, g, lr, t] + states)
    value = start.astype(dtype)
    state_values = [np.zeros(start.shape, dtype) for _ in states]
    for step, gv in enumerate(grads, start=1):
        got = kern(value, gv.astype(dtype), np.float32(0.1), np.float32(step), *state_values)
        got = got if isinstance(got, tuple) else (got,)
        value, state_values = got[0], list(got[1:])
    return value


@pytest.mark.parametrize("kind,cls,opts", OPTIMIZERS)
def test_optimizer_updates_follow_their_formulas(kind, cls, opts):
    start = RNG.standard_normal((4, 3))
    grads = [RNG.standard_normal((4, 3)) for _ in range(5)]
    got = _run_optimizer(cls, opts, start, grads)
    np.testing.assert_allclose(got, _numpy_opt(kind, opts, start, grads), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind,cls,opts", OPTIMIZERS)
def test_optimizer_updates_match_torch_optim(kind, cls, opts):
    torch = pytest.importorskip("torch")
    start = RNG.standard_normal((4, 3)).astype(np.float32)
    grads = [RNG.standard_normal((4, 3)).astype(np.float32) for _ in range(5)]
    got = _run_optimizer(cls, opts, start, grads, dtype="float32")
    p = torch.nn.Parameter(torch.from_numpy(start.copy()))
    torch_cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    opt = torch_cls([p], lr=0.1, **opts)
    for gv in grads:
        p.grad = torch.from_numpy(gv.copy())
        opt.step()
    np.testing.assert_allclose(got, p.detach().numpy(), rtol=1e-4, atol=1e-5)  # float32 rounding


def _regression(batch=8, model=None, optimizer=None, **kw):
    x = tg.placeholder((batch, 5), name="x")
    y = tg.placeholder((batch, 3), name="y")
    model = model or train.Sequential(train.Linear(5, 7), train.Tanh(), train.Linear(7, 3))
    return model, train.Trainer(model, inputs=[x], targets=[y], loss=tg.nn.mse_loss,
                                optimizer=optimizer or train.SGD(lr=0.1, momentum=0.9),
                                init=train.xavier_normal(seed=1), progress=False, **kw)


def test_a_step_equals_the_evaluators_forward_gradient_and_update():
    model, trainer = _regression()
    before = trainer.params
    xb, yb = RNG.standard_normal((8, 5)).astype(np.float32), RNG.standard_normal((8, 3)).astype(np.float32)
    x, y = tg.placeholder((8, 5), name="x"), tg.placeholder((8, 3), name="y")
    loss = tg.nn.mse_loss(model(x, train.Context(training=False)), y)
    phs = [p.placeholder for p in model.parameters()]
    feed = {x: xb, y: yb, **{p: before[p.name] for p in phs}}
    want_loss, *grads = tg.evaluate([loss] + tg.gradient(loss, phs), feed)
    got_loss = trainer.update(xb, yb, lr=0.05)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    after = trainer.params
    for p, g in zip(phs, grads):  # SGD with momentum, first step: p - lr * g
        np.testing.assert_allclose(after[p.name], before[p.name] - 0.05 * g, rtol=1e-5, atol=1e-6)
    assert trainer.t == 1
    np.testing.assert_allclose(trainer.states["0.weight.momentum_buffer"], grads[0], rtol=1e-5, atol=1e-6)


class _TwoHeads(train.Module):
    """A classifier that also returns its hidden features: ``(logits, features)``."""

    def __init__(self):
        self.body, self.head = train.Sequential(train.Linear(5, 7), train.Tanh()), train.Linear(7, 3)

    def parameters(self):
        return self.body.parameters() + self.head.parameters()

    def __call__(self, x, ctx):
        features = self.body(x, ctx)
        return self.head(features, ctx), features


def test_a_model_of_several_outputs_trains_predicts_and_exports_them_all(tmp_path):
    """A loss of one output with one class-label target (the accuracy the Trainer adds for
    such a target reads a single output, and is skipped for a tuple); ``predict`` returns
    every output, and ``export`` gives ``NAME_predict`` a buffer for each."""
    model = _TwoHeads()
    x, y = tg.placeholder((8, 5), name="x"), tg.placeholder((8,), dtype="int64", name="y")
    trainer = train.Trainer(model, inputs=[x], targets=[y], progress=False, init=train.xavier_normal(seed=1),
                            loss=lambda outs, y: tg.nn.softmax_cross_entropy(outs[0], y),
                            optimizer=train.SGD(lr=0.1))
    xb, yb = RNG.standard_normal((8, 5)).astype(np.float32), RNG.integers(0, 3, 8).astype(np.int64)
    before = trainer.params
    phs = [p.placeholder for p in model.parameters()]
    feed = {x: xb, y: yb, **{p: before[p.name] for p in phs}}
    logits, features = model(x, train.Context(training=False))
    loss = tg.nn.softmax_cross_entropy(logits, y)
    want_loss, want_logits, want_features, *grads = tg.evaluate([loss, logits, features] + tg.gradient(loss, phs),
                                                                feed)
    got_logits, got_features = trainer.predict(xb)
    np.testing.assert_allclose(got_logits, want_logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_features, want_features, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.update(xb, yb), want_loss, rtol=1e-5)
    for p, g in zip(phs, grads):
        np.testing.assert_allclose(trainer.params[p.name], before[p.name] - 0.1 * g, rtol=1e-5, atol=1e-6)
    files = trainer.export(str(tmp_path / "two"))
    header = open(files["header"]).read()
    assert "float *out0" in header and "float *out1" in header, header


def test_gradient_accumulation_and_clipping():
    _, plain = _regression(optimizer=train.SGD(lr=0.1))
    _, acc = _regression(optimizer=train.SGD(lr=0.1), accumulate=2)
    _, wide = _regression(batch=16, optimizer=train.SGD(lr=0.1))
    xb, yb = RNG.standard_normal((16, 5)).astype(np.float32), RNG.standard_normal((16, 3)).astype(np.float32)
    acc.update(xb[:8], yb[:8])
    assert acc.t == 0 and all(np.array_equal(v, plain.params[k]) for k, v in acc.params.items())
    acc.update(xb[8:], yb[8:])
    wide.update(xb, yb)  # the mean loss over 16 rows: its gradient is the mean of the two halves'
    assert acc.t == 1
    for k, v in acc.params.items():
        np.testing.assert_allclose(v, wide.params[k], rtol=1e-5, atol=1e-6)
    _, clipped = _regression(optimizer=train.SGD(lr=1.0), clip_norm=0.01)
    before = clipped.params
    clipped.update(xb[:8], yb[:8])
    step = np.sqrt(sum(((clipped.params[k] - before[k]) ** 2).sum() for k in before))
    np.testing.assert_allclose(step, 0.01, rtol=1e-3)  # lr 1: the step is the clipped gradient


def test_ragged_last_batch_save_load_and_profile(tmp_path):
    _, trainer = _regression(dynamic_batch=False)  # a kernel per batch size (tests/train/test_dynamic_batch.py: one)
    x = RNG.standard_normal((21, 5)).astype(np.float32)
    y = RNG.standard_normal((21, 3)).astype(np.float32)
    losses = trainer.fit(x, y, epochs=3, batch_size=8)  # batches of 8, 8 and 5
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert {key[0][0][0] for key in trainer._steps} == {8, 5}
    path = tmp_path / "model.npz"
    trainer.save(str(path))
    _, other = _regression()
    other.load(str(path))
    assert other.t == trainer.t
    for k, v in trainer.params.items():
        np.testing.assert_array_equal(other.params[k], v)
    # other predicts with its one kernel for every batch size, trainer with an exact one: the same up to rounding
    np.testing.assert_allclose(other.predict(x[:8]), trainer.predict(x[:8]), rtol=1e-6, atol=1e-7)
    # and so does a step: the same loss up to rounding (one kernel for every batch size against
    # one for batches of 8), the same update of the same parameters
    np.testing.assert_allclose(other.update(x[:8], y[:8]), trainer.update(x[:8], y[:8]), rtol=1e-6)
    rows = trainer.profile(x[:8], y[:8], repeat=2, show=False)
    assert rows and all(r["ms"] >= 0 for r in rows) and any("weight_new" in r["stage"] for r in rows)
    with pytest.raises(tg.UserError, match="float32"):
        trainer.update(x[:8].astype(np.float64), y[:8])


def test_batch_norm_running_statistics_match_pytorch():
    torch = pytest.importorskip("torch")
    x = tg.placeholder((6, 3, 4, 4), name="x")
    y = tg.placeholder((6, 3, 4, 4), name="y")
    model = train.Sequential(train.BatchNorm2d(3, momentum=0.2))
    trainer = train.Trainer(model, inputs=[x], targets=[y], loss=tg.nn.mse_loss, optimizer=train.SGD(lr=0.1),
                            progress=False)
    twin = torch.nn.Sequential(torch.nn.BatchNorm2d(3, momentum=0.2))
    opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    for _ in range(3):
        xb = RNG.standard_normal((6, 3, 4, 4)).astype(np.float32) * 2 + 1
        yb = RNG.standard_normal((6, 3, 4, 4)).astype(np.float32)
        loss = trainer.update(xb, yb)
        opt.zero_grad()
        tloss = torch.nn.functional.mse_loss(twin(torch.from_numpy(xb)), torch.from_numpy(yb))
        tloss.backward()
        opt.step()
        np.testing.assert_allclose(loss, tloss.item(), rtol=1e-5)
    state = twin.state_dict()
    for name in ("0.running_mean", "0.running_var", "0.weight", "0.bias"):
        got = trainer.states.get(name, trainer.params.get(name))
        np.testing.assert_allclose(got, state[name].numpy(), rtol=1e-5, atol=1e-6)
    twin.eval()
    xb = RNG.standard_normal((6, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(trainer.predict(xb), twin(torch.from_numpy(xb)).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_dropout_layers_and_functions():
    x = tg.placeholder((16, 20), name="x")
    y = tg.placeholder((16,), name="y", dtype="int64")
    model = train.Sequential(train.Linear(20, 32), train.GELU(), train.Dropout(0.5), train.LayerNorm(32),
                             train.Linear(32, 4))
    trainer = train.Trainer(model, inputs=[x], targets=[y], loss=tg.nn.softmax_cross_entropy,
                            optimizer=train.AdamW(lr=1e-2), progress=False)
    xb = RNG.standard_normal((16, 20)).astype(np.float32)
    yb = RNG.integers(0, 4, 16)
    losses = [trainer.update(xb, yb) for _ in range(30)]
    assert losses[-1] < losses[0] and "accuracy" in trainer.last
    out1, out2 = trainer.predict(xb), trainer.predict(xb)  # no dropout when predicting
    np.testing.assert_array_equal(out1, out2)
    # a model given as a function of placeholders, with its parameter list
    w = tg.placeholder((20, 4), name="w")
    fn = train.Trainer(lambda x: tg.nn.matmul(x, w), inputs=[x], targets=[y], loss=tg.nn.softmax_cross_entropy,
                       optimizer=train.SGD(lr=0.5), params=[w], progress=False)
    first = fn.update(xb, yb)
    for _ in range(20):
        last = fn.update(xb, yb)
    assert last < first


def test_digits_reach_97_percent():
    pytest.importorskip("sklearn")
    from te_grad.train import digits
    result = digits.run(epochs=10, lr=1e-2, compare=False, out=open("/dev/null", "w"))
    assert result["te_grad"]["accuracy"][-1] >= 0.97


def test_digits_match_pytorch_over_the_first_epoch():
    pytest.importorskip("sklearn")
    pytest.importorskip("torch")
    from te_grad.train import digits
    result = digits.run(epochs=1, compare=True, out=open("/dev/null", "w"))
    assert result["first_epoch_max_rel_diff"] < 1e-3


def test_compile_builds_every_batch_size_asked_and_waits_for_all():
    model, trainer = _regression(batch=8, dynamic_batch=False)
    seconds = trainer.compile(8, 3)
    assert seconds > 0
    kernels = [step.kernel for step in trainer._steps.values()]
    assert len(kernels) == 2 and all(k._pending is None for k in kernels)  # ready when compile returns
    ragged = RNG.standard_normal((3, 5)).astype(np.float32), RNG.standard_normal((3, 3)).astype(np.float32)
    assert np.isfinite(trainer.update(*ragged))
    assert len(trainer._steps) == 2  # the ragged batch used the kernel compiled for it


def test_a_model_returning_an_input_or_one_output_twice_predicts_and_exports_each(tmp_path):
    """``(y, y, x)``: each output its own buffer (a copy where the model returns the same tensor
    twice or its input), so the exported ``NAME_predict`` writes all three and reads ``x``
    as an input; a plain kernel of such outputs refuses to export instead."""
    x = tg.placeholder((8, 5), name="x")
    lin = train.Linear(5, 3)
    trainer = train.Trainer(lambda x: (lambda y: (y, y, x))(lin(x, train.Context(training=False))), inputs=[x], targets=[],
                            loss=lambda outs: tg.nn.mean(outs[0]), optimizer=train.SGD(lr=0.1),
                            params=[p.placeholder for p in lin.parameters()], progress=False,
                            init=train.xavier_normal(seed=1))
    xb = RNG.standard_normal((8, 5)).astype(np.float32)
    y0, y1, x2 = trainer.predict(xb)
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(x2, xb)
    header = open(trainer.export(str(tmp_path / "m"))["header"]).read()
    assert "int m_predict(const float *x, const void *state, float *out0, float *out1, float *out2);" in header
    y = tg.compute((8, 5), lambda i, j: x[i, j] * 2.0, name="y")
    with pytest.raises(tg.TeGradError, match="x is an input"):
        tg.build([y, x], [x]).export(str(tmp_path / "k"))
    with pytest.raises(tg.TeGradError, match="y is given twice"):
        tg.build([y, y], [x]).export(str(tmp_path / "k"))
