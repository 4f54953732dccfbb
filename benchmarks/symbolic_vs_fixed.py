"""Symbolic kernels (one kernel for every batch size, tg.var) against fixed-shape kernels.

    python benchmarks/symbolic_vs_fixed.py [--threads 2] [--time 0.3]

For dense (matmul, and matmul + bias), conv1d, conv2d, softmax over rows and layer norm,
forward and backward (the gradients of every float input for a random head), at 3 batch
sizes each: the same graph built once with the batch a size variable
(``n = tg.var("n", min=1)``) and once per size with the batch an int. Prints the median
ms of each and the ratio symbolic / fixed, after checking that both kernels agree.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import te_grad as tg  # noqa: E402
from te_grad.tools.benchmark import Timer, pin_threads  # noqa: E402


def dense(n):
    X, W = tg.placeholder((n, 256), name="X"), tg.placeholder((256, 256), name="W")
    k = tg.reduce_axis(256, "k")
    return [tg.compute((n, 256), lambda i, j: tg.sum(X[i, k] * W[k, j], axis=k), name="Y")], [X, W]


def dense_bias(n):
    X, W, B = tg.placeholder((n, 256), name="X"), tg.placeholder((256, 256), name="W"), tg.placeholder((256,), name="B")
    k = tg.reduce_axis(256, "k")
    return [tg.compute((n, 256), lambda i, j: tg.sum(X[i, k] * W[k, j], axis=k) + B[j], name="Y")], [X, W, B]


def conv1d(n):
    X, W = tg.placeholder((n, 16, 128), name="X"), tg.placeholder((32, 16, 5), name="W")
    c, r = tg.reduce_axis(16, "c"), tg.reduce_axis(5, "r")
    Y = tg.compute((n, 32, 124), lambda b, o, t: tg.sum(X[b, c, t + r] * W[o, c, r], axis=[c, r]), name="Y")
    return [Y], [X, W]


def conv2d(n):
    X, W = tg.placeholder((n, 8, 32, 32), name="X"), tg.placeholder((16, 8, 3, 3), name="W")
    c, p, q = tg.reduce_axis(8, "c"), tg.reduce_axis(3, "p"), tg.reduce_axis(3, "q")
    Y = tg.compute((n, 16, 30, 30), lambda b, o, y, x: tg.sum(X[b, c, y + p, x + q] * W[o, c, p, q],
                                                             axis=[c, p, q]), name="Y")
    return [Y], [X, W]


def softmax(n):
    X = tg.placeholder((n, 512), name="X")
    r, s = tg.reduce_axis(512, "r"), tg.reduce_axis(512, "s")
    M = tg.compute((n,), lambda i: tg.max(X[i, r], axis=r), name="M")
    E = tg.compute((n, 512), lambda i, j: tg.exp(X[i, j] - M[i]), name="E")
    S = tg.compute((n,), lambda i: tg.sum(E[i, s], axis=s), name="S")
    return [tg.compute((n, 512), lambda i, j: E[i, j] / S[i], name="Y")], [X]


def layer_norm(n):
    X = tg.placeholder((n, 512), name="X")
    G, B = tg.placeholder((512,), name="G"), tg.placeholder((512,), name="B")
    r, s = tg.reduce_axis(512, "r"), tg.reduce_axis(512, "s")
    mean = tg.compute((n,), lambda i: tg.sum(X[i, r], axis=r) / 512.0, name="mean")
    var = tg.compute((n,), lambda i: tg.sum((X[i, s] - mean[i]) * (X[i, s] - mean[i]), axis=s) / 512.0,
                     name="var")
    Y = tg.compute((n, 512), lambda i, j: (X[i, j] - mean[i]) / tg.sqrt(var[i] + 1e-5) * G[j] + B[j], name="Y")
    return [Y], [X, G, B]


OPS = {"dense": (dense, (16, 64, 256)), "dense_bias": (dense_bias, (16, 64, 256)), "conv1d": (conv1d, (4, 16, 64)), "conv2d": (conv2d, (2, 8, 32)),
       "softmax": (softmax, (16, 128, 1024)), "layer_norm": (layer_norm, (16, 128, 1024))}


def kernels(make, batch, threads):
    """(forward kernel, backward kernel, inputs, head placeholder) of ``make(batch)``."""
    outs, inputs = make(batch)
    y = outs[0]
    head = tg.placeholder(y.shape, name="H")
    grads = tg.gradient(y, inputs, head=head)
    return (tg.build(outs, inputs, threads=threads), tg.build(grads, inputs + [head], threads=threads),
            inputs, head)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--time", type=float, default=0.3, help="seconds of timing per kernel")
    ap.add_argument("--ops", default=",".join(OPS))
    args = ap.parse_args()
    pin_threads(args.threads)
    timer = Timer(warmup=2, min_runs=5, min_time=args.time)
    rng = np.random.default_rng(0)
    print(f"{'op':<11}{'pass':<5}{'batch':>6}{'fixed ms':>11}{'symbolic ms':>13}{'ratio':>8}")
    for name in args.ops.split(","):
        make, batches = OPS[name]
        n = tg.var("n", min=1)
        sym_fwd, sym_bwd, sym_inputs, _ = kernels(make, n, args.threads)
        for batch in batches:
            fix_fwd, fix_bwd, inputs, head = kernels(make, batch, args.threads)
            arrays = [rng.standard_normal(t.shape).astype("float32") for t in inputs]
            h = rng.standard_normal(head.shape).astype("float32")
            for what, fixed, sym, args_ in (("fwd", fix_fwd, sym_fwd, arrays), ("bwd", fix_bwd, sym_bwd, arrays + [h])):
                a, b = fixed(*args_), sym(*args_)
                for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
                    np.testing.assert_allclose(y, x, rtol=2e-3, atol=2e-3 * max(1.0, float(np.abs(x).max())))
                got = timer({"fixed": lambda: fixed(*args_), "symbolic": lambda: sym(*args_)})
                f, s = got["fixed"]["ms"], got["symbolic"]["ms"]
                print(f"{name:<11}{what:<5}{batch:>6}{f:>11.3f}{s:>13.3f}{s / f:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
