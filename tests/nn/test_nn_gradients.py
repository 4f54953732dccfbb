"""Gradients of every te_grad.nn operator, in float64.

For each operator and parameter case:

- the simplified gradients match central finite differences
  (:func:`te_grad.testing.check_gradients`);
- the raw VJP (``simplify=False``) and the simplified one agree to 1e-10 for
  the same head;
- where every read is quasi-affine, the simplified gradients are gathers (no
  scatter) and iterate at most ``R * iterations(forward) + |gradients| +
  4 * |output|`` times, and never more than the raw form; where a read is
  data-dependent (embedding, take, the label read of softmax_cross_entropy)
  they contain a scatter and the same bound holds.

Shapes are small: the raw form sums over the whole forward domain for every
gradient element.
"""
import functools

import numpy as np
import pytest

import te_grad as tg
from te_grad import nn
from te_grad.graph import topo_order
from te_grad.ir import ScatterOp
from te_grad.testing import check_gradients

F64 = "float64"
#: forward iterations allowed per read of the simplified gradients (see the module docstring)
R = 3


def ph(shape, name):
    return tg.placeholder(shape, dtype=F64, name=name)


def ids(shape, name, dtype="int64"):
    return tg.placeholder(shape, dtype=dtype, name=name)


def uniform(rng, shape, low=-1.0, high=1.0):
    return rng.uniform(low, high, size=shape)


def away_from_zero(rng, shape, low=0.1, high=1.0):
    """Random values with magnitude in [low, high] and a random sign (no kink at 0)."""
    return rng.uniform(low, high, size=shape) * rng.choice([-1.0, 1.0], size=shape)


def distinct(rng, shape, gap=0.05):
    """A random permutation of evenly spaced values: no ties, no near ties (max pooling)."""
    n = int(np.prod(shape))
    return (rng.permutation(n) * gap - n * gap / 2).reshape(shape).astype(F64)


# ---------------------------------------------------------------------------
# the cases: name -> builder returning (output, float inputs, feed)
# ---------------------------------------------------------------------------

CASES = {}
OPTIONS = {}


def case(name, *, quasi_affine=True, full_limit=64, directions=2, marks=(), bound_marks=()):
    """Register a builder ``fn(rng) -> (output, inputs, feed)`` under ``name``.

    ``marks`` apply to every test of the case, ``bound_marks`` to the iteration bound only.
    """
    def deco(fn):
        assert name not in CASES, name
        CASES[name] = fn
        OPTIONS[name] = dict(quasi_affine=quasi_affine, full_limit=full_limit,
                             directions=directions, marks=tuple(marks),
                             bound_marks=tuple(bound_marks))
        return fn
    return deco


def simple(name, build, shapes, gen=uniform, **kw):
    """Register ``build(*placeholders)`` with float64 placeholders of ``shapes`` fed by ``gen``."""
    def fn(rng):
        xs = [ph(s, f"X{i}") for i, s in enumerate(shapes)]
        gens = gen if isinstance(gen, (list, tuple)) else [gen] * len(xs)
        return build(*xs), xs, {x: g(rng, x.shape) for x, g in zip(xs, gens)}
    case(name, **kw)(fn)


# ----- linear algebra ------------------------------------------------------

simple("dense", lambda x, w: nn.dense(x, w), [(3, 4), (5, 4)])
simple("dense_bias", lambda x, w, b: nn.dense(x, w, b), [(3, 4), (5, 4), (5,)])
for _ta in (False, True):
    for _tb in (False, True):
        simple(f"matmul_ta{int(_ta)}_tb{int(_tb)}",
               functools.partial(lambda a, b, ta, tb: nn.matmul(a, b, ta, tb), ta=_ta, tb=_tb),
               [(4, 3) if _ta else (3, 4), (5, 4) if _tb else (4, 5)])
simple("batch_matmul", lambda a, b: nn.batch_matmul(a, b), [(2, 3, 4), (2, 4, 3)])
simple("batch_matmul_tb", lambda a, b: nn.batch_matmul(a, b, transpose_b=True),
       [(2, 3, 4), (2, 2, 4)])
simple("batch_matmul_bcast_a", lambda a, b: nn.batch_matmul(a, b), [(1, 3, 4), (3, 4, 2)],
       directions=3)
simple("batch_matmul_bcast_b_tb", lambda a, b: nn.batch_matmul(a, b, transpose_b=True),
       [(3, 2, 4), (1, 3, 4)])

# ----- convolutions --------------------------------------------------------

