"""Vectorizable math (tanh, exp, sigmoid, erf, log, log1p, expm1, pow, atan, atan2, asin, acos in
float32 and float64; sin and cos in :mod:`codegen.trig`), emitted inline as LLVM IR.

libm's ``expf``/``tanhf``/``erf`` are opaque calls that stop LLVM's loop vectorizer
(and register blocking); these are plain branch-free arithmetic (both sides of a
range split computed and selected), so loops over them vectorize (8 lanes with AVX2).

Maximum error in ulps of the exact result, over the whole domain (measured against
mpmath by tests/codegen/test_vecmath_accuracy.py, which checks the bound):

============  =========  =========  ==========================================
function      float32    float64    notes
============  =========  =========  ==========================================
exp           1          1 (0.81)   float32 results below the smallest normal
                                    flush to 0; float64's underflow gradually
tanh          1.5 (1.14) 1.5 (1.19)
sigmoid       1 to 3     2 (1.89)
erf           1 (0.95)   1.5 (1.44)  measured maximum in parentheses
log           1 (0.75)   1 (0.78)   NaN below 0, -inf at +-0, subnormals exact
sin, cos      1 (0.50)   1 (0.75,   every float up to the largest, exactly
                         0.85)      reduced; NaN at +-inf
log1p         1 (0.50)   1.5 (1.11) -inf at -1, NaN below
expm1         1 (0.50)   1 (0.81)   -1 below -45, inf above 709.78
pow           1 (0.50)   1.5 (1.25) IEEE pow's special cases (C99 Annex F)
atan          1 (0.50)   1 (0.74)   +-pi/2 at +-inf
atan2         1 (0.50)   2 (1.27)   C99's special cases (zeros, infinities)
asin          1 (0.50)   1 (0.78)   NaN outside [-1, 1]
acos          1 (0.50)   1 (0.87)   NaN outside [-1, 1]
============  =========  =========  ==========================================

- ``exp``: ``x = n ln2 + r`` with ``n = roundeven(x / ln2)``, ``|r| <= ln2/2``
  (ln2 split in two parts for exactness); ``e^r`` by its degree-7 Taylor
  polynomial (relative error below 1e-8 on that range); ``2^n`` built in the
  exponent bits (as ``2 * 2^(n-1)``, so ``n = 128`` near the top of the range is finite). Results below the smallest normal float flush to 0; above
  the largest float, +inf; NaN stays NaN.
- ``tanh``: Cephes' odd polynomial for ``|x| < 0.625``, else
  ``1 - 2 / (exp(2|x|) + 1)`` with the sign restored (no cancellation either side).
- ``tanh`` (float64): Cephes' rational form ``x + x z P(z) / Q(z)`` below 0.625, the float32
  form's ``1 - 2 / (exp(2|x|) + 1)`` above, the sign restored.
- ``sigmoid``: ``1 / (1 + exp(-x))``, exact limits 0 and 1; float64: with ``e = exp_f64(-|x|)``,
  ``1 / (1 + e)`` or ``e / (1 + e)`` (no overflow in either tail).
- ``erf``: ``|x| < 0.875``: ``x + x (P(x^2) - 1)``; above, ``1 - erfc(|x|)``, the sign
  restored; clamped where erf rounds to 1 (4 in float32, 6 in float64); NaN stays NaN,
  subnormals keep ``2 x / sqrt(pi)``. float32: ``erfc = 2^Q`` with ``Q`` one polynomial
  approximation of ``log2(erfc)`` on ``[0.875, 4]`` and ``2^Q = 2^n 2^f`` (``f`` a degree-6
  fit, ``n`` added into the exponent bits: no clamps, as ``Q`` stays in ``[-26, -2.2]``).
  float64: ``e^Q`` with ``Q`` approximating ``log(erfc)`` on two intervals (coefficients
  selected per lane) and ``exp_f64`` (degree-13 Taylor polynomial, gradual underflow).
- ``log``: fdlibm's reduction ``x = 2^e (1 + f)``, ``1 + f`` in ``[sqrt(1/2), sqrt(2))``
  (subnormals scaled by ``2^23`` / ``2^52`` first), ``log(1 + f) = f - (f^2/2 - s (f^2/2 + R))``
  with ``s = f / (2 + f)`` and ``R`` the Taylor series of ``2 atanh(s) / s - 2`` in ``s^2``
  (4 terms in float32, 10 in float64), plus ``e ln2`` split in two parts.
- ``sin``, ``cos``: exact reductions and double-double polynomials, in :mod:`codegen.trig`.
- ``exp`` (float64): ``exp_f64`` (see erf).
- ``log1p``: ``u + c = 1 + x`` exactly (two-sum), ``log(u) + c / u`` with the float64 ``log``;
  ``x - x^2/2 + x^3/3 - x^4/4`` for ``|x| < 2^-20``. float32 computes in float64.
- ``expm1``: ``x = n ln2 + r`` (``r`` double-double; ``n = 0`` up to ``|x| = 1/2``), Taylor to
  ``r^16``, then ``2^n expm1(r) + (2^n - 1)`` in one fused multiply-add (for ``n > 53``:
  ``2^n (expm1(r) - 2^-n) + 2^n``). float32 computes in float64.
- ``pow``: float32 ``exp_f64(y log_f64(|x|))`` in float64 (the exponent's error stays under
  ``2^-44`` where the float32 result is finite and nonzero); float64 ``t = y log|x|`` in
  double-double (``_log_dd``: fdlibm's reduction, ``2 atanh(s)`` with ``s`` and its leading
  series terms in double-double, about ``2^-75`` relative), then ``exp_f64(t_hi) (1 + t_lo)``.
  The sign and IEEE's special cases by selects.
- ``atan``: fdlibm's reduction ``atan(x) = atan(c) + atan((x - c) / (1 + c x))`` with ``c`` in
  0, 1/2, 1, 3/2 by interval (selected per lane), ``-1/x`` and ``pi/2`` above 39/16; an odd
  polynomial on ``|t| <= 7/16``. ``atan2``: ``atan(|y| / |x|)``, ``pi - z`` (pi in two parts) for a
  negative x, y's sign. ``asin``, ``acos``: fdlibm's arrangements, ``sqrt((1 - |x|) / 2)`` in two
  parts above 1/2. float32 forms compute in float64.
"""
from __future__ import annotations

