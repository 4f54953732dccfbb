"""te_grad ops inside PyTorch (te_grad.torch): autograd, gradcheck, torch.compile, training.

Skipped only where PyTorch is not installed; CI installs it and fails on skips."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import te_grad as tg  # noqa: E402
import te_grad.torch as tgt  # noqa: E402
from bridge_ops import causal_conv1d, embedding, layer_norm, two_outputs  # noqa: E402

torch.manual_seed(0)
CONV = tgt.custom_op("te_grad_tests::causal_conv1d", causal_conv1d)
LN = tgt.custom_op("te_grad_tests::layer_norm", layer_norm)
EMB = tgt.custom_op("te_grad_tests::embedding", embedding)
TWO = tgt.custom_op("te_grad_tests::two_outputs", two_outputs)


def torch_causal_conv1d(x, w, dilation=2):
    return torch.nn.functional.conv1d(torch.nn.functional.pad(x, ((w.shape[2] - 1) * dilation, 0)), w,
                                      dilation=dilation)


def test_the_example_runs_as_written():
    x = torch.randn(2, 3, 10, requires_grad=True)
    w = torch.randn(4, 3, 3, requires_grad=True)
    y = CONV(x, w)
    torch.testing.assert_close(y, torch_causal_conv1d(x, w), rtol=1e-5, atol=1e-5)
    y.square().sum().backward()
    gx, gw = x.grad, w.grad
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch_causal_conv1d(x2, w2).square().sum().backward()
    torch.testing.assert_close(gx, x2.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gw, w2.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("which", ["conv", "layer_norm", "embedding", "two_outputs"])
def test_gradcheck_in_float64(which):
    d = torch.float64
    if which == "conv":
        args = (torch.randn(2, 3, 7, dtype=d, requires_grad=True), torch.randn(2, 3, 3, dtype=d, requires_grad=True))
        fn = CONV
    elif which == "layer_norm":
        args = tuple(torch.randn(s, dtype=d, requires_grad=True) for s in ((3, 6), (6,), (6,)))
        fn = LN
    elif which == "embedding":
        args = (torch.randn(5, 3, dtype=d, requires_grad=True), torch.tensor([4, 0, 4, 2]))
        fn = EMB
    else:
        args = (torch.randn(3, 4, dtype=d, requires_grad=True),)
        fn = TWO
    assert torch.autograd.gradcheck(fn, args)


@pytest.mark.parametrize("which", ["conv", "layer_norm", "embedding"])
def test_torch_compile_fullgraph_without_recompiling(which):
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()  # the lambda below has one code object for every case
    counter = CompileCounter()
    if which == "conv":
        make = lambda: (torch.randn(2, 3, 9, requires_grad=True), torch.randn(4, 3, 3, requires_grad=True))  # noqa: E731
        fn, ref = CONV, torch_causal_conv1d
    elif which == "layer_norm":
        make = lambda: tuple(torch.randn(s, requires_grad=True) for s in ((4, 8), (8,), (8,)))  # noqa: E731
        fn, ref = LN, lambda x, g, b: torch.nn.functional.layer_norm(x, (8,), g, b)
    else:
        make = lambda: (torch.randn(6, 3, requires_grad=True), torch.tensor([1, 5, 5]))  # noqa: E731
        fn, ref = EMB, lambda t, i: t[i]
    compiled = torch.compile(lambda *a: fn(*a).square().sum(), fullgraph=True, backend=counter)
    for _ in range(3):
        args = make()
        loss = compiled(*args)
        loss.backward()
        twins = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        ref(*twins).square().sum().backward()
        torch.testing.assert_close(loss, ref(*twins).square().sum(), rtol=1e-4, atol=1e-4)
        for a, b in zip(args, twins):
            if a.requires_grad:
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)
    assert counter.frame_count == 1


def test_gradients_only_for_inputs_that_need_them():
    x = torch.randn(2, 3, 8, requires_grad=True)
    w = torch.randn(4, 3, 3)
    CONV(x, w).sum().backward()
    assert x.grad is not None and w.grad is None
    spec = CONV.spec(x, w)
    assert (True, False) in spec._backward


def test_non_contiguous_inputs_and_float64_dispatch():
    x = torch.randn(2, 8, 3, dtype=torch.float64).transpose(1, 2)
    w = torch.randn(4, 3, 3, dtype=torch.float64)
    assert not x.is_contiguous()
    y = CONV(x, w)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, torch_causal_conv1d(x, w))


def test_errors_are_clear():
    with pytest.raises(tg.UserError, match="takes 2 tensors"):
        CONV(torch.randn(1, 1, 4))
    with pytest.raises(tg.UserError, match="dtype torch.float16"):
        CONV(torch.randn(1, 1, 4, dtype=torch.float16), torch.randn(1, 1, 2, dtype=torch.float16))

    with pytest.raises(tg.UserError, match="on cuda.*CPU"):
        tgt.check_device("x", torch.device("cuda", 0))


def test_relu_and_max_pool_follow_pytorch_at_ties():
    """A relu + max-pool block and its PyTorch twin give identical gradients on inputs full of
    exact zeros (relu'(0) = 0; a tied window sends its gradient to its first maximum)."""
    x = tg.placeholder((2, 3, 8, 8), name="x", dtype="float64")
    for kw in (dict(kernel=2), dict(kernel=3, stride=2, padding=1), dict(kernel=3, stride=1, dilation=2)):
        y = tg.nn.max_pool2d(tg.nn.relu(x), **kw)
        head = tg.placeholder(y.shape, name="H", dtype="float64")
        xv = np.random.default_rng(0).standard_normal(x.shape)
        xv[xv < 0.3] = 0.0
        hv = np.random.default_rng(1).standard_normal(y.shape)
        g, = tg.gradient(y, [x], head=head)
        got = tg.build([g], [x, head])(xv, hv)
        xt = torch.tensor(xv, requires_grad=True)
        tk = dict(kw, kernel_size=kw.pop("kernel"))
        torch.nn.functional.max_pool2d(torch.relu(xt), **tk).backward(torch.tensor(hv))
        np.testing.assert_array_equal(got, xt.grad.numpy())
        np.testing.assert_array_equal(tg.evaluate([g], {x: xv, head: hv})[0], xt.grad.numpy())


class TeGradConvNet(torch.nn.Module):
    """A 1-D CNN whose first layer is the te_grad causal convolution."""

    def __init__(self, conv):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 2, 3) * 0.3)
        self.head = torch.nn.Linear(8 * 16, 1)
        self.conv = conv

    def forward(self, x):
        return self.head(torch.relu(self.conv(x, self.w)).flatten(1))


