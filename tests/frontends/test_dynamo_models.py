"""``torch.compile(model, backend=te_grad.torch.backend)`` on the models import_model covers:
a residual CNN with batch norm (ResNet's basic blocks), a GPT-2 block (embeddings, causal
``scaled_dot_product_attention``, tanh GELU, layer norm) and an ``nn.LSTM`` classifier, each
trained 5 steps next to an eager twin from the same weights and batches: the same losses, the
same weights (and running statistics), with te_grad kernels really used (the backend's counters)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch._dynamo  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import te_grad.torch as tgt  # noqa: E402


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) \
            if stride != 1 or cin != cout else None

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (x if self.down is None else self.down(x)))


class SmallResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.layer1, self.layer2 = BasicBlock(8, 8, 1), BasicBlock(8, 16, 2)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class GPT2Block(nn.Module):
    def __init__(self, vocab=20, d=16, heads=2, seq=8):
        super().__init__()
        self.heads = heads
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, ids):
        b, t = ids.shape
        x = self.wte(ids) + self.wpe(torch.arange(t))
        q, k, v = self.c_attn(self.ln_1(x)).split(x.shape[-1], dim=2)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.c_proj(y)
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return self.lm_head(x)


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(6, 12, batch_first=True)
        self.head = nn.Linear(12, 4)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def _close(got, want, rtol, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(np.abs(want).max(initial=0.0), 1e-3)
    err = np.abs(got - want).max(initial=0.0) / scale
    assert err <= rtol, f"{what}: relative error {err:.3g} > {rtol:g}"


CASES = {
    "resnet": (SmallResNet, lambda g: torch.randn(4, 3, 12, 12, generator=g),
               lambda g: torch.randint(0, 5, (4,), generator=g)),
    "gpt2": (GPT2Block, lambda g: torch.randint(0, 20, (4, 8), generator=g),
             lambda g: torch.randint(0, 20, (4, 8), generator=g)),
    "lstm": (LSTMClassifier, lambda g: torch.randn(4, 5, 6, generator=g),
             lambda g: torch.randint(0, 4, (4,), generator=g)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_five_steps_through_the_backend_are_eager_pytorchs(name):
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):  # Dynamo leaves nn.LSTM to eager mode otherwise
        _train_and_compare(name)


def _train_and_compare(name):
    make, inputs, labels = CASES[name]
    torch.manual_seed(0)
    net = make()
    twin = make()
    twin.load_state_dict(net.state_dict())
    backend = tgt.Backend()
    compiled = torch.compile(net, backend=backend)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (net, twin)]
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        x, y = inputs(g), labels(g)
        losses = []
        for model, opt in zip((compiled, twin), opts):
            opt.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        _close(losses[0], losses[1], 1e-4, f"{name} loss at step {step}")
    want = twin.state_dict()
    for key, value in net.state_dict().items():
        if key.endswith("num_batches_tracked"):
            assert value.item() == want[key].item() == 5, key
        else:
            _close(value.numpy(), want[key].numpy(), 1e-4, f"{name} {key}")
    assert backend.stats["te_grad_ops"] >= 1 and backend.stats["te_grad_calls"] >= 5
    if name == "lstm":  # the recurrence decomposes into cells te_grad translates: nothing falls back
        assert backend.stats["fallback_nodes"] == 0, backend.notes
    # what falls back is only what must: batch norm's int64 step counter and the bool mask of a
    # causal attention (a te_grad op's results are float tensors), never a float operator
    for note in backend.notes:
        assert "this one is int64" in note or "this one is bool" in note or "aten.any" in note, note
