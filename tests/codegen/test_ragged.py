"""Compiled ragged (CSR) loops: values against the oracle, and bad data refused at run time."""
import numpy as np
import pytest

import te_grad as tg
from tests.oracle.test_ragged_oracle import csr_graph, random_csr


def build_csr(threads=1, dtype="float64"):
    rowptr, src, x, w, y = csr_graph(6, 4, 13, dtype)
    head = tg.placeholder(y.shape, dtype=dtype, name="head")
    dx, dw = tg.differentiate(y, [x, w], head=head)
    kernel = tg.build([y, dx, dw], inputs=[rowptr, src, x, w, head], threads=threads)
    return kernel, (rowptr, src, x, w, head), (y, dx, dw)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seed", range(3))
def test_forward_and_backward_match_the_oracle(threads, seed):
    kernel, inputs, outputs = build_csr(threads)
    rng = np.random.default_rng(seed)
    rp, sr = random_csr(rng, 6, 13)
    arrays = [rp, sr, rng.standard_normal((6, 4)), rng.standard_normal(13), rng.standard_normal((6, 4))]
    got = kernel(*arrays)
    want = tg.evaluate(list(outputs), dict(zip(inputs, arrays)))
    for g, w, t in zip(got, want, outputs):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=t.name)


def test_float32_and_empty_rows():
    kernel, inputs, outputs = build_csr(dtype="float32")
    rng = np.random.default_rng(5)
    rp = np.array([0, 0, 0, 13, 13, 13, 13])
    arrays = [rp, rng.integers(0, 6, 13), rng.standard_normal((6, 4)).astype("float32"),
              rng.standard_normal(13).astype("float32"), rng.standard_normal((6, 4)).astype("float32")]
    got = kernel(*arrays)
    want = tg.evaluate(list(outputs), dict(zip(inputs, arrays)))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert not got[0][[0, 1, 3, 4, 5]].any()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case, match", [
    ("decreasing", r"ragged loop e runs backwards from 9 to 4 while computing y"),
    ("beyond", r"index 13 is out of range \[0, 13\) for dimension 0 of tensor w"),
    ("negative", r"index -2 is out of range \[0, 13\)"),
    ("src", r"index 6 is out of range \[0, 6\) for dimension 0 of tensor x"),
])
def test_bad_data_is_a_run_time_error(threads, case, match):
    kernel, inputs, outputs = build_csr(threads)
    rng = np.random.default_rng(0)
    rp = np.array([0, 2, 9, 4, 9, 11, 13])
    sr = rng.integers(0, 6, 13)
    if case != "decreasing":
        rp = np.array([0, 2, 4, 9, 9, 11, 13])
    if case == "beyond":
        rp[-1] = 15
    if case == "negative":
        rp[0] = -2
    if case == "src":
        sr[10] = 6
    arrays = [rp, sr, rng.standard_normal((6, 4)), rng.standard_normal(13), rng.standard_normal((6, 4))]
    with pytest.raises(tg.TeGradError, match=match):
        kernel(*arrays)
    with pytest.raises(tg.UserError):  # the oracle refuses the same data
        tg.evaluate(list(outputs), dict(zip(inputs, arrays)))


def test_a_decreasing_range_in_the_backward_alone_is_refused():
    """The adjoints' scatters keep the ragged loop: a kernel of the gradients alone checks it."""
    rowptr, src, x, w, y = csr_graph(6, 4, 13)
    head = tg.placeholder(y.shape, dtype="float64", name="head")
    dw, = tg.differentiate(y, [w], head=head)
    kernel = tg.build([dw], inputs=[rowptr, src, x, head])
    rng = np.random.default_rng(1)
    arrays = [np.array([0, 2, 9, 4, 9, 11, 13]), rng.integers(0, 6, 13), rng.standard_normal((6, 4)),
              rng.standard_normal((6, 4))]
    with pytest.raises(tg.UserError, match="ragged loop e runs backwards from 9 to 4 while computing dw"):
        kernel(*arrays)


def test_ragged_triangle_and_argmax():
    """A later axis bounded by an earlier one and by data; an indexed reduction over a ragged loop."""
    deg = tg.placeholder((4,), dtype="int64", name="deg")
    x = tg.placeholder((4, 6), dtype="float64", name="x")

    def tri(v):
        a = tg.reduce_axis(deg[v], "a")
        b = tg.reduce_axis((a, deg[v]), "b")
        return tg.sum(x[v, b] * x[v, a], axis=[a, b])

    t = tg.compute((4,), tri, name="tri")
    am = tg.compute((4,), lambda v: tg.argmax(x[v, (k := tg.reduce_axis(deg[v], "k"))], axis=k), name="am")
    kernel = tg.build([t, am], inputs=[deg, x])
    dv, xv = np.array([0, 6, 3, 1]), np.random.default_rng(2).standard_normal((4, 6))
    got = kernel(dv, xv)
    want = tg.evaluate([t, am], {deg: dv, x: xv})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_array_equal(got[1], want[1])
    assert got[1][0] == -1
    with pytest.raises(tg.UserError, match=r"index 6 is out of range \[0, 6\) for dimension 1 of tensor x"):
        kernel(np.array([0, 7, 3, 1]), xv)


def test_exported_kernel_returns_the_ragged_error_code(tmp_path):
    from tests.codegen.test_export import run_exported
    kernel, inputs, outputs = build_csr()
    rng = np.random.default_rng(4)
    rp, sr = random_csr(rng, 6, 13)
    arrays = [rp, sr, rng.standard_normal((6, 4)), rng.standard_normal(13), rng.standard_normal((6, 4))]
    rc, _, got = run_exported(kernel, arrays, "host", tmp_path, "csr")
    assert rc == 0
    for g, w in zip(got, kernel(*arrays)):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    arrays[0] = np.array([0, 2, 9, 4, 9, 11, 13])
    rc, info, _ = run_exported(kernel, arrays, "host", tmp_path, "csr")
    assert rc == 4 and info[:3] == [9, 4, 0]
    assert "#define CSR_ERROR_RAGGED 4" in (tmp_path / "host" / "csr.h").read_text()
