"""Ops written several ways (te_grad.formulations): each one exact in every stage, the
formulations of one op equal to each other, and the scheduling decisions they rely on."""
import numpy as np
import pytest

import te_grad as tg
from codegen.loop_order import loop_order
from te_grad.formulations import FORMULATIONS
from te_grad.testing import check_gradients

ALL = [(op, name) for op, names in FORMULATIONS.items() for name in names]


def small(name, dtype="float64"):
    op = next(o for o, names in FORMULATIONS.items() if name in names)
    return FORMULATIONS[op][name](dtype, small=True)


@pytest.mark.parametrize("op,name", ALL, ids=[n for _, n in ALL])
def test_formulation_compiled_matches_evaluator_and_finite_differences(op, name):
    work = small(name)
    feed = work.feed(np.random.default_rng(len(name)))
    head = tg.placeholder(work.output.shape, dtype="float64", name="H")
    feed[head] = np.random.default_rng(1).standard_normal(head.shape)
    raw = tg.differentiate(work.output, work.inputs, head=head, simplify=False)
    simp = tg.differentiate(work.output, work.inputs, head=head)
    want = tg.evaluate([work.output] + list(raw), feed)
    order = work.inputs + [head]
    got = tg.build([work.output] + list(simp), order, threads=2)(*[feed[t] for t in order])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    check_gradients(work.output, work.inputs, {x: feed[x] for x in work.inputs}, grads=simp, head=head,
                    head_value=feed[head], full_limit=40)


def _same_data(name, canonical):
    """The canonical (first formulation's) inputs laid out as formulation ``name`` reads them."""
    if name == "conv_nhwc":
        x, w = canonical
        return [x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)]  # NCHW -> NHWC, OIHW -> HWIO
    if name == "dense_io":
        x, w = canonical
        return [x, w.T]
    if name == "bmm_transposed":
        a, b = canonical
        return [a.transpose(0, 2, 1), b.transpose(0, 2, 1)]
    return list(canonical)


@pytest.mark.parametrize("op", sorted(FORMULATIONS))
def test_formulations_of_one_op_compute_the_same_function(op):
    names = list(FORMULATIONS[op])
    first = small(names[0])
    rng = np.random.default_rng(7)
    canonical = [rng.standard_normal(x.shape) for x in first.inputs]
    want = tg.evaluate([first.output], dict(zip(first.inputs, canonical)))[0]
    for name in names[1:]:
        work = small(name)
        got = tg.build([work.output], work.inputs)(*_same_data(name, canonical))
        if name == "conv_nhwc":
            got = got.transpose(0, 3, 1, 2)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_register_block_with_lanes_scattered_in_the_output(dtype):
    """A^T B^T: lanes run along i, contiguous in A but 40 apart in the output; the
    accumulators stay in registers and are stored element by element."""
    a = tg.placeholder((3, 7, 37), dtype=dtype, name="A")
    b = tg.placeholder((3, 40, 7), dtype=dtype, name="B")
    y = tg.nn.batch_matmul(a, b, transpose_a=True, transpose_b=True)
    rng = np.random.default_rng(3)
    av, bv = rng.standard_normal(a.shape).astype(dtype), rng.standard_normal(b.shape).astype(dtype)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for threads in (1, 2):
        got = tg.build([y], [a, b], threads=threads)(av, bv)
        np.testing.assert_allclose(got, np.einsum("tki,tjk->tij", av, bv), rtol=tol, atol=tol)


def test_lanes_go_where_reads_are_contiguous_not_only_the_store():
    """The policy's choice for A^T B^T: lanes along i (A[t, k, i] contiguous, B invariant)
    rather than j (contiguous store but B[t, j, k] gathered) or k (A gathered)."""
    a, b = tg.placeholder((4, 16, 64), name="A"), tg.placeholder((4, 64, 16), name="B")
    y = tg.nn.batch_matmul(a, b, transpose_a=True, transpose_b=True)
    red = y.op.body
    t, i, j = y.op.axes
    order, parallel = loop_order(y.op.axes, y.shape, red.axes, [r.indices for r in tg.graph.reads_in(red)],
                                 (t, i, j))
    assert order[-1] is i and parallel is t
    # and for the plain product the contiguous store and B decide: lanes along j
    a2, b2 = tg.placeholder((2, 64, 16), name="A"), tg.placeholder((2, 16, 64), name="B")
    y2 = tg.nn.batch_matmul(a2, b2)
    order2, _ = loop_order(y2.op.axes, y2.shape, y2.op.body.axes,
                           [r.indices for r in tg.graph.reads_in(y2.op.body)], tuple(y2.op.axes))
    assert order2[-1] is y2.op.axes[2]


def test_a_narrow_piece_puts_its_lanes_on_a_longer_axis():
    """The one-column edge of a padded convolution vectorizes along another axis."""
    x, w = tg.placeholder((1, 2, 16, 16), name="X"), tg.placeholder((16, 2, 3, 3), name="W")
    y = tg.nn.conv2d(x, w, padding=1)
    red = y.op.body
    accesses = [r.indices for r in tg.graph.reads_in(red)]
    n, f, h, v = y.op.axes
    whole, _ = loop_order(y.op.axes, y.shape, red.axes, accesses, (n, f, h, v))
    edge, _ = loop_order(y.op.axes, y.shape, red.axes, accesses, (n, f, h, v), piece=(1, 16, 14, 1))
    assert whole[-1] is v and edge[-1] is not v


def test_between_equal_costs_lanes_take_the_smaller_stride():
    """A padded convolution's edge column at batch 32: lanes along the batch would gather
    from X[n, ...] and scatter into Y[n, ...] 128 KB apart (71 ms instead of 11 ms for the
    whole forward); along the filters they step W by 288 and Y by 1024 elements."""
    x, w = tg.placeholder((32, 32, 32, 32), name="X"), tg.placeholder((32, 32, 3, 3), name="W")
    y = tg.nn.conv2d(x, w, padding=1)
    red = y.op.body
    reads = tg.graph.reads_in(red)
    n, f, h, v = y.op.axes
    edge, _ = loop_order(y.op.axes, y.shape, red.axes, [r.indices for r in reads], (n, f, h, v),
                         reads=reads, piece=(32, 32, 1, 1))
    assert edge[-1] is f
