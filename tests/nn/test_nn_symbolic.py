"""Every te_grad.nn op on a symbolic batch (``tg.var``): its values (tg.evaluate) and its
gradients (tg.differentiate, simplified) equal those of the same op at fixed shapes, at
three batch sizes; one kernel (tg.build) on the size variable serves all three. Shape
errors that only a symbolic shape can make (reshape) are clear UserErrors."""
import contextvars

import numpy as np
import pytest

import te_grad as tg
from te_grad import nn

N = "N"  # stands for the batch in the shapes below
N1 = "N+1"  # the batch plus one
H = "H"  # a spatial size known at run time (tg.var("h", min=4)), in SPATIAL
_BATCH = contextvars.ContextVar("batch")


def B():
    """The batch inside an op of CASES: the size variable, or the int of the fixed-shape twin."""
    return _BATCH.get()

BATCHES = (2, 3, 5)


def F(*shape):
    return ("float32", shape, None)


def I(*shape, hi):  # noqa: E743 - integer input in [0, hi)
    return ("int64", shape, hi)


def P(length, rows):
    """A CSR row pointer of ``length`` entries over ``rows`` rows (either may be the batch)."""
    return ("int64", (length,), ("rowptr", rows))


def _shape(shape, n):
    return tuple(n if s in (N, H) else n + 1 if s == N1 else s for s in shape)


def _arrays(specs, b, seed):
    rng = np.random.default_rng(seed)
    out = []
    for dtype, shape, hi in specs:
        s = _shape(shape, b)
        if isinstance(hi, tuple):  # a row pointer: sorted, from 0 to the number of rows
            rows = _shape((hi[1],), b)[0]
            inner = np.sort(rng.integers(0, rows + 1, s[0] - 2))
            out.append(np.concatenate([[0], inner, [rows]]).astype(dtype))
        else:
            out.append(rng.integers(0, hi, s).astype(dtype) if hi else rng.standard_normal(s).astype(dtype))
    return out


