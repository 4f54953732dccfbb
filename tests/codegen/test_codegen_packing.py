"""Copies of contraction operands (codegen/packing.py: transposed, zero-padded, split into
congruence classes, in panels): when they are made, that
every read of the new loops stays inside its tensor, and that kernels reading them
equal the reference evaluator in float64."""
import itertools

import numpy as np
import pytest

import te_grad as tg
from codegen import packing
from codegen.loop_order import panel_width
from codegen.loopir import If, Loop, RegisterBlock, RegisterBlocked, Store, loops_of_kind, stmt_stores
from codegen.machine import Machine
from codegen.schedule import stages_for
from te_grad.graph import reads_in
from te_grad.intervals import interval
from simplify import simplify

RNG = np.random.default_rng(8)
AVX512 = Machine(vector_bits=512, vector_registers=32, l1_bytes=48 * 1024, l2_bytes=2 << 20)


@pytest.fixture
def always_pack():
    """Copies for any size (the thresholds are about speed, not correctness)."""
    with packing.using(packing.EVERY_COPY):
        yield


def copies(outputs, suffix):
    return sorted(s.tensor.name for s in stages_for(simplify(outputs), AVX512) if s.tensor.name.endswith(suffix))


def reads_stay_inside(outputs):
    """Every read of the stages reading a copy is inside its tensor at every point of its loops, by
    interval analysis of the loop bounds (a witness independent of the packing's own
    reasoning); False if some read cannot be bounded or may leave its tensor."""
    def walk(stmts, ranges):
        for s in stmts:
            if isinstance(s, Loop):
                lo, hi = interval(s.lo, ranges), interval(s.hi, ranges)
                if lo is None or hi is None:
                    return False
                if lo[0] < hi[1] and not walk(s.body, {**ranges, id(s.var): (lo[0], hi[1] - 1)}):
                    return False
            elif isinstance(s, If):
                continue  # a guarded read is the guard's business (the original reads there too)
            elif isinstance(s, Store):
                for r in reads_in(s.value):
                    for i, n in zip(r.indices, r.tensor.shape):
                        span = interval(i, ranges)
                        if span is None or span[0] < 0 or span[1] >= n:
                            return False
        return True
    stages = stages_for(simplify(outputs), AVX512)
    # the stages reading a copy (a copy's own reads are guarded by its border test)
    suffixes = ("_padded", "_packed", "_classes", "_panels")
    readers = [s for s in stages if not s.tensor.name.endswith(suffixes) and
               any(r.tensor.name.endswith(suffixes) for st in stmt_stores(s.body) for r in reads_in(st.value))]
    return all(walk(s.body, {}) for s in readers)


def compare(outputs, inputs):
    feed = {x: RNG.standard_normal(x.shape) for x in inputs}
    want = tg.evaluate(outputs, feed)
    got = tg.build(outputs, inputs, machine=AVX512)(*[feed[x] for x in inputs])
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


CONVS = [c for c in itertools.product([1, 2, 3], [1, 2, 3], [0, 1, 2], [1, 2]) if c[2] < c[1] * c[3] or c[2] == 0]


@pytest.mark.parametrize("stride,kernel,padding,dilation", CONVS)
def test_padded_convolutions_and_gradients(always_pack, stride, kernel, padding, dilation):
    x = tg.placeholder((2, 3, 9, 8), name="X", dtype="float64")
    w = tg.placeholder((4, 3, kernel, kernel), name="W", dtype="float64")
    y = tg.nn.conv2d(x, w, stride=stride, padding=padding, dilation=dilation)
    head = tg.placeholder(y.shape, name="H", dtype="float64")
    outputs = [y] + tg.gradient(y, [x, w], head=head)
    if padding and kernel == 3:  # a 1x1 kernel's border outputs receive no terms: nothing to pad
        assert copies([y], "_padded") == ["X_padded"]
    if stride > 1 and dilation > 1 and kernel > 1:  # (the lanes of smaller cases run elsewhere)
        assert len(copies([y], "_classes")) == 1
        assert len(copies(outputs[2:], "_classes")) == 1  # dW's lanes run along output columns too
    assert reads_stay_inside(outputs)
    compare(outputs, [x, w, head])


