"""Parallel regions: consecutive stages that threads run without waiting for each other.

Every stage is forced onto the thread team (threshold 0) so that the regions
are exercised on small shapes; results must equal the evaluator's.
"""
import numpy as np
import pytest

import importlib

import codegen
import te_grad as tg
from codegen.options import Thresholds
from te_grad import nn

from test_codegen import assert_kernel_matches, assert_same


regions_module = importlib.import_module("codegen.regions")  # codegen.regions is also a function's name


@pytest.fixture
def always_parallel():
    """Kernels built in the test split every run of stages among their threads."""
    with codegen.compile_options(thresholds=Thresholds(min_parallel_work=0)):
        yield


def _with_gradient(y, inputs, rng):
    head = tg.placeholder(y.shape, dtype="float64", name="head")
    grads = list(tg.gradient(y, inputs, head=head))
    feed = {t: rng.standard_normal(t.shape) for t in inputs + [head]}
    return [y] + grads, inputs + [head], feed


def _graphs():
    rng = np.random.default_rng(0)
    x = tg.placeholder((13, 17), dtype="float64", name="X")
    yield "softmax", _with_gradient(nn.softmax(x), [x], rng)
    g = tg.placeholder((17,), dtype="float64", name="g")
    b = tg.placeholder((17,), dtype="float64", name="b")
    yield "layer_norm", _with_gradient(nn.layer_norm(x, g, b), [x, g, b], rng)
    q, k, v = (tg.placeholder((3, 9, 5), dtype="float64", name=n) for n in "QKV")
    att = nn.batch_matmul(nn.softmax(nn.batch_matmul(q, k, transpose_b=True)), v)
    yield "attention", _with_gradient(att, [q, k, v], rng)
    xi = tg.placeholder((2, 3, 10, 10), dtype="float64", name="XI")
    w = tg.placeholder((4, 3, 3, 3), dtype="float64", name="W")
    yield "conv_s2", _with_gradient(nn.conv2d(xi, w, stride=2, padding=1), [xi, w], rng)
    kk = tg.reduce_axis((0, 17), "kk")
    yield "cumsum", _with_gradient(tg.compute((13, 17), lambda i, j: tg.sum(x[i, kk], axis=kk, where=kk <= j),
                                              name="cumsum"), [x], rng)


@pytest.mark.parametrize("name,graph", list(_graphs()), ids=[n for n, _ in _graphs()])
@pytest.mark.parametrize("threads", [2, 3])
def test_regions_match_the_evaluator(always_parallel, name, graph, threads):
    outs, inputs, feed = graph
    kern, _ = assert_kernel_matches(outs, inputs, feed, threads=threads, rtol=1e-9, atol=1e-11, scaled=True)
    assert all(run.chunks == threads for run in kern.plan())


def test_row_local_stages_share_one_region_and_a_transposed_read_starts_another(always_parallel):
    x = tg.placeholder((30, 20), dtype="float64", name="X")
    k = tg.reduce_axis((0, 20), "k")
    rows = tg.compute((30,), lambda i: tg.sum(x[i, k] * x[i, k], axis=k), name="rows")
    scaled = tg.compute((30, 20), lambda i, j: x[i, j] / (1.0 + rows[i]), name="scaled")
    k2 = tg.reduce_axis((0, 20), "k2")
    again = tg.compute((30,), lambda i: tg.max(scaled[i, k2], axis=k2), name="again")
    crossed = tg.compute((30, 30), lambda i, j: again[j] - scaled[i, 0] * again[i], name="crossed")
    feed = {x: np.random.default_rng(1).standard_normal(x.shape)}
    kern, _ = assert_kernel_matches([crossed], [x], feed, threads=3, rtol=1e-12, atol=1e-12)
    names = [cs.stage.tensor.name for cs in kern.stages]
    regions = [[names[n] for n in range(a, b)] for a, b in kern.regions]
    assert ["rows", "scaled", "again"] in regions and ["crossed"] in regions


