"""ResNet-18 (torchvision's architecture at a small width) through ``te_grad.torch.import_model``:
its outputs in evaluation and training mode, five training steps with SGD and with Adam
(losses, weights and batch-norm buffers), one step kernel serving two batch sizes, the
weights back into PyTorch, and the refusals (unsupported operators, bad inputs). Every value
is checked against PyTorch's own eager run."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import te_grad as tg  # noqa: E402
import te_grad.torch as tgt  # noqa: E402
from te_grad import train  # noqa: E402
from te_grad.errors import UserError  # noqa: E402
from te_grad.train import Context  # noqa: E402
from symbolic_builds import use_builds  # noqa: E402


# -- ResNet-18 as published (He et al. 2015; torchvision.models.resnet18) ----------------------
class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """``width`` is 64 in the paper; the stages have width, 2, 4 and 8 times width channels."""

    def __init__(self, width=64, num_classes=10, layers=(2, 2, 2, 2)):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._layer(width, layers[0])
        self.layer2 = self._layer(width * 2, layers[1], stride=2)
        self.layer3 = self._layer(width * 4, layers[2], stride=2)
        self.layer4 = self._layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


WIDTH, SIZE = 8, 48   # 48 px: layer4 is 2x2, so its batch norms average over 2*2*batch values


def _resnet(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return ResNet18(WIDTH).to(dtype)


def _close(got, want, rtol, what="", floor=1e-30):
    """``got`` within ``rtol`` of ``want`` relative to ``want``'s largest magnitude (at least ``floor``)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, what
    scale = max(np.abs(want).max(initial=0.0), floor)
    err = np.abs(got - want).max(initial=0.0) / scale
    assert err <= rtol, f"{what}: relative error {err:.3g} > {rtol:g}"


def _run(model, x: np.ndarray, training: bool, seed: int = 0):
    """The imported model's output on ``x`` by the reference evaluator (no Trainer), and the
    buffer updates of the training program, by state name."""
    xp = tg.placeholder(x.shape, dtype=str(x.dtype), name="x")
    ctx = Context(training=training, seed=tg.placeholder((), dtype="int64", name="seed"))
    out = model(xp, ctx)
    feed = {xp: x, ctx.seed: np.int64(seed)}
    feed.update({p.placeholder: p.value for p in model.parameters()})
    feed.update({s.placeholder: s.initial for s in model.states()})
    names = [s.name for s in model.states() if id(s.placeholder) in ctx.updates]
    values = tg.evaluate([out] + [ctx.updates[id(s.placeholder)] for s in model.states()
                                  if id(s.placeholder) in ctx.updates], feed)
    return values[0], dict(zip(names, values[1:]))


# -- forward -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_forward_in_eval_and_training_mode_is_pytorchs(dtype, rtol):
    net = _resnet(dtype)
    x = torch.randn(4, 3, SIZE, SIZE, dtype=dtype, generator=torch.Generator().manual_seed(1))
    model = tgt.import_model(net, (x,))
    assert net.training  # import_model restores the module's mode
    for training in (False, True):
        ref = copy.deepcopy(net).train(training)
        with torch.no_grad():
            want = ref(x).numpy()
        got, updates = _run(model, x.numpy(), training)
        assert got.dtype == want.dtype
        _close(got, want, rtol, f"output, training={training}")
        buffers = dict(ref.named_buffers())
        if training:   # running statistics and num_batches_tracked updated as PyTorch updates them
            assert len(updates) == 3 * 20 and set(updates) == set(buffers)
            for name, value in updates.items():
                if name.endswith("num_batches_tracked"):
                    assert value == buffers[name].item() == 1
                else:
                    _close(value, buffers[name].numpy(), rtol, name)
        else:
            assert updates == {}


# -- training --------------------------------------------------------------------------------------
def _batches(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((b, 3, SIZE, SIZE)).astype(np.float32), rng.integers(0, 10, b)) for b in sizes]


def _torch_training(net, batches, make_optimizer):
    ref = copy.deepcopy(net).train()
    opt = make_optimizer(ref.parameters())
    losses = []
    for xb, yb in batches:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ref(torch.from_numpy(xb)), torch.from_numpy(yb))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, ref


def _same_state(trainer_values, ref, rtol, floor=1e-30):
    want = ref.state_dict()
    assert set(trainer_values) == set(want)
    for name, value in trainer_values.items():
        if name.endswith("num_batches_tracked"):
            assert int(value) == want[name].item(), name
        else:
            _close(value, want[name].numpy(), rtol, name, floor)


