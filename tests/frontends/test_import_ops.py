"""Operators of imported models, each against eager PyTorch in float64 (the output and one
SGD step, with a dynamic batch): LeakyReLU, ELU / SELU / CELU, Hardtanh / ReLU6, Hardswish /
Hardsigmoid (on their kinks too), sign, floor /
ceil / round / trunc, vector norms (``F.normalize``), ``cdist`` (p 1, 2, 3), ``max`` / ``min`` along a dimension,
``argmax``, ``cumsum``, ``prod`` (of int32 in int64, as PyTorch), reductions along dim 0 of
a 0-d tensor, advanced indexing by one or several tensors (negative indices counted from
the end, of a fixed axis and of the batch), dtype conversions (``.float()``, ``.long()``),
``flip``, ``roll``, ``repeat``, ``var_mean``, ``std`` (0 where the variance is), ``atan2``, GroupNorm, InstanceNorm, adaptive max
pooling (windows overlapping and of varying size too), nearest and bilinear upsampling, at
ordinary points and where PyTorch's gradient takes a side: on the bounds of ``hardtanh`` (0 there), at 0 for
``leaky_relu`` and ``elu`` (the negative branch), the norm of a zero vector and ``atan2`` at
the origin (0, not NaN), the sign of NaN (0), a tie of ``max`` along a dimension or in a
pooling window (all to the first), a product over zeros (the product of the others)."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import te_grad as tg  # noqa: E402
import te_grad.torch as tgt  # noqa: E402
from te_grad import train  # noqa: E402
from te_grad.errors import UserError  # noqa: E402


def _at(v, value):
    """``value`` everywhere, with ``v``'s gradient: the point where a rule's gradient takes a side."""
    return v - v.detach() + value


#: index tensors (repeated positions: their gradients add up)
_IDX = (torch.tensor([0, 3, 3]), torch.tensor([1, 2, 1]), torch.tensor([1, 0, 1]))


#: where the binary cross entropy cases put their inputs at 0 (else 1), and their targets
_EDGES = torch.tensor([[True, False, False, True]])
_TARGETS = torch.tensor([[0.0, 0.3, 1.0, 0.3]], dtype=torch.float64)


def _outer(v):
    """``(b, 4, 4)``: the outer product of each row of ``v`` with itself."""
    return v[:, :, None] * v[:, None, :]


def _of_a_scalar(s):
    """Reductions and normalizations along dim 0 or -1 of a 0-d tensor (PyTorch takes both)."""
    return (torch.sum(s, 0) + torch.sum(s, -1, keepdim=True) + torch.prod(s, 0) + torch.mean(s, 0) + torch.amax(s, 0)
            + torch.max(s, 0).values + torch.logsumexp(s, 0) + torch.softmax(s, 0) + torch.log_softmax(s, -1)
            + torch.cumsum(s, 0) + torch.var(s, 0, correction=0) + torch.argmax(s, 0)
            + torch.linalg.vector_norm(s, 2, 0))


FUNCTIONS = {
    "leaky_relu": lambda v: F.leaky_relu(v, 0.2),
    "leaky_relu at 0": lambda v: F.leaky_relu(_at(v, 0.0), 0.2) * v,
    "elu": lambda v: F.elu(v, 0.7),
    "elu at 0": lambda v: F.elu(_at(v, 0.0), 0.7) * v,
    "selu": F.selu,
    "celu": lambda v: F.celu(v, 1.5),
    "hardtanh": lambda v: F.hardtanh(v, -0.4, 0.3),
    "hardtanh on its bounds": lambda v: F.hardtanh(_at(v, 1.0)) * v + F.hardtanh(_at(v, -1.0)),
    "relu6": lambda v: F.relu6(v * 4),
    "sign": lambda v: torch.sign(v) * v + torch.sign(v * (v > 0)),
    "floor ceil round trunc": lambda v: v * (torch.floor(v) + torch.ceil(v) + torch.round(v * 2) + torch.trunc(v)),
    "normalize": lambda v: F.normalize(v, dim=-1),
    "normalize a zero row": lambda v: F.normalize(v * (v.sum(-1, keepdim=True) > 0.5), dim=-1),
    "norm 1": lambda v: v / (1 + torch.linalg.vector_norm(v * (v > 0), 1, dim=-1, keepdim=True)),
    "norm 2 of all": lambda v: v * torch.linalg.vector_norm(v),
    "max and min along a dim": lambda v: v * v.max(-1, keepdim=True).values + v.min(0).values,
    "max along a dim, tied": lambda v: torch.stack([v[:, 0], v[:, 0].detach()], -1).max(-1).values,
    "min along a dim, tied": lambda v: torch.stack([v[:, 1].detach(), v[:, 1]], -1).min(-1).values,
    "argmax and argmin": lambda v: v.gather(-1, v.argmax(-1, keepdim=True)) * v + v.gather(-1, v.argmin(-1)[:, None]),
    "cumsum": lambda v: torch.cumsum(v, -1) * v,
    "flip": lambda v: torch.flip(v, [0, 1]) * v,
    "roll": lambda v: torch.roll(v, 1, -1) * v + torch.roll(v, (-5, 2), (1, 1)),
    "roll flattened": lambda v: torch.roll(v.t() @ v, 5) @ v.t() @ v,
    "repeat": lambda v: v.repeat(1, 3)[:, 2:6] * v + v.repeat(2, 1).mean(0) + v.repeat(1, 1, 2).sum(0)[:, :4],
    "var_mean": lambda v: torch.var_mean(v, -1, keepdim=True)[0] * v + torch.var_mean(v, 0)[1],
    "atan2": lambda v: torch.atan2(v, v * v - 1),
    "atan2 at the origin": lambda v: torch.atan2(_at(v, 0.0), 2 * _at(v, 0.0)) + v,
    "sign of NaN": lambda v: torch.sign(torch.log(v)) * v,
    "prod along a dim": lambda v: v * torch.prod(v, -1, keepdim=True) + torch.prod(v, 0),
    "prod with zeros": lambda v: torch.prod(torch.where(v > 0.3, _at(v, 0.0), v), -1, keepdim=True) * v,
    "prod of all": lambda v: v * torch.prod(v[:, :2] * 0.25 + 1),
    "index by two tensors": lambda v: _outer(v)[:, _IDX[0], _IDX[1]] * v[:, :3],
    "index by two tensors apart": lambda v: _outer(v).view(-1, 4, 2, 2)[:, _IDX[0], :, _IDX[2]].sum(0) * v[:, :2],
    "index by broadcast tensors": lambda v: _outer(v)[:, _IDX[0][:, None], _IDX[2][None, :2]].sum(-1) * v[:, :3],
    "index from the end": lambda v: v[:, torch.tensor([-1, 0, -4, 2, -1])][:, :4] * v,
    "index by two tensors from the end": lambda v: _outer(v)[:, _IDX[0] - 4, -1 - _IDX[1]] * v[:, :3],
    "index the batch from the end": lambda v: v[torch.tensor([-1, 0, -2])].sum(0) * v,
    "dtype conversions": lambda v: v * (v > 0).double() + (v > 0).long().sum(-1, keepdim=True) * v
    + v.float().double(),
    "cdist (zero distances among them)": lambda v: torch.cdist(_outer(v), _outer(v)[:, 1:3]).sum(-1) * v,
    "cdist p=1 and p=3": lambda v: (torch.cdist(_outer(v), _outer(v)[:, :2], p=1)
                                    + torch.cdist(_outer(v), _outer(v)[:, 1:3] * 0.5, p=3)).sum(-1) * v,
    "cdist of features along the batch": lambda v: torch.cdist(v.t(), v.t()[:2]).sum() * v,
    "std (zero variance among them)": lambda v: torch.std(v, -1, keepdim=True) * v + torch.std_mean(v, 0)[0]
    + torch.std(v[:, :1].expand(-1, 3), -1, keepdim=True) + torch.std(v.sum() * 0.1, 0, correction=0),
    "hardswish, on its kinks too": lambda v: F.hardswish(v * 3) + F.hardswish(_at(v, 3.0)) * v
    + F.hardswish(_at(v, -3.0)),
    "reductions of a 0-d tensor": lambda v: v * _of_a_scalar(v.sum() * 0.1),
    "int32 sums and products in int64": lambda v: v * 1e-9 * (((v > -99).int() * 2 ** 30).sum(-1, keepdim=True)
                                                              + ((v > -99).int() * 2 ** 10).prod(-1, keepdim=True))
    + (v > 0).sum(-1, keepdim=True, dtype=torch.float64) * v,
    "prod of bools": lambda v: v * torch.prod(v > -1, -1, keepdim=True) + torch.prod(v > -2, 0) * v,
    "pow of tensors at a zero base or exponent": lambda v: torch.pow(_at(v, 0.0), v.abs() + 1)
    + torch.pow(_at(v, 0.0), _at(v, 0.0)) + torch.pow(v.abs() + 0.5, _at(v, 0.0)) * v + torch.pow(v.abs() + 1, v),
    "sinc, at 0 too": lambda v: torch.sinc(v) * v + torch.sinc(_at(v, 0.0)) + torch.sinc(v * 1e-20),
    "max and min of all, tied too": lambda v: v * v.max() + v.min() + torch.stack([v, v.detach()], -1).max()
    + torch.cat([v, v.detach()]).reshape(-1).min(),
    "clamp by tensors": lambda v: torch.clamp(v, v.flip(-1) * 0.5, v[:, :1] + 1) + torch.clamp(v, min=v.flip(0))
    + torch.clamp(v, max=v.roll(1, -1)) * v,
    "clamp by tensors, on and across the bounds": lambda v: torch.clamp(
        _at(v, torch.tensor([-2.0, -1.0, 0.0, 2.0], dtype=torch.float64)),
        _at(v.flip(-1), torch.tensor([-1.0, 1.0, 0.0, 1.0], dtype=torch.float64)),
        _at(v.roll(1, -1), torch.tensor([1.0, -1.0, 0.0, 1.0], dtype=torch.float64))) * v,
    "clamp by tensors of NaN": lambda v: torch.clamp(torch.log(v), _at(v, -1.0), _at(v.flip(-1), 1.0)) * 0
    + torch.clamp(torch.log(v), _at(v, 1.0), _at(v.flip(-1), -1.0)).nan_to_num(0.0),
    "cosine similarity": lambda v: F.cosine_similarity(v, v.flip(0), dim=-1)[:, None] * v
    + F.cosine_similarity(v, v * (v > 10), dim=-1)[:, None],
    "bitwise not and isnan": lambda v: v * (~(v > 0)) + v * torch.isnan(torch.log(v)) + (~(v > 0).int()) * v,
    "pow of a number": lambda v: 2.0 ** v + 0.0 ** v.abs() + 0.0 ** _at(v, 0.0) + 0.5 ** _at(v, 0.0),
    "nan_to_num": lambda v: torch.nan_to_num(torch.log(v), 0.5, 3.0, -3.0) * v,
    "label smoothing": lambda v: F.cross_entropy(v, (v.detach() > 0).long().sum(-1).clamp(max=3), label_smoothing=0.2,
                                                 reduction="none")[:, None] * v,
    "xlogy and xlog1py, at x = 0 too": lambda v: torch.xlogy(_at(v, 0.0), v.abs() + 0.5)
    + torch.xlogy(v.abs(), v.abs() + 1)
    + torch.special.xlog1py(_at(v, 0.0), v.abs()) * v + torch.special.xlog1py(v, v.abs()),
    "softplus past exp's overflow": lambda v: F.softplus(v * 500) + F.softplus(v, 2.0, 1.0) * v,
    "mish past exp's overflow": lambda v: F.mish(v * 500) + F.mish(v),
    "binary cross entropy at 0 and 1": lambda v: F.binary_cross_entropy(
        torch.where(_EDGES, _at(v, 0.0), _at(v, 1.0)), _TARGETS.expand(v.shape[0], -1), reduction="none") + v,
    "binary cross entropy of a saturated sigmoid": lambda v: F.binary_cross_entropy(
        torch.sigmoid(v * 40), (_TARGETS * 0.8 + 0.1).expand(v.shape[0], -1)) * v,
    "binary cross entropy of a tiny probability, the target's gradient": lambda v: F.binary_cross_entropy(
        _at(v, 1e-50), torch.sigmoid(v), reduction="none")
    + F.binary_cross_entropy(_at(v, 1.0 - 1e-16), torch.sigmoid(v)),
    "binary cross entropy, weighted, summed": lambda v: F.binary_cross_entropy(
        torch.sigmoid(v), torch.sigmoid(v.flip(-1)), weight=_TARGETS[0] + 1, reduction="sum") * v,
}


class _Net(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.lin(x))


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_an_imported_function_matches_pytorch_in_its_output_and_a_step(name):
    torch.manual_seed(0)
    _check(_Net(FUNCTIONS[name]).double(), torch.randn(6, 4, dtype=torch.float64) * 2)


def _check(net, x):
    """``net`` imported (a dynamic batch) against PyTorch: the output, then one SGD step."""
    model = tgt.import_model(net, (x,))
    assert model.dynamic_batch, model.static_reason
    xs = model.input_placeholders()
    feed = {xs[0]: x.numpy(), **{p.placeholder: p.value for p in model.parameters()},
            **{s.placeholder: s.initial for s in model.states()}}   # tensor constants among them
    got = tg.evaluate([model(*xs, train.Context(training=False))], feed)[0]
    np.testing.assert_allclose(got, net(x).detach().numpy(), rtol=1e-13, atol=1e-13)
    trainer = train.Trainer(model, inputs=xs, targets=[], loss=tg.nn.mean, optimizer=train.SGD(lr=0.5),
                            progress=False)
    trainer.update(x.numpy())
    assert trainer.static_reason is None, trainer.static_reason  # one step kernel for every batch size
    ref = copy.deepcopy(net)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.5)
    ref(x).mean().backward()
    sgd.step()
    for n, p in ref.named_parameters():
        np.testing.assert_allclose(trainer.params[n], p.detach().numpy(), rtol=1e-12, atol=1e-12)
        assert np.isfinite(trainer.params[n]).all()


class _Net2d(torch.nn.Module):
    def __init__(self, fn, layer=None):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 1)
        self.layer = layer
        self.fn = fn

    def forward(self, x):
        return self.fn(self, self.conv(x))


IMAGE_OPS = {
    "group_norm": (lambda m, v: m.layer(v) * v, lambda: torch.nn.GroupNorm(2, 4)),
    "instance_norm": (lambda m, v: m.layer(v) * v, lambda: torch.nn.InstanceNorm2d(4, affine=True)),
    "upsample by 2": (lambda m, v: F.interpolate(v, scale_factor=2, mode="nearest")[..., 1:4, 2:5] * v, None),
    "upsample to a size": (lambda m, v: F.interpolate(v, size=(6, 3)).sum(-2) * v.mean(-2), None),
    "subsample by 3": (lambda m, v: F.interpolate(v, scale_factor=1 / 3) * v, None),
    "adaptive max pool": (lambda m, v: F.adaptive_max_pool2d(torch.cat([v, -v], -1), (3, 3)) * v, None),
    "adaptive max pool, global": (lambda m, v: F.adaptive_max_pool2d(v, 1) + F.adaptive_max_pool2d(v, (1, 3)), None),
    "adaptive max pool, overlapping windows": (
        lambda m, v: F.adaptive_max_pool2d(v, (2, 2)).sum((-2, -1), keepdim=True) * v, None),
    "adaptive max pool, windows of varying size": (  # columns [0, 2), [1, 4), [3, 5) of 5
        lambda m, v: F.adaptive_max_pool2d(torch.cat([v, -2 * v[..., :2]], -1), (2, 3)).mean((-2, -1), keepdim=True) * v,
        None),
    "adaptive max pool, tied in overlapping windows": (
        lambda m, v: F.adaptive_max_pool2d(torch.stack([v.detach(), v], -1).flatten(-2), (2, 4)) * 2
        + F.adaptive_max_pool2d(torch.stack([v, v.detach()], -1).flatten(-2), (2, 4)), None),
    "adaptive max pool, tied": (  # each window (a, a): PyTorch's gradient to the first, detached or not
        lambda m, v: F.adaptive_max_pool2d(torch.stack([v.detach(), v], -1).flatten(-2), (3, 3)) * 2
        + F.adaptive_max_pool2d(torch.stack([v, v.detach()], -1).flatten(-2), (3, 3)), None),
    "bilinear by 2": (lambda m, v: F.interpolate(v, scale_factor=2, mode="bilinear")[..., 1:4, 2:5] * v, None),
    "bilinear by 2, corners aligned": (
        lambda m, v: F.interpolate(v, scale_factor=2, mode="bilinear", align_corners=True)[..., 1:4, 2:5] * v, None),
    "bilinear by 1.5 and 0.5": (lambda m, v: F.interpolate(v, scale_factor=(1.5, 0.5), mode="bilinear").sum((-2, -1)),
                                None),
    "bilinear to a size": (lambda m, v: F.interpolate(v, size=(7, 3), mode="bilinear").sum(-2) * v.mean(-2), None),
    "bilinear to a size, corners aligned": (
        lambda m, v: F.interpolate(v, size=(2, 5), mode="bilinear", align_corners=True).mean((-2, -1), keepdim=True) * v,
        None),
    "bilinear by 4 (past the last row)": (
        lambda m, v: F.interpolate(v, scale_factor=4, mode="bilinear")[..., 9:, :3] * v, None),
    "bilinear to one row": (lambda m, v: F.interpolate(v, size=(1, 3), mode="bilinear") * v, None),
}


@pytest.mark.parametrize("name", list(IMAGE_OPS))
def test_an_imported_image_operator_matches_pytorch_in_its_output_and_a_step(name):
    fn, layer = IMAGE_OPS[name]
    torch.manual_seed(0)
    _check(_Net2d(fn, layer() if layer else None).double(), torch.randn(3, 4, 3, 3, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("hw,kw", [((17, 9), {"scale_factor": 3}), ((17, 9), {"scale_factor": 1 / 3}),
                                   ((8, 12), {"size": (13, 5)}), ((1, 6), {"scale_factor": (5, 1.25)})],
                         ids=["by 3", "by 1/3", "to 13 x 5", "one row by 5"])
def test_bilinear_upsampling_matches_pytorch_in_its_output_and_its_input_gradient(hw, kw, align_corners, dtype):
    """The rows and weights of bilinear resampling, computed exactly here and in the input's
    float type by PyTorch: the output and the gradient of every input element (read through
    the Trainer's step on a convolution's weight and directly through ``tg.build``) agree to
    that type's rounding, at larger sizes than the table above and in float32."""
    torch.manual_seed(0)
    net = _Net2d(lambda m, v: F.interpolate(v, mode="bilinear", align_corners=align_corners, **kw)).to(dtype)
    x = torch.randn(2, 4, *hw, dtype=dtype)
    model = tgt.import_model(net, (x,))
    xp = model.input_placeholders()[0]
    out = model(xp, train.Context(training=False))
    head = tg.placeholder(out.shape, dtype=out.dtype, name="head")
    params = {p.name: p for p in model.parameters()}
    (grad_x,) = tg.gradient(out, [xp], head=head)
    kern = tg.build([out, grad_x], [xp, head] + [p.placeholder for p in params.values()])
    h = torch.randn(net(x).shape, dtype=dtype)
    got_out, got_grad = kern(x.numpy(), h.numpy(), *[net.state_dict()[n].numpy() for n in params])
    xr = x.clone().requires_grad_(True)
    want = net(xr)
    (want_grad,) = torch.autograd.grad(want, xr, h)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    np.testing.assert_allclose(got_out, want.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(got_grad, want_grad.numpy(), rtol=tol, atol=tol)


def test_bilinear_upsampling_by_a_factor_that_is_no_ratio_of_small_integers_is_refused():
    net = _Net2d(lambda m, v: F.interpolate(v, scale_factor=3.14159, mode="bilinear")).double()
    with pytest.raises(UserError, match="not a ratio of small integers"):
        tgt.import_model(net, (torch.randn(3, 4, 3, 2, dtype=torch.float64),))


@pytest.mark.parametrize("size", [(5, 3), (4, 3), (3, 82)])
def test_nearest_upsampling_by_another_factor_is_refused(size):
    """A ratio that is not whole, or a whole one (41) where PyTorch's float32 index reads
    another row than ``i // 41`` (row 0 for output row 41)."""
    net = _Net2d(lambda m, v: F.interpolate(v, size=size)).double()
    with pytest.raises(UserError, match="not a whole factor"):
        tgt.import_model(net, (torch.randn(3, 4, 3, 2, dtype=torch.float64),))


@pytest.mark.parametrize("fn,reason", [
    (lambda v: torch.roll(v, 1, 0) * v, "roll along axis 0 of size batch, known at run time only"),
    (lambda v: torch.roll(v, v.shape[0], -1) * v, "a shift known at run time only")], ids=["along", "by"])
def test_a_roll_along_a_dynamic_batch_trains_at_exact_batch_sizes_saying_why(fn, reason):
    """A roll's index is affine modulo a size known at import: along the batch, or by a shift
    that is the batch, the Trainer builds a step per batch size (its ``static_reason`` naming
    the roll), PyTorch's."""
    torch.manual_seed(0)
    net = _Net(fn).double()
    x = torch.randn(6, 4, dtype=torch.float64)
    model = tgt.import_model(net, (x,))
    trainer = train.Trainer(model, inputs=model.input_placeholders(), targets=[], loss=tg.nn.mean,
                            optimizer=train.SGD(lr=0.5), progress=False)
    with pytest.warns(RuntimeWarning):
        trainer.update(x.numpy())
    assert reason in trainer.static_reason
    ref = copy.deepcopy(net)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.5)
    ref(x).mean().backward()
    sgd.step()
    for n, p in ref.named_parameters():
        np.testing.assert_allclose(trainer.params[n], p.detach().numpy(), rtol=1e-12, atol=1e-12)
    x4 = torch.randn(4, 4, dtype=torch.float64)
    np.testing.assert_allclose(trainer.predict(x4.numpy()), ref(x4).detach().numpy(), rtol=1e-12, atol=1e-12)


