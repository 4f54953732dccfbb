"""Optimizers written as te_grad ops: each update is a compute tensor of the training step.

An optimizer declares, per parameter, the state tensors it keeps (momentum buffer,
first and second moments) and builds the new parameter and new states from the
parameter, its gradient and its states, with the step's hyperparameters as 0-d
float32 inputs of the step kernel: the learning rate (a schedule is just a different
value each call) and the step count ``t`` (1 for the first update). The formulas are
PyTorch's (``torch.optim``), operation for operation, so float32 runs agree closely.

Hyperparameters are checked when the optimizer is made, and a :class:`UserError` names
the argument and the value: every one must be a finite real number (no nan, no inf);
``lr``, ``momentum`` and ``weight_decay`` are ``>= 0``, ``dampening`` in ``[0, 1]``, each of
``betas`` in ``[0, 1)`` and ``eps > 0``. A learning rate given to ``Trainer.update`` (or by
a schedule) is checked the same way.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import List, Tuple

from .. import dsl
from ..errors import UserError
from ..ir import Tensor


@dataclass
class Hyper:
    """The per-step inputs: ``lr`` and ``t`` (0-d float32 placeholders)."""
    lr: Tensor
    t: Tensor


def check_hyper(owner: str, name: str, value, low: float = 0.0, high: float = math.inf,
                low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a float if it is a finite real number in the interval from ``low`` to
    ``high`` (``low_open`` / ``high_open``: that end excluded); a :class:`UserError` naming
    ``owner``, the argument and the value otherwise (nan, inf, a string, a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UserError(f"{owner}: {name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise UserError(f"{owner}: {name} must be finite, got {value}")
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if below or above:
        lo, hi = "(" if low_open else "[", ")" if high_open or high == math.inf else "]"
        raise UserError(f"{owner}: {name} must be in {lo}{low:g}, {high:g}{hi}, got {value:g}")
    return value


def _elementwise(shape, fn, name):
    return dsl.compute(shape, lambda *idx: fn(idx), name=name)


class Optimizer:
    """``states(shape)``: ``[(suffix, initial value)]``; ``update(p, g, states, hyper)``:
    ``(new parameter, [new states])``, te_grad tensors."""

    def __init__(self, lr: float = 1e-3):
        self.lr = check_hyper(type(self).__name__, "lr", lr)

    def states(self) -> List[Tuple[str, float]]:
        return []

    def update(self, p: Tensor, g: Tensor, states: List[Tensor], hyper: Hyper):
        raise NotImplementedError


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight
    decay (``torch.optim.SGD``)::

        g = grad + weight_decay * p
        buf = g at the first step, else momentum * buf + (1 - dampening) * g
        g = g + momentum * buf (nesterov) or buf (momentum > 0)
        p = p - lr * g
    """

    def __init__(self, lr: float = 1e-2, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(lr)
        momentum = check_hyper("SGD", "momentum", momentum)
        dampening = check_hyper("SGD", "dampening", dampening, 0.0, 1.0)
        weight_decay = check_hyper("SGD", "weight_decay", weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise UserError("SGD: Nesterov momentum needs momentum > 0 and no dampening")
        self.momentum, self.dampening, self.weight_decay, self.nesterov = momentum, dampening, weight_decay, nesterov

    def states(self):
        return [("momentum_buffer", 0.0)] if self.momentum else []

    def update(self, p, g, states, hyper):
        m, d, wd = self.momentum, self.dampening, self.weight_decay

        def grad(idx):
            return g[idx] + wd * p[idx] if wd else g[idx]
        if not m:
            return _elementwise(p.shape, lambda idx: p[idx] - hyper.lr[()] * grad(idx), f"{p.name}_new"), []
        buf = states[0]
        first = hyper.t[()] <= 1.0
        new_buf = _elementwise(p.shape, lambda idx: dsl.if_then_else(first, grad(idx),
                                                                     m * buf[idx] + (1.0 - d) * grad(idx)),
                               f"{buf.name}_new")
        if self.nesterov:
            step = lambda idx: grad(idx) + m * new_buf[idx]  # noqa: E731
        else:
            step = lambda idx: new_buf[idx]  # noqa: E731
        return _elementwise(p.shape, lambda idx: p[idx] - hyper.lr[()] * step(idx), f"{p.name}_new"), [new_buf]


class Adam(Optimizer):
    """Adam (``torch.optim.Adam``; ``weight_decay`` adds ``weight_decay * p`` to the gradient)::

        m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
        p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
    """

    decoupled = False

    def __init__(self, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(lr)
        owner = type(self).__name__
        try:
            beta1, beta2 = betas
        except (TypeError, ValueError):
            raise UserError(f"{owner}: betas must be a pair (beta1, beta2), got {betas!r}") from None
        self.beta1 = check_hyper(owner, "betas[0]", beta1, 0.0, 1.0, high_open=True)
        self.beta2 = check_hyper(owner, "betas[1]", beta2, 0.0, 1.0, high_open=True)
        self.eps = check_hyper(owner, "eps", eps, low_open=True)
        self.weight_decay = check_hyper(owner, "weight_decay", weight_decay)

    def states(self):
        return [("exp_avg", 0.0), ("exp_avg_sq", 0.0)]

    def update(self, p, g, states, hyper):
        b1, b2, eps, wd = self.beta1, self.beta2, self.eps, self.weight_decay
        m, v = states
        t, lr = hyper.t[()], hyper.lr[()]

        def grad(idx):
            return g[idx] + wd * p[idx] if wd and not self.decoupled else g[idx]
        new_m = _elementwise(p.shape, lambda idx: b1 * m[idx] + (1.0 - b1) * grad(idx), f"{m.name}_new")
        new_v = _elementwise(p.shape, lambda idx: b2 * v[idx] + (1.0 - b2) * grad(idx) * grad(idx), f"{v.name}_new")
        bc1 = 1.0 - dsl.pow(dsl.const(b1, p.dtype), t)
        bc2 = 1.0 - dsl.pow(dsl.const(b2, p.dtype), t)

        def new_p(idx):
            base = p[idx] * (1.0 - lr * wd) if wd and self.decoupled else p[idx]
            denom = dsl.sqrt(new_v[idx]) / dsl.sqrt(bc2) + eps
            return base - (lr / bc1) * new_m[idx] / denom
        return _elementwise(p.shape, new_p, f"{p.name}_new"), [new_m, new_v]


class AdamW(Adam):
    """Adam with decoupled weight decay (``torch.optim.AdamW``): ``p = p * (1 - lr * weight_decay)``
    before the Adam step."""

    decoupled = True

    def __init__(self, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(lr, betas, eps, weight_decay)
