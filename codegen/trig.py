"""sin and cos in float32 and float64, inline and branch free (so loops over them vectorize),
within 1 ulp for every float up to the largest (the error table is :mod:`codegen.vecmath`'s).

``sin x`` and ``cos x`` are ``+-sin r`` or ``+-cos r`` by the quadrant ``k mod 4``, where
``x = k pi/2 + r`` and ``|r| <= pi/4``; everything rests on computing ``r`` exactly enough
for every float, including those closest to multiples of pi/2.

float32: computed in float64. Payne-Hanek's reduction without a table:
``x 2/pi`` as the sum of ``x P_i`` over four float64 words of 2/pi (to ``2^-213``), each product
split exactly into ``h + l`` by a fused multiply-add, each part taken mod 4 exactly
(``t - 4 roundeven(t/4)``), the parts summed in double-double; the nearest integer ``k`` of the
sum picks the quadrant and ``r = (sum - k) pi/2``, ``|r| <= pi/4``, goes to Taylor polynomials
(to ``r^11`` and ``r^12``: truncation below ``2^-36``), rounded once to float32. The
reduction's absolute error, about ``|x| 2^-213 <= 2^-85``, stays far below ``r`` even at the
float32s closest to multiples of pi/2 (the tests include them: convergents of pi/2 scaled by
powers of 2), up to the largest float32. (float64's table, below, cut in 29-bit chunks for
exact products, measured no faster for float32: its gathers cost what the words saved.)

float64: for ``|x| <= 2^26`` Cody and Waite's reduction, ``k = roundeven(x 2/pi)``,
``x - k P1`` exact in one fused multiply-add, ``k P2`` split exactly, pi/2 in three doubles,
``r`` in double-double; above, Payne and Hanek's with a table: ``x = m 2^E``, and ``2^E 2/pi mod 4``
for each exponent ``E`` stored as four 53-bit chunks (998 rows cut from 1280 bits of 2/pi, 32 KB,
one constant per module), ``m`` times each chunk split exactly and summed mod 4 in
double-double to about 2^-150. Both reductions run in every lane (no branch, so loops
vectorize), each lane takes its own; then the float32 form's polynomials in double-double.
"""
from __future__ import annotations

import functools

from .llvm import ir
from .vecmath import F64, I64, _fast_two_sum, _fma, _fn, _int_like, _int_type, _like, _poly, _two_sum, _widen, lanewise

# pi/2 in three doubles (to about 2^-164)
_PIO2_D = (1.5707963267948966, 6.123233995736766e-17, -1.4973849048591698e-33)
#: 2/pi in four doubles (each the double nearest the remainder), for float32's reduction
_TWO_OVER_PI_WORDS = (0.6366197723675814, -3.935735335036497e-17, -2.1442872565786008e-33,
                      1.6107127853188224e-49)
#: above this |x| the reduction takes its words of 2/pi from a table indexed by the exponent
_SINCOS_BIG = 2.0 ** 26
#: floor(2/pi 2^1280), the bits of 2/pi the tables are cut from
_TWO_OVER_PI_BITS = int(
    "a2f9836e4e441529fc2757d1f534ddc0db6295993c439041fe5163abdebbc561b7246e3a424dd2e006492eea09d1921c"
    "fe1deb1cb129a73ee88235f52ebb4484e99c7026b45f7e413991d639835339f49c845f8bbdf9283b1ff897ffde05980f"
    "ef2f118b5a0a6d1f6d367ecf27cb09b74f463f669e5fea2d7527bac7ebe5f17b3d0739f78a5292ea6bfb5fb11f8d5d08"
    "56033046fc7b6babf0cfbc209af4361d", 16)
#: the biased exponents of the doubles above 2^26 (the table's rows)
_EXP_FIRST, _EXP_LAST = 1049, 2046
_CHUNKS = 4


