"""Reduction records (te_grad.ops.REDUCTIONS): argmax / argmin, the (value, index) kind, in the
reference evaluator, the native kernels and the loop interpreter; gradients through a read at
an argmax; and a new reduction kind defined by one record."""
import numpy as np
import pytest

import te_grad as tg
from te_grad import ops
from te_grad.errors import UserError
from te_grad.testing import check_gradients
from codegen.interpret import run
from codegen.schedule import stages_for
from simplify import simplify

RNG = np.random.default_rng(11)


def _data(shape, dtype, ties):
    if dtype.startswith("int"):
        return RNG.integers(-3, 3 if ties else 1000, shape).astype(dtype)
    x = RNG.standard_normal(shape)
    if ties:
        x = np.round(x)  # many equal values
    return x.astype(dtype)


def _arg_graph(fn, shape, axis, dtype, where=None):
    X = tg.placeholder(shape, dtype=dtype, name="X")
    k = tg.reduce_axis(shape[axis], "k")
    out_shape = shape[:axis] + shape[axis + 1:]

    def body(*idx):
        full = idx[:axis] + (k,) + idx[axis:]
        return fn(X[full], k, where=None if where is None else where(k, idx))
    return X, tg.compute(out_shape, body, name="A")


CASES = [((7,), 0), ((4, 9), 1), ((4, 9), 0), ((3, 5, 6), 1), ((3, 5, 6), 2)]


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("shape,axis", CASES)
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_arg_reductions_match_numpy_compiled_and_interpreted(name, shape, axis, dtype, ties):
    X, A = _arg_graph(getattr(tg, name), shape, axis, dtype)
    x = _data(shape, dtype, ties)
    want = getattr(np, name)(x, axis=axis)
    got = tg.evaluate([A], {X: x})[0]
    assert A.dtype == "int64" and got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(tg.build([A], [X])(x), want)
    np.testing.assert_array_equal(_interpreted(A, X, x), want)


def _interpreted(A, X, x):
    outs = simplify([A])
    return run(stages_for(outs), {X: x})[id(outs[0])]


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_nan_wins_first_as_in_numpy(name):
    X, A = _arg_graph(getattr(tg, name), (4, 6), 1, "float64")
    x = RNG.standard_normal((4, 6))
    x[0, 3] = x[0, 5] = np.nan
    x[2, 0] = np.nan
    x[3, :] = np.inf if name == "argmax" else -np.inf
    want = getattr(np, name)(x, axis=1)
    for got in (tg.evaluate([A], {X: x})[0], tg.build([A], [X])(x), _interpreted(A, X, x)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_where_restricts_the_candidates_and_an_empty_domain_gives_minus_one(name):
    # the odd positions from i on (none for the last rows): a strided, row-dependent domain
    X, A = _arg_graph(getattr(tg, name), (6, 9), 1, "float64",
                      where=lambda k, idx: (k % 2 == 1) & (k >= 2 * idx[0]))
    x = np.round(RNG.standard_normal((6, 9)))
    want = []
    for i in range(6):
        ks = [k for k in range(9) if k % 2 == 1 and k >= 2 * i]
        want.append(ks[int(getattr(np, name)(x[i, ks]))] if ks else -1)
    for got in (tg.evaluate([A], {X: x})[0], tg.evaluate(simplify([A]), {X: x})[0],
                tg.build([A], [X])(x), _interpreted(A, X, x)):
        np.testing.assert_array_equal(got, want)


def test_argmax_of_a_computed_body_with_a_nested_reduction():
    X = tg.placeholder((5, 8), dtype="float32", name="X")
    k, j = tg.reduce_axis(8, "k"), tg.reduce_axis(8, "j")
    A = tg.compute((5,), lambda i: tg.argmax(X[i, k] * X[i, k] - tg.sum(X[i, j], j) * X[i, k], k), name="A")
    x = RNG.standard_normal((5, 8)).astype("float32")
    want = tg.evaluate([A], {X: x})[0]
    xd = x.astype(np.float64)
    ref = np.argmax(xd * xd - xd.sum(1, keepdims=True) * xd, axis=1)
    np.testing.assert_array_equal(want, ref)
    np.testing.assert_array_equal(tg.build([A], [X])(x), want)


def test_gradient_through_a_read_at_the_argmax_matches_finite_differences():
    X = tg.placeholder((4, 7), dtype="float64", name="X")
    V = tg.placeholder((4,), dtype="float64", name="V")
    k = tg.reduce_axis(7, "k")
    A = tg.compute((4,), lambda i: tg.argmax(X[i, k] * V[i], k), name="A")
    Y = tg.compute((4,), lambda i: X[i, A[i]] * X[i, A[i]] * tg.sin(V[i]) + X[i, 0], name="Y")
    r = tg.reduce_axis(4, "r")
    L = tg.compute((), lambda: tg.sum(Y[r], r), name="L")
    feed = {X: RNG.standard_normal((4, 7)), V: RNG.uniform(0.5, 1.5, 4)}
    check_gradients(L, [X, V], feed)  # float64 central differences, element by element
    grads = tg.gradient(L, [X, V])
    want = tg.evaluate(grads, feed)
    # d/dX: 2 x at the argmax times sin(v), plus 1 in column 0
    a = np.argmax(feed[X] * feed[V][:, None], axis=1)
    dx = np.zeros((4, 7))
    dx[np.arange(4), a] += 2 * feed[X][np.arange(4), a] * np.sin(feed[V])
    dx[:, 0] += 1
    np.testing.assert_allclose(want[0], dx, rtol=1e-12)
    got = tg.build(list(grads), [X, V])(feed[X], feed[V])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)


