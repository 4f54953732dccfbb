"""``torch.compile(model, backend=te_grad.torch.backend)``: training and inference against eager PyTorch.

Every model is trained side by side with an identical eager copy (same initial weights,
same batches, same ``torch.optim`` optimizer): the compiled copy's losses and weights must
match eager PyTorch's. Each test also checks that te_grad kernels really ran (forward calls
of the te_grad ops, a backward kernel built from te_grad's derived gradients), so none can
pass by leaving the whole graph to PyTorch.
"""
import copy
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import te_grad.torch as tgt  # noqa: E402

RTOL = 1e-4


def _close(a, b, rtol=RTOL, atol=1e-6, what=""):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert np.allclose(a, b, rtol=rtol, atol=atol), f"{what}: max diff {np.max(np.abs(a - b))}"


def _backward_built(backend) -> bool:
    """Whether some te_grad op of ``backend`` built a backward kernel (only its autograd does)."""
    for op in backend.ops:
        for key in op._specs.keys():
            spec = op._specs.get(key, None)
            if spec is not None and spec._backward:
                return True
    return False


def _train_both(make, opt, batches, backend, steps=5):
    """Train ``make()`` eagerly and compiled with ``backend``; returns (eager, compiled) models."""
    torch.manual_seed(0)
    eager = make()
    net = copy.deepcopy(eager)
    fast = torch.compile(net, backend=backend)
    opts = [opt(eager.parameters()), opt(net.parameters())]
    for step in range(steps):
        x, y = batches[step % len(batches)]
        losses = []
        for model, o in zip((eager, fast), opts):
            o.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            o.step()
            losses.append(loss.item())
        _close(losses[1], losses[0], what=f"loss at step {step}")
    for (name, a), (_, b) in zip(eager.state_dict().items(), net.state_dict().items()):
        _close(b.detach().numpy(), a.detach().numpy(), what=name)
    return eager, net, fast


def _batches(shape, classes, n=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g), torch.randint(0, classes, (shape[0],), generator=g))
            for _ in range(n)]


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(6, 16), nn.Linear(16, 12), nn.Linear(12, 3)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(F.relu(self.fc1(x)))))


def test_mlp_trains_as_eager_on_te_grad_kernels():
    backend = tgt.Backend()
    eager, net, fast = _train_both(MLP, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                                   _batches((8, 6), 3), backend)
    assert backend.stats["fallback_nodes"] == 0, backend.notes   # the whole graph is te_grad's
    assert backend.stats["te_grad_ops"] == 1 and backend.stats["te_grad_calls"] == 5
    assert _backward_built(backend)
    with torch.no_grad():  # inference
        x = torch.randn(8, 6)
        _close(fast(x).numpy(), eager(x).numpy(), rtol=1e-5, what="inference")


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        # no bias before batch norm: its true gradient is 0, and Adam would scale float noise to steps
        self.conv = nn.Conv2d(2, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 3 * 3, 3)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(h.flatten(1))


def test_cnn_with_batch_norm_trains_as_eager():
    backend = tgt.Backend()
    with pytest.warns(tgt.FallbackWarning, match="aten.add.Tensor"):  # num_batches_tracked += 1
        eager, net, fast = _train_both(CNN, lambda p: torch.optim.Adam(p, lr=1e-2), _batches((6, 2, 6, 6), 3),
                                       backend)
    # the running statistics were updated as eager's (state_dict compared above), and moved
    assert not torch.allclose(net.bn.running_mean, torch.zeros(4))
    assert int(net.bn.num_batches_tracked) == 5
    assert backend.stats["te_grad_calls"] == 5 and _backward_built(backend)
    # the only node left to PyTorch is num_batches_tracked += 1 (an integer result)
    assert backend.stats["fallback_nodes"] == 1 and "aten.add.Tensor" in backend.notes[0]
    eager.eval(), net.eval()
    x = torch.randn(5, 2, 6, 6)
    with torch.no_grad():
        _close(fast(x).numpy(), eager(x).numpy(), rtol=1e-5, what="inference in eval mode")
    _close(net.bn.running_var.numpy(), eager.bn.running_var.numpy(), what="running_var after eval")


