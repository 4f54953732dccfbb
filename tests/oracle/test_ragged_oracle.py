"""Ragged (CSR) reduce axes: the DSL's checks and the oracle's values and errors."""
import numpy as np
import pytest

import te_grad as tg
from te_grad.fingerprint import fingerprint


def csr_graph(V=5, F=3, E=9, dtype="float64"):
    rowptr = tg.placeholder((V + 1,), dtype="int64", name="rowptr")
    src = tg.placeholder((E,), dtype="int64", name="src")
    x = tg.placeholder((V, F), dtype=dtype, name="x")
    w = tg.placeholder((E,), dtype=dtype, name="w")

    def body(v, f):
        e = tg.reduce_axis((rowptr[v], rowptr[v + 1]), name="e")
        return tg.sum(w[e] * x[src[e], f], axis=e)

    return rowptr, src, x, w, tg.compute((V, F), body, name="y")


def random_csr(rng, V, E):
    """A random sorted row pointer from 0 to E (empty rows included) and sources in [0, V)."""
    cuts = np.sort(rng.integers(0, E + 1, size=V - 1))
    return np.concatenate([[0], cuts, [E]]).astype(np.int64), rng.integers(0, V, size=E).astype(np.int64)


def loop_reference(rp, sr, xv, wv):
    out = np.zeros_like(xv)
    for v in range(len(rp) - 1):
        for e in range(rp[v], rp[v + 1]):
            out[v] += wv[e] * xv[sr[e]]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_values_match_a_numpy_loop(seed):
    rng = np.random.default_rng(seed)
    V, F, E = 6, 3, 11
    rowptr, src, x, w, y = csr_graph(V, F, E)
    rp, sr = random_csr(rng, V, E)
    xv, wv = rng.standard_normal((V, F)), rng.standard_normal(E)
    got, = tg.evaluate([y], {rowptr: rp, src: sr, x: xv, w: wv})
    np.testing.assert_allclose(got, loop_reference(rp, sr, xv, wv), rtol=1e-12, atol=1e-12)


def test_empty_rows_and_empty_graph():
    rowptr, src, x, w, y = csr_graph(4, 2, 3)
    rp = np.array([0, 0, 3, 3, 3])
    xv, wv = np.arange(8.0).reshape(4, 2), np.array([1.0, 2.0, 3.0])
    sr = np.array([3, 0, 1])
    got, = tg.evaluate([y], {rowptr: rp, src: sr, x: xv, w: wv})
    np.testing.assert_array_equal(got, loop_reference(rp, sr, xv, wv))
    assert not got[0].any() and not got[2:].any()


def test_nested_ragged_axes_and_extent_form():
    """A later axis's bounds may use an earlier axis of the same reduction; an extent may be an
    expression: ``reduce_axis(deg[v])`` is ``range(0, deg[v])``."""
    deg = tg.placeholder((4,), dtype="int64", name="deg")
    x = tg.placeholder((4, 5), dtype="float64", name="x")
    z = tg.compute((4,), lambda v: tg.sum(x[v, (k := tg.reduce_axis(deg[v], "k"))], axis=k), name="z")
    tri = tg.compute((4,), lambda v: tg.sum(x[v, (b := tg.reduce_axis((a := tg.reduce_axis(deg[v], "a"), deg[v]),
                                                                       "b"))], axis=[a, b]), name="tri")
    dv, xv = np.array([0, 5, 2, 3]), np.arange(20.0).reshape(4, 5)
    got_z, got_t = tg.evaluate([z, tri], {deg: dv, x: xv})
    np.testing.assert_array_equal(got_z, [xv[v, :dv[v]].sum() for v in range(4)])
    want = [sum(xv[v, b] for a in range(dv[v]) for b in range(a, dv[v])) for v in range(4)]
    np.testing.assert_array_equal(got_t, want)


