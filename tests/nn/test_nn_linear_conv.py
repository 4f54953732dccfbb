"""te_grad.nn matrix products and convolutions against hand-written numpy references."""
import numpy as np
import pytest

import te_grad as tg
from te_grad import nn

from nn_helpers import close, ev, ph, random_arrays

rand = random_arrays(0)


# ---------------------------------------------------------------------------
# numpy references
# ---------------------------------------------------------------------------

def pad4(p):
    if isinstance(p, int):
        return (p,) * 4
    return tuple(p) * 2 if len(p) == 2 else tuple(p)


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def conv2d_ref(x, w, stride=1, padding=0, dilation=1, groups=1):
    (sh, sw), (dh, dw) = pair(stride), pair(dilation)
    pt, pl, pb, pr = pad4(padding)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow), dtype=x.dtype)
    og = o // groups
    for g in range(groups):
        for ky in range(kh):
            for kx in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg,
                           ky * dh: ky * dh + sh * (oh - 1) + 1: sh,
                           kx * dw: kx * dw + sw * (ow - 1) + 1: sw]
                out[:, g * og:(g + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, ky, kx])
    return out


def conv2d_transpose_ref(x, w, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """Scatter form: each input pixel adds x * w to the output rows it reaches."""
    (sh, sw), (dh, dw), (oph, opw) = pair(stride), pair(dilation), pair(output_padding)
    pt, pl, pb, pr = pad4(padding)
    n, c, h, wd = x.shape
    _, cog, kh, kw = w.shape
    cig = c // groups
    fh = (h - 1) * sh + dh * (kh - 1) + 1 + oph
    fw = (wd - 1) * sw + dw * (kw - 1) + 1 + opw
    full = np.zeros((n, cog * groups, fh, fw), dtype=x.dtype)
    for g in range(groups):
        for ky in range(kh):
            for kx in range(kw):
                full[:, g * cog:(g + 1) * cog,
                     ky * dh: ky * dh + (h - 1) * sh + 1: sh,
                     kx * dw: kx * dw + (wd - 1) * sw + 1: sw] += np.einsum(
                    "nchw,co->nohw", x[:, g * cig:(g + 1) * cig], w[g * cig:(g + 1) * cig, :, ky, kx])
    return full[:, :, pt:fh - pb, pl:fw - pr]


# ---------------------------------------------------------------------------
# dense / matmul / batch_matmul
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("n,k,m", [(1, 1, 1), (3, 5, 4), (7, 2, 3)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_dense(n, k, m, with_bias):
    X, W, B = ph((n, k), "X"), ph((m, k), "W"), ph((m,), "B")
    x, w, b = rand((n, k)), rand((m, k)), rand((m,))
    out = nn.dense(X, W, B if with_bias else None)
    assert out.shape == (n, m)
    want = x @ w.T + (b if with_bias else 0.0)
    close(ev(out, {X: x, W: w, B: b}), want)


def test_dense_float32():
    X, W = ph((4, 6), "X", "float32"), ph((3, 6), "W", "float32")
    x, w = rand((4, 6), "float32"), rand((3, 6), "float32")
    out = nn.dense(X, W)
    assert out.dtype == "float32"
    close(ev(out, {X: x, W: w}), x @ w.T, "float32")


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("m,k,n", [(3, 4, 5), (1, 3, 2)])
def test_matmul(ta, tb, m, k, n):
    a, b = rand((m, k)), rand((k, n))
    a_in, b_in = (a.T.copy() if ta else a), (b.T.copy() if tb else b)
    A, B = ph(a_in.shape, "A"), ph(b_in.shape, "B")
    out = nn.matmul(A, B, transpose_a=ta, transpose_b=tb)
    assert out.shape == (m, n)
    close(ev(out, {A: a_in, B: b_in}), a @ b)


@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("ba,bb", [(2, 2), (1, 3), (3, 1)])
def test_batch_matmul(tb, ba, bb):
    m, k, n = 3, 4, 2
    a, b = rand((ba, m, k)), rand((bb, k, n))
    b_in = b.transpose(0, 2, 1).copy() if tb else b
    A, B = ph(a.shape, "A"), ph(b_in.shape, "B")
    out = nn.batch_matmul(A, B, transpose_b=tb)
    want = np.matmul(a, b)  # numpy broadcasts a batch of 1
    assert out.shape == want.shape
    close(ev(out, {A: a, B: b_in}), want)


# ---------------------------------------------------------------------------
# conv2d
# ---------------------------------------------------------------------------

CONV_CASES = [
    # (N, C, H, W), (O, KH, KW), stride, padding, dilation, groups
    ((1, 1, 5, 5), (1, 3, 3), 1, 0, 1, 1),
    ((2, 3, 7, 6), (4, 3, 3), 1, 1, 1, 1),
    ((2, 3, 7, 6), (4, 3, 3), 2, 1, 1, 1),
    ((1, 2, 8, 7), (3, 3, 2), (2, 1), (1, 0), 1, 1),
    ((1, 2, 9, 9), (2, 3, 3), 1, 2, 2, 1),
    ((1, 2, 9, 8), (2, 3, 3), 2, (2, 1), (2, 3), 1),
    ((1, 3, 6, 7), (2, 2, 3), 1, (0, 1, 2, 1), 1, 1),       # asymmetric padding
    ((2, 3, 7, 5), (2, 3, 3), 2, (1, 0, 0, 2), 1, 1),       # asymmetric + stride
    ((1, 4, 6, 6), (6, 3, 3), 1, 1, 1, 2),                  # groups=2
    ((1, 4, 7, 7), (4, 3, 3), 2, 1, 2, 2),                  # groups + stride + dilation
    ((2, 3, 6, 5), (3, 3, 3), 1, 1, 1, 3),                  # depthwise
    ((1, 3, 7, 7), (6, 3, 3), 2, 1, 1, 3),                  # depthwise, multiplier 2
    ((1, 4, 5, 5), (8, 1, 1), 1, 0, 1, 4),                  # depthwise 1x1
    ((2, 5, 4, 3), (3, 1, 1), 1, 0, 1, 1),                  # pointwise
    ((1, 2, 3, 3), (2, 3, 3), 3, 0, 1, 1),                  # single output pixel
]


@pytest.mark.parametrize("xs,ws,stride,padding,dilation,groups", CONV_CASES)
def test_conv2d(xs, ws, stride, padding, dilation, groups):
    o, kh, kw = ws
    wshape = (o, xs[1] // groups, kh, kw)
    X, W = ph(xs, "X"), ph(wshape, "W")
    x, w = rand(xs), rand(wshape)
    out = nn.conv2d(X, W, stride=stride, padding=padding, dilation=dilation, groups=groups)
    want = conv2d_ref(x, w, stride, padding, dilation, groups)
    assert out.shape == want.shape
    close(ev(out, {X: x, W: w}), want)


def test_conv2d_bias_and_float32():
    X, W, B = ph((2, 3, 6, 6), "X", "float32"), ph((4, 3, 3, 3), "W", "float32"), \
        ph((4,), "B", "float32")
    x, w, b = rand(X.shape, "float32"), rand(W.shape, "float32"), rand((4,), "float32")
    out = nn.conv2d(X, W, stride=2, padding=1, bias=B)
    assert out.dtype == "float32"
    want = conv2d_ref(x, w, 2, 1) + b[None, :, None, None]
    close(ev(out, {X: x, W: w, B: b}), want, "float32")


def test_conv2d_guards_only_where_needed():
    X, W = ph((1, 2, 6, 6), "X"), ph((2, 2, 3, 3), "W")
    assert "if_then_else" not in tg.show(nn.conv2d(X, W))
    text = tg.show(nn.conv2d(X, W, padding=(1, 0, 0, 0)))
    assert text.count(">= 0") == 1 and " < 6" not in text


# ---------------------------------------------------------------------------
# conv2d_transpose
# ---------------------------------------------------------------------------

TCONV_CASES = [
    # (N, C_in, H, W), (C_out/groups, KH, KW), stride, padding, output_padding, dilation, groups
    ((1, 1, 3, 3), (1, 3, 3), 1, 0, 0, 1, 1),
    ((2, 3, 4, 3), (2, 3, 3), 2, 1, 1, 1, 1),
    ((1, 2, 3, 4), (3, 3, 2), (2, 3), (1, 0), (1, 2), 1, 1),
    ((1, 2, 4, 4), (2, 3, 3), 1, 1, 0, 2, 1),
    ((1, 2, 3, 3), (2, 2, 3), 3, 0, (2, 1), (1, 2), 1),
    ((1, 4, 3, 4), (3, 3, 3), 2, 1, 0, 1, 2),                  # groups=2
    ((2, 3, 3, 3), (1, 3, 3), 2, 1, 1, 1, 3),                  # depthwise
    ((1, 2, 4, 3), (2, 4, 3), 2, (1, 0, 2, 1), 0, 1, 1),       # asymmetric padding
    ((1, 3, 2, 2), (2, 1, 1), 1, 0, 0, 1, 1),                  # 1x1
]


@pytest.mark.parametrize("xs,ws,stride,padding,output_padding,dilation,groups", TCONV_CASES)
def test_conv2d_transpose(xs, ws, stride, padding, output_padding, dilation, groups):
    wshape = (xs[1],) + ws
    X, W = ph(xs, "X"), ph(wshape, "W")
    x, w = rand(xs), rand(wshape)
    out = nn.conv2d_transpose(X, W, stride=stride, padding=padding,
                              output_padding=output_padding, dilation=dilation, groups=groups)
    want = conv2d_transpose_ref(x, w, stride, padding, output_padding, dilation, groups)
    assert out.shape == want.shape
    close(ev(out, {X: x, W: w}), want)


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 2),
                                                             (2, (1, 0, 2, 1), 2, 1)])
def test_conv2d_transpose_is_adjoint_of_conv2d(stride, padding, dilation, groups):
    """<conv2d(x, w), y> == <x, conv2d_transpose(y, w)> with matching parameters."""
    xs, w = (1, 4, 7, 8), rand((6, 4 // groups, 3, 3))
    X, W = ph(xs, "X"), ph(w.shape, "W")
    y_t = nn.conv2d(X, W, stride=stride, padding=padding, dilation=dilation, groups=groups)
    sh = pair(stride)
    pt, pl, pb, pr = pad4(padding)
    dil = pair(dilation)
    # output_padding recovers the rows the strided convolution dropped
    oph = [(xs[2 + a] + pad4(padding)[a] + pad4(padding)[a + 2] - dil[a] * 2 - 1) % sh[a]
           for a in range(2)]
    Y = ph(y_t.shape, "Y")
    x_t = nn.conv2d_transpose(Y, W, stride=stride, padding=padding, output_padding=tuple(oph),
                              dilation=dilation, groups=groups)
    assert x_t.shape == xs
    x, y = rand(xs), rand(y_t.shape)
    lhs = np.sum(ev(y_t, {X: x, W: w}) * y)
    rhs = np.sum(x * ev(x_t, {Y: y, W: w}))
    assert abs(lhs - rhs) < 1e-9 * max(1.0, abs(lhs))


def test_conv2d_transpose_bias():
    X, W, B = ph((1, 2, 3, 3), "X"), ph((2, 3, 2, 2), "W"), ph((3,), "B")
    x, w, b = rand(X.shape), rand(W.shape), rand((3,))
    out = nn.conv2d_transpose(X, W, stride=2, bias=B)
    close(ev(out, {X: x, W: w, B: b}), conv2d_transpose_ref(x, w, 2) + b[None, :, None, None])


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------

def _x(shape=(1, 4, 6, 6)):
    return ph(shape, "X")


ERRORS = [
    (lambda: nn.dense(ph((2, 3), "X"), ph((4, 5), "W")), "dense: .*3 input features"),
    (lambda: nn.dense(ph((2, 3, 1), "X"), ph((4, 3), "W")), "dense: x X must be 2-D"),
    (lambda: nn.dense(ph((2, 3), "X"), ph((4, 3), "W"), ph((5,), "B")), "dense: bias B has length 5"),
    (lambda: nn.dense("x", ph((4, 3), "W")), "dense: x must be a tensor"),
    (lambda: nn.matmul(ph((2, 3), "A"), ph((4, 5), "B")), "matmul: inner dimensions"),
    (lambda: nn.matmul(ph((2, 3), "A"), ph((2, 5), "B"), transpose_b=True), "matmul: inner"),
    (lambda: nn.batch_matmul(ph((2, 3, 4), "A"), ph((3, 4, 5), "B")), "batch_matmul: batch sizes"),
    (lambda: nn.batch_matmul(ph((2, 3, 4), "A"), ph((2, 5, 5), "B")), "batch_matmul: inner"),
    (lambda: nn.batch_matmul(ph((3, 4), "A"), ph((2, 4, 5), "B")), "batch_matmul: a A must be 3-D"),
    (lambda: nn.conv2d(_x(), ph((2, 3, 3, 3), "W")), "conv2d: channel mismatch"),
    (lambda: nn.conv2d(_x(), ph((2, 4, 3, 3), "W"), groups=3), "conv2d: groups=3 does not divide the 4"),
    (lambda: nn.conv2d(_x(), ph((3, 2, 3, 3), "W"), groups=2), "conv2d: groups=2 .* 3 output"),
    (lambda: nn.conv2d(_x(), ph((2, 4, 3, 3), "W"), groups=0), "conv2d: groups must be a positive"),
    (lambda: nn.conv2d(_x(), ph((2, 4, 3, 3), "W"), stride=0), r"conv2d: stride must be >= 1"),
    (lambda: nn.conv2d(_x(), ph((2, 4, 3, 3), "W"), stride=(1, 2, 3)), "conv2d: stride must be"),
    (lambda: nn.conv2d(_x(), ph((2, 4, 3, 3), "W"), dilation=0), "conv2d: dilation"),
    (lambda: nn.conv2d(_x(), ph((2, 4, 3, 3), "W"), padding=-1), "conv2d: padding must be non-neg"),
    (lambda: nn.conv2d(_x(), ph((2, 4, 3, 3), "W"), padding=(1, 2, 3)), r"conv2d: padding must be an int"),
    (lambda: nn.conv2d(_x(), ph((2, 4, 7, 3), "W")), "conv2d: the dilated kernel"),
    (lambda: nn.conv2d(_x(), ph((2, 4, 3, 3), "W"), dilation=3), "conv2d: the dilated kernel"),
    (lambda: nn.conv2d(_x(), ph((2, 4, 3, 3), "W"), bias=ph((3,), "B")), "conv2d: bias B has length 3"),
    (lambda: nn.conv2d(ph((4, 6, 6), "X"), ph((2, 4, 3, 3), "W")), "conv2d: input X must be 4-D"),
    (lambda: nn.conv2d(_x(), ph((2, 4, 3), "W")), "conv2d: weight W must be 4-D"),
    (lambda: nn.conv2d_transpose(_x(), ph((3, 2, 3, 3), "W")), "conv2d_transpose: channel mismatch"),
    (lambda: nn.conv2d_transpose(_x(), ph((4, 2, 3, 3), "W"), groups=3), "conv2d_transpose: groups=3"),
    (lambda: nn.conv2d_transpose(_x(), ph((4, 2, 3, 3), "W"), stride=2, output_padding=2),
     "conv2d_transpose: output_padding 2 must be smaller"),
    (lambda: nn.conv2d_transpose(_x((1, 4, 1, 1)), ph((4, 2, 1, 1), "W"), padding=1),
     "conv2d_transpose: padding 1 leaves an empty output"),
    (lambda: nn.conv2d_transpose(_x(), ph((4, 2, 3, 3), "W"), bias=ph((4,), "B")),
     "conv2d_transpose: bias B has length 4"),
]


@pytest.mark.parametrize("build,match", ERRORS)
def test_errors(build, match):
    with pytest.raises(tg.TeGradError, match=match):
        build()


def test_errors_are_user_errors():
    with pytest.raises(tg.UserError):
        nn.conv2d(_x(), ph((2, 3, 3, 3), "W"))
