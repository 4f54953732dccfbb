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

A dtype is named by its width: the strings ``"float"``, ``"int"`` and ``"long"`` are
refused (a :class:`UserError`), since numpy reads ``"float"`` as float64 and ``"int"`` as
int64 where C (the exported headers) and PyTorch's ``torch.float`` mean 32 bits, and
``long`` is 32 or 64 bits by platform. Names of one meaning everywhere are accepted:
``"double"`` (float64), ``"single"`` (float32), numpy dtypes and types, and Python's
``float`` / ``int`` / ``bool`` types (float64, int64, bool, as in numpy and PyTorch).
"""
import numpy as np

from .errors import UserError

BOOL, INT32, INT64, FLOAT32, FLOAT64 = "bool", "int32", "int64", "float32", "float64"
DTYPES = (BOOL, INT32, INT64, FLOAT32, FLOAT64)
DEFAULT_FLOAT = FLOAT32
INDEX = INT64
_RANK = {d: r for r, d in enumerate(DTYPES)}


#: dtype names whose width numpy reads otherwise than C or PyTorch: what to write instead
AMBIGUOUS = {
    "float": ('numpy reads it as float64, C and torch.float as float32 (te_grad\'s default)',
              '"float32" or "float64"'),
    "int": ("numpy reads it as int64, C as int32", '"int32" or "int64"'),
    "long": ("it is 32 or 64 bits depending on the platform", '"int32" or "int64"'),
}


def canonical(dtype) -> str:
    """Return the te_grad name of ``dtype`` (a string, numpy dtype or type); the ambiguous
    names of :data:`AMBIGUOUS` are a :class:`UserError` saying what to write."""
    if type(dtype) is str and dtype in _RANK:  # a te_grad name already (most calls: IR nodes)
        return dtype
    if dtype is None:  # np.dtype(None) would silently mean float64
        raise UserError(f"a dtype is required; te_grad supports {', '.join(DTYPES)}")
    if isinstance(dtype, str) and dtype.strip().lower() in AMBIGUOUS:
        why, write = AMBIGUOUS[dtype.strip().lower()]
        raise UserError(f"dtype {dtype!r} is ambiguous ({why}): write {write}")
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