def test_adaptive_max_pooling_to_an_empty_size_is_refused():
    net = _Net2d(lambda m, v: F.adaptive_max_pool2d(v, (0, 3))).double()
    with pytest.raises(UserError, match="adaptive_max_pool2d .* a positive output size"):
        tgt.import_model(net, (torch.randn(3, 4, 3, 3, dtype=torch.float64),))


@pytest.mark.parametrize("pool", [lambda v: F.max_pool2d(v, 3, return_indices=True),
                                  lambda v: F.adaptive_max_pool2d(v, 1, return_indices=True)], ids=["max", "adaptive"])
@pytest.mark.parametrize("use", [lambda v, i: v * (i > 3), lambda v, i: (v, i)], ids=["read", "returned"])
def test_pooling_indices_read_or_returned_are_refused_naming_them(pool, use):
    """Max pooling's indices are not translated (the rule gives the values alone): a model
    reading or returning them is refused at import, naming the result and its reader."""
    net = _Net2d(lambda m, v: use(*pool(v))).double()
    with pytest.raises(UserError, match=r"result 1 of aten\.(adaptive_)?max_pool2d.* is not translated, and "):
        tgt.import_model(net, (torch.randn(3, 4, 3, 3, dtype=torch.float64),))


@pytest.mark.parametrize("index", [-5, 4])
def test_an_index_past_either_end_is_an_error_naming_it_when_the_step_runs(index):
    """Advanced indexing takes ``[-n, n)`` as PyTorch does; an index outside is a clear error
    from the compiled step, naming the index the model gave, not a read of other memory."""
    net = _Net(lambda v: v[:, torch.tensor([0, index])]).double()
    x = torch.randn(6, 4, dtype=torch.float64)
    model = tgt.import_model(net, (x,))
    trainer = train.Trainer(model, inputs=model.input_placeholders(), targets=[], loss=tg.nn.mean,
                            optimizer=train.SGD(lr=0.5), progress=False)
    with pytest.raises(UserError, match=rf"index {index} is out of range \[0, 4\) for dimension 1"):
        trainer.update(x.numpy())


