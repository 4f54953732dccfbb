"""Ragged (CSR) loops scheduled: segment softmax in one pass over the edges, scatters over
CSR segments split among threads, values against the oracle."""
import numpy as np
import pytest

import te_grad as tg
from tests.oracle.test_ragged_oracle import random_csr


def test_segment_softmax_is_one_pass_over_the_edges():
    """Each edge is visited once per stage: not once per (segment, edge) pair."""
    S, E = 50, 400
    rowptr = tg.placeholder((S + 1,), dtype="int64", name="rowptr")
    scores = tg.placeholder((E,), dtype="float64", name="scores")
    alpha = tg.nn.segment_softmax(scores, rowptr)
    # ragged=1 counts each ragged loop as one trip per point: the max, the sum, the scatter
    assert tg.iterations([alpha], ragged=1) <= 3 * S
    rng = np.random.default_rng(0)
    rp, _ = random_csr(rng, S, E)
    sv = rng.standard_normal(E)
    got = tg.build([alpha], inputs=[rowptr, scores], threads=2)(rp, sv)
    np.testing.assert_allclose(got, tg.evaluate([alpha], {rowptr: rp, scores: sv})[0], rtol=1e-12, atol=1e-15)


def gat_graph(V=7, F=4, E=19):
    """A small GAT layer's loss and gradients (benchmarks/gat.py): segment softmax, CSR
    aggregation; the gradients scatter over the ragged loops."""
    rowptr = tg.placeholder((V + 1,), dtype="int64", name="rowptr")
    src = tg.placeholder((E,), dtype="int64", name="src")
    dst = tg.placeholder((E,), dtype="int64", name="dst")
    x = tg.placeholder((V, F), dtype="float64", name="x")
    w = tg.placeholder((F, F), dtype="float64", name="W")
    a = tg.placeholder((F,), dtype="float64", name="a")
    h = tg.nn.matmul(x, w)
    k = tg.reduce_axis(F, "k")
    s = tg.compute((V,), lambda v: tg.sum(h[v, k] * a[k], axis=k), name="s")
    score = tg.nn.leaky_relu(tg.compute((E,), lambda e: s[src[e]] + s[dst[e]], name="pre"), 0.2)
    alpha = tg.nn.segment_softmax(score, rowptr)

    def aggregate(v, f):
        e = tg.reduce_axis((rowptr[v], rowptr[v + 1]), name="e")
        return tg.sum(alpha[e] * h[src[e], f], axis=e)

    out = tg.compute((V, F), aggregate, name="out")
    head = tg.placeholder((V, F), dtype="float64", name="head")
    grads = tg.gradient(out, [x, w, a], head=head)
    return [out] + grads, [rowptr, src, dst, x, w, a, head]


def gat_feed(inputs, seed, V=7, F=4, E=19):
    rng = np.random.default_rng(seed)
    rp, sr = random_csr(rng, V, E)
    ds = np.repeat(np.arange(V), np.diff(rp))
    floats = [rng.standard_normal(t.shape) for t in inputs[3:]]
    return [rp, sr, ds] + floats


OFF = frozenset({"order_ragged_scatter"})


def _scatter_stages(stages):
    return [s for s in stages if any(getattr(st, "checked", False) for st in _stores(s))]


def _stores(stage):
    from codegen.loopir import stmt_stores
    return stmt_stores(stage.body)


@pytest.mark.parametrize("seed", range(3))
def test_ragged_scatters_interpret_to_the_serial_values_bit_for_bit(seed):
    """The loop interpreter runs each scatter before and after the pass: the same bits (each
    location's contributions in the same order), and the oracle's values."""
    from codegen.interpret import run
    from codegen.options import CompileOptions
    from codegen.schedule import stages_for
    outs, inputs = gat_graph()
    arrays = gat_feed(inputs, seed)
    feed = dict(zip(inputs, arrays))
    on = stages_for(outs, options=CompileOptions(disk_cache=False))
    off = stages_for(outs, options=CompileOptions(disk_cache=False, disabled_passes=OFF))
    split = [s for s in _scatter_stages(on) if s.parallel_extent]
    assert len(split) >= 4 and not any(s.parallel_extent for s in _scatter_stages(off))
    got, base = run(on, feed), run(off, feed)
    want = tg.evaluate(outs, feed)
    for t, w in zip(outs, want):
        np.testing.assert_array_equal(got[id(t)], base[id(t)], err_msg=t.name)
        np.testing.assert_allclose(got[id(t)], w, rtol=1e-12, atol=1e-12, err_msg=t.name)


