"""Elementwise intrinsics against PyTorch eager: ``python benchmarks/intrinsics.py [--threads 1 2] [--quick]
[--dtype float64]``.

Each intrinsic applied to a 1M-element float32 (or ``--dtype`` float64) tensor: the forward alone, and forward plus
backward (one te_grad kernel computing ``y`` and ``dx`` from ``x`` and the head; PyTorch's
recorded forward and ``autograd.grad``), at each thread count; then ``nn.gelu`` (exact)
against ``F.gelu``. Prints milliseconds (the best of several repetitions) and the ratio
te_grad / PyTorch (below 1: te_grad is faster).
"""
import argparse
import sys
import time

import numpy as np

import te_grad as tg

N = 1 << 20

# name: (te_grad expression of the inputs, torch function, input ranges)
CASES = {
    "exp": (lambda x: tg.exp(x), "exp", [(-10, 10)]),
    "tanh": (lambda x: tg.tanh(x), "tanh", [(-5, 5)]),
    "erf": (lambda x: tg.erf(x), "erf", [(-4, 4)]),
    "log": (lambda x: tg.log(x), "log", [(1e-3, 1e3)]),
    "sin": (lambda x: tg.sin(x), "sin", [(-100, 100)]),
    "cos": (lambda x: tg.cos(x), "cos", [(-100, 100)]),
    "log1p": (lambda x: tg.log1p(x), "log1p", [(-0.9, 100)]),
    "expm1": (lambda x: tg.expm1(x), "expm1", [(-10, 10)]),
    "atan": (lambda x: tg.atan(x), "atan", [(-100, 100)]),
    "asin": (lambda x: tg.asin(x), "asin", [(-0.99, 0.99)]),
    "acos": (lambda x: tg.acos(x), "acos", [(-0.99, 0.99)]),
    "atan2": (lambda y, x: tg.atan2(y, x), "atan2", [(-10, 10), (-10, 10)]),
    "pow": (lambda x, y: x ** y, "pow", [(0.1, 10), (-3, 3)]),
}


def best(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def te_calls(expr, arrays, threads):
    dtype = str(arrays[0].dtype)
    xs = [tg.placeholder((N,), dtype=dtype, name=f"x{k}") for k in range(len(arrays))]
    y = tg.compute((N,), lambda i: expr(*[x[i] for x in xs]), name="y")
    head = tg.placeholder((N,), dtype=dtype, name="head")
    grads = tg.gradient(y, xs, head=head)
    fwd = tg.build([y], xs, threads=threads)
    step = tg.build([y] + list(grads), xs + [head], threads=threads)
    h = np.ones(N, dtype)
    return (lambda: fwd(*arrays)), (lambda: step(*arrays, h))


def torch_calls(torch, fn, arrays):
    xs = [torch.from_numpy(a).requires_grad_() for a in arrays]
    h = torch.ones(N, dtype=xs[0].dtype)

    def fwd():
        with torch.no_grad():
            return fn(*xs)

    def step():
        y = fn(*xs)
        return torch.autograd.grad(y, xs, h)
    return fwd, step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--ops", nargs="*", default=None, help=f"a subset of {', '.join(CASES)} gelu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = parser.parse_args(argv)
    import torch
    import torch.nn.functional as F
    reps = 3 if args.quick else 15
    rng = np.random.default_rng(0)
    names = args.ops or list(CASES) + ["gelu"]
    print(f"{'op':8} {'thr':>3} {'fwd ms':>8} {'torch':>8} {'ratio':>6} {'f+b ms':>8} {'torch':>8} {'ratio':>6}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name in names:
            if name == "gelu":
                x = rng.uniform(-5, 5, N).astype(args.dtype)
                X = tg.placeholder((N,), dtype=args.dtype, name="x")
                y = tg.nn.gelu(X)
                head = tg.placeholder((N,), dtype=args.dtype, name="head")
                (gx,) = tg.gradient(y, [X], head=head)
                fwd_k = tg.build([y], [X], threads=threads)
                step_k = tg.build([y, gx], [X, head], threads=threads)
                h = np.ones(N, args.dtype)
                te = (lambda: fwd_k(x)), (lambda: step_k(x, h))
                pt = torch_calls(torch, lambda v: F.gelu(v), [x])
            else:
                expr, tname, ranges = CASES[name]
                arrays = [rng.uniform(lo, hi, N).astype(args.dtype) for lo, hi in ranges]
                te = te_calls(expr, arrays, threads)
                pt = torch_calls(torch, getattr(torch, tname), arrays)
            f_te, f_pt = best(te[0], reps), best(pt[0], reps)
            s_te, s_pt = best(te[1], reps), best(pt[1], reps)
            print(f"{name:8} {threads:3d} {f_te:8.3f} {f_pt:8.3f} {f_te / f_pt:6.2f} "
                  f"{s_te:8.3f} {s_pt:8.3f} {s_te / s_pt:6.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