from .llvm import ir

F32 = ir.FloatType()
F64 = ir.DoubleType()
I32 = ir.IntType(32)
I64 = ir.IntType(64)

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_EXP_HI = 88.72283935546875     # above: +inf
_EXP_LO = -87.33654475          # below: flushed to 0
_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
              -3.33332819422e-1)


def _elem(x):
    return x.type.element if isinstance(x.type, ir.VectorType) else x.type


def _like(x, v):
    """The float constant ``v`` of ``x``'s element type, splat to a vector if ``x`` is one."""
    ft = _elem(x)
    if isinstance(x.type, ir.VectorType):
        return ir.Constant(x.type, [ir.Constant(ft, v)] * x.type.count)
    return ir.Constant(ft, v)


def _int_type(x):
    """The integer type of ``x``'s width (i32 for float32, i64 for float64), vector if ``x`` is."""
    it = I64 if isinstance(_elem(x), ir.DoubleType) else I32
    return ir.VectorType(it, x.type.count) if isinstance(x.type, ir.VectorType) else it


def _int_like(x, v):
    it = _int_type(x)
    if isinstance(it, ir.VectorType):
        return ir.Constant(it, [ir.Constant(it.element, v)] * it.count)
    return ir.Constant(it, v)


def _suffix(ty) -> str:
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{_suffix(ty.element)}"
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    return f"i{ty.width}"


def intrinsic(module: ir.Module, name: str, ty, nargs: int):
    """The overloaded LLVM intrinsic ``name`` for scalar or vector type ``ty`` (declared once)."""
    full = f"{name}.{_suffix(ty)}"
    fn = module.globals.get(full)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ty, [ty] * nargs), full)
    return fn


def _fn(module, name, x, nargs):
    return intrinsic(module, name, x.type, nargs)


def exp_f32(b: ir.IRBuilder, module: ir.Module, x):
    """e^x for a float32 scalar or vector ``x``."""
    flags = ("contract",)
    c = lambda v: _like(x, v)  # noqa: E731
    xc = b.call(_fn(module, "llvm.minnum", x, 2),
                [b.call(_fn(module, "llvm.maxnum", x, 2), [x, c(_EXP_LO)]), c(_EXP_HI)])
    n = b.call(_fn(module, "llvm.roundeven", x, 1), [b.fmul(xc, c(_LOG2E))])
    r = b.fsub(b.fsub(xc, b.fmul(n, c(_LN2_HI)), flags=flags), b.fmul(n, c(_LN2_LO)), flags=flags)
    # 2 e^r (the coefficients doubled, exactly) times 2^(n-1): n reaches 128 from x = 88.38,
    # and 2^128 has no exponent bits; 2^(n-1) is 2^-127 (a subnormal, bits 1 << 22) at n = -126
    p = c(2.0 / 5040)
    for k in (720, 120, 24, 6, 2, 1, 1):
        p = b.fadd(b.fmul(p, r, flags=flags), c(2.0 / k), flags=flags)
    ity = ir.VectorType(I32, x.type.count) if isinstance(x.type, ir.VectorType) else I32
    bits = b.shl(b.add(b.fptosi(n, ity), _int_like(x, 126)), _int_like(x, 23))
    bits = b.select(b.icmp_signed("<", bits, _int_like(x, 1 << 22)), _int_like(x, 1 << 22), bits)
    y = b.fmul(p, b.bitcast(bits, x.type))
    y = b.select(b.fcmp_ordered("<", x, c(_EXP_LO)), c(0.0), y)
    y = b.select(b.fcmp_ordered(">", x, c(_EXP_HI)), c(float("inf")), y)
    return b.select(b.fcmp_unordered("uno", x, x), x, y)


def tanh_f32(b: ir.IRBuilder, module: ir.Module, x):
    """tanh(x) for a float32 scalar or vector ``x``."""
    c = lambda v: _like(x, v)  # noqa: E731
    ax = b.call(_fn(module, "llvm.fabs", x, 1), [x])
    z = b.fmul(x, x)
    p = c(_TANH_POLY[0])
    for coef in _TANH_POLY[1:]:
        p = b.fadd(b.fmul(p, z), c(coef))
    small = b.fadd(x, b.fmul(b.fmul(x, z), p))
    e = exp_f32(b, module, b.fmul(ax, c(2.0)))
    large = b.fsub(c(1.0), b.fdiv(c(2.0), b.fadd(e, c(1.0))))
    return b.call(_fn(module, "llvm.copysign", x, 2), [b.select(b.fcmp_ordered("<", ax, c(0.625)), small, large), x])


def sigmoid_f32(b: ir.IRBuilder, module: ir.Module, x):
    """1 / (1 + e^-x) for a float32 scalar or vector ``x``."""
    e = exp_f32(b, module, b.fneg(x))
    return b.fdiv(_like(x, 1.0), b.fadd(_like(x, 1.0), e))


def _poly(b, u, coeffs):
    """Horner's rule for ``coeffs`` (highest degree first, floats or values) at ``u``."""
    c = lambda v: _like(u, v) if isinstance(v, float) else v  # noqa: E731
    p = c(coeffs[0])
    for coef in coeffs[1:]:
        p = b.fadd(b.fmul(p, u, flags=("contract",)), c(coef), flags=("contract",))
    return p


def _pick(b, cond, x, pairs):
    return [b.select(cond, _like(x, a), _like(x, z)) for a, z in pairs]


def _pow2(b, n_int, x):
    """2^n as a float of ``x``'s type, for an integer ``n`` in the normal exponent range."""
    f64 = isinstance(_elem(x), ir.DoubleType)
    bias, shift = (1023, 52) if f64 else (127, 23)
    return b.bitcast(b.shl(b.add(n_int, _int_like(x, bias)), _int_like(x, shift)), x.type)


def _fma(b, module, a, x, y):
    """``a x + y`` rounded once (llvm.fma: exact products for the double-word arithmetic below)."""
    return b.call(_fn(module, "llvm.fma", a, 3), [a, x, y])


def _two_sum(b, a, z):
    """``(s, e)`` with ``s = fl(a + z)`` and ``a + z = s + e`` exactly (Knuth)."""
    s = b.fadd(a, z)
    bb = b.fsub(s, a)
    e = b.fadd(b.fsub(a, b.fsub(s, bb)), b.fsub(z, bb))
    return s, e


