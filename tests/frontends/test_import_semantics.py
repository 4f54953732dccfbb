"""PyTorch semantics an imported model keeps, each against eager PyTorch in float64: a
``detach`` and a ``torch.no_grad()`` block stop the gradient, and so do batch norm's statistics
read beside its output (the running ones after their update, the saved mean and inverse
standard deviation); a parameter the training loss
does not read is left alone by weight decay and momentum (PyTorch's ``grad`` is None); a
non-persistent buffer is copied back; and what te_grad cannot do as PyTorch does is a
``UserError``, not another number: state changed in evaluation mode, dropout left on in
evaluation mode, a batch of 1 for a model imported with a dynamic batch; channel dropout
(``Dropout2d``) zeroes whole channels at its rate."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import te_grad as tg  # noqa: E402
import te_grad.torch as tgt  # noqa: E402
from te_grad import train  # noqa: E402
from te_grad.errors import UserError  # noqa: E402


def _trainer(model, **opt):
    return train.Trainer(model, inputs=model.input_placeholders(), targets=[], loss=tg.nn.mean,
                         optimizer=train.SGD(lr=0.5, **opt), progress=False)


def _torch_step(net, x, **opt):
    ref = copy.deepcopy(net)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.5, **opt)
    ref(x).mean().backward()
    sgd.step()
    return ref


class _Stops(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2, bias=False)

    def forward(self, x):
        y = self.lin(x)
        with torch.no_grad():
            z = y * 2
        return y * y.detach() + y * z + torch.tanh(y).detach()


def test_detach_and_no_grad_stop_the_gradient():
    """d/dW of y * y.detach() + y * (2 y under no_grad) is 3 y x, not 6 y x: the decomposition
    made ``detach`` an ``alias`` and inlined the ``no_grad`` block, and both were differentiated."""
    torch.manual_seed(0)
    net = _Stops().double()
    x = torch.randn(4, 3, dtype=torch.float64)
    trainer = _trainer(tgt.import_model(net, (x,)))
    trainer.update(x.numpy())
    want = _torch_step(net, x).lin.weight.detach().numpy()
    np.testing.assert_allclose(trainer.params["lin.weight"], want, rtol=1e-12, atol=1e-12)
    assert not np.allclose(want, net.lin.weight.detach().numpy())


class _EvalHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.lin2 = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x) if self.training else self.lin2(x)


@pytest.mark.parametrize("opt", [dict(weight_decay=0.1), dict(momentum=0.9, weight_decay=0.1)])
def test_a_parameter_the_loss_does_not_read_is_left_alone(opt):
    torch.manual_seed(1)
    net = _EvalHead().double()
    x = torch.randn(4, 3, dtype=torch.float64)
    trainer = _trainer(tgt.import_model(net, (x,)), **opt)
    trainer.update(x.numpy())
    ref = _torch_step(net, x, **opt)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(trainer.params[name], p.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(trainer.params["lin2.bias"], net.lin2.bias.detach().numpy())
    np.testing.assert_allclose(trainer.predict(x.numpy()), ref.eval()(x).detach().numpy(), rtol=1e-12)


class _Shift(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("shift", torch.zeros(3), persistent=False)

    def forward(self, x):
        if self.training:
            self.shift.add_(x.mean(0))
        return self.lin(x - self.shift)


def test_a_non_persistent_buffer_is_copied_back():
    torch.manual_seed(2)
    net = _Shift().double()
    x = torch.randn(4, 3, dtype=torch.float64)
    model = tgt.import_model(net, (x,))
    trainer = _trainer(model)
    trainer.update(x.numpy())
    ref = _torch_step(net, x)
    back = copy.deepcopy(net)
    model.copy_to(back, trainer)
    np.testing.assert_allclose(back.shift.numpy(), ref.shift.numpy(), rtol=1e-12)
    assert np.abs(ref.shift.numpy()).max() > 0.01
    np.testing.assert_allclose(back.eval()(x).detach().numpy(), ref.eval()(x).detach().numpy(), rtol=1e-12)


class _EvalCounter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("acc", torch.zeros(3))

    def forward(self, x):
        self.acc.mul_(0.5).add_(x.mean(0))
        return self.lin(x + self.acc)


class _McDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)

    def forward(self, x):
        return torch.nn.functional.dropout(self.lin(x), 0.5, training=True)


class _Squeezes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x):
        return torch.softmax(self.lin(x).squeeze(), 0).reshape(-1, 2)


def test_what_would_differ_from_pytorch_is_refused():
    x = torch.randn(4, 3, dtype=torch.float64)
    trainer = _trainer(tgt.import_model(_EvalCounter().double(), (x,)))
    trainer.update(x.numpy())  # training changes the buffer as PyTorch does; a prediction cannot
    with pytest.raises(UserError, match=r"changes its state in evaluation mode \(acc\)"):
        trainer.predict(x.numpy())
    with pytest.raises(UserError, match="dropout .* in evaluation mode"):
        tgt.import_model(_McDropout().double(), (x,))
    net = _Squeezes().double()
    model = tgt.import_model(net, (torch.randn(5, 3, dtype=torch.float64),))
    trainer = _trainer(model)
    x1 = np.random.default_rng(0).standard_normal((1, 3))
    with pytest.raises(UserError, match="a batch of 1: .* at least 2"):
        trainer.predict(x1)
    with pytest.raises(UserError, match="a batch of 1"):
        trainer.update(x1)
    data = np.random.default_rng(1).standard_normal((9, 3))
    with pytest.raises(UserError, match="leave a last batch of 1; .* drop_last=True"):
        trainer.fit(data, np.zeros((9, 2)), batch_size=4)
    assert trainer.t == 0  # refused before any step
    exact = _trainer(tgt.import_model(net, (torch.from_numpy(x1),), dynamic_batch=False))
    np.testing.assert_allclose(exact.predict(x1), net.eval()(torch.from_numpy(x1)).detach().numpy(), rtol=1e-12)


class _IntTimesFloat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, i):
        return i * 0.3 * self.w + torch.exp(i[:, :1] / 7) + i / 3


def test_integers_meet_floats_in_the_dtype_pytorch_records():
    """An int64 tensor times a Python float is computed in the float dtype PyTorch recorded for
    the node (float64 here, the default dtype), not in float32 and widened after (a relative
    error of 2e-8); an integer true division is that too."""
    keep = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        net = _IntTimesFloat()
        i = torch.arange(10, 18).reshape(2, 4)
        trainer = _trainer(tgt.import_model(net, (i,)))
        np.testing.assert_allclose(trainer.predict(i.numpy()), net(i).detach().numpy(), rtol=1e-15)
    finally:
        torch.set_default_dtype(keep)


class _ReadUnderNoGrad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.scale = torch.nn.Parameter(torch.tensor(2.0))
        self.shift = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        with torch.no_grad():
            c = self.scale.abs() + 1
        return self.lin(x) * c + self.shift.detach()


def test_a_parameter_read_only_under_no_grad_or_detach_is_left_alone():
    """Its gradient is derived as the constant 0, PyTorch's is None: weight decay must not move it."""
    torch.manual_seed(3)
    net = _ReadUnderNoGrad().double()
    x = torch.randn(4, 3, dtype=torch.float64)
    trainer = _trainer(tgt.import_model(net, (x,)), weight_decay=0.1, momentum=0.9)
    trainer.update(x.numpy())
    ref = _torch_step(net, x, weight_decay=0.1, momentum=0.9)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(trainer.params[name], p.detach().numpy(), rtol=1e-12, atol=1e-12)
    assert trainer.params["scale"] == 2.0 and trainer.params["shift"] == 0.5