@functools.lru_cache(maxsize=None)
def _two_over_pi_table() -> tuple:
    """Row ``B - 1049`` for biased exponent ``B`` (``x = m 2^E``, ``m`` an integer below 2^53,
    ``E = B - 1075``): ``T_E = 2^E 2/pi mod 4`` (the bits of 2/pi whose products with ``m`` are
    multiples of 4 dropped) cut into four 53-bit chunks, each exactly a double: bits 2^1 to
    2^-51, 2^-52 to 2^-104, 2^-105 to 2^-157, 2^-158 to 2^-210 (the part cut off, times ``m``,
    below 2^-157)."""
    rows = []
    for B in range(_EXP_FIRST, _EXP_LAST + 1):
        shift = 1280 - (B - 1075)  # T_E = (Q mod 2^(shift + 2)) 2^-shift
        t = _TWO_OVER_PI_BITS % (1 << (shift + 2))
        for j in range(_CHUNKS):
            lsb = 51 + 53 * j  # chunk j: bits 2^(52 - lsb) .. 2^-lsb
            top = shift - lsb
            chunk = (t >> top if top >= 0 else t << -top) & ((1 << 53) - 1)
            rows.append(float(chunk) * 2.0 ** -lsb)
    return tuple(rows)


def _table_chunks(b, module, x):
    """``(m, [c0, c1, c2, c3])`` for a float64 ``x``: ``m = x 2^-E`` (an integer, exactly) and
    the chunks of ``T_E`` from the module's constant table (defined once per module). The row index is clamped, so no lane reads outside the
    table: a lane below 2^26 reads the first row (its result is not taken), +-inf the last
    (``m`` is infinite: NaN)."""
    first, last = _EXP_FIRST, _EXP_LAST
    name = "te_grad_two_over_pi"
    table = module.globals.get(name)
    if table is None:
        rows = _two_over_pi_table()
        ty = ir.ArrayType(F64, len(rows))
        table = ir.GlobalVariable(module, ty, name)
        table.global_constant = True
        table.linkage = "internal"
        table.initializer = ir.Constant(ty, rows)
    ic = lambda v: _int_like(x, v)  # noqa: E731
    B = b.and_(b.lshr(b.bitcast(x, _int_type(x)), ic(52)), ic(0x7FF))
    B = b.select(b.icmp_signed("<", B, ic(first)), ic(first), B)
    B = b.select(b.icmp_signed(">", B, ic(last)), ic(last), B)
    m = b.fmul(x, b.bitcast(b.shl(b.sub(ic(2098), B), ic(52)), x.type))  # x 2^-(B - 1075)
    row = b.mul(b.sub(B, ic(first)), ic(_CHUNKS))
    zero = ir.Constant(I64, 0)
    return m, [lanewise(b, [row], lambda i, j=j: b.load(b.gep(table, [zero, b.add(i, ir.Constant(I64, j))])))
               for j in range(_CHUNKS)]


def _mod4(b, module, t):
    """``t - 4 roundeven(t / 4)``, in ``[-2, 2]``: exact for every double ``t``."""
    q = b.call(_fn(module, "llvm.roundeven", t, 1), [b.fmul(t, _like(t, 0.25))])
    return _fma(b, module, q, _like(t, -4.0), t)

def _reduce_medium_f64(b, module, x):
    """``(k, r, rr)`` with ``x = k pi/2 + r + rr``, ``|r| <= pi/4 (1 + 2^-27)``, for ``|x| <= 2^26``:
    ``k = roundeven(x 2/pi)``; ``x - k P1`` is exact (one fused multiply-add: both are multiples of
    ``2^-52`` or of ``ulp(x)``, and the difference is below 1); ``k P2`` split exactly into two
    doubles, the sum carried in double-double, ``k P3`` added to the low part (absolute error
    about ``2^-130``, far below the smallest ``|r|`` of a double in this range)."""
    c = lambda v: _like(x, v)  # noqa: E731
    p1, p2, p3 = _PIO2_D
    k = b.call(_fn(module, "llvm.roundeven", x, 1), [b.fmul(x, c(2 / 3.141592653589793))])
    t1 = _fma(b, module, b.fneg(k), c(p1), x)
    p2h = b.fmul(k, c(p2))
    p2l = _fma(b, module, k, c(p2), b.fneg(p2h))
    r, e = _two_sum(b, t1, b.fneg(p2h))
    rr = b.fsub(b.fsub(e, p2l), b.fmul(k, c(p3)))
    r, rr = _fast_two_sum(b, r, rr)
    return k, r, rr