@pytest.mark.parametrize("mode", [None, "use_mm_for_euclid_dist"])
def test_cdist_over_more_than_25_rows_has_pytorch_s_gradient_at_zero_distances(mode):
    """Above 25 rows (or asked to), PyTorch computes 2-norm distances from a matrix product;
    decomposed so, their gradient at a zero distance was NaN in te_grad (PyTorch's is 0):
    ``cdist`` is kept whole and summed from the differences. Compared with PyTorch's exact
    differences (``donot_use_mm_for_euclid_dist``): the product rounds (a zero distance may
    come out near 1e-8, gradients 1e-8 off relative)."""
    def distances(how):
        def fn(v):
            rows = v.t().repeat(8, 1)  # (32, batch): rows 0..3 again and again, zero distances
            kw = {"compute_mode": how} if how else {}
            return torch.cdist(rows, rows[:3] * torch.tensor([[1.0], [1.0], [0.5]]), **kw).sum() * v
        return fn
    torch.manual_seed(0)
    net = _Net(distances(mode)).double()
    ref = copy.deepcopy(net)
    ref.fn = distances("donot_use_mm_for_euclid_dist")
    x = torch.randn(6, 4, dtype=torch.float64)
    model = tgt.import_model(net, (x,))
    xs = model.input_placeholders()
    feed = {xs[0]: x.numpy(), **{p.placeholder: p.value for p in model.parameters()},
            **{s.placeholder: s.initial for s in model.states()}}
    got = tg.evaluate([model(*xs, train.Context(training=False))], feed)[0]
    np.testing.assert_allclose(got, ref(x).detach().numpy(), rtol=1e-13, atol=1e-13)
    trainer = train.Trainer(model, inputs=xs, targets=[], loss=tg.nn.mean, optimizer=train.SGD(lr=0.5),
                            progress=False)
    trainer.update(x.numpy())
    sgd = torch.optim.SGD(ref.parameters(), lr=0.5)
    ref(x).mean().backward()
    sgd.step()
    for n, p in ref.named_parameters():
        assert np.isfinite(trainer.params[n]).all(), n
        np.testing.assert_allclose(trainer.params[n], p.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_hardsigmoid_has_pytorch_s_gradient_on_its_kinks():
    """0 at ``x = -3`` and ``x = 3`` (the decomposition gave 1/6 there). PyTorch's CPU kernel
    multiplies by 1/6 rounded to float32 even in float64, hence the tolerance."""
    def fn(v):
        return F.hardsigmoid(v * 3) + F.hardsigmoid(_at(v, 3.0)) * v + F.hardsigmoid(_at(v, -3.0)) * 2
    torch.manual_seed(0)
    net = _Net(fn).double()
    x = torch.randn(6, 4, dtype=torch.float64)
    model = tgt.import_model(net, (x,))
    trainer = train.Trainer(model, inputs=model.input_placeholders(), targets=[], loss=tg.nn.mean,
                            optimizer=train.SGD(lr=0.5), progress=False)
    trainer.update(x.numpy())
    ref = copy.deepcopy(net)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.5)
    ref(x).mean().backward()
    sgd.step()
    for n, p in ref.named_parameters():
        np.testing.assert_allclose(trainer.params[n], p.detach().numpy(), rtol=1e-7, atol=1e-8)


