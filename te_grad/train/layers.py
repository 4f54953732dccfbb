"""Layers: thin wrappers over te_grad.nn that hold their parameters as placeholders.

A layer is built once, with its parameter shapes; calling it on te_grad tensors (with a
:class:`Context`) returns te_grad tensors, so the same layer serves the training step
(``training=True``: batch statistics, dropout) and prediction (running statistics, no
dropout) and any batch size. Parameters and states are named as in PyTorch's
``state_dict`` (``"0.weight"``, ``"2.running_mean"``) once a :class:`Sequential` owns
the layer, so weights move between the two by name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from .. import dsl, nn
from ..errors import UserError
from ..ir import Tensor


@dataclass
class Param:
    """A trainable tensor: its placeholder, and how to initialize it (``kind``: ``"weight"``
    with ``fan_in``/``fan_out``, ``"bias"``, ``"ones"``, ``"zeros"``, ``"embedding"``).
    ``value`` (an array of ``shape``), when set, is the initial value and the Trainer's
    initializer leaves the parameter alone (an imported model's weights)."""
    name: str
    shape: Tuple[int, ...]
    kind: str
    fan_in: int = 1
    fan_out: int = 1
    dtype: str = "float32"
    placeholder: Tensor = None
    value: object = None

    def __post_init__(self):
        self.placeholder = dsl.placeholder(self.shape, dtype=self.dtype, name=self.name)


@dataclass
class State:
    """A non-trainable tensor the training step may update (batch norm's running statistics).
    ``initial`` is a number, or an array of ``shape`` (an imported model's buffer)."""
    name: str
    shape: Tuple[int, ...]
    initial: object
    dtype: str = "float32"
    placeholder: Tensor = None

    def __post_init__(self):
        self.placeholder = dsl.placeholder(self.shape, dtype=self.dtype, name=self.name)


@dataclass
class Context:
    """What a layer needs besides its input: the mode, the dropout seed (an int64 0-d
    placeholder), and where state updates are collected (``{id(state placeholder): new value}``)."""
    training: bool
    seed: Optional[Tensor] = None
    updates: Dict[int, Tensor] = field(default_factory=dict)
    dropout_count: int = 0


class Module:
    """A layer: its parameters, its states, and ``forward(x, ctx)``."""

    def parameters(self) -> List[Param]:
        return [v for v in vars(self).values() if isinstance(v, Param)]

    def states(self) -> List[State]:
        return [v for v in vars(self).values() if isinstance(v, State)]

    def rename(self, prefix: str):
        """Give the parameters and states their ``state_dict`` names under ``prefix``."""
        for attr, v in vars(self).items():
            if isinstance(v, (Param, State)):
                v.name = f"{prefix}{attr}"
                v.placeholder = dsl.placeholder(v.shape, dtype=v.dtype, name=v.name)

    def params_with_gradient(self, outputs: Sequence[int]) -> Optional[Set[str]]:
        """The names of the parameters the framework the model comes from gives a gradient
        when the loss reads the outputs at positions ``outputs``: a training step moves them
        even where te_grad derives their gradient as the constant 0 (PyTorch's ``0 * p`` has
        the gradient zeros, which weight decay moves). ``None`` (the default): te_grad's rule
        alone, a parameter whose gradient is the constant 0 (the loss does not read it, or only
        under ``stop_gradient``) stays as it is."""
        return None

    def __call__(self, x: Tensor, ctx: Context) -> Tensor:
        return self.forward(x, ctx)

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        raise NotImplementedError


class Linear(Module):
    """``y = x @ weight.T + bias`` on the last axis (PyTorch's ``nn.Linear``): ``weight`` is
    (out_features, in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        self.weight = Param("weight", (out_features, in_features), "weight", in_features, out_features)
        self.bias = Param("bias", (out_features,), "bias", in_features, out_features) if bias else None

    def forward(self, x, ctx):
        return nn.dense(x, self.weight.placeholder, self.bias.placeholder if self.bias else None)


class Conv2d(Module):
    """A 2-D convolution in NCHW (PyTorch's ``nn.Conv2d``): ``weight`` is (out, in / groups, k, k)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True):
        kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        fan_in, fan_out = in_channels // groups * kh * kw, out_channels // groups * kh * kw
        self.weight = Param("weight", (out_channels, in_channels // groups, kh, kw), "weight", fan_in, fan_out)
        self.bias = Param("bias", (out_channels,), "bias", fan_in, fan_out) if bias else None
        self.options = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)

    def forward(self, x, ctx):
        return nn.conv2d(x, self.weight.placeholder, bias=self.bias.placeholder if self.bias else None,
                         **self.options)


class Conv1d(Module):
    """A 1-D convolution in NCL (PyTorch's ``nn.Conv1d``): ``weight`` is (out, in / groups, k);
    ``padding`` is an int, ``"same"`` or ``"valid"``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True):
        (k,) = (kernel_size,) if isinstance(kernel_size, int) else tuple(kernel_size)
        if in_channels % groups or out_channels % groups:
            raise UserError(f"Conv1d: groups={groups} must divide in_channels={in_channels} and "
                            f"out_channels={out_channels}")
        fan_in, fan_out = in_channels // groups * k, out_channels // groups * k
        self.weight = Param("weight", (out_channels, in_channels // groups, k), "weight", fan_in, fan_out)
        self.bias = Param("bias", (out_channels,), "bias", fan_in, fan_out) if bias else None
        self.options = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)

    def forward(self, x, ctx):
        return nn.conv1d(x, self.weight.placeholder, bias=self.bias.placeholder if self.bias else None,
                         **self.options)


class BatchNorm2d(Module):
    """Batch normalization over (N, H, W) per channel (PyTorch's ``nn.BatchNorm2d``).

    Training: the batch mean and biased variance normalize, and the running statistics
    become ``(1 - momentum) * running + momentum * batch`` (the variance unbiased), an
    update the training step writes. Prediction: the running statistics normalize."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        self.weight = Param("weight", (num_features,), "ones")
        self.bias = Param("bias", (num_features,), "zeros")
        self.running_mean = State("running_mean", (num_features,), 0.0)
        self.running_var = State("running_var", (num_features,), 1.0)
        self.eps, self.momentum = eps, momentum

    def forward(self, x, ctx):
        if x.ndim != 4:
            raise UserError(f"BatchNorm2d: input {x.name} must be (N, C, H, W), got {list(x.shape)}")
        g, b = self.weight.placeholder, self.bias.placeholder
        if ctx.training:
            mean = nn.mean(x, (0, 2, 3))
            var = nn.variance(x, (0, 2, 3))
            n = x.shape[0] * x.shape[2] * x.shape[3]
            m = self.momentum
            rm, rv = self.running_mean.placeholder, self.running_var.placeholder
            ctx.updates[id(rm)] = dsl.compute(rm.shape, lambda c: (1.0 - m) * rm[c] + m * mean[c],
                                              name=f"{self.running_mean.name}_new")
            if isinstance(n, int):
                unbias = n / max(n - 1, 1)
            else:  # the batch is a size variable: the same factor, computed in the kernel
                unbias = dsl.cast(x.dtype, n) / dsl.cast(x.dtype, dsl.maximum(n - 1, 1))
            ctx.updates[id(rv)] = dsl.compute(rv.shape, lambda c: (1.0 - m) * rv[c] + (m * unbias) * var[c],
                                              name=f"{self.running_var.name}_new")
        else:
            mean, var = self.running_mean.placeholder, self.running_var.placeholder
        eps = self.eps
        return dsl.compute(x.shape, lambda n_, c, h, w: (x[n_, c, h, w] - mean[c]) / dsl.sqrt(var[c] + eps)
                           * g[c] + b[c], name="batch_norm")


class LayerNorm(Module):
    """Layer normalization over the last axis (PyTorch's ``nn.LayerNorm(normalized_shape)``)."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5):
        self.weight = Param("weight", (normalized_shape,), "ones")
        self.bias = Param("bias", (normalized_shape,), "zeros")
        self.eps = eps

    def forward(self, x, ctx):
        return nn.layer_norm(x, self.weight.placeholder, self.bias.placeholder, eps=self.eps)


class RMSNorm(Module):
    """Root-mean-square normalization over the trailing ``normalized_shape`` (PyTorch's
    ``nn.RMSNorm``): ``weight`` of that shape, initialized to ones; ``eps=None`` is the machine
    epsilon of the input's dtype, as PyTorch's."""

    def __init__(self, normalized_shape, eps: float = None):
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if not shape:
            raise UserError(f"RMSNorm: normalized_shape must be an int or a non-empty tuple, got {normalized_shape!r}")
        self.weight = Param("weight", shape, "ones")
        self.eps = eps

    def forward(self, x, ctx):
        axes = tuple(range(-len(self.weight.shape), 0))
        return nn.rms_norm(x, self.weight.placeholder, eps=self.eps, axis=axes)


class Embedding(Module):
    """A table of ``num_embeddings`` rows read at integer ids (PyTorch's ``nn.Embedding``)."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        self.weight = Param("weight", (num_embeddings, embedding_dim), "embedding", num_embeddings, embedding_dim)

    def forward(self, ids, ctx):
        return nn.embedding(self.weight.placeholder, ids)


class _Function(Module):
    def __init__(self, fn: Callable, name: str):
        self.fn, self.name = fn, name

    def forward(self, x, ctx):
        return self.fn(x)

    def __repr__(self):
        return f"{self.name}()"


def ReLU() -> Module:  # noqa: N802 - PyTorch's name
    """``max(x, 0)`` (te_grad.nn.relu: derivative 0 at 0, as PyTorch's)."""
    return _Function(nn.relu, "ReLU")


def GELU(approximate: str = "none") -> Module:  # noqa: N802
    """The GELU (te_grad.nn.gelu): exact, or its tanh approximation with ``approximate="tanh"``."""
    if approximate not in ("none", "tanh"):
        raise UserError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _Function(lambda x: nn.gelu(x, approximate), "GELU")


def SiLU() -> Module:  # noqa: N802
    """``x * sigmoid(x)`` (te_grad.nn.silu)."""
    return _Function(nn.silu, "SiLU")


def Tanh() -> Module:  # noqa: N802
    """The hyperbolic tangent."""
    return _Function(nn.tanh, "Tanh")


def Flatten() -> Module:  # noqa: N802
    """Every axis after the first flattened into one (PyTorch's ``nn.Flatten``)."""
    return _Function(nn.flatten, "Flatten")


def MaxPool2d(kernel_size, stride=None, padding=0) -> Module:  # noqa: N802
    """2-D max pooling; a tied window's gradient goes to its first maximum, as PyTorch's."""
    return _Function(lambda x: nn.max_pool2d(x, kernel_size, stride, padding), "MaxPool2d")


def AvgPool2d(kernel_size, stride=None, padding=0) -> Module:  # noqa: N802
    """2-D average pooling (padding counted, as PyTorch's default)."""
    return _Function(lambda x: nn.avg_pool2d(x, kernel_size, stride, padding), "AvgPool2d")


class Dropout(Module):
    """Zeroes each element with probability ``p`` in training (and scales the rest by
    ``1 / (1 - p)``); the identity in prediction. The mask is a hash of the element's
    position and the step's seed (an input of the training step, new each step), so a
    step is reproducible from its seed."""

    def __init__(self, p: float = 0.5):
        if not 0.0 <= p < 1.0:
            raise UserError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x, ctx):
        return dropout(x, self.p, ctx)


def dropout(x: Tensor, p: float, ctx: Context) -> Tensor:
    """``x`` with each element zeroed with probability ``p`` and the rest scaled by ``1 / (1 - p)``
    in training (``ctx.training``), ``x`` itself otherwise. The mask is a hash of the element's
    position, the step's seed (``ctx.seed``) and the count of dropouts before it in the step."""
    if not ctx.training or p == 0.0:
        return x
    keep, scale = 1.0 - p, 1.0 / (1.0 - p)
    uniform = _uniform(x.shape, x.dtype, ctx, "Dropout")
    return dsl.compute(x.shape, lambda *idx: dsl.if_then_else(uniform(idx) < keep, x[idx] * scale,
                                                              dsl.const(0.0, x.dtype)), name="dropout")


def bernoulli(shape, p: float, dtype: str, ctx: Context) -> Tensor:
    """A tensor of ``shape`` whose elements are 1 with probability ``p`` and 0 otherwise, drawn
    as :func:`dropout` draws its mask (the step's seed, the count of draws before it)."""
    uniform = _uniform(shape, dtype, ctx, "bernoulli")
    return dsl.compute(tuple(shape), lambda *idx: dsl.if_then_else(uniform(idx) < p, dsl.const(1.0, dtype),
                                                                   dsl.const(0.0, dtype)), name="bernoulli")


def _uniform(shape, dtype: str, ctx: Context, what: str):
    """``idx -> u``, a number in ``[0, 1)`` of ``dtype`` for each position ``idx`` of ``shape``:
    a hash of the flat position, the step's seed (``ctx.seed``) and the count of draws made
    in the step before this one (each draw a new salt)."""
    if ctx.seed is None:
        raise UserError(f"{what} needs the training step's seed (Context.seed)")
    salt = 7919 * (ctx.dropout_count + 1)
    ctx.dropout_count += 1
    seed = ctx.seed

    def u(idx):
        flat = dsl.const(0)
        for i, n in zip(idx, shape):
            flat = flat * n + i
        h = (flat * 1103515245 + seed[()] * 12345 + salt) % 2147483648
        h = (h * 1103515245 + 12345) % 2147483648
        h = (h * 69069 + 1) % 2147483648
        return dsl.cast(dtype, h) * (1.0 / 2147483648.0)
    return u


class Sequential(Module):
    """Layers applied in order; their parameters and states are named ``"{index}.{name}"``."""

    def __init__(self, *layers: Module):
        self.layers = list(layers)
        for k, layer in enumerate(self.layers):
            if not isinstance(layer, Module):
                raise UserError(f"Sequential: item {k} is not a layer: {layer!r}")
            layer.rename(f"{k}.")

    def parameters(self) -> List[Param]:
        return [p for layer in self.layers for p in layer.parameters() if p is not None]

    def states(self) -> List[State]:
        return [s for layer in self.layers for s in layer.states()]

    def forward(self, x, ctx):
        for layer in self.layers:
            x = layer(x, ctx)
        return x