CONV = {
    # name: (x shape, w shape, kwargs)
    "basic": ((1, 2, 5, 5), (3, 2, 3, 3), {}),
    "stride2": ((1, 2, 6, 6), (2, 2, 3, 3), dict(stride=2)),
    "pad1": ((1, 2, 4, 4), (2, 2, 3, 3), dict(padding=1)),
    "pad_asym": ((1, 1, 5, 4), (2, 1, 3, 2), dict(padding=(1, 0, 2, 1))),
    "pad_pair": ((1, 1, 4, 5), (2, 1, 3, 3), dict(padding=(0, 2))),
    "dilation2": ((1, 2, 6, 6), (2, 2, 2, 2), dict(dilation=2)),
    "stride2_pad1_dil2": ((2, 1, 6, 6), (2, 1, 3, 3), dict(stride=2, padding=1, dilation=2)),
    "stride_1x2_dil_2x1": ((1, 2, 5, 6), (2, 2, 2, 3), dict(stride=(1, 2), dilation=(2, 1))),
    "groups2": ((1, 4, 4, 4), (4, 2, 2, 2), dict(groups=2)),
    "groups2_stride2_pad1": ((1, 4, 5, 5), (2, 2, 3, 3), dict(groups=2, stride=2, padding=1)),
    "depthwise": ((1, 3, 4, 4), (3, 1, 3, 3), dict(groups=3, padding=1)),
    "depthwise_mult2": ((1, 2, 5, 5), (4, 1, 2, 2), dict(groups=2, stride=2)),
    "bias": ((1, 2, 4, 4), (3, 2, 2, 2), dict(bias=True)),
    "bias_groups2_pad1": ((2, 2, 3, 3), (4, 1, 3, 3), dict(groups=2, padding=1, bias=True)),
    "kernel1x1": ((2, 3, 3, 3), (2, 3, 1, 1), {}),
    "kernel1x1_one_channel_stride2": ((1, 1, 5, 5), (2, 1, 1, 1), dict(stride=2)),
    "stride3_dil2_pad_asym": ((1, 1, 8, 7), (1, 1, 2, 3), dict(stride=3, dilation=2,
                                                                padding=(2, 1, 0, 3))),
    "kernel_larger_than_stride_gaps": ((1, 1, 7, 7), (1, 1, 2, 2), dict(stride=3)),
    "pad_beyond_kernel": ((1, 1, 3, 3), (1, 1, 2, 2), dict(padding=2)),
}


def _conv_case(fn, xs, ws, kw):
    kw = dict(kw)
    use_bias = kw.pop("bias", False)

    def build(rng):
        x, w = ph(xs, "x"), ph(ws, "w")
        inputs = [x, w]
        b = None
        if use_bias:
            b = ph((ws[0] if fn is nn.conv2d else ws[1] * kw.get("groups", 1),), "b")
            inputs.append(b)
        out = fn(x, w, bias=b, **kw)
        return out, inputs, {t: uniform(rng, t.shape) for t in inputs}
    return build


for _name, (_xs, _ws, _kw) in CONV.items():
    case(f"conv2d_{_name}", directions=3)(_conv_case(nn.conv2d, _xs, _ws, _kw))

CONV_T = {
    # x is (N, C_in, H, W); w is (C_in, C_out/groups, KH, KW)
    "basic": ((1, 2, 3, 3), (2, 2, 2, 2), {}),
    "stride2": ((1, 2, 3, 3), (2, 1, 3, 3), dict(stride=2)),
    "pad1": ((1, 1, 4, 4), (1, 2, 3, 3), dict(padding=1)),
    "stride2_pad1": ((1, 2, 3, 3), (2, 2, 3, 3), dict(stride=2, padding=1)),
    "stride2_pad1_outpad1": ((1, 1, 3, 3), (1, 2, 3, 3),
                             dict(stride=2, padding=1, output_padding=1)),
    "stride_2x1_outpad_1x0": ((1, 1, 3, 3), (1, 2, 2, 3),
                              dict(stride=(2, 1), output_padding=(1, 0))),
    "pad_asym": ((1, 1, 4, 3), (1, 2, 3, 3), dict(padding=(1, 0, 0, 2))),
    "dilation2": ((1, 1, 3, 3), (1, 2, 2, 2), dict(dilation=2)),
    "groups2": ((1, 2, 3, 3), (2, 2, 2, 2), dict(groups=2, stride=2)),
    "bias": ((1, 2, 3, 3), (2, 3, 2, 2), dict(bias=True, stride=2, padding=1)),
    "depthwise": ((1, 2, 3, 3), (2, 1, 3, 3), dict(groups=2, stride=2, padding=1)),
    "stride3_dil2_outpad2": ((1, 1, 2, 3), (1, 1, 2, 2),
                             dict(stride=3, dilation=2, output_padding=2)),
    "outpad_below_dilation": ((1, 1, 3, 3), (1, 1, 2, 2), dict(dilation=2, output_padding=1)),
    "kernel1x1_stride2": ((1, 2, 3, 3), (2, 1, 1, 1), dict(stride=2)),
    "pad_asym_stride2_groups2": ((2, 2, 3, 2), (2, 2, 3, 2),
                                 dict(stride=2, padding=(0, 1, 2, 0), groups=2)),
}
for _name, (_xs, _ws, _kw) in CONV_T.items():
    case(f"conv2d_transpose_{_name}", directions=3)(
        _conv_case(nn.conv2d_transpose, _xs, _ws, _kw))

# ----- pooling -------------------------------------------------------------

MAX_POOL = {
    "k2": ((1, 2, 4, 4), dict(kernel=2)),
    "k3_s2": ((1, 1, 7, 7), dict(kernel=3, stride=2)),
    "k3_s1_pad1": ((1, 2, 4, 4), dict(kernel=3, stride=1, padding=1)),
    "k2_s1": ((2, 1, 4, 4), dict(kernel=2, stride=1)),
    "k2_dil2": ((1, 1, 5, 5), dict(kernel=2, stride=1, dilation=2)),
    "k3_s2_pad1_dil2": ((1, 1, 7, 7), dict(kernel=3, stride=2, padding=1, dilation=2)),
    "k_2x3_pad_asym": ((1, 1, 5, 6), dict(kernel=(2, 3), stride=(1, 2), padding=(1, 0, 0, 1))),
    "k2_s3_gaps": ((1, 2, 7, 7), dict(kernel=2, stride=3)),
    "k1": ((1, 2, 3, 3), dict(kernel=1)),
    "k_1x3_pad_0x1_dil_1x2": ((1, 1, 3, 7), dict(kernel=(1, 3), stride=1, padding=(0, 1),
                                                 dilation=(1, 2))),
}
for _name, (_shape, _kw) in MAX_POOL.items():
    # the first maximum of a window (PyTorch's rule) is read at a data-dependent position
    simple(f"max_pool2d_{_name}", functools.partial(nn.max_pool2d, **_kw), [_shape],
           gen=distinct, directions=3, quasi_affine=False)
    simple(f"max_pool2d_split_{_name}", functools.partial(nn.max_pool2d, ties="split", **_kw), [_shape],
           gen=distinct, directions=3)

