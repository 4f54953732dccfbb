"""Random ``torch.nn.Module`` s through the PyTorch importer, every result against PyTorch's.

``python -m te_grad fuzz --torch --programs N --seed S`` generates ``N`` random small modules
(:func:`generate`: a DAG over one float input, and an int input of ids when an ``Embedding`` is
drawn, of the ops the importer translates: Linear, Conv2d, BatchNorm1d/2d (its running
statistics also read after the update), LayerNorm, GroupNorm, activations (among them
LeakyReLU, ELU, SELU, ReLU6, Hardtanh, Hardswish, Softplus and Mish past ``exp``'s overflow),
pools (adaptive max pooling among them, its windows overlapping), nearest and bilinear
upsampling (corners aligned or not, by factors of 2, 3, 1.5 and 0.5), broadcasting arithmetic
with tensors, parameters, scalars and masks converted to numbers (``(x > 0).to(dtype)``,
``.long()``, int32 counts, a 0-d count summed along dim 0), residual adds and clamps to a band
around another value, a number to a tensor's power, ``x.max()`` / ``x.min()`` of every element,
operands detached (``.detach()``, a ``torch.no_grad()`` block), parameters read only where
their gradient is zero (``0 * p.sum()``, ``x * (p > 0)``, ``zeros_like(p)``), softmax /
log_softmax, views, permutations, flips, rolls and repeats, a linear layer between views that
flatten its input's leading axes into rows and restore them, slices, advanced indexing by two
index tensors (some indices counted from the end), ``cat`` / ``chunk`` / ``split``, ``matmul``
/ ``bmm``, reductions (``max`` / ``min`` along a dimension, ``cumsum``, ``prod``, ``std``),
``cdist`` (p 1, 2, 3), ``scaled_dot_product_attention``), each in float32 or float64, with or
without a dynamic batch.
A module returns its last value, or (30% of them) a tuple of it and one or two other values,
among them perhaps a probe (a linear layer on detached features); the loss reads each output
with its gradient, under ``stop_gradient`` (PyTorch's ``.detach()``) or not at all
(:attr:`Spec.reads`). :func:`build_module` makes the module of a :class:`Spec`; the checks
against PyTorch are in :mod:`.torch_check`. Torch is imported here (lazily) and there only:
``te_grad`` and the program fuzzer never import it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

#: every family of constructs the generator draws (each must appear over a fuzz budget)
FAMILIES = ("linear", "conv2d", "batch_norm", "layer_norm", "activation", "pool", "arith", "residual",
            "softmax", "layout", "slice", "cat_split", "matmul", "reduce", "attention", "embedding", "outputs")


@dataclass
class Spec:
    """A random module: its inputs, nodes (``op``, argument value indices, attributes) and dtype."""
    seed: int
    dtype: str
    dynamic_batch: bool
    grad_training: bool
    batch: int
    input_shape: tuple
    ids: Optional[tuple] = None           # (length, vocabulary) of the int input, if any
    nodes: List[dict] = field(default_factory=list)
    shapes: List[tuple] = field(default_factory=list)  # of every value: inputs, then nodes
    #: the values ``forward`` returns (a tuple when several; the first is the last node), and
    #: how the loss reads each: ``grad`` (``sum(head * out)``), ``stop`` (the same under
    #: ``stop_gradient``, PyTorch's ``.detach()``) or ``none`` (not at all)
    outputs: List[int] = field(default_factory=list)
    reads: List[str] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"# seed {self.seed}: {self.dtype}, dynamic_batch={self.dynamic_batch}, gradients in "
                 f"{'training' if self.grad_training else 'evaluation'} mode",
                 f"v0 = x{list(self.input_shape)}"]
        first = 1
        if self.ids is not None:
            lines.append(f"v1 = ids[{self.batch}, {self.ids[0]}] < {self.ids[1]}")
            first = 2
        for k, node in enumerate(self.nodes):
            attrs = {a: b for a, b in node.items() if a not in ("op", "args", "family")}
            lines.append(f"v{first + k} = {node['op']}({', '.join(f'v{a}' for a in node['args'])}"
                         + (f", {attrs}" if attrs else "") + f")  # {list(self.shapes[first + k])}")
        lines.append("return " + ", ".join(f"v{v}" for v in self.outputs)
                     + f"  # the loss reads them: {', '.join(self.reads)}")
        return "\n".join(lines)


# -- generation ----------------------------------------------------------------------------------
def _numel(shape) -> int:
    return int(np.prod(shape[1:])) if len(shape) > 1 else 1


class _Gen:
    def __init__(self, rng: np.random.Generator, spec: Spec):
        self.rng, self.spec = rng, spec
        self.float_values = [0]

    def r(self, n: int) -> int:
        return int(self.rng.integers(0, n))

    def pick(self, seq):
        return seq[self.r(len(seq))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def value(self, rank=None, pred=None) -> Optional[int]:
        """A float value (recent ones preferred) of rank ``rank`` and satisfying ``pred``."""
        cands = [v for v in self.float_values if (rank is None or len(self.spec.shapes[v]) in
                                                    (rank if isinstance(rank, tuple) else (rank,)))
                 and (pred is None or pred(self.spec.shapes[v]))]
        if not cands:
            return None
        if self.chance(0.6):
            return cands[-1]
        return self.pick(cands)

    def add(self, family, op, args, shape, **attrs) -> bool:
        if any(s < 1 for s in shape) or _numel(shape) > 240:
            return False
        self.spec.nodes.append(dict(family=family, op=op, args=list(args), **attrs))
        self.spec.shapes.append(tuple(shape))
        self.float_values.append(len(self.spec.shapes) - 1)
        return True

    # each returns whether it added a node
    def linear(self):
        v = self.value((2, 3, 4))
        if v is None:
            return False
        s = self.spec.shapes[v]
        out = 1 + self.r(6)
        if len(s) >= 3 and self.chance(0.35):
            # as nn.MultiheadAttention's output projection: the leading axes (the batch second when
            # ``swap``) flattened into rows, the linear layer, the rows put back
            lead = 2 + self.r(len(s) - 2)
            return self.add("linear", "flat_linear", [v], s[:lead] + (out,), features=(int(np.prod(s[lead:])), out),
                            bias=self.chance(0.7), lead=lead, swap=self.chance(0.5))
        return self.add("linear", "linear", [v], s[:-1] + (out,), features=(s[-1], out), bias=self.chance(0.7))

    def conv2d(self):
        v = self.value(4)
        if v is None:
            return False
        _, c, h, w = self.spec.shapes[v]
        k = 1 + self.r(3)
        stride, dilation = 1 + self.r(2), 1 + self.r(2) if k > 1 else 1
        padding = self.r(k // 2 + 1) * dilation
        groups = self.pick([g for g in (1, 2, 3) if c % g == 0])
        out_c = groups * (1 + self.r(3))
        oh = (h + 2 * padding - dilation * (k - 1) - 1) // stride + 1
        ow = (w + 2 * padding - dilation * (k - 1) - 1) // stride + 1
        return self.add("conv2d", "conv2d", [v], (self.spec.batch, out_c, oh, ow), channels=(c, out_c),
                        kernel=k, stride=stride, padding=padding, dilation=dilation, groups=groups,
                        bias=self.chance(0.7))

    def batch_norm(self):
        v = self.value((2, 3, 4))
        if v is None:
            return False
        s = self.spec.shapes[v]
        if not self.add("batch_norm", "batch_norm2d" if len(s) == 4 else "batch_norm1d", [v], s,
                        channels=s[1], affine=self.chance(0.8), momentum=self.pick([0.1, 0.3, 1.0])):
            return False
        if self.chance(0.25):  # the layer's running statistic read after its update (a buffer: no gradient)
            self.add("batch_norm", "bn_stat", [self.float_values[-1]], s, layer=len(self.spec.nodes) - 1,
                     stat=self.pick(["running_mean", "running_var"]))
        return True

    def layer_norm(self):
        v = self.value((2, 3, 4))
        if v is None:
            return False
        s = self.spec.shapes[v]
        groups = [g for g in range(1, s[1] + 1) if s[1] % g == 0 and _numel(s) // g >= 2]
        if self.chance(0.3) and groups:  # GroupNorm over (N, C, ...): groups of channels and positions
            return self.add("layer_norm", "group_norm", [v], s, groups=self.pick(groups), channels=s[1],
                            affine=self.chance(0.7))
        k = 1 + self.r(min(2, len(s) - 1))
        if int(np.prod(s[-k:])) < 2:
            # over one element the output is the bias exactly, and PyTorch's fused kernel gives
            # rounding noise times 1/sqrt(eps) instead: nothing to compare
            return False
        return self.add("layer_norm", "layer_norm", [v], s, normalized=tuple(s[-k:]),
                        affine=self.chance(0.7), bias=self.chance(0.7))

    def activation(self):
        v = self.value()
        if v is None:
            return False
        fn = self.pick(["relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid", "leaky_relu", "elu", "selu",
                        "relu6", "hardtanh", "hardswish"])
        if fn == "silu" and self.chance(0.5):  # softplus and mish on inputs past exp's overflow too
            fn = self.pick(["softplus", "mish"])
        return self.add("activation", fn, [v], self.spec.shapes[v])

    def pool(self):
        v = self.value(4)
        if v is None:
            return False
        _, c, h, w = self.spec.shapes[v]
        kind = self.pick(["max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "upsample"])
        if kind == "upsample":  # nearest by a whole factor, or bilinear by a ratio of integers
            f = self.pick([2, 3])
            if self.chance(0.5):
                return self.add("pool", kind, [v], (self.spec.batch, c, f * h, f * w), factor=f, mode="nearest")
            f = self.pick([f, 0.5, 1.5] if min(h, w) >= 2 else [f, 1.5])
            return self.add("pool", kind, [v], (self.spec.batch, c, int(h * f), int(w * f)), factor=f,
                            mode="bilinear", align_corners=self.chance(0.5))
        if kind == "adaptive_avg_pool2d" and self.chance(0.5):  # max: its windows overlapping, of varying
            # size, where the output's extent does not divide the input's (3 of 4, 2 or 3 of 5)
            apart = [(o, w) for o in range(2, h) if h % o] + [(h, o) for o in range(2, w) if w % o]
            if apart and self.chance(0.7):
                size = self.pick(apart)
            else:
                size = self.pick([(1, 1), (h, 1), (1, w)] + ([(h // 2, w // 2)] if h % 2 == 0 == w % 2 else []))
            return self.add("pool", "adaptive_max_pool2d", [v], (self.spec.batch, c) + size, size=size)
        if kind == "adaptive_avg_pool2d":
            size = self.pick([(1, 1), (max(1, h // 2), max(1, w // 2)), (h, 1)])
            return self.add("pool", kind, [v], (self.spec.batch, c) + size, size=size)
        k = 1 + self.r(3)
        stride = 1 + self.r(k) if self.chance(0.7) else None
        padding = self.r(k // 2 + 1)
        st = stride or k
        oh, ow = (h + 2 * padding - k) // st + 1, (w + 2 * padding - k) // st + 1
        extra = {"count_include_pad": self.chance(0.5)} if kind == "avg_pool2d" else {}
        return self.add("pool", kind, [v], (self.spec.batch, c, oh, ow), kernel=k, stride=stride,
                        padding=padding, **extra)

    def arith(self):
        v = self.value()
        if v is None:
            return False
        s = self.spec.shapes[v]
        fn = self.pick(["add", "mul", "sub"])
        form = self.pick(["value", "value", "keepdim", "param", "scalar", "constant", "stop", "cut", "mask"])
        if form == "value":
            others = [u for u in self.float_values if u != v and self.spec.shapes[u] == s]
            if others:
                if fn == "sub" and self.chance(0.3):  # clamp to a band around another value (tensor bounds)
                    return self.add("residual", "clamp", [v, self.pick(others)], s)
                return self.add("residual", fn, [v, self.pick(others)], s)
            return self.add("arith", fn, [v, v], s)
        if form == "keepdim" and len(s) > 1:
            d = 1 + self.r(len(s) - 1)
            red = self.pick(["mean", "amax", "sum"])
            if red == "amax" and self.chance(0.4):  # x.max() / x.min() of every element, 0-d
                red = self.pick(["max", "min"])
            return self.add("arith", fn + "_keepdim", [v], s, dim=d, reduce=red)
        if form == "mask":  # a comparison converted to numbers in forward (.to(dtype), .long()), or
            # its int32 count along the last axis beside the 0-d count's sum along dim 0
            return self.add("arith", fn + "_mask", [v], s, how=self.pick(["to", "long", "count"]))
        if form == "stop":  # a detached operand: by .detach() or out of a torch.no_grad() block
            return self.add("arith", fn + "_stop", [v], s, how=self.pick(["detach", "no_grad"]))
        if form == "constant":  # a tensor made in forward, one per mode: torch.export lifts each program's
            values = [[float(self.pick([-1.0, 0.5, 2.0, 3.0])) for _ in range(s[-1])] for _ in range(2)]
            return self.add("arith", fn + "_constant", [v], s, train=values[0], eval=values[1])
        if form == "cut" and len(s) > 1:  # a parameter whose gradient is 0 (PyTorch: zeros, or None when cut)
            pshape = tuple(d if self.chance(0.7) else 1 for d in s[1:])
            return self.add("arith", "add_cut", [v], s, pshape=pshape, how=self.pick(["zero", "gate", "like"]))
        if form == "param" and len(s) > 1:
            k = 1 + self.r(len(s) - 1)
            pshape = tuple(d if self.chance(0.7) else 1 for d in s[-k:])
            return self.add("arith", fn + "_param", [v], s, pshape=pshape)
        scalar, left = float(self.pick([0.5, -1.5, 2.0, 3.25])), self.chance(0.5)
        if fn == "mul" and left and self.chance(0.3):  # a number to the tensor's power
            return self.add("arith", "pow_scalar", [v], s, scalar=abs(scalar))
        return self.add("arith", fn + "_scalar", [v], s, scalar=scalar, left=left)

    def softmax(self):
        v = self.value()
        if v is None:
            return False
        s = self.spec.shapes[v]
        d = self.r(len(s))
        return self.add("softmax", self.pick(["softmax", "log_softmax"]), [v], s,
                        dim=d - len(s) if self.chance(0.4) else d)

    def layout(self):
        v = self.value()
        if v is None:
            return False
        s = self.spec.shapes[v]
        rest = list(s[1:])
        kind = self.pick(["view", "reshape", "permute", "transpose", "flatten", "unsqueeze", "squeeze", "flip",
                          "repeat"])
        if kind == "flip" and rest and self.chance(0.4):  # roll: axes other than the batch, maybe one twice
            dims = [1 + self.r(len(rest)) for _ in range(1 + self.r(2))]
            shifts = [int(self.r(4 * s[d] + 1)) - 2 * s[d] for d in dims]
            dims = [d - len(s) if self.chance(0.3) else d for d in dims]
            return self.add("layout", "roll", [v], s, dims=tuple(dims), shifts=tuple(shifts))
        if kind == "flip":
            dims = self.rng.choice(len(s), 1 + self.r(len(s)), replace=False)
            return self.add("layout", kind, [v], s, dims=tuple(int(d) for d in dims))
        if kind == "repeat" and rest:
            repeats = (1,) + tuple(1 + self.r(2) for _ in rest)
            return self.add("layout", kind, [v], (s[0],) + tuple(n * r for n, r in zip(rest, repeats[1:])),
                            repeats=repeats)
        if kind in ("view", "reshape") and rest:
            n = int(np.prod(rest))
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            a = self.pick(divisors)
            new = [a, n // a] if self.chance(0.6) else [n]
            if self.chance(0.3) and len(new) == 2:
                new[self.r(2)] = -1
            shape = (s[0],) + tuple(n // a if x == -1 and i == 1 else (a if x == -1 else x)
                                    for i, x in enumerate(new))
            return self.add("layout", kind, [v], shape, shape_args=tuple(new))
        if kind in ("permute", "transpose") and len(rest) >= 2:
            if kind == "permute":
                perm = [int(p) + 1 for p in self.rng.permutation(len(rest))]
                return self.add("layout", kind, [v], (s[0],) + tuple(s[p] for p in perm), perm=tuple(perm))
            a, b = (int(x) + 1 for x in self.rng.choice(len(rest), 2, replace=False))
            shape = list(s)
            shape[a], shape[b] = shape[b], shape[a]
            return self.add("layout", kind, [v], tuple(shape), dims=(a - len(s) if self.chance(0.3) else a, b))
        if kind == "flatten" and len(rest) >= 2:
            start = 1 + self.r(len(rest) - 1)
            end = start + 1 + self.r(len(s) - start - 1)
            shape = s[:start] + (int(np.prod(s[start:end + 1])),) + s[end + 1:]
            return self.add("layout", kind, [v], shape, start=start, end=end)
        if kind == "squeeze":
            ones = [d for d in range(1, len(s)) if s[d] == 1]
            if ones:
                d = self.pick(ones)
                return self.add("layout", kind, [v], s[:d] + s[d + 1:], dim=d)
        if len(s) < 4:
            d = 1 + self.r(len(s))
            return self.add("layout", "unsqueeze", [v], s[:d] + (1,) + s[d:], dim=d)
        return False

    def slice(self):
        if self.chance(0.3) and self.index():
            return True
        v = self.value(pred=lambda s: len(s) > 1 and max(s[1:]) > 1)
        if v is None:
            return False
        s = self.spec.shapes[v]
        d = self.pick([d for d in range(1, len(s)) if s[d] > 1])
        n = s[d]
        start = self.r(n - 1)
        stop = start + 1 + self.r(n - start)
        step = 1 + self.r(2)
        length = len(range(start, stop, step))
        neg = self.chance(0.3)
        shape = s[:d] + (length,) + s[d + 1:]
        return self.add("slice", "slice", [v], shape, dim=d, start=start - n if neg else start,
                        stop=None if stop == n and self.chance(0.5) else stop, step=step)

    def index(self):
        """Advanced indexing of two adjacent non-batch axes by index tensors (``x[:, rows,
        cols]``, repeats among the indices, some counted from the end), zipped or broadcast
        (``rows[:, None]``, ``cols[None, :]``); the batch stays first."""
        v = self.value(pred=lambda s: len(s) > 2)
        if v is None:
            return False
        s = self.spec.shapes[v]
        a = 1 + self.r(len(s) - 2)
        k = 1 + self.r(3)
        neg = self.chance(0.3)  # indices counted from the end, some of them

        def pick(n):
            i = self.r(n)
            return i - n if neg and self.chance(0.5) else i
        rows = [pick(s[a]) for _ in range(k)]
        outer = self.chance(0.3)
        cols = [pick(s[a + 1]) for _ in range(1 + self.r(3) if outer else k)]
        shape = s[:a] + ((k, len(cols)) if outer else (k,)) + s[a + 2:]
        return self.add("slice", "index", [v], shape, dim=a, rows=rows, cols=cols, outer=outer)

    def cat_split(self):
        v = self.value(pred=lambda s: len(s) > 1)
        if v is None:
            return False
        s = self.spec.shapes[v]
        d = 1 + self.r(len(s) - 1)
        kind = self.pick(["cat", "chunk", "split", "split_sizes"])
        if kind == "cat":
            others = [u for u in self.float_values if len(self.spec.shapes[u]) == len(s) and all(
                a == b for i, (a, b) in enumerate(zip(self.spec.shapes[u], s)) if i != d)]
            u = self.pick(others)
            shape = s[:d] + (s[d] + self.spec.shapes[u][d],) + s[d + 1:]
            return self.add("cat_split", "cat", [v, u], shape, dim=d - len(s) if self.chance(0.3) else d)
        n = s[d]
        if n < 2:
            return False
        if kind == "chunk":
            parts = 2 + self.r(2)
            size = -(-n // parts)
            lengths = [min(size, n - a) for a in range(0, n, size)]
            arg = parts
        elif kind == "split":
            size = 1 + self.r(n - 1)
            lengths = [min(size, n - a) for a in range(0, n, size)]
            arg = size
        else:
            cut = 1 + self.r(n - 1)
            lengths = [cut, n - cut]
            arg = tuple(lengths)
        pick = self.r(len(lengths) + 1)  # len(lengths): all parts concatenated in reverse order
        shape = s if pick == len(lengths) else s[:d] + (lengths[pick],) + s[d + 1:]
        return self.add("cat_split", kind, [v], shape, dim=d, arg=arg, part=pick)

    def matmul(self):
        v = self.value((2, 3, 4))
        if v is None:
            return False
        s = self.spec.shapes[v]
        kind = self.pick(["matmul_t", "matmul_param", "bmm"])
        if kind == "bmm" and len(s) != 3:
            kind = "matmul_t"
        if kind == "matmul_param":
            out = 1 + self.r(5)
            return self.add("matmul", kind, [v], s[:-1] + (out,), pshape=(s[-1], out))
        if len(s) < 3:
            kind = "matmul_param"
            return self.add("matmul", kind, [v], s[:-1] + (3,), pshape=(s[-1], 3))
        others = [u for u in self.float_values if self.spec.shapes[u] == s]
        u = self.pick(others)
        return self.add("matmul", kind, [v, u], s[:-1] + (s[-2],))

    def reduce(self):
        v = self.value(pred=lambda s: len(s) > 1)
        if v is None:
            return False
        s = self.spec.shapes[v]
        if len(s) == 3 and self.chance(0.15):  # cdist of rows against some of the same rows (zero
            m = 1 + self.r(s[1])               # distances), or halved
            return self.add("reduce", "cdist", [v], s[:2] + (m,), start=self.r(s[1] - m + 1), rows=m,
                            p=self.pick([1, 2, 3]), scale=self.pick([1.0, 0.5]))
        k = 1 + self.r(len(s) - 1)
        dims = tuple(sorted(int(d) + 1 for d in self.rng.choice(len(s) - 1, k, replace=False)))
        keep = self.chance(0.4)
        op = self.pick(["mean", "sum", "amax", "max_dim", "min_dim", "cumsum", "prod", "std"])
        if op == "cumsum":
            return self.add("reduce", op, [v], s, dim=dims[0])
        if op in ("max_dim", "min_dim", "prod"):  # one dimension (max / min: the values, the gradient
            dims = dims[:1]                          # to the first extreme; prod: of factors near 1)
        shape = tuple(1 if d in dims else x for d, x in enumerate(s)) if keep else \
            tuple(x for d, x in enumerate(s) if d not in dims)
        return self.add("reduce", op, [v], shape, dims=dims, keepdim=keep)

    def attention(self):
        v = self.value((3, 4))
        if v is None:
            return False
        s = self.spec.shapes[v]
        others = [u for u in self.float_values if self.spec.shapes[u][:-1] == s[:-1]]
        u = self.pick(others)
        return self.add("attention", "sdpa", [v, u], s[:-1] + (self.spec.shapes[u][-1],), causal=self.chance(0.5),
                        features=s[-1])

    def extra_outputs(self) -> List[int]:
        """Values returned beside the last (in 30% of the modules): one or two of the values made,
        and with even chance a probe, a linear layer on detached features of one, as a
        second head (PyTorch gives its weight a gradient from its own output only)."""
        if len(self.float_values) < 2 or not self.chance(0.3):
            return []
        made = self.float_values[1:-1]
        v = self.value((2, 3, 4))
        if v is not None and self.chance(0.5):
            s, out = self.spec.shapes[v], 1 + self.r(4)
            if self.add("outputs", "probe", [v], s[:-1] + (out,), features=(s[-1], out), bias=self.chance(0.7)):
                made = made + [self.float_values[-1]]
        if not made:
            return []
        picked = [int(k) for k in self.rng.permutation(len(made))[:1 + self.r(2)]]
        return [made[k] for k in sorted(picked)]

    def embedding(self):
        if self.spec.ids is None:
            return False
        length, vocab = self.spec.ids
        dim = 1 + self.r(5)
        return self.add("embedding", "embedding", [1], (self.spec.batch, length, dim), vocab=vocab, dim=dim,
                        padding_idx=self.r(vocab) if self.chance(0.3) else None)


def generate(seed: int) -> Spec:
    """The random module spec of ``seed`` (reproducible)."""
    rng = np.random.default_rng(seed)
    batch = 2 + int(rng.integers(0, 2))
    rank = int(rng.integers(2, 5))
    shape = (batch,) + tuple(int(rng.integers(1, 5)) if d < rank - 2 or rank == 2 else int(rng.integers(3, 7))
                             for d in range(rank - 1))
    if rank == 3:
        shape = (batch, int(rng.integers(2, 5)), int(rng.integers(1, 6)))
    spec = Spec(seed=seed, dtype="float64" if rng.random() < 0.5 else "float32",
                dynamic_batch=bool(rng.random() < 0.6), grad_training=bool(rng.random() < 0.5), batch=batch,
                input_shape=shape)
    spec.shapes.append(shape)
    if rng.random() < 0.15:
        spec.ids = (int(rng.integers(1, 5)), int(rng.integers(2, 7)))
        spec.shapes.append((batch, spec.ids[0]))
    g = _Gen(rng, spec)
    if spec.ids is not None:
        g.embedding()
    ops = [g.linear, g.conv2d, g.batch_norm, g.layer_norm, g.activation, g.pool, g.arith, g.softmax, g.layout,
           g.slice, g.cat_split, g.matmul, g.reduce, g.attention]
    weights = np.array([3, 3, 2, 2, 3, 2, 4, 1, 3, 1, 2, 1, 1, 1], dtype=float)
    target = int(rng.integers(2, 9))
    tries = 0
    while len(spec.nodes) < target and tries < 60:
        tries += 1
        op = ops[int(rng.choice(len(ops), p=weights / weights.sum()))]
        op()
    if len(g.float_values) == 1:
        g.activation()
    main = g.float_values[-1]
    extras = g.extra_outputs()
    # every value reaches an output: the dangling ones join the main one through their means
    consumed = {a for n in spec.nodes for a in n["args"]}
    dangling = [v for v in g.float_values[1:] if v not in consumed and v != main and v not in extras]
    if dangling and g.add("join", "join", [main] + dangling, spec.shapes[main]):
        main = g.float_values[-1]
    # and one parameter at least
    if not any(n["op"] in _WITH_PARAMS or (n["op"] in ("batch_norm1d", "batch_norm2d") and n["affine"])
               or (n["op"] in ("layer_norm", "group_norm") and n["affine"]) for n in spec.nodes):
        if g.add("arith", "mul_param", [main], spec.shapes[main], pshape=(1,)):
            main = g.float_values[-1]
    spec.outputs = [main] + extras
    spec.reads = ["grad"] + [str(rng.choice(["grad", "stop", "none"], p=[0.45, 0.35, 0.2])) for _ in extras]
    if extras and rng.random() < 0.3:  # the last output under stop_gradient too (a teacher's logits)
        spec.reads[0] = "stop"
    return spec


_WITH_PARAMS = ("linear", "conv2d", "add_param", "mul_param", "sub_param", "matmul_param", "sdpa", "embedding")


# -- the module ----------------------------------------------------------------------------------
def build_module(spec: Spec):
    """The ``torch.nn.Module`` of ``spec`` (weights drawn from the spec's seed)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(spec.seed % (2 ** 31))

    class FuzzNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleDict()
            self.params = torch.nn.ParameterDict()
            for k, node in enumerate(spec.nodes):
                op, name = node["op"], f"n{k}"
                if op in ("linear", "flat_linear"):
                    self.layers[name] = torch.nn.Linear(*node["features"], bias=node["bias"])
                elif op == "conv2d":
                    self.layers[name] = torch.nn.Conv2d(*node["channels"], node["kernel"], stride=node["stride"],
                                                        padding=node["padding"], dilation=node["dilation"],
                                                        groups=node["groups"], bias=node["bias"])
                elif op in ("batch_norm1d", "batch_norm2d"):
                    cls = torch.nn.BatchNorm2d if op == "batch_norm2d" else torch.nn.BatchNorm1d
                    bn = cls(node["channels"], affine=node["affine"], momentum=node["momentum"])
                    with torch.no_grad():
                        bn.running_mean.uniform_(-0.5, 0.5)
                        bn.running_var.uniform_(0.5, 1.5)
                    self.layers[name] = _affine_drawn(bn, torch)
                elif op == "layer_norm":
                    self.layers[name] = _affine_drawn(torch.nn.LayerNorm(
                        node["normalized"], elementwise_affine=node["affine"], bias=node["bias"]), torch)
                elif op.endswith("_param") or op.endswith("_cut"):
                    self.params[name] = torch.nn.Parameter(torch.empty(node["pshape"]).uniform_(-1.0, 1.0))
                elif op == "sdpa":
                    self.layers[name] = torch.nn.Linear(node["features"], node["features"])
                elif op == "group_norm":
                    self.layers[name] = _affine_drawn(
                        torch.nn.GroupNorm(node["groups"], node["channels"], affine=node["affine"]), torch)
                elif op == "probe":
                    self.layers[name] = torch.nn.Linear(*node["features"], bias=node["bias"])
                elif op == "embedding":
                    self.layers[name] = torch.nn.Embedding(node["vocab"], node["dim"], padding_idx=node["padding_idx"])

        def forward(self, *inputs):
            vals = list(inputs)
            for k, node in enumerate(spec.nodes):
                vals.append(_apply(self, f"n{k}", node, [vals[a] for a in node["args"]], torch, F))
            outs = [vals[v] for v in spec.outputs] if spec.outputs else [vals[-1]]
            return outs[0] if len(outs) == 1 else tuple(outs)

    net = FuzzNet()
    return net.double() if spec.dtype == "float64" else net


def _affine_drawn(layer, torch):
    """``layer`` (a normalization) with its weight drawn in [0.5, 1.5] and its bias in
    [-0.5, 0.5], where it has them."""
    with torch.no_grad():
        if getattr(layer, "weight", None) is not None:
            layer.weight.uniform_(0.5, 1.5)
        if getattr(layer, "bias", None) is not None:
            layer.bias.uniform_(-0.5, 0.5)
    return layer


def _apply(net, name, node, args, torch, F):
    op, x = node["op"], args[0]
    if op == "group_norm":
        # PyTorch's own CPU backward of GroupNorm crashed the process (a segmentation fault in
        # NativeGroupNormBackward0, module 91000391: its input in a channels-last layout from a
        # transpose, its gradient contiguous): it gets its input contiguous
        return net.layers[name](x.contiguous())
    if op in ("batch_norm1d", "batch_norm2d"):
        y = net.layers[name](x)
        if y.requires_grad and not torch.compiler.is_compiling():
            # PyTorch's CPU backward of batch norm reads a gradient laid out channels-last
            # (strides (8, 1, 4, 1) for a (3, 4, 2, 1) tensor, which a unit extent makes
            # contiguous in both layouts) as if it were laid out as its input, and gives wrong
            # gradients (module 95000313: the gradient of a query of scaled_dot_product_attention
            # read from batch norm's output, its weight's gradient off by 0.6, PyTorch's own
            # finite differences agreeing with te_grad's): the gradient goes back contiguous
            y.register_hook(lambda g: g.contiguous())
        return y
    if op in ("linear", "conv2d", "layer_norm", "embedding"):
        return net.layers[name](x)
    if op == "probe":
        return net.layers[name](x.detach())
    if op == "bn_stat":
        stat = getattr(net.layers[f"n{node['layer']}"], node["stat"])
        return x + stat.reshape((1, -1) + (1,) * (x.ndim - 2))
    acts = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"), "silu": F.silu,
            "tanh": torch.tanh, "sigmoid": torch.sigmoid, "leaky_relu": lambda v: F.leaky_relu(v, 0.2),
            "elu": lambda v: F.elu(v, 0.7), "selu": F.selu, "relu6": lambda v: F.relu6(v * 8),
            "hardtanh": lambda v: F.hardtanh(v, -0.5, 0.4), "hardswish": lambda v: F.hardswish(v * 4),
            "softplus": lambda v: F.softplus(v * 400) + F.softplus(v, 2.0, 1.0),
            "mish": lambda v: F.mish(v * 400)}
    if op in acts:
        return acts[op](x)
    if op == "flat_linear":
        lead = node["lead"]
        x = x.transpose(0, 1) if node["swap"] else x
        y = net.layers[name](x.reshape(-1, node["features"][0])).view(*x.shape[:lead], -1)
        return y.transpose(0, 1) if node["swap"] else y
    if op == "max_pool2d":
        return F.max_pool2d(x, node["kernel"], node["stride"], node["padding"])
    if op == "avg_pool2d":
        return F.avg_pool2d(x, node["kernel"], node["stride"], node["padding"],
                            count_include_pad=node["count_include_pad"])
    if op == "adaptive_avg_pool2d":
        return F.adaptive_avg_pool2d(x, node["size"])
    if op == "adaptive_max_pool2d":
        return F.adaptive_max_pool2d(x, node["size"])
    if op == "matmul_param":
        return torch.matmul(x, net.params[name])
    if op == "join":
        for u in args[1:]:
            m = u.reshape(u.shape[0], -1).mean(1) if u.ndim > 1 else u
            x = x + m.reshape((u.shape[0],) + (1,) * (x.ndim - 1))
        return x
    binops = {"add": torch.add, "mul": torch.mul, "sub": torch.sub}
    base = op.split("_")[0]
    if op in binops:
        return binops[op](x, args[1])
    if op == "clamp":
        return torch.clamp(x, args[1] - 0.25, args[1] + 0.25)
    if op == "pow_scalar":
        return node["scalar"] ** x
    if op.endswith("_keepdim"):
        red = getattr(x, node["reduce"])() if node["reduce"] in ("max", "min") else \
            getattr(x, node["reduce"])(node["dim"], keepdim=True)
        return binops[base](x, red)
    if op.endswith("_param"):
        return binops[base](x, net.params[name])
    if op.endswith("_cut"):  # 0 * p: PyTorch's grad of p is zeros (weight decay moves p); p > 0 and
        p = net.params[name]  # zeros_like(p) cut p off the loss (its grad None: p stays)
        return {"zero": lambda: x + 0 * p.sum(), "gate": lambda: x * (p > 0),
                "like": lambda: x + torch.zeros_like(p)}[node["how"]]()
    if op.endswith("_mask"):
        mask = x > 0
        if node["how"] == "count":
            count = mask.int().sum(-1, keepdim=True) + mask.int().sum().sum(0)
            return binops[base](x, count.to(x.dtype))
        return binops[base](x, mask.to(x.dtype) if node["how"] == "to" else mask.long().to(x.dtype))
    if op.endswith("_stop"):
        if node["how"] == "detach":
            return binops[base](x, torch.sigmoid(x).detach())
        with torch.no_grad():
            other = torch.sigmoid(x) * 1.5
        return binops[base](x, other)
    if op.endswith("_constant"):
        return binops[base](x, torch.tensor(node["train" if net.training else "eval"], dtype=x.dtype))
    if op.endswith("_scalar"):
        c = node["scalar"]
        if node["left"]:
            return {"add": lambda: c + x, "mul": lambda: c * x, "sub": lambda: c - x}[base]()
        return binops[base](x, c)
    if op in ("softmax", "log_softmax"):
        return getattr(F, op)(x, dim=node["dim"])
    if op in ("view", "reshape"):
        if op == "view" and not x.is_contiguous():  # a view needs a contiguous tensor (as users write it)
            x = x.contiguous()
        return getattr(x, op)(x.shape[0], *node["shape_args"])
    if op == "permute":
        return x.permute(0, *node["perm"])
    if op == "transpose":
        return x.transpose(*node["dims"])
    if op == "flatten":
        return torch.flatten(x, node["start"], node["end"])
    if op == "unsqueeze":
        return x.unsqueeze(node["dim"])
    if op == "squeeze":
        return x.squeeze(node["dim"])
    if op == "index":
        rows, cols = torch.tensor(node["rows"]), torch.tensor(node["cols"])
        if node["outer"]:
            rows, cols = rows[:, None], cols[None, :]
        return x[(slice(None),) * node["dim"] + (rows, cols)]
    if op == "slice":
        return x[(slice(None),) * node["dim"] + (slice(node["start"], node["stop"], node["step"]),)]
    if op == "cat":
        return torch.cat([x, args[1]], dim=node["dim"])
    if op in ("chunk", "split", "split_sizes"):
        d = node["dim"]
        parts = torch.chunk(x, node["arg"], dim=d) if op == "chunk" else \
            torch.split(x, list(node["arg"]) if op == "split_sizes" else node["arg"], dim=d)
        return torch.cat(parts[::-1], dim=d) if node["part"] == len(parts) else parts[node["part"]]
    if op == "matmul_t":
        return torch.matmul(x, args[1].transpose(-1, -2))
    if op == "bmm":
        return torch.bmm(x, args[1].transpose(1, 2))
    if op in ("mean", "sum", "amax"):
        return getattr(torch, op)(x, dim=node["dims"], keepdim=node["keepdim"])
    if op == "std":  # over one element, the population's (Bessel's divides by 0)
        one = all(x.shape[d] == 1 for d in node["dims"])
        return torch.std(x, dim=node["dims"], keepdim=node["keepdim"], correction=0 if one else 1)
    if op in ("max_dim", "min_dim"):
        return getattr(torch, op[:3])(x, dim=node["dims"][0], keepdim=node["keepdim"]).values
    if op == "cumsum":
        return torch.cumsum(x, node["dim"])
    if op == "prod":
        return torch.prod(torch.tanh(x) * 0.5 + 1.0, node["dims"][0], keepdim=node["keepdim"])
    if op == "cdist":
        return torch.cdist(x, x[:, node["start"]:node["start"] + node["rows"]] * node["scale"], p=node["p"])
    if op == "flip":
        return torch.flip(x, node["dims"])
    if op == "repeat":
        return x.repeat(*node["repeats"])
    if op == "roll":
        return torch.roll(x, node["shifts"], node["dims"])
    if op == "upsample":
        if node["mode"] == "nearest":
            return F.interpolate(x, scale_factor=node["factor"], mode="nearest")
        return F.interpolate(x, scale_factor=node["factor"], mode="bilinear", align_corners=node["align_corners"])
    if op == "sdpa":
        return F.scaled_dot_product_attention(x, net.layers[name](x), args[1], is_causal=node["causal"])
    raise AssertionError(op)