def _reduce_big_f64(b, module, x):
    """``(k, r, rr)`` for ``|x| > 2^26``, every such double: Payne and Hanek's reduction,
    ``x 2/pi mod 4 = m T_E mod 4`` with ``T_E = c0 + c1 + c2 + c3`` from the table
    (:func:`_table_chunks`). The chunks sit at fixed bits, so (each product split exactly into
    ``h + l`` by a fused multiply-add):

    - ``m c0`` (below 2^55, a multiple of 2^-51): ``h0 mod 4 + l0 mod 4`` is exact;
    - ``m c1`` (below 4): ``h1`` joins that sum in a two-sum, ``S + e1`` exactly;
    - ``e1 + l1 + h2`` (below 2^-48) in double-double by two two-sums, ``l2`` and ``m c3`` (below
      2^-101) added to its low word: absolute error about 2^-150.

    ``k = roundeven(S)``, ``S - k`` exact, plus the tail, times pi/2 in double-double. +-inf gives
    NaN."""
    c = lambda v: _like(x, v)  # noqa: E731
    m, (c0, c1, c2, c3) = _table_chunks(b, module, x)

    def split(cj):
        h = b.fmul(m, cj)
        return h, _fma(b, module, m, cj, b.fneg(h))

    (h0, l0), (h1, l1), (h2, l2) = split(c0), split(c1), split(c2)
    S, e1 = _two_sum(b, b.fadd(_mod4(b, module, h0), _mod4(b, module, l0)), h1)
    t, tt1 = _two_sum(b, e1, l1)
    t, tt2 = _two_sum(b, t, h2)
    tt = b.fadd(b.fadd(tt1, tt2), b.fadd(l2, b.fmul(m, c3)))
    k = b.call(_fn(module, "llvm.roundeven", S, 1), [S])
    f, e = _two_sum(b, b.fsub(S, k), t)
    e = b.fadd(e, tt)
    p1, p2 = _PIO2_D[:2]
    rh = b.fmul(f, c(p1))
    rl = b.fadd(_fma(b, module, f, c(p1), b.fneg(rh)), b.fadd(b.fmul(f, c(p2)), b.fmul(e, c(p1))))
    r, rr = _fast_two_sum(b, rh, rl)
    return k, r, rr


def _reduce_f32(b, module, X):
    """``(k, r)`` for a float32 ``X`` widened to float64, every float32 reduced exactly:
    Payne and Hanek's reduction without a table, ``X 2/pi`` as the sum of ``X P_i`` over four
    float64 words of 2/pi (to ``2^-213``), each product split exactly into ``h + l`` by a fused
    multiply-add, each part taken mod 4 exactly, the parts summed in double-double; ``k`` the
    nearest integer of the sum, ``r = (sum - k) pi/2``. The absolute error, about
    ``|x| 2^-213 <= 2^-85``, stays far below ``r`` at the float32s closest to multiples of pi/2.
    (A table indexed by the exponent, as for float64, measured no faster: its gathers cost
    what the words it saves do.)"""
    s = c = None
    for p in _TWO_OVER_PI_WORDS:
        h = b.fmul(X, _like(X, p))
        lo = _fma(b, module, X, _like(X, p), b.fneg(h))
        for t in (h, lo):
            t = _mod4(b, module, t)
            if s is None:
                s, c = t, _like(X, 0.0)
            else:
                s, e = _two_sum(b, s, t)
                c = b.fadd(c, e)
    s = _mod4(b, module, s)
    k = b.call(_fn(module, "llvm.roundeven", s, 1), [s])
    return k, b.fmul(b.fadd(b.fsub(s, k), c), _like(X, _PIO2_D[0]))


def _taylor(b, z, first, last, step):
    """The Taylor coefficients ``(-1)^n / (2n + step)!`` for n from ``last`` down to ``first``, in ``z``."""
    fact = [1.0]
    for k in range(1, 2 * last + step + 1):
        fact.append(fact[-1] * k)
    return _poly(b, z, [(-1.0) ** n / fact[2 * n + step] for n in range(last, first - 1, -1)])


def _sin_poly(b, r, rr, last=8):
    """sin(r + rr) for ``|r| <= pi/4 (1 + 2^-20)``, ``|rr| <= ulp(r)`` (``None``: 0): Taylor to
    ``r^(2 last + 1)`` (to ``r^17``: truncation below ``2^-62 r``; to ``r^11``, for float32, below
    ``2^-36 r``), the leading ``r`` added last."""
    z = b.fmul(r, r)
    s = b.fmul(b.fmul(r, z), _taylor(b, z, 1, last, 1))
    return b.fadd(r, s if rr is None else b.fadd(s, rr))