def lanewise(b, args, f):
    """``f`` applied lane by lane to the vectors ``args`` (all of one lane count), the results
    as a vector; ``f(*args)`` for scalars."""
    vt = args[0].type
    if not isinstance(vt, ir.VectorType):
        return f(*args)
    out = None
    for k in range(vt.count):
        lane = ir.Constant(I32, k)
        y = f(*[b.extract_element(a, lane) for a in args])
        out = ir.Constant(ir.VectorType(y.type, vt.count), ir.Undefined) if out is None else out
        out = b.insert_element(out, y, lane)
    return out


_LN2_HI_D = 6.93147180369123816490e-01    # fdlibm's ln2 split: n * hi is exact for |n| < 2^11
_LN2_LO_D = 1.90821492927058770002e-10
_EXP_HI_D = 709.782712893384              # above: +inf
_EXP_LO_D = -745.1332191019412            # below: 0


def exp_f64(b: ir.IRBuilder, module: ir.Module, x):
    """e^x for a float64 scalar or vector ``x``: ``x = n ln2 + r``, ``|r| <= ln2/2``, ``e^r`` by its
    degree-13 Taylor polynomial, times ``2^n`` as ``2^(n >> 1) 2^(n - (n >> 1))`` (both normal,
    so subnormal results round once, gradually)."""
    flags = ("contract",)
    c = lambda v: _like(x, v)  # noqa: E731
    xc = b.call(_fn(module, "llvm.minnum", x, 2),
                [b.call(_fn(module, "llvm.maxnum", x, 2), [x, c(_EXP_LO_D)]), c(_EXP_HI_D)])
    n = b.call(_fn(module, "llvm.roundeven", x, 1), [b.fmul(xc, c(_LOG2E))])
    r = b.fsub(b.fsub(xc, b.fmul(n, c(_LN2_HI_D)), flags=flags), b.fmul(n, c(_LN2_LO_D)), flags=flags)
    fact = [1.0]
    for k in range(1, 14):
        fact.append(fact[-1] * k)
    p = _poly(b, r, [1.0 / f for f in reversed(fact)])
    ni = b.fptosi(n, _int_type(x))
    n1 = b.ashr(ni, _int_like(x, 1))
    y = b.fmul(b.fmul(p, _pow2(b, n1, x)), _pow2(b, b.sub(ni, n1), x))
    y = b.select(b.fcmp_ordered("<", x, c(_EXP_LO_D)), c(0.0), y)
    y = b.select(b.fcmp_ordered(">", x, c(_EXP_HI_D)), c(float("inf")), y)
    return b.select(b.fcmp_unordered("uno", x, x), x, y)


# erf. |x| < 0.875: x P(x^2); above: 1 - erfc(|x|), the sign restored, clamped where erf rounds
# to 1 (erfc(4) < 2^-25 in float32, erfc(6) < 2^-55 in float64). Chebyshev fits (mpmath.chebyfit)
# of erf(sqrt t) / sqrt t (relative fit error 8e-9 in float32, 3e-19 in float64), of log2(erfc(x))
# on [0.875, 4] at x - 0.875 (float32, absolute 3e-8; evaluated from the split up, where erfc
# is largest, so the rounding that grows with x - 0.875 is scaled by an erfc that falls faster) and of log(erfc(x)) on two intervals at x
# minus their centres (float64, 2e-16 and 2e-14, scaled by erfc(0.875) = 0.22 and erfc(2.5) = 4e-4
# in erf), and of 2^f on [-1/2, 1/2] (relative 2e-9).
_ERF_SPLIT = 0.875
_ERF32_SMALL = (-0.0006214585361977137, 0.005034370663204096, -0.02679294777783731, 0.11282496599586316,
                -0.37612554506584434, 1.1283791581332128)
_ERF32_FAR = (0.875, 4.0, (2.367627606105127e-06, -4.996258881992303e-05, 0.0005047306967534174,
                           -0.003325676668774106, 0.01650103688865174, -0.06772860717851939,
                           -1.1924304586863432, -3.506067677683156, -2.211398180795371))
_EXP2_F32 = (0.0001546144469856913, 0.0013400428177615838, 0.009618056678524637, 0.05550327226670302,
             0.24022650922288757, 0.6931472067028326, 1.0)
_ERF64_SMALL = (-8.666276629203472e-10, 1.4122777660357666e-08, -1.6289242608284092e-07, 1.6456607597388118e-06,
                -1.492538720169797e-05, 0.00012055324561705379, -0.0008548326845690305, 0.005223977623059443,
                -0.026866170644942594, 0.11283791670954353, -0.3761263890318374, 1.1283791670955126)
_ERF64_MID = (1.6875, 2.5, (-4.810015327091605e-10, 9.332790440676563e-10, 2.5437994214410327e-09,
                            -2.563907226836e-08, 1.31223294675192e-07, -4.856228164458005e-07,
                            1.1676486382329937e-06, 2.5095737710937115e-07, -2.401758537886867e-05,
                            0.00018498086754390752, -0.0010315018410927094, 0.004936640927147266,
                            -0.021733597992102595, -0.9059783429382229, -3.846113660634183,
                            -4.073937212041669))
_ERF64_TAIL = (4.25, 6.0, (2.787088451017419e-13, -9.972921296100604e-13, -2.845969376880144e-12,
                           4.797055964084283e-11, -4.678659140862092e-10, 4.042168508793074e-09,
                           -3.154723596538365e-08, 2.3021012686764595e-07, -1.6067299038585212e-06,
                           1.0879241408834927e-05, -7.237983576395795e-05, 0.0004805287604009644,
                           -0.0032637442791883632, -0.97608457639746, -8.723775715521935,
                           -20.107769901469695))