AVG_POOL = {
    "k2": ((1, 2, 4, 4), dict(kernel=2)),
    "k3_s2": ((1, 1, 7, 7), dict(kernel=3, stride=2)),
    "k3_s1_pad1": ((1, 2, 4, 4), dict(kernel=3, stride=1, padding=1)),
    "k3_s1_pad1_exclude_pad": ((1, 2, 4, 4),
                               dict(kernel=3, stride=1, padding=1, count_include_pad=False)),
    "k2_s1_pad_asym_exclude": ((1, 1, 5, 5), dict(kernel=2, stride=1, padding=(1, 0, 0, 1),
                                                  count_include_pad=False)),
    "k_2x3_s_2x1": ((2, 1, 4, 5), dict(kernel=(2, 3), stride=(2, 1))),
    "k2_s3_gaps": ((1, 2, 7, 7), dict(kernel=2, stride=3)),
    "k3_s2_pad1_exclude_pad": ((1, 1, 6, 6),
                               dict(kernel=3, stride=2, padding=1, count_include_pad=False)),
    "k1": ((1, 2, 3, 3), dict(kernel=1)),
}
for _name, (_shape, _kw) in AVG_POOL.items():
    simple(f"avg_pool2d_{_name}", functools.partial(nn.avg_pool2d, **_kw), [_shape], directions=3)

simple("global_avg_pool2d", nn.global_avg_pool2d, [(2, 3, 3, 4)], directions=3)
simple("global_max_pool2d", nn.global_max_pool2d, [(2, 3, 3, 4)], gen=distinct, directions=3,
       quasi_affine=False)
simple("global_max_pool2d_split", functools.partial(nn.global_max_pool2d, ties="split"), [(2, 3, 3, 4)],
       gen=distinct, directions=3)

# ----- activations ---------------------------------------------------------

simple("relu", nn.relu, [(3, 4)], gen=away_from_zero)
simple("leaky_relu", functools.partial(nn.leaky_relu, alpha=0.2), [(3, 4)], gen=away_from_zero)
simple("sigmoid", nn.sigmoid, [(2, 3, 2)], gen=functools.partial(uniform, low=-3, high=3))
simple("tanh", nn.tanh, [(3, 4)], gen=functools.partial(uniform, low=-2, high=2))
simple("gelu", nn.gelu, [(3, 4)], gen=functools.partial(uniform, low=-3, high=3))
for _axis in (0, 1, -1):
    simple(f"softmax_axis{_axis}", functools.partial(nn.softmax, axis=_axis), [(2, 3, 4)],
           gen=functools.partial(uniform, low=-2, high=2))
    simple(f"log_softmax_axis{_axis}", functools.partial(nn.log_softmax, axis=_axis), [(2, 3, 4)],
           gen=functools.partial(uniform, low=-2, high=2))
simple("softmax_1d", nn.softmax, [(5,)])
simple("softmax_size1_axis", functools.partial(nn.softmax, axis=1), [(3, 1, 2)])
simple("log_softmax_size1_axis", functools.partial(nn.log_softmax, axis=0), [(1, 4)])
simple("log_softmax_2d_axis0", functools.partial(nn.log_softmax, axis=0), [(4, 3)])

# ----- normalization -------------------------------------------------------

simple("layer_norm", nn.layer_norm, [(3, 5)])
simple("layer_norm_gamma", lambda x, g: nn.layer_norm(x, g), [(3, 5), (5,)])
simple("layer_norm_beta", lambda x, b: nn.layer_norm(x, beta=b), [(3, 5), (5,)])
simple("layer_norm_gamma_beta", lambda x, g, b: nn.layer_norm(x, g, b), [(3, 5), (5,), (5,)])
simple("layer_norm_2_axes", lambda x, g, b: nn.layer_norm(x, g, b, axis=(-2, -1)),
       [(2, 3, 4), (3, 4), (3, 4)])
simple("layer_norm_3_axes", lambda x: nn.layer_norm(x, axis=(1, 2, 3)), [(2, 2, 2, 3)],
       directions=3)
simple("layer_norm_1d", nn.layer_norm, [(6,)])
simple("batch_norm_2d", nn.batch_norm, [(4, 3)])
simple("batch_norm_5d", nn.batch_norm, [(2, 2, 2, 1, 3)])
simple("batch_norm_2d_affine", lambda x, g, b: nn.batch_norm(x, g, b), [(4, 3), (3,), (3,)])
simple("batch_norm_3d", lambda x, g: nn.batch_norm(x, g), [(2, 3, 4), (3,)])
simple("batch_norm_4d", nn.batch_norm, [(2, 2, 3, 3)], directions=3)
simple("batch_norm_4d_affine", lambda x, g, b: nn.batch_norm(x, g, b), [(2, 3, 2, 2), (3,), (3,)])

# ----- layout --------------------------------------------------------------

