"""Operands copied in panels of one cache line (``codegen.packing``): each product built with
the copies and without them, side by side.

    python benchmarks/panels.py [--threads 1] [--rounds 30]
    python benchmarks/panels.py --threads 2 --no-torch
    python benchmarks/panels.py --models encoder resnet_small [--threads 1 2]

Without ``--models``: the products of a transformer's linear layers (``nn.dense`` over 1024
rows, 128 -> 512 and 512 -> 128, with both gradients; ``X @ W`` with ``W`` as it lies; a
``(batch, 64, 128) @ (128, 512)`` layer over a run-time batch, with both gradients) and a
ResNet-18 convolution of 2 x 2 images with 256 channels (with both gradients), each built
twice in this process, with the default thresholds and with no copy in panels, their calls
interleaved with PyTorch's same computation (medians of ``--rounds``). Printed: ms, the ratio
of the two builds, and each to PyTorch.

``--models``: :mod:`import_models`'s training steps built both ways, interleaved with eager
PyTorch's (:func:`jams.compare_models`).
"""
import argparse
import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import codegen  # noqa: E402
import te_grad as tg  # noqa: E402
from codegen.options import Thresholds  # noqa: E402
from jams import compare_models, interleaved  # noqa: E402

#: the default thresholds with no copy in panels
NO_PANELS = dataclasses.replace(Thresholds(), min_panel_stride=1 << 62, min_panel_bytes=1 << 62)


def built_with(thresholds):
    def build(make):
        with codegen.compile_options(disk_cache=False, jit_cache=0, thresholds=thresholds):
            return make()
    return build


VARIANTS = {"panels": built_with(Thresholds()), "none": built_with(NO_PANELS)}


def cases(batch):
    """``name: (outputs, inputs, feed, torch twin or None)``."""
    rng = np.random.default_rng(0)

    def arrays(ts, sizes=None):
        return [rng.standard_normal(tuple(sizes.get(id(d), d) if sizes else d for d in t.shape)).astype(np.float32)
                for t in ts]

    def with_grads(y, ins):
        head = tg.placeholder(y.shape, name="H")
        return [y] + tg.gradient(y, ins, head=head), list(ins) + [head]

    out = {}
    for m, k, n in ((1024, 128, 512), (1024, 512, 128)):
        x, w = tg.placeholder((m, k), name="X"), tg.placeholder((n, k), name="W")
        outs, ins = with_grads(tg.nn.dense(x, w), [x, w])
        out[f"dense {m}x{k} -> {n} + grads"] = (outs, ins, arrays(ins), "dense")
    x, w = tg.placeholder((1024, 128), name="X"), tg.placeholder((128, 512), name="W")
    r = tg.reduce_axis(128, "k")
    y = tg.compute((1024, 512), lambda i, j: tg.sum(x[i, r] * w[r, j], axis=r), name="Y")
    out["X @ W 1024x128 @ 128x512"] = ([y], [x, w], arrays([x, w]), "matmul")
    b = tg.var("batch", min=1)
    x, w = tg.placeholder((b, 64, 128), name="X"), tg.placeholder((128, 512), name="W")
    r = tg.reduce_axis(128, "k")
    y = tg.compute((b, 64, 512), lambda i, j, l: tg.sum(x[i, j, r] * w[r, l], axis=r), name="Y")
    outs, ins = with_grads(y, [x, w])
    out[f"(batch={batch}, 64, 128) @ W + grads"] = (outs, ins, arrays(ins, {id(b): batch}), "matmul")
    x, w = tg.placeholder((32, 256, 2, 2), name="X"), tg.placeholder((256, 256, 3, 3), name="W")
    outs, ins = with_grads(tg.nn.conv2d(x, w, padding=1), [x, w])
    out["conv 32x256x2x2, 3x3 + grads"] = (outs, ins, arrays(ins), "conv")
    return out


def torch_twin(kind, feed, grads):
    import torch
    ts = [torch.from_numpy(a) for a in feed]
    if not grads:
        return lambda: ts[0] @ ts[1]
    x, w, h = ts
    x.requires_grad_(True)
    w.requires_grad_(True)
    op = {"dense": lambda: x @ w.T, "matmul": lambda: x @ w,
          "conv": lambda: torch.nn.functional.conv2d(x, w, padding=1)}[kind]
    return lambda: torch.autograd.grad(op(), [x, w], h)


def products(args):
    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    for name, (outs, ins, feed, kind) in cases(16).items():
        kernels = {k: build(lambda: tg.build(outs, ins, threads=args.threads)) for k, build in VARIANTS.items()}
        got = {k: kern(*feed) for k, kern in kernels.items()}
        for a, c in zip(*[g if isinstance(g, tuple) else (g,) for g in got.values()]):
            np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-2)
        runs = {k: (lambda kern=kern: kern(*feed)) for k, kern in kernels.items()}
        if torch is not None and not args.no_torch:
            runs["torch"] = torch_twin(kind, feed, len(outs) > 1)
        med = interleaved(runs, args.rounds)
        line = f"{name:36s} panels {med['panels'] * 1e3:7.3f} ms  none {med['none'] * 1e3:7.3f} ms  " \
               f"panels / none {med['panels'] / med['none']:.3f}"
        if "torch" in med:
            line += f"  torch {med['torch'] * 1e3:7.3f} ms  panels / torch {med['panels'] / med['torch']:.2f}  " \
                    f"none / torch {med['none'] / med['torch']:.2f}"
        print(line, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--models", nargs="+", help="import_models.py's models to train both ways")
    ap.add_argument("--no-torch", action="store_true",
                    help="time te_grad's two builds alone (PyTorch's threads, spinning after each call, "
                         "take cores from te_grad's on a machine with no spare one)")
    args = ap.parse_args()
    for threads in args.threads:
        one = argparse.Namespace(**{**vars(args), "threads": threads})
        if args.models:
            compare_models(args.models, threads, args.rounds, VARIANTS)
        else:
            print(f"threads={threads}")
            products(one)


if __name__ == "__main__":
    main()