def _erf(b, module, x, small, top, erfc):
    """erf from its two sides: ``small`` the coefficients of ``erf(sqrt t) / sqrt t`` (below
    0.875), ``erfc(b, module, a)`` its complement for ``a = min(|x|, top)`` (above)."""
    c = lambda v: _like(x, v)  # noqa: E731
    ax = b.call(_fn(module, "llvm.fabs", x, 1), [x])
    # x + x (P(x^2) - 1): the leading x exact, the correction (at most 0.13 x) by a fused multiply-add
    near = b.fadd(b.fmul(x, _poly(b, b.fmul(x, x), small[:-1] + (small[-1] - 1.0,)), flags=("contract",)), x,
                  flags=("contract",))
    a = b.call(_fn(module, "llvm.minnum", x, 2), [ax, c(top)])
    far = b.call(_fn(module, "llvm.copysign", x, 2), [b.fsub(c(1.0), erfc(b, module, a)), x])
    # unordered: a NaN takes the near side, which keeps it
    return b.select(b.fcmp_unordered("<", ax, c(_ERF_SPLIT)), near, far)


def _erfc32(b, module, a):
    """erfc(a) for float32 ``a`` in [0.875, 4] (other lanes: finite, unused): ``2^Q(a)``,
    ``Q = c0 + u P(u)`` in [-26, -2.2] (``u = a - 0.875``), so ``2^n 2^f`` (``n = roundeven(Q)``)
    is normal and ``2^n`` goes straight into the exponent bits. ``f = (c0 - n) + u P(u)`` is
    rounded once (``c0 - n`` is exact), not from a rounded ``Q``."""
    centre, _, coeffs = _ERF32_FAR
    u = b.fsub(a, _like(a, centre))
    p = _poly(b, u, coeffs[:-1])
    c0 = _like(a, coeffs[-1])
    n = b.call(_fn(module, "llvm.roundeven", a, 1), [b.fadd(b.fmul(u, p), c0, flags=("contract",))])
    f = _fma(b, module, u, p, b.fsub(c0, n))
    e = _poly(b, f, _EXP2_F32)
    ity = _int_type(a)
    bits = b.add(b.bitcast(e, ity), b.shl(b.fptosi(n, ity), _int_like(a, 23)))
    return b.bitcast(bits, a.type)


def _erfc64(b, module, a):
    """erfc(a) for float64 ``a`` in [0.875, 6]: ``e^Q(a)``, ``Q`` from one of two intervals
    (each coefficient selected per lane, no branch)."""
    c = lambda v: _like(a, v)  # noqa: E731
    (c1, e1, k1), (c2, _, k2) = _ERF64_MID, _ERF64_TAIL
    first = b.fcmp_ordered("<", a, c(e1))
    centre = b.select(first, c(c1), c(c2))
    q = _poly(b, b.fsub(a, centre), _pick(b, first, a, list(zip(k1, k2))))
    return exp_f64(b, module, q)


def erf_f32(b: ir.IRBuilder, module: ir.Module, x):
    """erf(x) for a float32 scalar or vector ``x``."""
    return _erf(b, module, x, _ERF32_SMALL, _ERF32_FAR[1], _erfc32)


def erf_f64(b: ir.IRBuilder, module: ir.Module, x):
    """erf(x) for a float64 scalar or vector ``x``."""
    return _erf(b, module, x, _ERF64_SMALL, _ERF64_TAIL[1], _erfc64)


_LN2_HI_F = 0.693359375          # float32 ln2 split (e * hi exact for every exponent e)
_LN2_LO_F = -2.12194440e-4


def _log(b, module, x, f64):
    """log(x): ``x = 2^e (1 + f)``, ``sqrt(1/2) <= 1 + f < sqrt(2)``; with ``s = f / (2 + f)``,
    ``log(1 + f) = f - (f^2/2 - s (f^2/2 + R(s^2)))``, ``R`` the series of ``2 atanh(s) / s - 2``
    (fdlibm's arrangement: the exact ``f`` first, a small correction after)."""
    c = lambda v: _like(x, v)  # noqa: E731
    mant, bias, nterms = (52, 1023, 10) if f64 else (23, 127, 4)
    tiny = b.fcmp_ordered("<", x, c(2.0 ** (1 - bias)))     # subnormal (or <= 0): scaled up exactly
    xs = b.select(tiny, b.fmul(x, c(2.0 ** mant)), x)
    bits = b.bitcast(xs, _int_type(x))
    e = b.sub(b.lshr(bits, _int_like(x, mant)), _int_like(x, bias))
    e = b.select(tiny, b.sub(e, _int_like(x, mant)), e)
    m = b.bitcast(b.or_(b.and_(bits, _int_like(x, (1 << mant) - 1)), _int_like(x, bias << mant)), x.type)
    big = b.fcmp_ordered(">", m, c(2 ** 0.5))
    m = b.select(big, b.fmul(m, c(0.5)), m)
    e = b.select(big, b.add(e, _int_like(x, 1)), e)
    ef = b.sitofp(e, x.type)
    f = b.fsub(m, c(1.0))
    s = b.fdiv(f, b.fadd(f, c(2.0)))
    z = b.fmul(s, s)
    r = b.fmul(z, _poly(b, z, [2.0 / (2 * j + 1) for j in range(nterms, 0, -1)]))
    hfsq = b.fmul(b.fmul(f, f), c(0.5))
    hi, lo = (_LN2_HI_D, _LN2_LO_D) if f64 else (_LN2_HI_F, _LN2_LO_F)
    corr = b.fadd(b.fmul(s, b.fadd(hfsq, r), flags=("contract",)), b.fmul(ef, c(lo)), flags=("contract",))
    y = b.fsub(b.fmul(ef, c(hi)), b.fsub(b.fsub(hfsq, corr), f))
    y = b.select(b.fcmp_ordered("==", x, c(float("inf"))), x, y)
    y = b.select(b.fcmp_ordered("==", x, c(0.0)), c(float("-inf")), y)
    return b.select(b.fcmp_unordered("<", x, c(0.0)), c(float("nan")), y)


def log_f32(b: ir.IRBuilder, module: ir.Module, x):
    """log(x) for a float32 scalar or vector ``x`` (NaN below 0, -inf at 0)."""
    return _log(b, module, x, False)


def log_f64(b: ir.IRBuilder, module: ir.Module, x):
    """log(x) for a float64 scalar or vector ``x`` (NaN below 0, -inf at 0)."""
    return _log(b, module, x, True)


def _widen(b, x):
    """``x`` converted exactly to float64 (scalar or vector)."""
    return b.fpext(x, ir.VectorType(F64, x.type.count) if isinstance(x.type, ir.VectorType) else F64)