CASES = [
    ("reshape", lambda x: nn.reshape(x, (B(), 64)), [F(N, 8, 8)]),
    ("reshape_minus_one", lambda x: nn.reshape(x, (-1, 64)), [F(N, 8, 8)]),
    ("reshape_split", lambda x: nn.reshape(x, (B(), 4, 2, 3)), [F(N, 2, 12)]),
    ("reshape_flat", lambda x: nn.reshape(x, (-1,)), [F(N, 3, 4)]),
    ("flatten", nn.flatten, [F(N, 2, 3, 4)]),
    ("transpose", lambda x: nn.transpose(x, (1, 2, 0)), [F(N, 3, 4)]),
    ("concat_batch", lambda a, b: nn.concat([a, b], axis=0), [F(N, 3), F(N, 3)]),
    ("concat_features", lambda a, b: nn.concat([a, b], axis=1), [F(N, 3), F(N, 2)]),
    ("split", lambda x: nn.split(x, [1, 3], axis=1)[1], [F(N, 5)]),
    ("split_sections", lambda x: nn.split(x, 2, axis=1)[1], [F(N, 6)]),
    ("pad", lambda x: nn.pad(x, ((0, 0), (1, 2))), [F(N, 4)]),
    ("pad_batch", lambda x: nn.pad(x, 1), [F(N, 4)]),
    ("strided_slice", lambda x: nn.strided_slice(x, [None, 1], [None, 6], [1, 2]), [F(N, 7)]),
    ("squeeze", lambda x: nn.squeeze(x, 1), [F(N, 1, 4)]),
    ("expand_dims", lambda x: nn.expand_dims(x, 1), [F(N, 4)]),
    ("stack", lambda a, b: nn.stack([a, b], axis=1), [F(N, 3), F(N, 3)]),
    ("dense", lambda x, w, b: nn.dense(x, w, b), [F(N, 5), F(4, 5), F(4)]),
    ("matmul", lambda x, w: nn.matmul(x, w), [F(N, 5), F(5, 3)]),
    ("batch_matmul", lambda a, b: nn.batch_matmul(a, b), [F(N, 2, 3), F(N, 3, 4)]),
    ("bias_add", lambda x, b: nn.bias_add(x, b), [F(N, 3, 4), F(3)]),
    ("conv2d", lambda x, w: nn.conv2d(x, w, padding=1), [F(N, 2, 5, 5), F(3, 2, 3, 3)]),
    ("conv2d_stride", lambda x, w: nn.conv2d(x, w, stride=2), [F(N, 2, 6, 6), F(3, 2, 2, 2)]),
    ("conv2d_transpose", lambda x, w: nn.conv2d_transpose(x, w, stride=2), [F(N, 2, 3, 3), F(2, 3, 2, 2)]),
    ("max_pool2d", lambda x: nn.max_pool2d(x, 2), [F(N, 2, 4, 4)]),
    ("avg_pool2d", lambda x: nn.avg_pool2d(x, 2, padding=1), [F(N, 2, 4, 4)]),
    ("global_avg_pool2d", nn.global_avg_pool2d, [F(N, 2, 3, 3)]),
    ("global_max_pool2d", nn.global_max_pool2d, [F(N, 2, 3, 3)]),
    ("relu", nn.relu, [F(N, 4)]),
    ("gelu", nn.gelu, [F(N, 4)]),
    ("leaky_relu", lambda x: nn.leaky_relu(x, 0.1), [F(N, 4)]),
    ("sigmoid", nn.sigmoid, [F(N, 4)]),
    ("tanh", nn.tanh, [F(N, 4)]),
    ("softmax", lambda x: nn.softmax(x, axis=1), [F(N, 4)]),
    ("softmax_batch_axis", lambda x: nn.softmax(x, axis=0), [F(N, 4)]),
    ("log_softmax", lambda x: nn.log_softmax(x, axis=-1), [F(N, 4)]),
    ("clip", lambda x: nn.clip(x, -0.5, 0.5), [F(N, 4)]),
    ("batch_norm", lambda x, g, b: nn.batch_norm(x, g, b), [F(N, 3, 2, 2), F(3), F(3)]),
    ("layer_norm", lambda x, g, b: nn.layer_norm(x, g, b), [F(N, 4), F(4), F(4)]),
    ("mse_loss", nn.mse_loss, [F(N, 3), F(N, 3)]),
    ("softmax_cross_entropy", lambda x, y: nn.softmax_cross_entropy(x, y), [F(N, 4), I(N, hi=4)]),
    ("cross_entropy", lambda x, y: nn.cross_entropy(x, nn.softmax(y, axis=1)), [F(N, 4), F(N, 4)]),
    ("binary_cross_entropy", lambda x, y: nn.binary_cross_entropy(nn.sigmoid(x), nn.sigmoid(y)),
     [F(N, 3), F(N, 3)]),
    ("embedding", lambda w, ids: nn.embedding(w, ids), [F(6, 3), I(N, 2, hi=6)]),
    ("take", lambda x, ids: nn.take(x, ids, axis=0), [F(5, N), I(N, hi=5)]),
    ("one_hot_dense", lambda ids, w: nn.dense(nn.one_hot(ids, 4), w), [I(N, hi=4), F(3, 4)]),
    ("sum", lambda x: nn.sum(x, axis=0), [F(N, 4)]),
    ("sum_all", lambda x: nn.sum(x), [F(N, 4)]),
    ("mean", lambda x: nn.mean(x, axis=0), [F(N, 4)]),
    ("mean_features", lambda x: nn.mean(x, axis=1), [F(N, 4)]),
    ("max", lambda x: nn.max(x, axis=0), [F(N, 4)]),
    ("min", lambda x: nn.min(x, axis=1), [F(N, 4)]),
    ("variance", lambda x: nn.variance(x, axis=0), [F(N, 4)]),
    ("cumsum", lambda x: nn.cumsum(x, axis=0), [F(N, 3)]),
    ("add", nn.add, [F(N, 3), F(3)]),
    ("multiply", nn.multiply, [F(N, 3), F(N, 1)]),
    ("maximum", nn.maximum, [F(N, 3), F(N, 3)]),
    ("where", lambda x, y: nn.where(tg.compute(x.shape, lambda i, j: x[i, j] > 0), x, y), [F(N, 3), F(N, 3)]),
    ("subtract", nn.subtract, [F(N, 3), F(N, 3)]),
    ("divide", lambda a, b: nn.divide(a, nn.add(nn.multiply(b, b), 1.0)), [F(N, 3), F(3)]),
    ("minimum", nn.minimum, [F(N, 3), F(1, 3)]),
    ("power", lambda a: nn.power(nn.add(nn.multiply(a, a), 0.5), 1.5), [F(N, 3)]),
    ("argmax", lambda x: nn.argmax(x, axis=1), [F(N, 4)]),
    ("argmin", lambda x: nn.argmin(x, axis=0), [F(N, 4)]),
    ("gather_nd", lambda x, ids: nn.gather_nd(x, ids), [F(4, 3, 2), I(N, 2, hi=3)]),
    ("arange", lambda x: nn.add(x, nn.arange(B(), "float32")), [F(N)]),
    ("segment_sum_rows", nn.segment_sum, [F(N, 2), P(4, rows=N)]),
    ("segment_sum_segments", nn.segment_sum, [F(6, 2), P(N1, rows=6)]),
    ("segment_max", nn.segment_max, [F(N, 2), P(3, rows=N)]),
    ("segment_softmax", nn.segment_softmax, [F(N, 2), P(N1, rows=N)]),
    ("silu", nn.silu, [F(N, 4)]),
    ("swiglu", nn.swiglu, [F(N, 4), F(N, 4)]),
    ("gelu_tanh", lambda x: nn.gelu(x, "tanh"), [F(N, 4)]),
    ("rms_norm", lambda x, w: nn.rms_norm(x, w), [F(N, 4), F(4)]),
    ("conv1d", lambda x, w, b: nn.conv1d(x, w, b, padding=1, stride=2), [F(N, 2, 7), F(3, 2, 3), F(3)]),
    ("chunk", lambda x: nn.chunk(x, 3, axis=1)[2], [F(N, 7)]),
    ("scaled_dot_product_attention", lambda q, k, v: nn.scaled_dot_product_attention(q, k, v, is_causal=True),
     [F(N, 2, 3, 4), F(N, 2, 3, 4), F(N, 2, 3, 2)]),
]


