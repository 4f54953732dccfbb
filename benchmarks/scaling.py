"""How time grows with size, next to PyTorch: where the crossovers are.

    python benchmarks/scaling.py [--threads 2] [--quick] [--ops dense conv softmax]

Three families, each from small to large: a square dense layer (``nn.dense``,
64 to 2048), a 3x3 convolution (32 channels, 32x32 images, batch 1 to 32) and a
softmax over 1000 columns (256 to 16384 rows). For each size te_grad's forward
and backward (all float gradients in one kernel) are timed next to PyTorch eager
(forward under ``no_grad``, backward ``autograd.grad`` on a retained graph) in
one process at the same thread count, with GFLOP/s for the contractions (and
their share of the machine's practical GEMM rate, measured first: the fastest of
PyTorch's and JAX's (XLA's) matrix products on 2048 x 2048 at the same thread count)
and the ratios te_grad / PyTorch (< 1: te_grad faster).
"""
import math

import numpy as np

import te_grad as tg
from te_grad import nn
from te_grad.tools.benchmark import Timer, cpu_name, script_options


def dense(n):
    x, w = tg.placeholder((n, n), name="X"), tg.placeholder((n, n), name="W")
    return nn.dense(x, w), [x, w], 2.0 * n ** 3, lambda torch, a, b: torch.nn.functional.linear(a, b)


def conv(batch):
    x, w = tg.placeholder((batch, 32, 32, 32), name="X"), tg.placeholder((32, 32, 3, 3), name="W")
    flops = 2.0 * batch * 32 * 32 * 32 * 32 * 9
    return nn.conv2d(x, w, padding=1), [x, w], flops, \
        lambda torch, a, b: torch.nn.functional.conv2d(a, b, padding=1)


def softmax(rows):
    x = tg.placeholder((rows, 1000), name="X")
    return nn.softmax(x), [x], None, lambda torch, a: torch.softmax(a, -1)


FAMILIES = {
    "dense": (dense, [64, 128, 256, 512, 1024, 2048]),
    "conv": (conv, [1, 2, 4, 8, 16, 32]),
    "softmax": (softmax, [256, 1024, 4096, 16384]),
}


def measure(build, size, threads, timer, torch):
    y, xs, flops, torch_fn = build(size)
    head = tg.placeholder(y.shape, name="H")
    fwd = tg.build([y], xs, threads=threads)
    bwd = tg.build(tg.gradient(y, xs, head=head), xs + [head], threads=threads)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(x.shape).astype(np.float32) for x in xs]
    h = rng.standard_normal(y.shape).astype(np.float32)
    fns = {"tg_fwd": lambda: fwd(*arrays), "tg_bwd": lambda: bwd(*arrays, h)}
    if torch is not None:
        ts = [torch.from_numpy(a.copy()).requires_grad_() for a in arrays]
        out = torch_fn(torch, *ts)
        np.testing.assert_allclose(fwd(*arrays), out.detach().numpy(), rtol=2e-3, atol=2e-3)
        th = torch.from_numpy(h)

        def torch_fwd():
            with torch.no_grad():
                return torch_fn(torch, *ts)
        fns["pt_fwd"] = torch_fwd
        fns["pt_bwd"] = lambda: torch.autograd.grad(out, ts, th, retain_graph=True)
    times = {k: v["ms"] for k, v in timer(fns).items()}
    times["flops"] = flops
    return times


def gemm_rate(torch, timer, n=2048):
    """The machine's practical single-precision GEMM rate at this thread count, GFLOP/s, and
    what measured it: the fastest of PyTorch's ``mm`` and ``linear`` (its BLAS, at
    ``torch.set_num_threads``) and ``jax.jit`` of ``@`` (XLA, on the CPUs the process is
    pinned to) on n x n matrices, or numpy's ``@`` without either (its BLAS picks its own
    thread count). Vendor libraries differ by machine: on an AMD EPYC PyTorch's ran at
    108 GFLOP/s on one core where XLA's ran at 240."""
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    fns = {}
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        fns.update({"torch.mm": lambda: torch.mm(ta, tb), "torch's linear": lambda: torch.nn.functional.linear(ta, tb)})
    try:
        import jax
        ja, jb = jax.device_put(a), jax.device_put(b)
        product = jax.jit(lambda x, y: x @ y)
        product(ja, jb).block_until_ready()
        fns["jax.jit @"] = lambda: product(ja, jb).block_until_ready()
    except ImportError:
        pass
    if not fns:
        fns = {"numpy @, its own thread count": lambda: a @ b}
    times = {k: v["ms"] for k, v in timer(fns).items()}
    best = min(times, key=times.get)
    rates = ", ".join(f"{k} {2.0 * n ** 3 / ms / 1e6:.0f}" for k, ms in times.items())
    return 2.0 * n ** 3 / times[best] / 1e6, f"{best}, the fastest of: {rates}"


def main(argv=None):
    args, torch, timer = script_options(argv, __doc__.split("\n\n")[0], FAMILIES, Timer(2, 7, 1.0))
    rate, what = gemm_rate(torch, timer)
    print(f"# scaling, {args.threads} threads, {cpu_name()}; times in ms, GFLOP/s of the forward")
    print(f"# practical GEMM rate: {rate:.0f} GFLOP/s ({what}, 2048 x 2048 float32); "
          "'of GEMM' = te_grad's forward rate / that")
    print(f"{'op':8s} {'size':>6s} {'tg fwd':>9s} {'tg bwd':>9s} {'pt fwd':>9s} {'pt bwd':>9s} "
          f"{'tg/pt f':>7s} {'tg/pt b':>7s} {'tg GF/s':>7s} {'pt GF/s':>7s} {'of GEMM':>7s}")
    for name, (build, sizes) in FAMILIES.items():
        if args.ops and name not in args.ops:
            continue
        for size in sizes:
            r = measure(build, size, args.threads, timer, torch)
            pf, pb = r.get("pt_fwd", math.nan), r.get("pt_bwd", math.nan)
            gf = r["flops"] / r["tg_fwd"] / 1e6 if r["flops"] else math.nan
            pgf = r["flops"] / pf / 1e6 if r["flops"] else math.nan
            print(f"{name:8s} {size:6d} {r['tg_fwd']:9.3f} {r['tg_bwd']:9.3f} {pf:9.3f} {pb:9.3f} "
                  f"{r['tg_fwd'] / pf:7.2f} {r['tg_bwd'] / pb:7.2f} {gf:7.1f} {pgf:7.1f} "
                  f"{gf / rate:7.0%}", flush=True)


if __name__ == "__main__":
    main()
