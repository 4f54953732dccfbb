"""COO graph aggregation y[i, :] = sum over edges e with dst[e] == i of w[e] * x[src[e], :].

    python benchmarks/coo_scatter.py [--threads 2]

te_grad's form is ``tg.sum(w[e] * x[src[e], j], axis=e, where=dst[e] == i)``; the
simplifier makes it a scatter over (e, j), and its gradients a scatter (dx) and a gather
(dw), E x F work each. Set against PyTorch's ``index_add_`` (autograd for the backward) and,
if jax is importable, ``jax.ops.segment_sum`` under ``jax.jit`` (``jax.vjp`` for the
backward), at the same thread count, N = 1,000 / E = 5,000 and N = 32,768 / E = 280,000
nodes / edges, F = 16 features, float32. Forward, and forward + both gradients (te_grad:
one kernel). Every result is checked against PyTorch's before timing; prints ms and the
ratios te_grad / other (below 1: te_grad is faster).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import te_grad as tg  # noqa: E402
from te_grad.tools.benchmark import Timer, pin_threads, rel_err  # noqa: E402

SIZES = [(1000, 5000), (32768, 280000)]
F = 16


def graph(N, E):
    src = tg.placeholder((E,), dtype="int64", name="src")
    dst = tg.placeholder((E,), dtype="int64", name="dst")
    w = tg.placeholder((E,), name="w")
    x = tg.placeholder((N, F), name="x")
    e = tg.reduce_axis((0, E), name="e")
    y = tg.compute((N, F), lambda i, j: tg.sum(w[e] * x[src[e], j], axis=e, where=dst[e] == i), name="y")
    return src, dst, w, x, y


def one_size(N, E, threads, timer):
    rng = np.random.default_rng(0)
    src, dst, w, x, y = graph(N, E)
    head = tg.placeholder((N, F), name="head")
    dx, dw = tg.gradient(y, [x, w], head=head)
    vals = [rng.integers(0, N, E), rng.integers(0, N, E), rng.standard_normal(E).astype("float32"),
            rng.standard_normal((N, F)).astype("float32")]
    hv = rng.standard_normal((N, F)).astype("float32")
    fwd = tg.build(y, [src, dst, w, x], threads=threads)
    both = tg.build([y, dx, dw], [src, dst, w, x, head], threads=threads)
    fns = {"te_grad fwd": lambda: fwd(*vals), "te_grad fwd+bwd": lambda: both(*vals, hv)}

    import torch
    torch.set_num_threads(threads)
    ts, td = torch.from_numpy(vals[0]), torch.from_numpy(vals[1])
    tw, tx, th = (torch.from_numpy(v) for v in (vals[2], vals[3], hv))

    def torch_y(w_, x_):
        return torch.zeros((N, F), dtype=x_.dtype).index_add_(0, td, w_[:, None] * x_[ts])

    def torch_fwd():
        with torch.no_grad():
            return torch_y(tw, tx)

    def torch_both():
        w_, x_ = tw.detach().requires_grad_(), tx.detach().requires_grad_()
        out = torch_y(w_, x_)
        return (out,) + torch.autograd.grad(out, [x_, w_], th)

    want = [t.detach().numpy() for t in torch_both()]
    fns.update({"torch fwd": torch_fwd, "torch fwd+bwd": torch_both})
    checks = {"fwd": rel_err(fwd(*vals), want[0])}
    got = both(*vals, hv)
    for name, g, v in zip(("y", "dx", "dw"), got, want):
        checks[name] = rel_err(g, v)
    try:
        import jax
        import jax.numpy as jnp
        js, jd = jnp.asarray(vals[0]), jnp.asarray(vals[1])

        def jax_y(w_, x_):
            return jax.ops.segment_sum(w_[:, None] * x_[js], jd, num_segments=N)

        jf = jax.jit(jax_y)

        @jax.jit
        def jb(w_, x_, h_):
            out, pull = jax.vjp(jax_y, w_, x_)
            dw_, dx_ = pull(h_)
            return out, dx_, dw_

        jw, jx, jh = (jnp.asarray(v) for v in (vals[2], vals[3], hv))
        checks["jax"] = rel_err(np.asarray(jb(jw, jx, jh)[1]), want[1])
        fns.update({"jax fwd": lambda: jf(jw, jx).block_until_ready(),
                    "jax fwd+bwd": lambda: [a.block_until_ready() for a in jb(jw, jx, jh)]})
    except ImportError:
        pass
    ms = {k: v["ms"] for k, v in timer(fns).items()}
    print(f"N = {N} nodes, E = {E} edges, F = {F}, float32, {threads} threads")
    for k, v in ms.items():
        print(f"  {k:18s} {v:9.3f} ms")
    for other in ("torch", "jax"):
        if f"{other} fwd" in ms:
            print(f"  te_grad / {other}: fwd {ms['te_grad fwd'] / ms[f'{other} fwd']:.2f}x, "
                  f"fwd+bwd {ms['te_grad fwd+bwd'] / ms[f'{other} fwd+bwd']:.2f}x")
    ok = all(err <= 1e-4 for err in checks.values())
    print("  checks: " + ", ".join(f"{k} {v:.1e}" for k, v in checks.items()) + (" PASS" if ok else " FAIL"))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds per timed callable")
    args = ap.parse_args()
    pin_threads(args.threads)
    timer = Timer(warmup=3, min_runs=10, min_time=args.min_time)
    ok = all([one_size(N, E, args.threads, timer) for N, E in SIZES])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
