"""The reference workloads: 18 forward ops at realistic sizes.

Used by the iteration-count table, the benchmarks and the tests of the
cheap-gradient promise. ``SUITE[name](dtype)`` builds a fresh :class:`Workload`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List

import numpy as np

from . import dsl, nn
from .ir import Tensor


@dataclass
class Workload:
    """A forward ``output`` of the float ``inputs`` (plus integer ``data`` placeholders)."""
    name: str
    output: Tensor
    inputs: List[Tensor]
    data: Dict[Tensor, Callable[[np.random.Generator], np.ndarray]] = field(default_factory=dict)

    def feed(self, rng: np.random.Generator) -> Dict[Tensor, np.ndarray]:
        """Random values for every placeholder (standard normal floats, valid integer data)."""
        out = {x: rng.standard_normal(x.shape).astype(x.dtype) for x in self.inputs}
        out.update({t: make(rng) for t, make in self.data.items()})
        return out


def _ph(shape, dtype, name):
    return dsl.placeholder(shape, dtype=dtype, name=name)


def _dense(dt):
    x, w = _ph((256, 512), dt, "X"), _ph((256, 512), dt, "W")
    return Workload("dense", nn.dense(x, w), [x, w])


def _conv(stride, padding, dilation, groups=1):
    def build(dt):
        x = _ph((4, 32, 32, 32), dt, "X")
        w = _ph((32, 32 // groups, 3, 3), dt, "W")
        y = nn.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
        return Workload("", y, [x, w])
    return build


def _pool(kind):
    def build(dt):
        x = _ph((4, 32, 32, 32), dt, "X")
        y = nn.max_pool2d(x, 2) if kind == "max" else nn.avg_pool2d(x, 2)
        return Workload("", y, [x])
    return build


def _softmax(log):
    def build(dt):
        x = _ph((256, 1000), dt, "X")
        return Workload("", nn.log_softmax(x) if log else nn.softmax(x), [x])
    return build


def _layer_norm(dt):
    x, g, b = _ph((256, 1024), dt, "X"), _ph((1024,), dt, "gamma"), _ph((1024,), dt, "beta")
    return Workload("", nn.layer_norm(x, g, b), [x, g, b])


def _flatten_dense(dt):
    x, w = _ph((4, 32, 16, 16), dt, "X"), _ph((128, 32 * 16 * 16), dt, "W")
    return Workload("", nn.dense(nn.flatten(x), w), [x, w])


def _transpose(dt):
    x = _ph((1024, 1024), dt, "X")
    return Workload("", nn.transpose(x), [x])


def _bias_add(dt):
    x, b = _ph((4, 32, 32, 32), dt, "X"), _ph((32,), dt, "b")
    return Workload("", nn.bias_add(x, b, axis=1), [x, b])


def _row_sum(dt):
    x = _ph((1024, 1024), dt, "X")
    k = dsl.reduce_axis(1024, "k")
    return Workload("", dsl.compute((1024,), lambda i: dsl.sum(x[i, k], axis=k), name="row_sum"), [x])


def _elementwise(dt):
    x = _ph((1024, 1024), dt, "X")
    y = dsl.compute((1024, 1024), lambda i, j: dsl.exp(dsl.tanh(x[i, j])) * dsl.sigmoid(x[i, j]),
                    name="exp_tanh_sigmoid")
    return Workload("", y, [x])


def _cumsum(dt):
    x = _ph((1024, 1024), dt, "X")
    k = dsl.reduce_axis(1024, "k")
    y = dsl.compute((1024, 1024), lambda i, j: dsl.sum(x[i, k], axis=k, where=k <= j), name="cumsum")
    return Workload("", y, [x])


def _embedding(dt):
    table = _ph((50000, 128), dt, "table")
    ids = dsl.placeholder((4096,), dtype="int64", name="ids")
    return Workload("", nn.embedding(table, ids), [table],
                    {ids: lambda rng: rng.integers(0, 50000, size=4096).astype("int64")})


def _attention(dt):
    q, k, v = _ph((8, 256, 64), dt, "Q"), _ph((8, 256, 64), dt, "K"), _ph((8, 256, 64), dt, "V")
    scores = nn.batch_matmul(q, k, transpose_b=True)
    scaled = dsl.compute(scores.shape, lambda b, i, j: scores[b, i, j] / 8.0, name="scaled")
    return Workload("", nn.batch_matmul(nn.softmax(scaled), v), [q, k, v])


SUITE: Dict[str, Callable[[str], Workload]] = {
    "dense": _dense,
    "conv2d_s1p1": _conv(1, 1, 1),
    "conv2d_s2p1": _conv(2, 1, 1),
    "conv2d_d2p2": _conv(1, 2, 2),
    "depthwise3x3": _conv(1, 1, 1, groups=32),
    "max_pool2x2": _pool("max"),
    "avg_pool2x2": _pool("avg"),
    "softmax": _softmax(False),
    "log_softmax": _softmax(True),
    "layer_norm": _layer_norm,
    "flatten_dense": _flatten_dense,
    "transpose": _transpose,
    "bias_add": _bias_add,
    "row_sum": _row_sum,
    "exp_tanh_sigmoid": _elementwise,
    "cumsum": _cumsum,
    "embedding": _embedding,
    "attention": _attention,
}


def workload(name: str, dtype: str = "float32") -> Workload:
    """A fresh instance of the named workload."""
    w = SUITE[name](dtype)
    w.name = name
    return w
