"""The layers an imported PyTorch model needs (RMSNorm, SiLU, GELU, Conv1d): their parameters
have torch's ``state_dict`` names and shapes, and with torch's weights copied in their forward
equals the torch layer's."""
import numpy as np
import pytest

import te_grad as tg
from te_grad import train
from te_grad.errors import UserError

torch = pytest.importorskip("torch")


def _forward(model, x):
    X = tg.placeholder(x.shape, dtype=str(x.dtype), name="x")
    params = model.parameters()
    out = model(X, train.Context(training=False))
    return out, X, params


def _check(model, twin, x, rtol=2e-5):
    """Layer parameters are float32, as torch's: compared in float32."""
    x = x.astype(np.float32)
    state = {k: v.detach().numpy() for k, v in twin.state_dict().items()}
    out, X, params = _forward(model, x)
    assert {p.name: tuple(p.shape) for p in params} == {k: v.shape for k, v in state.items()}
    feed = {X: x}
    feed.update({p.placeholder: state[p.name] for p in params})
    got = tg.evaluate([out], feed)[0]
    want = twin(torch.from_numpy(x)).detach().numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


def _randomized(twin, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in twin.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return twin


@pytest.mark.parametrize("shape", [5, (3, 5)])
def test_rms_norm_layer(shape):
    x = np.random.default_rng(1).standard_normal((2, 3, 5)) * 1e-4  # mean squares near the default eps
    model = train.Sequential(train.RMSNorm(shape))
    twin = torch.nn.Sequential(torch.nn.RMSNorm(shape))
    # the weight starts at ones, as torch's
    init = train.zeros()(model.parameters())
    np.testing.assert_array_equal(init["0.weight"], twin.state_dict()["0.weight"].numpy())
    _check(model, _randomized(twin), x)


def test_rms_norm_layer_with_eps():
    x = np.random.default_rng(2).standard_normal((4, 6)) * 1e-3
    _check(train.Sequential(train.RMSNorm(6, eps=1e-2)),
           _randomized(torch.nn.Sequential(torch.nn.RMSNorm(6, eps=1e-2))), x)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_silu_and_gelu_layers(approximate):
    x = np.random.default_rng(3).standard_normal((3, 4)) * 3
    _check(train.Sequential(train.Linear(4, 5), train.GELU(approximate), train.Linear(5, 2), train.SiLU()),
           _randomized(torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.GELU(approximate=approximate),
                                           torch.nn.Linear(5, 2), torch.nn.SiLU())), x)


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1, dilation=2, groups=2, bias=False),
                                dict(padding="same", groups=2), dict(padding="valid", stride=3)])
def test_conv1d_layer(kw):
    x = np.random.default_rng(4).standard_normal((2, 4, 11))
    _check(train.Sequential(train.Conv1d(4, 6, 3, **kw)),
           _randomized(torch.nn.Sequential(torch.nn.Conv1d(4, 6, 3, **kw))), x)


def test_conv1d_layer_on_a_symbolic_batch():
    n = tg.var("n", min=1)
    model = train.Sequential(train.Conv1d(2, 3, 3, padding=1), train.SiLU())
    twin = _randomized(torch.nn.Sequential(torch.nn.Conv1d(2, 3, 3, padding=1), torch.nn.SiLU()))
    X = tg.placeholder((n, 2, 7), name="x")
    out = model(X, train.Context(training=False))
    state = {k: v.detach().numpy() for k, v in twin.state_dict().items()}
    for b in (1, 3):
        x = np.random.default_rng(b).standard_normal((b, 2, 7)).astype(np.float32)
        feed = {X: x, **{p.placeholder: state[p.name] for p in model.parameters()}}
        got = tg.evaluate([out], feed, sizes={n: b})[0]
        np.testing.assert_allclose(got, twin(torch.from_numpy(x)).detach().numpy(), rtol=2e-5, atol=2e-5)


def test_bad_layer_arguments():
    with pytest.raises(UserError, match="GELU: approximate must be 'none' or 'tanh', got 'fast'"):
        train.GELU("fast")
    with pytest.raises(UserError, match="Conv1d: groups=2 must divide in_channels=3"):
        train.Conv1d(3, 4, 2, groups=2)
    with pytest.raises(UserError, match="RMSNorm: normalized_shape"):
        train.RMSNorm(())
