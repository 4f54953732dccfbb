"""The same op written several ways, as users write it: te_grad's speed per formulation.

    python benchmarks/formulations.py [--threads 2] [--quick]

Each row is one formulation of one op (a convolution with a separate zero-padding stage,
in NHWC, a dense layer with the weight transposed, a softmax or a layer norm in several
stages, ...); te_grad's forward and backward (all float gradients, one kernel each) are
timed next to PyTorch's equivalent (forward under no_grad; backward ``autograd.grad`` on a
retained graph), in one process at the same thread count, and the ratio of each
formulation to the best te_grad formulation of the same op is printed: equivalent
formulations should run at about the same speed.
"""
import argparse
import math
import statistics
import time

import numpy as np

import te_grad as tg
from te_grad import nn
from te_grad.benchmark import Timer, cpu_name, pin_threads


def conv_guards():
    x, w = tg.placeholder((4, 32, 32, 32), name="X"), tg.placeholder((32, 32, 3, 3), name="W")
    return nn.conv2d(x, w, padding=1), [x, w]


def conv_pad_stage():
    x, w = tg.placeholder((4, 32, 32, 32), name="X"), tg.placeholder((32, 32, 3, 3), name="W")
    p = tg.compute((4, 32, 34, 34), lambda n, c, h, v: tg.if_then_else(
        tg.all(h >= 1, h < 33, v >= 1, v < 33), x[n, c, h - 1, v - 1], 0.0), name="P")
    c, ry, rx = tg.reduce_axis(32, "c"), tg.reduce_axis(3, "ry"), tg.reduce_axis(3, "rx")
    y = tg.compute((4, 32, 32, 32), lambda n, f, h, v: tg.sum(p[n, c, h + ry, v + rx] * w[f, c, ry, rx],
                                                            axis=[c, ry, rx]), name="Y")
    return y, [x, w]


def conv_nhwc():
    x, w = tg.placeholder((4, 32, 32, 32), name="X"), tg.placeholder((3, 3, 32, 32), name="W")  # NHWC, HWIO
    c, ry, rx = tg.reduce_axis(32, "c"), tg.reduce_axis(3, "ry"), tg.reduce_axis(3, "rx")

    def body(n, h, v, f):
        hh, vv = h + ry - 1, v + rx - 1
        inside = tg.all(hh >= 0, hh < 32, vv >= 0, vv < 32)
        return tg.sum(tg.if_then_else(inside, x[n, hh, vv, c], 0.0) * w[ry, rx, c, f], axis=[c, ry, rx])
    return tg.compute((4, 32, 32, 32), body, name="Y"), [x, w]


def dense_oi():
    x, w = tg.placeholder((256, 512), name="X"), tg.placeholder((256, 512), name="W")
    return nn.dense(x, w), [x, w]


def dense_io():
    x, w = tg.placeholder((256, 512), name="X"), tg.placeholder((512, 256), name="W")
    return nn.matmul(x, w), [x, w]


def softmax_one():
    x = tg.placeholder((256, 1000), name="X")
    return nn.softmax(x), [x]


def softmax_stages():
    x = tg.placeholder((256, 1000), name="X")
    k = tg.reduce_axis(1000, "k")
    m = tg.compute((256,), lambda i: tg.max(x[i, k], axis=k), name="m")
    d = tg.compute((256, 1000), lambda i, j: x[i, j] - tg.stop_gradient(m[i]), name="d")
    e = tg.compute((256, 1000), lambda i, j: tg.exp(d[i, j]), name="e")
    k2 = tg.reduce_axis(1000, "k2")
    s = tg.compute((256,), lambda i: tg.sum(e[i, k2], axis=k2), name="s")
    return tg.compute((256, 1000), lambda i, j: e[i, j] / s[i], name="y"), [x]


def layer_norm_one():
    x = tg.placeholder((256, 1024), name="X")
    return nn.layer_norm(x), [x]


def layer_norm_stages():
    x = tg.placeholder((256, 1024), name="X")
    k = tg.reduce_axis(1024, "k")
    mu = tg.compute((256,), lambda i: tg.sum(x[i, k], axis=k) / 1024.0, name="mu")
    c = tg.compute((256, 1024), lambda i, j: x[i, j] - mu[i], name="c")
    k2 = tg.reduce_axis(1024, "k2")
    var = tg.compute((256,), lambda i: tg.sum(c[i, k2] * c[i, k2], axis=k2) / 1024.0, name="var")
    return tg.compute((256, 1024), lambda i, j: c[i, j] / tg.sqrt(var[i] + 1e-5), name="y"), [x]


