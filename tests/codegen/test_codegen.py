"""Compiled kernels (tg.build): the calling convention, run-time errors, threads, the JIT cache.

Every compiled result is compared with the reference evaluator on the same
feed. The helpers here (:func:`assert_kernel_matches`, :func:`assert_same`)
are shared by the other ``test_codegen_*`` modules.
"""
import numpy as np
import pytest

import codegen
import codegen.jit
import codegen.kernel
import te_grad as tg
from codegen.loopir import TransposeBlock, Transposed, loops_of_kind
from te_grad import nn

F64 = "float64"


def ph(shape, name, dtype=F64):
    return tg.placeholder(shape, dtype=dtype, name=name)


# ---------------------------------------------------------------------------
# helpers shared by the codegen tests
# ---------------------------------------------------------------------------

def assert_same(got, want, *, rtol=1e-9, atol=1e-12, scaled=False, what=""):
    """``got`` (compiled) equals ``want`` (evaluator): same shape and dtype, values within tolerance.

    Integers and booleans must be equal. For floats ``scaled`` multiplies
    ``atol`` by the largest magnitude of ``want`` (sums of float32 terms).
    """
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if got.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    if scaled:
        finite = np.abs(want[np.isfinite(want)])
        atol = atol * max(1.0, float(finite.max()) if finite.size else 1.0)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def as_list(result):
    return list(result) if isinstance(result, tuple) else [result]


def assert_kernel_matches(outputs, inputs, feed, *, rtol=1e-9, atol=1e-12, scaled=False, **options):
    """Build ``outputs`` of ``inputs``, run it on ``feed`` and compare with ``tg.evaluate``.

    Returns the kernel and the compiled results.
    """
    outputs = list(outputs)
    kern = tg.build(outputs, inputs=list(inputs), **options)
    got = as_list(kern(*[feed[x] for x in inputs]))
    want = tg.evaluate(outputs, feed)
    assert len(got) == len(outputs)
    for t, g, w in zip(outputs, got, want):
        assert_same(g, w, rtol=rtol, atol=atol, scaled=scaled, what=f"compiled {t.name} vs evaluator")
    return kern, got


def _dense_graph(n=3, k=4, m=5, dtype=F64):
    X, W, head = ph((n, k), "X", dtype), ph((m, k), "W", dtype), ph((n, m), "head", dtype)
    Y = nn.dense(X, W)
    dX, dW = tg.differentiate(Y, [X, W], head=head)
    return (X, W, head), (Y, dX, dW)


def _dense_feed(inputs, seed=0):
    rng = np.random.default_rng(seed)
    return {t: rng.standard_normal(t.shape).astype(t.dtype) for t in inputs}


# ---------------------------------------------------------------------------
# the calling convention
# ---------------------------------------------------------------------------

def test_public_api_example():
    (X, W, head), (Y, dX, dW) = _dense_graph()
    feed = _dense_feed([X, W, head])
    kern = tg.build([Y, dX, dW], inputs=[X, W, head])
    y, dx, dw = kern(feed[X], feed[W], feed[head])
    np.testing.assert_allclose(y, feed[X] @ feed[W].T, rtol=1e-12)
    np.testing.assert_allclose(dx, feed[head] @ feed[W], rtol=1e-12)
    np.testing.assert_allclose(dw, feed[head].T @ feed[X], rtol=1e-12)
    assert_kernel_matches([Y, dX, dW], [X, W, head], feed)


def test_one_output_gives_the_array_itself():
    (X, W, _), (Y, _, _) = _dense_graph()
    feed = _dense_feed([X, W])
    for outputs in (Y, [Y]):
        y = tg.build(outputs, inputs=[X, W])(feed[X], feed[W])
        assert isinstance(y, np.ndarray) and y.shape == (3, 5) and y.dtype == np.float64


def test_results_are_fresh_arrays_each_call():
    (X, W, _), (Y, _, _) = _dense_graph()
    feed = _dense_feed([X, W])
    kern = tg.build([Y], inputs=[X, W])
    y1 = kern(feed[X], feed[W])
    y2 = kern(feed[X], feed[W])
    assert y1 is not y2 and not np.shares_memory(y1, y2)
    np.testing.assert_array_equal(y1, y2)


def test_wrong_number_of_arrays_names_the_inputs():
    (X, W, head), outs = _dense_graph()
    feed = _dense_feed([X, W, head])
    kern = tg.build(list(outs), inputs=[X, W, head])
    for args in ([feed[X], feed[W]], [feed[X], feed[W], feed[head], feed[head]], []):
        with pytest.raises(tg.TeGradError, match=r"3.*X, W, head.*got %d" % len(args)):
            kern(*args)


