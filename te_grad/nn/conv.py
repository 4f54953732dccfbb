"""Convolutions: ``conv1d`` in NCL layout (weights OIK), ``conv2d`` in NCHW (weights OIHW) and
``conv2d_transpose``.

Padding is never materialized: the body reads the input under a quasi-affine
guard on the index variables (``tg.if_then_else(tg.all(...), x[...], 0)``), and
only the guards that can fail for the given shapes are emitted.
"""
from __future__ import annotations

from .. import dsl
from ..errors import UserError
from ..ir import Tensor
from ._util import (affine, may_reach, smallest, check_tensor, compute, floordiv, guard, int_tuple, is_int, padding4,
                    reduce, reduce_axes, tap)
from .elementwise import bias_add

__all__ = ["conv1d", "conv2d", "conv2d_transpose", "conv2d_output_shape"]


def _at_min(h, w) -> str:
    """Where a spatial size is a size expression, the note that it was checked at its min."""
    if is_int(h) and is_int(w):
        return ""
    return f" at the smallest sizes (each tg.var at its min: input {smallest(h)} x {smallest(w)}); declare a larger min"


def _groups(op: str, groups) -> int:
    if not is_int(groups) or groups < 1:
        raise UserError(f"{op}: groups must be a positive int, got {groups!r}")
    return int(groups)


def conv2d_output_shape(in_hw, kernel_hw, stride, padding, dilation):
    """Output (H, W) of a convolution or pooling window; padding is (top, left, bottom, right)."""
    (h, w), (kh, kw), (sh, sw), (dh, dw) = in_hw, kernel_hw, stride, dilation
    pt, pl, pb, pr = padding
    if not (is_int(h) and is_int(w)):  # size expressions: one constant offset each (h + 2 - 3 + 1 is h)
        return tuple(_window_extent(x, p0 + p1 - d * (k - 1) - 1, s)
                     for x, p0, p1, d, k, s in ((h, pt, pb, dh, kh, sh), (w, pl, pr, dw, kw, sw)))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    return oh, ow


def _window_extent(x, offset: int, stride: int):
    """``(x + offset) // stride + 1`` with as few nodes as the ints allow."""
    if stride == 1:
        return affine(x, 1, offset + 1) if not is_int(x) else x + offset + 1
    return affine(x, 1, offset) // stride + 1