def _graphs(fn, specs, n):
    ins = [tg.placeholder(_shape(shape, n), dtype=dtype, name=f"a{k}") for k, (dtype, shape, _) in enumerate(specs)]
    return ins, _with_batch(fn, n)(*ins)


SPATIAL = [
    ("conv2d_hw", lambda x, w: nn.conv2d(x, w, padding=1), [F(2, 2, H, H), F(3, 2, 3, 3)]),
    ("conv2d_hw_stride", lambda x, w: nn.conv2d(x, w, stride=2), [F(1, 2, H, 5), F(3, 2, 3, 3)]),
    ("conv2d_transpose_hw", lambda x, w: nn.conv2d_transpose(x, w, stride=2, padding=1),
     [F(1, 2, H, H), F(2, 3, 3, 3)]),
    ("max_pool2d_hw", lambda x: nn.max_pool2d(x, 2), [F(1, 2, H, H)]),
    ("avg_pool2d_hw", lambda x: nn.avg_pool2d(x, 3, stride=1, padding=1), [F(1, 2, H, H)]),
    ("global_avg_pool2d_hw", nn.global_avg_pool2d, [F(2, 2, H, H)]),
    ("batch_norm_hw", lambda x: nn.batch_norm(x), [F(2, 2, H, 3)]),
    ("softmax_hw", lambda x: nn.softmax(x, axis=2), [F(2, H, 3)]),
    ("layer_norm_hw", lambda x: nn.layer_norm(x, axis=-1), [F(2, H)]),
    ("pad_hw", lambda x: nn.pad(x, 1), [F(2, H)]),
    ("sum_hw", lambda x: nn.sum(x, axis=1), [F(2, H)]),
    ("reshape_hw", lambda x: nn.reshape(x, (2, 3, B())), [F(6, H)]),
]


@pytest.mark.parametrize("name,fn,specs", SPATIAL, ids=[c[0] for c in SPATIAL])
def test_symbolic_spatial_sizes_match_fixed_shapes(name, fn, specs):
    test_symbolic_batch_matches_fixed_shapes_values_gradients_and_one_kernel(name, fn, specs, tg.var("h", min=4),
                                                                            sizes=(4, 5, 7))


@pytest.mark.parametrize("name,fn,specs", CASES, ids=[c[0] for c in CASES])
def test_symbolic_batch_matches_fixed_shapes_values_gradients_and_one_kernel(name, fn, specs, n=None,
                                                                            sizes=BATCHES):
    n = n if n is not None else tg.var("n", min=1)
    ins, out = _graphs(fn, specs, n)
    assert tg.sizes.graph_size_vars([out]) == (n,)
    floats = [t for t in ins if t.dtype == "float32"] if out.dtype == "float32" else []
    grads = tg.differentiate(out, floats) if floats else []
    kernel = tg.build([out] + list(grads), ins)
    for b in sizes:
        arrays = _arrays(specs, b, seed=b)
        fins, fout = _graphs(fn, specs, b)
        want = tg.evaluate([fout], dict(zip(fins, arrays)))[0]
        got = tg.evaluate([out], dict(zip(ins, arrays)), sizes={n: b})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{name} at batch {b}")
        fgrads = tg.differentiate(fout, [t for t in fins if t.dtype == "float32"]) if floats else []
        want_g = tg.evaluate(list(fgrads), dict(zip(fins, arrays))) if floats else []
        got_g = tg.evaluate(list(grads), dict(zip(ins, arrays)), sizes={n: b}) if floats else []
        for g, w in zip(got_g, want_g):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"gradient of {name} at batch {b}")
        ran = kernel(*arrays)
        ran = ran if isinstance(ran, tuple) else (ran,)
        for g, w in zip(ran, [want] + list(want_g)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"kernel of {name} at batch {b}")


