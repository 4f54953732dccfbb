"""tg.nn.segment_sum / segment_max / segment_softmax: CSR segments as ragged loops."""
import numpy as np
import pytest
import torch

import te_grad as tg
from te_grad.ir import ScatterOp
from te_grad.testing import check_gradients
from tests.oracle.test_ragged_oracle import random_csr

OPS = [tg.nn.segment_sum, tg.nn.segment_max, tg.nn.segment_softmax]


def numpy_segment(name, x, rp):
    S = len(rp) - 1
    if name == "segment_softmax":
        out = np.zeros_like(x)
        for s in range(S):
            seg = x[rp[s]:rp[s + 1]]
            if len(seg):
                ex = np.exp(seg - seg.max(axis=0))
                out[rp[s]:rp[s + 1]] = ex / ex.sum(axis=0)
        return out
    out = np.zeros((S,) + x.shape[1:], dtype=x.dtype)
    for s in range(S):
        seg = x[rp[s]:rp[s + 1]]
        if len(seg):
            out[s] = seg.sum(axis=0) if name == "segment_sum" else seg.max(axis=0)
    return out


def graph(op, E=11, S=5, tail=(3,), dtype="float64"):
    rowptr = tg.placeholder((S + 1,), dtype="int64", name="rowptr")
    x = tg.placeholder((E,) + tail, dtype=dtype, name="x")
    return rowptr, x, op(x, rowptr)


@pytest.mark.parametrize("tail", [(), (3,), (2, 2)])
@pytest.mark.parametrize("op", OPS, ids=lambda f: f.__name__)
def test_values_match_numpy(op, tail):
    rng = np.random.default_rng(len(tail))
    rowptr, x, y = graph(op, tail=tail)
    for _ in range(3):
        rp, _ = random_csr(rng, 5, 11)
        xv = rng.standard_normal((11,) + tail)
        got, = tg.evaluate([y], {rowptr: rp, x: xv})
        np.testing.assert_allclose(got, numpy_segment(op.__name__, xv, rp), rtol=1e-12, atol=1e-12)


def test_segment_max_of_an_empty_segment_is_torch_scatter_reduce_zero_init():
    rowptr, x, y = graph(tg.nn.segment_max, E=6, S=4, tail=(2,))
    rp = np.array([0, 2, 2, 6, 6])
    xv = -1 - np.random.default_rng(0).random((6, 2))  # all negative: the empty segments' 0 is no max
    got, = tg.evaluate([y], {rowptr: rp, x: xv})
    index = torch.tensor(np.repeat(np.arange(4), np.diff(rp)))
    want = torch.zeros(4, 2, dtype=torch.float64).scatter_reduce(
        0, index[:, None].expand(6, 2), torch.tensor(xv), "amax", include_self=False)
    np.testing.assert_array_equal(got, want.numpy())
    assert (got[[1, 3]] == 0).all()


def test_segment_softmax_sums_to_one_per_segment_and_is_zero_outside():
    rowptr, x, y = graph(tg.nn.segment_softmax, E=8, S=3, tail=(2,))
    rp = np.array([1, 4, 4, 7])  # rows 0 and 7 in no segment
    xv = 50 * np.random.default_rng(1).standard_normal((8, 2))  # large: the max shift matters
    got, = tg.evaluate([y], {rowptr: rp, x: xv})
    np.testing.assert_allclose(got[1:4].sum(axis=0), 1.0, rtol=1e-12)
    np.testing.assert_allclose(got[4:7].sum(axis=0), 1.0, rtol=1e-12)
    assert (got[[0, 7]] == 0).all() and np.isfinite(got).all()


@pytest.mark.parametrize("op", OPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("simplify", [False, True])
def test_gradients_match_finite_differences(op, simplify):
    rng = np.random.default_rng(4)
    rowptr, x, y = graph(op, E=9, S=4, tail=(2,))
    rp = np.array([0, 3, 3, 7, 9])
    check_gradients(y, [x], {rowptr: rp, x: rng.standard_normal((9, 2))}, simplify=simplify)


@pytest.mark.parametrize("op", OPS, ids=lambda f: f.__name__)
def test_compiled_matches_the_oracle(op):
    rowptr, x, y = graph(op, E=23, S=7, tail=(4,), dtype="float32")
    head = tg.placeholder(y.shape, dtype="float32", name="head")
    dx, = tg.differentiate(y, [x], head=head)
    kernel = tg.build([y, dx], inputs=[rowptr, x, head])
    rng = np.random.default_rng(6)
    for _ in range(3):
        rp, _ = random_csr(rng, 7, 23)
        arrays = [rp, rng.standard_normal((23, 4)).astype("float32"), rng.standard_normal(y.shape).astype("float32")]
        got = kernel(*arrays)
        want = tg.evaluate([y, dx], dict(zip([rowptr, x, head], arrays)))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
    with pytest.raises(tg.UserError, match="runs backwards"):
        kernel(np.array([0, 5, 3, 9, 12, 15, 20, 23]), *arrays[1:])


def test_segment_softmax_gradient_is_one_pass_over_the_edges():
    """The per-segment softmax pinned to its edge (e' == e) scatters without a loop over
    every edge per edge: the backward's loops are the segments, their edges and the heads."""
    rowptr, x, y = graph(tg.nn.segment_softmax, E=9, S=4, tail=(2,))
    dx, = tg.differentiate(y, [x])
    from te_grad.graph import topo_order
    for t in topo_order([dx]):
        if isinstance(t.op, ScatterOp):
            assert len(t.op.axes) <= 3, tg.show(t)
    rp = np.array([0, 3, 3, 7, 9])
    check_gradients(y, [x], {rowptr: rp, x: np.random.default_rng(2).standard_normal((9, 2))})


def test_argument_errors():
    x = tg.placeholder((5, 2), name="x")
    rp = tg.placeholder((3,), dtype="int64", name="rp")
    with pytest.raises(tg.UserError, match="rowptr rpf must have dtype int32 or int64"):
        tg.nn.segment_sum(x, tg.placeholder((3,), name="rpf"))
    with pytest.raises(tg.UserError, match="must be 1-D"):
        tg.nn.segment_max(x, tg.placeholder((3, 1), dtype="int64", name="r2"))
    with pytest.raises(tg.UserError, match="float dtype"):
        tg.nn.segment_softmax(tg.placeholder((5,), dtype="int64", name="xi"), rp)
    with pytest.raises(tg.UserError, match="at least one axis"):
        tg.nn.segment_sum(tg.placeholder((), name="x0"), rp)
