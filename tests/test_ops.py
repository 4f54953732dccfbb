"""The op table (te_grad/ops.py) is complete: every stage handles every record.

Each intrinsic: a DSL function with a docstring, a numpy lowering, a printed name,
a native lowering that matches numpy, and a derivative rule that matches sympy's
derivative of the same function at random points (float32 and float64) and
float64 finite differences.
"""
import numpy as np
import pytest
import sympy

import te_grad as tg
from te_grad import ops
from te_grad.autodiff.rules import BINARY_RULES
from te_grad.symbolic import sympy_function, to_sympy
from te_grad.testing import check_gradients

RNG = np.random.default_rng(3)
SMOOTH = [name for name, op in ops.INTRINSICS.items() if op.derivative is not None]


def _points(op, n=9, dtype="float64"):
    lo, hi = op.domain
    return [RNG.uniform(lo, hi, n).astype(dtype) for _ in range(op.arity)]


def _graph(name, dtype, n=9):
    op = ops.intrinsic(name)
    xs = [tg.placeholder((n,), name=f"x{k}", dtype=dtype) for k in range(op.arity)]
    Y = tg.compute((n,), lambda i: tg.call(name, *[x[i] for x in xs]), name="Y")
    return op, xs, Y


@pytest.mark.parametrize("name", list(ops.INTRINSICS))
def test_every_record_is_complete(name):
    op = ops.intrinsic(name)
    fn = getattr(tg, name)
    assert callable(fn) and fn.__doc__ and op.math in fn.__doc__ or name in ("abs", "stop_gradient")
    assert op.doc and op.math and op.latex or name == "stop_gradient" or op.latex is None
    assert op.c_name or op.llvm or name in ("sigmoid", "stop_gradient"), "no native lowering"
    assert name in tg.ir.INTRINSICS


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(ops.INTRINSICS))
def test_evaluator_printer_and_native_code_agree(name, dtype):
    op, xs, Y = _graph(name, dtype)
    args = _points(op, dtype=dtype)
    feed = dict(zip(xs, args))
    want = op.numpy(*[a.astype(np.float64) for a in args])
    got = tg.evaluate([Y], feed)[0]
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, want, rtol=2e-6 if dtype == "float32" else 1e-14, atol=1e-7)
    assert f"{name}(" in tg.show(Y)
    compiled = tg.build([Y], xs)(*args)
    np.testing.assert_allclose(compiled, got, rtol=4e-6 if dtype == "float32" else 1e-14, atol=1e-7)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", SMOOTH)
def test_derivative_rules_match_sympy(name, dtype):
    op, xs, Y = _graph(name, dtype)
    args = _points(op, dtype=dtype)
    grads = tg.gradient(Y, xs)
    got = tg.evaluate(grads, dict(zip(xs, args)))
    symbols = sympy.symbols(f"a0:{op.arity}", real=True)
    f = sympy_function(name)(*symbols)
    for k, g in enumerate(got):
        deriv = sympy.lambdify(symbols, sympy.diff(f, symbols[k]), modules=["numpy", {"erf": np.vectorize(
            __import__("math").erf)}])
        want = np.broadcast_to(np.asarray(deriv(*[a.astype(np.float64) for a in args]), np.float64), g.shape)
        np.testing.assert_allclose(g, want, rtol=2e-5 if dtype == "float32" else 1e-12, atol=1e-6,
                                   err_msg=f"d {name} / d argument {k} ({op.math})")


@pytest.mark.parametrize("name", SMOOTH)
def test_derivative_rules_match_finite_differences(name):
    op, xs, Y = _graph(name, "float64", n=5)
    check_gradients(Y, xs, dict(zip(xs, _points(op, n=5))))


def test_piecewise_constant_functions_have_zero_derivative():
    for name, op in ops.INTRINSICS.items():
        if op.derivative is None:
            _, xs, Y = _graph(name, "float64")
            for g in tg.evaluate(tg.gradient(Y, xs), {x: _points(op)[0] for x in xs}):
                assert not np.any(g)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "max", "min"])
def test_binary_rules_match_sympy(op):
    a, b = (tg.placeholder((7,), name=n, dtype="float64") for n in "ab")
    av, bv = RNG.uniform(0.5, 2.0, 7), RNG.uniform(0.5, 2.0, 7) + 0.01  # no ties
    Y = tg.compute((7,), lambda i: tg.dsl.binary(op, a[i], b[i]), name="Y")
    ga, gb = tg.evaluate(tg.gradient(Y, [a, b]), {a: av, b: bv})
    sa, sb = sympy.symbols("sa sb", positive=True)
    f = to_sympy(Y.op.body).subs({sympy.IndexedBase("a")[sympy.Symbol("i", integer=True)]: sa,
                                  sympy.IndexedBase("b")[sympy.Symbol("i", integer=True)]: sb})
    for g, s in ((ga, sa), (gb, sb)):
        want = sympy.lambdify((sa, sb), sympy.diff(f, s))(av, bv)
        np.testing.assert_allclose(g, np.broadcast_to(want, g.shape), rtol=1e-12)
    assert op in BINARY_RULES and op in ops.BINARY_OPS


def test_every_binary_operator_has_a_rule_and_a_lowering():
    for name, op in ops.BINARY_OPS.items():
        if op.floats:
            assert name in BINARY_RULES, name


def test_new_functions_differentiate_inside_reductions_and_compile():
    X = tg.placeholder((4, 6), name="X", dtype="float64")
    k = tg.reduce_axis(6, "k")
    Y = tg.compute((4,), lambda i: tg.sum(tg.atan2(tg.log1p(X[i, k] * X[i, k]), tg.expm1(X[i, k]) + 2.0)
                                          * tg.asin(0.5 * tg.tanh(X[i, k])) + tg.acos(0.3 * X[i, k])
                                          * tg.atan(X[i, k]), axis=k), name="Y")
    feed = {X: RNG.uniform(-1, 1, (4, 6))}
    check_gradients(Y, [X], feed, full_limit=0)
    g, = tg.gradient(Y, [X])
    np.testing.assert_allclose(tg.build([g], [X])(feed[X]), tg.evaluate([g], feed)[0], rtol=1e-12)


def test_latex_rendering():
    X = tg.placeholder((4, 5), name="X")
    k = tg.reduce_axis(5, "k")
    Y = tg.compute((4,), lambda i: tg.max(tg.exp(X[i, k]), axis=k, where=k < i), name="Y")
    text = Y._repr_latex_()
    assert text.startswith("$$") and r"\max_{k=0}^{4}" in text and "e^{{X}_{i,k}}" in text
    assert tg.placeholder((2,), name="P")._repr_latex_() is None
    g, = tg.gradient(Y, [X])
    assert "{dX}_{" in tg.latex([g])
