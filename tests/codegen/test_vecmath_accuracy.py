"""The inline vector math of codegen/vecmath.py against mpmath, over each function's whole domain.

A kernel applies the intrinsic to a dense sample of its domain (every binade from the smallest
subnormal to the largest float, both signs, zeros, infinities, NaN, dense grids over the ranges
where the approximation changes, the neighbours of each range-reduction boundary) in float32 and
float64; the largest error, in ulps of the exact result rounded to the dtype, must stay within
the bound documented in codegen/vecmath.py (:data:`BOUNDS`). The lowering must be the inline
one (no libm call in the module) and stages using it keep register blocking.
"""
import re

import mpmath as mp
import numpy as np
import pytest

import te_grad as tg
from codegen.llvm_types import lowering

#: the documented maximum error in ulps, (float32, float64): codegen/vecmath.py's docstring
#: (None: the C library's function, not tested here)
BOUNDS = {"erf": (1.0, 1.5), "log": (1.0, 1.0), "sin": (1.0, 1.0), "cos": (1.0, 1.0),
          "exp": (None, 1.0), "sigmoid": (None, 2.0), "log1p": (1.0, 1.5), "expm1": (1.0, 1.0),
          "atan": (1.0, 1.0), "asin": (1.0, 1.0), "acos": (1.0, 1.0), "tanh": (1.5, 1.5)}
_CASES = [(n, d) for n in sorted(BOUNDS) for d, bound in zip(("float32", "float64"), BOUNDS[n]) if bound is not None]

_REF = {"erf": mp.erf, "log": lambda v: mp.log(v) if v >= 0 else mp.nan, "sin": mp.sin, "cos": mp.cos,
        "exp": mp.exp, "sigmoid": lambda v: 1 / (1 + mp.exp(-v)), "expm1": mp.expm1,
        "log1p": lambda v: mp.log1p(v) if v >= -1 else mp.nan, "atan": mp.atan,
        "asin": lambda v: mp.asin(v) if abs(v) <= 1 else mp.nan,
        "acos": lambda v: mp.acos(v) if abs(v) <= 1 else mp.nan, "tanh": mp.tanh}


def _near_multiples_of_half_pi(dtype):
    """Floats closest to multiples of pi/2 (where the reduction cancels most): the numerators of
    the continued-fraction convergents of pi/2 times powers of 2, the multiples k pi/2 for small
    k, and the closest of 200,000 random floats in each of a few magnitudes."""
    fi = np.finfo(dtype)
    out = []
    with mp.workdps(80):
        a, (p0, p1) = mp.pi / 2, (1, int(mp.floor(mp.pi / 2)))
        q0, q1, frac = 0, 1, mp.pi / 2 - mp.floor(mp.pi / 2)
        while p1 < 2.0 ** fi.nmant * 4:
            if p1 > 0:
                out += [p1 * 2.0 ** j for j in range(0, int(fi.maxexp) - 60, 7)]
            frac = 1 / frac
            t = int(mp.floor(frac))
            frac -= t
            p0, p1, q0, q1 = p1, t * p1 + p0, q1, t * q1 + q0
    out += [float(k * mp.pi / 2) for k in range(1, 64)]
    rng = np.random.default_rng(11)
    for hi in (2.0 ** 10, 2.0 ** 20, 2.0 ** 30, 2.0 ** 40):
        x = rng.uniform(1, hi, 200000).astype(dtype)
        f = np.asarray(x, np.longdouble) * (2 / np.longdouble(np.pi))
        out += list(x[np.argsort(np.abs(f - np.round(f)))[:100]])
    with np.errstate(over="ignore"):
        x = np.array(out, dtype)
    return x[np.isfinite(x)]


def _neighbours(v, dtype, n=16):
    out, a, z = [], np.array(v, dtype), np.array(v, dtype)
    for _ in range(n):
        out += [a, z]
        a = np.nextafter(a, np.array(np.inf, dtype))
        z = np.nextafter(z, np.array(-np.inf, dtype))
    return out


