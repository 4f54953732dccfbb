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
from te_grad.autodiff.rules import BINARY_RULES, INTRINSIC_RULES
from te_grad.symbolic import sympy_function, to_sympy
from te_grad.testing import check_gradients

RNG = np.random.default_rng(3)
SMOOTH = [name for name in ops.INTRINSICS if name in INTRINSIC_RULES]


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
        if name not in INTRINSIC_RULES:
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


# ---------------------------------------------------------------------------------------------
# accuracy of every intrinsic's lowering over its whole domain, against mpmath at 50 digits
# ---------------------------------------------------------------------------------------------

mpmath = pytest.importorskip("mpmath")
_mp = mpmath.mp
_REFERENCE = {
    "exp": lambda x: _mp.exp(x), "log": lambda x: _mp.log(x), "sqrt": lambda x: _mp.sqrt(x),
    "tanh": lambda x: _mp.tanh(x), "sigmoid": lambda x: 1 / (1 + _mp.exp(-x)), "abs": abs,
    "sin": lambda x: _mp.sin(x), "cos": lambda x: _mp.cos(x), "erf": lambda x: _mp.erf(x),
    "asin": lambda x: _mp.asin(x), "acos": lambda x: _mp.acos(x), "atan": lambda x: _mp.atan(x),
    "atan2": lambda y, x: _mp.atan2(y, x), "log1p": lambda x: _mp.log1p(x),
    "expm1": lambda x: _mp.expm1(x), "floor": lambda x: _mp.floor(x), "ceil": lambda x: _mp.ceil(x),
    "trunc": lambda x: _mp.floor(x) if x >= 0 else _mp.ceil(x), "round": lambda x: _mp.nint(x),
    "stop_gradient": lambda x: x,
}
# The largest error allowed, in ulps of the exact result (a subnormal result's ulp is the
# smallest subnormal), as (float64, float32). Exact operations 0, sqrt 0.5 (IEEE), the others
# a few ulps (measured on AVX-512 numpy 2.4: at most 1.3 ulps in float64, 2.3 in float32).
_ULPS = {name: (2.0, 3.0) for name in _REFERENCE}
_ULPS.update({name: (0.0, 0.0) for name in ("abs", "floor", "ceil", "trunc", "round", "stop_gradient")})
_ULPS["sqrt"] = (0.5, 0.5)
# The native float32 exp and sigmoid are inline polynomials (codegen/vecmath.py) that flush
# results below the smallest normal float to zero: their error is measured against
# max(ulp, smallest normal) there.
_FLUSHES = {("exp", "float32"), ("sigmoid", "float32")}


def _sweep(name, dtype):
    """Arguments over the function's whole domain: every binade from the smallest subnormal to
    the largest float (both signs, zeros), dense grids over the range where exp-like functions
    go from overflow to underflow, the neighbours of domain edges (1 for asin, -1 for log1p)."""
    fi = np.finfo(dtype)
    rng = np.random.default_rng(11)
    with np.errstate(over="ignore"):
        mags = np.concatenate([np.geomspace(float(fi.smallest_subnormal), float(fi.max), 200),
                               [float(fi.smallest_subnormal), float(fi.smallest_normal), 1.0, float(fi.max)]])
    xs = np.concatenate([mags, -mags, [0.0], rng.uniform(-10, 10, 80), rng.uniform(-1, 1, 40)])
    if name in ("exp", "expm1", "sigmoid", "tanh", "erf"):
        edge = 760.0 if dtype == "float64" else 110.0
        xs = np.concatenate([xs, np.linspace(-edge, edge, 500), rng.uniform(-40, 40, 100)])
    with np.errstate(over="ignore"):
        xs = xs.astype(dtype)

    def steps_from(v, toward, n=24):  # v and the n floats after it toward ``toward``
        out, v = [], np.array(v, dtype)
        for _ in range(n):
            out.append(v)
            v = np.nextafter(v, np.array(toward, dtype))
        return np.array(out, dtype)

    if name in ("log", "sqrt"):
        xs = np.concatenate([np.abs(xs), steps_from(1.0, 0.0), steps_from(1.0, 2.0)])
    elif name in ("asin", "acos"):
        xs = np.concatenate([xs[np.abs(xs) <= 1], steps_from(1.0, 0.0), steps_from(-1.0, 0.0)])
    elif name == "log1p":
        xs = np.concatenate([xs[xs >= -1], steps_from(-1.0, 0.0), rng.uniform(-1, 0, 40).astype(dtype)])
    xs = np.unique(xs)
    if ops.intrinsic(name).arity == 2:  # atan2: every quadrant, axes, tiny and huge ratios
        return [rng.choice(xs, 800), rng.choice(xs, 800)]
    return [xs]