class _Unary(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, v):
        return self.fn(v)


def test_entropy_whose_gradient_at_0_is_infinite_is_refused():
    """``special.entr``'s gradient at 0 is infinite in PyTorch; decomposed, te_grad's was 0: kept
    whole with no rule, refused by name."""
    with pytest.raises(UserError, match="special_entr"):
        tgt.import_model(_Net(lambda v: torch.special.entr(v.abs())).double(),
                         (torch.randn(6, 4, dtype=torch.float64),))


def test_clamp_by_tensor_bounds_on_and_across_its_bounds_and_at_nan_is_pytorch_s():
    """Every combination of ``x`` below, on, between and above the bounds, ``lo < hi``, ``lo =
    hi``, ``lo > hi``, and NaN in each operand: the value and the three gradients as PyTorch's."""
    class Clamp(torch.nn.Module):
        def forward(self, x, lo, hi):
            return torch.clamp(x, lo, hi) + torch.clamp(x, min=lo) * 2 + torch.clamp(x, max=hi) * 3
    values = [-2.0, -1.0, 0.0, 1.0, 2.0, float("nan")]
    grid = torch.tensor([(x, lo, hi) for x in values for lo in values for hi in values], dtype=torch.float64).t()
    x, lo, hi = (g.reshape(6, -1) for g in grid)
    model = tgt.import_model(Clamp(), (x, lo, hi))
    xs = model.input_placeholders()
    out = model(*xs, train.Context(training=False))
    grads = tg.gradient([out], xs)
    got = tg.evaluate([out] + grads, dict(zip(xs, (x.numpy(), lo.numpy(), hi.numpy()))))
    operands = [t.clone().requires_grad_(True) for t in (x, lo, hi)]
    want = Clamp()(*operands)
    want = [want] + list(torch.autograd.grad(want.sum(), operands))
    for what, g, w in zip(("value", "x's gradient", "lo's gradient", "hi's gradient"), got, want):
        np.testing.assert_array_equal(g, w.detach().numpy(), err_msg=what)


