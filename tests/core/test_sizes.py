"""Size variables (tg.var): shapes and bounds affine in sizes, binding from argument shapes,
specialization, and the oracle and the raw VJP on symbolic graphs."""
import numpy as np
import pytest

import te_grad as tg
from te_grad import sizes
from te_grad.errors import UserError


def _matmul_chain():
    n = tg.var("n", min=2)
    X = tg.placeholder((n, 8), name="X")
    W = tg.placeholder((8, 4), name="W")
    k = tg.reduce_axis(8, "k")
    Y = tg.compute((n, 4), lambda i, j: tg.sum(X[i, k] * W[k, j], axis=k), name="Y")
    Z = tg.compute((n - 1,), lambda i: tg.tanh(Y[i, 0] + Y[i + 1, 1]), name="Z")
    r = tg.reduce_axis((0, n - 1), "r")
    L = tg.compute((), lambda: tg.sum(Z[r] * Z[r], axis=r), name="L")
    return n, X, W, Y, Z, L


def _loss(x, w):
    y = x @ w
    z = np.tanh(y[:-1, 0] + y[1:, 1])
    return (z * z).sum()


def test_var_arguments_are_checked():
    with pytest.raises(UserError, match="identifier"):
        tg.var("2n")
    with pytest.raises(UserError, match=">= 0"):
        tg.var("n", min=-1)
    with pytest.raises(UserError, match="below min"):
        tg.var("n", min=4, max=3)
    n = tg.var("n")
    with pytest.raises(UserError, match="not a size"):
        tg.placeholder((n * 0.5,), name="A")
    X = tg.placeholder((n,), name="X")
    with pytest.raises(UserError, match="not a size"):
        tg.placeholder((X[0],), name="B")


def test_shapes_hold_size_expressions():
    n, X, W, Y, Z, L = _matmul_chain()
    assert Y.shape[0] is n and Y.shape[1] == 4
    assert str(Z.shape[0]) == "n - 1"
    assert sizes.graph_size_vars([L]) == (n,)
    assert sizes.value(Z.shape[0], {n: 7}) == 6
    m = tg.var("m")
    P = tg.placeholder((2 * m, m // 2, m + 3), name="P")
    assert sizes.concrete_shape(P.shape, {m: 5}) == (10, 2, 8)


def test_binding_solves_and_checks():
    n, X, W, Y, Z, L = _matmul_chain()
    got = sizes.bind_sizes([("X", X.shape, (5, 8)), ("W", W.shape, (8, 4))])
    assert got == {n: 5}
    m = tg.var("m")
    P = tg.placeholder((2 * m + 1,), name="P")
    assert sizes.bind_sizes([("P", P.shape, (9,))]) == {m: 4}
    with pytest.raises(UserError, match=r"not 2 \* m \+ 1|not .* for any integer m"):
        sizes.bind_sizes([("P", P.shape, (8,))])
    with pytest.raises(UserError, match="argument Z .* n - 1 is 4 with n = 5 .*argument X"):
        sizes.bind_sizes([("X", X.shape, (5, 8)), ("Z", Z.shape, (5,))])
    with pytest.raises(UserError, match="size n = 1 .* must be >= 2"):
        sizes.bind_sizes([("X", X.shape, (1, 8))])
    with pytest.raises(UserError, match="extent 9 in dimension 1"):
        sizes.bind_sizes([("X", X.shape, (5, 9))])


def test_two_variables_of_one_name_are_refused():
    a, b = tg.var("n"), tg.var("n")
    X = tg.placeholder((a,), name="X")
    Y = tg.placeholder((b,), name="Y")
    Z = tg.compute((a,), lambda i: X[i] + Y[i], name="Z")
    with pytest.raises(UserError, match="two different size variables are named 'n'"):
        sizes.graph_size_vars([Z])


def test_specialize_gives_a_fixed_graph():
    n, X, W, Y, Z, L = _matmul_chain()
    (L5,), new = sizes.specialize([L], {n: 5})
    assert new[id(X)].shape == (5, 8) and new[id(Z)].shape == (4,)
    assert not sizes.graph_size_vars([L5])
    assert new[id(W)] is W  # nothing symbolic in it: kept


@pytest.mark.parametrize("rows", [2, 3, 9])
def test_oracle_binds_sizes_from_the_feed(rows):
    n, X, W, Y, Z, L = _matmul_chain()
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 8)).astype(np.float32)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    z, l = tg.evaluate([Z, L], {X: x, W: w})
    y = x.astype(np.float64) @ w
    np.testing.assert_allclose(z, np.tanh(y[:-1, 0] + y[1:, 1]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(l, _loss(x.astype(np.float64), w.astype(np.float64)), rtol=1e-4)


def test_oracle_needs_sizes_no_input_states():
    m = tg.var("m")
    X = tg.placeholder((4,), name="X")
    r = tg.reduce_axis((0, m), "r")
    S = tg.compute((4,), lambda i: tg.sum(X[i] * 1.0, axis=r), name="S")
    x = np.ones(4, np.float32)
    with pytest.raises(UserError, match="sizes=.*'m'"):
        tg.evaluate([S], {X: x})
    (s,) = tg.evaluate([S], {X: x}, sizes={"m": 3})
    np.testing.assert_allclose(s, 3 * x)
    with pytest.raises(UserError, match="does not use"):
        tg.evaluate([S], {X: x}, sizes={"q": 3})


@pytest.mark.parametrize("rows", [2, 5])
def test_raw_vjp_on_symbolic_shapes_matches_finite_differences(rows):
    n, X, W, Y, Z, L = _matmul_chain()
    gx, gw = tg.differentiate(L, [X, W], simplify=False)
    assert gx.shape == X.shape and gw.shape == W.shape
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 8))
    w = rng.standard_normal((8, 4)) * 0.3
    dx, dw = tg.evaluate([gx, gw], {X: x.astype(np.float32), W: w.astype(np.float32)})
    eps = 1e-6
    for arr, got in ((x, dx), (w, dw)):
        num = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            hi, lo = arr.copy(), arr.copy()
            hi[idx] += eps
            lo[idx] -= eps
            args_hi = (hi, w) if arr is x else (x, hi)
            args_lo = (lo, w) if arr is x else (x, lo)
            num[idx] = (_loss(*args_hi) - _loss(*args_lo)) / (2 * eps)
        np.testing.assert_allclose(got, num, rtol=2e-3, atol=2e-4)


def test_a_size_that_makes_an_extent_negative_is_named():
    n = tg.var("n")
    X = tg.placeholder((n,), name="X")
    Z = tg.compute((n - 1,), lambda i: X[i] + X[i + 1], name="Z")
    with pytest.raises(UserError, match=r"at n = 0 the extent n - 1 of Z \(dimension 0\) is -1"):
        tg.evaluate([Z], {X: np.zeros(0, np.float32)})
    (z,) = tg.evaluate([Z], {X: np.arange(3, dtype=np.float32)})
    np.testing.assert_allclose(z, [1, 3])