def sigmoid_f64(b: ir.IRBuilder, module: ir.Module, x):
    """1 / (1 + e^-x) for a float64 scalar or vector ``x``: with ``e = exp(-|x|)`` in (0, 1],
    ``1 / (1 + e)`` for ``x >= 0`` and ``e / (1 + e)`` below (no overflow in either tail);
    NaN fails ``x >= 0`` and stays NaN."""
    one = _like(x, 1.0)
    e = exp_f64(b, module, b.fneg(b.call(_fn(module, "llvm.fabs", x, 1), [x])))
    d = b.fadd(one, e)
    return b.select(b.fcmp_ordered(">=", x, _like(x, 0.0)), b.fdiv(one, d), b.fdiv(e, d))


def log1p_f64(b: ir.IRBuilder, module: ir.Module, x):
    """log(1 + x) for a float64 scalar or vector ``x``: ``u + c = 1 + x`` exactly (two-sum),
    ``log(u)`` (:func:`log_f64`) plus ``c / u``; its Taylor polynomial for ``|x| < 2^-20``;
    -inf at -1, NaN below."""
    c = lambda v: _like(x, v)  # noqa: E731
    u, corr = _two_sum(b, c(1.0), x)
    y = b.fadd(_log(b, module, u, True), b.fdiv(corr, u))
    # |x| < 2^-20: x - x^2/2 + x^3/3 - x^4/4 (truncation below 2^-80 x), x itself where 1 + x rounds to 1
    near = b.fadd(x, b.fmul(b.fmul(x, x), _poly(b, x, [-0.25, 1.0 / 3.0, -0.5])))
    y = b.select(b.fcmp_ordered("<", b.call(_fn(module, "llvm.fabs", x, 1), [x]), c(2.0 ** -20)), near, y)
    y = b.select(b.fcmp_ordered("==", x, c(-1.0)), c(float("-inf")), y)
    y = b.select(b.fcmp_ordered("==", x, c(float("inf"))), x, y)
    return b.select(b.fcmp_unordered("<", x, c(-1.0)), c(float("nan")), y)


def log1p_f32(b: ir.IRBuilder, module: ir.Module, x):
    """log(1 + x) for a float32 scalar or vector ``x``: :func:`log1p_f64` rounded to float32."""
    return b.fptrunc(log1p_f64(b, module, _widen(b, x)), x.type)


_EXPM1_HI_D = 709.782712893384     # above: +inf
_EXPM1_LO_D = -45.0                # below: -1 (e^x under 2^-64)


def expm1_f64(b: ir.IRBuilder, module: ir.Module, x):
    """e^x - 1 for a float64 scalar or vector ``x``: ``x = n ln2 + r + rc`` (ln2 in two parts,
    ``r + rc`` double-double), ``expm1(r + rc) = r + r^2 Q(r) + rc (1 + r)`` (Taylor to
    ``r^16``; ``n = 0`` for ``|x| < 1/2``), then ``2^n expm1 + (2^n - 1)`` by one fused
    multiply-add (``2^n - 1`` exact for ``n <= 53``; above, ``2^n (expm1 - 2^-n) + 2^n``),
    ``n = 1024`` as ``2^1023`` and a doubling; -0 kept."""
    c = lambda v: _like(x, v)  # noqa: E731
    xc = b.call(_fn(module, "llvm.minnum", x, 2),
                [b.call(_fn(module, "llvm.maxnum", x, 2), [x, c(_EXPM1_LO_D)]), c(_EXPM1_HI_D)])
    n = b.call(_fn(module, "llvm.roundeven", x, 1), [b.fmul(xc, c(_LOG2E))])
    # n = 0 up to |x| = 1/2, not ln2/2: 2 expm1(r) + 1 would double expm1's error below 1/2
    n = b.select(b.fcmp_ordered("<", b.call(_fn(module, "llvm.fabs", x, 1), [xc]), c(0.5)), c(0.0), n)
    hi = _fma(b, module, b.fneg(n), c(_LN2_HI_D), xc)          # exact: n ln2_hi has 32 bits
    lo = b.fmul(n, c(_LN2_LO_D))
    r = b.fsub(hi, lo)
    rc = b.fsub(b.fsub(hi, r), lo)
    fact = [1.0]
    for k in range(1, 17):
        fact.append(fact[-1] * k)
    q = _poly(b, r, [1.0 / f for f in reversed(fact[2:])])
    em = b.fadd(r, _fma(b, module, b.fmul(r, r), q, b.fmul(rc, b.fadd(c(1.0), r))))
    ni = b.fptosi(n, _int_type(x))
    top = b.select(b.icmp_signed(">", ni, _int_like(x, 1023)), _int_like(x, 1023), ni)
    p2 = _pow2(b, top, x)
    # n > 53: 2^n - 1 is inexact; the 1 goes into expm1 instead, as 2^-n
    mid = b.select(b.icmp_signed("<", ni, _int_like(x, 54)), _int_like(x, 54), b.select(
        b.icmp_signed(">", ni, _int_like(x, 200)), _int_like(x, 200), ni))
    big = b.fcmp_ordered(">", n, c(53.0))
    y = _fma(b, module, p2, b.select(big, b.fsub(em, _pow2(b, b.sub(_int_like(x, 0), mid), x)), em),
             b.select(big, p2, b.fsub(p2, c(1.0))))
    y = b.fmul(y, _pow2(b, b.sub(ni, top), x))                # 2^1024 (x near the top) in two steps
    y = b.select(b.fcmp_ordered(">", x, c(_EXPM1_HI_D)), c(float("inf")), y)
    y = b.select(b.fcmp_ordered("==", x, c(0.0)), x, y)
    return b.select(b.fcmp_unordered("uno", x, x), x, y)


_TANH_P_D = (-9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3)
_TANH_Q_D = (1.0, 1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3)


