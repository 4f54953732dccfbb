"""Running reductions compiled as scans (codegen/scan.py), compared with the reference evaluator.

A reduction whose upper (or lower) bound moves with one output axis while the
body does not read it is computed in linear time, each element extending the
previous one; anything else keeps the direct reduction.
"""
import numpy as np
import te_grad as tg
from codegen.loopir import Carried, Scan, loops, loops_of_kind

from test_codegen import assert_kernel_matches


def _feed(rng, *tensors):
    return {t: rng.standard_normal(t.shape) for t in tensors}


def _scanned(kern):
    """The tensors whose running value is carried in a register (a Carried loop)."""
    return sorted(Scan.of(lp).store.tensor.name for cs in kern.stages for lp in loops_of_kind(cs.stage.body, Carried))


def test_cumsum_and_its_gradient():
    x = tg.placeholder((37, 45), dtype="float64", name="X")
    k = tg.reduce_axis((0, 45), "k")
    y = tg.compute((37, 45), lambda i, j: tg.sum(x[i, k], axis=k, where=k <= j), name="cumsum")
    head = tg.placeholder(y.shape, dtype="float64", name="head")
    (dx,) = tg.gradient(y, [x], head=head)  # a suffix sum: the reverse scan
    rng = np.random.default_rng(0)
    kern, _ = assert_kernel_matches([y, dx], [x, head], _feed(rng, x, head), rtol=1e-9, atol=1e-11,
                                    scaled=True)
    assert _scanned(kern) == ["cumsum", "dX"]


def test_running_max_and_product_with_a_condition_and_an_offset():
    x = tg.placeholder((6, 30), dtype="float64", name="X")
    k = tg.reduce_axis((0, 30), "k")
    cummax = tg.compute((6, 28), lambda i, j: tg.max(x[i, k], axis=k, where=k < j + 3), name="cummax")
    k2 = tg.reduce_axis((0, 30), "k2")
    cumprod = tg.compute((6, 30), lambda i, j: tg.prod(1.0 + 0.01 * x[i, k2], axis=k2,
                                                       where=(k2 <= j) & (k2 % 3 != 1)), name="cumprod")
    k3 = tg.reduce_axis((0, 30), "k3")
    suffix = tg.compute((6, 30), lambda i, j: tg.sum(x[i, k3] * x[i, k3], axis=k3, where=k3 >= j),
                        name="suffix")
    rng = np.random.default_rng(3)
    kern, _ = assert_kernel_matches([cummax, cumprod, suffix], [x], _feed(rng, x), scaled=True)
    assert _scanned(kern) == ["cummax", "cumprod", "suffix"]


def test_scan_along_an_outer_axis_vectorizes_across_the_inner_one():
    x = tg.placeholder((40, 33), dtype="float64", name="X")
    k = tg.reduce_axis((0, 40), "k")
    y = tg.compute((40, 33), lambda i, j: tg.sum(x[k, j], axis=k, where=k <= i), name="down")
    kern, _ = assert_kernel_matches([y], [x], _feed(np.random.default_rng(4), x), scaled=True)
    (stage,) = [cs.stage for cs in kern.stages]
    step = next(lp for lp in loops(stage.body) if lp.var.name == "is")  # the scan step
    assert int(step.hi.value) == 40 and any(lp.var.name == "j" for lp in loops(step.body))  # j inside it
    assert _scanned(kern) == []


def test_sliding_windows_and_shrinking_bounds_stay_direct():
    x = tg.placeholder((50,), dtype="float64", name="X")
    k = tg.reduce_axis((0, 50), "k")
    window = tg.compute((45,), lambda j: tg.sum(x[k], axis=k, where=(k >= j) & (k < j + 6)), name="window")
    k2 = tg.reduce_axis((0, 50), "k2")
    shrinking = tg.compute((50,), lambda j: tg.sum(x[k2], axis=k2, where=k2 < 50 - j), name="shrinking")
    kern, _ = assert_kernel_matches([window, shrinking], [x], _feed(np.random.default_rng(5), x),
                                    scaled=True)
    assert _scanned(kern) == []


def test_a_scan_under_a_batch_known_at_run_time():
    """A cumsum along axis 1 of a (batch, 9, 3) tensor whose batch is a size variable, and its
    gradient, both scans with the batch split among threads: the batch's extent once went into a
    constant (a UserError), then into the stage's split extent as an expression (a UserError at
    emission), and an imported model with a cumsum after a dynamic batch lost its one step
    kernel for every batch size."""
    batch = tg.var("batch", min=1)
    x = tg.placeholder((batch, 9, 3), dtype="float64", name="X")
    k = tg.reduce_axis((0, 9), "k")
    y = tg.compute((batch, 9, 3), lambda b, j, c: tg.sum(x[b, k, c], axis=k, where=k <= j), name="cumsum")
    head = tg.placeholder(y.shape, dtype="float64", name="head")
    (dx,) = tg.gradient(y, [x], head=head)
    for threads in (1, 2):
        kern = tg.build([y, dx], [x, head], threads=threads)
        assert _scanned(kern) == ["cumsum", "dX"]
        rng = np.random.default_rng(threads)
        for n in (1, 4, 7):
            a, h = rng.standard_normal((n, 9, 3)), rng.standard_normal((n, 9, 3))
            got_y, got_dx = kern(a, h)
            np.testing.assert_allclose(got_y, np.cumsum(a, axis=1), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(got_dx, np.cumsum(h[:, ::-1], axis=1)[:, ::-1], rtol=1e-12, atol=1e-12)