def _ulp_errors(got, want, dtype, floor=0.0):
    """|got - want| in ulps of ``want`` rounded to ``dtype`` (inf where got misses an exact inf or nan)."""
    out = np.empty(len(want))
    big = _mp.mpf(float(np.finfo(dtype).max))
    for k, (g, w) in enumerate(zip(got, want)):
        if _mp.isnan(w) or abs(w) > 2 * big:  # nan, or beyond any rounding to the largest float
            ok = np.isnan(g) if _mp.isnan(w) else (np.isinf(g) and (g > 0) == (w > 0))
            out[k] = 0.0 if ok else np.inf
            continue
        with np.errstate(over="ignore"):
            rounded = np.array(float(w), dtype)
        if np.isinf(rounded):
            out[k] = 0.0 if g == rounded else np.inf
        elif not np.isfinite(g):
            out[k] = np.inf
        else:
            top = np.abs(rounded) == np.finfo(dtype).max  # the spacing there is the one below it
            ulp = max(float(np.spacing(np.nextafter(np.abs(rounded), 0) if top else np.abs(rounded))), floor)
            out[k] = float(abs(_mp.mpf(float(g)) - w) / _mp.mpf(ulp))
    return out


def _exact(name, args):
    with _mp.workdps(50):
        ref = _REFERENCE[name]
        return [ref(*[_mp.mpf(float(a)) for a in point]) for point in zip(*args)]


def _worst(err, args):
    k = int(np.argmax(err))
    return f"{err[k]:.3g} ulps at {[a[k] for a in args]}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(ops.INTRINSICS))
def test_reference_lowering_is_accurate_over_the_whole_domain(name, dtype):
    assert set(_REFERENCE) == set(ops.INTRINSICS), "every intrinsic needs an mpmath reference here"
    args = _sweep(name, dtype)
    want = _exact(name, args)
    xs = [tg.placeholder((len(args[0]),), name=f"x{k}", dtype=dtype) for k in range(len(args))]
    Y = tg.compute(xs[0].shape, lambda i: tg.call(name, *[x[i] for x in xs]), name="Y")
    with np.errstate(all="ignore"):
        got = tg.evaluate([Y], dict(zip(xs, args)))[0]
    assert got.dtype == np.dtype(dtype)
    err = _ulp_errors(got, want, dtype)
    bound = _ULPS[name][dtype == "float32"]
    assert err.max() <= bound, f"tg.evaluate: {name} in {dtype}: {_worst(err, args)} (bound {bound})"
    # the compiled kernel, against the same references
    with np.errstate(all="ignore"):
        compiled = tg.build([Y], xs)(*args)
    floor = float(np.finfo(dtype).smallest_normal) if (name, dtype) in _FLUSHES else 0.0
    err = _ulp_errors(compiled, want, dtype, floor)
    assert err.max() <= bound, f"tg.build: {name} in {dtype}: {_worst(err, args)} (bound {bound})"


def test_sigmoid_tails_are_exact_in_the_oracle_and_the_kernel():
    """log(sigmoid(x)) is about x far in the negative tail; 0.5 (tanh(x/2) + 1) gave -inf from -37.5."""
    for dtype, xs in (("float64", [-30.0, -40.0, -300.0, -700.0, -720.0]), ("float32", [-20.0, -40.0, -80.0])):
        X = tg.placeholder((len(xs),), name="X", dtype=dtype)
        Y = tg.compute(X.shape, lambda i: tg.log(tg.sigmoid(X[i])), name="Y")
        x = np.array(xs, dtype)
        want = np.array([float(_mp.log(1 / (1 + _mp.exp(-_mp.mpf(float(v)))))) for v in x])
        rtol = 1e-14 if dtype == "float64" else 1e-6
        np.testing.assert_allclose(tg.evaluate([Y], {X: x})[0], want, rtol=rtol)
        np.testing.assert_allclose(tg.build([Y], [X])(x), want, rtol=rtol)


def test_every_derivative_rule_names_a_record_and_ops_imports_no_builder():
    assert set(INTRINSIC_RULES) <= set(ops.INTRINSICS)
    assert set(INTRINSIC_RULES) | {"floor", "ceil", "trunc", "round", "stop_gradient"} == set(ops.INTRINSICS)
    from te_grad.autodiff.rules import REDUCTION_RULES
    assert set(REDUCTION_RULES) == set(ops.REDUCTIONS)
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(ops))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level and not n.module
                 for a in n.names}
    assert imported <= {"dtypes", "errors"}, imported