class _ZeroGradient(torch.nn.Module):
    """``0 * p.sum()`` (the way to make every parameter take part in a step), a comparison and a
    tensor shaped like a parameter: PyTorch connects only the first to the loss."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.unused = torch.nn.Parameter(torch.full((2,), 3.0))
        self.gate = torch.nn.Parameter(torch.tensor([1.0, -1.0]))
        self.like = torch.nn.Parameter(torch.tensor([4.0, 5.0]))

    def forward(self, x):
        y = torch.where(self.gate > 0, self.lin(x), -self.lin(x)) + torch.zeros_like(self.like)
        return y + 0 * self.unused.sum()


@pytest.mark.parametrize("opt", [dict(weight_decay=0.1), dict(momentum=0.9, weight_decay=0.1)])
def test_a_parameter_whose_gradient_is_zero_is_decayed_as_pytorch_decays_it(opt):
    """PyTorch's ``grad`` of ``unused`` is zeros, not None, so weight decay moves it, although
    te_grad derives its gradient as the constant 0; ``gate`` (read by a comparison) and
    ``like`` (read by ``zeros_like``) get None and stay."""
    torch.manual_seed(4)
    net = _ZeroGradient().double()
    x = torch.randn(4, 3, dtype=torch.float64)
    trainer = _trainer(tgt.import_model(net, (x,)), **opt)
    trainer.update(x.numpy())
    trainer.update(x.numpy())
    ref = copy.deepcopy(net)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.5, **opt)
    for _ in range(2):
        sgd.zero_grad()
        ref(x).mean().backward()
        sgd.step()
    assert ref.gate.grad is None and ref.like.grad is None and ref.unused.grad is not None
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(trainer.params[name], p.detach().numpy(), rtol=1e-12, atol=1e-12)
    assert not np.allclose(trainer.params["unused"], 3.0)
    np.testing.assert_array_equal(trainer.params["gate"], [1.0, -1.0])


def test_an_exported_step_at_a_batch_the_model_does_not_hold_for_is_refused(tmp_path):
    """The C step has the batch of the Trainer's input placeholders: a batch of 1 for a model
    imported with a dynamic batch (traced for 2 on) would compute another function there."""
    net = _Squeezes().double()
    model = tgt.import_model(net, (torch.randn(5, 3, dtype=torch.float64),))
    one = train.Trainer(model, inputs=[tg.placeholder((1, 3), dtype="float64", name="x")], targets=[],
                        loss=tg.nn.mean, optimizer=train.SGD(lr=0.5), progress=False)
    with pytest.raises(UserError, match="a batch of 1: .* at least 2"):
        one.export(str(tmp_path / "one"))
    assert not list(tmp_path.iterdir())


class _Probe(torch.nn.Module):
    """A linear probe on detached features, which are a second output; batch norm run only for
    its running mean, which the model reads (its new value is a by-product of the op)."""

    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Linear(3, 4)
        self.probe = torch.nn.Linear(4, 2)
        self.bn = torch.nn.BatchNorm1d(3)
        with torch.no_grad():
            self.bn.bias.fill_(0.5)

    def forward(self, x):
        self.bn(x)
        f = torch.tanh(self.backbone(x))
        return self.probe(f.detach()) + self.bn.running_mean[:2], f


class _Teacher(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.student = torch.nn.Linear(3, 2)
        self.teacher = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.student(x), self.teacher(x)


@pytest.mark.parametrize("case", ["probe", "teacher"])
def test_a_parameter_reached_only_through_a_cut_or_a_by_product_is_left_alone(case):
    """The loss reads the second output only under stop_gradient (teacher), or not at all (probe:
    its features reach the first output only through detach); batch norm's weight and bias
    reach its new running mean in the same op, but PyTorch does not connect them: all of these
    get grad None, and weight decay must not move them."""
    torch.manual_seed(5)
    if case == "probe":
        net, te_loss, torch_loss = _Probe().double(), (lambda o: tg.nn.mean(o[0])), (lambda o: o[0].mean())
        still = ["backbone.weight", "backbone.bias", "bn.weight", "bn.bias"]
    else:
        net = _Teacher().double()

        def te_loss(o):
            d = tg.compute(o[0].shape, lambda *i: o[0][i] - tg.stop_gradient(o[1][i]), name="d")
            return tg.nn.mean(tg.nn.multiply(d, d))

        def torch_loss(o):
            return ((o[0] - o[1].detach()) ** 2).mean()
        still = ["teacher.weight", "teacher.bias"]
    x = torch.randn(4, 3, dtype=torch.float64)
    model = tgt.import_model(net, (x,))
    trainer = train.Trainer(model, inputs=model.input_placeholders(), targets=[], loss=te_loss,
                            optimizer=train.SGD(lr=0.5, weight_decay=0.1), progress=False)
    trainer.update(x.numpy())
    ref = copy.deepcopy(net)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.5, weight_decay=0.1)
    torch_loss(ref(x)).backward()
    sgd.step()
    assert sorted(n for n, p in ref.named_parameters() if p.grad is None) == sorted(still)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(trainer.params[name], p.detach().numpy(), rtol=1e-12, atol=1e-12)


class _ReadsRunningStats(torch.nn.Module):
    """A model that reads batch norm's running statistics after the training step updated them
    (PyTorch updates the buffers in place, unrecorded: no gradient reaches ``lin`` through them)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.bn = torch.nn.BatchNorm1d(3, momentum=0.5)

    def forward(self, x):
        y = self.bn(self.lin(x))
        return (y + 1.0) * (self.bn.running_mean + self.bn.running_var)


