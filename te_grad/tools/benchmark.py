"""Time te_grad's compiled forward and backward kernels against PyTorch and JAX on the suite.

    python -m te_grad bench [--ops dense,softmax,...] [--threads 2] [--quick] [--json PATH]
    (or python benchmarks/bench.py with the same options)

For every op of ``te_grad.suite``: one forward kernel, and one backward kernel
computing the gradients of all float inputs for a fixed random head, are built
and timed (median of repeated runs after warm-up) next to PyTorch eager
(forward under ``no_grad``; backward = ``torch.autograd.grad`` on a retained
graph) and ``jax.jit`` (forward, and the VJP with the same head), all in
this process and interleaved in rounds. te_grad's
outputs and gradients are checked against PyTorch's (JAX's when PyTorch is
missing). Exits non-zero if any check fails. PyTorch and JAX are optional
(``pip install te_grad[bench]``). See benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback

import numpy as np

import te_grad as tg
from te_grad.suite import SUITE, workload

#: a check passes when max|got - want| <= RTOL * max|want| for the output and every gradient
RTOL = 1e-3
#: a timing is flagged as unstable when its median exceeds this multiple of its fastest run
UNSTABLE = 3.0


# -- equivalents: each takes the float inputs then the integer data, in suite order ----------
def torch_table(torch):
    F = torch.nn.functional

    def conv(stride, padding, dilation, groups=1):
        return lambda x, w: F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation,
                                     groups=groups)

    return {
        "dense": lambda x, w: F.linear(x, w),
        "conv2d_s1p1": conv(1, 1, 1),
        "conv2d_s2p1": conv(2, 1, 1),
        "conv2d_d2p2": conv(1, 2, 2),
        "depthwise3x3": conv(1, 1, 1, groups=32),
        "max_pool2x2": lambda x: F.max_pool2d(x, 2),
        "avg_pool2x2": lambda x: F.avg_pool2d(x, 2),
        "softmax": lambda x: torch.softmax(x, -1),
        "log_softmax": lambda x: torch.log_softmax(x, -1),
        "layer_norm": lambda x, g, b: F.layer_norm(x, x.shape[-1:], g, b, eps=1e-5),
        "flatten_dense": lambda x, w: F.linear(torch.flatten(x, 1), w),
        "transpose": lambda x: x.t(),
        "bias_add": lambda x, b: x + b[None, :, None, None],
        "row_sum": lambda x: x.sum(1),
        "exp_tanh_sigmoid": lambda x: torch.exp(torch.tanh(x)) * torch.sigmoid(x),
        "cumsum": lambda x: torch.cumsum(x, 1),
        "embedding": lambda table, ids: F.embedding(ids, table),
        "attention": lambda q, k, v: torch.softmax(q @ k.transpose(1, 2) / 8.0, -1) @ v,
    }


def jax_table(jax):
    jnp, lax = jax.numpy, jax.lax

    def conv(stride, padding, dilation, groups=1):
        return lambda x, w: lax.conv_general_dilated(
            x, w, (stride, stride), [(padding, padding)] * 2, rhs_dilation=(dilation, dilation),
            feature_group_count=groups, dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def pool(x, init, op):
        return lax.reduce_window(x, init, op, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def layer_norm(x, g, b):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * lax.rsqrt(var + 1e-5) * g + b

    return {
        "dense": lambda x, w: x @ w.T,
        "conv2d_s1p1": conv(1, 1, 1),
        "conv2d_s2p1": conv(2, 1, 1),
        "conv2d_d2p2": conv(1, 2, 2),
        "depthwise3x3": conv(1, 1, 1, groups=32),
        "max_pool2x2": lambda x: pool(x, -jnp.inf, lax.max),
        "avg_pool2x2": lambda x: pool(x, 0.0, lax.add) / 4.0,
        "softmax": lambda x: jax.nn.softmax(x, axis=-1),
        "log_softmax": lambda x: jax.nn.log_softmax(x, axis=-1),
        "layer_norm": layer_norm,
        "flatten_dense": lambda x, w: x.reshape(x.shape[0], -1) @ w.T,
        "transpose": lambda x: x.T,
        "bias_add": lambda x, b: x + b[None, :, None, None],
        "row_sum": lambda x: x.sum(1),
        "exp_tanh_sigmoid": lambda x: jnp.exp(jnp.tanh(x)) * jax.nn.sigmoid(x),
        "cumsum": lambda x: jnp.cumsum(x, 1),
        "embedding": lambda table, ids: table[ids],
        "attention": lambda q, k, v: jax.nn.softmax(q @ k.transpose(0, 2, 1) / 8.0, axis=-1) @ v,
    }


# -- measurement ------------------------------------------------------------------------------
class Timer:
    """Median wall times of several callables, run in interleaved rounds.

    After ``warmup`` calls each, every round gives each callable a slice of about
    ``min_time / ROUNDS`` seconds; rounds go on until each has run ``min_runs`` times
    and for ``min_time`` seconds in all, so that a slow phase of the machine hits
    all frameworks of an op alike.
    """
    ROUNDS = 10

    def __init__(self, warmup: int, min_runs: int, min_time: float):
        self.warmup, self.min_runs, self.min_time = warmup, min_runs, min_time

    def __call__(self, fns: dict) -> dict:
        for fn in fns.values():
            for _ in range(self.warmup):
                fn()
        gc.collect()
        samples = {k: [] for k in fns}

        def done(k):
            return len(samples[k]) >= self.min_runs and sum(samples[k]) >= self.min_time

        while not all(done(k) for k in fns):
            for k, fn in fns.items():
                if done(k):
                    continue
                end = time.perf_counter() + self.min_time / self.ROUNDS
                while True:
                    t = time.perf_counter()
                    fn()
                    samples[k].append(time.perf_counter() - t)
                    if samples[k][-1] + t >= end or len(samples[k]) >= 100000:
                        break
        return {k: dict(ms=statistics.median(v) * 1e3, min_ms=min(v) * 1e3, runs=len(v))
                for k, v in samples.items()}


def rel_err(got, want) -> float:
    """max|got - want| / max|want| (inf if the shapes differ)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return math.inf
    if want.size == 0:
        return 0.0
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