def _cos_poly(b, r, rr, last=8):
    """cos(r + rr): ``1 - z/2`` with its rounding error carried (fdlibm's arrangement), Taylor to
    ``r^(2 last)`` (``r^16``; ``r^12`` for float32, truncation below 2^-41)."""
    c = lambda v: _like(r, v)  # noqa: E731
    z = b.fmul(r, r)
    q = _taylor(b, z, 2, last, 0)
    hz = b.fmul(z, c(0.5))
    w = b.fsub(c(1.0), hz)
    tail = b.fmul(b.fmul(z, z), q)
    if rr is not None:
        tail = b.fsub(tail, b.fmul(r, rr))
    return b.fadd(w, b.fadd(b.fsub(b.fsub(c(1.0), w), hz), tail))


def _quadrant_pick(b, k, r, rr, cosine, degrees=(8, 8)):
    """sin or cos of ``k pi/2 + r`` from the polynomials at ``r`` (their ``last`` terms:
    ``degrees``): ``k mod 4`` (a float, exact) picks the function and the sign."""
    c = lambda v: _like(r, v)  # noqa: E731
    kq = b.fsub(k, b.fmul(b.call(_fn(b.module, "llvm.floor", k, 1), [b.fmul(k, c(0.25))]), c(4.0)))
    sn, cs = _sin_poly(b, r, rr, degrees[0]), _cos_poly(b, r, rr, degrees[1])
    odd = b.or_(b.fcmp_ordered("==", kq, c(1.0)), b.fcmp_ordered("==", kq, c(3.0)))
    y = b.select(odd, cs, sn) if not cosine else b.select(odd, sn, cs)
    neg = b.fcmp_ordered(">=", kq, c(2.0)) if not cosine else \
        b.or_(b.fcmp_ordered("==", kq, c(1.0)), b.fcmp_ordered("==", kq, c(2.0)))
    return b.select(neg, b.fneg(y), y)


def _sincos_f32(b, module, x, cosine):
    """Every float32 reduced exactly in float64 (:func:`_reduce_f32`), the polynomials to
    ``r^11`` and ``r^12`` in float64, rounded once to float32."""
    X = _widen(b, x)
    k, r = _reduce_f32(b, module, X)
    y = b.fptrunc(_quadrant_pick(b, k, r, None, cosine, degrees=(5, 6)), x.type)
    if not cosine:  # sin(-0) = -0
        y = b.select(b.fcmp_ordered("==", x, _like(x, 0.0)), x, y)
    return y


def sin_f32(b: ir.IRBuilder, module: ir.Module, x):
    """sin(x) for a float32 scalar or vector ``x``."""
    return _sincos_f32(b, module, x, False)


def cos_f32(b: ir.IRBuilder, module: ir.Module, x):
    """cos(x) for a float32 scalar or vector ``x``."""
    return _sincos_f32(b, module, x, True)


def _sincos_f64(b, module, x, cosine):
    """Both reductions for every lane (branch free, so loops over it vectorize), the table's
    where ``|x| > 2^26`` (or infinite), then the polynomials in double-double. NaN and +-inf
    give NaN; sin(-0) = -0."""
    c = lambda v: _like(x, v)  # noqa: E731
    near = _reduce_medium_f64(b, module, x)
    far = _reduce_big_f64(b, module, x)
    big = b.fcmp_ordered(">", b.call(_fn(module, "llvm.fabs", x, 1), [x]), c(_SINCOS_BIG))
    k, r, rr = (b.select(big, u, v) for u, v in zip(far, near))
    y = _quadrant_pick(b, k, r, rr, cosine)
    if not cosine:  # sin(-0) = -0
        y = b.select(b.fcmp_ordered("==", x, c(0.0)), x, y)
    return y


def sin_f64(b: ir.IRBuilder, module: ir.Module, x):
    """sin(x) for a float64 scalar or vector ``x``."""
    return _sincos_f64(b, module, x, False)


def cos_f64(b: ir.IRBuilder, module: ir.Module, x):
    """cos(x) for a float64 scalar or vector ``x``."""
    return _sincos_f64(b, module, x, True)
