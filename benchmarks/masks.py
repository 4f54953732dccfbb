"""Masked attention written with a full score matrix, against its banded form.

    python benchmarks/masks.py [--threads 2] [--quick]

A user writes causal or sliding-window attention the PyTorch way: the whole ``S x S`` score
matrix, then ``if_then_else(mask, s, -inf)`` and a softmax. te_grad carries the mask's zeros
across tensors (``simplify/zeros.py``), so the masked region is neither computed nor summed.
Each row compares, for ``H`` heads of ``S x dh`` float32 (forward kernel, then the backward
kernel of the three gradients from the inputs and a head; ms, and exact iterations of the
simplified kernels, ``tg.iterations``):

- ``full``: the full score matrix and the mask, as written;
- ``banded``: the same attention written over the band only, ``j = i - w`` for the ``w`` of
  the window (what a user who knows the mask's shape writes by hand);
- ``no carry``: the full form with the carrying of zeros switched off (every score computed);
- ``torch``: PyTorch eager, ``masked_fill(-inf)``, ``softmax`` and ``@``, forward and
  ``autograd.grad``.

The targets: the full form's iterations within 1.1x of the banded form's, its time within 1.3x.
"""
import contextlib
from unittest import mock

import numpy as np

import te_grad as tg
from te_grad.tools.benchmark import Timer, cpu_name, script_options

H, S, DH = 4, 256, 32
WINDOW = 16

OPS = {"causal": S, "band": WINDOW}


def _mask(kind, i, j):
    return j <= i if kind == "causal" else (j <= i) & (i - j < WINDOW)


def full_form(kind, q, k, v):
    d = tg.reduce_axis(DH, "d")
    sc = tg.compute((H, S, S), lambda h, i, j: tg.sum(q[h, i, d] * k[h, j, d], axis=d), name="scores")
    m = tg.compute((H, S, S), lambda h, i, j: tg.if_then_else(_mask(kind, i, j), sc[h, i, j], -np.inf),
                   name="masked")
    p = tg.nn.softmax(m, axis=2)
    e = tg.reduce_axis(S, "e")
    return tg.compute((H, S, DH), lambda h, i, c: tg.sum(p[h, i, e] * v[h, e, c], axis=e), name="out")


def banded_form(kind, q, k, v):
    w_n = OPS[kind]
    d = tg.reduce_axis(DH, "d")
    sc = tg.compute((H, S, w_n), lambda h, i, w: tg.if_then_else(
        i - w >= 0, tg.sum(q[h, i, d] * k[h, i - w, d], axis=d), -np.inf), name="scores")
    p = tg.nn.softmax(sc, axis=2)
    w = tg.reduce_axis(w_n, "w")
    return tg.compute((H, S, DH), lambda h, i, c: tg.sum(
        tg.if_then_else(i - w >= 0, p[h, i, w] * v[h, i - w, c], 0.0), axis=w), name="out")


@contextlib.contextmanager
def carry_off():
    """Simplification without the carrying of structural zeros."""
    with mock.patch("simplify.rewrite.carry_zeros", lambda *a, **k: {}):
        yield


def te_grad_fn(form, kind, threads, values, off=False):
    q, k, v = (tg.placeholder((H, S, DH), name=n) for n in "QKV")
    with carry_off() if off else contextlib.nullcontext():
        o = form(kind, q, k, v)
        head = tg.placeholder(o.shape, name="dO")
        grads = tg.gradient(o, [q, k, v], head=head)
        # the forward graph is the same either way: off the disk cache, or the other's kernel is found
        fwd = tg.build([o], [q, k, v], threads=threads, disk_cache=not off)
        bwd = tg.build(grads, [q, k, v, head], threads=threads, disk_cache=not off)
        iters = (tg.iterations(tg.simplify(o)), tg.iterations(tg.simplify(list(grads))))

    def run():
        out = fwd(*values[:3])
        return (out,) + tuple(bwd(*values))
    return run, iters


def torch_fn(torch, kind, values):
    q, k, v = (torch.from_numpy(x.copy()).requires_grad_() for x in values[:3])
    head = torch.from_numpy(values[3])
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    keep = (j <= i) if kind == "causal" else (j <= i) & (i - j < WINDOW)

    def run():
        s = (q @ k.transpose(1, 2)).masked_fill(~keep, float("-inf"))
        o = torch.softmax(s, dim=-1) @ v
        return (o,) + torch.autograd.grad(o, [q, k, v], head)
    return run


def main(argv=None):
    args, torch, timer = script_options(argv, __doc__.split("\n\n")[0], OPS, Timer(2, 10, 1.0))
    print(f"# masked attention, {H} heads x {S} x {DH} float32, window {WINDOW}, {args.threads} threads, "
          f"{cpu_name()}")
    print(f"{'mask':7s} {'full ms':>8s} {'banded':>8s} {'no carry':>8s} {'torch':>8s} {'full/band':>9s} "
          f"{'full/torch':>10s} {'iters full fwd, bwd':>22s} {'banded':>20s} {'no carry':>20s} "
          f"{'iter ratio':>10s}")
    rng = np.random.default_rng(0)
    values = [rng.standard_normal((H, S, DH)).astype(np.float32) for _ in range(4)]
    for kind in OPS:
        if args.ops and kind not in args.ops:
            continue
        (f_full, i_full), (f_band, i_band), (f_off, i_off) = (
            te_grad_fn(full_form, kind, args.threads, values), te_grad_fn(banded_form, kind, args.threads, values),
            te_grad_fn(full_form, kind, args.threads, values, off=True))
        want = f_off()
        for got in (f_full(), f_band()):
            for a, b in zip(got, want):
                np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
        fns = {"full": f_full, "band": f_band, "off": f_off}
        if torch is not None:
            fns["torch"] = torch_fn(torch, kind, values)
            for a, b in zip(fns["torch"](), want):
                np.testing.assert_allclose(a.detach().numpy(), b, rtol=1e-3, atol=1e-4)
        t = {key: r["ms"] for key, r in timer(fns).items()}
        tt = t.get("torch", float("nan"))
        ratio = (i_full[0] + i_full[1]) / (i_band[0] + i_band[1])
        print(f"{kind:7s} {t['full']:8.3f} {t['band']:8.3f} {t['off']:8.3f} {tt:8.3f} {t['full'] / t['band']:9.2f} "
              f"{t['full'] / tt:10.2f} {str(i_full):>22s} {str(i_band):>20s} {str(i_off):>20s} {ratio:10.2f}",
              flush=True)


if __name__ == "__main__":
    main()