def _sample(name, dtype):
    fi = np.finfo(dtype)
    rng = np.random.default_rng(7)
    with np.errstate(over="ignore"):
        mags = np.geomspace(float(fi.smallest_subnormal), float(fi.max), 3000)
    xs = [mags, -mags, [0.0, -0.0, np.inf, -np.inf, np.nan, float(fi.smallest_subnormal),
                        float(fi.smallest_normal), float(fi.max)]]
    if name == "erf":
        edges = [0.875, 2.5, 4.0, 6.0]
        xs += [np.linspace(-7, 7, 20001), rng.uniform(-1, 1, 4000), rng.uniform(0.8, 6.5, 4000)]
        xs += [np.array(_neighbours(s * e, dtype)) for e in edges for s in (1, -1)]
    if name == "log":
        edges = [1.0, 2 ** 0.5, 2 ** -0.5, 2.0, 0.5, float(fi.smallest_normal)]
        xs += [np.linspace(0, 4, 20001), rng.uniform(0.5, 2, 4000), np.exp(rng.uniform(-700, 700, 4000)),
               [-1.0, -float(fi.smallest_subnormal)]]
        xs += [np.array(_neighbours(e, dtype)) for e in edges]
    if name in ("sin", "cos"):
        edges = [np.pi / 4, np.pi / 2, 3 * np.pi / 4, np.pi, 2.0 ** 20, 2.0 ** 40, 2.0 ** 60]
        xs += [np.linspace(-10, 10, 20001), rng.uniform(-1e4, 1e4, 4000), _near_multiples_of_half_pi(dtype),
               [6381956970095103.0 * 2.0 ** 797]]  # the hardest double
        xs += [np.array(_neighbours(s * e, dtype)) for e in edges for s in (1, -1)]
    if name in ("exp", "expm1", "sigmoid", "tanh"):
        ln2 = np.log(2.0)
        edges = [709.782712893384, -745.1332191019412, -708.3964185322641, 88.72283935546875, -87.33654475,
                 -103.97, -45.0, -17.4, 53.5 * ln2, 54.5 * ln2, 2.0 ** -26, 2.0 ** -53]
        edges += [(k + 0.5) * ln2 for k in range(-4, 4)]
        xs += [np.linspace(-750, 750, 20001), np.linspace(-2, 2, 20001), rng.uniform(-40, 40, 4000)]
        xs += [np.array(_neighbours(s * e, dtype)) for e in edges for s in (1, -1)]
    if name == "log1p":
        edges = [-1.0, 2 ** 0.5 - 1, 2 ** -0.5 - 1, 1.0, -0.5, 2.0 ** -26, 2.0 ** -53, 2.0 ** 53, 2.0 ** 24]
        xs += [np.linspace(-1, 4, 20001), rng.uniform(-0.5, 0.5, 4000), np.exp(rng.uniform(-700, 700, 4000)),
               -np.exp(rng.uniform(-700, 0, 4000)), [-2.0, -float(fi.max)]]
        xs += [np.array(_neighbours(s * e, dtype)) for e in edges for s in (1, -1)]
    if name == "atan":
        edges = [7 / 16, 11 / 16, 19 / 16, 39 / 16, 1.0, 2.0 ** 27, 2.0 ** 60]
        xs += [np.linspace(-5, 5, 20001), rng.uniform(-1e3, 1e3, 4000)]
        xs += [np.array(_neighbours(s * e, dtype)) for e in edges for s in (1, -1)]
    if name in ("asin", "acos"):
        edges = [0.5, 1.0, 2.0 ** -26, 0.99, 1e-3]
        xs += [np.linspace(-1, 1, 20001), rng.uniform(-1, 1, 4000), 1 - np.exp(rng.uniform(-36, 0, 4000)),
               -1 + np.exp(rng.uniform(-36, 0, 4000))]
        xs += [np.array(_neighbours(s * e, dtype)) for e in edges for s in (1, -1)]
    with np.errstate(over="ignore"):
        return np.concatenate([np.asarray(a, dtype=dtype).ravel() for a in xs])