def test_a_padded_copy_needs_the_bounds_to_come_from_the_read(always_pack):
    # X[i + k - 2] leaves its range near the ends (a padding), but k <= i also clips the
    # sum where X is inside: the hull would add terms that are not zero; isl refuses
    x = tg.placeholder((16,), name="X", dtype="float64")
    w = tg.placeholder((5,), name="W", dtype="float64")
    k = tg.reduce_axis(5, "k")

    def body(i):
        inside = tg.all(i + k - 2 >= 0, i + k - 2 < 16)
        return tg.sum(tg.if_then_else(inside, x[i + k - 2], 0.0) * w[k], axis=k, where=k <= i)
    y = tg.compute((16,), body, name="Y")
    assert copies([y], "_padded") == []
    compare([y], [x, w])
    # without the triangle, the same sum is padded
    y = tg.compute((16,), lambda i: tg.sum(tg.if_then_else(tg.all(i + k - 2 >= 0, i + k - 2 < 16),
                                                         x[i + k - 2], 0.0) * w[k], axis=k), name="Y")
    assert copies([y], "_padded") == ["X_padded"]
    compare([y], [x, w])


def test_a_causal_convolution_reads_a_padded_copy(always_pack):
    x = tg.placeholder((3, 20), name="X", dtype="float64")
    w = tg.placeholder((5,), name="W", dtype="float64")
    k = tg.reduce_axis(5, "k")
    y = tg.compute((3, 20), lambda b, i: tg.sum(x[b, i - k] * w[k], axis=k, where=i - k >= 0), name="Y")
    head = tg.placeholder(y.shape, name="H", dtype="float64")
    outputs = [y] + tg.gradient(y, [x, w], head=head)
    assert copies([y], "_padded") == ["X_padded"]
    assert reads_stay_inside(outputs)
    compare(outputs, [x, w, head])


def test_no_padded_copy_when_another_factor_would_leave_its_range(always_pack):
    # both factors are clipped by the same bounds: padding one still reads the other outside
    x = tg.placeholder((16,), name="X", dtype="float64")
    k = tg.reduce_axis(3, "k")
    y = tg.compute((16,), lambda i: tg.sum(tg.if_then_else(tg.all(i + k - 1 >= 0, i + k - 1 < 16),
                                                         x[i + k - 1] * x[i + k - 1], 0.0), axis=k), name="Y")
    assert copies([y], "_padded") == []
    compare([y], [x])


def test_a_pooling_window_is_not_copied():
    # each element of X is read once: a copy would double the traffic
    x = tg.placeholder((4, 16, 32, 32), name="X")
    y = tg.nn.max_pool2d(x, 2)
    head = tg.placeholder(y.shape, name="H")
    assert copies([y] + tg.gradient(y, [x], head=head), "_classes") == []


def test_small_convolutions_are_not_padded():
    x = tg.placeholder((1, 2, 6, 6), name="X", dtype="float64")
    w = tg.placeholder((2, 2, 3, 3), name="W", dtype="float64")
    assert copies([tg.nn.conv2d(x, w, padding=1)], "_padded") == []


def test_a_large_convolution_is_padded_by_default():
    x = tg.placeholder((2, 16, 16, 16), name="X")
    w = tg.placeholder((16, 16, 3, 3), name="W")
    y = tg.nn.conv2d(x, w, padding=1)
    head = tg.placeholder(y.shape, name="H")
    assert copies([y], "_padded") == ["X_padded"]
    assert copies(tg.gradient(y, [x, w], head=head), "_padded") == ["H_padded", "X_padded"]
    # the forward and the weight gradient in one kernel share one padded copy of X
    assert copies([y] + tg.gradient(y, [x, w], head=head), "_padded") == ["H_padded", "X_padded"]
    y2 = tg.nn.conv2d(x, w, padding=1, stride=2)
    assert copies([y2], "_classes") == ["X_padded_classes"]


