"""Size variables as isl parameters: the bounds proof for every size, the simplified gradients
of symbolic graphs (against the raw VJP and float64 finite differences at several sizes, the
smallest allowed included), translation validation with parameters, and the loops isl builds
holding the size variable itself."""
import numpy as np
import pytest

import te_grad as tg
from te_grad.errors import UserError
from te_grad.graph import topo_order
from te_grad.ir import ComputeOp, ScatterOp, SizeVar
from te_grad.sizes import size_vars_in
from simplify import check_bounds
from simplify.affine import IslNames, isl_expr
from simplify.isl_bridge import Domain
from simplify.validate import check_nests, scan

F = "float64"


# -- the isl side -------------------------------------------------------------------------------

def test_isl_expr_renders_a_size_as_a_parameter():
    n = tg.var("n", min=1)
    i = tg.reduce_axis((0, n), "i")
    names = IslNames({id(i): "r0"})
    assert isl_expr(2 * n - i + 1, names) == "(((2 * _n) - r0) + 1)"
    assert names.size_vars() == [n]
    assert isl_expr(n * n, names) is None  # a product of two sizes is no quasi-affine form


def test_domain_declares_sizes_with_their_ranges_and_scans_with_the_size_itself():
    n = tg.var("n", min=2, max=50)
    out = tg.reduce_axis((0, n - 1), "j")  # stands for an output index: a parameter
    names = IslNames({id(out): "p0"})
    hi = isl_expr(n - out, names)
    dom = Domain([("p0", out, n - 1)], [("r0", "k")], [f"0 <= r0 < {hi}", "(r0 + p0) mod 2 = 0"],
                 sizes=names.size_vars())
    assert "2 <= _n <= 50" in dom._texts[0] and "0 <= p0 < (_n - 1)" in dom._texts[0]
    nests = scan(dom)
    assert check_nests(dom, nests) is None  # validated symbolically: for every n in [2, 50]
    used = [v for nest in nests for ax in nest.axes for v in size_vars_in(ax.hi)]
    assert used and all(v is n for v in used)
    # a nest that drops the last point for some n is refused
    bad = [type(nests[0])(nests[0].guards, nests[0].axes, nests[0].filters, nests[0].values)]
    from te_grad import dsl
    ax = bad[0].axes[0]
    bad[0].axes = [type(ax)(ax.name, ax.dtype, ax.lo, dsl.minimum(ax.hi, n - 3))]
    bad[0].values = [v if v is not ax else bad[0].axes[0] for v in bad[0].values]
    assert check_nests(dom, bad) is not None


# -- bounds -------------------------------------------------------------------------------------

def test_a_shifted_read_is_refused_at_the_sizes_where_it_leaves():
    n = tg.var("n")
    Y = tg.placeholder((n,), name="Y")
    Z = tg.compute((n,), lambda i: Y[i + 1], name="Z")
    with pytest.raises(UserError, match=r"Y\[i \+ 1\] in Z can go out of bounds: at n=\d+, i=\d+ .*\[0, n\)"):
        check_bounds([Z])
    ok = tg.compute((n - 1,), lambda i: Y[i + 1], name="Z")
    assert check_bounds([ok]) == []
    # the range of the size matters: with n <= 3 an index 3 * i may stay inside a (n + 4,) tensor
    m = tg.var("m", min=1, max=3)
    P = tg.placeholder((m + 4,), name="P")
    assert check_bounds([tg.compute((m,), lambda i: P[3 * i], name="Q")]) == []
    m2 = tg.var("m", min=1)
    P2 = tg.placeholder((m2 + 4,), name="P")
    with pytest.raises(UserError, match=r"at m=\d+, i=\d+"):
        check_bounds([tg.compute((m2,), lambda i: P2[3 * i], name="Q")])


def test_strided_read_bounds_and_a_reduce_bound_in_the_size():
    n = tg.var("n", min=3)
    X = tg.placeholder((2 * n,), name="X")
    k = tg.reduce_axis((0, 3), "k")
    C = tg.compute((n - 2,), lambda i: tg.sum(X[2 * i + k], axis=k), name="C")
    assert check_bounds([C]) == []
    k2 = tg.reduce_axis((0, 7), "k")
    bad = tg.compute((n - 2,), lambda i: tg.sum(X[2 * i + k2], axis=k2), name="C")
    with pytest.raises(UserError, match=r"at n=\d+, i=\d+, k=\d+"):
        check_bounds([bad])
    r = tg.reduce_axis((0, n), "r")
    Y = tg.placeholder((n + 1,), name="Y")
    S = tg.compute((), lambda: tg.sum(Y[r + 1], axis=r), name="S")
    assert check_bounds([S]) == []


