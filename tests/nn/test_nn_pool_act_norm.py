"""te_grad.nn pooling, activations and normalization against numpy references."""
import math

import numpy as np
import pytest

import te_grad as tg
from te_grad import nn

from nn_helpers import close, ev, ph, random_arrays

rand = random_arrays(1)


def pad4(p):
    if isinstance(p, int):
        return (p,) * 4
    return tuple(p) * 2 if len(p) == 2 else tuple(p)


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


# ---------------------------------------------------------------------------
# pooling references: explicit loops over output pixels
# ---------------------------------------------------------------------------

def pool_ref(x, kernel, stride, padding, dilation, kind, count_include_pad=True):
    (kh, kw), (dh, dw) = pair(kernel), pair(dilation)
    sh, sw = pair(kernel if stride is None else stride)
    pt, pl, pb, pr = pad4(padding)
    n, c, h, w = x.shape
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            vals, inside = [], 0
            for ky in range(kh):
                for kx in range(kw):
                    r, q = i * sh - pt + ky * dh, j * sw - pl + kx * dw
                    if 0 <= r < h and 0 <= q < w:
                        vals.append(x[:, :, r, q])
                        inside += 1
                    else:
                        vals.append(np.full((n, c), -np.inf if kind == "max" else 0.0))
            v = np.stack(vals)
            if kind == "max":
                out[:, :, i, j] = v.max(axis=0)
            else:
                out[:, :, i, j] = v.sum(axis=0) / (kh * kw if count_include_pad else inside)
    return out


POOL_CASES = [
    # shape, kernel, stride, padding, dilation
    ((1, 1, 4, 4), 2, None, 0, 1),
    ((2, 3, 7, 6), 3, 2, 1, 1),
    ((1, 2, 7, 7), 3, 1, 1, 1),
    ((1, 2, 8, 7), (3, 2), (2, 1), (1, 0), 1),
    ((1, 2, 9, 9), 3, 2, 1, 2),
    ((1, 2, 7, 8), (2, 3), 2, (0, 1, 1, 0), 1),   # asymmetric padding
    ((2, 1, 5, 5), 5, 1, 2, 1),                  # pad 2 with kernel 5: corner windows mostly padding
    ((1, 1, 3, 3), 1, 1, 0, 1),                  # 1x1 window
]


@pytest.mark.parametrize("shape,kernel,stride,padding,dilation", POOL_CASES)
def test_max_pool2d(shape, kernel, stride, padding, dilation):
    X = ph(shape, "X")
    x = rand(shape)
    out = nn.max_pool2d(X, kernel, stride=stride, padding=padding, dilation=dilation)
    close(ev(out, {X: x}), pool_ref(x, kernel, stride, padding, dilation, "max"))


def test_max_pool2d_padding_is_minus_infinity():
    X = ph((1, 1, 3, 3), "X")
    x = -np.ones((1, 1, 3, 3)) - np.arange(9.0).reshape(1, 1, 3, 3)
    got = ev(nn.max_pool2d(X, 3, stride=1, padding=1), {X: x})
    assert np.all(got < 0)  # a zero padding would win every max here
    close(got, pool_ref(x, 3, 1, 1, 1, "max"))


@pytest.mark.parametrize("shape,kernel,stride,padding,dilation", [c for c in POOL_CASES if c[4] == 1])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d(shape, kernel, stride, padding, dilation, count_include_pad):
    X = ph(shape, "X")
    x = rand(shape)
    out = nn.avg_pool2d(X, kernel, stride=stride, padding=padding, count_include_pad=count_include_pad)
    close(ev(out, {X: x}), pool_ref(x, kernel, stride, padding, 1, "avg", count_include_pad))


def test_pool_float32():
    X = ph((2, 3, 6, 6), "X", "float32")
    x = rand(X.shape, "float32")
    close(ev(nn.max_pool2d(X, 2), {X: x}), pool_ref(x, 2, None, 0, 1, "max").astype("float32"),
          "float32")
    close(ev(nn.avg_pool2d(X, 3, 2, 1, count_include_pad=False), {X: x}),
          pool_ref(x, 3, 2, 1, 1, "avg", False).astype("float32"), "float32")


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 4, 5)])
def test_global_pools(shape):
    X = ph(shape, "X")
    x = rand(shape)
    avg, mx = nn.global_avg_pool2d(X), nn.global_max_pool2d(X)
    assert avg.shape == mx.shape == shape[:2] + (1, 1)
    close(ev(avg, {X: x}), x.mean(axis=(2, 3), keepdims=True))
    close(ev(mx, {X: x}), x.max(axis=(2, 3), keepdims=True))


