"""Checking the arrays given for placeholders: dtype and shape, exactly.

One check shared by a compiled kernel's call (:class:`codegen.kernel.Kernel`) and the
reference evaluator's feed (:func:`te_grad.evaluator.evaluate`), so both accept and refuse
the same arguments with the same messages. A numpy array must have the placeholder's dtype
and shape; a Python scalar or list is converted, but never with a loss of value (a float
given for an integer placeholder must be integral). Contiguity is the caller's business:
the kernel copies a non-contiguous array (``np.ascontiguousarray``), the evaluator reads
any layout.
"""
from __future__ import annotations

import numpy as np

from . import dtypes
from .errors import UserError


def check_feed(tensor, value) -> np.ndarray:
    """``value`` as an array for placeholder ``tensor``, or a UserError naming the mismatch."""
    if isinstance(value, np.ndarray):
        arr = value
        if arr.dtype != np.dtype(tensor.dtype):
            raise UserError(f"placeholder {tensor.name} expects dtype {tensor.dtype} but got an array of "
                            f"{arr.dtype}; convert it with .astype(np.{tensor.dtype})")
    else:  # Python scalars and lists are converted, but never with a loss of value
        try:
            given = np.asarray(value)
            arr = given.astype(tensor.dtype)
        except (TypeError, ValueError) as err:
            raise UserError(f"cannot convert the value for placeholder {tensor.name} to "
                            f"{tensor.dtype}: {err}") from None
        if given.dtype.kind in "fc" and not dtypes.is_float(tensor.dtype) and not np.array_equal(arr, given):
            raise UserError(f"placeholder {tensor.name} is {tensor.dtype} but was given non-integral "
                            f"values {value!r}")
    if arr.shape != tensor.shape:
        raise UserError(f"placeholder {tensor.name} expects shape {list(tensor.shape)} but got "
                        f"{list(arr.shape)}")
    return arr
