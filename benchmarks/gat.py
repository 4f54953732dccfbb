"""One GAT layer, forward and backward, on CSR ragged loops: te_grad next to PyTorch and JAX.

    python benchmarks/gat.py [--threads 2] [--features 16] [--small] [--one-thread]

The layer as a user writes it in te_grad, with the edges sorted by destination and
grouped by a row pointer (no padding)::

    h = x @ W                                             (V x F)
    e_ij = leaky_relu(a_src . h[src[e]] + a_dst . h[v])   per edge e into v
    alpha = segment_softmax(e, rowptr)                     over each destination's edges
    out[v] = sum over the edges e into v of alpha_e * h[src[e]]
    loss = sum(out * g)                                    for a fixed random g

One kernel computes the loss and its gradients with respect to x, W, a_src and
a_dst (``tg.differentiate`` then ``tg.build``). PyTorch eager is the PyG-style
formulation (``index_add_`` for the sums, ``scatter_reduce(amax)`` for the softmax's
maximum, autograd); JAX uses ``jax.ops.segment_sum`` / ``segment_max`` under
``jax.jit(jax.value_and_grad)``. The three are checked against each other (loss and
every gradient) before timing. Two graphs with the same V and E: power-law in-degrees
(Zipf weights over shuffled destinations, seeded) and uniform in-degrees.
``--small`` runs a small graph quickly. Prints median ms and the ratios
te_grad / PyTorch and te_grad / JAX.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from te_grad.tools.benchmark import Timer, pin_threads, rel_err  # noqa: E402

#: the checks: max|got - want| <= RTOL * max|want| for the loss and each gradient (float32)
RTOL = 2e-3
SLOPE = 0.2  # leaky_relu's negative slope, GAT's


# -- graphs ---------------------------------------------------------------------------------
def power_law_graph(V, E, seed=0, exponent=0.8):
    """Destinations drawn with Zipf weights 1 / rank**exponent over shuffled vertex ids,
    sources uniform: CSR by destination (rowptr, src, dst)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, V + 1) ** exponent
    dst = rng.permutation(V)[rng.choice(V, size=E, p=weights / weights.sum())]
    return _csr(rng, V, dst)


def uniform_graph(V, E, seed=0):
    """Every destination gets E // V or E // V + 1 edges, sources uniform."""
    rng = np.random.default_rng(seed)
    deg = np.full(V, E // V)
    deg[rng.permutation(V)[:E - deg.sum()]] += 1
    return _csr(rng, V, np.repeat(np.arange(V), deg))


def _csr(rng, V, dst):
    dst = np.sort(dst).astype(np.int64)
    src = rng.integers(0, V, size=dst.size).astype(np.int64)
    rowptr = np.zeros(V + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=V), out=rowptr[1:])
    return rowptr, src, dst


# -- te_grad ----------------------------------------------------------------------------------
def te_grad_gat(V, E, Fi, Fo, threads):
    """The loss and its gradients wrt (x, W, a_src, a_dst) as one kernel, inputs
    (rowptr, src, dst, x, W, a_src, a_dst, g)."""
    import te_grad as tg
    rowptr = tg.placeholder((V + 1,), dtype="int64", name="rowptr")
    src = tg.placeholder((E,), dtype="int64", name="src")
    dst = tg.placeholder((E,), dtype="int64", name="dst")
    x = tg.placeholder((V, Fi), name="x")
    W = tg.placeholder((Fi, Fo), name="W")
    a_src = tg.placeholder((Fo,), name="a_src")
    a_dst = tg.placeholder((Fo,), name="a_dst")
    g = tg.placeholder((V, Fo), name="g")

    h = tg.nn.matmul(x, W)
    k = tg.reduce_axis(Fo, "k")
    s_src = tg.compute((V,), lambda v: tg.sum(h[v, k] * a_src[k], axis=k), name="s_src")
    k = tg.reduce_axis(Fo, "k")
    s_dst = tg.compute((V,), lambda v: tg.sum(h[v, k] * a_dst[k], axis=k), name="s_dst")
    score = tg.nn.leaky_relu(tg.compute((E,), lambda e: s_src[src[e]] + s_dst[dst[e]], name="pre"), SLOPE)
    alpha = tg.nn.segment_softmax(score, rowptr)

    def aggregate(v, f):
        e = tg.reduce_axis((rowptr[v], rowptr[v + 1]), name="e")
        return tg.sum(alpha[e] * h[src[e], f], axis=e)

    out = tg.compute((V, Fo), aggregate, name="out")
    i, f = tg.reduce_axis(V, "i"), tg.reduce_axis(Fo, "f")
    loss = tg.compute((), lambda: tg.sum(out[i, f] * g[i, f], axis=[i, f]), name="loss")
    grads = tg.gradient(loss, [x, W, a_src, a_dst])
    t0 = time.perf_counter()
    kernel = tg.build([loss] + grads, inputs=[rowptr, src, dst, x, W, a_src, a_dst, g], threads=threads)
    return kernel, time.perf_counter() - t0


# -- PyTorch (PyG-style) ---------------------------------------------------------------------
def torch_gat(torch, V):
    def step(src, dst, x, W, a_src, a_dst, g):
        h = x @ W
        score = torch.nn.functional.leaky_relu((h @ a_src)[src] + (h @ a_dst)[dst], SLOPE)
        m = torch.zeros(V, dtype=score.dtype).scatter_reduce(0, dst, score.detach(), "amax",
                                                              include_self=False)
        p = torch.exp(score - m[dst])
        z = torch.zeros(V, dtype=p.dtype).index_add_(0, dst, p)
        alpha = p / z[dst]
        out = torch.zeros(V, h.shape[1], dtype=h.dtype).index_add_(0, dst, alpha[:, None] * h[src])
        loss = (out * g).sum()
        return [loss] + list(torch.autograd.grad(loss, [x, W, a_src, a_dst]))
    return step