# Each prepare_* returns ({"fwd": callable, ...}, [output] + gradients, info).
def prepare_te_grad(w, arrays, head, threads):
    floats, data = w.inputs, list(w.data)
    t0 = time.perf_counter()
    fwd = tg.build([w.output], inputs=floats + data, threads=threads)
    t1 = time.perf_counter()
    head_ph = tg.placeholder(w.output.shape, name="head")
    grads = tg.gradient(w.output, floats, head=head_ph)
    t2 = time.perf_counter()
    bwd = tg.build(grads, inputs=floats + data + [head_ph], threads=threads)
    t3 = time.perf_counter()
    step = tg.build([w.output] + list(grads), inputs=floats + data + [head_ph], threads=threads)
    g = bwd(*arrays, head)
    values = [fwd(*arrays)] + (list(g) if isinstance(g, tuple) else [g])
    for got, want in zip(step(*arrays, head), values):  # the step kernel computes the same values
        if rel_err(got, want) > RTOL:
            raise AssertionError("te_grad's training-step kernel disagrees with its forward and backward")
    # the backward from saved residuals, as PyTorch's autograd runs it: forward once, then
    # the backward kernel alone on what it saved
    vjp = tg.build_vjp([w.output], floats + data, wrt=floats, threads=threads)
    _, residuals = vjp.run_forward(*arrays)
    res_args = vjp.backward_arguments(residuals, arrays, [head])
    for got, want in zip(vjp.run_backward(residuals, arrays, [head]), values[1:]):
        if rel_err(got, want) > RTOL:
            raise AssertionError("te_grad's backward from residuals disagrees with its backward")
    info = dict(build_fwd_s=t1 - t0, gradient_s=t2 - t1, build_bwd_s=t3 - t2,
                saved=[t.name for t in vjp.saved], residual_bytes=vjp.residual_bytes)
    return (dict(fwd=lambda: fwd(*arrays), bwd=lambda: bwd(*arrays, head), step=lambda: step(*arrays, head),
                 res=lambda: vjp.backward(*res_args)),
            values, info)