class Attention(nn.Module):
    """A single-head self-attention block with a residual and layer norm, then a classifier."""

    def __init__(self, d=8, classes=3):
        super().__init__()
        self.q, self.v, self.o = (nn.Linear(d, d) for _ in range(3))
        self.k = nn.Linear(d, d, bias=False)  # softmax ignores a key bias: its true gradient is 0 (see CNN)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)
        h = self.norm(x + self.o(att @ v))
        return self.head(h.mean(1))


def test_attention_block_trains_as_eager():
    backend = tgt.Backend()
    eager, net, fast = _train_both(Attention, lambda p: torch.optim.Adam(p, lr=1e-2), _batches((4, 5, 8), 3),
                                   backend)
    assert backend.stats["te_grad_calls"] >= 5 and _backward_built(backend)
    assert backend.stats["fallback_nodes"] == 0, backend.notes
    x = torch.randn(4, 5, 8)
    with torch.no_grad():
        _close(fast(x).numpy(), eager(x).numpy(), rtol=1e-5, what="inference")


class WithCumprod(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = torch.sigmoid(self.fc1(x))
        h = torch.cumprod(h, dim=1)  # no te_grad rule: runs in PyTorch
        return self.fc2(h)


def test_untranslated_op_falls_back_once_with_its_name_and_line():
    backend = tgt.Backend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eager, net, fast = _train_both(WithCumprod, lambda p: torch.optim.SGD(p, lr=0.5), _batches((8, 5), 3),
                                       backend, steps=3)
    notes = [str(w.message) for w in caught if issubclass(w.category, tgt.FallbackWarning)]
    assert len(notes) == 1, notes
    assert "aten.cumprod.default" in notes[0] and "test_dynamo_backend.py" in notes[0] \
        and "torch.cumprod(h, dim=1)" in notes[0] and "no te_grad rule" in notes[0]
    # the layers around it are two te_grad ops, run at every step, with te_grad's backward
    assert backend.stats["te_grad_ops"] == 2 and backend.stats["te_grad_calls"] == 6
    assert _backward_built(backend)


def test_a_second_batch_size_reuses_one_symbolic_te_grad_op():
    backend = tgt.Backend()
    torch.manual_seed(0)
    eager = MLP()
    net = copy.deepcopy(eager)
    fast = torch.compile(net, backend=backend)
    for batch in (8, 5, 3):
        x = torch.randn(batch, 6, requires_grad=True)
        y = torch.randint(0, 3, (batch,))
        x2 = x.detach().clone().requires_grad_(True)
        F.cross_entropy(fast(x), y).backward()
        F.cross_entropy(eager(x2), y).backward()
        _close(x.grad.numpy(), x2.grad.numpy(), what=f"input gradient at batch {batch}")
    for a, b in zip(eager.parameters(), net.parameters()):  # gradients accumulated over the 3 batches
        _close(b.grad.numpy(), a.grad.numpy(), what="parameter gradient")
    # batch 8: an exact op; batch 5: Dynamo's symbolic recompile, an op on a size variable; batch 3 reuses it
    assert backend.stats["graphs"] == 2 and backend.stats["te_grad_ops"] == 2
    dynamic = backend.ops[1]
    assert dynamic.dynamic and all(0 in dims for dims in dynamic.dynamic.values())
    (key,) = dynamic._specs.keys()  # one spec: its batch extent is a size variable's name
    assert any(isinstance(e, str) for shape, _ in key for e in shape), key
    assert backend.stats["te_grad_calls"] == 3


class OverriddenPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)

    def forward(self, x):
        return torch.tanh(F.avg_pool2d(self.conv(x), 2, divisor_override=3))


def test_a_node_its_rule_refuses_falls_back_with_the_reason():
    backend = tgt.Backend()
    net = OverriddenPool()
    x = torch.randn(2, 1, 8, 8)
    with pytest.warns(tgt.FallbackWarning, match=r"avg_pool2d.*the rule refused it.*divisor_override"):
        with torch.no_grad():
            got = torch.compile(net, backend=backend)(x)
    with torch.no_grad():
        _close(got.numpy(), net(x).numpy(), rtol=1e-5, what="inference")
    assert backend.stats["te_grad_ops"] == 2 and backend.stats["te_grad_calls"] == 2  # conv, then tanh


