"""import_model translates aten.gelu (exact and tanh), values and gradients against PyTorch."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import te_grad as tg  # noqa: E402
from te_grad import train  # noqa: E402
import te_grad.torch as tgt  # noqa: E402


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_is_imported(approximate):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU(approximate=approximate)).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    model = tgt.import_model(net, (x,))
    xp = model.input_placeholders()[0]
    out = model(xp, train.Context(training=False))
    feed = {p.placeholder: p.value for p in model.parameters()}
    feed[xp] = x.numpy()
    head = np.random.default_rng(0).standard_normal((3, 3))
    hp = tg.placeholder((3, 3), dtype="float64", name="head")
    feed[hp] = head
    params = model.parameters()
    got = tg.evaluate([out] + tg.gradient([out], [p.placeholder for p in params], head=[hp]), feed)
    want = net(x)
    (want * torch.from_numpy(head)).sum().backward()
    np.testing.assert_allclose(got[0], want.detach().numpy(), rtol=1e-12, atol=1e-12)
    tparams = dict(net.named_parameters())
    for p, g in zip(params, got[1:]):
        np.testing.assert_allclose(g, tparams[p.name].grad.numpy(), rtol=1e-12, atol=1e-12)
