"""The same ops written several ways, as users write them: a sibling of :mod:`te_grad.suite`.

``FORMULATIONS[op][name](dtype, small=False)`` builds a fresh
:class:`~te_grad.suite.Workload`. Every formulation of one op computes the same
function of the same data (layouts aside: ``conv_nhwc`` takes NHWC images and HWIO
weights), so equivalent formulations should compile to kernels of about the same
speed; ``benchmarks/formulations.py`` measures how far they are. ``small=True`` gives
sizes that the reference evaluator checks in a moment.
"""
from __future__ import annotations

from typing import Callable, Dict

from . import dsl, nn
from .suite import Workload


def _conv_sizes(small):
    return (2, 4, 6, 6, 3) if small else (4, 32, 32, 32, 32)  # batch, channels, height, width, filters


def conv_guards(dt, small=False):
    """``nn.conv2d(padding=1)``: the zero padding as guards inside the convolution."""
    n, c, h, w, f = _conv_sizes(small)
    x = dsl.placeholder((n, c, h, w), dtype=dt, name="X")
    k = dsl.placeholder((f, c, 3, 3), dtype=dt, name="W")
    return Workload("conv_guards", nn.conv2d(x, k, padding=1), [x, k])


def conv_pad_stage(dt, small=False):
    """A separate zero-padding stage ``P`` that the convolution reads without guards."""
    n, c, h, w, f = _conv_sizes(small)
    x = dsl.placeholder((n, c, h, w), dtype=dt, name="X")
    k = dsl.placeholder((f, c, 3, 3), dtype=dt, name="W")
    p = dsl.compute((n, c, h + 2, w + 2), lambda b, ch, y, v: dsl.if_then_else(
        dsl.all(y >= 1, y < h + 1, v >= 1, v < w + 1), x[b, ch, y - 1, v - 1], 0.0), name="P")
    rc, ry, rx = dsl.reduce_axis(c, "c"), dsl.reduce_axis(3, "ry"), dsl.reduce_axis(3, "rx")
    y = dsl.compute((n, f, h, w), lambda b, o, i, j: dsl.sum(p[b, rc, i + ry, j + rx] * k[o, rc, ry, rx],
                                                           axis=[rc, ry, rx]), name="Y")
    return Workload("conv_pad_stage", y, [x, k])


def _strided(stride, dilation):
    """The guarded and the padding-stage 3x3 convolution with ``stride`` and ``dilation``
    (padding ``dilation``, so that stride 1 keeps the size)."""
    def guards(dt, small=False):
        n, c, h, w, f = _conv_sizes(small)
        x = dsl.placeholder((n, c, h, w), dtype=dt, name="X")
        k = dsl.placeholder((f, c, 3, 3), dtype=dt, name="W")
        y = nn.conv2d(x, k, stride=stride, padding=dilation, dilation=dilation)
        return Workload(f"conv_guards_s{stride}d{dilation}", y, [x, k])

    def pad_stage(dt, small=False):
        n, c, h, w, f = _conv_sizes(small)
        d = dilation
        x = dsl.placeholder((n, c, h, w), dtype=dt, name="X")
        k = dsl.placeholder((f, c, 3, 3), dtype=dt, name="W")
        p = dsl.compute((n, c, h + 2 * d, w + 2 * d), lambda b, ch, y, v: dsl.if_then_else(
            dsl.all(y >= d, y < h + d, v >= d, v < w + d), x[b, ch, y - d, v - d], 0.0), name="P")
        rc, ry, rx = dsl.reduce_axis(c, "c"), dsl.reduce_axis(3, "ry"), dsl.reduce_axis(3, "rx")
        oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
        y = dsl.compute((n, f, oh, ow), lambda b, o, i, j: dsl.sum(
            p[b, rc, stride * i + d * ry, stride * j + d * rx] * k[o, rc, ry, rx], axis=[rc, ry, rx]), name="Y")
        return Workload(f"conv_pad_stage_s{stride}d{dilation}", y, [x, k])
    guards.__doc__ = f"``nn.conv2d(stride={stride}, dilation={dilation}, padding={dilation})``: guards."
    pad_stage.__doc__ = (f"The same convolution (stride {stride}, dilation {dilation}) reading a separate "
                         "zero-padding stage.")
    return guards, pad_stage