@pytest.mark.parametrize("transpose_a,transpose_b", list(itertools.product([False, True], repeat=2)))
def test_batch_matmuls_with_transposed_copies(always_pack, transpose_a, transpose_b):
    a = tg.placeholder((2, 7, 5) if transpose_a else (2, 5, 7), name="A", dtype="float64")
    b = tg.placeholder((2, 6, 7) if transpose_b else (2, 7, 6), name="B", dtype="float64")
    y = tg.nn.batch_matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    head = tg.placeholder(y.shape, name="H", dtype="float64")
    outputs = [y] + tg.gradient(y, [a, b], head=head)
    if transpose_b:  # B[t, j, k]: lanes along j need it transposed (A^T @ B^T would run them along i)
        assert copies([y], "_packed") == ["B_packed"]
    assert reads_stay_inside(outputs)
    compare(outputs, [a, b, head])


def test_a_structural_zero_never_meets_an_infinite_computed_factor(always_pack):
    # 1 / W[0] is infinite; the tap k = 0 of output 0 falls outside X, so the simplified sum
    # skips it and y[0] is finite. A padded copy would multiply the border's zero by inf
    # (NaN): with a computed factor (a partial derivative, say), no copy is made.
    x = tg.placeholder((12,), name="X", dtype="float64")
    w = tg.placeholder((3,), name="W", dtype="float64")
    k = tg.reduce_axis(3, "k")
    y = tg.compute((12,), lambda i: tg.sum(tg.if_then_else(tg.all(i + k - 1 >= 0, i + k - 1 < 12), x[i + k - 1], 0.0)
                                          * (1.0 / w[k]), axis=k), name="Y")
    assert copies([y], "_padded") == []
    feed = {x: RNG.standard_normal(12), w: np.array([0.0, 2.0, 4.0])}
    want = tg.evaluate(simplify([y]), feed)[0]  # (the formula as written gives 0 * inf = NaN)
    got = tg.build([y], [x, w], machine=AVX512)(feed[x], feed[w])
    assert np.isfinite(want[0]) and np.isfinite(got[0])
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-12)


AVX2 = Machine(vector_bits=256, vector_registers=16)


def _dense(rows, cols, out, dtype="float64"):
    x = tg.placeholder((rows, cols), name="X", dtype=dtype)
    w = tg.placeholder((out, cols), name="W", dtype=dtype)
    y = tg.nn.dense(x, w)
    head = tg.placeholder(y.shape, name="H", dtype=dtype)
    return [y] + tg.gradient(y, [x, w], head=head), [x, w, head]


