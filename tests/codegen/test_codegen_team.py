"""The thread team: shared runs are claimed in chunks by native workers and the calling thread.

Every run is forced onto the team (threshold 0) so that small graphs exercise it; results
must equal the evaluator's whatever the thread count, whether the workers are spinning,
asleep or busy with another caller, and a failing chunk must be reported like any error.
"""
import os
import threading
import time

import numpy as np
import pytest

import codegen
import te_grad as tg
from codegen.options import Thresholds
from te_grad import nn
from codegen import team as team_module

@pytest.fixture
def always_parallel():
    """Kernels built in the test split every run of stages among their threads."""
    with codegen.compile_options(thresholds=Thresholds(min_parallel_work=0)):
        yield


@pytest.fixture
def sleepy_team(monkeypatch):
    """A team whose workers sleep as soon as a job is over (no spinning), in place of the
    process's team for the test."""
    with codegen.compile_options(spin_us=0):  # inside any options a fixture before it set
        crew = team_module.Team()
    assert crew._spin_ns == 0
    monkeypatch.setattr(team_module, "_team", crew)
    yield crew
    crew.stop()


def _softmax_and_gradient(rows=37, cols=19, seed=0):
    rng = np.random.default_rng(seed)
    x = tg.placeholder((rows, cols), dtype="float64", name="X")
    y = nn.softmax(x)
    h = tg.placeholder(y.shape, dtype="float64", name="H")
    outs = [y] + list(tg.gradient(y, [x], head=h))
    feed = {x: rng.standard_normal(x.shape), h: rng.standard_normal(h.shape)}
    return outs, [x, h], feed


def _check_calls(kern, outs, inputs, feed, calls):
    expected = tg.evaluate(outs, feed)
    arrays = [feed[t] for t in inputs]
    for _ in range(calls):
        got = kern(*arrays)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("threads", [2, 3, 4])
def test_shared_runs_match_the_evaluator(always_parallel, threads):
    outs, inputs, feed = _softmax_and_gradient()
    kern = tg.build(outs, inputs, threads=threads)
    assert all(run.chunks == threads for run in kern.plan())
    assert team_module.team(threads).workers >= threads - 1
    _check_calls(kern, outs, inputs, feed, calls=300)


def test_workers_take_chunks():
    """Chunks of a few hundred microseconds: a worker claims some of them (on a loaded
    machine the caller may take all of a short run, so this one is long, and the test
    gives the workers up to ten seconds of calls)."""
    x = tg.placeholder((2048, 1000), name="X")
    kern = tg.build([nn.softmax(x)], [x], threads=2)
    assert kern.plan()[0].chunks == 2
    crew = team_module.team(2)
    before = crew.worker_chunks
    a = np.random.default_rng(4).standard_normal(x.shape).astype("float32")
    expected = tg.evaluate([nn.softmax(x)], {x: a})[0]
    deadline = time.monotonic() + 10.0
    while crew.worker_chunks == before and time.monotonic() < deadline:
        np.testing.assert_allclose(kern(a), expected, rtol=1e-5, atol=1e-7)
    assert crew.worker_chunks > before, "no worker ever ran a chunk"


def test_workers_that_sleep_between_calls_are_woken_and_never_waited_for(always_parallel, sleepy_team):
    outs, inputs, feed = _softmax_and_gradient(rows=64, cols=33, seed=1)
    kern = tg.build(outs, inputs, threads=3)
    _check_calls(kern, outs, inputs, feed, calls=200)
    assert sleepy_team.workers == 2


def test_kernels_called_from_several_threads_at_once(always_parallel):
    """Callers that find the team busy run their plans alone: every result still exact."""
    graphs = [_softmax_and_gradient(rows=41, cols=23, seed=s) for s in range(3)]
    kernels = [tg.build(outs, inputs, threads=2) for outs, inputs, _ in graphs]
    failures = []

    def caller(k):
        try:
            _check_calls(kernels[k % 3], *graphs[k % 3], calls=150)
        except Exception as exc:  # reported below, in the test's own thread
            failures.append(exc)

    callers = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for c in callers:
        c.start()
    for c in callers:
        c.join()
    assert not failures, failures[0]