def conv2d(x: Tensor, w: Tensor, stride=1, padding=0, dilation=1, groups: int = 1,
           bias: Tensor = None) -> Tensor:
    """A 2-D cross-correlation (PyTorch's ``conv2d``) in NCHW layout with OIHW weights.

    ``x`` is (N, C, H, W) and ``w`` is (O, C/groups, KH, KW); the result is
    (N, O, OH, OW) with ``OH = (H + pad_top + pad_bottom - dilation_h*(KH-1) - 1) // stride_h + 1``
    (likewise OW), and ``out[n, o, h, v] = sum_{c, ry, rx} xpad[n, g*C/groups + c,
    h*stride_h + ry*dilation_h, v*stride_w + rx*dilation_w] * w[o, c, ry, rx]`` where
    ``g = o // (O/groups)`` and ``xpad`` is ``x`` zero-padded. ``stride`` and
    ``dilation`` are an int or a pair; ``padding`` is an int, (ph, pw) or
    (top, left, bottom, right). ``groups = C`` gives a depthwise convolution
    (with O a multiple of C). The optional ``bias`` (O,) is added per channel.
    """
    op = "conv2d"
    check_tensor(op, x, "input", ndim=4)
    check_tensor(op, w, "weight", ndim=4)
    sh, sw = int_tuple(op, "stride", stride, 2, minimum=1)
    dh, dw = int_tuple(op, "dilation", dilation, 2, minimum=1)
    pt, pl, pb, pr = pad = padding4(op, padding)
    groups = _groups(op, groups)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if c % groups:
        raise UserError(f"{op}: groups={groups} does not divide the {c} input channels of {x.name}")
    if o % groups:
        raise UserError(f"{op}: groups={groups} does not divide the {o} output channels of "
                        f"weight {w.name}")
    if cg != c // groups:
        raise UserError(f"{op}: channel mismatch: input {x.name} has {c} channels, so with "
                        f"groups={groups} weight {w.name} needs {c // groups} input channels per "
                        f"group, but its shape is {list(w.shape)}")
    oh, ow = conv2d_output_shape((h, wd), (kh, kw), (sh, sw), pad, (dh, dw))
    if smallest(oh) < 1 or smallest(ow) < 1:  # a size expression: at its variables' min
        raise UserError(f"{op}: the dilated kernel {[dh * (kh - 1) + 1, dw * (kw - 1) + 1]} is "
                        f"larger than the padded input {[h + pt + pb, wd + pl + pr]}{_at_min(h, wd)}")
    og = o // groups
    (rc, ry, rx), axes = reduce_axes((cg, kh, kw), ("rc", "ry", "rx"))
    # the largest row / column read, to know which guards can fail
    max_h = (oh - 1) * sh + (kh - 1) * dh - pt
    max_w = (ow - 1) * sw + (kw - 1) * dw - pl

    def body(idx):
        nn, oc, hh, ww = idx
        ih = tap(affine(hh, sh, -pt), ry, dh)
        iw = tap(affine(ww, sw, -pl), rx, dw)
        ic = rc if groups == 1 else tap(affine(floordiv(oc, og), cg), rc, 1)
        cond = guard([ih >= 0 if pt > 0 else None, ih < h if may_reach(max_h, h) else None,
                       iw >= 0 if pl > 0 else None, iw < wd if may_reach(max_w, wd) else None])
        val = x[nn, ic, ih, iw]
        if cond is not None:
            val = dsl.if_then_else(cond, val, 0.0)
        return reduce("sum", val * w[oc, rc, ry, rx], axes)

    out = compute((n, o, oh, ow), body, name=op, names="nchw")
    if bias is not None:
        check_tensor(op, bias, "bias", ndim=1)
        if bias.shape[0] != o:
            raise UserError(f"{op}: bias {bias.name} has length {bias.shape[0]} but there are "
                            f"{o} output channels")
        out = bias_add(out, bias, axis=1, name=op + "_bias")
    return out


def _padding1(op: str, padding, stride: int, dilation: int, k: int):
    """1-D padding as ``(left, right)``: an int or 1-tuple (both sides), ``"valid"`` (none) or
    ``"same"`` (stride 1 only: ``dilation * (k - 1)`` in all, the odd one on the right, as PyTorch)."""
    if isinstance(padding, str):
        if padding == "valid":
            return 0, 0
        if padding == "same":
            if stride != 1:
                raise UserError(f"{op}: padding='same' needs stride 1, got stride {stride}")
            total = dilation * (k - 1)
            return total // 2, total - total // 2
        raise UserError(f"{op}: padding must be an int, a 1-tuple, 'same' or 'valid', got {padding!r}")
    if isinstance(padding, (tuple, list)) and len(padding) == 1:
        padding = padding[0]
    if not is_int(padding) or padding < 0:
        raise UserError(f"{op}: padding must be a non-negative int, a 1-tuple, 'same' or 'valid', "
                        f"got {padding!r}")
    return int(padding), int(padding)