def test_sgd_steps_on_two_batch_sizes_with_one_kernel_and_weights_back_into_pytorch(monkeypatch):
    made = use_builds(monkeypatch, "real")
    net = _resnet()
    original = copy.deepcopy(net)
    batches = _batches([4, 3, 4, 3, 4])
    want_losses, ref = _torch_training(
        net, batches, lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, weight_decay=5e-4))
    model = tgt.import_model(net, (torch.from_numpy(batches[0][0]),))
    assert model.dynamic_batch and model.static_reason is None
    x = model.input_placeholders()[0]
    y = tg.placeholder((4,), "int64", name="y")
    trainer = train.Trainer(model, inputs=[x], targets=[y], loss=tg.nn.softmax_cross_entropy,
                            optimizer=train.SGD(lr=0.01, momentum=0.9, weight_decay=5e-4), progress=False)
    losses = [trainer.update(xb, yb) for xb, yb in batches]
    _close(losses, want_losses, 1e-4, "losses")
    values = dict(trainer.params)
    values.update({k: v for k, v in trainer.states.items() if not k.endswith("momentum_buffer")})
    _same_state(values, ref, 1e-4)
    # one step kernel on the batch size variable served batches of 4 and 3
    assert trainer.static_reason is None
    assert len(trainer.kernels) == 1 and trainer.kernels[0].size_vars
    assert len(made["symbolic"]) == 1 and made["exact"] == [], made
    # the trained weights and buffers back into (a copy of) the untrained module
    back = copy.deepcopy(original)
    model.copy_to(back, trainer)
    for name, tensor in back.state_dict().items():
        np.testing.assert_array_equal(tensor.numpy(), values[name], err_msg=name)
    assert back.training  # copy_to keeps the module's mode
    _same_state({k: v.numpy() for k, v in back.state_dict().items()}, ref, 1e-4)


def test_adam_steps_with_an_exact_batch_are_pytorchs():
    # the same blocks, one per stage (ResNet-10): a second 850-stage build would double the file's time
    torch.manual_seed(1)
    net = ResNet18(WIDTH, layers=(1, 1, 1, 1))
    batches = _batches([4] * 5, seed=1)
    # eps 1e-4, not 1e-8: Adam moves an element whose gradient is float32 rounding noise by about
    # lr whatever its sign, so with eps 1e-8 PyTorch's own float32 run is 1e-3 from its float64 run
    want_losses, ref = _torch_training(net, batches, lambda ps: torch.optim.Adam(ps, lr=1e-3, eps=1e-4))
    model = tgt.import_model(net, (torch.from_numpy(batches[0][0]),), dynamic_batch=False)
    assert not model.dynamic_batch
    x = model.input_placeholders()[0]
    y = tg.placeholder((4,), "int64", name="y")
    trainer = train.Trainer(model, inputs=[x], targets=[y], loss=tg.nn.softmax_cross_entropy,
                            optimizer=train.Adam(lr=1e-3, eps=1e-4), progress=False, dynamic_batch=False)
    losses = [trainer.update(xb, yb) for xb, yb in batches]
    _close(losses, want_losses, 1e-4, "losses")
    values = dict(trainer.params)
    values.update({k: v for k, v in trainer.states.items() if not k.endswith(("exp_avg", "exp_avg_sq"))})
    # Adam divides each gradient element by its own magnitude, so an element whose gradient is
    # near float32 rounding moves by its noise: PyTorch's float32 run is itself up to 1e-3 from its
    # float64 run here. Each tensor is within 1e-4, or within 3 times that gap where it is larger
    # (a parameter starting at 0 judged against the farthest 5 steps move it, 5 * lr)
    _, exact = _torch_training(net.double(), [(xb.astype(np.float64), yb) for xb, yb in batches],
                               lambda ps: torch.optim.Adam(ps, lr=1e-3, eps=1e-4))
    want, exact = ref.state_dict(), exact.state_dict()
    assert set(values) == set(want)
    for name, value in values.items():
        if name.endswith("num_batches_tracked"):
            assert int(value) == want[name].item() == 5, name
            continue
        w64 = exact[name].numpy()
        gap = np.abs(want[name].numpy() - w64).max() / max(np.abs(w64).max(), 5e-3)
        _close(value, want[name].numpy(), max(1e-4, 3 * gap), name, floor=5e-3)
    assert len(trainer.kernels) == 1 and not trainer.kernels[0].size_vars