class PoolIndices(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        v, i = F.max_pool2d(self.conv(x), 2, return_indices=True)
        return torch.tanh(v * (i % 2 == 0))


def test_pooling_whose_indices_are_read_falls_back_naming_them():
    """Max pooling's indices are not translated: reading them sends the pooling to PyTorch,
    with the reason (the refusal was once charged to the ``getitem`` taking the indices out,
    which the partitioner keeps with its operator: the partitioning never ended)."""
    backend = tgt.Backend()
    net = PoolIndices()
    x = torch.randn(2, 3, 8, 8)
    with pytest.warns(tgt.FallbackWarning, match=r"max_pool2d_with_indices.*result 1 .* is not translated") as seen:
        with torch.no_grad():
            got = torch.compile(net, backend=backend)(x)
    with torch.no_grad():
        _close(got.numpy(), net(x).numpy(), rtol=1e-5, what="inference")
    assert backend.stats["te_grad_ops"] >= 1  # the convolution
    text = next(str(w.message) for w in seen if "max_pool2d_with_indices" in str(w.message))
    assert text.count("return_indices=True") == 1, text  # the source line named once


class MaxIndices(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        v, i = self.lin(x).max(1)
        return torch.tanh(v), i


def test_an_integer_result_returned_beside_a_value_falls_back_and_compiles():
    """``max(1)``'s indices returned as a result: a te_grad op's results are float tensors, so
    the ``getitem`` taking them out is refused, and the refusal goes to ``max`` itself (charged
    to the ``getitem``, which the partitioner keeps with its operator, it never left the
    partition: compiling did not end)."""
    backend = tgt.Backend()
    net = MaxIndices()
    x = torch.randn(6, 4)
    with pytest.warns(tgt.FallbackWarning, match=r"aten\.max\.dim"):
        with torch.no_grad():
            got, idx = torch.compile(net, backend=backend)(x)
    with torch.no_grad():
        want, want_idx = net(x)
    _close(got.numpy(), want.numpy(), rtol=1e-5, what="values")
    assert torch.equal(idx, want_idx)


class MHAConv(torch.nn.Module):
    """nn.MultiheadAttention (its reshapes of a size of run-time extent fall back), a 1-D
    convolution with padding="same" and a linear head."""
    def __init__(self):
        super().__init__()
        self.att = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.conv = torch.nn.Conv1d(8, 8, 4, padding="same")
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x):
        y, _ = self.att(x, x, x)
        return self.fc(self.conv(y.transpose(1, 2)).transpose(1, 2).mean(1))


@pytest.mark.parametrize("mode", [{}, {"dynamic": True}], ids=["default", "dynamic"])
def test_multihead_attention_at_three_batch_sizes_is_eagers(mode):
    """Default settings (a static first batch, then symbolic) and dynamic=True, batches 3, 5 and
    8: the loss and every gradient are eager PyTorch's in float64. A size input of a partition
    whose first reader lies outside it is charged to a reader inside (it used to end the
    partitioning with a StopIteration)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = MHAConv().double()
    twin = copy.deepcopy(net)
    backend = tgt.Backend()
    compiled = torch.compile(net, backend=backend, **mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tgt.FallbackWarning)
        for b in (3, 5, 8):
            x = torch.randn(b, 6, 8, dtype=torch.float64)
            losses = []
            for model in (compiled, twin):
                model.zero_grad()
                loss = model(x).square().sum()
                loss.backward()
                losses.append(loss.item())
            assert abs(losses[0] - losses[1]) <= 1e-12 * abs(losses[1])
            for (name, p), q in zip(net.named_parameters(), twin.parameters()):
                np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    assert backend.stats["te_grad_ops"] >= 1


class Distances(torch.nn.Module):
    """``cdist`` between 32 rows and 3 of them (zero distances): above 25 rows PyTorch's
    ``cdist`` is a matrix product under a square root once traced (``mode`` None); the twin
    takes PyTorch's exact differences (``donot_use_mm_for_euclid_dist``), whose rounding is
    te_grad's (the product's is not: 1e-8 relative in the gradients here)."""
    def __init__(self, mode=None):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.mode = mode

    def forward(self, x):
        rows = self.lin(x).t().repeat(8, 1)
        kw = {"compute_mode": self.mode} if self.mode else {}
        return torch.cdist(rows, rows[:3], **kw).sum() * x


@pytest.mark.parametrize("mode", [{}, {"dynamic": True}], ids=["default", "dynamic"])
def test_cdist_over_many_rows_has_eager_gradients_at_zero_distances(mode):
    """Traced, ``cdist`` above 25 rows became ``sqrt`` of ``x1^2 + x2^2 - 2 x1 x2``: its gradient
    at the zero distances was NaN in te_grad where PyTorch's is 0. It is kept whole (with
    ``_euclidean_dist``) and summed from the differences; batches 4, 7 and 13."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = Distances().double()
    twin = copy.deepcopy(net)
    twin.mode = "donot_use_mm_for_euclid_dist"
    backend = tgt.Backend()
    compiled = torch.compile(net, backend=backend, **mode)
    for b in (4, 7, 13):
        x = torch.randn(b, 4, dtype=torch.float64)
        for model in (compiled, twin):
            model.zero_grad()
            model(x).sum().backward()
        for (name, p), q in zip(net.named_parameters(), twin.parameters()):
            assert torch.isfinite(p.grad).all(), name
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-10, atol=1e-10, err_msg=name)
    assert backend.stats["te_grad_ops"] >= 1


