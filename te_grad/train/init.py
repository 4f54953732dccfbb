"""Parameter initialization (numpy, seeded): zeros, Xavier/Glorot and Kaiming/He schemes.

An initializer maps the trainer's parameters to arrays: weights by its scheme (from
their fan-in and fan-out), biases to zero, normalization scales to one and shifts to
zero, embedding tables to a standard normal, as PyTorch's layers do by default for
those kinds.
"""
from __future__ import annotations

import math
from typing import Dict, Sequence

import numpy as np

from ..errors import UserError


class Initializer:
    """``init(params) -> {name: array}``; ``scheme(rng, shape, fan_in, fan_out)`` draws a weight."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def scheme(self, rng, shape, fan_in, fan_out) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, params: Sequence) -> Dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        out = {}
        for p in params:
            if p.kind == "weight":
                value = self.scheme(rng, p.shape, p.fan_in, p.fan_out)
            elif p.kind in ("bias", "zeros"):
                value = np.zeros(p.shape)
            elif p.kind == "ones":
                value = np.ones(p.shape)
            elif p.kind == "embedding":
                value = rng.standard_normal(p.shape)
            else:
                raise UserError(f"cannot initialize parameter {p.name} of kind {p.kind!r}")
            out[p.name] = np.asarray(value, dtype=p.dtype)
        return out


class zeros(Initializer):  # noqa: N801 - a scheme name
    """Every weight zero."""

    def scheme(self, rng, shape, fan_in, fan_out):
        return np.zeros(shape)


class xavier_uniform(Initializer):  # noqa: N801
    """Glorot & Bengio: U(-a, a) with ``a = gain * sqrt(6 / (fan_in + fan_out))``."""

    def __init__(self, seed: int = 0, gain: float = 1.0):
        super().__init__(seed)
        self.gain = gain

    def scheme(self, rng, shape, fan_in, fan_out):
        a = self.gain * math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-a, a, shape)


class xavier_normal(xavier_uniform):  # noqa: N801
    """Glorot & Bengio: N(0, std^2) with ``std = gain * sqrt(2 / (fan_in + fan_out))``."""

    def scheme(self, rng, shape, fan_in, fan_out):
        return rng.standard_normal(shape) * self.gain * math.sqrt(2.0 / (fan_in + fan_out))


class kaiming_uniform(Initializer):  # noqa: N801
    """He et al.: U(-b, b) with ``b = sqrt(6 / fan_in)`` (ReLU gain, fan-in mode)."""

    def scheme(self, rng, shape, fan_in, fan_out):
        b = math.sqrt(6.0 / fan_in)
        return rng.uniform(-b, b, shape)


class kaiming_normal(Initializer):  # noqa: N801
    """He et al.: N(0, 2 / fan_in) (ReLU gain, fan-in mode)."""

    def scheme(self, rng, shape, fan_in, fan_out):
        return rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)


# the usual aliases
glorot_uniform = xavier_uniform
glorot_normal = xavier_normal
