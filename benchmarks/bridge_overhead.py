"""The fixed cost of a te_grad op called from PyTorch: a tiny op against its PyTorch twin.

    python benchmarks/bridge_overhead.py [--threads 1] [--size 4] [--quick]

The op is ``y = x * w`` on ``size``-element float32 tensors that require gradients,
registered with ``te_grad.torch.custom_op``; its twin is ``torch.mul(x, w)``. Both are timed
in one process, at the same thread count, in interleaved rounds (medians,
te_grad.tools.benchmark.Timer):

- ``fwd``: the call, with autograd recording (the inputs require gradients);
- ``fwd no_grad``: the call under ``torch.no_grad()``;
- ``fwd+bwd``: the call and ``torch.autograd.grad`` of both inputs.

At this size the kernels do nearly nothing: what is timed is the bridge (argument checks,
the op's cache lookup, the kernel call, the autograd node), against PyTorch's own dispatch
and autograd. The ratios are te_grad / PyTorch.
"""
import argparse

import torch

import te_grad as tg
import te_grad.torch as tgt
from te_grad.tools.benchmark import Timer, cpu_name, pin_threads


def _mul(x, w):
    return tg.compute(x.shape, lambda *i: x[i] * w[i], name="y")


def measure(size: int, threads: int, timer: Timer) -> dict:
    """Median microseconds of each of the three calls, for the te_grad op and for torch.mul."""
    op = tgt.custom_op(f"te_grad_bench_overhead::mul_{size}", _mul, threads=threads)
    x = torch.randn(size, requires_grad=True)
    w = torch.randn(size, requires_grad=True)
    h = torch.randn(size)
    got = torch.autograd.grad(op(x, w), (x, w), h)
    want = torch.autograd.grad(torch.mul(x, w), (x, w), h)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)

    def no_grad(fn):
        def run():
            with torch.no_grad():
                fn(x, w)
        return run

    times = timer({
        "tg fwd": lambda: op(x, w),
        "torch fwd": lambda: torch.mul(x, w),
        "tg fwd no_grad": no_grad(op),
        "torch fwd no_grad": no_grad(torch.mul),
        "tg fwd+bwd": lambda: torch.autograd.grad(op(x, w), (x, w), h),
        "torch fwd+bwd": lambda: torch.autograd.grad(torch.mul(x, w), (x, w), h),
    })
    return {k: v["ms"] * 1e3 for k, v in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="threads for te_grad and PyTorch")
    parser.add_argument("--size", type=int, default=4, help="elements of the op's tensors")
    parser.add_argument("--quick", action="store_true", help="a smoke run: short rounds")
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    torch.set_num_threads(args.threads)
    timer = Timer(200, 200, 0.2) if args.quick else Timer(2000, 2000, 3.0)
    print(f"# a {args.size}-element te_grad op (y = x * w) vs torch.mul, PyTorch {torch.__version__}, "
          f"{args.threads} thread(s), {cpu_name()}")
    t = measure(args.size, args.threads, timer)
    print(f"{'call':14s} {'te_grad us':>11s} {'torch us':>9s} {'ratio':>6s}")
    for call in ("fwd", "fwd no_grad", "fwd+bwd"):
        tg_us, torch_us = t[f"tg {call}"], t[f"torch {call}"]
        print(f"{call:14s} {tg_us:11.1f} {torch_us:9.1f} {tg_us / torch_us:6.2f}", flush=True)


if __name__ == "__main__":
    main()