def _ulps(got, x, name, dtype):
    """|got - f(x)| in ulps of f(x) rounded to ``dtype`` (inf for a missed nan / inf)."""
    err = np.zeros(len(x))
    fi = np.finfo(dtype)
    with mp.workdps(60):
        for k, (g, v) in enumerate(zip(got.tolist(), x.tolist())):
            if np.isnan(v):
                err[k] = 0.0 if np.isnan(g) else np.inf
                continue
            w = _REF[name](mp.mpf(v))
            if mp.isnan(w):
                err[k] = 0.0 if np.isnan(g) else np.inf
                continue
            with np.errstate(over="ignore"):
                r = np.array(float(w), dtype)
            if not np.isfinite(r) or not np.isfinite(g):
                err[k] = 0.0 if g == r else np.inf
                continue
            a = abs(r)
            ulp = float(np.spacing(np.nextafter(a, np.array(0, dtype)) if a == fi.max else a))
            err[k] = float(abs(mp.mpf(g) - w) / ulp)
    return err


@pytest.mark.parametrize("name, dtype", _CASES)
def test_inline_intrinsic_within_documented_ulps(name, dtype):
    assert lowering(name, dtype)[0] == "inline"
    x = _sample(name, dtype)
    X = tg.placeholder((len(x),), name="X", dtype=dtype)
    Y = tg.compute(X.shape, lambda i: tg.call(name, X[i]), name="Y")
    kern = tg.build([Y], [X])
    called = set(re.findall(r"call [^@]*@([\w.]+)", kern.llvm_ir))
    assert not {f for f in called if not f.startswith(("llvm.", "stage"))}, f"{name} {dtype} calls {called}"
    with np.errstate(all="ignore"):
        got = kern(x)
    err = _ulps(got, x, name, dtype)
    k = int(np.argmax(err))
    bound = BOUNDS[name][dtype == "float64"]
    assert err[k] <= bound, f"{name} {dtype}: {err[k]:.3g} ulps at x = {x[k]!r} (got {got[k]!r}, bound {bound})"
    zeros = x == 0  # odd functions keep the sign of zero
    if name in ("sin", "erf", "log1p", "expm1", "atan", "asin", "tanh"):
        np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(x[zeros]))


AVX2 = dict(vector_bits=256, vector_registers=16, l1_bytes=32 * 1024, l2_bytes=1 << 20)
_MARKERS = {"RegisterBlocked": (": in vector registers across the loops below", ": lanes of a vector accumulator"),
            "Transposed": ("// 8 x 8: rows of ",)}


def _blocked_kernels(name, dtype):
    """A transpose (8 x 8 blocks exist in float32 only) and a matmul with the intrinsic inside
    the blocked statement."""
    from codegen.machine import Machine
    machine = Machine(**AVX2)
    X = tg.placeholder((64, 64), name="X", dtype=dtype)
    T = tg.compute((64, 64), lambda i, j: tg.call(name, X[j, i]), name="T")
    W = tg.placeholder((32, 16), name="W", dtype=dtype)
    A = tg.placeholder((16, 32), name="A", dtype=dtype)
    k = tg.reduce_axis(32, "k")
    M = tg.compute((16, 16), lambda i, j: tg.sum(tg.call(name, A[i, k]) * W[k, j], axis=k), name="M")
    cases = [("RegisterBlocked", M, [A, W])]
    return cases + [("Transposed", T, [X])] * (dtype == "float32"), machine


@pytest.mark.parametrize("name, dtype", _CASES)
def test_stages_with_inline_intrinsics_keep_register_blocks(name, dtype):
    """A libm call lane by lane turned these blocks off; the inline forms keep them."""
    cases, machine = _blocked_kernels(name, dtype)
    rng = np.random.default_rng(3)
    for kind, y, inputs in cases:
        kern = tg.build([y], inputs, machine=machine)
        assert sum(kern.loops.count(m) for m in _MARKERS[kind]) >= 1, kern.loops
        feed = [rng.uniform(-2, 2, x.shape).astype(dtype) for x in inputs]
        (want,) = tg.evaluate([y], dict(zip(inputs, feed)))
        tol = 1e-5 if dtype == "float32" else 1e-13
        np.testing.assert_allclose(kern(*feed), want, rtol=tol, atol=tol)