simple("flatten", nn.flatten, [(2, 3, 2, 2)])
simple("flatten_1d", nn.flatten, [(5,)])
simple("reshape_merge", lambda x: nn.reshape(x, (6, 4)), [(2, 3, 4)])
simple("reshape_split", lambda x: nn.reshape(x, (2, 3, 2)), [(3, 4)])
simple("reshape_rank_change_neg1", lambda x: nn.reshape(x, (4, -1)), [(2, 3, 4)])
simple("reshape_mixed", lambda x: nn.reshape(x, (3, -1, 2)), [(4, 3, 2)])
simple("reshape_to_1d", lambda x: nn.reshape(x, -1), [(3, 2, 2)])
simple("reshape_unit_dims", lambda x: nn.reshape(x, (2, 1, 3)), [(1, 6, 1)])
simple("reshape_no_common_factor", lambda x: nn.reshape(x, (2, 6)), [(3, 4)])
simple("reshape_to_0d", lambda x: nn.reshape(x, ()), [(1, 1)])
simple("transpose_2d", nn.transpose, [(3, 4)])
simple("transpose_reverse_3d", nn.transpose, [(2, 3, 4)])
simple("transpose_perm", lambda x: nn.transpose(x, (1, 2, 0)), [(2, 3, 4)])
simple("transpose_neg_axes", lambda x: nn.transpose(x, (0, -1, 1, 2)), [(2, 2, 3, 2)])
simple("concat_axis0", lambda a, b: nn.concat([a, b], axis=0), [(2, 3), (3, 3)])
simple("concat_axis1_three", lambda a, b, c: nn.concat([a, b, c], axis=1),
       [(2, 1, 3), (2, 3, 3), (2, 2, 3)])
simple("concat_axis_neg1", lambda a, b: nn.concat([a, b], axis=-1), [(2, 3, 2), (2, 3, 3)])
simple("concat_same_input_twice", lambda a: nn.concat([a, a], axis=0), [(2, 3)])
simple("concat_with_empty", lambda a, b, c: nn.concat([a, b, c], axis=1), [(2, 2), (2, 0), (2, 3)])
simple("concat_single", lambda a: nn.concat([a], axis=1), [(2, 3)])
for _part in range(3):
    simple(f"split_sections3_part{_part}",
           functools.partial(lambda x, p: nn.split(x, 3, axis=1)[p], p=_part), [(2, 6)])
    simple(f"split_indices_part{_part}",
           functools.partial(lambda x, p: nn.split(x, [1, 3], axis=0)[p], p=_part), [(5, 2)])
simple("pad_all", lambda x: nn.pad(x, 1), [(2, 3)])
simple("pad_per_axis", lambda x: nn.pad(x, [(0, 1), (2, 0), (1, 1)], value=0.5), [(2, 2, 3)])
simple("pad_pair", lambda x: nn.pad(x, (1, 2)), [(3, 2)])
simple("pad_nothing_on_one_axis", lambda x: nn.pad(x, [(0, 0), (3, 1)]), [(2, 2)])
simple("strided_slice_step2", lambda x: nn.strided_slice(x, [0, 1], [4, 5], [2, 2]), [(4, 5)])
simple("strided_slice_partial_axes", lambda x: nn.strided_slice(x, [1], [3]), [(4, 3, 2)])
simple("strided_slice_neg_stride", lambda x: nn.strided_slice(x, [-1, 4], [None, 0], [-1, -2]),
       [(3, 5)])
simple("strided_slice_neg_stride3_clipped",
       lambda x: nn.strided_slice(x, [10, None], [-10, None], [-3, -1]), [(7, 2)])
simple("strided_slice_step3_out_of_range", lambda x: nn.strided_slice(x, [1], [100], [3]), [(8, 2)])
simple("strided_slice_neg_begin_end", lambda x: nn.strided_slice(x, [-3, -1], [-1, -5], [1, -3]),
       [(4, 6)])

# ----- broadcast arithmetic ------------------------------------------------

BINARY = {
    # name: (fn, generator of the first operand, of the second)
    "add": (nn.add, uniform, uniform),
    "subtract": (nn.subtract, uniform, uniform),
    "multiply": (nn.multiply, uniform, uniform),
    "divide": (nn.divide, uniform, functools.partial(away_from_zero, low=0.5, high=2.0)),
    "maximum": (nn.maximum, uniform, uniform),
    "minimum": (nn.minimum, uniform, uniform),
    "power": (nn.power, functools.partial(uniform, low=0.5, high=2.0),
              functools.partial(uniform, low=-1.5, high=2.0)),
}
BROADCASTS = {
    "same": ((3, 4), (3, 4)),
    "rank": ((2, 3, 4), (3, 4)),
    "both": ((3, 1, 4), (2, 1)),
    "vs_scalar_tensor": ((), (2, 3)),
}
for _op, (_fn, _ga, _gb) in BINARY.items():
    for _bname, _shapes in BROADCASTS.items():
        simple(f"{_op}_{_bname}", _fn, list(_shapes), gen=[_ga, _gb])
    simple(f"{_op}_python_number", functools.partial(lambda x, f: f(x, 1.5), f=_fn), [(2, 3)],
           gen=_ga)
simple("power_number_base", lambda x: nn.power(2.0, x), [(2, 3)])
simple("bias_add_nchw", lambda x, b: nn.bias_add(x, b), [(2, 3, 2, 2), (3,)])
simple("bias_add_last_axis", lambda x, b: nn.bias_add(x, b, axis=-1), [(3, 4), (4,)])
simple("bias_add_axis0", lambda x, b: nn.bias_add(x, b, axis=0), [(3, 2, 2), (3,)])
simple("add_same_tensor_twice", lambda a: nn.add(a, a), [(2, 3)])
simple("multiply_0d_0d", nn.multiply, [(), ()])
simple("power_scalar_exponent_vs_matrix", nn.power, [(2, 3), (1, 1)],
       gen=[functools.partial(uniform, low=0.5, high=2.0), uniform])