def test_what_the_pass_splits_and_what_stays_serial():
    outs, inputs = gat_graph()
    loops = tg.build(outs, inputs, threads=2).loops
    # dalpha[e] += ...: the segment v of the stored edge e decides the location; f innermost
    assert ("parallel for (v = 0; v < 7; ++v) {\n  for (e = rowptr[v]; e < rowptr[v + 1]; ++e) {\n"
            "    for (f = 0; f < 4; ++f) {\n      dsegment_softmax[e] +=") in loops
    # the softmax written per segment: one thread per segment range
    assert "parallel for (s = 0; s < 7; ++s) {\n  for (k = rowptr[s]; k < rowptr[s + 1]; ++k) {\n    segment_softmax[k]" \
        in loops
    # dh[src[e], f] += ...: two segments may write one row; f innermost, serial (a data index
    # is written only inside the output, as the raw gradient's sum over its rows means)
    assert ("for (v = 0; v < 7; ++v) {\n  for (e = rowptr[v]; e < rowptr[v + 1]; ++e) {\n    for (f = 0; f < 4; ++f) {\n"
            "      if ((src[e] >= 0) & (src[e] < 7)) {\n        dmatmul_via_out[src[e]][f] +=") in loops
    assert "parallel for (v = 0; v < 7; ++v) {\n  for (e = rowptr[v]; e < rowptr[v + 1]; ++e) {\n    for (f = 0; f < 4; ++f) {\n      dmatmul_via_out" not in loops
    # a scatter over a plain edge loop (no ragged loop) is left alone
    assert "\nfor (e = 0; e < 19; ++e) {\n  if ((src[e] >= 0) & (src[e] < 7)) {\n    ds_via_pre[src[e]] +=" in loops


@pytest.mark.parametrize("seed", range(3))
def test_compiled_split_scatters_match_the_serial_kernel_bit_for_bit(seed):
    outs, inputs = gat_graph()
    arrays = gat_feed(inputs, seed)
    want = tg.evaluate(outs, dict(zip(inputs, arrays)))
    # without fast_math (no contraction into fused multiply-adds, which a vector loop may
    # do differently) the split scatters give the serial kernel's bits
    serial = tg.build(outs, inputs, threads=2, disabled_passes=OFF, fast_math=False)(*arrays)
    for threads in (1, 2):
        exact = tg.build(outs, inputs, threads=threads, fast_math=False)(*arrays)
        fast = tg.build(outs, inputs, threads=threads)(*arrays)
        for g, f, s, w, t in zip(exact, fast, serial, want, outs):
            np.testing.assert_array_equal(g, s, err_msg=t.name)
            np.testing.assert_allclose(f, w, rtol=1e-12, atol=1e-12, err_msg=t.name)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_decreasing_row_pointer_is_still_refused_by_the_split_scatters(threads):
    outs, inputs = gat_graph()
    arrays = gat_feed(inputs, 0)
    arrays[0] = np.array([0, 2, 9, 4, 9, 11, 13, 19])
    kernel = tg.build(outs, inputs, threads=threads)
    with pytest.raises(tg.UserError, match="runs backwards from 9 to 4"):
        kernel(*arrays)