def test_dsl_errors():
    rowptr, src, x, w, _ = csr_graph()
    with pytest.raises(tg.UserError, match="lower bound must be an int"):
        tg.reduce_axis((0.5, rowptr[1]))
    with pytest.raises(tg.UserError, match="upper bound .* is float64"):
        tg.reduce_axis((0, x[0, 0]))
    with pytest.raises(tg.UserError, match="converts a float64"):
        tg.reduce_axis((0, tg.cast("int64", x[0, 0])))
    with pytest.raises(tg.UserError, match="is float32"):
        tg.reduce_axis((0, rowptr[1] / 2))
    with pytest.raises(tg.UserError, match="empty range"):
        tg.reduce_axis((3, 1))
    with pytest.raises(tg.UserError, match="holds a Reduce"):
        k = tg.reduce_axis(3, "k")
        tg.reduce_axis((0, tg.sum(rowptr[k], axis=k)))

    def later(v):
        e = tg.reduce_axis((0, 3), "e")
        k = tg.reduce_axis((rowptr[e], rowptr[e + 1]), "k")
        return tg.sum(x[k, 0], axis=[k, e])

    with pytest.raises(tg.UserError, match="axis 'e' listed after it"):
        tg.compute((5,), later, name="bad")

    def outside(v):
        k = tg.reduce_axis((0, 3), "k")
        e = tg.reduce_axis((rowptr[k], rowptr[k + 1]), "e")
        return tg.sum(w[e], axis=e)

    with pytest.raises(tg.UserError, match="reduce axis 'k' is used outside a reduction"):
        tg.compute((5,), outside, name="bad")


def test_printer_verify_fingerprint():
    rowptr, src, x, w, y = csr_graph()
    assert "range(rowptr[v], rowptr[v + 1])" in tg.show(y)
    tg.verify(y)
    other = tg.placeholder(rowptr.shape, dtype="int64", name="rowptr")
    y2 = tg.compute(y.shape, lambda v, f: tg.sum(w[(e := tg.reduce_axis((other[v], other[v + 1]), "e"))]
                                                 * x[src[e], f], axis=e), name="y")
    y3 = tg.compute(y.shape, lambda v, f: tg.sum(w[(e := tg.reduce_axis((rowptr[v], rowptr[v + 1]), "e"))]
                                                 * x[src[e], f], axis=e), name="y")
    y4 = tg.compute(y.shape, lambda v, f: tg.sum(w[(e := tg.reduce_axis((rowptr[v], rowptr[v] + 1), "e"))]
                                                 * x[src[e], f], axis=e), name="y")
    base = fingerprint([y], [rowptr, src, x, w])
    assert fingerprint([y3], [rowptr, src, x, w]) == base
    assert fingerprint([y4], [rowptr, src, x, w]) != base
    assert fingerprint([y2], [other, src, x, w]) == fingerprint([y], [rowptr, src, x, w])


@pytest.mark.parametrize("rp, sr, what", [
    ([0, 5, 2, 5, 8, 9], None, "runs backwards from 5 to 2"),
    ([0, 2, 2, 5, 8, 12], None, r"w\[e\] .* reaches index \[9\]"),
    ([-1, 2, 2, 5, 8, 9], None, r"reaches index \[-1\]"),
    ([0, 2, 2, 5, 8, 9], 5, r"x\[src\[e\], f\] .* reaches index \[5, 0\]"),
])
def test_bad_data_is_a_clear_error(rp, sr, what):
    rowptr, src, x, w, y = csr_graph()
    rng = np.random.default_rng(0)
    srv = rng.integers(0, 5, 9)
    if sr is not None:
        srv[3] = sr
    feed = {rowptr: np.array(rp), src: srv, x: rng.standard_normal((5, 3)), w: rng.standard_normal(9)}
    with pytest.raises(tg.UserError, match=what):
        tg.evaluate([y], feed)


def test_the_readme_example_runs(capsys):
    import pathlib
    import re
    text = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index("## Ragged loops"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "[1. 0. 9. 5.]"