@pytest.mark.parametrize("threads", [2, 3, 5])
@pytest.mark.parametrize("rows", [24, 36, 64])
def test_jammed_split_axis_gives_threads_whole_blocks(always_parallel, threads, rows):
    """Contractions jam the axis threads split: each thread gets whole blocks of it."""
    x = tg.placeholder((rows, 40), dtype="float64", name="X")
    w = tg.placeholder((24, 40), dtype="float64", name="W")
    y = nn.dense(x, w)
    outs, inputs, feed = _with_gradient(y, [x, w], np.random.default_rng(rows))
    kern, _ = assert_kernel_matches(outs, inputs, feed, threads=threads, rtol=1e-9, atol=1e-11, scaled=True)
    granules = {cs.stage.parallel_granule for cs in kern.stages}
    assert granules - {1}, "no stage jammed its split axis"


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Every multi-stage region runs in blocks of as few rows as its granule allows."""
    monkeypatch.setattr(regions_module, "REGION_CACHE_BYTES", 0)
    monkeypatch.setattr(regions_module, "BLOCK_BYTES", 1)


def _dense_jammed():
    x = tg.placeholder((36, 40), dtype="float64", name="X")
    w = tg.placeholder((24, 40), dtype="float64", name="W")
    return _with_gradient(nn.dense(x, w), [x, w], np.random.default_rng(5))


@pytest.mark.parametrize("name,graph", list(_graphs()) + [("dense_jammed", _dense_jammed())],
                         ids=[n for n, _ in _graphs()] + ["dense_jammed"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_regions_run_in_blocks_of_rows_match_the_evaluator(tiny_blocks, always_parallel, name, graph, threads):
    outs, inputs, feed = graph
    kern, _ = assert_kernel_matches(outs, inputs, feed, threads=threads, rtol=1e-9, atol=1e-11, scaled=True)
    blocked = [(first, last, block) for (first, last), block in zip(kern.regions, kern.blocks) if block]
    if name in ("softmax", "layer_norm", "dense_jammed"):  # regions of several row-local stages
        assert blocked, "no region ran in blocks"
    for first, last, block in blocked:
        extent = kern.stages[first].stage.parallel_extent
        assert 0 < block < extent
        for cs in kern.stages[first:last]:
            assert block % cs.stage.parallel_granule == 0


def test_big_regions_are_blocked_and_small_ones_are_not():
    """Blocks only where a region's tensors outgrow the cache: softmax's backward over 4096
    rows of 1000 (some 16 MB per tensor), not over 16 rows."""
    for rows, want in ((4096, True), (16, False)):
        x = tg.placeholder((rows, 1000), name="X")
        y = nn.softmax(x)
        h = tg.placeholder(y.shape, name="H")
        kern = tg.build(tg.gradient(y, [x], head=h), [x, h], threads=1)
        assert any(kern.blocks) == want
        assert not any(run.chunks for run in kern.plan())


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("rows,factor,rest", [(50, 6, 2), (53, 6, None), (64, 6, 2), (60, 6, 0), (51, 6, 3)])
def test_the_split_axis_is_jammed_for_the_most_accumulators_and_its_remainder_in_blocks_dividing_it(
        always_parallel, threads, rows, factor, rest):
    """Rows of 64 lanes span several vector registers, so 6 rows of 2 or more registers keep
    more accumulators busy than 8 rows of one: the split axis is jammed by 6 even where 6 does
    not divide it, and its last rows form a remainder, jammed by a divisor of 6 dividing the
    rows (2 for rows 48..50 and 60..64, 3 for rows 48..51), else one row at a time (48..53):
    3 rows of 4 registers would keep as many busy, but with more loads per multiply-add. The
    threads take ranges of whole blocks of 6 rows (the remainder adds nothing to the stage's
    granule), and the interpreter and the kernel agree with the evaluator at every thread count."""
    from codegen.interpret import run
    from codegen.loopir import RegisterBlocked, loops
    from codegen.schedule import stages_for

    x = tg.placeholder((rows, 40), dtype="float64", name="X")
    w = tg.placeholder((64, 40), dtype="float64", name="W")
    y = nn.dense(x, w)
    (stage,) = [s for s in stages_for([y]) if s.tensor is y]
    blocks = [lp for lp in loops(stage.body) if isinstance(lp.kind, RegisterBlocked)]
    assert [j.factor for j in blocks[0].kind.jams if j.var.name == "i"] == [factor]
    whole = rows // factor * factor
    split = [lp for lp in loops(stage.body) if lp.parallel and lp.scale > 1]
    assert [(lp.scale, lp.lo.value * lp.scale, lp.hi.value * lp.scale) for lp in split] == \
        [(factor, 0, whole)] + ([(rest, whole, rows)] if rest else [])
    assert len(blocks) == (1 if rest == 0 else 2) and stage.parallel_granule == factor
    if rest != 0:
        assert [j.factor for j in blocks[1].kind.jams if j.var.name == "i"] == ([rest] if rest else [])
    feed = {t: np.random.default_rng(rows).standard_normal(t.shape) for t in (x, w)}
    assert_same(run(stages_for([y]), feed)[id(y)], tg.evaluate([y], feed)[0], rtol=1e-12, atol=1e-12,
                what="interpreted vs evaluator")
    outs, inputs, feed = _with_gradient(y, [x, w], np.random.default_rng(rows))
    kern, _ = assert_kernel_matches(outs, inputs, feed, threads=threads, rtol=1e-9, atol=1e-11, scaled=True)
    assert all(r.chunks == (threads if threads > 1 else 0) for r in kern.plan())


def test_a_run_time_batch_of_sequences_is_jammed_six_rows_of_two_registers():
    """``Y[b, s, :] = X[b, s, :] @ W`` over a run-time batch (a transformer's linear layer on
    (batch, seq, d)): the jam is chosen over the sequence axis and the batch together, 6 rows
    (``s`` by 2, ``b`` by 3: 6 broadcasts and 2 vector loads per 12 multiply-adds), where
    jamming ``s`` by 4 first left room for ``b`` by 2 only (8 rows of one register: 9 loads
    for 8). The batches past the last whole block of 3 run one at a time; the kernel agrees
    with the evaluator at batches that are and are not multiples of 3."""
    from codegen.loopir import RegisterBlocked, loops
    from codegen.machine import Machine
    from codegen.schedule import stages_for

    b = tg.var("batch", min=1)
    x = tg.placeholder((b, 8, 32), name="X")
    w = tg.placeholder((32, 64), name="W")
    k = tg.reduce_axis(32, "k")
    y = tg.compute((b, 8, 64), lambda i, j, l: tg.sum(x[i, j, k] * w[k, l], axis=k), name="Y")
    avx2 = Machine(vector_bits=256, vector_registers=16)
    (stage,) = [s for s in stages_for([y], avx2) if s.tensor is y]
    blocks = [lp for lp in loops(stage.body) if isinstance(lp.kind, RegisterBlocked)]
    assert sorted((j.var.name, j.factor) for j in blocks[0].kind.jams) == [("i", 3), ("j", 2)]
    assert [(j.var.name, j.factor) for j in blocks[1].kind.jams] == [("j", 2)]  # the last batches
    kern = tg.build([y], [x, w], threads=1)
    rng = np.random.default_rng(0)
    for batch in (4, 6, 7):
        feed = {x: rng.standard_normal((batch, 8, 32)).astype(np.float32),
                w: rng.standard_normal((32, 64)).astype(np.float32)}
        assert_same(kern(feed[x], feed[w]), tg.evaluate([y], feed)[0], rtol=1e-5, atol=1e-5)


def test_among_jams_of_equal_loads_the_fewest_copies_each_holding_more_of_the_row():
    """``Y[i, lb, :] = X[i, :] @ P[lb, :, :]`` (a weight packed in panels of 16 columns): jamming
    ``i`` by 6 (6 copies of 2 registers) and ``i`` by 6 with ``lb`` by 2 (12 copies of one) keep
    12 accumulators busy with 10 weighted loads each; the first reads each panel row whole
    (64 contiguous bytes per step) and is the one chosen (on AVX2 it ran at 85 GFLOP/s where
    the other ran at 35)."""
    from codegen.loopir import RegisterBlocked, loops
    from codegen.machine import Machine
    from codegen.schedule import stages_for

    x = tg.placeholder((96, 64), name="X")
    p = tg.placeholder((8, 64, 16), name="P")
    k = tg.reduce_axis(64, "k")
    y = tg.compute((96, 8, 16), lambda i, lb, li: tg.sum(x[i, k] * p[lb, k, li], axis=k), name="Y")
    (stage,) = [s for s in stages_for([y], Machine(vector_bits=256, vector_registers=16)) if s.tensor is y]
    blocks = [lp for lp in loops(stage.body) if isinstance(lp.kind, RegisterBlocked)]
    assert [[(j.var.name, j.factor) for j in b.kind.jams] for b in blocks] == [[("i", 6)]]
    feed = {x: np.random.default_rng(1).standard_normal((96, 64)).astype(np.float32),
            p: np.random.default_rng(2).standard_normal((8, 64, 16)).astype(np.float32)}
    assert_same(tg.build([y], [x, p], threads=1)(feed[x], feed[p]), tg.evaluate([y], feed)[0], rtol=1e-5, atol=1e-5)
