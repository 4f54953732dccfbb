"""Parametric iteration counts (tg.iterations on a graph with size variables): exact values at
given sizes, a closed form that agrees with the specialized graph's count at sizes it was not
fitted on, for forward and simplified backward graphs, and the cheap-gradient ratio of a
matrix product bounded in n."""
from fractions import Fraction

import itertools

import pytest

import te_grad as tg
from te_grad.errors import UserError
from te_grad.sizes import specialize
from simplify.count import SizeCount


def _concrete(tensors, n, s):
    outs, _ = specialize(list(tensors), {n: s})
    return tg.iterations(outs)


def _matmul(n):
    X = tg.placeholder((n, 8), name="X")
    W = tg.placeholder((8, 4), name="W")
    k = tg.reduce_axis(8, "k")
    return [X, W], tg.compute((n, 4), lambda i, j: tg.sum(X[i, k] * W[k, j], axis=k), name="Y")


def _shifted(n):
    X = tg.placeholder((n, 3), name="X")
    Z = tg.compute((n - 1, 3), lambda i, j: X[i + 1, j] * X[i, j], name="Z")
    return [X], Z


def _strided(n):
    X = tg.placeholder((2 * n,), name="X")
    W = tg.placeholder((3,), name="W")
    k = tg.reduce_axis((0, 3), "k")
    return [X, W], tg.compute((n - 2,), lambda i: tg.sum(X[2 * i + k] * W[k], axis=k), name="C")


def _half(n):
    X = tg.placeholder((n,), name="X")
    k = tg.reduce_axis((0, n), "k")
    return [X], tg.compute((n // 2,), lambda i: tg.sum(X[k], axis=k, where=k <= 2 * i), name="H")


def _triangle(n):
    X = tg.placeholder((n,), name="X")
    k = tg.reduce_axis((0, n), "k")
    return [X], tg.compute((n,), lambda i: tg.sum(X[k] * X[i], axis=k, where=k <= i), name="T")


CASES = {"matmul": (_matmul, 0), "shifted": (_shifted, 1), "strided": (_strided, 2), "half": (_half, 0),
         "triangle": (_triangle, 0)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_closed_form_matches_the_specialized_count(case):
    make, lo = CASES[case]
    n = tg.var("n", min=lo)
    inputs, Y = make(n)
    graphs = {"forward": [Y], "backward": list(tg.differentiate(Y, inputs)),
              "raw": list(tg.differentiate(Y, inputs, simplify=False))}
    for what, ts in graphs.items():
        count = tg.iterations(ts)
        assert isinstance(count, SizeCount)
        assert count.pieces() is not None, (case, what)
        for s in itertools.chain(range(lo, lo + 5), (57, 230, 231)):
            want = _concrete(ts, n, s)
            assert count.at(n=s) == want and count({"n": s}) == want and count({n: s}) == want
            assert count.closed_form_at(s) == want, (case, what, s, str(count))


def test_brute_force_enumeration_of_the_triangle():
    """A where filter is evaluated at every point (the raw box counts), the simplified
    tensor's loops visit the triangle only."""
    n = tg.var("n")
    (X,), T = _triangle(n)
    raw, tight = tg.iterations(T), tg.iterations(tg.simplify(T))
    (dX,) = tg.differentiate(T, [X])
    back = tg.iterations(dX)
    for s in range(0, 7):
        assert raw.at(n=s) == sum(1 for i in range(s) for k in range(s))
        assert tight.at(n=s) == sum(1 for i in range(s) for k in range(s) if k <= i)
        # dX[j] = sum over i >= j of dT[i] * X[i]  +  dT[j] * sum over k <= j of X[k]
        assert back.at(n=s) == 2 * sum(1 for i in range(s) for k in range(s) if k <= i)
    assert str(raw) == "n**2"
    assert str(tight) == "n**2 / 2 + n / 2"


def test_printed_forms():
    n = tg.var("n")
    _, Y = _matmul(n)
    assert str(tg.iterations(Y)) == "32 * n"
    m = tg.var("m", min=1)
    _, Z = _shifted(m)
    assert str(tg.iterations(Z)) == "3 * m - 3"
    q = tg.var("q")
    _, H = _half(q)
    text = str(tg.iterations(H))
    assert "q % 2 = 0" in text and "q % 2 = 1" in text
    # a fixed-shape graph keeps its int
    X = tg.placeholder((4, 8), name="X")
    W = tg.placeholder((8, 2), name="W")
    k = tg.reduce_axis(8, "k")
    got = tg.iterations(tg.compute((4, 2), lambda i, j: tg.sum(X[i, k] * W[k, j], axis=k), name="Y"))
    assert type(got) is int and got == 64


def test_cheap_gradient_ratio_of_matmul_is_bounded_in_n():
    n = tg.var("n")
    inputs, Y = _matmul(n)
    fwd = tg.iterations(Y)
    bwd = tg.iterations(list(tg.differentiate(Y, inputs)))
    raw = tg.iterations(list(tg.differentiate(Y, inputs, simplify=False)))
    assert fwd.leading() == (1, Fraction(32))
    degree, coef = bwd.leading()
    assert degree == 1 and coef / 32 == 2  # gradient work / forward work -> 2
    for s in (1, 10, 100, 1000):
        assert bwd.at(n=s) <= 2 * fwd.at(n=s)
    assert raw.leading()[0] == 2  # the raw VJP is quadratic: its ratio grows with n


def test_counts_need_the_sizes():
    n = tg.var("n")
    _, Y = _matmul(n)
    count = tg.iterations(Y)
    with pytest.raises(UserError, match="needs the value of n"):
        count({})
    with pytest.raises(UserError, match="does not use"):
        count.at(m=3)
    with pytest.raises(UserError, match="depends on n"):
        int(count)


def test_two_size_variables_are_counted_at_given_sizes():
    n, m = tg.var("n"), tg.var("m")
    A = tg.placeholder((n, m), name="A")
    k = tg.reduce_axis((0, m), "k")
    S = tg.compute((n,), lambda i: tg.sum(A[i, k], axis=k), name="S")
    count = tg.iterations(S)
    assert count.at(n=3, m=5) == 15 and count.pieces() is None
    assert "evaluate with .at" in str(count)