def conv1d(x: Tensor, w: Tensor, bias: Tensor = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """A 1-D cross-correlation (PyTorch's ``F.conv1d``, same argument order) in NCL layout.

    ``x`` is (N, C, L) and ``w`` is (O, C/groups, K); the result is (N, O, OL) with
    ``OL = (L + pad_left + pad_right - dilation*(K-1) - 1) // stride + 1`` and
    ``out[n, o, l] = sum_{c, r} xpad[n, g*C/groups + c, l*stride + r*dilation] * w[o, c, r]``
    where ``g = o // (O/groups)`` and ``xpad`` is ``x`` zero-padded (never materialized: the
    read is guarded, as in :func:`conv2d`). ``stride`` and ``dilation`` are an int or a 1-tuple;
    ``padding`` an int or a 1-tuple (both sides), ``"valid"`` (none) or ``"same"`` (stride 1;
    the output has length L, an odd total padding's extra element on the right, as PyTorch).
    The optional ``bias`` (O,) is added per channel.
    """
    op = "conv1d"
    check_tensor(op, x, "input", ndim=3)
    check_tensor(op, w, "weight", ndim=3)
    (st,) = int_tuple(op, "stride", stride, 1, minimum=1)
    (dl,) = int_tuple(op, "dilation", dilation, 1, minimum=1)
    groups = _groups(op, groups)
    n, c, length = x.shape
    o, cg, k = w.shape
    pl, pr = _padding1(op, padding, st, dl, k)
    if c % groups:
        raise UserError(f"{op}: groups={groups} does not divide the {c} input channels of {x.name}")
    if o % groups:
        raise UserError(f"{op}: groups={groups} does not divide the {o} output channels of "
                        f"weight {w.name}")
    if cg != c // groups:
        raise UserError(f"{op}: channel mismatch: input {x.name} has {c} channels, so with "
                        f"groups={groups} weight {w.name} needs {c // groups} input channels per "
                        f"group, but its shape is {list(w.shape)}")
    ol = (length + pl + pr - dl * (k - 1) - 1) // st + 1 if is_int(length) else \
        _window_extent(length, pl + pr - dl * (k - 1) - 1, st)
    if smallest(ol) < 1:
        at_min = "" if is_int(length) else f" at the smallest sizes (input length {smallest(length)})"
        raise UserError(f"{op}: the dilated kernel {dl * (k - 1) + 1} is larger than the padded input "
                        f"{length + pl + pr}{at_min}")
    og = o // groups
    (rc, rx), axes = reduce_axes((cg, k), ("rc", "rx"))
    max_l = (ol - 1) * st + (k - 1) * dl - pl  # the largest position read

    def body(idx):
        nn, oc, ll = idx
        il = tap(affine(ll, st, -pl), rx, dl)
        ic = rc if groups == 1 else tap(affine(floordiv(oc, og), cg), rc, 1)
        cond = guard([il >= 0 if pl > 0 else None, il < length if may_reach(max_l, length) else None])
        val = x[nn, ic, il]
        if cond is not None:
            val = dsl.if_then_else(cond, val, 0.0)
        return reduce("sum", val * w[oc, rc, rx], axes)

    out = compute((n, o, ol), body, name=op, names="ncl")
    if bias is not None:
        check_tensor(op, bias, "bias", ndim=1)
        if bias.shape[0] != o:
            raise UserError(f"{op}: bias {bias.name} has length {bias.shape[0]} but there are "
                            f"{o} output channels")
        out = bias_add(out, bias, axis=1, name=op + "_bias")
    return out


def conv2d_transpose(x: Tensor, w: Tensor, stride=1, padding=0, output_padding=0, dilation=1,
                     groups: int = 1, bias: Tensor = None) -> Tensor:
    """The transposed 2-D convolution (PyTorch's ``conv_transpose2d``), NCHW layout.

    ``x`` is (N, C_in, H, W) and ``w`` is (C_in, C_out/groups, KH, KW); the result
    is (N, C_out, OH, OW) with ``OH = (H-1)*stride_h - pad_top - pad_bottom +
    dilation_h*(KH-1) + output_padding_h + 1`` (likewise OW). It is the adjoint of
    ``conv2d`` with the same parameters: every input pixel ``x[n, ci, i, j]``
    spreads ``x * w[ci, co, ry, rx]`` to output row ``i*stride_h - pad_top +
    ry*dilation_h`` and column ``j*stride_w - pad_left + rx*dilation_w``. It is
    written as a gather: output ``(h, v)`` sums over the kernel taps whose source
    row ``(h + pad_top - ry*dilation_h) / stride_h`` is an integer inside the input
    (likewise for columns). ``padding`` is an int, (ph, pw) or (top, left, bottom,
    right); ``output_padding`` (an int or pair, smaller than stride or dilation)
    only enlarges the output at the bottom / right. The optional ``bias`` is (C_out,).
    """
    op = "conv2d_transpose"
    check_tensor(op, x, "input", ndim=4)
    check_tensor(op, w, "weight", ndim=4)
    sh, sw = int_tuple(op, "stride", stride, 2, minimum=1)
    dh, dw = int_tuple(op, "dilation", dilation, 2, minimum=1)
    oph, opw = int_tuple(op, "output_padding", output_padding, 2, minimum=0)
    pt, pl, pb, pr = padding4(op, padding)
    groups = _groups(op, groups)
    n, c, h, wd = x.shape
    cw, cog, kh, kw = w.shape
    if c % groups:
        raise UserError(f"{op}: groups={groups} does not divide the {c} input channels of {x.name}")
    if cw != c:
        raise UserError(f"{op}: channel mismatch: input {x.name} has {c} channels but weight "
                        f"{w.name} of shape {list(w.shape)} expects {cw} "
                        "(layout C_in, C_out/groups, KH, KW)")
    if not (oph < sh or oph < dh) or not (opw < sw or opw < dw):
        raise UserError(f"{op}: output_padding {output_padding!r} must be smaller than either "
                        f"the stride {(sh, sw)} or the dilation {(dh, dw)}")
    oh = (h - 1) * sh - pt - pb + dh * (kh - 1) + oph + 1
    ow = (wd - 1) * sw - pl - pr + dw * (kw - 1) + opw + 1
    if smallest(oh) < 1 or smallest(ow) < 1:  # a size expression: at its variables' min
        raise UserError(f"{op}: padding {padding!r} leaves an empty output ({oh}, {ow}){_at_min(h, wd)}")
    cig = c // groups
    co = cog * groups
    (rc, ry, rx), axes = reduce_axes((cig, kh, kw), ("rc", "ry", "rx"))

    def source(out_idx, pad_before, r, k, dil, stride_, size, out_size):
        """The input index feeding ``out_idx`` through tap ``r``, and when it exists."""
        num = tap(affine(out_idx, 1, pad_before), r, -dil)
        conds = []
        if stride_ > 1:
            conds.append(num % stride_ == 0)
        if pad_before - (k - 1) * dil < 0:  # smallest numerator
            conds.append(num >= 0)
        if may_reach(out_size - 1 + pad_before, size * stride_):  # largest numerator
            conds.append(num < size * stride_)
        return floordiv(num, stride_), conds

    def body(idx):
        nn, oc, hh, ww = idx
        ih, ch = source(hh, pt, ry, kh, dh, sh, h, oh)
        iw, cw_ = source(ww, pl, rx, kw, dw, sw, wd, ow)
        ic = rc if groups == 1 else tap(affine(floordiv(oc, cog), cig), rc, 1)
        occ = oc if groups == 1 else (0 if cog == 1 else oc % cog)
        cond = guard(ch + cw_)
        val = x[nn, ic, ih, iw]
        if cond is not None:
            val = dsl.if_then_else(cond, val, 0.0)
        return reduce("sum", val * w[ic, occ, ry, rx], axes)

    out = compute((n, co, oh, ow), body, name=op, names="nchw")
    if bias is not None:
        check_tensor(op, bias, "bias", ndim=1)
        if bias.shape[0] != co:
            raise UserError(f"{op}: bias {bias.name} has length {bias.shape[0]} but there are "
                            f"{co} output channels")
        out = bias_add(out, bias, axis=1, name=op + "_bias")
    return out