def prepare_torch(torch, fn, arrays, n_float, head):
    """``fwd`` under no_grad; ``step`` = recorded forward + autograd.grad; ``grad`` = the grad call
    alone on a retained graph, which is the reported bwd (see the README)."""
    xs = [torch.from_numpy(a.copy()).requires_grad_() for a in arrays[:n_float]]
    data = [torch.from_numpy(a.copy()) for a in arrays[n_float:]]
    h = torch.from_numpy(head.copy())

    def fwd():
        with torch.no_grad():
            return fn(*xs, *data).contiguous()

    def step():
        out = fn(*xs, *data).contiguous()
        return out, [g.contiguous() for g in torch.autograd.grad(out, xs, h)]

    retained = fn(*xs, *data).contiguous()

    def grad():
        return [g.contiguous() for g in torch.autograd.grad(retained, xs, h, retain_graph=True)]

    out, grads = step()
    return dict(fwd=fwd, step=step, grad=grad), [t.detach().numpy() for t in [out] + grads], {}


def prepare_jax(jax, fn, arrays, n_float, head):
    def vjp(*args):
        xs, data, h = args[:n_float], args[n_float:-1], args[-1]
        return jax.vjp(lambda *x: fn(*x, *data), *xs)[1](h)

    def step(*args):  # the output and its gradients in one jitted call
        xs, data, h = args[:n_float], args[n_float:-1], args[-1]
        out, pullback = jax.vjp(lambda *x: fn(*x, *data), *xs)
        return out, pullback(h)

    x64 = jax.config.read("jax_enable_x64")
    args = [jax.device_put(a if x64 or a.dtype != np.int64 else a.astype(np.int32)) for a in arrays]
    h = jax.device_put(head)
    fwd, bwd, stepped = jax.jit(fn), jax.jit(vjp), jax.jit(step)
    t0 = time.perf_counter()
    out = jax.block_until_ready(fwd(*args))
    t1 = time.perf_counter()
    g = jax.block_until_ready(bwd(*args, h))
    t2 = time.perf_counter()
    jax.block_until_ready(stepped(*args, h))
    fns = dict(fwd=lambda: jax.block_until_ready(fwd(*args)),
               bwd=lambda: jax.block_until_ready(bwd(*args, h)),
               step=lambda: jax.block_until_ready(stepped(*args, h)))
    return fns, [np.asarray(out)] + [np.asarray(x) for x in g], \
        dict(compile_fwd_s=t1 - t0, compile_bwd_s=t2 - t1)