# -- JAX -------------------------------------------------------------------------------------
def jax_gat(jax, V):
    jnp = jax.numpy

    def loss_fn(x, W, a_src, a_dst, src, dst, g):
        h = x @ W
        score = jax.nn.leaky_relu((h @ a_src)[src] + (h @ a_dst)[dst], SLOPE)
        m = jax.lax.stop_gradient(jax.ops.segment_max(score, dst, V, indices_are_sorted=True))
        p = jnp.exp(score - m[dst])
        z = jax.ops.segment_sum(p, dst, V, indices_are_sorted=True)
        alpha = p / z[dst]
        out = jax.ops.segment_sum(alpha[:, None] * h[src], dst, V, indices_are_sorted=True)
        return jnp.sum(out * g)

    return jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1, 2, 3)))


def run_graph(label, graph, args, timer, torch, jax):
    rowptr, src, dst = graph
    V, E = rowptr.size - 1, src.size
    Fi = Fo = args.features
    rng = np.random.default_rng(1)
    x = rng.standard_normal((V, Fi)).astype(np.float32)
    W = (rng.standard_normal((Fi, Fo)) / np.sqrt(Fi)).astype(np.float32)
    a_src = rng.standard_normal(Fo).astype(np.float32)
    a_dst = rng.standard_normal(Fo).astype(np.float32)
    g = rng.standard_normal((V, Fo)).astype(np.float32)
    deg = np.diff(rowptr)
    print(f"\n{label}: V={V} E={E} F={Fi}->{Fo} in-degree max={deg.max()} mean={deg.mean():.1f} "
          f"empty={int((deg == 0).sum())}", flush=True)

    kernel, build_s = te_grad_gat(V, E, Fi, Fo, args.threads)
    fns = {"te_grad": lambda: kernel(rowptr, src, dst, x, W, a_src, a_dst, g)}
    if args.threads > 1 and args.one_thread:
        kernel1, _ = te_grad_gat(V, E, Fi, Fo, 1)
        fns["te_grad 1 thread"] = lambda: kernel1(rowptr, src, dst, x, W, a_src, a_dst, g)
    results = {"te_grad": fns["te_grad"]()}
    print(f"te_grad build {build_s:.1f} s", flush=True)
    if torch is not None:
        step = torch_gat(torch, V)
        t_args = [torch.from_numpy(a) for a in (src, dst)] + \
                 [torch.from_numpy(a).requires_grad_() for a in (x, W, a_src, a_dst)] + [torch.from_numpy(g)]
        fns["torch"] = lambda: step(*t_args)
        results["torch"] = [r.detach().numpy() for r in fns["torch"]()]
        if args.threads > 1 and args.one_thread:

            def torch_one():
                torch.set_num_threads(1)
                try:
                    return step(*t_args)
                finally:
                    torch.set_num_threads(args.threads)

            fns["torch 1 thread"] = torch_one
    if jax is not None:
        fn = jax_gat(jax, V)
        j_args = [jax.numpy.asarray(a) for a in (x, W, a_src, a_dst, src, dst, g)]

        def jax_run():
            value, grads = fn(*j_args)
            value.block_until_ready()
            for d in grads:
                d.block_until_ready()
            return [value] + list(grads)

        fns["jax"] = jax_run
        results["jax"] = [np.asarray(r) for r in jax_run()]
    names = ["loss", "dx", "dW", "da_src", "da_dst"]
    ok = True
    ref_name = "torch" if "torch" in results else ("jax" if "jax" in results else None)
    for other in results:
        if other == ref_name or ref_name is None:
            continue
        for n, got, want in zip(names, results[other], results[ref_name]):
            err = rel_err(got, want)
            if not err <= RTOL:
                ok = False
                print(f"MISMATCH {other} vs {ref_name} {n}: rel err {err:.2e}", flush=True)
    if not ok:
        return False
    print("values and gradients agree (" + ", ".join(results) + f"; rel tol {RTOL})", flush=True)
    times = {k: t["ms"] for k, t in timer(fns).items()}
    row = "  ".join(f"{k} {v:.2f} ms" for k, v in times.items())
    ratios = "  ".join(f"te_grad/{k} {times['te_grad'] / times[k]:.2f}x" for k in times
                       if not k.startswith("te_grad"))
    print(row, flush=True)
    print(ratios, flush=True)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--features", type=int, default=16, help="F_in = F_out")
    ap.add_argument("--small", action="store_true", help="a small graph, short timing (a quick check)")
    ap.add_argument("--graphs", default="power,uniform", help="power, uniform or both")
    ap.add_argument("--one-thread", action="store_true",
                    help="also time te_grad and PyTorch on one thread (references)")
    args = ap.parse_args()
    pin_threads(args.threads)
    torch = jax = None
    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        print("note: PyTorch not installed")
    try:
        import jax
        jax.config.update("jax_enable_x64", False)
    except ImportError:
        print("note: JAX not installed")
    V, E = (2048, 18_000) if args.small else (32_768, 280_000)
    timer = Timer(1, 3, 0.5) if args.small else Timer(2, 10, 4.0)
    print(f"threads={args.threads} (torch {torch.get_num_threads() if torch else '-'}, "
          f"jax pinned to {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'} CPUs)")
    ok = True
    graphs = {"power": lambda: power_law_graph(V, E), "uniform": lambda: uniform_graph(V, E)}
    for name in args.graphs.split(","):
        ok &= run_graph(f"{name}-law graph" if name == "power" else "uniform graph", graphs[name](),
                        args, timer, torch, jax)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