def test_arg_reductions_are_not_differentiable_outputs_and_take_one_axis():
    X = tg.placeholder((3, 4, 5), dtype="float64", name="X")
    k, j = tg.reduce_axis(4, "k"), tg.reduce_axis(5, "j")
    A = tg.compute((3,), lambda i: tg.argmax(X[i, k, 0], k), name="A")
    with pytest.raises(UserError):
        tg.gradient(A, [X])
    with pytest.raises(UserError, match="one reduce axis"):
        tg.argmax(X[0, k, j], [k, j])
    from te_grad.autodiff.rules import REDUCTION_RULES
    from te_grad.autodiff.vjp import _seed_for_reduction
    with pytest.raises(UserError, match="integer index"):
        _seed_for_reduction(A, A.op.axes, A.op.body, None)
    assert set(REDUCTION_RULES) == set(ops.REDUCTIONS)


def test_nn_argmax_and_argmin():
    x = np.round(RNG.standard_normal((3, 4, 5)), 1)
    X = tg.placeholder(x.shape, dtype="float64", name="X")
    for axis in (0, 1, -1):
        for name in ("argmax", "argmin"):
            A = getattr(tg.nn, name)(X, axis)
            np.testing.assert_array_equal(tg.evaluate([A], {X: x})[0], getattr(np, name)(x, axis=axis))
            K = getattr(tg.nn, name)(X, axis, keepdims=True)
            np.testing.assert_array_equal(tg.build([K], [X])(x), getattr(np, name)(x, axis=axis, keepdims=True))
    with pytest.raises(UserError, match="one int"):
        tg.nn.argmax(X, [0, 1])
    with pytest.raises(UserError, match="empty axis"):
        tg.nn.argmax(tg.placeholder((3, 0), name="E"), 1)


@pytest.mark.parametrize("record", [
    ops.Reduction("peak", "The largest value.", np.maximum, r"\operatorname{peak}", "select", ">",
                  idempotent=True, selects=True),
    ops.Reduction("total", "The sum.", np.add, r"\operatorname{total}", "add"),
    ops.Reduction("first_low", "The position of the smallest.", None, r"\operatorname{low}", "select", "<",
                  idempotent=True, selects=True, indexed=True),
], ids=lambda r: r.name)
def test_a_new_reduction_kind_is_one_record(monkeypatch, record):
    """Registering a record is all the oracle, the simplifier, the scheduler, the interpreter
    and the LLVM emitter need (a derivative rule is the autodiff's, and its absence is a
    clear error)."""
    monkeypatch.setitem(ops.REDUCTIONS, record.name, record)
    X = tg.placeholder((5, 9), dtype="float64", name="X")
    k = tg.reduce_axis(9, "k")
    R = tg.compute((5,), lambda i: tg.dsl._reduction(record.name, X[i, k] * X[i, k] - X[i, k], k,
                                                      (k > 0) & (k < i + 4)), name="R")
    x = np.round(RNG.standard_normal((5, 9)), 1)
    body = np.where((np.arange(9)[None, :] > 0) & (np.arange(9)[None, :] < np.arange(5)[:, None] + 4),
                    x * x - x, np.nan)
    if record.indexed:
        want = np.nanargmin(body, axis=1)
    else:
        want = (np.nanmax if record.name == "peak" else np.nansum)(body, axis=1)
    for got in (tg.evaluate([R], {X: x})[0], tg.evaluate(simplify([R]), {X: x})[0],
                tg.build([R], [X])(x), _interpreted(R, X, x)):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    assert record.name in tg.show(R)
    with pytest.raises(UserError):
        tg.gradient(R, [X])


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_arg_reductions_split_among_threads(threads):
    X, A = _arg_graph(tg.argmax, (67, 40), 1, "float32")
    x = _data((67, 40), "float32", ties=True)
    np.testing.assert_array_equal(tg.build([A], [X], threads=threads)(x), np.argmax(x, axis=1))
    k = tg.reduce_axis(40, "k")
    B = tg.compute((67,), lambda i: tg.argmin(X[i, k] + X[i, 0], k), name="B")
    np.testing.assert_array_equal(tg.build([A, B], [X], threads=threads)(x)[1], np.argmin(x + x[:, :1], axis=1))


def test_printed_forms_of_an_argmax():
    X = tg.placeholder((4, 7), dtype="float64", name="X")
    k = tg.reduce_axis(7, "k")
    A = tg.compute((4,), lambda i: tg.argmax(X[i, k], k, where=k > 1), name="A")
    assert "argmax(X[i, k]" in tg.show(A) and "int64[4]" in tg.show(A)
    # a point outside ``where`` is no candidate: its value is -inf, not the empty result -1
    assert r"-\infty" in tg.latex(A) and r"\operatorname{argmax}" in tg.latex(A)
