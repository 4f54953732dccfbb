"""LLVM types and small helpers shared by the stage emitter and its register blocks."""
from __future__ import annotations

from typing import List, Sequence

from te_grad import ops
from te_grad.errors import InternalError
from te_grad.graph import reads_in
from te_grad.ir import Call, Expr, Read, distinct_nodes

from .llvm import ir

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
SCALAR = {"float32": ir.FloatType(), "float64": ir.DoubleType(), "int32": I32, "int64": I64, "bool": I1}
MEMORY = dict(SCALAR, bool=I8)
FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
#: intrinsics with an inline vector form (:mod:`.vecmath`), by dtype
_ARC = ("atan", "atan2", "asin", "acos")
INLINE = {"float32": ("exp", "tanh", "sigmoid", "erf", "log", "sin", "cos", "log1p", "expm1") + _ARC,
          "float64": ("exp", "tanh", "sigmoid", "erf", "log", "sin", "cos", "log1p", "expm1") + _ARC}
#: intrinsics lowered to other operations (no call at all)
EXPANDED = ("sigmoid", "stop_gradient")


def lowering(name: str, dtype: str):
    """How intrinsic ``name`` is lowered for ``dtype``: ``("inline", None)`` (vecmath),
    ``("expand", None)``, ``("llvm", intrinsic)`` or ``("libm", C symbol)``, from its record."""
    op = ops.intrinsic(name)
    if name in INLINE.get(dtype, ()):
        return "inline", None
    if name in EXPANDED:
        return "expand", None
    if op.llvm is not None:
        return "llvm", op.llvm
    if op.c_name is not None:
        return "libm", op.c_name + ("f" if dtype == "float32" else "")
    raise InternalError(f"intrinsic {name} has no native lowering: give its record in te_grad/ops.py "
                        "an llvm intrinsic or a C math library name")


SIZE = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1}


def vectorizable(e: Expr, dtype: str) -> bool:
    """True if ``e`` has a lane-wise vector form: no opaque library calls, no data-dependent
    or boolean reads. Each distinct node is looked at once (iterative, linear in a DAG)."""
    for x in distinct_nodes(e):
        if isinstance(x, Call) and lowering(x.name, x.dtype)[0] == "libm":
            return False
        if isinstance(x, Read) and (x.tensor.dtype == "bool" or any(reads_in(i) for i in x.indices)):
            return False
    return True


def strides(shape: Sequence[int]) -> List[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return list(reversed(out))
