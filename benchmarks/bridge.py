"""te_grad ops inside PyTorch: the bridge's cost, and the backward pass from saved residuals.

    python benchmarks/bridge.py [--threads 2] [--ops softmax,layer_norm,...] [--quick]

For every op of the reference suite, in one process, at the same thread count:

- ``torch fwd+bwd``: PyTorch's own op, forward and ``autograd.grad``;
- ``tg op fwd+bwd``: the same op written in te_grad, registered with
  ``te_grad.torch.custom_op``, called from PyTorch the same way;
- ``torch bwd``: PyTorch's backward alone (``autograd.grad`` on a retained graph);
- ``tg bwd (residuals)``: te_grad's backward kernel from the residuals its forward saved
  (``tg.build_vjp``, default policy), and ``tg bwd (recompute)`` with ``save=[]``.

It prints the ratios and the geometric means, the per-call overhead of the bridge (a
one-element op: te_grad custom op vs ``torch.mul``) and a 4-element op's forward and
forward+backward against ``torch.mul``'s (:mod:`bridge_overhead`). Timings are medians of interleaved
runs (te_grad.tools.benchmark.Timer).
"""
import argparse
import math
import time

import numpy as np
import torch

import te_grad as tg
import te_grad.torch as tgt
from te_grad.tools.benchmark import Timer, cpu_name, pin_threads, torch_table
from te_grad.suite import SUITE, workload
from bridge_overhead import measure as tiny_op


def _suite_fn(name):
    """The te_grad function of suite op ``name`` taking placeholders (floats then data)."""
    def fn(*phs):
        w = workload(name)
        mapping = dict(zip(w.inputs + list(w.data), phs))
        from te_grad.transform import replace_tensors
        new = replace_tensors([w.output], {id(k): v for k, v in mapping.items()})
        return new[id(w.output)]
    w = workload(name)
    names = [t.name for t in w.inputs + list(w.data)]
    params = ", ".join(names)
    namespace = {"fn": fn}
    exec(f"def op({params}):\n    return fn({params})\n", namespace)  # noqa: S102 - a signature with names
    return namespace["op"]


def measure(name, threads, timer):
    w = workload(name)
    rng = np.random.default_rng(0)
    feed = w.feed(rng)
    arrays = [feed[t] for t in w.inputs + list(w.data)]
    head = rng.standard_normal(w.output.shape).astype(np.float32)
    n_float = len(w.inputs)
    xs = [torch.from_numpy(a.copy()).requires_grad_() for a in arrays[:n_float]]
    data = [torch.from_numpy(a.copy()) for a in arrays[n_float:]]
    h = torch.from_numpy(head)
    ref = torch_table(torch)[name]
    op = tgt.custom_op(f"te_grad_bench::{name}", _suite_fn(name), threads=threads)

    def step(fn):
        out = fn(*xs, *data)
        return torch.autograd.grad(out, xs, h)

    retained = ref(*xs, *data)
    vjp = tg.build_vjp([w.output], w.inputs + list(w.data), threads=threads)
    vjp0 = tg.build_vjp([w.output], w.inputs + list(w.data), save=[], threads=threads)
    _, res = vjp.run_forward(*arrays)
    _, res0 = vjp0.run_forward(*arrays)
    got = step(op)
    want = step(ref)
    err = max(float((g - r).abs().max() / (r.abs().max() + 1e-30)) for g, r in zip(got, want))
    times = timer({
        "torch_step": lambda: step(ref),
        "tg_step": lambda: step(op),
        "torch_bwd": lambda: torch.autograd.grad(retained, xs, h, retain_graph=True),
        "tg_bwd_res": lambda: vjp.run_backward(res, arrays, [head]),
        "tg_bwd_recompute": lambda: vjp0.run_backward(res0, arrays, [head]),
    })
    return dict(op=name, err=err, residual_bytes=vjp.residual_bytes,
                saved=[t.name for t in vjp.saved], **{k: v["ms"] for k, v in times.items()})


def overhead(threads):
    def scale(x):
        return tg.compute(x.shape, lambda *i: x[i] * 2.0, name="y")
    op = tgt.custom_op("te_grad_bench::scale", scale, threads=threads)
    x = torch.randn(1)
    op(x)
    best = {}
    for label, fn in (("te_grad op", lambda: op(x)), ("torch.mul", lambda: torch.mul(x, 2.0))):
        runs = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(2000):
                fn()
            runs.append((time.perf_counter() - t0) / 2000 * 1e6)
        best[label] = min(runs)
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="threads for te_grad and PyTorch")
    parser.add_argument("--ops", default=",".join(SUITE), help="comma-separated suite op names")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few, short repetitions")
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    torch.set_num_threads(args.threads)
    timer = Timer(1, 3, 0.2) if args.quick else Timer(3, 10, 1.0)
    print(f"# te_grad inside PyTorch {torch.__version__}, {args.threads} threads, {cpu_name()}")
    print(f"{'op':18s} {'torch f+b':>10s} {'tg op f+b':>10s} {'ratio':>6s} | {'torch bwd':>10s} "
          f"{'tg bwd res':>10s} {'ratio':>6s} {'tg recomp':>10s} {'ratio':>6s} | residuals")
    ratios_step, ratios_bwd = [], []
    for name in args.ops.split(","):
        r = measure(name, args.threads, timer)
        rs, rb = r["tg_step"] / r["torch_step"], r["tg_bwd_res"] / r["torch_bwd"]
        ratios_step.append(rs)
        ratios_bwd.append(rb)
        print(f"{name:18s} {r['torch_step']:10.3f} {r['tg_step']:10.3f} {rs:6.2f} | {r['torch_bwd']:10.3f} "
              f"{r['tg_bwd_res']:10.3f} {rb:6.2f} {r['tg_bwd_recompute']:10.3f} "
              f"{r['tg_bwd_recompute'] / r['torch_bwd']:6.2f} | {r['residual_bytes'] / 1024:.0f} KiB "
              f"{','.join(r['saved']) or '-'}  (max rel err {r['err']:.1e})", flush=True)

    def geo(v):
        return math.exp(sum(math.log(x) for x in v) / len(v))
    print(f"geomean: fwd+bwd through the bridge {geo(ratios_step):.2f}x PyTorch; backward from residuals "
          f"{geo(ratios_bwd):.2f}x PyTorch's backward; worst {max(ratios_bwd):.2f}x")
    o = overhead(args.threads)
    print(f"per-call cost of a one-element op: te_grad op {o['te_grad op']:.1f} us, torch.mul "
          f"{o['torch.mul']:.1f} us")
    t = tiny_op(4, args.threads, Timer(200, 200, 0.2) if args.quick else Timer(2000, 2000, 1.0))
    print(f"a 4-element op (x * w) vs torch.mul, inputs requiring grad: fwd {t['tg fwd']:.1f} us vs "
          f"{t['torch fwd']:.1f} us ({t['tg fwd'] / t['torch fwd']:.2f}x), fwd+bwd {t['tg fwd+bwd']:.1f} us vs "
          f"{t['torch fwd+bwd']:.1f} us ({t['tg fwd+bwd'] / t['torch fwd+bwd']:.2f}x) "
          f"({args.threads} thread(s); benchmarks/bridge_overhead.py)")


if __name__ == "__main__":
    main()