# ----- reductions over axes and array operations -----------------------------
simple("sum_axis1", functools.partial(nn.sum, axis=1), [(3, 4, 2)])
simple("sum_all_keepdims", functools.partial(nn.sum, keepdims=True), [(3, 4)])
simple("mean_axes_0_2", functools.partial(nn.mean, axis=(0, 2)), [(3, 4, 2)])
simple("variance_last", functools.partial(nn.variance, axis=-1), [(3, 5)])
simple("variance_unbiased_keepdims", functools.partial(nn.variance, axis=0, correction=1, keepdims=True), [(4, 3)])
simple("max_axis0", functools.partial(nn.max, axis=0), [(4, 3)], gen=distinct)
simple("min_all", nn.min, [(3, 4)], gen=distinct)
for _arg in ("argmax", "argmin"):
    # the position has zero derivative: the gradient flows through the read at it
    simple(f"{_arg}_read", functools.partial(lambda x, arg: tg.compute(
        (3,), lambda i: x[i, getattr(nn, arg)(x, 1)[i]] ** 2, name=f"{arg}_read"), arg=_arg),
        [(3, 5)], gen=distinct, quasi_affine=False)
simple("clip_both", functools.partial(nn.clip, lo=-0.4, hi=0.3), [(3, 5)], gen=distinct)
simple("clip_lower", functools.partial(nn.clip, lo=0.1), [(4,)], gen=distinct)
simple("stack_axis1", lambda a, b: nn.stack([a, b, a], axis=1), [(2, 3), (2, 3)])
simple("expand_dims_middle", functools.partial(nn.expand_dims, axis=1), [(2, 3)])
simple("squeeze_all", nn.squeeze, [(2, 1, 3, 1)])
simple("cumsum_axis1", functools.partial(nn.cumsum, axis=1), [(2, 5)])
simple("cross_entropy_soft_targets", lambda z, t: nn.cross_entropy(z, nn.softmax(t)), [(3, 4), (3, 4)])


@case("where_broadcast")
def _where(rng):
    a, b = ph((3, 4), "a"), ph((1, 4), "b")
    c = tg.placeholder((3, 4), dtype="bool", name="c")
    return nn.where(c, a, b), [a, b], {a: uniform(rng, a.shape), b: uniform(rng, b.shape),
                                       c: rng.integers(0, 2, (3, 4)).astype(bool)}


@case("one_hot_weights")  # the ids only select: no data-dependent index
def _one_hot(rng):
    w, i = ph((3, 5), "w"), ids((3,), "ids")
    oh = nn.one_hot(i, 5, dtype="float64")
    return nn.sum(nn.multiply(oh, w), axis=1), [w], {w: uniform(rng, w.shape), i: np.array([4, 0, 2])}


@case("gather_nd_rows", quasi_affine=False)
def _gather_nd(rng):
    x, i = ph((4, 3, 2), "x"), ids((5, 2), "idx")
    return nn.gather_nd(x, i), [x], {x: uniform(rng, x.shape),
                                     i: np.array([[0, 1], [3, 2], [0, 1], [2, 0], [1, 1]])}


@case("arange_scaled")
def _arange(rng):
    x = ph((5,), "x")
    r = nn.arange(5, dtype="float64")
    return nn.multiply(x, r), [x], {x: uniform(rng, x.shape)}


simple("batch_matmul_transpose_a", functools.partial(nn.batch_matmul, transpose_a=True), [(2, 4, 3), (2, 4, 5)])


# ----- gathers (data-dependent reads: no iteration bound) -----------------


def _rowptr():  # CSR segments of 7 rows: sizes 2, 0, 4, 1 (an empty one included)
    return np.array([0, 2, 2, 6, 7])


@case("segment_sum", quasi_affine=False)
def _segment_sum(rng):
    x, r = ph((7, 3), "x"), ids((5,), "rowptr")
    return nn.segment_sum(x, r), [x], {x: uniform(rng, x.shape), r: _rowptr()}


@case("segment_max", quasi_affine=False)
def _segment_max(rng):
    x, r = ph((7, 3), "x"), ids((5,), "rowptr")
    return nn.segment_max(x, r), [x], {x: distinct(rng, x.shape), r: _rowptr()}


@case("segment_softmax", quasi_affine=False)
def _segment_softmax(rng):
    s, r = ph((7, 2), "scores"), ids((5,), "rowptr")
    return nn.segment_softmax(s, r), [s], {s: uniform(rng, s.shape), r: _rowptr()}


@case("embedding", quasi_affine=False)
def _embedding(rng):
    table, i = ph((5, 3), "table"), ids((2, 3), "ids")
    return nn.embedding(table, i), [table], {table: uniform(rng, table.shape),
                                            i: np.array([[0, 2, 2], [4, 0, 2]])}


@case("embedding_1d_ids_int32", quasi_affine=False)
def _embedding_1d(rng):
    table, i = ph((4, 2), "table"), ids((6,), "ids", "int32")
    return nn.embedding(table, i), [table], {table: uniform(rng, table.shape),
                                            i: np.array([3, 1, 3, 3, 0, 1], dtype=np.int32)}


@case("embedding_0d_id", quasi_affine=False)
def _embedding_0d(rng):
    table, i = ph((3, 4), "table"), ids((), "ids")
    return nn.embedding(table, i), [table], {table: uniform(rng, table.shape), i: np.array(2)}


@case("take_0d_index", quasi_affine=False)
def _take_0d(rng):
    x, i = ph((3, 4), "x"), ids((), "indices")
    return nn.take(x, i, axis=1), [x], {x: uniform(rng, x.shape), i: np.array(1)}


