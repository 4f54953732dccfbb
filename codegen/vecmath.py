"""Vectorizable float32 exp, tanh and sigmoid, emitted inline as LLVM IR.

libm's ``expf``/``tanhf`` are opaque calls that stop LLVM's loop vectorizer;
these are plain arithmetic, so loops over them vectorize (8 lanes with AVX2).

- ``exp``: ``x = n ln2 + r`` with ``n = roundeven(x / ln2)``, ``|r| <= ln2/2``
  (ln2 split in two parts for exactness); ``e^r`` by its degree-7 Taylor
  polynomial (relative error below 1e-8 on that range); ``2^n`` built in the
  exponent bits (as ``2 * 2^(n-1)``, so ``n = 128`` near the top of the range is finite). Results below the smallest normal float flush to 0; above
  the largest float, +inf; NaN stays NaN.
- ``tanh``: Cephes' odd polynomial for ``|x| < 0.625``, else
  ``1 - 2 / (exp(2|x|) + 1)`` with the sign restored (no cancellation either side).
- ``sigmoid``: ``1 / (1 + exp(-x))``, exact limits 0 and 1.
"""
from __future__ import annotations

from .llvm import ir

F32 = ir.FloatType()
I32 = ir.IntType(32)

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_EXP_HI = 88.72283935546875     # above: +inf
_EXP_LO = -87.33654475          # below: flushed to 0
_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
              -3.33332819422e-1)


def _like(x, v):
    """The float32 constant ``v``, splat to a vector if ``x`` is one."""
    if isinstance(x.type, ir.VectorType):
        return ir.Constant(x.type, [ir.Constant(F32, v)] * x.type.count)
    return ir.Constant(F32, v)


def _int_like(x, v):
    if isinstance(x.type, ir.VectorType):
        return ir.Constant(ir.VectorType(I32, x.type.count), [ir.Constant(I32, v)] * x.type.count)
    return ir.Constant(I32, v)


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
    large = b.call(_fn(module, "llvm.copysign", x, 2), [b.fsub(c(1.0), b.fdiv(c(2.0), b.fadd(e, c(1.0)))), x])
    return b.select(b.fcmp_ordered("<", ax, c(0.625)), small, large)


def sigmoid_f32(b: ir.IRBuilder, module: ir.Module, x):
    """1 / (1 + e^-x) for a float32 scalar or vector ``x``."""
    e = exp_f32(b, module, b.fneg(x))
    return b.fdiv(_like(x, 1.0), b.fadd(_like(x, 1.0), e))