class ZeroVariance(torch.nn.Module):
    """``std`` of a constant row (three copies of one value) beside an ordinary one."""
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        v = self.lin(x)
        return torch.std(v[:, :1].expand(-1, 3), -1, keepdim=True) * v + torch.std(v, -1, keepdim=True)


@pytest.mark.parametrize("mode", [{}, {"dynamic": True}], ids=["default", "dynamic"])
def test_std_where_the_variance_is_zero_has_eager_gradients(mode):
    """Traced, ``std`` was ``sqrt(var)``: its gradient where the variance is 0 was NaN in
    te_grad where PyTorch's is 0. ``std`` is kept whole; batches 4, 7 and 13."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = ZeroVariance().double()
    twin = copy.deepcopy(net)
    backend = tgt.Backend()
    compiled = torch.compile(net, backend=backend, **mode)
    for b in (4, 7, 13):
        x = torch.randn(b, 4, dtype=torch.float64)
        for model in (compiled, twin):
            model.zero_grad()
            model(x).sum().backward()
        for (name, p), q in zip(net.named_parameters(), twin.parameters()):
            assert torch.isfinite(p.grad).all(), name
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)
    assert backend.stats["te_grad_ops"] >= 1


class IntegerChain(torch.nn.Module):
    """A count of positive features as a float factor: ``(h > 0).int().sum(-1).double()``."""
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return h * (h > 0).int().sum(-1, keepdim=True).double() + h.float().double()


@pytest.mark.parametrize("mode", [{}, {"dynamic": True}], ids=["default", "dynamic"])
def test_a_chain_of_integer_results_ending_in_a_float_runs_in_one_te_grad_op(mode):
    """The export checks each dtype conversion's operand (``_assert_tensor_metadata``); that
    check made the comparison, the int32 cast and the int64 sum partition outputs, which te_grad
    does not give, and the chain ran in PyTorch node by node. Batches 4, 7 and 13."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = IntegerChain().double()
    twin = copy.deepcopy(net)
    backend = tgt.Backend()
    compiled = torch.compile(net, backend=backend, **mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tgt.FallbackWarning)
        for b in (4, 7, 13):
            x = torch.randn(b, 4, dtype=torch.float64)
            out = [model(x) for model in (compiled, twin)]
            np.testing.assert_allclose(out[0].detach().numpy(), out[1].detach().numpy(), rtol=1e-13, atol=1e-13)
            for model, y in zip((compiled, twin), out):
                model.zero_grad()
                y.sum().backward()
            for (name, p), q in zip(net.named_parameters(), twin.parameters()):
                np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)
    assert backend.stats["fallback_nodes"] == 0, backend.notes
    assert backend.stats["te_grad_ops"] >= 1


class NoGradBlock(torch.nn.Module):
    """A ``torch.no_grad()`` block in ``forward``: its results are read after it, without gradient."""
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        with torch.no_grad():
            scale = torch.sigmoid(h) * 1.5 + self.lin.weight.sum()
        return h * scale + x * (x + scale)