def test_wrong_dtype_names_the_input():
    (X, W, head), outs = _dense_graph()
    feed = _dense_feed([X, W, head])
    kern = tg.build(list(outs), inputs=[X, W, head])
    with pytest.raises(tg.TeGradError, match=r"W.*float64.*float32"):
        kern(feed[X], feed[W].astype(np.float32), feed[head])
    with pytest.raises(tg.TeGradError, match=r"head.*float64.*int64"):
        kern(feed[X], feed[W], feed[head].astype(np.int64))
    ids = ph((3,), "ids", "int32")
    T = ph((4, 2), "T")
    kern = tg.build([nn.embedding(T, ids)], inputs=[T, ids])
    with pytest.raises(tg.TeGradError, match=r"ids.*int32.*int64"):
        kern(np.zeros((4, 2)), np.zeros(3, dtype=np.int64))


def test_wrong_shape_names_the_input():
    (X, W, head), outs = _dense_graph()
    feed = _dense_feed([X, W, head])
    kern = tg.build(list(outs), inputs=[X, W, head])
    with pytest.raises(tg.TeGradError, match=r"X.*shape \[3, 4\].*\[4, 3\]"):
        kern(feed[X].T.copy(), feed[W], feed[head])
    with pytest.raises(tg.TeGradError, match=r"head.*shape \[3, 5\].*\[15\]"):
        kern(feed[X], feed[W], feed[head].ravel())
    with pytest.raises(tg.TeGradError, match=r"W.*shape"):
        kern(feed[X], feed[W][None], feed[head])


@pytest.mark.parametrize("view", ["transposed", "strided_slice", "fortran", "negative_stride", "readonly"])
def test_non_contiguous_inputs_give_the_right_answer(view):
    (X, W, head), outs = _dense_graph()
    feed = _dense_feed([X, W, head], seed=3)
    base = {"transposed": lambda a: np.ascontiguousarray(a.T).T,
            "strided_slice": lambda a: np.repeat(np.repeat(a, 2, axis=0), 3, axis=1)[::2, ::3],
            "fortran": np.asfortranarray,
            "negative_stride": lambda a: np.ascontiguousarray(a[::-1, ::-1])[::-1, ::-1],
            "readonly": lambda a: a.copy()}[view]
    views = {t: base(v) for t, v in feed.items()}
    for t in views:
        np.testing.assert_array_equal(views[t], feed[t])
        if view == "readonly":
            views[t].setflags(write=False)
        else:
            assert not views[t].flags.c_contiguous
    kern = tg.build(list(outs), inputs=[X, W, head])
    before = {t: v.copy() for t, v in views.items()}
    got = kern(*[views[t] for t in (X, W, head)])
    for g, w in zip(got, tg.evaluate(list(outs), feed)):
        assert_same(g, w)
    for t in views:  # inputs are never written
        np.testing.assert_array_equal(views[t], before[t])


def test_out_arrays_are_written_and_returned():
    (X, W, head), outs = _dense_graph()
    feed = _dense_feed([X, W, head])
    kern = tg.build(list(outs), inputs=[X, W, head])
    arrays = [np.full(t.shape, np.nan) for t in outs]
    got = kern(feed[X], feed[W], feed[head], out=arrays)
    assert isinstance(got, tuple) and len(got) == 3
    for g, a, w in zip(got, arrays, tg.evaluate(list(outs), feed)):
        assert g is a
        assert_same(a, w)
    # called again into the same arrays: overwritten, not accumulated
    got = kern(feed[X], feed[W], feed[head], out=tuple(arrays))
    for g, a, w in zip(got, arrays, tg.evaluate(list(outs), feed)):
        assert g is a
        assert_same(a, w)
    # one output: a bare array is accepted
    Y = outs[0]
    one = tg.build(Y, inputs=[X, W])
    y = np.empty(Y.shape)
    assert one(feed[X], feed[W], out=y) is y
    assert_same(y, tg.evaluate([Y], feed)[0])
    assert one(feed[X], feed[W], out=[y]) is y