# ---------------------------------------------------------------------------
# activations
# ---------------------------------------------------------------------------

_erf = np.vectorize(math.erf)

ACTIVATIONS = [
    ("relu", nn.relu, lambda x: np.maximum(x, 0.0)),
    ("leaky_relu", nn.leaky_relu, lambda x: np.where(x > 0, x, 0.01 * x)),
    ("leaky_relu_0.2", lambda X: nn.leaky_relu(X, alpha=0.2), lambda x: np.where(x > 0, x, 0.2 * x)),
    ("sigmoid", nn.sigmoid, lambda x: 1.0 / (1.0 + np.exp(-x))),
    ("tanh", nn.tanh, np.tanh),
    ("gelu", nn.gelu, lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))),
]


@pytest.mark.parametrize("name,op,ref", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4)])
def test_activation(name, op, ref, shape):
    X = ph(shape, "X")
    x = rand(shape) * 3
    out = op(X)
    assert out.shape == shape and out.name == name.split("_0")[0]
    close(ev(out, {X: x}), np.asarray(ref(x), dtype="float64"))


@pytest.mark.parametrize("name,op,ref", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation_float32(name, op, ref):
    X = ph((3, 4), "X", "float32")
    x = rand((3, 4), "float32") * 3
    out = op(X)
    assert out.dtype == "float32"
    close(ev(out, {X: x}), np.asarray(ref(x.astype("float64"))).astype("float32"), "float32")


def softmax_ref(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("shape,axis", [((5,), 0), ((3, 4), -1), ((3, 4), 0), ((2, 3, 4), 1),
                                        ((2, 1, 3), 1), ((2, 3, 4), -3)])
def test_softmax_and_log_softmax(shape, axis):
    X = ph(shape, "X")
    x = rand(shape) * 4
    close(ev(nn.softmax(X, axis), {X: x}), softmax_ref(x, axis))
    close(ev(nn.log_softmax(X, axis), {X: x}), np.log(softmax_ref(x, axis)))


def test_softmax_is_stable_for_large_inputs():
    X = ph((2, 3), "X")
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1000.0, -999.0]])
    s, ls = ev(nn.softmax(X), {X: x}), ev(nn.log_softmax(X), {X: x})
    assert np.all(np.isfinite(s)) and np.all(np.isfinite(ls))
    close(s, softmax_ref(x, -1))
    close(ls, np.log(softmax_ref(x, -1)))
    X32 = ph((2, 3), "X", "float32")
    s32 = ev(nn.softmax(X32), {X32: x.astype("float32")})
    close(s32, softmax_ref(x, -1).astype("float32"), "float32")


def test_softmax_uses_a_max_reduction():
    X = ph((2, 3), "X")
    text = tg.show(nn.softmax(X))
    assert "softmax_max[" in text and "max(X[" in text and "exp(X[i, j] - stop_gradient(softmax_max[i]))" in text
    assert "log_softmax_max[" in tg.show(nn.log_softmax(X))


# ---------------------------------------------------------------------------
# normalization
# ---------------------------------------------------------------------------

def layer_norm_ref(x, gamma, beta, axes, eps):
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    out = (x - mean) / np.sqrt(var + eps)
    if gamma is not None:
        out = out * gamma
    if beta is not None:
        out = out + beta
    return out


@pytest.mark.parametrize("shape,axis", [((4, 5), -1), ((2, 3, 4), -1), ((2, 3, 4), (1, 2)),
                                        ((2, 3, 4), (-1, -2)), ((6,), 0), ((2, 1, 3), (1, 2))])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(shape, axis, affine):
    axes = (axis,) if isinstance(axis, int) else axis
    axes = tuple(sorted(a % len(shape) for a in axes))
    pshape = tuple(shape[a] for a in axes)
    X, G, B = ph(shape, "X"), ph(pshape, "G"), ph(pshape, "B")
    x, g, b = rand(shape), rand(pshape), rand(pshape)
    out = nn.layer_norm(X, G if affine else None, B if affine else None, axis=axis, eps=1e-3)
    want = layer_norm_ref(x, g if affine else None, b if affine else None, axes, 1e-3)
    close(ev(out, {X: x, G: g, B: b}), want)


def test_layer_norm_float32():
    X, G, B = ph((3, 8), "X", "float32"), ph((8,), "G", "float32"), ph((8,), "B", "float32")
    x, g, b = rand((3, 8), "float32"), rand((8,), "float32"), rand((8,), "float32")
    got = ev(nn.layer_norm(X, G, B), {X: x, G: g, B: b})
    close(got, layer_norm_ref(x.astype("float64"), g, b, (1,), 1e-5).astype("float32"), "float32")