def test_every_nn_op_has_a_symbolic_case():
    tested = {op for op in nn.__all__ for name, _, _ in CASES if name == op or name.startswith(op + "_")}
    tested |= {"linear", "embedding"}  # nn.linear is dense's module; embedding's case is above
    helpers = {"broadcast_shape", "conv2d_output_shape"}
    assert set(nn.__all__) - helpers - tested == set()


def _with_batch(fn, n):
    """``fn`` run with :func:`B` giving the batch ``n`` (a size variable or an int)."""
    def call(*ins):
        token = _BATCH.set(n)
        try:
            return fn(*ins)
        finally:
            _BATCH.reset(token)
    return call


def test_reshape_infers_minus_one_as_a_size_expression_and_refuses_what_is_not_structural():
    n = tg.var("n", min=1)
    x = tg.placeholder((n, 8, 8), name="x")
    assert tg.sizes.same_shape(nn.reshape(x, (-1, 64)).shape, (n, 64))
    assert tg.sizes.same_shape(nn.reshape(x, (n, -1)).shape, (n, 64))
    assert nn.reshape(x, (-1,)).shape[0].same_as(n * 64)
    assert tg.sizes.same_shape(nn.reshape(nn.reshape(x, (-1,)), (n, 8, 8)).shape, (n, 8, 8))
    with pytest.raises(tg.errors.UserError, match="cannot infer the -1 .* not a multiple of 5"):
        nn.reshape(x, (-1, 5))
    with pytest.raises(tg.errors.UserError, match="cannot reshape x of shape .* for every value of the sizes"):
        nn.reshape(x, (n, 65))
    with pytest.raises(tg.errors.UserError, match="known only at run time"):
        nn.reshape(tg.placeholder((n, 4), name="y"), (4, n))  # would read y[j // n ...]
    m = tg.var("m")
    with pytest.raises(tg.errors.UserError, match="cannot reshape"):
        nn.reshape(x, (m, 64))  # m is another size: not the same count for every value
    with pytest.raises(tg.errors.UserError, match="at most one -1"):
        nn.reshape(x, (-1, -1))


def test_windows_are_checked_at_the_smallest_sizes():
    h = tg.var("h", min=2)
    x = tg.placeholder((1, 1, h, h), name="x")
    with pytest.raises(tg.errors.UserError, match="at the smallest sizes .* declare a larger min"):
        nn.conv2d(x, tg.placeholder((1, 1, 3, 3), name="w"))
    with pytest.raises(tg.errors.UserError, match="at the smallest sizes"):
        nn.max_pool2d(x, 3, stride=1)
    assert nn.conv2d(x, tg.placeholder((1, 1, 3, 3), name="w"), padding=1).shape[2] is h
    with pytest.raises(tg.errors.UserError, match="do not broadcast .* for every value of the sizes"):
        nn.add(x, tg.placeholder((1, 1, 3, 3), name="y"))


def test_ops_that_need_an_int_say_so_on_a_symbolic_dimension():
    n = tg.var("n", min=1)
    x = tg.placeholder((n, 6), name="x")
    with pytest.raises(tg.errors.UserError, match="strided_slice keeps such an axis whole"):
        nn.strided_slice(x, [1], [None])
    with pytest.raises(tg.errors.UserError, match="sections do not divide axis 0"):
        nn.split(x, 4, axis=0)
    with pytest.raises(tg.errors.UserError, match=r"min >= 2"):
        nn.split(x, [2], axis=0)
    parts = nn.split(tg.placeholder((2 * n, 3), name="z"), 2, axis=0)  # 2 * n in two: n each
    assert all(tg.sizes.same_shape(p.shape, (n, 3)) for p in parts)
    k = tg.var("k", min=2)
    w = tg.placeholder((k, 3), name="w")
    a, b = nn.split(w, [2], axis=0)
    assert a.shape == (2, 3) and tg.sizes.same_shape(b.shape, (k - 2, 3))
    data = np.arange(15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_array_equal(tg.evaluate([b], {w: data})[0], data[2:])