def test_out_arrays_are_checked():
    (X, W, head), outs = _dense_graph()
    feed = _dense_feed([X, W, head])
    args = [feed[X], feed[W], feed[head]]
    kern = tg.build(list(outs), inputs=[X, W, head])
    good = [np.empty(t.shape) for t in outs]
    with pytest.raises(tg.TeGradError, match="3 arrays, got 2"):
        kern(*args, out=good[:2])
    bad_shape = [good[0], np.empty((5, 4)), good[2]]
    with pytest.raises(tg.TeGradError, match=r"dX.*shape \[3, 4\]"):
        kern(*args, out=bad_shape)
    bad_dtype = [good[0], good[1], np.empty((5, 4), dtype=np.float32)]
    with pytest.raises(tg.TeGradError, match=r"dW.*float64"):
        kern(*args, out=bad_dtype)
    not_contiguous = [np.empty((5, 3)).T, good[1], good[2]]
    with pytest.raises(tg.TeGradError, match=rf"\b{outs[0].name}\b.*C-contiguous"):
        kern(*args, out=not_contiguous)
    strided = [good[0], np.empty((3, 8))[:, ::2], good[2]]
    with pytest.raises(tg.TeGradError, match=r"dX.*C-contiguous"):
        kern(*args, out=strided)
    readonly = np.empty((3, 5))
    readonly.setflags(write=False)
    with pytest.raises(tg.TeGradError, match=rf"\b{outs[0].name}\b.*writeable"):
        kern(*args, out=[readonly, good[1], good[2]])
    with pytest.raises(tg.TeGradError, match=rf"\b{outs[0].name}\b"):
        kern(*args, out=[np.zeros((3, 5)).tolist(), good[1], good[2]])


def test_build_rejects_missing_and_bad_inputs():
    (X, W, head), (Y, dX, dW) = _dense_graph()
    with pytest.raises(tg.TeGradError, match=r"placeholder\(s\) W"):
        tg.build([Y], inputs=[X])
    with pytest.raises(tg.TeGradError, match="head"):
        tg.build([Y, dX], inputs=[X, W])
    with pytest.raises(tg.TeGradError, match=r"W.*head|head.*W"):
        tg.build([dX], inputs=[X])
    with pytest.raises(tg.TeGradError, match=rf"{Y.name}.*not a placeholder"):
        tg.build([dX], inputs=[X, W, head, Y])
    with pytest.raises(tg.TeGradError, match="twice"):
        tg.build([Y], inputs=[X, W, X])
    with pytest.raises(tg.TeGradError, match="tensors"):
        tg.build([Y, np.zeros(3)], inputs=[X, W])
    with pytest.raises(tg.TeGradError, match="tensors"):
        tg.build([Y], inputs=[X, np.zeros((5, 4))])


def test_unused_inputs_are_allowed_and_checked():
    (X, W, head), (Y, _, _) = _dense_graph()
    U = ph((2,), "U")
    feed = _dense_feed([X, W])
    kern = tg.build([Y], inputs=[U, X, W])
    assert_same(kern(np.zeros(2), feed[X], feed[W]), tg.evaluate([Y], feed)[0])
    with pytest.raises(tg.TeGradError, match="U"):
        kern(np.zeros(3), feed[X], feed[W])


def test_output_that_is_also_an_input():
    (X, W, _), (Y, _, _) = _dense_graph()
    feed = _dense_feed([X, W])
    kern = tg.build([Y, X], inputs=[X, W])
    y, x = kern(feed[X], feed[W])
    assert_same(y, tg.evaluate([Y], feed)[0])
    np.testing.assert_array_equal(x, feed[X])
    assert not np.shares_memory(x, feed[X])
    x[...] = 0.0  # the caller's array is untouched
    assert np.any(feed[X] != 0.0)
    only = tg.build([W], inputs=[W])
    w = only(feed[W].T.copy().T)
    np.testing.assert_array_equal(w, feed[W])
    out = np.empty((5, 4))
    assert only(feed[W], out=out) is out
    np.testing.assert_array_equal(out, feed[W])


def test_same_output_twice():
    (X, W, _), (Y, _, _) = _dense_graph()
    feed = _dense_feed([X, W])
    y1, y2 = tg.build([Y, Y], inputs=[X, W])(feed[X], feed[W])
    assert y1 is not y2
    assert_same(y1, tg.evaluate([Y], feed)[0])
    assert_same(y2, y1)


def test_outputs_without_inputs():
    T = tg.compute((2, 3), lambda i, j: tg.cast(F64, i - j) * 0.5, name="T")
    kern = tg.build([T], inputs=[])
    np.testing.assert_array_equal(kern(), [[0, -0.5, -1], [0.5, 0, -0.5]])