@case("take_axis0", quasi_affine=False)
def _take0(rng):
    x, i = ph((4, 3), "x"), ids((5,), "indices")
    return nn.take(x, i), [x], {x: uniform(rng, x.shape), i: np.array([1, 3, 1, 0, 1])}


@case("take_axis1_2d_indices", quasi_affine=False)
def _take1(rng):
    x, i = ph((2, 4, 3), "x"), ids((2, 2), "indices")
    return nn.take(x, i, axis=1), [x], {x: uniform(rng, x.shape), i: np.array([[3, 0], [3, 3]])}


@case("take_last_axis", quasi_affine=False)
def _take_last(rng):
    x, i = ph((3, 4), "x"), ids((3,), "indices")
    return nn.take(x, i, axis=-1), [x], {x: uniform(rng, x.shape), i: np.array([2, 2, 0])}


@case("embedding_then_multiply", quasi_affine=False)
def _embedding_then_multiply(rng):
    table, i = ph((5, 3), "table"), ids((4,), "ids")
    return (nn.multiply(nn.embedding(table, i), 2.0), [table],
            {table: uniform(rng, table.shape), i: np.array([1, 4, 1, 0])})


@case("relu_of_take", quasi_affine=False)
def _relu_of_take(rng):
    x, i = ph((4, 5), "x"), ids((4,), "indices")
    return (nn.relu(nn.take(x, i, axis=1)), [x],
            {x: away_from_zero(rng, x.shape), i: np.array([3, 0, 3, 2])})


@case("take_of_sigmoid", quasi_affine=False)
def _take_of_sigmoid(rng):
    x, i = ph((3, 5), "x"), ids((4,), "indices")
    return (nn.take(nn.sigmoid(x), i, axis=1), [x],
            {x: uniform(rng, x.shape), i: np.array([3, 0, 3, 2])})


# ----- losses --------------------------------------------------------------

simple("mse_loss", nn.mse_loss, [(3, 4), (3, 4)])
simple("mse_loss_3d", nn.mse_loss, [(2, 2, 3), (2, 2, 3)])
simple("binary_cross_entropy", nn.binary_cross_entropy, [(3, 4), (3, 4)],
       gen=[functools.partial(uniform, low=0.1, high=0.9),
            functools.partial(uniform, low=0.0, high=1.0)])
simple("binary_cross_entropy_1d", nn.binary_cross_entropy, [(5,), (5,)],
       gen=[functools.partial(uniform, low=0.05, high=0.95),
            lambda rng, s: rng.integers(0, 2, size=s).astype(F64)])


@case("softmax_cross_entropy", quasi_affine=False)
def _sce(rng):
    logits, labels = ph((4, 3), "logits"), ids((4,), "labels")
    return (nn.softmax_cross_entropy(logits, labels), [logits],
            {logits: uniform(rng, logits.shape, -2, 2), labels: np.array([2, 0, 2, 2])})


@case("softmax_cross_entropy_int32", quasi_affine=False)
def _sce32(rng):
    logits, labels = ph((3, 5), "logits"), ids((3,), "labels", "int32")
    return (nn.softmax_cross_entropy(logits, labels), [logits],
            {logits: uniform(rng, logits.shape, -2, 2),
             labels: np.array([4, 4, 1], dtype=np.int32)})


# ----- small networks: several ops chained -------------------------------


def _cnn(rng, loss):
    x, w, b = ph((2, 1, 5, 5), "x"), ph((2, 1, 3, 3), "w"), ph((2,), "b")
    fc, fb = ph((3, 8), "fc"), ph((3,), "fb")
    h = nn.conv2d(x, w, padding=1, bias=b)
    h = nn.max_pool2d(nn.gelu(h), 2)
    logits = nn.dense(nn.flatten(h), fc, fb)
    params = [x, w, b, fc, fb]
    feed = {t: uniform(rng, t.shape) for t in params}
    if loss == "mse":
        target = ph((2, 3), "target")
        feed[target] = uniform(rng, target.shape)
        return nn.mse_loss(nn.log_softmax(logits), target), params, feed
    labels = ids((2,), "labels")
    feed[labels] = np.array([2, 2])
    return nn.softmax_cross_entropy(logits, labels), params, feed


case("network_cnn_mse", quasi_affine=False, directions=3)(functools.partial(_cnn, loss="mse"))  # max pool: first max
case("network_cnn_cross_entropy", quasi_affine=False, directions=3)(
    functools.partial(_cnn, loss="ce"))


@case("network_attention", directions=3)
def _attention(rng):
    """softmax(q k^T) v with layer norm and a residual."""
    x, wq, wk, wv = ph((2, 3, 4), "x"), ph((4, 4), "wq"), ph((4, 4), "wk"), ph((4, 4), "wv")
    flat = nn.reshape(x, (6, 4))
    q, k, v = (nn.reshape(nn.dense(flat, w_), (2, 3, 4)) for w_ in (wq, wk, wv))
    att = nn.softmax(nn.multiply(nn.batch_matmul(q, k, transpose_b=True), 0.5), axis=-1)
    out = nn.add(x, nn.batch_matmul(att, v))
    inputs = [x, wq, wk, wv]
    return nn.layer_norm(out), inputs, {t: uniform(rng, t.shape) for t in inputs}