def test_a_product_of_sizes_is_left_to_run_time():
    n, m = tg.var("n"), tg.var("m")
    X = tg.placeholder((n * m,), name="X")
    Z = tg.compute((n,), lambda i: X[i], name="Z")
    got = check_bounds([Z])
    assert [str(c) for c in got] == ["X[i] in Z"]


# -- gradients of symbolic graphs ---------------------------------------------------------------

def _fd_check(L, inputs, grads, raw, values, rng, eps=1e-6):
    """grads == raw at ``values`` and both match central finite differences of L."""
    feed = dict(zip(inputs, values))
    got = tg.evaluate(list(grads), feed)
    want = tg.evaluate(list(raw), feed)
    for g, w, x in zip(got, want, values):
        assert g.shape == x.shape
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    for x_t, x, g in zip(inputs, values, got):
        for _ in range(3):
            if x.size == 0:
                break
            v = rng.standard_normal(x.shape)
            hi = dict(feed)
            hi[x_t] = x + eps * v
            lo = dict(feed)
            lo[x_t] = x - eps * v
            fd = (tg.evaluate([L], hi)[0] - tg.evaluate([L], lo)[0]) / (2 * eps)
            np.testing.assert_allclose(float(np.sum(g * v)), float(fd), rtol=1e-6, atol=1e-8)


def _symbolic_simplified(grads):
    """Every size variable the simplified gradients use is the graph's own object."""
    for t in topo_order(list(grads)):
        parts = list(t.shape)
        if isinstance(t.op, ComputeOp):
            parts.append(t.op.body)
        elif isinstance(t.op, ScatterOp):
            parts += [t.op.value] + list(t.op.indices) + [b for a in t.op.axes for b in (a.lo, a.hi)]
        for p in parts:
            for v in size_vars_in(p):
                assert isinstance(v, SizeVar)
                yield v


def _matmul():
    n = tg.var("n")
    X = tg.placeholder((n, 6), name="X", dtype=F)
    W = tg.placeholder((6, 4), name="W", dtype=F)
    k = tg.reduce_axis(6, "k")
    Y = tg.compute((n, 4), lambda i, j: tg.sum(X[i, k] * W[k, j], axis=k), name="Y")
    r, c = tg.reduce_axis((0, n), "r"), tg.reduce_axis(4, "c")
    L = tg.compute((), lambda: tg.sum(Y[r, c] * Y[r, c], axis=[r, c]), name="L")
    return n, [X, W], L, lambda s, rng: [rng.standard_normal((s, 6)), rng.standard_normal((6, 4))]


def _shifted():
    n = tg.var("n", min=1)
    X = tg.placeholder((n, 3), name="X", dtype=F)
    Y = tg.compute((n, 3), lambda i, j: tg.tanh(X[i, j]), name="Y")
    Z = tg.compute((n - 1, 3), lambda i, j: Y[i + 1, j] * Y[i, j], name="Z")
    r, c = tg.reduce_axis((0, n - 1), "r"), tg.reduce_axis(3, "c")
    L = tg.compute((), lambda: tg.sum(Z[r, c] * Z[r, c], axis=[r, c]), name="L")
    return n, [X], L, lambda s, rng: [rng.standard_normal((s, 3))]


def _strided():
    n = tg.var("n", min=2)
    X = tg.placeholder((2 * n,), name="X", dtype=F)
    W = tg.placeholder((3,), name="W", dtype=F)
    k = tg.reduce_axis((0, 3), "k")
    C = tg.compute((n - 2,), lambda i: tg.sum(X[2 * i + k] * W[k], axis=k), name="C")
    r = tg.reduce_axis((0, n - 2), "r")
    L = tg.compute((), lambda: tg.sum(C[r] * C[r], axis=r), name="L")
    return n, [X, W], L, lambda s, rng: [rng.standard_normal((2 * s,)), rng.standard_normal((3,))]


def _rows():
    """softmax then layer-norm-style centering over rows of length n."""
    n = tg.var("n", min=1)
    X = tg.placeholder((3, n), name="X", dtype=F)
    k1, k2, k3 = (tg.reduce_axis((0, n), f"k{q}") for q in range(3))
    m = tg.compute((3,), lambda i: tg.max(X[i, k1], axis=k1), name="m")
    e = tg.compute((3, n), lambda i, j: tg.exp(X[i, j] - m[i]), name="e")
    s = tg.compute((3,), lambda i: tg.sum(e[i, k2], axis=k2), name="s")
    p = tg.compute((3, n), lambda i, j: e[i, j] / s[i], name="p")
    mu = tg.compute((3,), lambda i: tg.sum(p[i, k3] * (1.0 + k3), axis=k3), name="mu")
    c = tg.compute((3, n), lambda i, j: (p[i, j] - mu[i]) * (1.0 + j), name="c")
    r, q = tg.reduce_axis(3, "r"), tg.reduce_axis((0, n), "q")
    L = tg.compute((), lambda: tg.sum(c[r, q] * c[r, q] + tg.sin(X[r, q]), axis=[r, q]), name="L")
    return n, [X], L, lambda s, rng: [rng.standard_normal((3, s))]