def _pow_sample(dtype):
    """(x, y) pairs for pow: x over every binade of both signs, zeros, infinities, NaN, +-1;
    y integers (odd, even, large), halves, small and large fractions, +-inf, NaN; plus random
    pairs whose results span the range from subnormal to overflow, and bases near 1."""
    fi = np.finfo(dtype)
    with np.errstate(over="ignore"):
        mags = np.geomspace(float(fi.smallest_subnormal), float(fi.max), 120)
    one = np.array(1, dtype)
    xs = np.concatenate([mags, -mags, [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0,
                                       np.nextafter(one, 0 * one), np.nextafter(one, 2 * one)]])
    ys = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, 1 / 3, 1e-3, -1e-3, 7.0, -7.0, 100.5,
                   2.0 ** 24 + 2, 2.0 ** 24 - 1, 2.0 ** 30, -(2.0 ** 23 + 1), 2.0 ** 53 + 2, 2.0 ** 52 + 1, 1e10,
                   np.inf, -np.inf, np.nan])
    X, Y = np.meshgrid(xs, ys)
    rng = np.random.default_rng(5)
    rx = np.exp(rng.uniform(-30, 30, 20000)) * rng.choice([1.0, -1.0], 20000)
    ry = np.where(rng.random(20000) < 0.5, np.round(rng.uniform(-40, 40, 20000)), rng.uniform(-40, 40, 20000))
    top = 100 if dtype == "float32" else 760
    bx = np.exp(rng.uniform(-5, 5, 20000))                        # results near over- and underflow
    by = rng.choice([1.0, -1.0], 20000) * rng.uniform(0.75 * top, 1.1 * top, 20000) / np.abs(np.log(bx))
    x = np.concatenate([X.ravel(), rx, bx, rng.uniform(0, 2, 5000), rng.uniform(0.9, 1.1, 5000)])
    y = np.concatenate([Y.ravel(), ry, by, rng.uniform(-200, 200, 5000), rng.uniform(-1e4, 1e4, 5000)])
    with np.errstate(over="ignore"):
        return x.astype(dtype), y.astype(dtype)


@pytest.mark.parametrize("dtype, bound", [("float32", 1.0), ("float64", 1.5)])
def test_inline_pow_within_documented_ulps_and_ieee_special_cases(dtype, bound):
    """x ** y is inline (no libm pow per lane): within its documented bound of mpmath where the
    inputs are finite, x is nonzero and the result is real; elsewhere exactly the C library's
    special values (numpy's float64 pow rounded to the dtype: signs of zeros and infinities, NaN
    for a negative base with a non-integer exponent, 1 for y = 0 or x = 1)."""
    x, y = _pow_sample(dtype)
    X = tg.placeholder((len(x),), name="X", dtype=dtype)
    Y = tg.placeholder((len(x),), name="Y", dtype=dtype)
    Z = tg.compute(X.shape, lambda i: X[i] ** Y[i], name="Z")
    kern = tg.build([Z], [X, Y])
    assert "llvm.pow" not in str(kern.llvm_ir) and "@pow" not in str(kern.llvm_ir)
    with np.errstate(all="ignore"):
        got = kern(x, y)
        special = np.power(x.astype(np.float64), y.astype(np.float64)).astype(dtype)
    fi = np.finfo(dtype)
    worst = (0.0, None)
    with mp.workdps(60):
        for k, (a, e, g) in enumerate(zip(x.tolist(), y.tolist(), got.tolist())):
            real = np.isfinite(a) and np.isfinite(e) and a != 0 and (a > 0 or e == int(e))
            if not real or a == 1 or e == 0:
                s = special[k]
                assert (np.isnan(g) and np.isnan(s)) or (g == s and np.signbit(g) == np.signbit(s)), \
                    f"pow({a!r}, {e!r}) = {g!r}, want {s!r}"
                continue
            w = mp.power(abs(mp.mpf(a)), mp.mpf(e)) * (-1 if a < 0 and int(e) % 2 else 1)
            with np.errstate(over="ignore", under="ignore"):
                r = np.array(float(w), dtype) if abs(w) < mp.mpf(2) ** 1100 else np.array(np.inf * mp.sign(w), dtype)
            if not np.isfinite(r):
                assert g == r, f"pow({a!r}, {e!r}) = {g!r}, want {r!r}"
                continue
            ulp = float(np.spacing(np.nextafter(fi.max, np.array(0, dtype)) if abs(r) == fi.max else np.abs(r)))
            err = float(abs(mp.mpf(g) - w) / ulp)
            if err > worst[0]:
                worst = (err, (a, e, g))
    print(f"pow {dtype}: {worst[0]:.3g} ulps at (x, y, got) = {worst[1]}")
    assert worst[0] <= bound, f"pow {dtype}: {worst[0]:.3g} ulps at (x, y, got) = {worst[1]}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pow_keeps_register_blocks(dtype):
    """pow is inline: a matmul computing it keeps its register block (a libm pow lane by lane
    would switch it off)."""
    from codegen.machine import Machine
    A = tg.placeholder((16, 32), name="A", dtype=dtype)
    W = tg.placeholder((32, 16), name="W", dtype=dtype)
    k = tg.reduce_axis(32, "k")
    M = tg.compute((16, 16), lambda i, j: tg.sum(A[i, k] ** W[k, j], axis=k), name="M")
    kern = tg.build([M], [A, W], machine=Machine(**AVX2))
    blocked = sum(kern.loops.count(m) for m in _MARKERS["RegisterBlocked"]) >= 1
    assert blocked, kern.loops
    rng = np.random.default_rng(4)
    a, w = rng.uniform(0.5, 2, A.shape).astype(dtype), rng.uniform(-2, 2, W.shape).astype(dtype)
    np.testing.assert_allclose(kern(a, w), (a[:, :, None] ** w[None]).sum(1), rtol=1e-5)