class _ReadsSavedStats(torch.nn.Module):
    """``torch.native_batch_norm``'s batch mean and inverse standard deviation read beside its
    output: PyTorch's derivative of batch norm reads the output's gradient alone."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("rm", torch.zeros(3))
        self.register_buffer("rv", torch.ones(3))

    def forward(self, x):
        out, mean, invstd = torch.native_batch_norm(self.lin(x), None, None, self.rm, self.rv, True, 0.1, 1e-5)
        return out * 2 + mean * 3 + invstd


@pytest.mark.parametrize("model", [_ReadsRunningStats, _ReadsSavedStats])
def test_batch_norm_statistics_read_beside_its_output_carry_no_gradient(model):
    """The step's parameters and the new statistics equal PyTorch's; differentiating the
    statistics (as the gradient of ``mean((y + 1) * (rm + rv))`` did) moves ``lin`` elsewhere."""
    torch.manual_seed(0)
    net = model().double()
    x = torch.randn(5, 3, dtype=torch.float64)
    trainer = _trainer(tgt.import_model(net, (x,)))
    trainer.update(x.numpy())
    ref = _torch_step(net, x)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(trainer.params[name], p.detach().numpy(), rtol=1e-12, atol=1e-12)
    for name, b in ref.named_buffers():
        if b.is_floating_point():
            np.testing.assert_allclose(trainer.states[name], b.numpy(), rtol=1e-12, atol=1e-12)


class _ChannelDropout(torch.nn.Module):
    def __init__(self, p, always=False):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 256, 1)
        self.p, self.always = p, always
        self.drop = torch.nn.Dropout2d(p)

    def forward(self, x):
        h = self.conv(x)
        return torch.nn.functional.dropout2d(h, self.p, training=True) if self.always else self.drop(h)


def test_channel_dropout_zeroes_whole_channels_at_its_rate_and_steps_as_pytorch_with_that_mask():
    """``Dropout2d``: in training each (sample, channel) is zeroed whole with probability ``p``
    (its mask is te_grad's draw: the fraction within 4 standard deviations of ``p`` over 2,048
    channels), the rest scaled by ``1 / (1 - p)``; PyTorch's SGD step with that mask moves the
    weights as te_grad's step does; in evaluation mode it is the identity; left on in
    evaluation mode (``F.dropout2d(training=True)``), it is refused."""
    torch.manual_seed(0)
    p = 0.3
    net = _ChannelDropout(p).double()
    x = torch.randn(8, 3, 2, 2, dtype=torch.float64)
    model = tgt.import_model(net, (x,))
    assert model.dynamic_batch
    xs = model.input_placeholders()
    feed = {xs[0]: x.numpy(), **{q.placeholder: q.value for q in model.parameters()}}
    plain = net.eval()(x).detach().numpy()
    np.testing.assert_allclose(tg.evaluate([model(*xs, train.Context(training=False))], feed)[0], plain,
                               rtol=1e-12, atol=1e-14)
    seed = tg.placeholder((), dtype="int64", name="seed")
    got = tg.evaluate([model(*xs, train.Context(training=True, seed=seed))], {**feed, seed: np.int64(1)})[0]
    kept = np.isclose(got, plain / (1 - p), rtol=1e-12, atol=1e-14).reshape(8, 256, 4).all(axis=2)
    dropped = (got == 0).reshape(8, 256, 4).all(axis=2)
    assert (kept | dropped).all()
    assert abs(dropped.mean() - p) < 4 * np.sqrt(p * (1 - p) / dropped.size)

    trainer = _trainer(model)
    trainer.update(x.numpy())  # its first step draws with seed 1, as above
    mask = torch.from_numpy(kept[:, :, None, None] / (1 - p))
    ref = copy.deepcopy(net).train()
    sgd = torch.optim.SGD(ref.parameters(), lr=0.5)
    (ref.conv(x) * mask).mean().backward()
    sgd.step()
    for n, q in ref.named_parameters():
        np.testing.assert_allclose(trainer.params[n], q.detach().numpy(), rtol=1e-12, atol=1e-12)
    with pytest.raises(UserError, match="bernoulli .* in evaluation mode"):
        tgt.import_model(_ChannelDropout(p, always=True).double(), (x,))