def run_op(name, fw, threads, timer, seed):
    """Everything measured for one op; ``ok`` is False when a check fails or te_grad raises."""
    w = workload(name)
    rng = np.random.default_rng(seed)
    feed = w.feed(rng)
    arrays = [feed[t] for t in w.inputs + list(w.data)]
    head = rng.standard_normal(w.output.shape).astype(w.output.dtype)
    labels = ["out"] + ["d" + t.name for t in w.inputs]
    rec = dict(op=name, shape=list(w.output.shape), inputs={t.name: list(t.shape) for t in w.inputs})
    fns, results = {}, {}
    for key, module, table in fw:
        try:
            if key == "te_grad":
                calls, results[key], rec[key] = prepare_te_grad(w, arrays, head, threads)
                print(f"  te_grad built: fwd {rec[key]['build_fwd_s']:.2f} s, bwd "
                      f"{rec[key]['gradient_s']:.2f} s gradient + {rec[key]['build_bwd_s']:.2f} s build",
                      flush=True)
            else:
                prepare = prepare_torch if key == "torch" else prepare_jax
                calls, results[key], rec[key] = prepare(module, table[name], arrays, len(w.inputs),
                                                        head)
            fns.update({(key, what): fn for what, fn in calls.items()})
        except Exception as exc:  # report it and go on
            print(f"  {key} ERROR", flush=True)
            traceback.print_exc()
            results.pop(key, None)
            rec[key] = dict(error=f"{type(exc).__name__}: {exc}")
    try:
        times = timer(fns)
    except Exception as exc:
        traceback.print_exc()
        times, rec["error"] = {}, f"{type(exc).__name__}: {exc}"
        results.pop("te_grad", None)
    for (key, what), t in times.items():
        rec[key].update({f"{what}_ms": t["ms"], f"{what}_min_ms": t["min_ms"], f"{what}_runs": t["runs"]})
    if "grad_ms" in rec.get("torch", {}):  # measured directly (a difference of two times can be negative)
        rec["torch"]["bwd_ms"] = rec["torch"]["grad_ms"]
    print("  " + "; ".join(f"{k} fwd {rec[k]['fwd_ms']:.3f} ms, bwd {rec[k]['bwd_ms']:.3f} ms"
                           + (f" (from residuals {rec[k]['res_ms']:.3f} ms)" if "res_ms" in rec[k] else "")
                           for k, _, _ in fw if "fwd_ms" in rec.get(k, {})), flush=True)
    ref = next((k for k in ("torch", "jax") if k in results), None)
    rec["reference"] = ref
    rec["errors"] = {k: {n: rel_err(g, r) for n, g, r in zip(labels, v, results[ref])}
                     for k, v in results.items() if k != ref and ref}
    failed = [k for k, errs in rec["errors"].items() if not all(e <= RTOL for e in errs.values())]
    rec["ok"] = "te_grad" in results and not failed
    rec["checked"] = "te_grad" in rec["errors"]
    return rec


# -- report ----------------------------------------------------------------------------------
def ratio(rec, a, b, what, what_b=None):
    try:
        return rec[a][what] / rec[b][what_b or what]
    except (KeyError, ZeroDivisionError):
        return None


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def check_text(rec):
    if not rec["ok"]:
        return "FAIL"
    return "PASS" if rec["checked"] else "n/a"


def report(recs, frameworks):
    # te_grad's backward from saved residuals is compared with PyTorch's (which reuses what its
    # forward saved), its backward from the inputs alone with JAX's jitted VJP (which recomputes)
    like = {"torch": "res_ms", "jax": "bwd_ms"}
    cols = [("tg fwd", lambda r: r.get("te_grad", {}).get("fwd_ms"), ".3f"),
            ("tg bwd", lambda r: r.get("te_grad", {}).get("bwd_ms"), ".3f"),
            ("tg res", lambda r: r.get("te_grad", {}).get("res_ms"), ".3f"),
            ("res/fwd", lambda r: ratio(r, "te_grad", "te_grad", "res_ms", "fwd_ms"), ".2f")]
    for key, short in (("torch", "pt"), ("jax", "jax")):
        if key in frameworks:
            cols += [(f"{short} fwd", lambda r, k=key: r.get(k, {}).get("fwd_ms"), ".3f"),
                     (f"{short} bwd", lambda r, k=key: r.get(k, {}).get("bwd_ms"), ".3f"),
                     (f"tg/{short} f", lambda r, k=key: ratio(r, "te_grad", k, "fwd_ms"), ".2f"),
                     (f"tg/{short} b", lambda r, k=key: ratio(r, "te_grad", k, like[k], "bwd_ms"), ".2f")]
    cols += [("build f s", lambda r: r.get("te_grad", {}).get("build_fwd_s"), ".2f"),
             ("build b s", lambda r: (r["te_grad"]["gradient_s"] + r["te_grad"]["build_bwd_s"])
              if "fwd_ms" in r.get("te_grad", {}) else None, ".2f")]
    header = f"{'op':<17}" + "".join(f"{c:>10}" for c, _, _ in cols) + f"{'check':>7}"
    print("\nmedian times in ms; ratios are te_grad / other (< 1: te_grad faster)")
    print(header)
    print("-" * len(header))
    for r in recs:
        print(f"{r['op']:<17}" + "".join(f"{fmt(get(r), spec):>10}" for _, get, spec in cols)
              + f"{check_text(r):>7}")
    summary = {}
    for key in frameworks:
        if key == "te_grad":
            continue
        for what in ("fwd_ms", "bwd_ms"):
            mine = like[key] if what == "bwd_ms" else what
            vals = [(ratio(r, "te_grad", key, mine, what), r["op"]) for r in recs]
            vals = [(v, op) for v, op in vals if v]
            if not vals:
                continue
            gmean = math.exp(sum(math.log(v) for v, _ in vals) / len(vals))
            worst = max(vals)
            tag = f"te_grad/{key} {what[:3]}"
            summary[tag] = dict(geomean=gmean, worst=worst[0], worst_op=worst[1], ops=len(vals))
            print(f"{tag:<20} geomean {gmean:6.2f}   worst {worst[0]:6.2f} ({worst[1]})")
    step_table(recs, frameworks, summary)
    unstable = [f"{r['op']} {k} {what}" for r in recs for k in frameworks
                for what in ("fwd", "bwd", "res", "step") if r.get(k, {}).get(f"{what}_ms", 0)
                > UNSTABLE * r[k].get(f"{what}_min_ms", math.inf)]
    if unstable:
        print(f"unstable (median > {UNSTABLE:g}x the fastest run): {', '.join(unstable)}")
    bad = [r["op"] for r in recs if not r["ok"]]
    passed = sum(r["ok"] and r["checked"] for r in recs)
    print(f"checks: {passed}/{len(recs)} PASS" + (f"; FAIL: {', '.join(bad)}" if bad else ""))
    return summary