# ---------------------------------------------------------------------------
# run-time errors: data-dependent ids, integer division by zero
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
@pytest.mark.parametrize("bad", [5, 6, 1000, -1, -5, 2 ** 31 - 1, -2 ** 31])
def test_embedding_id_out_of_range_is_an_error(id_dtype, bad):
    table, ids, head = ph((5, 3), "table"), ph((4,), "ids", id_dtype), ph((4, 3), "head")
    Y = nn.embedding(table, ids)
    (dT,) = tg.differentiate(Y, [table], head=head)
    forward = tg.build([Y], inputs=[table, ids])
    backward = tg.build([dT], inputs=[ids, head])
    both = tg.build([Y, dT], inputs=[table, ids, head])
    rng = np.random.default_rng(0)
    t, h = rng.standard_normal((5, 3)), rng.standard_normal((4, 3))
    bad_ids = np.array([0, 4, bad, 1], dtype=id_dtype)
    for kern, args, name in ((forward, (t, bad_ids), "table"), (both, (t, bad_ids, h), "table")):
        with pytest.raises(tg.TeGradError, match=rf"{bad}\b.*\b{name}\b") as err:
            kern(*args)
        assert not isinstance(err.value, tg.InternalError)
    # the backward alone reads no table: dtable[k] sums head[i] over the i with ids[i] == k, and an
    # id outside the table selects no row (as in the raw gradient), never a write outside dtable
    (raw,) = tg.differentiate(Y, [table], head=head, simplify=False)
    assert_same(backward(bad_ids, h), tg.evaluate([raw], {ids: bad_ids, head: h})[0])
    # the kernels still work afterwards
    good = np.array([0, 4, 2, 4], dtype=id_dtype)
    feed = {table: t, ids: good, head: h}
    assert_same(forward(t, good), tg.evaluate([Y], feed)[0])
    assert_same(backward(good, h), tg.evaluate([dT], feed)[0])
    for g, w in zip(both(t, good, h), tg.evaluate([Y, dT], feed)):
        assert_same(g, w)


def test_take_and_cross_entropy_label_out_of_range():
    x, idx, head = ph((3, 4), "x"), ph((2,), "indices", "int64"), ph((3, 2), "head")
    Y = nn.take(x, idx, axis=1)
    (dx,) = tg.differentiate(Y, [x], head=head)
    kern = tg.build([Y, dx], inputs=[x, idx, head])
    for bad in (4, -1):
        with pytest.raises(tg.TeGradError, match=rf"{bad}\b.*\bx\b"):
            kern(np.zeros((3, 4)), np.array([0, bad]), np.zeros((3, 2)))
    logits, labels = ph((3, 4), "logits"), ph((3,), "labels", "int64")
    loss = nn.softmax_cross_entropy(logits, labels)
    (dl,) = tg.differentiate(loss, [logits])
    kern = tg.build([loss, dl], inputs=[logits, labels])
    for bad in (4, -2):
        with pytest.raises(tg.TeGradError, match=rf"{bad}\b.*\blogits\b"):
            kern(np.zeros((3, 4)), np.array([0, bad, 1]))


def test_guarded_data_dependent_read_is_not_an_error():
    W, ids = ph((5, 2), "W"), ph((4,), "ids", "int32")
    E = tg.compute((4, 2), lambda i, j: tg.if_then_else((ids[i] >= 0) & (ids[i] < 5), W[ids[i], j], 0.0),
                   name="E")
    feed = {W: np.arange(10.0).reshape(5, 2), ids: np.array([1, 7, -3, 4], np.int32)}
    assert_kernel_matches([E], [W, ids], feed)