def tanh_f64(b: ir.IRBuilder, module: ir.Module, x):
    """tanh(x) for a float64 scalar or vector ``x``: for ``|x| < 0.625`` Cephes' rational
    form ``x + x z P(z) / Q(z)``, ``z = x^2`` (the correction at most 13% of ``x``); above,
    ``1 - 2 / (exp(2|x|) + 1)`` (its rounding errors scaled by the small ``2 / (exp + 1)``);
    the sign restored by copysign (so ``tanh(-0) = -0``), 1 once ``exp`` overflows; NaN stays
    NaN."""
    c = lambda v: _like(x, v)  # noqa: E731
    ax = b.call(_fn(module, "llvm.fabs", x, 1), [x])
    z = b.fmul(x, x)
    small = b.fadd(x, b.fmul(b.fmul(x, z), b.fdiv(_poly(b, z, _TANH_P_D), _poly(b, z, _TANH_Q_D))))
    big = b.fsub(c(1.0), b.fdiv(c(2.0), b.fadd(exp_f64(b, module, b.fmul(ax, c(2.0))), c(1.0))))
    t = b.select(b.fcmp_ordered("<", ax, c(0.625)), small, big)
    return b.call(_fn(module, "llvm.copysign", x, 2), [t, x])


def expm1_f32(b: ir.IRBuilder, module: ir.Module, x):
    """e^x - 1 for a float32 scalar or vector ``x``: :func:`expm1_f64` rounded to float32."""
    return b.fptrunc(expm1_f64(b, module, _widen(b, x)), x.type)


def _pow_cases(b, module, X, Y, r):
    """IEEE pow's sign and special cases around ``r = |X|^Y`` (float64): the sign from ``X < 0``
    with an odd integer ``Y``; NaN for ``X < 0`` finite with ``Y`` not an integer; 1 for
    ``Y = +-0`` (even with a NaN ``X``), ``X = 1`` (even with a NaN ``Y``) and ``X = -1``,
    ``Y = +-inf``."""
    c = lambda v: _like(X, v)  # noqa: E731
    fabs = lambda v: b.call(_fn(module, "llvm.fabs", v, 1), [v])  # noqa: E731
    floor = lambda v: b.call(_fn(module, "llvm.floor", v, 1), [v])  # noqa: E731
    integer = b.fcmp_ordered("==", floor(Y), Y)                  # +-inf count as even integers
    half = b.fmul(Y, c(0.5))
    odd = b.and_(integer, b.fcmp_ordered("!=", floor(half), half))
    negative = b.icmp_signed("<", b.bitcast(X, _int_type(X)), _int_like(X, 0))   # -0 and -inf too
    r = b.select(b.and_(negative, odd), b.fneg(r), r)
    finite_neg = b.and_(b.fcmp_ordered("<", X, c(0.0)), b.fcmp_ordered("!=", X, c(float("-inf"))))
    r = b.select(b.and_(finite_neg, b.fcmp_unordered("!=", floor(Y), Y)), c(float("nan")), r)
    one = b.or_(b.fcmp_ordered("==", X, c(1.0)), b.fcmp_ordered("==", Y, c(0.0)))
    one = b.or_(one, b.and_(b.fcmp_ordered("==", fabs(X), c(1.0)), b.fcmp_ordered("==", fabs(Y), c(float("inf")))))
    return b.select(one, c(1.0), r)


def pow_f32(b: ir.IRBuilder, module: ir.Module, x, y):
    """x^y for float32 scalars or vectors, IEEE pow's special cases included (:func:`_pow_cases`):
    computed in float64 as ``exp_f64(y log_f64(|x|))`` (the exponent's error, under ``2^-44``
    wherever the float32 result is finite and nonzero, is far below a float32 ulp)."""
    X, Y = _widen(b, x), _widen(b, y)
    ax = b.call(_fn(module, "llvm.fabs", X, 1), [X])
    r = exp_f64(b, module, b.fmul(Y, _log(b, module, ax, True)))
    return b.fptrunc(_pow_cases(b, module, X, Y, r), x.type)


def _fast_two_sum(b, a, z):
    s = b.fadd(a, z)
    return s, b.fsub(z, b.fsub(s, a))


def _dd_mul(b, module, a, z):
    """The double-double product of ``a = (hi, lo)`` and ``z = (hi, lo)`` (about 2^-104)."""
    p = b.fmul(a[0], z[0])
    e = _fma(b, module, a[0], z[0], b.fneg(p))
    e = b.fadd(e, _fma(b, module, a[0], z[1], b.fmul(a[1], z[0])))
    return _fast_two_sum(b, p, e)


def _dd_add(b, a, z):
    s, e = _two_sum(b, a[0], z[0])
    return _fast_two_sum(b, s, b.fadd(e, b.fadd(a[1], z[1])))


#: 2 / (2k + 1) for k = 1..4 in two parts (the leading terms of 2 atanh(s) / s - 2, over s^2)
_ATANH_DD = ((0.6666666666666666, 3.700743415417188e-17), (0.4, -2.2204460492503132e-17),
             (0.2857142857142857, 1.586032892321652e-17), (0.2222222222222222, 1.2335811384723961e-17))


def _log_dd(b, module, x):
    """log(x) as a double-double ``(hi, lo)`` for float64 ``x > 0`` finite (about ``2^-75``
    relative): fdlibm's reduction ``x = 2^e m``, ``s = (m - 1) / (m + 1)`` in double-double,
    ``log(m) = s (2 + z B(z))``, ``z = s^2``, ``B = sum 2 z^(k-1) / (2k + 1)`` (its first four
    terms in double-double Horner), ``e ln2`` in two parts."""
    c = lambda v: _like(x, v)  # noqa: E731
    tiny = b.fcmp_ordered("<", x, c(2.0 ** -1022))
    xs = b.select(tiny, b.fmul(x, c(2.0 ** 52)), x)
    bits = b.bitcast(xs, _int_type(x))
    e = b.sub(b.lshr(bits, _int_like(x, 52)), _int_like(x, 1023))
    e = b.select(tiny, b.sub(e, _int_like(x, 52)), e)
    m = b.bitcast(b.or_(b.and_(bits, _int_like(x, (1 << 52) - 1)), _int_like(x, 1023 << 52)), x.type)
    big = b.fcmp_ordered(">", m, c(2 ** 0.5))
    m = b.select(big, b.fmul(m, c(0.5)), m)
    e = b.select(big, b.add(e, _int_like(x, 1)), e)
    ef = b.sitofp(e, x.type)
    f = b.fsub(m, c(1.0))                                       # exact
    d = _two_sum(b, c(2.0), f)
    s_hi = b.fdiv(f, d[0])
    rem = b.fsub(_fma(b, module, b.fneg(s_hi), d[0], f), b.fmul(s_hi, d[1]))
    S = _fast_two_sum(b, s_hi, b.fdiv(rem, d[0]))
    z = _dd_mul(b, module, S, S)
    acc = (_poly(b, z[0], [2.0 / (2 * k + 1) for k in range(13, 4, -1)]), c(0.0))
    for hi, lo in reversed(_ATANH_DD):
        acc = _dd_add(b, (c(hi), c(lo)), _dd_mul(b, module, z, acc))
    logm = _dd_mul(b, module, S, _dd_add(b, (c(2.0), c(0.0)), _dd_mul(b, module, z, acc)))
    e_hi = b.fmul(ef, c(_LN2_HI_D))                             # exact: 32-bit ln2_hi
    e_lo = _fast_two_sum(b, b.fmul(ef, c(_LN2_LO_D)), _fma(b, module, ef, c(_LN2_LO_D),
                                                            b.fneg(b.fmul(ef, c(_LN2_LO_D)))))
    return _dd_add(b, _dd_add(b, (e_hi, c(0.0)), e_lo), logm)