def test_inline_atan2_within_documented_ulps_and_special_cases():
    """atan2 in float32 and float64 against mpmath (mp.atan2) over pairs covering every binade,
    both signs, zeros, infinities and NaN, and the quadrant boundaries; exact results (signed
    zeros, +-pi, +-pi/2, +-pi/4, +-3pi/4) compared with their sign bits."""
    for dtype, bound in (("float32", 1.0), ("float64", 2.0)):
        fi = np.finfo(dtype)
        with np.errstate(over="ignore"):
            mags = np.geomspace(float(fi.smallest_subnormal), float(fi.max), 60)
        vals = np.concatenate([mags, -mags, [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0]])
        Yg, Xg = np.meshgrid(vals, vals)
        rng = np.random.default_rng(9)
        ang = rng.uniform(-np.pi, np.pi, 20000)
        rad = np.exp(rng.uniform(-20, 20, 20000))
        y = np.concatenate([Yg.ravel(), rad * np.sin(ang), rng.uniform(-1, 1, 3000)]).astype(dtype)
        x = np.concatenate([Xg.ravel(), rad * np.cos(ang), rng.choice([-1.0, 1.0], 3000)]).astype(dtype)
        Y = tg.placeholder((len(x),), name="Y", dtype=dtype)
        X = tg.placeholder((len(x),), name="X", dtype=dtype)
        Z = tg.compute(X.shape, lambda i: tg.atan2(Y[i], X[i]), name="Z")
        assert lowering("atan2", dtype)[0] == "inline"
        with np.errstate(all="ignore"):
            got = tg.build([Z], [Y, X])(y, x)
            special = np.arctan2(y.astype(np.float64), x.astype(np.float64)).astype(dtype)
        worst = (0.0, None)
        with mp.workdps(60):
            for k, (a, e, g) in enumerate(zip(y.tolist(), x.tolist(), got.tolist())):
                if not (np.isfinite(a) and np.isfinite(e)) or a == 0 or e == 0:
                    s = special[k]
                    assert (np.isnan(g) and np.isnan(s)) or (g == s and np.signbit(g) == np.signbit(s)), \
                        f"{dtype} atan2({a!r}, {e!r}) = {g!r}, want {s!r}"
                    continue
                w = mp.atan2(mp.mpf(a), mp.mpf(e))
                r = np.array(float(w), dtype)
                ulp = float(np.spacing(np.abs(r)))
                err = float(abs(mp.mpf(g) - w) / ulp)
                if err > worst[0]:
                    worst = (err, (a, e, g))
        print(f"atan2 {dtype}: {worst[0]:.3g} ulps at (y, x, got) = {worst[1]}")
        assert worst[0] <= bound, f"atan2 {dtype}: {worst[0]:.3g} ulps at (y, x, got) = {worst[1]}"