conv_guards_s2, conv_pad_stage_s2 = _strided(2, 1)
conv_guards_d2, conv_pad_stage_d2 = _strided(1, 2)


def conv_nhwc(dt, small=False):
    """Channels last: NHWC images, HWIO weights, guards for the padding."""
    n, c, h, w, f = _conv_sizes(small)
    x = dsl.placeholder((n, h, w, c), dtype=dt, name="X")
    k = dsl.placeholder((3, 3, c, f), dtype=dt, name="W")
    rc, ry, rx = dsl.reduce_axis(c, "c"), dsl.reduce_axis(3, "ry"), dsl.reduce_axis(3, "rx")

    def body(b, i, j, o):
        yy, vv = i + ry - 1, j + rx - 1
        inside = dsl.all(yy >= 0, yy < h, vv >= 0, vv < w)
        return dsl.sum(dsl.if_then_else(inside, x[b, yy, vv, rc], 0.0) * k[ry, rx, rc, o], axis=[rc, ry, rx])
    return Workload("conv_nhwc", dsl.compute((n, h, w, f), body, name="Y"), [x, k])


def _dense_sizes(small):
    return (5, 7, 6) if small else (256, 512, 256)  # rows, inputs, outputs


def dense_oi(dt, small=False):
    """``nn.dense``: weights stored ``W[out, in]`` (PyTorch's ``Linear``)."""
    m, i, o = _dense_sizes(small)
    x, w = dsl.placeholder((m, i), dtype=dt, name="X"), dsl.placeholder((o, i), dtype=dt, name="W")
    return Workload("dense_oi", nn.dense(x, w), [x, w])


def dense_io(dt, small=False):
    """``nn.matmul``: weights stored ``W[in, out]`` (JAX's and Keras's layout)."""
    m, i, o = _dense_sizes(small)
    x, w = dsl.placeholder((m, i), dtype=dt, name="X"), dsl.placeholder((i, o), dtype=dt, name="W")
    return Workload("dense_io", nn.matmul(x, w), [x, w])


def _rows(small, cols):
    return (3, 9) if small else (256, cols)


def softmax_one(dt, small=False):
    """``nn.softmax``."""
    x = dsl.placeholder(_rows(small, 1000), dtype=dt, name="X")
    return Workload("softmax_one", nn.softmax(x), [x])


def softmax_stages(dt, small=False):
    """Softmax as five stages: row max, shift, exp, row sum, divide."""
    r, c = _rows(small, 1000)
    x = dsl.placeholder((r, c), dtype=dt, name="X")
    k = dsl.reduce_axis(c, "k")
    m = dsl.compute((r,), lambda i: dsl.max(x[i, k], axis=k), name="m")
    d = dsl.compute((r, c), lambda i, j: x[i, j] - dsl.stop_gradient(m[i]), name="d")
    e = dsl.compute((r, c), lambda i, j: dsl.exp(d[i, j]), name="e")
    k2 = dsl.reduce_axis(c, "k2")
    s = dsl.compute((r,), lambda i: dsl.sum(e[i, k2], axis=k2), name="s")
    return Workload("softmax_stages", dsl.compute((r, c), lambda i, j: e[i, j] / s[i], name="y"), [x])


def layer_norm_one(dt, small=False):
    """``nn.layer_norm`` without scale and shift."""
    x = dsl.placeholder(_rows(small, 1024), dtype=dt, name="X")
    return Workload("layer_norm_one", nn.layer_norm(x), [x])


