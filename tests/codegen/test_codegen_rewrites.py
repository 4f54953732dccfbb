"""codegen's own index rewrites, checked exhaustively against the evaluator on small extents.

Congruence classes (``j = m*a + p``, with ``//`` and ``%`` folded), interior splits
(pieces of the output domain with constant reduce bounds) and scans (running
reductions) rewrite index arithmetic and iteration domains. Every combination of
the parameters below is compiled and compared, element by element, with the
reference evaluator in float64 (the fuzzer, tests/tools/test_fuzz.py, covers random
programs; these sweep the patterns the rewrites target).
"""
import itertools

import numpy as np
import pytest

import te_grad as tg

RNG = np.random.default_rng(21)


def _compare(outputs, inputs):
    feed = {x: RNG.standard_normal(x.shape) for x in inputs}
    want = tg.evaluate(outputs, feed)
    got = tg.build(outputs, inputs)(*[feed[x] for x in inputs])
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("stride,kernel,padding,dilation",
                         [c for c in itertools.product([2, 3, 4], [1, 2, 3], [0, 1, 2], [1, 2])
                          if c[2] < c[1] * c[3]])
def test_strided_1d_convolution_gradients(stride, kernel, padding, dilation):
    for n in (3 * stride, 3 * stride + 1):
        x = tg.placeholder((2, n), name="X", dtype="float64")
        w = tg.placeholder((kernel,), name="W", dtype="float64")
        out = (n + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
        r = tg.reduce_axis(kernel, "r")

        def body(b, o):
            at = o * stride - padding + r * dilation
            return tg.sum(tg.if_then_else(tg.all(at >= 0, at < n), x[b, at], 0.0) * w[r], axis=r)
        y = tg.compute((2, out), body, name="y")
        head = tg.placeholder(y.shape, name="H", dtype="float64")
        _compare(tg.gradient(y, [x, w], head=head), [x, w, head])


@pytest.mark.parametrize("a,b,m", list(itertools.product([1, 2, 3], [0, 1, 3], [2, 3, 4])))
def test_elementwise_classes(a, b, m):
    n = 4 * m
    x = tg.placeholder((a * n + b + m,), name="X", dtype="float64")
    y = tg.compute((n,), lambda j: x[(a * j + b) // m] * (1.0 + ((j + b) % m)) - x[(j + 1) % m + 1], name="y")
    head = tg.placeholder((n,), name="H", dtype="float64")
    _compare([y] + tg.gradient(y, [x], head=head), [x, head])


@pytest.mark.parametrize("m,r", [(m, r) for m in (2, 3, 4) for r in range(m)])
def test_reductions_with_a_modular_filter(m, r):
    n = 3 * m
    x = tg.placeholder((n, n), name="X", dtype="float64")
    k = tg.reduce_axis(n, "k")
    y = tg.compute((n, n), lambda i, j: tg.sum(x[k, (i + j) % n], axis=k, where=(j + k) % m == r), name="y")
    head = tg.placeholder(y.shape, name="H", dtype="float64")
    _compare([y] + tg.gradient(y, [x], head=head), [x, head])


BOUNDS = {
    "prefix": (lambda j: 0, lambda j: j + 1),
    "suffix": (lambda j: j, lambda j: 8),
    "twice": (lambda j: 0, lambda j: tg.minimum(2 * j, 8)),
    "half": (lambda j: j // 2, lambda j: 8),
}


@pytest.mark.parametrize("combiner", ["sum", "max", "min", "prod"])
@pytest.mark.parametrize("bounds", sorted(BOUNDS))
def test_running_reductions(combiner, bounds):
    lo, hi = BOUNDS[bounds]
    x = tg.placeholder((3, 8), name="X", dtype="float64")

    def body(i, j):
        k = tg.ir.ReduceAxis("k", "int64", tg.dsl.as_expr(lo(j)), tg.dsl.as_expr(hi(j)))
        value = x[i, k] * 0.5 + 1.0 if combiner == "prod" else x[i, k]
        return getattr(tg, combiner)(value, axis=k)
    y = tg.compute((3, 8), body, name="y")
    z = tg.compute((3, 8), lambda i, j: tg.maximum(tg.minimum(y[i, j], 1e6), -1e6), name="z")
    head = tg.placeholder(y.shape, name="H", dtype="float64")
    _compare([z] + tg.gradient(z, [x], head=head), [x, head])


@pytest.mark.parametrize("bounds", sorted(BOUNDS))
def test_running_product_gradient_matches_finite_differences(bounds):
    from te_grad.testing import check_gradients
    lo, hi = BOUNDS[bounds]
    x = tg.placeholder((2, 8), name="X", dtype="float64")

    def body(i, j):
        k = tg.ir.ReduceAxis("k", "int64", tg.dsl.as_expr(lo(j)), tg.dsl.as_expr(hi(j)))
        return tg.prod(x[i, k] * 0.5 + 1.0, axis=k)
    y = tg.compute((2, 8), body, name="y")
    check_gradients(y, [x], {x: RNG.uniform(-1, 1, (2, 8))})
