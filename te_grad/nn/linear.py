"""Matrix products: ``dense``, ``matmul`` and ``batch_matmul``."""
from __future__ import annotations

from .. import dsl
from ..errors import UserError
from ..ir import Tensor
from ._util import check_tensor
from .elementwise import bias_add

__all__ = ["dense", "matmul", "batch_matmul"]


def dense(x: Tensor, w: Tensor, bias: Tensor = None) -> Tensor:
    """A fully connected layer: ``out[n, m] = sum_k x[n, k] * w[m, k] (+ bias[m])``.

    ``x`` is (N, K), ``w`` is (M, K) (PyTorch's ``Linear.weight`` layout, TVM's
    ``topi.nn.dense``), the optional ``bias`` is (M,); the result is (N, M).
    """
    check_tensor("dense", x, "x", ndim=2)
    check_tensor("dense", w, "weight", ndim=2)
    n, k = x.shape
    m, kw = w.shape
    if k != kw:
        raise UserError(f"dense: x {x.name} has {k} input features (shape {list(x.shape)}) but "
                        f"weight {w.name} expects {kw} (shape {list(w.shape)})")
    rk = dsl.reduce_axis((0, k), name="k")
    out = dsl.compute((n, m), lambda i, j: dsl.sum(x[i, rk] * w[j, rk], axis=rk), name="dense")
    if bias is not None:
        check_tensor("dense", bias, "bias", ndim=1)
        if bias.shape[0] != m:
            raise UserError(f"dense: bias {bias.name} has length {bias.shape[0]} but there are "
                            f"{m} output features")
        out = bias_add(out, bias, axis=1, name="dense_bias")
    return out


def matmul(a: Tensor, b: Tensor, transpose_a: bool = False, transpose_b: bool = False) -> Tensor:
    """The matrix product ``op(a) @ op(b)`` of two 2-D tensors.

    ``op(a)`` is ``a`` (M, K), or ``a.T`` when ``transpose_a`` (then ``a`` is
    (K, M)); likewise ``op(b)`` is ``b`` (K, N) or ``b.T`` when ``transpose_b``
    (``b`` is (N, K)). The result is (M, N): ``out[i, j] = sum_k op(a)[i, k] * op(b)[k, j]``.
    """
    check_tensor("matmul", a, "a", ndim=2)
    check_tensor("matmul", b, "b", ndim=2)
    m, k = (a.shape[1], a.shape[0]) if transpose_a else a.shape
    kb, n = (b.shape[1], b.shape[0]) if transpose_b else b.shape
    if k != kb:
        raise UserError(f"matmul: inner dimensions differ: op(a) is {[m, k]} (a {a.name} "
                        f"{list(a.shape)}, transpose_a={transpose_a}) and op(b) is {[kb, n]} "
                        f"(b {b.name} {list(b.shape)}, transpose_b={transpose_b})")
    rk = dsl.reduce_axis((0, k), name="k")

    def body(i, j):
        va = a[rk, i] if transpose_a else a[i, rk]
        vb = b[j, rk] if transpose_b else b[rk, j]
        return dsl.sum(va * vb, axis=rk)

    return dsl.compute((m, n), body, name="matmul")


def batch_matmul(a: Tensor, b: Tensor, transpose_b: bool = False, transpose_a: bool = False) -> Tensor:
    """A batch of matrix products: ``out[t] = op(a[t]) @ op(b[t])``.

    ``a`` is (B, M, K), or (B, K, M) when ``transpose_a``; ``b`` is (B, K, N), or
    (B, N, K) when ``transpose_b`` (TVM's ``topi.nn.batch_matmul`` layout). A batch
    size of 1 on either side broadcasts against the other. The result is (B, M, N):
    ``out[t, i, j] = sum_k op(a)[t, i, k] * op(b)[t, k, j]``.
    """
    check_tensor("batch_matmul", a, "a", ndim=3)
    check_tensor("batch_matmul", b, "b", ndim=3)
    if transpose_a:
        ba, k, m = a.shape
    else:
        ba, m, k = a.shape
    if transpose_b:
        bb, n, kb = b.shape
    else:
        bb, kb, n = b.shape
    if ba != bb and 1 not in (ba, bb):
        raise UserError(f"batch_matmul: batch sizes differ: a {a.name} {list(a.shape)} and "
                        f"b {b.name} {list(b.shape)}")
    if k != kb:
        raise UserError(f"batch_matmul: inner dimensions differ: a {a.name} {list(a.shape)} has "
                        f"K={k} and b {b.name} {list(b.shape)} has K={kb} "
                        f"(transpose_a={transpose_a}, transpose_b={transpose_b})")
    batch = ba if bb == 1 else bb
    rk = dsl.reduce_axis((0, k), name="k")

    def body(t, i, j):
        ta = 0 if ba == 1 else t
        tb = 0 if bb == 1 else t
        vb = b[tb, j, rk] if transpose_b else b[tb, rk, j]
        va = a[ta, rk, i] if transpose_a else a[ta, i, rk]
        return dsl.sum(va * vb, axis=rk)

    return dsl.compute((batch, m, n), body, name="batch_matmul")
