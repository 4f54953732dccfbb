"""Kernels on graphs whose shapes use size variables (tg.var): one native kernel for every
value of the sizes, bound from the arguments' shapes at each call; values against the
oracle (which specializes the graph at the bound sizes)."""
import numpy as np
import pytest

import codegen
import te_grad as tg
from te_grad.errors import UserError

RNG = np.random.default_rng(7)


def _chain():
    n = tg.var("n", min=2)
    X = tg.placeholder((n, 8), name="X")
    W = tg.placeholder((8, 4), name="W")
    k = tg.reduce_axis(8, "k")
    Y = tg.compute((n, 4), lambda i, j: tg.sum(X[i, k] * W[k, j], axis=k), name="Y")
    Z = tg.compute((n - 1,), lambda i: tg.tanh(Y[i, 0] + Y[i + 1, 1]), name="Z")
    r = tg.reduce_axis((0, n - 1), "r")
    L = tg.compute((), lambda: tg.sum(Z[r] * Z[r], axis=r), name="L")
    return n, X, W, Y, Z, L


def _rand(*shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.fixture
def count_compiles(monkeypatch):
    """The LLVM modules compiled so far (by the compile worker or in this process; a module
    found in the in-process or disk cache is not compiled)."""
    from codegen import jit
    from codegen.team import team
    from codegen.kernel import default_threads
    team(default_threads())  # the thread team's own module, compiled once per process
    calls = []
    remote, here = jit._remote, jit._compile_here

    def counting_remote(text, key, functions):
        got = remote(text, key, functions)
        if got is not None:
            calls.append(key)
        return got

    def counting_here(text, key, functions):
        calls.append(key)
        return here(text, key, functions)
    monkeypatch.setattr(jit, "_remote", counting_remote)
    monkeypatch.setattr(jit, "_compile_here", counting_here)
    return calls


def test_one_kernel_serves_every_size(count_compiles):
    n, X, W, Y, Z, L = _chain()
    with codegen.compile_options(disk_cache=False):
        kern = tg.build([Y, Z, L], [X, W])
        assert kern.size_vars == (n,)
        w = _rand(8, 4)
        for size in (2, 3, 17, 64):  # 2: the smallest n allowed
            x = _rand(size, 8)
            got = kern(x, w)
            want = tg.evaluate([Y, Z, L], {X: x, W: w})
            assert [g.shape for g in got] == [(size, 4), (size - 1,), ()]
            for g, e in zip(got, want):
                np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    assert len(count_compiles) == 1


def test_a_symbolic_module_reads_its_sizes_at_run_time():
    n, X, W, Y, Z, L = _chain()
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(Z, [X, W])
    assert "for (i = 0; i < n - 1; ++i)" in kern.loops.replace("(n - 1)", "n - 1")
    x, w = _rand(5, 8), _rand(8, 4)
    np.testing.assert_allclose(kern(x, w), tg.evaluate([Z], {X: x, W: w})[0], rtol=1e-5, atol=1e-5)


def test_inconsistent_arguments_name_the_variable_and_both_arrays():
    n = tg.var("n", min=1)
    A = tg.placeholder((n, 3), name="A")
    B = tg.placeholder((n,), name="B")
    C = tg.compute((n, 3), lambda i, j: A[i, j] * B[i], name="C")
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(C, [A, B])
    with pytest.raises(UserError, match=r"argument B has extent 5.*n = 4 \(from argument A"):
        kern(_rand(4, 3), _rand(5))
    with pytest.raises(UserError, match=r"n = 0.*must be >= 1"):
        kern(_rand(0, 3), _rand(0))
    with pytest.raises(UserError, match=r"argument out=C has extent 5.*n = 4"):
        kern(_rand(4, 3), _rand(4), out=np.empty((5, 3), np.float32))
    a, b = _rand(4, 3), _rand(4)
    out = np.empty((4, 3), np.float32)
    kern(a, b, out=out)
    np.testing.assert_allclose(out, a * b[:, None], rtol=1e-6)
    res = np.empty((4, 3), np.float32)
    kern.run([a, b], [res])
    np.testing.assert_allclose(res, a * b[:, None], rtol=1e-6)
    with pytest.raises(UserError, match="argument B"):
        kern.run([a, _rand(3)], [res])
    assert [p["tensor"] for p in kern.profile([a, b], [res], repeat=1)] == ["C"]
    res2 = np.empty((4, 3), np.float32)
    kern.run_pointers([a.ctypes.data, b.ctypes.data], [res2.ctypes.data], sizes={"n": 4})
    np.testing.assert_allclose(res2, res)
    with pytest.raises(UserError, match="sizes="):
        kern.run_pointers([a.ctypes.data, b.ctypes.data], [res2.ctypes.data])


def test_reduce_bounds_strides_and_intermediates_at_run_time():
    n, m = tg.var("n", min=1), tg.var("m", min=3)
    X = tg.placeholder((n, m), name="X")
    r = tg.reduce_axis((0, m), "r")
    S = tg.compute((n,), lambda i: tg.sum(X[i, r], axis=r), name="S")
    E = tg.compute((n, m), lambda i, j: tg.exp(X[i, j] - S[i]), name="E")
    q = tg.reduce_axis((0, m - 2), "q")
    P = tg.compute((n, m - 2), lambda i, j: tg.sum(E[i, q] * X[i, j + 2], axis=q), name="P")
    with codegen.compile_options(disk_cache=False):
        kern = tg.build([S, P], [X])
    for shape in ((1, 3), (4, 7), (9, 33)):
        x = _rand(*shape)
        got = kern(x)
        want = tg.evaluate([S, P], {X: x})
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


def test_a_data_index_out_of_range_names_the_bound_extent():
    n = tg.var("n", min=1)
    T = tg.placeholder((n, 2), name="T")
    ids = tg.placeholder((3,), dtype="int64", name="ids")
    G = tg.compute((3, 2), lambda i, j: T[ids[i], j], name="G")
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(G, [T, ids])
    t = _rand(5, 2)
    np.testing.assert_array_equal(kern(t, np.array([4, 0, 2])), t[[4, 0, 2]])
    with pytest.raises(UserError, match=r"index 5 is out of range \[0, 5\)"):
        kern(t, np.array([5, 0, 2]))


def test_the_disk_cache_keeps_one_build_for_every_size(count_compiles, tmp_path):
    from codegen import jit
    with codegen.compile_options(disk_cache=True, cache_dir=str(tmp_path)):
        _, X0, W0, _, _, L0 = _chain()
        tg.build(L0, [X0, W0])
        n, X, W, Y, Z, L = _chain()  # the same graph, new objects: found on disk
        jit.clear_cache()
        again = tg.build(L, [X, W])
        assert len(count_compiles) == 1  # the second build compiled nothing
        assert again.size_vars == (n,)
        w = _rand(8, 4)
        for size in (2, 5, 30):
            x = _rand(size, 8)
            np.testing.assert_allclose(again(x, w), tg.evaluate([L], {X: x, W: w})[0], rtol=1e-4)
        with pytest.raises(UserError, match="n = 1.*>= 2"):
            again(_rand(1, 8), w)
        # a variable of the same name with another range makes another graph
        m = tg.var("n", min=3)
        X3, W3 = tg.placeholder((m, 8), name="X"), tg.placeholder((8, 4), name="W")
        k = tg.reduce_axis(8, "k")
        Y3 = tg.compute((m, 4), lambda i, j: tg.sum(X3[i, k] * W3[k, j], axis=k), name="Y")
        Z3 = tg.compute((m - 1,), lambda i: tg.tanh(Y3[i, 0] + Y3[i + 1, 1]), name="Z")
        r = tg.reduce_axis((0, m - 1), "r")
        L3 = tg.compute((), lambda: tg.sum(Z3[r] * Z3[r], axis=r), name="L")
        third = tg.build(L3, [X3, W3])
        with pytest.raises(UserError, match="n = 2.*>= 3"):
            third(_rand(2, 8), w)
    assert len(count_compiles) == 1  # the same module: the range is checked by the call
