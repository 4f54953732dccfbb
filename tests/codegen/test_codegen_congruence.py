"""Congruence classes in codegen: output axes entering ``// m`` and ``% m`` are split.

The input gradient of a strided convolution and the gradient of a pooling
window are scheduled per class ``j = m*a + p`` (strided stores, register
blocks included). Each kernel is compared with the reference evaluator, on
shapes that divide by the stride (split) and shapes that do not (not split).
"""
import numpy as np
import pytest

import te_grad as tg
from te_grad import nn

from test_codegen import assert_kernel_matches


def _feed(rng, tensors, dtype):
    return {t: rng.standard_normal(t.shape).astype(dtype) for t in tensors}


def _gradient_kernel(y, inputs, dtype, seed=0, **tol):
    rng = np.random.default_rng(seed)
    head = tg.placeholder(y.shape, dtype=dtype, name="head")
    grads = tg.gradient(y, inputs, head=head)
    feed = _feed(rng, inputs + [head], dtype)
    kern, _ = assert_kernel_matches(list(grads), inputs + [head], feed, **tol)
    return kern


TOL = {"float64": dict(rtol=1e-9, atol=1e-12, scaled=True), "float32": dict(rtol=1e-4, atol=1e-5, scaled=True)}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("size,stride,padding,dilation", [
    (16, 2, 1, 1), (16, 2, 0, 1), (15, 2, 1, 1), (18, 3, 1, 1), (16, 2, 2, 2), (12, 4, 0, 1)])
def test_strided_conv_gradients(dtype, size, stride, padding, dilation):
    x = tg.placeholder((2, 8, size, size), dtype=dtype, name="X")
    w = tg.placeholder((4, 8, 3, 3), dtype=dtype, name="W")
    y = nn.conv2d(x, w, stride=stride, padding=padding, dilation=dilation)
    kern = _gradient_kernel(y, [x, w], dtype, **TOL[dtype])
    if size % stride == 0:  # the input gradient is split into classes: strided stores
        assert f"[{stride} * " in kern.loops


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("size,kernel,stride", [(16, 2, 2), (15, 2, 2), (18, 3, 3), (16, 3, 2)])
def test_pooling_gradients(dtype, size, kernel, stride):
    x = tg.placeholder((2, 3, size, size), dtype=dtype, name="X")
    for y in (nn.max_pool2d(x, kernel, stride), nn.max_pool2d(x, kernel, stride, ties="split"),
              nn.avg_pool2d(x, kernel, stride)):
        _gradient_kernel(y, [x], dtype, **TOL[dtype])


def test_max_pool_gradient_stores_both_classes_in_one_loop():
    x = tg.placeholder((2, 3, 16, 16), name="X")
    kern = _gradient_kernel(nn.max_pool2d(x, 2, ties="split"), [x], "float32", **TOL["float32"])
    assert "[2 * " in kern.loops and "[2 * " in kern.loops.split("+ 1]")[0]


@pytest.mark.parametrize("m", [2, 3, 4])
def test_upsample_and_its_gradient(m):
    x = tg.placeholder((5, 6), dtype="float64", name="X")
    y = tg.compute((5 * m, 6 * m), lambda i, j: x[i // m, j // m] * (1.0 + (j % m)), name="up")
    rng = np.random.default_rng(m)
    assert_kernel_matches([y], [x], _feed(rng, [x], "float64"))
    _gradient_kernel(y, [x], "float64", seed=m)


def test_classes_with_negative_offsets_and_modulus():
    x = tg.placeholder((40,), dtype="float64", name="X")
    y = tg.compute((36,), lambda j: x[(j + 3) // 2] - x[(j - 1) % 4 + 30] * ((j + 1) % 3), name="y")
    rng = np.random.default_rng(1)
    assert_kernel_matches([y], [x], _feed(rng, [x], "float64"))
    _gradient_kernel(y, [x], "float64")


def test_bounds_linear_on_the_class_domain_are_shifted_to_constants():
    """A stride-2 convolution over a separate padding stage: once its input gradient is
    computed in the slice that reads it, each class's reduce bounds read
    ``maximum(0, a) <= i < minimum(15, a) + 1``, whose max and min the loop ranges decide:
    they are linear, the axis is shifted to start at 0, and every bound is a constant (the
    direct form ran 17x slower, its lanes on a strided axis)."""
    from codegen.loopir import Nest
    from codegen.schedule import stages_for
    from codegen.machine import Machine
    from simplify import simplify
    from te_grad.formulations import conv_pad_stage_s2
    from te_grad.ir import Const, ReduceAxis
    w = conv_pad_stage_s2("float64")
    h = tg.placeholder(w.output.shape, dtype="float64", name="h")
    dx = tg.gradient(w.output, w.inputs, head=h)[0]
    (stage,) = [s for s in stages_for(simplify([dx]), Machine(512, 32)) if s.tensor.name == dx.name]
    reduce_bounds = [b for s in stage.body for n in [Nest.of(s)] if n is not None
                     for lp in n.loops if isinstance(lp.var, ReduceAxis) for b in (lp.lo, lp.hi)]
    from codegen.loopir import loops
    reduce_bounds += [b for lp in loops(stage.body) if isinstance(lp.var, ReduceAxis) for b in (lp.lo, lp.hi)]
    assert reduce_bounds and all(isinstance(b, Const) for b in reduce_bounds)
    small = conv_pad_stage_s2("float64", small=True)
    hs = tg.placeholder(small.output.shape, dtype="float64", name="h")
    grads = tg.gradient(small.output, small.inputs, head=hs)
    rng = np.random.default_rng(4)
    feed = {t: rng.standard_normal(t.shape) for t in small.inputs + [hs]}
    got = tg.build(grads, small.inputs + [hs])(*[feed[t] for t in small.inputs + [hs]])
    for g, want in zip(got, tg.evaluate(grads, feed)):
        np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-12)
