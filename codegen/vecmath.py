"""Vectorizable float32 exp, tanh and sigmoid, emitted inline as LLVM IR.

libm's ``expf``/``tanhf`` are opaque calls that stop LLVM's loop vectorizer;
these are plain arithmetic, so loops over them vectorize (8 lanes with AVX2).

- ``exp``: ``x = n ln2 + r`` with ``n = roundeven(x / ln2)``, ``|r| <= ln2/2``
  (ln2 split in two parts for exactness); ``e^r`` by its degree-7 Taylor
  polynomial (relative error below 1e-8 on that range); ``2^n`` built in the
  exponent bits. Results below the smallest normal float flush to 0; above
  the largest float, +inf; NaN stays NaN.
- ``tanh``: Cephes' odd polynomial for ``|x| < 0.625``, else
  ``1 - 2 / (exp(2|x|) + 1)`` with the sign restored (no cancellation either side).
- ``sigmoid``: ``1 / (1 + exp(-x))``, exact limits 0 and 1.
"""
from __future__ import annotations

import llvmlite.ir as ir

F32 = ir.FloatType()
I32 = ir.IntType(32)

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_EXP_HI = 88.72283935546875     # above: +inf
_EXP_LO = -87.33654475          # below: flushed to 0
_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
              -3.33332819422e-1)


def _c(v):
    return ir.Constant(F32, v)


def exp_f32(b: ir.IRBuilder, module: ir.Module, x):
    flags = ("contract",)
    rint = module.declare_intrinsic("llvm.roundeven", [F32], ir.FunctionType(F32, [F32]))
    xc = b.call(module.declare_intrinsic("llvm.minnum", [F32], ir.FunctionType(F32, [F32, F32])),
                [b.call(module.declare_intrinsic("llvm.maxnum", [F32], ir.FunctionType(F32, [F32, F32])),
                        [x, _c(_EXP_LO)]), _c(_EXP_HI)])
    n = b.call(rint, [b.fmul(xc, _c(_LOG2E))])
    r = b.fsub(b.fsub(xc, b.fmul(n, _c(_LN2_HI)), flags=flags), b.fmul(n, _c(_LN2_LO)), flags=flags)
    p = _c(1.0 / 5040)
    for k in (720, 120, 24, 6, 2, 1, 1):
        p = b.fadd(b.fmul(p, r, flags=flags), _c(1.0 / k), flags=flags)
    bits = b.shl(b.add(b.fptosi(n, I32), ir.Constant(I32, 127)), ir.Constant(I32, 23))
    y = b.fmul(p, b.bitcast(bits, F32))
    y = b.select(b.fcmp_ordered("<", x, _c(_EXP_LO)), _c(0.0), y)
    y = b.select(b.fcmp_ordered(">", x, _c(_EXP_HI)), _c(float("inf")), y)
    return b.select(b.fcmp_unordered("uno", x, x), x, y)


def tanh_f32(b: ir.IRBuilder, module: ir.Module, x):
    fabs = module.declare_intrinsic("llvm.fabs", [F32], ir.FunctionType(F32, [F32]))
    copysign = module.declare_intrinsic("llvm.copysign", [F32], ir.FunctionType(F32, [F32, F32]))
    ax = b.call(fabs, [x])
    z = b.fmul(x, x)
    p = _c(_TANH_POLY[0])
    for coef in _TANH_POLY[1:]:
        p = b.fadd(b.fmul(p, z), _c(coef))
    small = b.fadd(x, b.fmul(b.fmul(x, z), p))
    e = exp_f32(b, module, b.fmul(ax, _c(2.0)))
    large = b.call(copysign, [b.fsub(_c(1.0), b.fdiv(_c(2.0), b.fadd(e, _c(1.0)))), x])
    return b.select(b.fcmp_ordered("<", ax, _c(0.625)), small, large)


def sigmoid_f32(b: ir.IRBuilder, module: ir.Module, x):
    e = exp_f32(b, module, b.fneg(x))
    return b.fdiv(_c(1.0), b.fadd(_c(1.0), e))
