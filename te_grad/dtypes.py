"""The dtypes te_grad knows and the rules that combine them.

Supported: ``bool``, ``int32``, ``int64``, ``float32`` (the default), ``float64``.

Promotion of two expressions follows the lattice
``bool < int32 < int64 < float32 < float64``: the result has the larger dtype
(so ``int64 + float32 -> float32``, as in JAX). Python scalars are *weak*: a
Python ``int`` takes the other operand's dtype (``int64`` next to a ``bool``),
a Python ``float`` takes the other operand's dtype if that is a float and
``float32`` otherwise. True division ``/`` always produces a float (integers
are promoted to ``float32``); ``//`` and ``%`` need integer operands. Index
variables are ``int64``.
"""
import numpy as np

from .errors import UserError

BOOL, INT32, INT64, FLOAT32, FLOAT64 = "bool", "int32", "int64", "float32", "float64"
DTYPES = (BOOL, INT32, INT64, FLOAT32, FLOAT64)
DEFAULT_FLOAT = FLOAT32
INDEX = INT64
_RANK = {d: r for r, d in enumerate(DTYPES)}


def canonical(dtype) -> str:
    """Return the te_grad name of ``dtype`` (a string, numpy dtype or type)."""
    if dtype is None:  # np.dtype(None) would silently mean float64
        raise UserError(f"a dtype is required; te_grad supports {', '.join(DTYPES)}")
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in _RANK:
        raise UserError(f"unsupported dtype {dtype!r}; te_grad supports {', '.join(DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    return dtype in (FLOAT32, FLOAT64)


def is_int(dtype: str) -> bool:
    return dtype in (INT32, INT64)


def promote(a: str, b: str) -> str:
    """The dtype of a binary arithmetic result between dtypes ``a`` and ``b``."""
    return a if _RANK[a] >= _RANK[b] else b


def numpy_dtype(dtype: str):
    return np.dtype(dtype)