@case("network_embedding_bag", quasi_affine=False)
def _embedding_bag(rng):
    """Mean of embedded tokens, a dense layer and a sigmoid."""
    table, w, tok = ph((5, 3), "table"), ph((2, 3), "w"), ids((2, 4), "tokens")
    e = nn.embedding(table, tok)
    pooled = nn.avg_pool2d(nn.reshape(e, (1, 2, 4, 3)), kernel=(4, 1))
    out = nn.sigmoid(nn.dense(nn.reshape(pooled, (2, 3)), w))
    return out, [table, w], {table: uniform(rng, table.shape), w: uniform(rng, w.shape),
                             tok: np.array([[1, 1, 4, 0], [4, 4, 4, 2]])}


# ----- ops of imported PyTorch models ---------------------------------------

simple("gelu_tanh", functools.partial(nn.gelu, approximate="tanh"), [(3, 4)],
       gen=functools.partial(uniform, low=-3, high=3))
simple("silu", nn.silu, [(3, 4)], gen=functools.partial(uniform, low=-3, high=3))
simple("swiglu", nn.swiglu, [(2, 3, 2), (2, 3, 2)], gen=functools.partial(uniform, low=-3, high=3))
simple("rms_norm", nn.rms_norm, [(3, 5)])
simple("rms_norm_weight_eps", lambda x, w: nn.rms_norm(x, w, eps=0.1), [(3, 5), (5,)])
simple("rms_norm_2_axes", lambda x, w: nn.rms_norm(x, w, axis=(-2, -1)), [(2, 3, 4), (3, 4)])
CONV1D = {
    "basic": ((2, 2, 6), (3, 2, 3), {}),
    "stride2_pad1_dil2_groups2": ((1, 4, 9), (2, 2, 3), dict(stride=2, padding=1, dilation=2, groups=2)),
    "same_even_kernel": ((1, 2, 5), (2, 2, 4), dict(padding="same")),
    "bias_depthwise": ((2, 3, 5), (3, 1, 2), dict(groups=3, bias=True)),
}
for _name, (_xs, _ws, _kw) in CONV1D.items():
    _kw = dict(_kw)
    if _kw.pop("bias", False):
        simple(f"conv1d_{_name}", functools.partial(lambda x, w, b, kw: nn.conv1d(x, w, b, **kw), kw=_kw),
               [_xs, _ws, (_ws[0],)])
    else:
        simple(f"conv1d_{_name}", functools.partial(lambda x, w, kw: nn.conv1d(x, w, **kw), kw=_kw), [_xs, _ws])
for _part in range(3):
    simple(f"chunk_uneven_part{_part}", functools.partial(lambda x, p: nn.chunk(x, 3, axis=1)[p], p=_part),
           [(2, 7)])
    simple(f"split_sizes_part{_part}", functools.partial(lambda x, p: nn.split(x, sizes=[2, 1, 2], axis=0)[p],
                                                         p=_part), [(5, 2)])
simple("scaled_dot_product_attention_3d", nn.scaled_dot_product_attention, [(2, 3, 4), (2, 5, 4), (2, 5, 2)],
       directions=3)
simple("scaled_dot_product_attention_4d_causal",
       lambda q, k, v: nn.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.7),
       [(1, 2, 4, 3), (1, 2, 4, 3), (1, 2, 4, 2)], directions=3)
simple("scaled_dot_product_attention_float_mask",
       lambda q, k, v, m: nn.scaled_dot_product_attention(q, k, v, attn_mask=m),
       [(2, 3, 4), (2, 4, 4), (2, 4, 3), (3, 4)], directions=3)


@case("scaled_dot_product_attention_bool_mask_fully_masked_row", directions=3)
def _sdpa_bool_mask(rng):
    """A bool mask broadcast over the batch, one query masked entirely (its output is 0)."""
    q, k, v = ph((2, 3, 4), "q"), ph((2, 4, 4), "k"), ph((2, 4, 3), "v")
    mask = tg.placeholder((3, 4), dtype="bool", name="mask")
    inputs = [q, k, v]
    feed = {t: uniform(rng, t.shape) for t in inputs}
    feed[mask] = np.array([[1, 0, 1, 1], [0, 0, 0, 0], [0, 1, 0, 0]], dtype=bool)
    return nn.scaled_dot_product_attention(q, k, v, attn_mask=mask), inputs, feed


# ---------------------------------------------------------------------------
# the checks
# ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def prepared(name):
    """The case ``name`` with a head placeholder, its raw and simplified gradients and a feed."""
    rng = np.random.default_rng(sum(map(ord, name)))
    out, inputs, feed = CASES[name](rng)
    head = tg.placeholder(out.shape, dtype=out.dtype, name="head")
    feed = dict(feed)
    feed[head] = rng.standard_normal(out.shape)
    raw = list(tg.differentiate(out, inputs, head=head, simplify=False))
    simp = list(tg.differentiate(out, inputs, head=head, simplify=True))
    return out, inputs, feed, head, raw, simp


def params(select=lambda opts: True, bound=False):
    return [pytest.param(n, id=n, marks=list(OPTIONS[n]["marks"])
                         + list(OPTIONS[n]["bound_marks"] if bound else ()))
            for n in sorted(CASES) if select(OPTIONS[n])]


def test_every_nn_operator_has_a_case():
    tested = set()
    for name in CASES:
        tested |= {op for op in nn.__all__ if name == op or name.startswith(op + "_")}
    helpers = {"broadcast_shape", "conv2d_output_shape"}
    assert set(nn.__all__) - helpers - tested == set()


@pytest.mark.parametrize("name", params())
def test_gradient_matches_finite_differences(name):
    out, inputs, feed, head, _, simp = prepared(name)
    opts = OPTIONS[name]
    feed = {t: v for t, v in feed.items() if t is not head}
    check_gradients(out, inputs, feed, grads=simp, head=head, full_limit=opts["full_limit"],
                    directions=opts["directions"], seed=len(name))