def pow_f64(b: ir.IRBuilder, module: ir.Module, x, y):
    """x^y for float64 scalars or vectors, IEEE pow's special cases included (:func:`_pow_cases`):
    ``t = y log|x|`` in double-double (:func:`_log_dd`), ``exp_f64(t_hi) (1 + t_lo)``."""
    c = lambda v: _like(x, v)  # noqa: E731
    ax = b.call(_fn(module, "llvm.fabs", x, 1), [x])
    finite = b.and_(b.fcmp_ordered(">", ax, c(0.0)), b.fcmp_ordered("<", ax, c(float("inf"))))
    L = _log_dd(b, module, b.select(finite, ax, c(1.0)))
    l_hi = b.select(finite, L[0], b.select(b.fcmp_ordered("==", ax, c(0.0)), c(float("-inf")), ax))
    t_hi = b.fmul(y, l_hi)
    t_lo = b.fadd(_fma(b, module, y, L[0], b.fneg(b.fmul(y, L[0]))), b.fmul(y, L[1]))
    ok = b.and_(finite, b.fcmp_ordered("<", b.call(_fn(module, "llvm.fabs", x, 1), [t_hi]), c(float("inf"))))
    t_hi, t_lo = _fast_two_sum(b, t_hi, b.select(ok, t_lo, c(0.0)))
    E = exp_f64(b, module, t_hi)
    ok = b.and_(ok, b.fcmp_ordered("<", E, c(float("inf"))))
    return _pow_cases(b, module, x, y, b.select(ok, _fma(b, module, E, t_lo, E), E))


# atan, atan2, asin, acos (fdlibm's reductions). Chebyshev fits (mpmath.chebyfit): atan(t) =
# t + t z P(z), z = t^2 <= (7/16)^2 (fit error 4e-18); asin(s) = s + s z R(z), z = s^2 <= 1/4
# (fit error 2e-17)
_ATAN_P = (0.014773184616983806, -0.033128134256069586, 0.04492259293193656, -0.05216679739313656,
           0.05876946456755061, -0.06666241923359964, 0.07692285554889286, -0.09090908355602592,
           0.11111111096645038, -0.14285714285566806, 0.1999999999999941, -0.3333333333333333)
_ASIN_R = (0.028757851367421566, -0.014851887071247204, 0.01740087944269402, 0.005457506718640358,
           0.01032281435018578, 0.011479177415184906, 0.013971212973552933, 0.017352392720869973,
           0.02237217294214989, 0.030381944138531247, 0.04464285714635543, 0.07499999999998433,
           0.16666666666666669)
#: (upper end of |x|'s interval, c, atan(c) in two parts): atan(x) = atan(c) + atan((x - c) / (1 + c x))
_ATAN_STEPS = ((7 / 16, 0.0, 0.0, 0.0), (11 / 16, 0.5, 0.4636476090008061, 2.2698777452961687e-17),
               (19 / 16, 1.0, 0.7853981633974483, 3.061616997868383e-17),
               (39 / 16, 1.5, 0.982793723247329, 1.3903311031230998e-17))
_PIO2_HI, _PIO2_LO = 1.5707963267948966, 6.123233995736766e-17
_PI_HI, _PI_LO = 3.141592653589793, 1.2246467991473532e-16
_PIO4_HI = 0.7853981633974483


def _atan_abs(b, module, a):
    """atan(a) for float64 ``a >= 0`` (or NaN): the interval of ``a`` picks ``c``, ``t = (a - c) /
    (1 + c a)`` (``a - c`` exact), ``-1 / a`` above 39/16 with ``atan(c) = pi/2``."""
    c = lambda v: _like(a, v)  # noqa: E731
    cc, hi, lo = c(0.0), c(_PIO2_HI), c(_PIO2_LO)
    for top, cv, h, low in reversed(_ATAN_STEPS):
        inside = b.fcmp_ordered("<", a, c(top))
        cc, hi, lo = b.select(inside, c(cv), cc), b.select(inside, c(h), hi), b.select(inside, c(low), lo)
    large = b.fcmp_ordered(">=", a, c(_ATAN_STEPS[-1][0]))
    num = b.select(large, c(-1.0), b.fsub(a, cc))
    den = b.select(large, a, _fma(b, module, cc, a, c(1.0)))
    t = b.fdiv(num, den)
    z = b.fmul(t, t)
    return b.fadd(hi, b.fadd(t, _fma(b, module, b.fmul(t, z), _poly(b, z, _ATAN_P), lo)))


def atan_f64(b: ir.IRBuilder, module: ir.Module, x):
    """atan(x) for a float64 scalar or vector ``x`` (odd; +-pi/2 at +-inf)."""
    ax = b.call(_fn(module, "llvm.fabs", x, 1), [x])
    y = b.call(_fn(module, "llvm.copysign", x, 2), [_atan_abs(b, module, ax), x])
    return b.select(b.fcmp_unordered("uno", x, x), x, y)