# -- the pooling and normalization rules on their own (float64, values and input gradients) -------
def _grad_check(module, x, rtol=1e-12):
    module = module.double()
    x = x.double()
    model = tgt.import_model(module, (x,))
    xp = tg.placeholder(tuple(x.shape), dtype="float64", name="x")
    for training in (False, True):
        ctx = Context(training=training, seed=tg.placeholder((), dtype="int64", name="seed"))
        out = model(xp, ctx)
        w = np.random.default_rng(0).standard_normal(tuple(out.shape))
        wt = tg.placeholder(w.shape, dtype="float64", name="w")
        loss = tg.nn.sum(tg.nn.multiply(out, wt))
        (gx,) = tg.gradient(loss, [xp])
        feed = {xp: x.numpy(), wt: w, ctx.seed: np.int64(0)}
        feed.update({p.placeholder: p.value for p in model.parameters()})
        feed.update({s.placeholder: s.initial for s in model.states()})
        got, got_g = tg.evaluate([out, gx], feed)
        ref = copy.deepcopy(module).train(training)
        xt = x.clone().requires_grad_(True)
        want = ref(xt)
        (want * torch.from_numpy(w)).sum().backward()
        _close(got, want.detach().numpy(), rtol, f"output, training={training}")
        _close(got_g, xt.grad.numpy(), rtol, f"input gradient, training={training}")


@pytest.mark.parametrize("shape,kernel,stride,padding", [
    ((2, 3, 8, 8), 3, 2, 1),     # ceil_mode adds nothing
    ((2, 3, 6, 7), 3, 2, 1),     # a window past the end on both axes
    ((2, 3, 6, 6), 2, 2, 0),
    ((2, 3, 5, 9), 3, 3, 0),     # the last window starts inside, ends past the end
    ((2, 3, 7, 5), (3, 2), (2, 3), (1, 0)),
])
def test_max_pool_ceil_mode_is_pytorchs(shape, kernel, stride, padding):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    x[0, 0, :2, :2] = 0.5  # a tie: the gradient goes to the first maximum, as PyTorch's
    _grad_check(nn.MaxPool2d(kernel, stride, padding, ceil_mode=True), x)


@pytest.mark.parametrize("shape,out", [((2, 3, 5, 7), (2, 3)), ((2, 3, 6, 6), (4, 5)), ((1, 2, 9, 4), (3, 4)),
                                       ((2, 3, 5, 5), (1, 1))])
def test_adaptive_avg_pool_with_uneven_windows_is_pytorchs(shape, out):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    module = nn.Sequential(nn.Conv2d(shape[1], 2, 1), nn.AdaptiveAvgPool2d(out))
    if shape[0] < 2:
        module = nn.AdaptiveAvgPool2d(out)
        model = tgt.import_model(module.double(), (x.double(),), dynamic_batch=False)
        got, _ = _run(model, x.double().numpy(), False)
        _close(got, module(x.double()).numpy(), 1e-12)
        return
    _grad_check(module, x)


def test_batch_norm_without_running_statistics_uses_batch_statistics_in_eval_too():
    x = torch.randn(3, 4, 5, 5, generator=torch.Generator().manual_seed(4)) * 2 + 1
    bn = nn.BatchNorm2d(4, track_running_stats=False)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    _grad_check(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), bn, nn.ReLU()), x)


class _ModeConstants(nn.Module):
    """Tensors made in ``forward``: torch.export lifts each program's as ``lifted_tensor_0``, ...,
    so the two modes' constants share names but not values."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        if self.training:
            return self.lin(x) * torch.tensor([2.0, 3.0, 4.0]) + torch.tensor([5.0, 5.0, 5.0])
        return self.lin(x) + torch.tensor([1.0, 2.0, 3.0])


def test_constants_of_the_two_modes_are_each_their_own():
    """Each mode reads its own lifted constants: the evaluation program once read the training
    program's ``lifted_tensor_0`` (5, 5, 5) in place of its own (1, 2, 3)."""
    torch.manual_seed(0)
    net = _ModeConstants()
    x = torch.randn(4, 3)
    model = tgt.import_model(net, (x,))
    xp = model.input_placeholders()[0]
    feed = {xp: x.numpy()}
    feed.update({p.placeholder: p.value for p in model.parameters()})
    feed.update({s.placeholder: np.asarray(s.initial) for s in model.states()})
    for training in (True, False):
        net.train(training)
        got = tg.evaluate([model(xp, Context(training=training, seed=tg.placeholder((), "int64", name="seed")))],
                          {**feed})[0]
        np.testing.assert_allclose(got, net(x).detach().numpy(), rtol=1e-6, atol=1e-6)
    y = tg.placeholder((4,), dtype="int64", name="y")
    trainer = train.Trainer(model, inputs=[xp], targets=[y], loss=tg.nn.softmax_cross_entropy,
                            optimizer=train.SGD(lr=0.0), progress=False)
    net.eval()
    np.testing.assert_allclose(trainer.predict(x.numpy()), net(x).detach().numpy(), rtol=1e-6, atol=1e-6)
    names = sorted(s.name for s in model.states())
    assert len(names) == 3, names  # the two training constants and the evaluation one