@pytest.mark.parametrize("machine", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_long_weight_rows_are_read_from_panels(machine):
    # X @ W.T over 512 outputs: a step of k moves 2 KiB in W's transposed copy (4 in float64), and
    # the input gradient walks W's 512 rows of 128: both read panels of one cache line, whose
    # lanes are one vector load per panel; X's rows (64 of 128) stay as they are
    outputs, inputs = _dense(64, 128, 512)
    stages = stages_for(simplify(outputs), machine)
    names = sorted(s.tensor.name for s in stages if s.tensor.name.endswith("_panels"))
    assert names == ["W_packed_panels", "W_panels"]
    assert len(_blocked_along_panels(stages, 8)) == 2
    assert reads_stay_inside(outputs)
    compare(outputs, inputs)
    # 128 columns of 128: a step moves 1 KiB over 128 KiB in float64, nothing to gain
    assert copies(_dense(64, 128, 128)[0], "_panels") == []


def _blocked_along_panels(stages, w):
    """The stages reading a copy in panels, each checked to read it only in register blocks whose
    lanes run along the panels' axis (loop_order costs ``P[j // w, .., j % w]`` as contiguous)."""
    readers = [s for s in stages if any(r.tensor.name.endswith("_panels") for st in stmt_stores(s.body)
                                        for r in reads_in(st.value))]
    for s in readers:
        blocks = [RegisterBlock.of(lp) for lp in loops_of_kind(s.body, RegisterBlocked)]
        in_blocks = [(b, r) for b in blocks for r in reads_in(b.store.value) if r.tensor.name.endswith("_panels")]
        everywhere = [r for st in stmt_stores(s.body) for r in reads_in(st.value) if r.tensor.name.endswith("_panels")]
        assert in_blocks and len(in_blocks) == len(everywhere), s.tensor.name
        assert all(panel_width(r.indices, b.var) == w for b, r in in_blocks), s.tensor.name
    return readers


def test_a_weight_gradient_walks_panels_of_the_layer_input():
    # dW[j, k] = sum_i H[i, j] * X[i, k] over 1024 rows of X (128 float32, 512 bytes a step, 512 KiB
    # walked): X in panels; the sum over i must stay inside register blocks along k
    outputs, _ = _dense(1024, 128, 512, "float32")
    stages = stages_for(simplify(outputs), AVX2)
    assert sorted(s.tensor.name for s in stages if s.tensor.name.endswith("_panels")) == \
        ["W_packed_panels", "W_panels", "X_panels"]
    assert len(_blocked_along_panels(stages, 16)) == 3


@pytest.mark.parametrize("transposed", [False, True])
def test_products_read_from_panels_and_their_gradients(always_pack, transposed):
    a = tg.placeholder((5, 7), name="A", dtype="float64")
    b = tg.placeholder((24, 7) if transposed else (7, 24), name="B", dtype="float64")
    k = tg.reduce_axis(7, "k")
    y = tg.compute((5, 24), lambda i, j: tg.sum(a[i, k] * (b[j, k] if transposed else b[k, j]), axis=k), name="Y")
    head = tg.placeholder(y.shape, name="H", dtype="float64")
    outputs = [y] + tg.gradient(y, [a, b], head=head)
    assert copies([y], "_panels") == ["B_packed_panels" if transposed else "B_panels"]
    assert reads_stay_inside(outputs)
    compare(outputs, [a, b, head])


@pytest.mark.parametrize("machine", [AVX512, AVX2], ids=["avx512", "avx2"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("w,n", [(4, 12), (8, 24), (8, 40), (16, 40), (16, 64), (32, 96), (8, 37)])
def test_panels_written_by_hand_at_every_alignment(monkeypatch, machine, dtype, w, n):
    # P[l // w, k, l % w]: a block whose first lane is a multiple of its width or of w loads
    # each panel's part as one vector; the last block of a row that is not a multiple of the
    # width starts inside a panel and gathers its lanes (panels of 4 are split into
    # congruence classes first, codegen/congruence.py)
    from codegen.llvm_blocks import RegisterBlockEmitter
    loads = []
    panel_read = RegisterBlockEmitter.panel_read

    def counted(self, e, var, width, chunk):
        loads.append((width, chunk))
        return panel_read(self, e, var, width, chunk)
    monkeypatch.setattr(RegisterBlockEmitter, "panel_read", counted)
    rows, red = 7, 9
    x = tg.placeholder((rows, red), name="X", dtype=dtype)
    p = tg.placeholder(((n + w - 1) // w, red, w), name="P", dtype=dtype)
    k = tg.reduce_axis(red, "k")
    y = tg.compute((rows, n), lambda i, l: tg.sum(x[i, k] * p[l // w, k, l % w], axis=k), name="Y")
    feed = {t: RNG.standard_normal(t.shape).astype(dtype) for t in (x, p)}
    want = tg.evaluate([y], feed)[0]
    got = tg.build([y], [x, p], machine=machine, disk_cache=False, jit_cache=0)(feed[x], feed[p])
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert bool(loads) == (w >= 8), loads  # vector loads by panel wherever a block starts aligned
    assert all(width % chunk == 0 and chunk <= w for width, chunk in loads)
