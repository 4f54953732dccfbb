"""LLVM types and small helpers shared by the stage emitter and its register blocks."""
from __future__ import annotations

from typing import List, Sequence

from te_grad.graph import reads_in
from te_grad.ir import Call, Expr, Read

from .llvm import ir

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
SCALAR = {"float32": ir.FloatType(), "float64": ir.DoubleType(), "int32": I32, "int64": I64, "bool": I1}
MEMORY = dict(SCALAR, bool=I8)
FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
LIBM = {("tanh", "float32"): "tanhf", ("tanh", "float64"): "tanh",
         ("erf", "float32"): "erff", ("erf", "float64"): "erf"}
LLVM_INTRINSIC = {"exp": "llvm.exp", "log": "llvm.log", "sqrt": "llvm.sqrt", "sin": "llvm.sin",
                   "cos": "llvm.cos", "abs": "llvm.fabs", "floor": "llvm.floor", "ceil": "llvm.ceil",
                   "trunc": "llvm.trunc", "round": "llvm.roundeven"}


SIZE = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1}


def vectorizable(e: Expr, dtype: str) -> bool:
    """True if ``e`` has a lane-wise vector form: no opaque library calls, no data-dependent
    or boolean reads."""
    if isinstance(e, Call) and (e.name, e.dtype) in LIBM:
        return False
    if isinstance(e, Read):
        if e.tensor.dtype == "bool" or any(reads_in(i) for i in e.indices):
            return False
    return all(vectorizable(c, dtype) for c in e.children())


def strides(shape: Sequence[int]) -> List[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return list(reversed(out))
