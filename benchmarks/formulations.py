"""The same op written several ways, as users write it: te_grad's speed per formulation.

    python benchmarks/formulations.py [--threads 2] [--quick]

Each row is one formulation of one op (a convolution with a separate zero-padding stage,
in NHWC, a dense layer with the weight transposed, a softmax or a layer norm in several
stages, ...); te_grad's forward, its backward from the inputs (all float gradients, one
kernel) and its backward from saved residuals (``tg.build_vjp``: what a model trained
through ``te_grad.torch`` runs) are timed next to PyTorch's equivalent (forward under
no_grad; backward ``autograd.grad`` on a retained graph, which reuses what its forward
saved, so it is compared with the backward from residuals), in one process at the same
thread count, and the ratio of each formulation to the best te_grad formulation of the
same op is printed: equivalent formulations should run at about the same speed (a
sliding-window attention whose window offset is an ``if_then_else`` on the head next to the
same window split by hand into one term per branch, ``--ops sliding_window_attention``).
"""
import math
import time

import numpy as np

import te_grad as tg
from te_grad.formulations import FORMULATIONS, _window_sizes
from te_grad.tools.benchmark import Timer, cpu_name, script_options


def sliding_window_torch(torch):
    """The Longformer formulations' attention in PyTorch: the keys of each window gathered by
    advanced indexing (clamped into the sequence, masked outside it)."""
    _, n, heads, d, width = _window_sizes(False)
    i, w, h = torch.arange(n), torch.arange(width), torch.arange(heads)
    offset = torch.where(h < heads // 2, width // 2, width - 1)
    j = i[:, None, None] + w[None, None, :] - offset[None, :, None]  # (N, H, W)
    valid = (j >= 0) & (j < n)
    jc, hh = j.clamp(0, n - 1), h[None, :, None].expand_as(j)

    def attend(q, k, v):
        s = (q[:, :, :, None, :] * k[:, jc, hh]).sum(-1) / d ** 0.5
        p = torch.softmax(torch.where(valid, s, torch.tensor(-1e4, dtype=s.dtype)), -1)
        return (p[..., None] * torch.where(valid[..., None], v[:, jc, hh], 0.0)).sum(-2)
    return attend


def torch_fns(torch):
    F = torch.nn.functional
    return {
        "longformer_conditional": sliding_window_torch(torch),
        "longformer_split": sliding_window_torch(torch),
        "conv_guards": lambda x, w: F.conv2d(x, w, padding=1),
        "conv_pad_stage": lambda x, w: F.conv2d(F.pad(x, (1, 1, 1, 1)), w),
        "conv_guards_s2": lambda x, w: F.conv2d(x, w, stride=2, padding=1),
        "conv_pad_stage_s2": lambda x, w: F.conv2d(F.pad(x, (1, 1, 1, 1)), w, stride=2),
        "conv_guards_d2": lambda x, w: F.conv2d(x, w, padding=2, dilation=2),
        "conv_pad_stage_d2": lambda x, w: F.conv2d(F.pad(x, (2, 2, 2, 2)), w, dilation=2),
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


def measure(name, threads, timer, torch):
    work = next(ops[name] for ops in FORMULATIONS.values() if name in ops)("float32")
    y, xs = work.output, work.inputs
    head = tg.placeholder(y.shape, name="H")
    grads = tg.gradient(y, xs, head=head)
    t0 = time.perf_counter()
    fwd = tg.build([y], xs, threads=threads)
    bwd = tg.build(grads, xs + [head], threads=threads)
    build_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(x.shape).astype(np.float32) for x in xs]
    h = rng.standard_normal(y.shape).astype(np.float32)
    vjp = tg.build_vjp([y], xs, threads=threads)
    _, residuals = vjp.run_forward(*arrays)
    res_args = vjp.backward_arguments(residuals, arrays, [h])
    for got, want in zip(vjp.run_backward(residuals, arrays, [h]), bwd(*arrays, h) if len(xs) > 1 else [bwd(*arrays, h)]):
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    fns = {"tg_fwd": lambda: fwd(*arrays), "tg_bwd": lambda: bwd(*arrays, h), "tg_res": lambda: vjp.backward(*res_args)}
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
    args, torch, timer = script_options(argv, __doc__.split("\n\n")[0], FORMULATIONS, Timer(2, 10, 1.0))
    print(f"# formulations, {args.threads} threads, {cpu_name()}")
    print(f"{'op':24s} {'formulation':22s} {'tg fwd ms':>9s} {'tg bwd ms':>9s} {'tg res ms':>9s} {'fwd/best':>8s} "
          f"{'bwd/best':>8s} {'res/best':>8s} {'fwd/torch':>9s} {'res/torch':>9s} {'build s':>7s}")
    for op, names in FORMULATIONS.items():
        if args.ops and op not in args.ops:
            continue
        rows = {n: measure(n, args.threads, timer, torch) for n in names}
        best_f = min(r["tg_fwd"] for r in rows.values())
        best_b = min(r["tg_bwd"] for r in rows.values())
        best_r = min(r["tg_res"] for r in rows.values())
        for n, r in rows.items():
            tf = r["tg_fwd"] / r["torch_fwd"] if "torch_fwd" in r else math.nan
            tr = r["tg_res"] / r["torch_bwd"] if "torch_bwd" in r else math.nan
            print(f"{op:24s} {n:22s} {r['tg_fwd']:9.3f} {r['tg_bwd']:9.3f} {r['tg_res']:9.3f} "
                  f"{r['tg_fwd'] / best_f:8.2f} {r['tg_bwd'] / best_b:8.2f} {r['tg_res'] / best_r:8.2f} "
                  f"{tf:9.2f} {tr:9.2f} {r['build_s']:7.2f}", flush=True)


if __name__ == "__main__":
    main()