def test_batch_norm_momentum_is_pytorchs():
    x = torch.randn(3, 4, 5, 5, generator=torch.Generator().manual_seed(5))
    bn = nn.BatchNorm2d(4, momentum=0.3, eps=1e-3).double()
    model = tgt.import_model(bn, (x.double(),))
    _, updates = _run(model, x.double().numpy(), True)
    ref = copy.deepcopy(bn).train()
    ref(x.double())
    for name, value in ref.named_buffers():
        _close(updates[name], value.numpy(), 1e-12, name)


# -- refusals --------------------------------------------------------------------------------------
@pytest.mark.parametrize("conv", [
    dict(in_channels=3, out_channels=4, kernel_size=3),
    dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1, dilation=2, groups=2, bias=False),
    dict(in_channels=3, out_channels=5, kernel_size=4, padding="same"),
])
def test_conv1d_is_pytorchs(conv):
    """nn.Conv1d imported (a rank-3 aten.convolution as nn.conv1d): the output and the input
    gradient equal PyTorch's in float64, in both modes."""
    torch.manual_seed(3)
    net = nn.Sequential(nn.Conv1d(**conv), nn.ReLU(), nn.Conv1d(conv["out_channels"], 2, 1))
    _grad_check(net, torch.randn(3, conv["in_channels"], 11))


class TwoUnsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        y = torch.cummax(self.fc(x), 1).values
        return y * torch.special.i0(y)


def test_every_unsupported_operator_is_listed_with_its_source_line():
    with pytest.raises(UserError) as info:
        tgt.import_model(TwoUnsupported(), (torch.randn(3, 6),))
    msg = str(info.value)
    for op, code in (("aten.cummax.default", "y = torch.cummax(self.fc(x), 1).values"),
                     ("aten.i0.default", "return y * torch.special.i0(y)")):
        lines = [ln for ln in msg.splitlines() if ln.strip().startswith(op)]
        # once, although both the training and the evaluation program use it
        assert len(lines) == 1, msg
        assert "test_import_resnet.py" in lines[0] and code in lines[0], msg
    assert "import_model(TwoUnsupported)" in msg


class TwoRefused(nn.Module):
    """Operators te_grad translates, used in ways its rules refuse: a 1-D transposed
    convolution and an average pool with a divisor override."""
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose1d(2, 4, 3)
        self.pool = nn.AvgPool2d(2, divisor_override=3)

    def forward(self, x):
        y = self.conv(x)
        return self.pool(y.unsqueeze(1))


def test_every_refused_use_is_listed_at_import_with_its_source_line():
    """A rule that refuses its arguments refuses the import, with every such use listed (the
    walk goes on past each), never a model that fails at its first use."""
    with pytest.raises(UserError) as info:
        tgt.import_model(TwoRefused(), (torch.randn(3, 2, 8),))
    msg = str(info.value)
    assert "import_model(TwoRefused): 2 use(s)" in msg, msg
    conv = [ln for ln in msg.splitlines() if ln.strip().startswith("aten.convolution")]
    pool = [ln for ln in msg.splitlines() if ln.strip().startswith("aten.avg_pool2d")]
    assert len(conv) == 1 and "y = self.conv(x)" in conv[0], msg
    assert len(pool) == 1 and "return self.pool(y.unsqueeze(1))" in pool[0] and "divisor_override" in pool[0], msg


def test_bad_inputs_are_user_errors():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    x = torch.randn(2, 3, 6, 6)
    with pytest.raises(UserError, match="expected a torch.nn.Module, got function"):
        tgt.import_model(lambda v: v, (x,))
    with pytest.raises(UserError, match="example input 0 is a ndarray, not a torch.Tensor"):
        tgt.import_model(net, (x.numpy(),))
    with pytest.raises(UserError, match="example input 1 is a list"):
        tgt.import_model(net, (x, [1, 2]))
    with pytest.raises(UserError, match="batch 1.*at least 2.*dynamic_batch=False"):
        tgt.import_model(net, (x[:1],))
    model = tgt.import_model(net, (x[:1],), dynamic_batch=False)  # an exact batch of 1 is fine
    got, _ = _run(model, x[:1].numpy(), False)
    with torch.no_grad():
        _close(got, copy.deepcopy(net).eval()(x[:1]).numpy(), 1e-5)
    cumulative = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=None))
    with pytest.raises(UserError, match=r"momentum=None.*: 1; give these a float momentum"):
        tgt.import_model(cumulative, (x,))