def step_table(recs, frameworks, summary):
    """A training step: the output and every gradient from one call (te_grad: one kernel
    computing shared tensors once; JAX: one jitted VJP; PyTorch: recorded forward + autograd)."""
    others = [(k, s) for k, s in (("torch", "pt"), ("jax", "jax")) if k in frameworks]
    cols = [("tg step", lambda r: r.get("te_grad", {}).get("step_ms"))]
    for key, short in others:
        cols += [(f"{short} step", lambda r, k=key: r.get(k, {}).get("step_ms")),
                 (f"tg/{short}", lambda r, k=key: ratio(r, "te_grad", k, "step_ms"))]
    header = f"{'op':<17}" + "".join(f"{c:>10}" for c, _ in cols)
    print("\ntraining step (forward + all gradients in one call), median ms")
    print(header)
    print("-" * len(header))
    for r in recs:
        print(f"{r['op']:<17}" + "".join(f"{fmt(get(r), '.3f' if 'step' in c else '.2f'):>10}"
                                         for c, get in cols))
    for key, _ in others:
        vals = [(ratio(r, "te_grad", key, "step_ms"), r["op"]) for r in recs]
        vals = [(v, op) for v, op in vals if v]
        if vals:
            gmean = math.exp(sum(math.log(v) for v, _ in vals) / len(vals))
            worst = max(vals)
            tag = f"te_grad/{key} step"
            summary[tag] = dict(geomean=gmean, worst=worst[0], worst_op=worst[1], ops=len(vals))
            print(f"{tag:<20} geomean {gmean:6.2f}   worst {worst[0]:6.2f} ({worst[1]})")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def pin_threads(n: int):
    """Restrict the process to ``n`` CPUs so that JAX (which sizes its pool by them) uses ``n``."""
    if not hasattr(os, "sched_getaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if n < len(cpus):
        os.sched_setaffinity(0, cpus[:n])
    elif n > len(cpus):
        print(f"note: --threads {n} exceeds the {len(cpus)} CPUs available", flush=True)


def script_options(argv, description: str, choices, default_timer: "Timer"):
    """What the benchmark scripts share: ``--threads``, ``--quick`` and ``--ops`` (a subset of
    ``choices``) parsed from ``argv``, the process pinned to that many CPUs, PyTorch set to
    as many threads (None when it is not installed) and the timer (``default_timer``, or a
    short one with ``--quick``). Returns ``(args, torch, timer)``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--threads", type=int, default=2,
                        help="threads for te_grad and PyTorch; the process is pinned to as many CPUs")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few, short repetitions")
    parser.add_argument("--ops", nargs="*", default=None, help=f"a subset of {', '.join(choices)}")
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    return args, torch, (Timer(1, 3, 0.2) if args.quick else default_timer)


def load(skip_torch, skip_jax, threads):
    fw = [("te_grad", tg, None)]
    notes = []
    if not skip_torch:
        try:
            import torch
            torch.set_num_threads(threads)
            fw.append(("torch", torch, torch_table(torch)))
        except ImportError:
            notes.append("PyTorch is not installed: skipped (pip install te_grad[bench])")
    if not skip_jax:
        try:
            os.environ.setdefault("JAX_PLATFORMS", "cpu")
            import jax
            fw.append(("jax", jax, jax_table(jax)))
        except ImportError:
            notes.append("JAX is not installed: skipped (pip install te_grad[bench])")
    return fw, notes


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m te_grad bench", description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=",".join(SUITE), help="comma-separated op names (default: all)")
    parser.add_argument("--threads", type=int, default=2, help="threads for every framework (default 2)")
    parser.add_argument("--quick", action="store_true", help="few repetitions (a smoke run)")
    parser.add_argument("--min-time", type=float,
                        help="seconds of timed runs per measurement (default 0.3; 0.02 with --quick)")
    parser.add_argument("--json", metavar="PATH", help="write every number to PATH")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    parser.add_argument("--no-jax", action="store_true", help="skip JAX")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs and the head")
    args = parser.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    unknown = [o for o in ops if o not in SUITE]
    if unknown or args.threads < 1:
        parser.error(f"unknown op(s) {', '.join(unknown)}; choose from {', '.join(SUITE)}"
                     if unknown else "--threads must be >= 1")
    pin_threads(args.threads)
    fw, notes = load(args.no_torch, args.no_jax, args.threads)
    if args.min_time is None:
        args.min_time = 0.02 if args.quick else 0.3
    timer = Timer(1, 3, args.min_time) if args.quick else Timer(3, 5, args.min_time)
    versions = {"te_grad": tg.__version__, "numpy": np.__version__}
    versions.update({k: m.__version__ for k, m, _ in fw if k != "te_grad"})
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(", ".join(f"{k} {v}" for k, v in versions.items())
          + f"; threads {args.threads}; {cpu_name()} ({cpus} CPUs in use)", flush=True)
    for n in notes:
        print("note:", n, flush=True)
    if len(fw) == 1:
        print("note: no reference framework, so nothing is checked", flush=True)

    recs = []
    for n, name in enumerate(ops, 1):
        print(f"[{n}/{len(ops)}] {name}", flush=True)
        rec = run_op(name, fw, args.threads, timer, args.seed)
        errs = rec["errors"].get("te_grad")
        if "error" in rec.get("te_grad", {}) or "error" in rec:
            print(f"  FAIL: te_grad raised {rec.get('error') or rec['te_grad']['error']}", flush=True)
        if errs:
            detail = ", ".join(f"{k} {v:.1e}" for k, v in errs.items())
            print(f"  {check_text(rec)} vs {rec['reference']}: {detail}", flush=True)
        for k, e in rec["errors"].items():
            if k != "te_grad" and not all(v <= RTOL for v in e.values()):
                print(f"  FAIL: the {k} equivalent disagrees with {rec['reference']}: {e}", flush=True)
        recs.append(rec)

    summary = report(recs, [k for k, _, _ in fw])
    if args.json:
        meta = dict(versions=versions, threads=args.threads, quick=args.quick, rtol=RTOL,
                    min_time_s=timer.min_time, min_runs=timer.min_runs, warmup=timer.warmup,
                    cpu=cpu_name(), python=platform.python_version(), notes=notes)
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, ops=recs, summary=summary), f, indent=1, default=str)
        print(f"wrote {args.json}")
    return 0 if all(r["ok"] for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
