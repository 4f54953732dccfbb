"""2-D pooling in NCHW layout: max, average, and their global forms."""
from __future__ import annotations

from .. import dsl
from ..errors import UserError
from ..ir import Tensor
from ._util import (affine, may_reach, smallest, check_tensor, compute, guard, int_tuple, padding4, reduce, reduce_axes,
                    tap)
from .conv import _at_min, conv2d_output_shape

__all__ = ["max_pool2d", "avg_pool2d", "global_avg_pool2d", "global_max_pool2d"]


def _window(op: str, x: Tensor, kernel, stride, padding, dilation):
    """Checked pooling parameters and the output shape."""
    check_tensor(op, x, "input", ndim=4)
    kh, kw = int_tuple(op, "kernel", kernel, 2, minimum=1)
    sh, sw = int_tuple(op, "stride", (kh, kw) if stride is None else stride, 2, minimum=1)
    dh, dw = int_tuple(op, "dilation", dilation, 2, minimum=1)
    pad = padding4(op, padding)
    pt, pl, pb, pr = pad
    if max(pt, pb) > kh // 2 or max(pl, pr) > kw // 2:
        raise UserError(f"{op}: padding {padding!r} must be at most half the kernel {[kh, kw]}")
    n, c, h, w = x.shape
    oh, ow = conv2d_output_shape((h, w), (kh, kw), (sh, sw), pad, (dh, dw))
    if smallest(oh) < 1 or smallest(ow) < 1:  # a size expression: at its variables' min
        raise UserError(f"{op}: the window {[dh * (kh - 1) + 1, dw * (kw - 1) + 1]} is larger "
                        f"than the padded input {[h + pt + pb, w + pl + pr]}{_at_min(h, w)}")
    return (kh, kw), (sh, sw), pad, (dh, dw), (n, c, oh, ow)


def _window_read(x: Tensor, idx, taps, stride, pad, dilation, out_hw, fill):
    """``x`` at window tap ``taps`` of output ``idx``, or ``fill`` outside the input."""
    nn, cc, hh, ww = idx
    (ry, rx), (sh, sw), (dh, dw) = taps, stride, dilation
    pt, pl = pad[0], pad[1]
    h, w = x.shape[2], x.shape[3]
    ih = tap(affine(hh, sh, -pt), ry, dh)
    iw = tap(affine(ww, sw, -pl), rx, dw)
    max_h = (out_hw[0] - 1) * sh + (0 if isinstance(ry, int) else ry.extent - 1) * dh - pt
    max_w = (out_hw[1] - 1) * sw + (0 if isinstance(rx, int) else rx.extent - 1) * dw - pl
    cond = guard([ih >= 0 if pt > 0 else None, ih < h if may_reach(max_h, h) else None,
                   iw >= 0 if pl > 0 else None, iw < w if may_reach(max_w, w) else None])
    val = x[nn, cc, ih, iw]
    return val if cond is None else dsl.if_then_else(cond, val, fill)


def max_pool2d(x: Tensor, kernel, stride=None, padding=0, dilation=1, ties: str = "first") -> Tensor:
    """2-D max pooling of ``x`` (N, C, H, W) into (N, C, OH, OW) (PyTorch's ``max_pool2d``).

    ``out[n, c, h, w] = max_{ry, rx} xpad[n, c, h*stride_h + ry*dilation_h, w*stride_w +
    rx*dilation_w]`` over the ``kernel`` window, where padding counts as ``-inf``.
    ``kernel``, ``stride`` (default: the kernel) and ``dilation`` are an int or a
    pair; ``padding`` is an int, (ph, pw) or (top, left, bottom, right), at most
    half the kernel; ``OH = (H + pad_top + pad_bottom - dilation_h*(KH-1) - 1) // stride_h + 1``.

    ``ties`` says where the gradient of a window whose maximum is reached more than once
    goes (after a ReLU, all-zero windows are common): ``"first"`` (the default, as PyTorch
    and JAX) to the first such element in row-major window order; ``"split"`` evenly among
    them (te_grad's rule for ``tg.max``). With ``"first"`` the op is the window maximum
    (``max_pool2d_max``), the position of its first occurrence (``max_pool2d_argmax``, an
    integer ``min`` reduction) and a read of ``x`` there.
    """
    op = "max_pool2d"
    k, s, pad, d, oshape = _window(op, x, kernel, stride, padding, dilation)
    taps, axes = reduce_axes(k, ("ry", "rx"))
    if ties not in ("first", "split"):
        raise UserError(f"{op}: ties must be 'first' or 'split', got {ties!r}")
    if ties == "split":
        return compute(oshape, lambda idx: reduce(
            "max", _window_read(x, idx, taps, s, pad, d, oshape[2:], float("-inf")), axes),
            name=op, names="nchw")
    mx = compute(oshape, lambda idx: reduce(
        "max", _window_read(x, idx, taps, s, pad, d, oshape[2:], float("-inf")), axes),
        name=op + "_max", names="nchw")
    return _read_at_first(op, x, mx, oshape, k, taps, axes, s, pad, d)