@pytest.mark.parametrize("name", params())
def test_raw_and_simplified_gradients_agree(name):
    _, inputs, feed, _, raw, simp = prepared(name)
    got_raw = tg.evaluate(raw, feed)
    got_simp = tg.evaluate(simp, feed)
    for x, r, s in zip(inputs, got_raw, got_simp):
        assert r.shape == s.shape == x.shape
        np.testing.assert_allclose(s, r, rtol=1e-10, atol=1e-12, err_msg=f"gradient of {x.name}")


def iteration_counts(name):
    """(forward, simplified gradients, raw gradients, total gradient size, output size);
    a ragged loop (CSR segments) counts as ``RAGGED`` trips per point in all three."""
    out, inputs, _, _, raw, simp = prepared(name)
    return (tg.iterations(out, ragged=RAGGED), tg.iterations(simp, ragged=RAGGED),
            tg.iterations(raw, ragged=RAGGED), sum(x.size for x in inputs), out.size)


#: the trips a ragged loop is counted as in the iteration bounds (the cases' mean segment)
RAGGED = 2


@pytest.mark.parametrize("name", params())
def test_scatter_exactly_where_a_read_is_data_dependent(name):
    """Quasi-affine reads give gathers; a data-dependent one a scatter, not a guarded gather."""
    *_, simp = prepared(name)
    scatters = [t.name for t in topo_order(simp) if isinstance(t.op, ScatterOp)]
    if OPTIONS[name]["quasi_affine"]:
        assert scatters == []
    else:
        assert scatters


def check_iteration_bound(name):
    fwd, simp, raw, grad_size, out_size = iteration_counts(name)
    bound = fwd * R + grad_size + 4 * out_size
    assert simp <= bound, (f"{name}: simplified gradients iterate {simp} times, more than "
                           f"{R} x {fwd} (forward) + {grad_size} + 4 x {out_size} = {bound}")
    assert simp <= raw, f"{name}: simplified {simp} > raw {raw}"
    if raw > 4 * fwd:
        assert simp < raw, f"{name}: raw {raw}, simplified {simp}, forward {fwd}"


@pytest.mark.parametrize("name", params(lambda opts: opts["quasi_affine"], bound=True))
def test_simplified_gradient_iteration_bound(name):
    check_iteration_bound(name)


@pytest.mark.parametrize("name", params(lambda opts: not opts["quasi_affine"], bound=True))
def test_scatter_gradient_iteration_bound(name):
    """Data-dependent reads become scatters over the forward domain: the same bound holds."""
    check_iteration_bound(name)


# ---------------------------------------------------------------------------
# several outputs, and gradients with respect to some of the inputs
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("simplify", [False, True], ids=["raw", "simplified"])
def test_split_parts_differentiated_together(simplify):
    """All parts of a split with their own heads: the gradient is the heads put back together."""
    x = ph((2, 7), "x")
    parts = nn.split(x, [2, 3, 3, 9], axis=1)
    nonempty = [p for p in parts if p.size]
    heads = [ph(p.shape, f"h{i}") for i, p in enumerate(nonempty)]
    (dx,) = tg.differentiate(nonempty, [x], head=heads, simplify=simplify)
    rng = np.random.default_rng(0)
    hv = [rng.standard_normal(h.shape) for h in heads]
    feed = {x: rng.standard_normal(x.shape), **dict(zip(heads, hv))}
    (got,) = tg.evaluate([dx], feed)
    np.testing.assert_allclose(got, np.concatenate(hv, axis=1), rtol=1e-12, atol=0)


SUBSETS = {
    "conv2d_weight_only": (lambda x, w: nn.conv2d(x, w, stride=2, padding=1),
                           [(1, 2, 5, 5), (2, 2, 3, 3)], [1]),
    "conv2d_transpose_input_only": (lambda x, w: nn.conv2d_transpose(x, w, stride=2, padding=1),
                                    [(1, 2, 3, 3), (2, 1, 3, 3)], [0]),
    "layer_norm_gamma_only": (lambda x, g, b: nn.layer_norm(x, g, b), [(3, 4), (4,), (4,)], [1]),
    "batch_norm_beta_only": (lambda x, g, b: nn.batch_norm(x, g, b), [(3, 2, 2), (2,), (2,)], [2]),
    "dense_bias_only": (lambda x, w, b: nn.dense(x, w, b), [(3, 4), (2, 4), (2,)], [2]),
}


@pytest.mark.parametrize("name", sorted(SUBSETS))
def test_gradient_with_respect_to_some_inputs(name):
    build, shapes, wrt = SUBSETS[name]
    xs = [ph(s, f"X{i}") for i, s in enumerate(shapes)]
    out = build(*xs)
    rng = np.random.default_rng(len(name))
    feed = {x: uniform(rng, x.shape) for x in xs}
    inputs = [xs[i] for i in wrt]
    check_gradients(out, inputs, feed, directions=3)
    head = ph(out.shape, "head")
    feed[head] = rng.standard_normal(out.shape)
    raw = tg.evaluate(list(tg.differentiate(out, inputs, head=head, simplify=False)), feed)
    simp_grads = list(tg.differentiate(out, inputs, head=head))
    simp = tg.evaluate(simp_grads, feed)
    for r, s_ in zip(raw, simp):
        np.testing.assert_allclose(s_, r, rtol=1e-10, atol=1e-12)
    grad_size = sum(x.size for x in inputs)
    assert tg.iterations(simp_grads) <= R * tg.iterations(out) + grad_size + 4 * out.size