def test_an_index_out_of_range_in_a_shared_chunk_is_reported_and_the_team_goes_on(always_parallel):
    table = tg.placeholder((50, 8), name="table")
    ids = tg.placeholder((64,), dtype="int32", name="ids")
    y = tg.compute((64, 8), lambda i, j: table[ids[i], j] * 2.0, name="y")
    kern = tg.build([y], [table, ids], threads=2)
    assert kern.plan()[0].chunks == 2
    t = np.random.default_rng(2).standard_normal((50, 8)).astype("float32")
    good = np.arange(64, dtype="int32") % 50
    for bad_row in (3, 60):  # in the first chunk and in the second
        bad = good.copy()
        bad[bad_row] = 77
        with pytest.raises(tg.TeGradError, match="index 77 is out of range"):
            kern(t, bad)
        np.testing.assert_array_equal(kern(t, good), t[good] * 2.0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_runs_threaded_kernels(always_parallel):
    outs, inputs, feed = _softmax_and_gradient(rows=30, cols=11, seed=3)
    kern = tg.build(outs, inputs, threads=2)
    _check_calls(kern, outs, inputs, feed, calls=5)  # the parent's team is running
    pid = os.fork()
    if pid == 0:  # the child: a team of its own, then exit without pytest's teardown
        code = 1
        try:
            _check_calls(kern, outs, inputs, feed, calls=20)
            code = 0 if team_module.team(2).worker_chunks >= 0 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_plans_merge_small_runs_and_share_big_ones():
    x = tg.placeholder((512, 1000), name="X")
    kern = tg.build([nn.softmax(x)], [x], threads=2)
    assert [run.chunks for run in kern.plan()] == [2]
    assert [run.chunks for run in kern.plan(1)] == [0]
    # three regions (the transposed read starts a new one), each too small to share: one run
    s = tg.placeholder((8, 10), name="S")
    t = tg.compute((10, 8), lambda i, j: s[j, i] * 2.0, name="t")
    u = tg.compute((8, 10), lambda i, j: t[j, i] + 1.0, name="u")
    small = tg.build([u], [s], threads=2)
    assert len(small.regions) >= 2
    assert [(run.first, run.last, run.chunks) for run in small.plan()] == [(0, len(small.stages), 0)]


def test_a_transposed_copy_splits_the_batch_like_its_reader():
    """A.T @ B.T reads a transposed copy of B; the copy is split among threads by batch, as the
    product is, so the two are one region (each thread copies the batches it multiplies)."""
    from te_grad.formulations import bmm_transposed
    w = bmm_transposed("float32")
    kern = tg.build([w.output], w.inputs, threads=2)
    names = [cs.stage.tensor.name for cs in kern.stages]
    assert names == ["B_packed", "batch_matmul"]
    assert [(run.first, run.last, run.chunks) for run in kern.plan()] == [(0, 2, 2)]
    assert kern.stages[0].stage.parallel_axis is kern.stages[0].stage.tensor.op.axes[0]
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal(t.shape).astype("float32") for t in w.inputs)
    np.testing.assert_allclose(kern(a, b), tg.evaluate([w.output], {w.inputs[0]: a, w.inputs[1]: b})[0],
                               rtol=1e-4, atol=1e-4)


def test_thread_counts_are_checked_and_any_count_is_safe(monkeypatch):
    """A thread count that is not a positive int is a UserError; one beyond what the team's
    claim word holds (255 threads) runs with that many at most, never hangs."""
    x = tg.placeholder((512, 40), name="X")
    y = nn.softmax(x)
    for bad in (0, -1, 2.5, "2", True):
        with pytest.raises(tg.UserError, match="threads must be a positive int"):
            tg.build([y], [x], threads=bad)
    assert tg.build([y], [x], threads=np.int64(2)).threads == 2
    with codegen.compile_options(spin_us=0):  # inside any options a fixture before it set
        crew = team_module.Team()
    assert crew._spin_ns == 0
    monkeypatch.setattr(team_module, "_team", crew)
    try:
        kern = tg.build([y], [x], threads=300)
        assert kern.plan()[0].chunks == 300
        a = np.random.default_rng(8).standard_normal(x.shape).astype("float32")
        np.testing.assert_allclose(kern(a), tg.evaluate([y], {x: a})[0], rtol=1e-5, atol=1e-7)
        assert crew.workers == 254
    finally:
        crew.stop()
    monkeypatch.setenv("TE_GRAD_NUM_THREADS", "lots")
    with pytest.raises(tg.UserError, match="TE_GRAD_NUM_THREADS"):
        tg.build([y], [x])


@pytest.mark.parametrize("extent,chunks,granule", [(16, 2, 3), (64, 2, 6), (19, 19, 10), (5, 4, 4), (37, 3, 1),
                                                   (100, 7, 6), (3, 2, 6)])
def test_the_team_splits_a_run_where_chunk_bounds_says(extent, chunks, granule):
    """The native team's chunks are :func:`codegen.regions.chunk_bounds`'s: each starts at the
    multiple of the granule nearest its share, so 16 rows in blocks of 3 split 9 / 7 (rounding
    down gave 6 / 10: one thread did 62% of the work). Recorded by a run function that notes
    the range of every chunk it is handed."""
    import ctypes
    from codegen import team_ir
    from codegen.regions import chunk_bounds
    seen, lock = [], threading.Lock()

    @ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                      ctypes.c_int64, ctypes.c_void_p)
    def run(table, first, last, lo, hi, err):
        with lock:
            seen.append((lo, hi))
        return 0

    bounds = chunk_bounds(extent, chunks, granule)
    assert bounds[0][0] == 0 and bounds[-1][1] == extent
    assert all(a[1] == b[0] and a[0] <= a[1] for a, b in zip(bounds, bounds[1:]))
    assert all(lo % granule == 0 or lo == extent for lo, _ in bounds)
    share = extent / chunks
    assert all(abs(lo - k * share) <= granule / 2 or lo == extent for k, (lo, _) in enumerate(bounds))
    crew = team_module.team(2)
    record = np.zeros((1, team_ir.RECORD), dtype=np.int64)
    record[0, :team_ir.REC_GRANULE + 1] = (0, 1, 0, extent, chunks, 2, granule)
    err = (ctypes.c_int64 * 4)()
    table = (ctypes.c_void_p * 1)()
    crew.wake()
    rc = crew.run_plan(crew.address, record.ctypes.data, 1, ctypes.cast(run, ctypes.c_void_p), None, table,
                       ctypes.addressof(err))
    assert rc == 0
    assert sorted(seen) == [b for b in bounds if b[1] > b[0]]
    if (extent, chunks, granule) == (16, 2, 3):
        assert bounds == [(0, 9), (9, 16)]