def _read_at_first(op, x, mx, oshape, k, taps, axes, s, pad, d):
    """``x`` at the first window position where it equals the window maximum ``mx``."""
    kh, kw = k
    count = kh * kw

    def position(idx):
        ry, rx = taps
        flat = (0 if isinstance(ry, int) else ry * kw) + (0 if isinstance(rx, int) else rx)
        at = _window_read(x, idx, taps, s, pad, d, oshape[2:], float("-inf"))
        return reduce("min", dsl.if_then_else(at == mx[idx], dsl.cast("int64", dsl.as_expr(flat)),
                                              dsl.const(count)), axes)
    first = compute(oshape, position, name=op + "_argmax", names="nchw")
    (sh, sw), (pt, pl), (dh, dw) = s, pad[:2], d
    h, w = x.shape[2], x.shape[3]

    def body(idx):
        nn, cc, hh, ww = idx
        am = first[idx]
        ih = hh * sh - pt + (am // kw) * dh
        iw = ww * sw - pl + (am % kw) * dw
        inside = dsl.all(am < count, ih >= 0, ih < h, iw >= 0, iw < w)
        # a window of NaN (no element equals its max) or of -inf only: the max itself, no gradient
        return dsl.if_then_else(inside, x[nn, cc, ih, iw], dsl.stop_gradient(mx[idx]))
    return compute(oshape, body, name=op, names="nchw")


def avg_pool2d(x: Tensor, kernel, stride=None, padding=0, count_include_pad: bool = True) -> Tensor:
    """2-D average pooling of ``x`` (N, C, H, W) into (N, C, OH, OW) (PyTorch's ``avg_pool2d``).

    ``out[n, c, h, w]`` is the sum of ``x`` over the ``kernel`` window at rows
    ``h*stride_h - pad_top + ry`` and columns ``w*stride_w - pad_left + rx``
    (padding reads 0), divided by ``KH*KW`` when ``count_include_pad`` and by the
    number of window positions inside ``x`` otherwise. ``kernel`` and ``stride``
    (default: the kernel) are an int or a pair; ``padding`` is an int, (ph, pw) or
    (top, left, bottom, right), at most half the kernel. Computed as a sum
    (``avg_pool2d_sum``) followed by the division.
    """
    op = "avg_pool2d"
    k, s, pad, d, oshape = _window(op, x, kernel, stride, padding, 1)
    taps, axes = reduce_axes(k, ("ry", "rx"))
    total = compute(oshape, lambda idx: reduce(
        "sum", _window_read(x, idx, taps, s, pad, d, oshape[2:], 0.0), axes),
        name=op + "_sum", names="nchw")
    (kh, kw), (sh, sw), (pt, pl, _, _) = k, s, pad
    h, w = x.shape[2], x.shape[3]

    def count(o, stride_, pad_before, size, ksize, out_size):
        """Window positions along one axis that fall inside ``x`` (an int or an expression)."""
        clamp_lo = pad_before > 0
        clamp_hi = (out_size - 1) * stride_ + ksize - pad_before > size
        if not clamp_lo and not clamp_hi:
            return ksize
        start, end = affine(o, stride_, -pad_before), affine(o, stride_, ksize - pad_before)
        lo = dsl.maximum(start, 0) if clamp_lo else start
        hi = dsl.minimum(end, size) if clamp_hi else end
        return hi - lo

    def body(idx):
        nn, cc, hh, ww = idx
        if count_include_pad:
            return total[idx] / (kh * kw)
        cnt = count(hh, sh, pt, h, kh, oshape[2]) * count(ww, sw, pl, w, kw, oshape[3])
        return total[idx] / cnt

    return compute(oshape, body, name=op, names="nchw")


def global_avg_pool2d(x: Tensor) -> Tensor:
    """The mean of ``x`` (N, C, H, W) over H and W, kept as (N, C, 1, 1) like TVM.

    Computed as a sum (``global_avg_pool2d_sum``) followed by a division by H*W.
    """
    op = "global_avg_pool2d"
    check_tensor(op, x, "input", ndim=4)
    n, c, h, w = x.shape
    if h * w == 0:
        raise UserError(f"{op}: input {x.name} has an empty spatial extent {list(x.shape)}")
    (ry, rx), axes = reduce_axes((h, w), ("ry", "rx"))
    total = compute((n, c, 1, 1), lambda idx: reduce("sum", x[idx[0], idx[1], ry, rx], axes),
                    name=op + "_sum", names="nchw")
    return compute((n, c, 1, 1), lambda idx: total[idx] / (h * w), name=op, names="nchw")


def global_max_pool2d(x: Tensor, ties: str = "first") -> Tensor:
    """The maximum of ``x`` (N, C, H, W) over H and W, kept as (N, C, 1, 1) like TVM.

    ``ties`` as for :func:`max_pool2d`: the gradient goes to the first maximum (``"first"``,
    as PyTorch's ``adaptive_max_pool2d``) or is split among them (``"split"``)."""
    op = "global_max_pool2d"
    check_tensor(op, x, "input", ndim=4)
    n, c, h, w = x.shape
    if h * w == 0:
        raise UserError(f"{op}: input {x.name} has an empty spatial extent {list(x.shape)}")
    if ties not in ("first", "split"):
        raise UserError(f"{op}: ties must be 'first' or 'split', got {ties!r}")
    (ry, rx), axes = reduce_axes((h, w), ("ry", "rx"))
    if ties == "split":
        return compute((n, c, 1, 1), lambda idx: reduce("max", x[idx[0], idx[1], ry, rx], axes),
                       name=op, names="nchw")
    mx = compute((n, c, 1, 1), lambda idx: reduce("max", x[idx[0], idx[1], ry, rx], axes),
                 name=op + "_max", names="nchw")
    return _read_at_first(op, x, mx, (n, c, 1, 1), (h, w), (ry, rx), axes, (1, 1), (0, 0, 0, 0), (1, 1))