def test_hardsigmoid_and_hardswish_of_nan_are_nan_with_a_nan_gradient():
    """NaN fell through both comparisons to the last piece: hardsigmoid(NaN) was 1 (PyTorch's is
    NaN) and hardswish's gradient there 1. PyTorch's own gradient at NaN is NaN from its
    vectorized kernel and passes through (1) from its scalar loop over the tail of a tensor,
    so there it is compared with NaN, elsewhere with PyTorch's."""
    class Hard(torch.nn.Module):
        def forward(self, v):
            return F.hardsigmoid(torch.log(v)) + F.hardswish(torch.log(v)) * 2
    net = Hard()
    x = torch.tensor([[1.0, 2.0, -1.0, 0.5]] * 3, dtype=torch.float64)
    model = tgt.import_model(net, (x,))
    xs = model.input_placeholders()
    out = model(*xs, train.Context(training=False))
    grad, = tg.gradient([out], [xs[0]])
    feed = {xs[0]: x.numpy(), **{p.placeholder: p.value for p in model.parameters()}}
    got, got_grad = tg.evaluate([out, grad], feed)
    xr = x.clone().requires_grad_(True)
    want = net(xr)
    want_grad, = torch.autograd.grad(want.sum(), xr)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want.detach().numpy()))
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-13, equal_nan=True)
    finite = x.numpy() > 0
    # (PyTorch's CPU hardsigmoid multiplies by 1/6 rounded to float32, hence the tolerance)
    np.testing.assert_allclose(got_grad[finite], want_grad.numpy()[finite], rtol=1e-7)
    assert np.isnan(got_grad[~finite]).all()
    # hardsigmoid alone: its gradient at NaN is 0 in PyTorch's kernels, vectorized or not
    xr = x.clone().requires_grad_(True)
    want_alone, = torch.autograd.grad(F.hardsigmoid(torch.log(xr)).sum(), xr)
    net2 = _Unary(lambda v: F.hardsigmoid(torch.log(v)))
    m2 = tgt.import_model(net2, (x,))
    x2 = m2.input_placeholders()
    g2, = tg.gradient([m2(*x2, train.Context(training=False))], x2)
    got_alone = tg.evaluate([g2], {x2[0]: x.numpy()})[0]
    np.testing.assert_allclose(got_alone, want_alone.numpy(), rtol=1e-7)
    assert (got_alone[~finite] == 0).all()


