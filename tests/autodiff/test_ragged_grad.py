"""Gradients through ragged (CSR) reduce axes, and how simplify and counting treat them."""
import numpy as np
import pytest

import te_grad as tg
from te_grad.ir import ScatterOp
from simplify.count import tensor_iterations
from te_grad.testing import check_gradients
from tests.oracle.test_ragged_oracle import csr_graph, random_csr


def feed_for(rowptr, src, x, w, rng, V=5, F=3, E=9):
    rp, sr = random_csr(rng, V, E)
    return {rowptr: rp, src: sr, x: rng.standard_normal((V, F)), w: rng.standard_normal(E)}


@pytest.mark.parametrize("simplify", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_gradients_match_finite_differences(simplify, seed):
    rowptr, src, x, w, y = csr_graph()
    feed = feed_for(rowptr, src, x, w, np.random.default_rng(seed))
    check_gradients(y, [x, w], feed, simplify=simplify, seed=seed)


def test_gradients_match_a_numpy_loop():
    """dx[src[e]] += w[e] head[v]; dw[e] = head[v] . x[src[e]]: each edge e reached once."""
    rowptr, src, x, w, y = csr_graph()
    rng = np.random.default_rng(7)
    feed = feed_for(rowptr, src, x, w, rng)
    head = tg.placeholder(y.shape, dtype="float64", name="head")
    feed[head] = rng.standard_normal(y.shape)
    dx, dw = tg.evaluate(list(tg.differentiate(y, [x, w], head=head)), feed)
    rp, sr, xv, wv, hv = feed[rowptr], feed[src], feed[x], feed[w], feed[head]
    want_x, want_w = np.zeros_like(xv), np.zeros_like(wv)
    for v in range(5):
        for e in range(rp[v], rp[v + 1]):
            want_x[sr[e]] += wv[e] * hv[v]
            want_w[e] += hv[v] @ xv[sr[e]]
    np.testing.assert_allclose(dx, want_x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw, want_w, rtol=1e-12, atol=1e-12)


def test_simplified_adjoints_are_scatters_over_the_edges():
    """isl cannot represent range(rowptr[v], rowptr[v + 1]): the adjoints keep the ragged loop
    as written and become scatters, one pass over the edges (never a gather per element)."""
    rowptr, src, x, w, y = csr_graph()
    dx, dw = tg.differentiate(y, [x, w])
    for g in (dx, dw):
        assert isinstance(g.op, ScatterOp), tg.show(g)
        e = g.op.axes[-1]
        assert "rowptr" in tg.show(g) and e.name == "e"
    tg.verify([dx, dw])


def test_second_order_through_a_ragged_loop():
    """y = sum_e w[e]^2 x[src[e]]: the Hessian-vector product wrt w, against finite differences
    of the evaluated first-order gradient."""
    rowptr, src, x, w, _ = csr_graph()
    y = tg.compute((5, 3), lambda v, f: tg.sum(w[(e := tg.reduce_axis((rowptr[v], rowptr[v + 1]), "e"))]
                                               * w[e] * x[src[e], f], axis=e), name="y2")
    dw, = tg.differentiate(y, [w])
    dirs, _, (hv,) = tg.testing.second_order([dw], [w])
    rng = np.random.default_rng(3)
    feed = feed_for(rowptr, src, x, w, rng)
    feed[dirs[0]] = rng.standard_normal(9)
    got, = tg.evaluate([hv], feed)
    eps = 1e-6
    plus, minus = dict(feed), dict(feed)
    plus[w] = feed[w] + eps * feed[dirs[0]]
    minus[w] = feed[w] - eps * feed[dirs[0]]
    want = (tg.evaluate([dw], plus)[0] - tg.evaluate([dw], minus)[0]) / (2 * eps)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def test_counting_a_ragged_loop_says_it_depends_on_data():
    rowptr, src, x, w, y = csr_graph()
    with pytest.raises(tg.UserError, match=r"ragged loop e runs over range\(rowptr\[v\], rowptr\[v \+ 1\]\)"):
        tg.iterations(y)
    # an estimate: each ragged loop as N trips per point of the loops around it
    assert tg.iterations(y, ragged=4) == 5 * 3 * 4
    assert tg.iterations(y, ragged=0) == 0
    dx, dw = tg.differentiate(y, [x, w])
    assert tensor_iterations(dx, 2) == 5 * 3 * 2  # the scatter's domain (v, f, e)
    with pytest.raises(tg.UserError, match="iterations of dx depend on data"):
        tensor_iterations(dx)


def test_bounds_of_a_scatter_are_proven_too():
    """A scatter's ragged bound reads data: that read is in the static bounds proof."""
    from simplify.bounds import check_bounds
    rowptr = tg.placeholder((4,), dtype="int64", name="rowptr")
    out = tg.placeholder((3,), dtype="float64", name="o")
    v = tg.reduce_axis((0, 3), "v")
    e = tg.reduce_axis((rowptr[v], rowptr[v + 2]), "e")
    bad = tg.Tensor("s", (5,), "float64", ScatterOp((v, e), (e,), out[v]))
    with pytest.raises(tg.UserError, match=r"rowptr\[v \+ 2\] .* can go out of bounds"):
        check_bounds([bad])


def test_domain_lists_a_ragged_bound_as_a_filter():
    rowptr, src, x, w, y = csr_graph()
    dom, = tg.domain(y)
    assert "rowptr[v] <= e < rowptr[v + 1]" in dom.filters


def test_notebook_form_of_a_ragged_result_says_the_count_depends_on_data():
    rowptr, src, x, w, y = csr_graph()
    html = tg.differentiate(y, [x, w])._repr_html_()
    assert "depends on the data" in html and "dx" in html