@pytest.mark.parametrize("mode", [{}, {"dynamic": True}], ids=["default", "dynamic"])
def test_a_no_grad_block_in_forward_compiles_and_gives_eager_gradients(mode):
    """Dynamo keeps the block as grad-mode switches, which made the export trace a joint graph
    (parameters as user inputs, a tangent to feed): the compiled call failed. The block's results
    are detached instead; outputs and parameter gradients as eager's, batches 4, 7 and 13."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = NoGradBlock().double()
    twin = copy.deepcopy(net)
    backend = tgt.Backend()
    compiled = torch.compile(net, backend=backend, **mode)
    for b in (4, 7, 13):
        x = torch.randn(b, 4, dtype=torch.float64)
        out = [model(x) for model in (compiled, twin)]
        np.testing.assert_allclose(out[0].detach().numpy(), out[1].detach().numpy(), rtol=1e-13, atol=1e-13)
        for model, y in zip((compiled, twin), out):
            model.zero_grad()
            y.sum().backward()
        for (name, p), q in zip(net.named_parameters(), twin.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)
    assert backend.stats["te_grad_ops"] >= 1


class Saturated(torch.nn.Module):
    """Softplus past ``exp``'s overflow and a binary cross entropy of a saturated sigmoid."""
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        v = self.lin(x)
        target = torch.tensor([0.1, 0.4, 0.9, 0.4], dtype=v.dtype).expand_as(v)
        return F.softplus(v * 500) + F.mish(v * 500) + F.binary_cross_entropy(torch.sigmoid(v * 40), target,
                                                                               reduction="none")


@pytest.mark.parametrize("mode", [{}, {"dynamic": True}], ids=["default", "dynamic"])
def test_softplus_and_binary_cross_entropy_where_they_saturate_have_eager_gradients(mode):
    """Traced, both were decomposed: softplus's unselected piece overflowed (a NaN gradient
    where PyTorch's is 1) and the clamped logarithms of the cross entropy gave a NaN gradient
    at a probability of exactly 1. Batches 4, 7 and 13."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = Saturated().double()
    twin = copy.deepcopy(net)
    backend = tgt.Backend()
    compiled = torch.compile(net, backend=backend, **mode)
    for b in (4, 7, 13):
        x = torch.randn(b, 4, dtype=torch.float64) * 2
        for model in (compiled, twin):
            model.zero_grad()
            model(x).sum().backward()
        for (name, p), q in zip(net.named_parameters(), twin.parameters()):
            assert torch.isfinite(p.grad).all(), name
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)
    assert backend.stats["te_grad_ops"] >= 1 and backend.stats["fallback_nodes"] == 0, backend.notes


class RunningAverage(torch.nn.Module):
    """A buffer's running average of the features, updated in place under ``no_grad``."""
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("average", torch.zeros(4))

    def forward(self, x):
        h = self.lin(x)
        with torch.no_grad():
            self.average.mul_(0.9).add_(h.mean(0), alpha=0.1)
        return h * self.average


class ScaledWeight(torch.nn.Module):
    """A parameter halved in place under ``no_grad`` before the layer reads it."""
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.mul_(0.5)
        return self.lin(x)


class ClampedInPlace(torch.nn.Module):
    """An activation clamped in place under ``no_grad``: eager's gradient ignores the clamp."""
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x) * 1
        with torch.no_grad():
            h.clamp_(min=0)
        return h


@pytest.mark.parametrize("make", [RunningAverage, ScaledWeight, ClampedInPlace], ids=lambda m: m.__name__)
def test_an_in_place_change_in_a_no_grad_block_runs_the_graph_in_pytorch(make):
    """The export's functional form differentiated the changed tensor (a running average's
    gradient twice eager's, a parameter's gradient lost, the clamp's mask applied), where eager
    PyTorch records nothing: such a graph runs in PyTorch, saying why; gradients and buffers as
    eager's, batches 4, 7 and 13."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = make().double()
    twin = copy.deepcopy(net)
    backend = tgt.Backend()
    compiled = torch.compile(net, backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tgt.FallbackWarning)
        for b in (4, 7, 13):
            x = torch.randn(b, 4, dtype=torch.float64)
            for model in (compiled, twin):
                model.zero_grad()
                model(x).sum().backward()
            for (name, p), q in zip(net.named_parameters(), twin.parameters()):
                assert p.grad is not None, name
                np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)
            for (name, u), v in zip(net.named_buffers(), twin.buffers()):
                np.testing.assert_allclose(u.numpy(), v.numpy(), rtol=1e-13, atol=1e-13, err_msg=name)
    assert backend.stats["graphs_in_pytorch"] >= 1
    assert any("no_grad() block changes a tensor made before it in place" in str(w.message) for w in caught)