def test_a_model_with_a_te_grad_layer_trains_like_its_twin():
    torch.manual_seed(3)
    data = torch.randn(32, 2, 16)
    target = data[:, 0].cumsum(1)[:, -1:] * 0.1
    ours = TeGradConvNet(CONV)
    twin = TeGradConvNet(torch_causal_conv1d)
    twin.load_state_dict(ours.state_dict())
    losses = []
    for model in (ours, twin):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(50):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(data), target)
            loss.backward()
            opt.step()
        losses.append(loss.item())
    assert losses[0] < 0.5 * torch.nn.functional.mse_loss(TeGradConvNet(torch_causal_conv1d)(data), target).item() \
        or losses[0] < 1e-2
    assert abs(losses[0] - losses[1]) <= 1e-4 * abs(losses[1]), losses


def test_registering_a_name_again_leaves_the_earlier_op_object_as_it_was():
    """As with torch.library, the newer registration takes the name (torch.ops runs its code);
    the earlier TorchOp object still computes its own values and gradients."""
    def double(x):
        return tg.compute(x.shape, lambda i: x[i] * x[i] * 2.0, name="y")

    def shifted(x):
        return tg.compute(x.shape, lambda i: tg.exp(x[i]) + 100.0, name="y")
    old = tgt.custom_op("tg_reregister::op", double)
    new = tgt.custom_op("tg_reregister::op", shifted)
    for _ in range(2):  # the first call builds, the second reuses
        a = torch.linspace(-1.0, 1.0, 5, dtype=torch.float64, requires_grad=True)
        b = a.detach().clone().requires_grad_(True)
        old(a).sum().backward()
        new(b).sum().backward()
        x = a.detach()
        np.testing.assert_allclose(old(x).numpy(), (2 * x * x).numpy(), rtol=1e-12)
        np.testing.assert_allclose(a.grad.numpy(), (4 * x).numpy(), rtol=1e-12)
        np.testing.assert_allclose(new(x).numpy(), (torch.exp(x) + 100).numpy(), rtol=1e-12)
        np.testing.assert_allclose(b.grad.numpy(), torch.exp(x).numpy(), rtol=1e-12)
    np.testing.assert_allclose(torch.ops.tg_reregister.op_fwd(x)[0].numpy(), (torch.exp(x) + 100).numpy(),
                               rtol=1e-12)


@pytest.mark.parametrize("dynamic", [None, True])
def test_torch_compile_follows_changing_batch_sizes(dynamic):
    """Dynamo marks a dimension dynamic once it changes (or from the start with dynamic=True):
    the op's fake implementation then sees symbolic sizes and the op builds its kernels on a
    size variable for them (or, where it cannot, exact kernels per batch size); values and
    gradients as PyTorch's own layer norm."""
    torch._dynamo.reset()
    ln = tgt.custom_op(f"te_grad_tests::layer_norm_batches_{dynamic}", layer_norm)
    compiled = torch.compile(lambda x, g, b: ln(x, g, b).square().sum(), dynamic=dynamic)
    g, b = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    for batch in (2, 3, 5, 3):
        x = torch.randn(batch, 8, requires_grad=True)
        loss = compiled(x, g, b)
        loss.backward()
        x2, g2, b2 = (t.detach().clone().requires_grad_() for t in (x, g, b))
        want = torch.nn.functional.layer_norm(x2, (8,), g2, b2).square().sum()
        want.backward()
        torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-4)
        g.grad = b.grad = None
    shapes = {k[0] for k in ln._specs.keys()}
    built = {k[0] for k in ln._specs.keys() if ln._specs._specs[k]._vjp is not None}
    if ln.static_reason is None:  # one kernel pair on a size variable serves the batch sizes after the first
        assert any(shape[0] == "x_0" for shape, _ in built)
        assert not built & {((3, 8), "float32"), ((5, 8), "float32")}
    else:  # dynamic=True makes the normalized dimension symbolic too, which layer_norm needs as an int
        assert {((2, 8), "float32"), ((3, 8), "float32"), ((5, 8), "float32")} <= shapes