def layer_norm_stages(dt, small=False):
    """Layer norm as four stages: mean, centre, variance, normalize."""
    r, c = _rows(small, 1024)
    x = dsl.placeholder((r, c), dtype=dt, name="X")
    k = dsl.reduce_axis(c, "k")
    mu = dsl.compute((r,), lambda i: dsl.sum(x[i, k], axis=k) / float(c), name="mu")
    cen = dsl.compute((r, c), lambda i, j: x[i, j] - mu[i], name="c")
    k2 = dsl.reduce_axis(c, "k2")
    var = dsl.compute((r,), lambda i: dsl.sum(cen[i, k2] * cen[i, k2], axis=k2) / float(c), name="var")
    y = dsl.compute((r, c), lambda i, j: cen[i, j] / dsl.sqrt(var[i] + 1e-5), name="y")
    return Workload("layer_norm_stages", y, [x])


def _bmm_sizes(small):
    return (2, 5, 3, 9) if small else (8, 128, 64, 128)  # batch, rows, inner, columns


def bmm_plain(dt, small=False):
    """``A @ B`` batched, both operands row-major."""
    b, m, k, n = _bmm_sizes(small)
    x, y = dsl.placeholder((b, m, k), dtype=dt, name="A"), dsl.placeholder((b, k, n), dtype=dt, name="B")
    return Workload("bmm_plain", nn.batch_matmul(x, y), [x, y])


def bmm_transposed(dt, small=False):
    """``A^T @ B^T`` batched: both operands stored transposed."""
    b, m, k, n = _bmm_sizes(small)
    x, y = dsl.placeholder((b, k, m), dtype=dt, name="A"), dsl.placeholder((b, n, k), dtype=dt, name="B")
    return Workload("bmm_transposed", nn.batch_matmul(x, y, transpose_a=True, transpose_b=True), [x, y])


def resize_exact(x, oh: int, ow: int):
    """A bilinear resize of ``x`` (N, C, H, W) to (N, C, oh, ow), corners aligned, written with
    exact integer coordinates: ``//`` and ``%`` by the output size, the last row and column
    clamped (their weight is zero there). Its gradient once compiled to thousands of lines
    of loops (one piece per row of each clamped tap); ``benchmarks/build_time.py`` keeps
    its build time in view."""
    n, c, h, w = x.shape

    def body(b, ch, oy, ox):
        y0, x0 = (oy * (h - 1)) // (oh - 1), (ox * (w - 1)) // (ow - 1)
        y1, x1 = dsl.minimum(y0 + 1, h - 1), dsl.minimum(x0 + 1, w - 1)
        wy, wx = ((oy * (h - 1)) % (oh - 1)) / float(oh - 1), ((ox * (w - 1)) % (ow - 1)) / float(ow - 1)
        return ((1.0 - wy) * ((1.0 - wx) * x[b, ch, y0, x0] + wx * x[b, ch, y0, x1])
                + wy * ((1.0 - wx) * x[b, ch, y1, x0] + wx * x[b, ch, y1, x1]))
    return dsl.compute((n, c, oh, ow), body, name="resize")


def jacobi_steps(u, steps: int):
    """``steps`` unrolled steps of a 5-point Jacobi stencil on the 2-D grid ``u`` (the border
    kept), each a tensor of its own: the same stage ``steps`` times over other buffers."""
    rows, cols = u.shape
    out = u
    for k in range(steps):
        p = out
        out = dsl.compute((rows, cols), lambda i, j, p=p: dsl.if_then_else(
            (i > 0) & (i < rows - 1) & (j > 0) & (j < cols - 1),
            0.25 * (p[i - 1, j] + p[i + 1, j] + p[i, j - 1] + p[i, j + 1]), p[i, j]), name=f"step{k}")
    return out


def _window_sizes(small):
    return (1, 12, 4, 3, 5) if small else (2, 512, 8, 32, 32)  # batch, tokens, heads, head width, window