def test_integer_division_by_zero_is_an_error():
    A, B = ph((4,), "A", "int32"), ph((4,), "B", "int32")
    a = np.array([7, -7, 3, 9], np.int32)
    for op in ("floordiv", "floormod"):
        T = tg.compute((4,), lambda i: A[i] // B[i] if op == "floordiv" else A[i] % B[i], name="T")
        kern = tg.build([T], inputs=[A, B])
        with pytest.raises(tg.TeGradError, match=r"division by zero.*\bT\b"):
            kern(a, np.array([2, 0, -2, 4], np.int32))
        assert_kernel_matches([T], [A, B], {A: a, B: np.array([2, 3, -2, -4], np.int32)})
    G = tg.compute((4,), lambda i: tg.if_then_else(B[i] != 0, A[i] // B[i] + A[i] % B[i], -100), name="G")
    assert_kernel_matches([G], [A, B], {A: a, B: np.array([2, 0, -2, 4], np.int32)})
    k = tg.reduce_axis(4, "k")
    S = tg.compute((), lambda: tg.sum(A[k] // B[k], axis=k, where=B[k] != 0), name="S")
    assert_kernel_matches([S], [A, B], {A: a, B: np.array([2, 0, -2, 4], np.int32)})


# ---------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------

def _threaded_graphs():
    rng = np.random.default_rng(5)
    graphs = []
    (X, W, head), outs = _dense_graph(128, 256, 128)
    graphs.append(("dense", list(outs), [X, W, head], _dense_feed([X, W, head], seed=1)))
    x, w, h = ph((2, 8, 16, 16), "x"), ph((8, 8, 3, 3), "w"), ph((2, 8, 8, 8), "head")
    y = nn.conv2d(x, w, stride=2, padding=1)
    dx, dw = tg.differentiate(y, [x, w], head=h)
    graphs.append(("conv2d", [y, dx, dw], [x, w, h],
                   {t: rng.standard_normal(t.shape) for t in (x, w, h)}))
    a, ha = ph((64, 600), "a"), ph((64, 600), "head")
    s = nn.softmax(nn.gelu(a))
    (da,) = tg.differentiate(s, [a], head=ha)
    graphs.append(("softmax_gelu", [s, da], [a, ha], {a: rng.standard_normal(a.shape),
                                                     ha: rng.standard_normal(ha.shape)}))
    return graphs


@pytest.mark.parametrize("index", range(3), ids=["dense", "conv2d", "softmax_gelu"])
def test_threads_give_the_same_results(index):
    name, outs, inputs, feed = _threaded_graphs()[index]
    args = [feed[t] for t in inputs]
    one = tg.build(outs, inputs=inputs, threads=1)
    two = tg.build(outs, inputs=inputs, threads=2)
    assert one.threads == 1 and two.threads == 2
    r1, r2 = as_list(one(*args)), as_list(two(*args))
    r2_again = as_list(two(*args))
    for t, a, b, c in zip(outs, r1, r2, r2_again):
        assert_same(b, a, rtol=1e-12, atol=1e-12, what=f"{name}: {t.name} with 2 threads vs 1")
        np.testing.assert_array_equal(c, b, err_msg=f"{name}: {t.name}: two runs with 2 threads differ")
    for t, a, w in zip(outs, r1, tg.evaluate(outs, feed)):
        assert_same(a, w, rtol=1e-9, atol=1e-10, what=f"{name}: {t.name}")


def test_threaded_float32_elementwise_is_bitwise_identical():
    X = ph((256, 300), "X", "float32")
    Y = tg.compute(X.shape, lambda i, j: tg.exp(tg.tanh(X[i, j])) * tg.sigmoid(X[i, j]) + X[j % 256, i],
                   name="Y")
    x = np.random.default_rng(2).standard_normal(X.shape).astype(np.float32)
    y1 = tg.build([Y], inputs=[X], threads=1)(x)
    for n in (2, 3, 7):
        np.testing.assert_array_equal(tg.build([Y], inputs=[X], threads=n)(x), y1)
    assert_same(y1, tg.evaluate([Y], {X: x})[0], rtol=1e-5, atol=1e-6)


def test_threaded_scatter_is_exact():
    """A big embedding gradient: the scatter accumulates without races."""
    table, ids, head = ph((300, 64), "table"), ph((3000,), "ids", "int64"), ph((3000, 64), "head")
    Y = nn.embedding(table, ids)
    (dT,) = tg.differentiate(Y, [table], head=head)
    rng = np.random.default_rng(0)
    feed = {table: rng.standard_normal(table.shape), ids: rng.integers(0, 30, size=3000),
            head: rng.integers(-3, 4, size=head.shape).astype(F64)}  # exact sums
    for threads in (1, 2):
        kern = tg.build([Y, dT], inputs=[table, ids, head], threads=threads)
        y, dt = kern(feed[table], feed[ids], feed[head])
        want_y, want_dt = tg.evaluate([Y, dT], feed)
        np.testing.assert_array_equal(y, want_y)
        np.testing.assert_array_equal(dt, want_dt)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_tiled_transposes_of_odd_sizes(threads):
    """Transposing element-wise nests (tiled) with extents that are not multiples of the tile."""
    rng = np.random.default_rng(threads)
    X = ph((3, 70, 90), "X")
    A = ph((65, 129), "A", "int32")
    B = ph((65, 129), "B", "bool")
    outs = [tg.compute((3, 90, 70), lambda b, i, j: X[b, j, i] * 2.0, name="swap"),
            tg.compute((90, 3, 70), lambda i, b, j: X[2 - b, 69 - j, i] + X[b, j, 89 - i], name="mixed"),
            tg.compute((129, 65), lambda i, j: A[j, i] // 3, name="int_t"),
            tg.compute((129, 65), lambda i, j: B[j, i] & (i > j), name="bool_t")]
    y = nn.transpose(X, (0, 2, 1))
    head = ph(y.shape, "head")
    (dx,) = tg.differentiate(y, [X], head=head)
    feed = {X: rng.standard_normal(X.shape), A: rng.integers(-100, 100, A.shape).astype(np.int32),
            B: rng.integers(0, 2, B.shape).astype(bool), head: rng.standard_normal(head.shape)}
    assert_kernel_matches(outs + [y, dx], [X, A, B, head], feed, rtol=0, atol=0, threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_transpose_under_a_batch_known_at_run_time_is_tiled(threads):
    """A transposing nest whose outer extent is a size variable (an imported model's batch):
    tiled along its two constant axes in 8 x 8 register blocks, the batch split among threads at
    its bound value. Its extent once went into a constant: a UserError, and a model upsampling
    64 x 64 images lost its one step kernel for every batch size."""
    batch = tg.var("batch", min=1)
    x = tg.placeholder((batch, 64, 96), name="X")
    y = tg.compute((batch, 96, 64), lambda b, i, j: x[b, j, i] * 2.0, name="T")
    head = tg.placeholder(y.shape, name="head")
    (dx,) = tg.differentiate(y, [x], head=head)
    kern = tg.build([y, dx], [x, head], threads=threads)
    assert sum(len(loops_of_kind(cs.stage.body, Transposed)) for cs in kern.stages) >= 2
    rng = np.random.default_rng(0)
    for n in (1, 3, 5):
        a = rng.standard_normal((n, 64, 96)).astype(np.float32)
        h = rng.standard_normal((n, 96, 64)).astype(np.float32)
        got_y, got_dx = kern(a, h)
        np.testing.assert_array_equal(got_y, a.transpose(0, 2, 1) * 2)
        np.testing.assert_array_equal(got_dx, h.transpose(0, 2, 1) * 2)


def test_more_threads_than_rows():
    A = ph((3, 40000), "A")
    B = tg.compute((3, 40000), lambda i, j: A[i, j] + 1.0, name="B")
    C = tg.compute((40000, 3), lambda j, i: A[i, j] * 2.0, name="C")
    a = np.random.default_rng(0).standard_normal(A.shape)
    assert_kernel_matches([B, C], [A], {A: a}, rtol=0, atol=0, threads=16)


def test_concurrent_calls_from_python_threads():
    import threading
    (X, W, head), outs = _dense_graph(64, 128, 96)
    kern = tg.build(list(outs), inputs=[X, W, head], threads=2)
    failures = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(10):
            x, w, h = (rng.standard_normal(t.shape) for t in (X, W, head))
            y, dx, dw = kern(x, w, h)
            if not (np.allclose(y, x @ w.T, rtol=1e-12) and np.allclose(dx, h @ w, rtol=1e-12)
                    and np.allclose(dw, h.T @ x, rtol=1e-12)):
                failures.append(seed)
    workers = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert failures == []


def test_zero_size_tensors():
    X, h = ph((0, 3), "X"), ph((0, 3), "head")
    k = tg.reduce_axis(0, "k")
    S = tg.compute((3,), lambda j: tg.sum(X[k, j], axis=k) + 1.0, name="S")
    Y = tg.compute((0, 3), lambda i, j: X[i, j] * 2.0, name="Y")
    Z = tg.compute((3, 0), lambda i, j: X[j, i], name="Z")
    (dX,) = tg.differentiate(Y, [X], head=h)
    _, got = assert_kernel_matches([S, Y, Z, dX], [X, h], {X: np.zeros((0, 3)), h: np.zeros((0, 3))})
    assert [g.shape for g in got] == [(3,), (0, 3), (3, 0), (0, 3)]
    np.testing.assert_array_equal(got[0], [1.0, 1.0, 1.0])


def test_num_threads_environment_variable(monkeypatch):
    (X, W, head), outs = _dense_graph(64, 64, 64)
    feed = _dense_feed([X, W, head])
    monkeypatch.setenv("TE_GRAD_NUM_THREADS", "3")
    assert codegen.kernel.default_threads() == 3
    kern = tg.build(list(outs), inputs=[X, W, head])
    assert kern.threads == 3 and "3 threads" in repr(kern)
    for g, w in zip(kern(feed[X], feed[W], feed[head]), tg.evaluate(list(outs), feed)):
        assert_same(g, w)
    monkeypatch.setenv("TE_GRAD_NUM_THREADS", "1")
    assert codegen.kernel.default_threads() == 1
    assert tg.build(list(outs), inputs=[X, W, head]).threads == 1
    assert tg.build(list(outs), inputs=[X, W, head], threads=2).threads == 2  # explicit wins
    monkeypatch.delenv("TE_GRAD_NUM_THREADS")
    assert codegen.kernel.default_threads() >= 1
    assert tg.build(list(outs), inputs=[X, W, head]).threads == codegen.kernel.default_threads()


# ---------------------------------------------------------------------------
# the JIT cache and inspection
# ---------------------------------------------------------------------------

def _cache_graph(c):
    X = ph((7, 13), "Xcache")
    Y = tg.compute((7, 13), lambda i, j: X[i, j] * c + X[6 - i, j], name="Ycache")
    return X, Y


def test_same_graph_compiles_once():
    X, Y = _cache_graph(1.2345678)
    x = np.random.default_rng(0).standard_normal(X.shape)
    codegen.jit.clear_cache()  # counted from empty: earlier tests may have filled it to its limit
    before = codegen.jit.cache_size()
    k1 = tg.build([Y], inputs=[X])
    assert codegen.jit.cache_size() == before + 1
    k2 = tg.build([Y], inputs=[X])
    k3 = tg.build([Y], inputs=[X], threads=1)
    X2, Y2 = _cache_graph(1.2345678)  # the same definition again, fresh tensors
    k4 = tg.build([Y2], inputs=[X2])
    assert codegen.jit.cache_size() == before + 1
    for k in (k1, k2, k3, k4):
        assert_same(k(x), tg.evaluate([Y], {X: x})[0])
    X3, Y3 = _cache_graph(2.5)  # a different graph compiles anew
    k5 = tg.build([Y3], inputs=[X3])
    assert codegen.jit.cache_size() == before + 2
    assert_same(k5(x), tg.evaluate([Y3], {X3: x})[0])
    tg.build([Y3], inputs=[X3])
    assert codegen.jit.cache_size() == before + 2


def test_fast_math_off_compiles_separately_and_agrees():
    (X, W, head), outs = _dense_graph(9, 17, 11)
    feed = _dense_feed([X, W, head])
    codegen.jit.clear_cache()  # counted from empty: earlier tests may have filled it to its limit
    before = codegen.jit.cache_size()
    fast = tg.build(list(outs), inputs=[X, W, head], fast_math=True)
    exact = tg.build(list(outs), inputs=[X, W, head], fast_math=False)
    assert codegen.jit.cache_size() == before + 2
    assert "reassoc" not in exact.llvm_ir
    args = [feed[X], feed[W], feed[head]]
    for a, b, w in zip(fast(*args), exact(*args), tg.evaluate(list(outs), feed)):
        assert_same(a, w)
        assert_same(b, w)


def test_loops_llvm_ir_and_asm():
    x, w = ph((1, 2, 6, 6), "x"), ph((3, 2, 3, 3), "w")
    y = nn.max_pool2d(nn.relu(nn.conv2d(x, w, stride=2, padding=1)), 2, stride=1)
    h = ph(y.shape, "head")
    dx, dw = tg.differentiate(y, [x, w], head=h)
    kern = tg.build([y, dx, dw], inputs=[x, w, h])
    text = kern.loops
    assert kern.stages
    for cs in kern.stages:
        assert cs.stage.tensor.name in text
    for t in (y, dx, dw):
        assert t.name in text
    assert "parallel for" in text
    assert "define" in kern.llvm_ir
    assert kern.asm.strip()
    assert "x, w, head" in repr(kern)


def test_clearing_the_jit_cache_keeps_kernels_working():
    import codegen.jit as jit
    X = tg.placeholder((4,), name="X")
    k = tg.build([tg.compute((4,), lambda i: X[i] + 1.0, name="A")], inputs=[X])
    jit.clear_cache()
    k2 = tg.build([tg.compute((4,), lambda i: X[i] + 2.0, name="B")], inputs=[X])
    x = np.ones(4, "float32")
    np.testing.assert_array_equal(k(x), x + 1)
    np.testing.assert_array_equal(k2(x), x + 2)


def test_ir_that_llvm_rejects_is_an_internal_error():
    import codegen.jit as jit
    with pytest.raises(tg.InternalError, match="LLVM rejected"):
        jit.compile_module("define i32 @f() {\n  ret float 0.0\n}\n", ["f"])


def test_stages_run_in_one_native_call_report_the_failing_stage():
    """Small stages run back to back in one call; an error names the stage that raised it."""
    x = ph((6, 4), "X")
    ids = tg.placeholder((3,), dtype="int64", name="ids")
    k = tg.reduce_axis((0, 4), "k")
    rows = tg.compute((6,), lambda i: tg.sum(x[i, k] * x[i, k], axis=k), name="rows")
    picked = tg.compute((3,), lambda i: tg.exp(rows[ids[i]]), name="picked")
    j = tg.reduce_axis((0, 3), "j")
    total = tg.compute((), lambda: tg.sum(picked[j], axis=j), name="total")
    kern = tg.build([total], inputs=[x, ids], threads=1)
    names = [cs.stage.tensor.name for cs in kern.stages]
    assert len(names) >= 2 and names.index("picked") > 0
    xv = np.random.default_rng(0).standard_normal((6, 4)) * 0.1
    good = np.array([5, 0, 2])
    assert_same(kern(xv, good), tg.evaluate([total], {x: xv, ids: good})[0], what="total")
    with pytest.raises(tg.TeGradError, match=r"index 6 is out of range \[0, 6\).*while computing picked"):
        kern(xv, np.array([1, 6, 0]))


@pytest.mark.parametrize("n", [8, 20, 37, 1000])
def test_row_reductions_in_vector_lanes(n):
    """Row sums and maxima (lanes along the reduce axis) of many widths, NaN propagated."""
    x = ph((5, n), "X", dtype="float32")
    k = tg.reduce_axis((0, n), "k")
    s = tg.compute((5,), lambda i: tg.sum(x[i, k], axis=k), name="s")
    k2 = tg.reduce_axis((0, n), "k2")
    m = tg.compute((5,), lambda i: tg.max(x[i, k2], axis=k2), name="m")
    xv = np.random.default_rng(n).standard_normal((5, n)).astype("float32")
    xv[2, n // 2] = np.nan
    kern = tg.build([s, m], inputs=[x])
    got_s, got_m = kern(xv)
    want_s, want_m = tg.evaluate([s, m], {x: xv})
    assert np.isnan(got_s[2]) and np.isnan(got_m[2])
    assert_same(got_s, want_s, rtol=1e-4, atol=1e-5, scaled=True, what="sum")
    assert_same(got_m, want_m, what="max")


def test_without_fast_math_a_sum_adds_in_order():
    """fast_math=False: no reassociation, so a float32 row sum is the sequential sum, bit for bit."""
    x = ph((3, 1000), "X", dtype="float32")
    k = tg.reduce_axis((0, 1000), "k")
    s = tg.compute((3,), lambda i: tg.sum(x[i, k], axis=k), name="s")
    xv = (np.random.default_rng(0).standard_normal((3, 1000)) * 1e3).astype("float32")
    sequential = np.cumsum(xv, axis=1, dtype=np.float32)[:, -1]
    np.testing.assert_array_equal(tg.build([s], inputs=[x], fast_math=False)(xv), sequential)
    assert not np.array_equal(tg.build([s], inputs=[x])(xv), sequential)  # lanes do reassociate


def test_intermediate_buffers_are_reused_across_calls_without_stale_values():
    """Intermediates live in buffers the kernel keeps; each call overwrites all of them."""
    x = ph((40, 30), "X")
    k = tg.reduce_axis((0, 30), "k")
    rows = tg.compute((40,), lambda i: tg.sum(tg.exp(x[i, k]), axis=k), name="rows")
    y = tg.compute((40, 30), lambda i, j: tg.exp(x[i, j]) / rows[i], name="y")
    kern = tg.build([y], inputs=[x])
    rng = np.random.default_rng(0)
    for _ in range(3):
        xv = rng.standard_normal((40, 30))
        assert_same(kern(xv), tg.evaluate([y], {x: xv})[0], what="y")
    assert len(kern._scratch) == 1  # one set of intermediates, kept


@pytest.mark.parametrize("threads", [1, 2])
def test_transposes_in_eight_by_eight_register_blocks(threads):
    """32-bit transposes whose extents divide by 8 go through 8 x 8 in-register transposes."""
    rng = np.random.default_rng(5)
    X = ph((2, 72, 80), "X", "float32")
    Y = ph((80, 72), "Y", "float32")
    N = ph((64, 96), "N", "int32")
    D = ph((64, 64), "D")  # float64: the element-wise fallback
    outs = [tg.compute((2, 80, 72), lambda b, i, j: X[b, j, i] * 2.0 + Y[i, j], name="mixed"),
            tg.compute((96, 64), lambda i, j: N[j, i] * 3, name="int_t"),
            tg.compute((80, 72), lambda i, j: tg.exp(X[1, j, i]) - Y[i, j] * Y[i, 0], name="exp_t"),
            tg.compute((64, 64), lambda i, j: D[j, i], name="f64_t")]
    feed = {X: rng.standard_normal(X.shape).astype(np.float32), Y: rng.standard_normal(Y.shape).astype(np.float32),
            N: rng.integers(-1000, 1000, N.shape).astype(np.int32), D: rng.standard_normal(D.shape)}
    kern, _ = assert_kernel_matches(outs, [X, Y, N, D], feed, rtol=1e-6, atol=1e-6, threads=threads)
    blocks = [lp for cs in kern.stages for lp in loops_of_kind(cs.stage.body, Transposed)]
    assert sorted({TransposeBlock.of(lp).store.tensor.name for lp in blocks}) == ["exp_t", "int_t", "mixed"]