def _padded_window():
    """a window read guarded at both ends: out[i] = sum_k X[i + k - 1] (zero outside)."""
    n = tg.var("n", min=0)
    X = tg.placeholder((n,), name="X", dtype=F)
    k = tg.reduce_axis(3, "k")
    Y = tg.compute((n,), lambda i: tg.sum(tg.if_then_else((i + k >= 1) & (i + k <= n), X[i + k - 1], 0.0) * (k + 1.0),
                                          axis=k), name="Y")
    r = tg.reduce_axis((0, n), "r")
    L = tg.compute((), lambda: tg.sum(Y[r] * Y[r], axis=r), name="L")
    return n, [X], L, lambda s, rng: [rng.standard_normal((s,))]


CASES = {"matmul": (_matmul, (0, 1, 2, 5)), "shifted": (_shifted, (1, 2, 3, 6)),
         "strided": (_strided, (2, 3, 4, 7)), "rows": (_rows, (1, 2, 5)),
         "padded_window": (_padded_window, (0, 1, 2, 3, 6))}


@pytest.mark.parametrize("case", sorted(CASES))
def test_simplified_gradients_of_symbolic_graphs(case):
    make, sizes = CASES[case]
    n, inputs, L, values = make()
    res = tg.differentiate(L, inputs)
    raw = tg.differentiate(L, inputs, simplify=False)
    assert not res.fallbacks
    used = list(_symbolic_simplified(list(res)))
    assert used and all(v is n for v in used)
    assert min(sizes) == n.lo  # the smallest allowed size, where shifted domains are empty
    rng = np.random.default_rng(len(case))
    for s in sizes:
        _fd_check(L, inputs, list(res), list(raw), values(s, rng), rng)


def test_the_shifted_gradient_has_tight_loops_in_n():
    n, inputs, L, _ = _shifted()
    (dX,) = tg.differentiate(L, inputs)
    text = tg.show(dX)
    assert "n" in text
    # the simplified backward is linear in n, the raw one quadratic
    raw = tg.differentiate(L, inputs, simplify=False)
    for s in (3, 9):
        from te_grad.sizes import specialize
        (a,), _ = specialize([dX], {n: s})
        (b,), _ = specialize(list(raw), {n: s})
        assert tg.iterations(a) < tg.iterations(b)
    assert tg.iterations(specialize([dX], {n: 9})[0][0]) - tg.iterations(specialize([dX], {n: 3})[0][0]) < 200


def test_scatter_of_symbolic_graph():
    """A data-dependent read (an embedding) over a symbolic number of rows becomes a scatter
    whose loops use n."""
    n = tg.var("n", min=0)
    T = tg.placeholder((5, 3), name="T", dtype=F)
    ids = tg.placeholder((n,), name="ids", dtype="int64")
    E = tg.compute((n, 3), lambda i, j: T[ids[i], j], name="E")
    r, c = tg.reduce_axis((0, n), "r"), tg.reduce_axis(3, "c")
    L = tg.compute((), lambda: tg.sum(E[r, c] * E[r, c], axis=[r, c]), name="L")
    res = tg.differentiate(L, [T])
    raw = tg.differentiate(L, [T], simplify=False)
    assert any(isinstance(t.op, ScatterOp) for t in topo_order(list(res)))
    rng = np.random.default_rng(3)
    for s in (0, 1, 4):
        t = rng.standard_normal((5, 3))
        i = rng.integers(0, 5, size=s)
        a = tg.evaluate(list(res), {T: t, ids: i})[0]
        b = tg.evaluate(list(raw), {T: t, ids: i})[0]
        want = np.zeros((5, 3))
        np.add.at(want, i, 2 * t[i])
        np.testing.assert_allclose(a, want, rtol=1e-12)
        np.testing.assert_allclose(b, want, rtol=1e-12)


def test_domain_shows_the_size_parameter():
    n = tg.var("n", min=1)
    X = tg.placeholder((n,), name="X")
    k = tg.reduce_axis((0, n), "k")
    S = tg.compute((n,), lambda i: tg.sum(X[k], axis=k, where=k <= i), name="S")
    (d,) = tg.domain(S)
    assert "_n" in d.isl and "k <= i" in d.isl