@pytest.mark.parametrize("p", [0.5, float("inf")])
def test_cdist_of_an_order_below_1_or_infinite_is_refused(p):
    net = _Net(lambda v: torch.cdist(_outer(v), _outer(v)[:, :2], p=p).sum(-1)).double()
    with pytest.raises(UserError, match=r"cdist with p=(0\.5|inf): p of at least 1 and finite"):
        tgt.import_model(net, (torch.randn(6, 4, dtype=torch.float64),))


def test_a_vector_norm_of_another_order_is_refused():
    net = _Net(lambda v: torch.linalg.vector_norm(v, 3, dim=-1)).double()
    with pytest.raises(UserError, match="ord=3"):
        tgt.import_model(net, (torch.randn(6, 4, dtype=torch.float64),))


class _Stepped(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.p = torch.nn.Parameter(torch.tensor([1.7, -2.3], dtype=torch.float64))
        self.fn = fn

    def forward(self, x):
        return x * self.fn(self.p)


@pytest.mark.parametrize("fn", [torch.floor, torch.ceil, torch.round, torch.trunc, torch.sign,
                                lambda p: 0 * torch.var_mean(p)[1]], ids=["floor", "ceil", "round", "trunc",
                                                                          "sign", "zero times var_mean's mean"])
def test_a_parameter_read_through_a_step_function_is_decayed_as_pytorch_decays_it(fn):
    """The gradient of ``floor(p)`` (and of ``0 * mean``, the second result of ``var_mean``) is
    zeros in PyTorch, not None: weight decay moves ``p``."""
    net = _Stepped(fn)
    x = torch.randn(3, 2, dtype=torch.float64)
    model = tgt.import_model(net, (x,))
    trainer = train.Trainer(model, inputs=model.input_placeholders(), targets=[], loss=tg.nn.mean,
                            optimizer=train.SGD(lr=0.5, weight_decay=0.1), progress=False)
    trainer.update(x.numpy())
    ref = copy.deepcopy(net)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.5, weight_decay=0.1)
    ref(x).mean().backward()
    sgd.step()
    np.testing.assert_allclose(trainer.params["p"], ref.p.detach().numpy(), rtol=1e-14)
    assert not np.allclose(trainer.params["p"], [1.7, -2.3])