def _sliding_window(dt, small, split):
    """Sliding-window attention (Longformer) whose window depends on the head: token ``i`` of
    a head in the first half attends to the ``W`` tokens around it (``i + w - W // 2``),
    of a head in the second half to the ``W`` tokens behind it (``i + w - W + 1``), ``w < W``;
    keys outside the sequence are masked (a score of -1e4, a value of 0). ``Q``, ``K``, ``V``
    are (B, N, H, D). ``split``: the window written as two terms, one per half of the heads,
    each reading at an affine index; else one read whose offset is an ``if_then_else`` on
    the head."""
    b_, n, heads, d, w_ = _window_sizes(small)
    half = heads // 2
    q, k, v = (dsl.placeholder((b_, n, heads, d), dtype=dt, name=nm) for nm in "QKV")
    rd, rw = dsl.reduce_axis(d, "d"), dsl.reduce_axis(w_, "w")
    scale = 1.0 / float(d) ** 0.5

    def inside(j):
        return dsl.all(j >= 0, j < n)

    def read(x, b, j, h, dd):
        return dsl.if_then_else(inside(j), x[b, j, h, dd], 0.0)

    if split:
        def window(i, h, w, term):
            near, behind = i + w - w_ // 2, i + w - (w_ - 1)
            return (dsl.if_then_else(h < half, term(near), 0.0)
                    + dsl.if_then_else(h >= half, term(behind), 0.0))

        def mask(i, h, w):
            return ((h < half) & inside(i + w - w_ // 2)) | ((h >= half) & inside(i + w - (w_ - 1)))
    else:
        def window(i, h, w, term):
            return term(i + w - dsl.if_then_else(h < half, w_ // 2, w_ - 1))

        def mask(i, h, w):
            return inside(i + w - dsl.if_then_else(h < half, w_ // 2, w_ - 1))

    s = dsl.compute((b_, heads, n, w_), lambda b, h, i, w: dsl.if_then_else(mask(i, h, w), window(
        i, h, w, lambda j: dsl.sum(q[b, i, h, rd] * read(k, b, j, h, rd), axis=rd)) * scale, -1e4), name="S")
    p = nn.softmax(s)
    o = dsl.compute((b_, n, heads, d), lambda b, i, h, dd: window(
        i, h, rw, lambda j: dsl.sum(p[b, h, i, rw] * read(v, b, j, h, dd), axis=rw)), name="O")
    return Workload("longformer_split" if split else "longformer_conditional", o, [q, k, v])


def longformer_conditional(dt, small=False):
    """Sliding-window attention, the window's offset an ``if_then_else`` on the head inside
    the index: ``K[b, i + w - if_then_else(h < H // 2, W // 2, W - 1), h, d]``."""
    return _sliding_window(dt, small, split=False)


def longformer_split(dt, small=False):
    """The same attention with the window split by hand into two sums, one per half of
    the heads, each reading at an affine index."""
    return _sliding_window(dt, small, split=True)

FORMULATIONS: Dict[str, Dict[str, Callable[..., Workload]]] = {
    "conv3x3": {"conv_guards": conv_guards, "conv_pad_stage": conv_pad_stage, "conv_nhwc": conv_nhwc},
    "conv3x3_stride2": {"conv_guards_s2": conv_guards_s2, "conv_pad_stage_s2": conv_pad_stage_s2},
    "conv3x3_dilation2": {"conv_guards_d2": conv_guards_d2, "conv_pad_stage_d2": conv_pad_stage_d2},
    "dense": {"dense_oi": dense_oi, "dense_io": dense_io},
    "softmax": {"softmax_one": softmax_one, "softmax_stages": softmax_stages},
    "layer_norm": {"layer_norm_one": layer_norm_one, "layer_norm_stages": layer_norm_stages},
    "batch_matmul": {"bmm_plain": bmm_plain, "bmm_transposed": bmm_transposed},
    "sliding_window_attention": {"longformer_conditional": longformer_conditional,
                                 "longformer_split": longformer_split},
}