@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 4), (2, 3, 4, 5), (1, 2, 3, 3)])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm(shape, affine):
    c = shape[1]
    X, G, B = ph(shape, "X"), ph((c,), "G"), ph((c,), "B")
    x, g, b = rand(shape) * 2 + 1, rand((c,)), rand((c,))
    axes = tuple(d for d in range(len(shape)) if d != 1)
    bshape = (1, c) + (1,) * (len(shape) - 2)
    want = layer_norm_ref(x, g.reshape(bshape) if affine else None,
                          b.reshape(bshape) if affine else None, axes, 1e-5)
    out = nn.batch_norm(X, G if affine else None, B if affine else None)
    got = ev(out, {X: x, G: g, B: b})
    close(got, want)
    if not affine:  # batch statistics: every channel is normalized
        np.testing.assert_allclose(got.mean(axis=axes), 0.0, atol=1e-10)


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------

X4 = ph((1, 2, 5, 5), "X")
X2 = ph((3, 4), "X")
ERRORS = [
    (lambda: nn.max_pool2d(X4, 2, padding=2), "max_pool2d: padding 2 must be at most half"),
    (lambda: nn.max_pool2d(X4, 0), "max_pool2d: kernel must be >= 1"),
    (lambda: nn.max_pool2d(X4, 3, dilation=3), "max_pool2d: the window"),
    (lambda: nn.max_pool2d(X2, 2), "max_pool2d: input X must be 4-D"),
    (lambda: nn.max_pool2d(X4, 2, stride=(1, 0)), "max_pool2d: stride must be >= 1"),
    (lambda: nn.avg_pool2d(X4, 6), "avg_pool2d: the window"),
    (lambda: nn.avg_pool2d(X4, (2, 2), padding=(0, 2)), r"avg_pool2d: padding \(0, 2\)"),
    (lambda: nn.avg_pool2d(X4, "a"), "avg_pool2d: kernel must be an int"),
    (lambda: nn.global_avg_pool2d(X2), "global_avg_pool2d: input X must be 4-D"),
    (lambda: nn.global_max_pool2d(ph((1, 2, 0, 3), "E")), "global_max_pool2d: input E has an empty"),
    (lambda: nn.relu(ph((2,), "I", "int32")), "relu: input I must have a float dtype"),
    (lambda: nn.leaky_relu(X2, alpha="x"), "leaky_relu: alpha must be a number"),
    (lambda: nn.gelu([1.0]), "gelu: input must be a tensor"),
    (lambda: nn.softmax(X2, axis=2), "softmax: axis 2 is out of range"),
    (lambda: nn.softmax(X2, axis=1.0), "softmax: axis must be an int"),
    (lambda: nn.log_softmax(ph((), "S"), axis=0), "log_softmax: input S is 0-d"),
    (lambda: nn.log_softmax(X2, axis=-3), "log_softmax: axis -3 is out of range"),
    (lambda: nn.layer_norm(ph((2, 3, 4), "X"), axis=(0, 2)), r"layer_norm: axis \(0, 2\) must name"),
    (lambda: nn.layer_norm(ph((2, 3, 4), "X"), axis=1), "layer_norm: axis 1 must name distinct trailing"),
    (lambda: nn.layer_norm(ph((2, 3, 4), "X"), axis=(2, -1)), "layer_norm: .*distinct"),
    (lambda: nn.layer_norm(X2, axis=()), "layer_norm: axis must be an int or a non-empty"),
    (lambda: nn.layer_norm(X2, ph((3,), "G"), None), r"layer_norm: gamma G has shape \[3\]"),
    (lambda: nn.layer_norm(X2, None, ph((4, 1), "B")), r"layer_norm: beta B has shape \[4, 1\]"),
    (lambda: nn.layer_norm(X2, eps=-1.0), "layer_norm: eps must be a non-negative"),
    (lambda: nn.batch_norm(X2, ph((3,), "G")), r"batch_norm: gamma G has shape \[3\] but \[4\]"),
    (lambda: nn.batch_norm(ph((4,), "V")), "batch_norm: input V must be 2-D or 3-D"),
    (lambda: nn.batch_norm(ph((0, 3), "E")), "batch_norm: no elements"),
]


@pytest.mark.parametrize("build,match", ERRORS)
def test_errors(build, match):
    with pytest.raises(tg.TeGradError, match=match):
        build()