def _balanced_rows_fn(extent, dtype="int64"):
    """The emitted mapping ``(P, lo, hi) -> (r(lo), r(hi))`` of :func:`codegen.ragged_split.balanced_range`."""
    import ctypes
    from codegen.jit import compile_module
    from codegen.llvm import ir
    from codegen.llvm_types import I64, MEMORY
    from codegen.ragged_split import balanced_range
    module = ir.Module(name="balance")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType(MEMORY[dtype]), I64, I64,
                                                             ir.PointerType(I64)]), "rows")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    p, lo, hi, out = fn.args
    r_lo, r_hi = balanced_range(b, fn, p, dtype, extent, lo, hi)
    b.store(r_lo, b.gep(out, [ir.Constant(I64, 0)]))
    b.store(r_hi, b.gep(out, [ir.Constant(I64, 1)]))
    b.ret_void()
    address = compile_module(str(module), ["rows"]).addresses["rows"]
    call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)(address)

    def rows(rp, lo, hi):
        rp = np.ascontiguousarray(rp, dtype=dtype)
        got = np.zeros(2, np.int64)
        call(rp.ctypes.data, lo, hi, got.ctypes.data)
        return tuple(int(g) for g in got)
    return rows


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_balanced_rows_tile_the_rows_for_any_data(dtype):
    """r(0) = 0, r(V) = V, r non-decreasing: consecutive chunks' rows tile [0, V) whatever the
    row pointer holds (sorted, skewed, unsorted, decreasing, negative), so no row is skipped
    or done twice."""
    V = 40
    rows = _balanced_rows_fn(V, dtype)
    rng = np.random.default_rng(3)
    skewed = np.concatenate([[0], np.cumsum(np.where(np.arange(V) == 7, 1000, 1))])
    cases = [skewed, np.sort(rng.integers(0, 500, V + 1)), rng.integers(-50, 500, V + 1),
             np.arange(V + 1)[::-1] * 3, np.zeros(V + 1, int), np.full(V + 1, -4)]
    for rp in cases:
        for chunks in (2, 3, 7, V):
            cuts = [V * k // chunks for k in range(chunks + 1)]
            mapped = [rows(rp, a, b) for a, b in zip(cuts, cuts[1:])]
            assert mapped[0][0] == 0 and mapped[-1][1] == V
            assert all(m[0] <= m[1] for m in mapped)
            assert all(x[1] == y[0] for x, y in zip(mapped, mapped[1:]))


def test_balanced_rows_share_the_edges():
    """Sorted data: each of two threads gets rows holding about half the edges (equal rows
    would give one thread 1010 of 1030)."""
    V = 40
    rows = _balanced_rows_fn(V)
    rp = np.concatenate([[0], np.cumsum(np.where(np.arange(V) >= 30, 100, 1))])
    (a, b), (c, d) = rows(rp, 0, V // 2), rows(rp, V // 2, V)
    assert (a, b, c, d) == (0, 35, 35, V)  # the first row reaching half the edges (515)
    assert (rp[b] - rp[a], rp[d] - rp[c]) == (530, 500)
    rp = np.arange(V + 1) * 5  # uniform: the plain split
    assert rows(rp, 0, V // 2) == (0, V // 2) and rows(rp, V // 2, V) == (V // 2, V)


def test_ragged_stages_split_rows_by_edges_and_compute_the_same_bits():
    outs, inputs = gat_graph(V=64, F=4, E=300)
    loops = tg.build(outs, inputs, threads=2).loops
    assert loops.count("// threads split the rows by the edges of rowptr") >= 6
    assert "edges of" not in tg.build(outs, inputs, threads=2, disabled_passes={"balance_ragged_rows"}).loops
    rng = np.random.default_rng(0)
    deg = np.where(np.arange(64) == 50, 200, 1) + np.r_[np.zeros(63, int), 300 - 200 - 63]
    rp = np.concatenate([[0], np.cumsum(deg)])
    arrays = gat_feed(inputs, 1, V=64, F=4, E=300)
    arrays[0], arrays[2] = rp, np.repeat(np.arange(64), deg)
    want = tg.evaluate(outs, dict(zip(inputs, arrays)))
    plain = tg.build(outs, inputs, threads=2, fast_math=False,
                     disabled_passes={"balance_ragged_rows"})(*arrays)
    for threads in (1, 2):
        got = tg.build(outs, inputs, threads=threads, fast_math=False)(*arrays)
        for g, p, w, t in zip(got, plain, want, outs):
            np.testing.assert_array_equal(g, p, err_msg=t.name)
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=t.name)
