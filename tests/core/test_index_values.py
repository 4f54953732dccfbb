"""Integer index arithmetic without the oracle: ``te_grad.intervals.index_values`` (what
iteration counts and reduce-bound probes are computed with) agrees with the reference
evaluator, refuses what is not index arithmetic, and the counts do not depend on how the
points are cut into blocks."""
import random

import numpy as np
import pytest

import te_grad as tg
from codegen.pieces import split_interior
from simplify import count
from te_grad.intervals import NotAnIndex, grid_values, index_values
from te_grad.ir import ReduceAxis


def _random_index(rng, leaves, depth):
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(leaves + [tg.const(rng.randint(-7, 7))])
    a, b = _random_index(rng, leaves, depth - 1), _random_index(rng, leaves, depth - 1)
    kind = rng.choice(["add", "sub", "mul", "floordiv", "floormod", "min", "max", "select", "neg", "int32"])
    if kind == "add":
        return a + b
    if kind == "sub":
        return a - b
    if kind == "mul":
        return a * b
    if kind in ("floordiv", "floormod"):
        c = rng.choice([-5, -3, -1, 1, 2, 4, 7])
        return a // c if kind == "floordiv" else a % c
    if kind == "min":
        return tg.minimum(a, b)
    if kind == "max":
        return tg.maximum(a, b)
    if kind == "neg":
        return -a
    if kind == "int32":
        return tg.cast("int64", tg.cast("int32", a))
    cond = (a < b) if rng.random() < 0.5 else ((a % 2 == 0) & (b >= 1)) | (a == b)
    return tg.if_then_else(cond, a - 1, b + 2)


def test_index_values_agree_with_the_evaluator():
    rng = random.Random(7)
    for _ in range(300):
        holder = {}

        def body(i, j):
            holder["e"] = e = _random_index(rng, [i, j], 4)
            return e
        T = tg.compute((5, 6), body, name="T", dtype="int64")
        (want,) = tg.evaluate([T], {})
        got = grid_values(holder["e"], T.op.axes, T.shape)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want, err_msg=str(holder["e"]))


def test_what_is_not_index_arithmetic_is_refused():
    X = tg.placeholder((6,), name="X", dtype="int64")
    T = tg.compute((6,), lambda i: i, name="T", dtype="int64")
    (i,) = T.op.axes
    for e in (X[i], tg.cast("int64", tg.cast("float32", i) * 0.5), tg.cast("int64", tg.exp(tg.cast("float32", i))),
              i // (i - 2)):  # a division by zero at i = 2
        assert grid_values(e, [i], [6]) is None
        with pytest.raises(NotAnIndex):
            index_values(e, {id(i): np.arange(6)})
    with pytest.raises(NotAnIndex, match="not bound"):
        index_values(i + 1, {})


def _graphs():
    X = tg.placeholder((1, 2, 9, 9), name="X")
    W = tg.placeholder((3, 2, 3, 3), name="W")
    Y = tg.nn.conv2d(X, W, stride=2, padding=1)
    res = tg.differentiate(Y, [X, W], head=tg.placeholder(Y.shape, name="dY"))
    A = tg.placeholder((7, 7), name="A")
    k = tg.reduce_axis(7, "k")
    cumsum = tg.compute((7, 7), lambda i, j: tg.sum(A[i, k], axis=k, where=k <= j), name="cumsum")
    (dA,) = tg.differentiate(cumsum, [A])
    m = tg.reduce_axis(7, "m")
    guarded = tg.compute((7,), lambda i: tg.sum(tg.if_then_else(2 * k < i + 1, tg.sum(A[k, m], axis=m), 0.0),
                                                axis=k), name="guarded")  # a guard inside the loop over k
    return [Y, *res.gradients, *res.raw, cumsum, dA, guarded]


def test_counts_do_not_depend_on_the_block_size(monkeypatch):
    graphs = _graphs()
    whole = [tg.iterations(t) for t in graphs]
    assert all(n > 0 for n in whole)
    monkeypatch.setattr(count, "BLOCK", 5)  # every range longer than a block is cut
    assert [tg.iterations(t) for t in graphs] == whole


def test_counts_of_nested_triangles_in_closed_form():
    """sum over i < 9, k < i, m in [k, i) of 1: the count of a tetrahedron, C(10, 3)."""
    A = tg.placeholder((9,), name="A")
    T = tg.compute((9,), lambda i: tg.sum(A[i], axis=tg.reduce_axis(1, "z")), name="T")
    (i,) = T.op.axes
    k = ReduceAxis("k", "int64", tg.const(0), i)
    m = ReduceAxis("m", "int64", k, i)
    assert count._count_nest([i], [9], [k, m], []) == 120 == sum((n * (n + 1)) // 2 for n in range(9))


def test_pieces_keep_bounds_that_read_data():
    """A reduce bound that reads a tensor has no value at compile time: the output domain stays
    one piece with the bounds as written (the evaluator refused the read without a feed)."""
    L = tg.placeholder((6,), name="L", dtype="int64")
    T = tg.compute((6,), lambda i: i, name="T", dtype="int64")
    (i,) = T.op.axes
    r = ReduceAxis("r", "int64", tg.const(0), L[i])
    pieces = split_interior([i], [6], [r])
    assert len(pieces) == 1 and pieces[0][1][id(r)] == (r.lo, r.hi)
    s = ReduceAxis("s", "int64", tg.maximum(0, 1 - i), tg.minimum(3, 7 - i))  # index arithmetic: cut
    assert len(split_interior([i], [6], [s])) > 1