def atan2_f64(b: ir.IRBuilder, module: ir.Module, y, x):
    """atan2(y, x) for float64 scalars or vectors: ``z = atan(|y| / |x|)`` (``pi/4`` for two
    infinities, 0 for two zeros), ``pi - z`` where x's sign bit is set (pi/2 itself where
    x is +-0 or y infinite), y's sign copied; NaN in, NaN out."""
    c = lambda v: _like(x, v)  # noqa: E731
    fabs = lambda v: b.call(_fn(module, "llvm.fabs", v, 1), [v])  # noqa: E731
    ax, ay = fabs(x), fabs(y)
    z = _atan_abs(b, module, b.fdiv(ay, ax))
    inf = c(float("inf"))
    z = b.select(b.and_(b.fcmp_ordered("==", ax, inf), b.fcmp_ordered("==", ay, inf)), c(_PIO4_HI), z)
    z = b.select(b.and_(b.fcmp_ordered("==", ax, c(0.0)), b.fcmp_ordered("==", ay, c(0.0))), c(0.0), z)
    negative = b.icmp_signed("<", b.bitcast(x, _int_type(x)), _int_like(x, 0))
    z = b.select(negative, b.fsub(c(_PI_HI), b.fsub(z, c(_PI_LO))), z)
    vertical = b.or_(b.and_(b.fcmp_ordered("==", ay, inf), b.fcmp_ordered("!=", ax, inf)),
                     b.and_(b.fcmp_ordered("==", ax, c(0.0)), b.fcmp_ordered("!=", ay, c(0.0))))
    z = b.select(vertical, c(_PIO2_HI), z)                # pi/2 rounded, on either side of x = 0
    r = b.call(_fn(module, "llvm.copysign", x, 2), [z, y])
    nan = b.or_(b.fcmp_unordered("uno", x, x), b.fcmp_unordered("uno", y, y))
    return b.select(nan, c(float("nan")), r)


def _sqrt_split(b, module, z, s):
    """``(df, cc)`` with ``df`` = ``s = sqrt(z)`` with its low 32 bits cleared and ``df + cc =
    sqrt(z)`` to about ``2^-80`` (fdlibm: ``cc = (z - df^2) / (s + df)``, ``df^2`` exact)."""
    df = b.bitcast(b.and_(b.bitcast(s, _int_type(s)), _int_like(s, -(1 << 32))), s.type)
    cc = b.fdiv(b.fsub(z, b.fmul(df, df)), b.fadd(s, df))
    return df, b.select(b.fcmp_ordered("==", s, _like(s, 0.0)), s, cc)        # |x| = 1: 0, not 0/0


def asin_f64(b: ir.IRBuilder, module: ir.Module, x):
    """asin(x) for a float64 scalar or vector ``x``: ``x + x z R(z)`` for ``|x| < 1/2``; above,
    ``pi/2 - 2 asin(sqrt((1 - |x|) / 2))`` with the square root in two parts (fdlibm); NaN
    outside [-1, 1]."""
    c = lambda v: _like(x, v)  # noqa: E731
    ax = b.call(_fn(module, "llvm.fabs", x, 1), [x])
    z0 = b.fmul(x, x)
    near = b.fadd(x, b.fmul(b.fmul(x, z0), _poly(b, z0, _ASIN_R)))
    z = b.fmul(b.fsub(c(1.0), ax), c(0.5))
    s = b.call(_fn(module, "llvm.sqrt", x, 1), [z])
    r = b.fmul(z, _poly(b, z, _ASIN_R))
    df, cc = _sqrt_split(b, module, z, s)
    p = b.fsub(b.fmul(b.fmul(c(2.0), s), r), b.fsub(c(_PIO2_LO), b.fmul(c(2.0), cc)))
    q = b.fsub(c(_PIO4_HI), b.fmul(c(2.0), df))
    far = b.call(_fn(module, "llvm.copysign", x, 2), [b.fsub(c(_PIO4_HI), b.fsub(p, q)), x])
    y = b.select(b.fcmp_ordered("<", ax, c(0.5)), near, far)
    return b.select(b.fcmp_ordered(">", ax, c(1.0)), c(float("nan")), y)


def acos_f64(b: ir.IRBuilder, module: ir.Module, x):
    """acos(x) for a float64 scalar or vector ``x`` (fdlibm): ``pi/2 - asin(x)`` for ``|x| < 1/2``,
    ``pi - 2 asin(sqrt((1 + x) / 2))`` below, ``2 asin(sqrt((1 - x) / 2))`` above (the square
    root in two parts); NaN outside [-1, 1]."""
    c = lambda v: _like(x, v)  # noqa: E731
    ax = b.call(_fn(module, "llvm.fabs", x, 1), [x])
    z0 = b.fmul(x, x)
    r0 = b.fmul(z0, _poly(b, z0, _ASIN_R))
    mid = b.fsub(c(_PIO2_HI), b.fsub(x, b.fsub(c(_PIO2_LO), b.fmul(x, r0))))
    pos = b.fcmp_ordered(">", x, c(0.0))
    z = b.fmul(b.fsub(c(1.0), ax), c(0.5))
    s = b.call(_fn(module, "llvm.sqrt", x, 1), [z])
    r = b.fmul(z, _poly(b, z, _ASIN_R))
    low = b.fsub(c(_PI_HI), b.fmul(c(2.0), b.fadd(s, b.fsub(b.fmul(r, s), c(_PIO2_LO)))))
    df, cc = _sqrt_split(b, module, z, s)
    high = b.fmul(c(2.0), b.fadd(df, b.fadd(b.fmul(r, s), cc)))
    y = b.select(b.fcmp_ordered("<", ax, c(0.5)), mid, b.select(pos, high, low))
    return b.select(b.fcmp_ordered(">", ax, c(1.0)), c(float("nan")), y)


def _via_f64(fn):
    def f32(b: ir.IRBuilder, module: ir.Module, *args):
        return b.fptrunc(fn(b, module, *[_widen(b, a) for a in args]), args[0].type)
    f32.__doc__ = f"{fn.__name__[:-4]} for float32 scalars or vectors: :func:`{fn.__name__}` rounded to float32."
    f32.__name__ = fn.__name__[:-4] + "_f32"
    return f32


atan_f32, atan2_f32, asin_f32, acos_f32 = (_via_f64(f) for f in (atan_f64, atan2_f64, asin_f64, acos_f64))
