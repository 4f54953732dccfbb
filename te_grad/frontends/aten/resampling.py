"""Pooling and resampling: max and average pooling (plain and adaptive), nearest and bilinear upsampling.

- ``max_pool2d_with_indices``: the values alone (the indices are not translated; a model
  reading them is refused at import); ``ceil_mode`` adds the windows PyTorch adds.
- ``adaptive_avg_pool2d(x, (oh, ow))[i, j]``: the mean of rows ``[floor(i h / oh), ceil((i + 1)
  h / oh))`` and the same for columns; ``adaptive_max_pool2d`` the maximum over the same
  windows, ``x`` read at the first one (its gradient goes there alone).
- ``upsample_nearest2d``: output row ``i`` reads ``min(floor(float32(i) * s), n - 1)``, in float32 as
  PyTorch computes it.
- ``upsample_bilinear2d``: source row ``s = r * d`` (corners aligned) or ``max(r * (d + 1/2) -
  1/2, 0)``, ``floor(s)`` and ``s - floor(s)`` computed exactly from ``r = p / q``
  (:func:`_linear_source`); width first, then height, as PyTorch.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ... import dsl, nn
from ...errors import UserError
from ...ir import Tensor
from .table import is_int, rule


def _nearest_rows(n: int, m: int, scale) -> "np.ndarray":
    """The input row of each of the ``m`` output rows of PyTorch's nearest resampling of ``n``
    rows: ``min(floor(float32(i) * s), n - 1)`` in float32, ``s = float32(1 / scale)`` for a
    given scale, else ``float32(n) / m`` (``i // 2`` for ``m = 2 n``, ``i`` for ``m = n``)."""
    if m == n:
        return np.arange(m)
    if m == 2 * n:
        return np.arange(m) >> 1
    s = np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(n) / np.float32(m)
    return np.minimum(np.floor(np.arange(m).astype(np.float32) * s).astype(np.int64), n - 1)


def _resampled_sizes(x: Tensor, output_size, scale_factors, where: str) -> list:
    """``[(n, m, f)]`` for the last two axes of ``x`` resampled by PyTorch's ``output_size``
    or ``scale_factors`` (one of them ``None``): ``n`` input rows, ``m`` output rows
    (``floor(n * f)`` from a scale factor, as PyTorch), ``f`` the float scale factor or
    ``None``. Sizes known only at run time are refused."""
    got = []
    for axis, n in enumerate(x.shape[-2:]):
        f = None if scale_factors is None else float(scale_factors[axis])
        m = None if output_size is None else output_size[axis]
        if not is_int(n) or (m is not None and not is_int(m)):
            raise UserError(f"{where}: sizes known at run time ({tuple(x.shape[-2:])}) are not translated")
        got.append((int(n), int(math.floor(n * f)) if m is None else int(m), f))
    return got


@rule("aten.upsample_nearest2d.vec")
def _upsample_nearest(t, x, output_size, scale_factors):
    """Nearest upsampling (or subsampling) by whole factors: ``out[.., i, j] = x[.., i // k, j // l]``
    (``x[.., i * k, j * l]`` for a factor ``1 / k``), where PyTorch's own rows
    (:func:`_nearest_rows`, in float32) are those; other sizes and factors are refused (at a
    factor of 41, PyTorch's float32 reads row 0 for output row 41)."""
    src, shape = [], list(x.shape[:-2])
    for n, m, f in _resampled_sizes(x, output_size, scale_factors, "upsample_nearest2d"):
        rows = _nearest_rows(n, m, f) if m > 0 else None
        k = None
        if rows is not None and m % n == 0 and np.array_equal(rows, np.arange(m) // (m // n)):
            k = m // n
            src.append(lambda v, k=k: v // k)
        elif rows is not None and n % m == 0 and np.array_equal(rows, np.arange(m) * (n // m)):
            k = n // m
            src.append(lambda v, k=k: v * k)
        if k is None:
            raise UserError(f"upsample_nearest2d: {n} rows to {m} (scale {f}) is not a whole factor whose rows "
                            "PyTorch's float32 index picks exactly (only those are translated)")
        shape.append(m)
    return dsl.compute(tuple(shape), lambda *i: x[i[:-2] + (src[0](i[-2]), src[1](i[-1]))], name="upsample_nearest")


def _linear_source(n: int, m: int, align_corners: bool, scale, dtype, where: str):
    """PyTorch's source of output row ``d`` (of ``m``) in linear resampling of ``n`` rows, as
    ``d -> (h0, h1, lam)``: ``out[d] = (1 - lam) * x[h0] + lam * x[h1]``, with the coordinates
    computed exactly. PyTorch's source coordinate is ``s = r * d`` with corners aligned
    (``r = (n - 1) / (m - 1)``, 0 for ``m = 1``), else ``max(r * (d + 1/2) - 1/2, 0)`` with
    ``r = 1 / scale`` for a given scale factor and ``n / m`` otherwise; ``h0 = min(floor(s),
    n - 1)``, ``h1 = min(h0 + 1, n - 1)``, ``lam = s - floor(s)``. Here ``r = p / q`` is a
    fraction and ``s = N(d) / D`` with an integer numerator, so ``h0`` and ``lam`` are a floor
    division and a remainder: PyTorch computes ``s`` in the input's float type, so the two
    agree to that type's rounding of ``s`` (the result is continuous in ``s``: where
    ``floor`` jumps, ``lam`` goes to 1 on the row the next ``h0`` reads). One exception:
    PyTorch floors a float64 ``s`` in float32 (``floorf``), and where that rounds ``s`` up to
    a whole number it clamps ``lam`` to 0; past about ten million (input rows times output
    rows: 5,000 to 4,999) its float64 results then differ from the exact ones by up to 4e-4
    of the values, where te_grad's do not."""
    if align_corners or not (scale is not None and scale > 0):
        r = Fraction(n - 1, m - 1) if align_corners and m > 1 else Fraction(0) if align_corners else Fraction(n, m)
    else:
        f = Fraction(float(scale)).limit_denominator(1 << 16)
        if float(f) != float(scale):
            raise UserError(f"{where}: scale factor {scale} is not a ratio of small integers (not translated)")
        r = 1 / f
    p, q = r.numerator, r.denominator
    if align_corners:  # s = d * p / q
        slope, offset, den = p, 0, q
    else:  # s = ((2 d + 1) p - q) / (2 q), clamped at 0
        slope, offset, den = 2 * p, p - q, 2 * q
    clamp_low = offset < 0
    top = max(slope * (m - 1) + offset, 0) // den  # the largest floor(s)

    def source(d):
        num = d * slope + offset
        if clamp_low:
            num = dsl.maximum(num, 0)
        h0 = num // den if den > 1 else num
        lam = dsl.cast(dtype, num % den) / dsl.const(float(den), dtype) if den > 1 else dsl.const(0.0, dtype)
        if top > n - 1:
            h0 = dsl.minimum(h0, n - 1)
        h1 = dsl.minimum(h0 + 1, n - 1) if min(top, n - 1) + 1 > n - 1 else h0 + 1
        return h0, h1, lam
    return source


@rule("aten.upsample_bilinear2d.vec")
def _upsample_bilinear(t, x, output_size, align_corners, scale_factors):
    """Bilinear resampling of the last two axes (``F.interpolate(mode="bilinear")``):
    ``out[.., i, j] = (1 - a) r[y0, j] + a r[y1, j]``, ``r[h, j] = (1 - b) x[h, x0] + b x[h, x1]``,
    the rows and weights of :func:`_linear_source` (exact coordinates) for ``i`` and ``j``;
    sizes known at import, scale factors ratios of integers. Two stages, along the width
    then along the height, in PyTorch's order of operations: written as one stage reading
    ``x`` at four clamped corners, the gradient's clamped pieces multiplied (2,000 lines of
    loops, a 12 s build and 5 ms for a 16 x 16 to 32 x 32 step that takes 0.8 ms so)."""
    where = "upsample_bilinear2d"
    if x.ndim != 4:
        raise UserError(f"{where}: input of rank {x.ndim}, 4 expected")
    sources, shape = [], list(x.shape[:-2])
    for n, m, f in _resampled_sizes(x, output_size, scale_factors, where):
        if m < 1:
            raise UserError(f"{where}: an output of {m} rows")
        sources.append(_linear_source(n, m, bool(align_corners), f, x.dtype, where))
        shape.append(m)

    def along_w(*i):
        x0, x1, b = sources[1](i[-1])
        return (1 - b) * x[i[:-1] + (x0,)] + b * x[i[:-1] + (x1,)]
    rows = dsl.compute(tuple(x.shape[:-1]) + (shape[-1],), along_w, name="upsample_bilinear_rows")

    def along_h(*i):
        y0, y1, a = sources[0](i[-2])
        return (1 - a) * rows[i[:-2] + (y0, i[-1])] + a * rows[i[:-2] + (y1, i[-1])]
    return dsl.compute(tuple(shape), along_h, name="upsample_bilinear")


def _pair(v, what):
    v = tuple(v) if isinstance(v, (list, tuple)) else (v, v)
    if len(v) == 1:
        v = (v[0], v[0])
    if len(v) != 2 or not all(is_int(a) for a in v):
        raise UserError(f"{what} must be an int or a pair of ints, got {v!r}")
    return tuple(int(a) for a in v)


def _ceil_extra(n, k, s, p, d):
    """The padding past the end that ``ceil_mode`` adds along one axis (PyTorch's
    ``pooling_output_shape``): the output is ``ceil((n + 2p - d(k-1) - 1) / s) + 1``, less one
    when the last window would start in the padding past the end."""
    span = n + 2 * p - d * (k - 1) - 1
    out = -(-span // s) + 1
    if (out - 1) * s >= n + p:
        out -= 1
    return max((out - 1) * s + d * (k - 1) + 1 - (n + 2 * p), 0)


@rule("aten.max_pool2d_with_indices.default")
def _max_pool2d(t, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    kernel = _pair(kernel, "max_pool2d: kernel_size")
    stride = _pair(stride, "max_pool2d: stride") if stride else kernel
    pad = _pair(padding, "max_pool2d: padding")
    dil = _pair(dilation, "max_pool2d: dilation")
    if ceil_mode:
        h, w = x.shape[2], x.shape[3]
        if not (is_int(h) and is_int(w)):
            raise UserError(f"max_pool2d with ceil_mode=True needs int spatial extents, got {h} x {w}")
        eh, ew = (_ceil_extra(n, k, s, p, d) for n, k, s, p, d in zip((h, w), kernel, stride, pad, dil))
        if eh or ew:
            # the windows ceil_mode adds at the end read -inf past the input (padding is -inf)
            nh, nw = h + eh, w + ew
            x = dsl.compute(x.shape[:2] + (nh, nw), lambda n, c, i, j: dsl.if_then_else(
                dsl.all(i < h, j < w), x[n, c, dsl.minimum(i, h - 1), dsl.minimum(j, w - 1)],
                dsl.const(float("-inf"), x.dtype)), name="max_pool2d_ceil_pad")
    return (nn.max_pool2d(x, kernel, stride, pad, dil), None)


@rule("aten.adaptive_max_pool2d.default")
def _adaptive_max_pool2d(t, x, output_size):
    """Adaptive max pooling: over PyTorch's windows, rows ``floor(i h / oh)`` to ``ceil((i + 1)
    h / oh)`` (likewise columns), of one size ``(h // oh, w // ow)`` when the output divides
    the input (max pooling then) and of varying size, overlapping, when it does not: there
    the window's elements in row-major order along one axis ``q`` (``-inf`` past the window's
    end), the first maximum's position along it (``argmax``), and ``x`` read there, so that the
    gradient goes to that element alone, as PyTorch's. The indices are not translated."""
    oh, ow = _pair(output_size, "adaptive_max_pool2d: output_size")
    h, w = x.shape[-2:]
    if x.ndim != 4 or not (is_int(h) and is_int(w)) or oh < 1 or ow < 1:
        raise UserError(f"adaptive_max_pool2d of {tuple(x.shape)} to {oh}x{ow}: spatial extents known at "
                        "import and a positive output size are translated")
    if h % oh == 0 and w % ow == 0:
        return (nn.max_pool2d(x, (h // oh, w // ow)), None)
    kh, kw = _window_extent(h, oh), _window_extent(w, ow)
    lead = x.shape[:-2]
    start = _window_start

    def at(idx, q):
        """The row and column of position ``q`` of output ``idx``'s window, clamped to ``x``."""
        return (dsl.minimum(start(idx[-2], h, oh) + q // kw, h - 1), dsl.minimum(start(idx[-1], w, ow) + q % kw, w - 1))

    def window(*idx):
        i, j, q = idx[-3], idx[-2], idx[-1]
        inside = dsl.all(start(i, h, oh) + q // kw < _window_end(i, h, oh),
                         start(j, w, ow) + q % kw < _window_end(j, w, ow))
        return dsl.if_then_else(inside, x[idx[:-3] + at(idx[:-1], q)], dsl.const(float("-inf"), x.dtype))
    windows = dsl.compute(lead + (oh, ow, kh * kw), window, name="adaptive_max_pool2d_window")
    first = nn.argmax(windows, windows.ndim - 1)
    return (dsl.compute(lead + (oh, ow), lambda *idx: x[idx[:-2] + at(idx, first[idx])],
                        name="adaptive_max_pool2d"), None)


def _window_start(i, n, o):
    """The start of adaptive pooling's window ``i`` of ``o`` over ``n``: ``floor(i n / o)``."""
    return (i * n) // o


def _window_end(i, n, o):
    """The end (exclusive) of adaptive pooling's window ``i`` of ``o`` over ``n``: ``ceil((i + 1) n / o)``."""
    return (i * n + n + o - 1) // o


def _window_extent(n: int, o: int) -> int:
    """The largest of adaptive pooling's ``o`` windows over ``n`` (PyTorch's)."""
    return max(_window_end(i, n, o) - _window_start(i, n, o) for i in range(o))


@rule("aten.avg_pool2d.default")
def _avg_pool2d(t, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    if ceil_mode or divisor_override is not None:
        raise UserError("avg_pool2d with ceil_mode or divisor_override is not translated")
    return nn.avg_pool2d(x, tuple(kernel), tuple(stride) if stride else None,
                         tuple(padding) if isinstance(padding, (list, tuple)) else padding,
                         count_include_pad=count_include_pad)


@rule("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(t, x, output_size):
    oh, ow = _pair(output_size, "adaptive_avg_pool2d: output_size")
    h, w = x.shape[-2:]
    if (oh, ow) == (1, 1):
        return nn.mean(x, (x.ndim - 2, x.ndim - 1), keepdims=True)
    if not (is_int(h) and is_int(w)):
        raise UserError(f"adaptive_avg_pool2d to {oh}x{ow} needs int spatial extents, got {h} x {w}")
    if h % oh == 0 and w % ow == 0:
        return nn.avg_pool2d(x, (h // oh, w // ow))
    # PyTorch's windows: rows floor(i*h/oh) .. ceil((i+1)*h/oh) (likewise columns), overlapping
    # and of varying size when the output does not divide the input
    kh, kw = _window_extent(h, oh), _window_extent(w, ow)
    ry, rx = dsl.reduce_axis((0, kh), "ry"), dsl.reduce_axis((0, kw), "rx")
    lead = x.shape[:-2]

    def bounds(i, n, o):
        return _window_start(i, n, o), _window_end(i, n, o)

    def total(*idx):
        i, j = idx[-2], idx[-1]
        (h0, h1), (w0, w1) = bounds(i, h, oh), bounds(j, w, ow)
        inside = dsl.all(h0 + ry < h1, w0 + rx < w1)
        val = x[idx[:-2] + (dsl.minimum(h0 + ry, h - 1), dsl.minimum(w0 + rx, w - 1))]
        return dsl.sum(dsl.if_then_else(inside, val, dsl.const(0.0, x.dtype)), axis=[ry, rx])
    sums = dsl.compute(lead + (oh, ow), total, name="adaptive_avg_pool2d_sum")

    def body(*idx):
        i, j = idx[-2], idx[-1]
        (h0, h1), (w0, w1) = bounds(i, h, oh), bounds(j, w, ow)
        return sums[idx] / dsl.cast(x.dtype, (h1 - h0) * (w1 - w0))
    return dsl.compute(lead + (oh, ow), body, name="adaptive_avg_pool2d")