def bmm_plain():
    a, b = tg.placeholder((8, 128, 64), name="A"), tg.placeholder((8, 64, 128), name="B")
    return nn.batch_matmul(a, b), [a, b]


def bmm_transposed():
    a, b = tg.placeholder((8, 64, 128), name="A"), tg.placeholder((8, 128, 64), name="B")
    return nn.batch_matmul(a, b, transpose_a=True, transpose_b=True), [a, b]


def torch_fns(torch):
    F = torch.nn.functional
    return {
        "conv_guards": lambda x, w: F.conv2d(x, w, padding=1),
        "conv_pad_stage": lambda x, w: F.conv2d(F.pad(x, (1, 1, 1, 1)), w),
        "conv_nhwc": lambda x, w: F.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), padding=1).permute(0, 2, 3, 1),
        "dense_oi": lambda x, w: F.linear(x, w),
        "dense_io": lambda x, w: x @ w,
        "softmax_one": lambda x: torch.softmax(x, -1),
        "softmax_stages": lambda x: torch.softmax(x, -1),
        "layer_norm_one": lambda x: F.layer_norm(x, x.shape[-1:]),
        "layer_norm_stages": lambda x: F.layer_norm(x, x.shape[-1:]),
        "bmm_plain": lambda a, b: a @ b,
        "bmm_transposed": lambda a, b: a.transpose(1, 2) @ b.transpose(1, 2),
    }


OPS = {"conv3x3": ["conv_guards", "conv_pad_stage", "conv_nhwc"], "dense": ["dense_oi", "dense_io"],
       "softmax": ["softmax_one", "softmax_stages"], "layer_norm": ["layer_norm_one", "layer_norm_stages"],
       "batch_matmul": ["bmm_plain", "bmm_transposed"]}


def measure(name, threads, timer, torch):
    y, xs = globals()[name]()
    head = tg.placeholder(y.shape, name="H")
    grads = tg.gradient(y, xs, head=head)
    t0 = time.perf_counter()
    fwd = tg.build([y], xs, threads=threads)
    bwd = tg.build(grads, xs + [head], threads=threads)
    build_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(x.shape).astype(np.float32) for x in xs]
    h = rng.standard_normal(y.shape).astype(np.float32)
    fns = {"tg_fwd": lambda: fwd(*arrays), "tg_bwd": lambda: bwd(*arrays, h)}
    if torch is not None:
        ts = [torch.from_numpy(a.copy()).requires_grad_() for a in arrays]
        fn = torch_fns(torch)[name]
        out = fn(*ts)
        th = torch.from_numpy(h)
        np.testing.assert_allclose(fwd(*arrays), out.detach().numpy(), rtol=2e-3, atol=2e-3)

        def torch_fwd():
            with torch.no_grad():
                return fn(*ts)
        fns["torch_fwd"] = torch_fwd
        fns["torch_bwd"] = lambda: torch.autograd.grad(out, ts, th, retain_graph=True)
    times = {k: v["ms"] for k, v in timer(fns).items()}
    return dict(build_s=build_s, **times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    timer = Timer(1, 3, 0.2) if args.quick else Timer(2, 10, 1.0)
    print(f"# formulations, {args.threads} threads, {cpu_name()}")
    print(f"{'op':12s} {'formulation':18s} {'tg fwd ms':>9s} {'tg bwd ms':>9s} {'fwd/best':>8s} {'bwd/best':>8s} "
          f"{'fwd/torch':>9s} {'bwd/torch':>9s} {'build s':>7s}")
    for op, names in OPS.items():
        rows = {n: measure(n, args.threads, timer, torch) for n in names}
        best_f = min(r["tg_fwd"] for r in rows.values())
        best_b = min(r["tg_bwd"] for r in rows.values())
        for n, r in rows.items():
            tf = r["tg_fwd"] / r["torch_fwd"] if "torch_fwd" in r else math.nan
            tb = r["tg_bwd"] / r["torch_bwd"] if "torch_bwd" in r else math.nan
            print(f"{op:12s} {n:18s} {r['tg_fwd']:9.3f} {r['tg_bwd']:9.3f} {r['tg_fwd'] / best_f:8.2f} "
                  f"{r['tg_bwd'] / best_b:8.2f} {tf:9.2f} {tb:9.2f} {r['build_s']:7.2f}", flush=True)


if __name__ == "__main__":
    main()
