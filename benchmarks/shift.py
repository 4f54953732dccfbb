"""Softmax, log-softmax and logsumexp with the max shift written by hand, without stop_gradient.

    python benchmarks/shift.py [--threads 2] [--quick]

``m = max(x)``, ``exp(x - m)`` and the normalization written as stages, as a user writes them:
te_grad proves the shift's gradient zero (``te_grad.autodiff.shift``) and drops it. Each row
times forward + backward (the forward kernel, then the backward kernel from the inputs and a
head, ms) of the hand-written form, of the same form with the rule switched off (the max
differentiated: a tie count and extra passes), of ``tg.nn.softmax`` / ``tg.nn.log_softmax``
(the shift under ``stop_gradient``) and of PyTorch eager (``torch.softmax`` etc., forward and
``autograd.grad``), on 1024 x 1000 float32 rows, in one process at the same thread count.
"""
import contextlib
from unittest import mock

import numpy as np

import te_grad as tg
from te_grad.tools.benchmark import Timer, cpu_name, script_options

ROWS, COLS = 1024, 1000


def _max(x):
    k = tg.reduce_axis(COLS, "k")
    return tg.compute((ROWS,), lambda i: tg.max(x[i, k], axis=k), name="m")


def _sum_exp(x, m):
    k = tg.reduce_axis(COLS, "k2")
    return tg.compute((ROWS,), lambda i: tg.sum(tg.exp(x[i, k] - m[i]), axis=k), name="s")


def hand_softmax(x):
    m = _max(x)
    e = tg.compute(x.shape, lambda i, j: tg.exp(x[i, j] - m[i]), name="e")
    k = tg.reduce_axis(COLS, "k2")
    s = tg.compute((ROWS,), lambda i: tg.sum(e[i, k], axis=k), name="s")
    return tg.compute(x.shape, lambda i, j: e[i, j] / s[i], name="y")


def hand_log_softmax(x):
    m = _max(x)
    s = _sum_exp(x, m)
    return tg.compute(x.shape, lambda i, j: x[i, j] - m[i] - tg.log(s[i]), name="y")


def hand_logsumexp(x):
    m = _max(x)
    s = _sum_exp(x, m)
    return tg.compute((ROWS,), lambda i: m[i] + tg.log(s[i]), name="y")


def lib_logsumexp(x):
    # log(sum(exp(log_softmax))) is 0: logsumexp = x - log_softmax at any one column
    ls = tg.nn.log_softmax(x)
    return tg.compute((ROWS,), lambda i: x[i, 0] - ls[i, 0], name="y")


OPS = {
    "softmax": (hand_softmax, tg.nn.softmax, lambda t, x: t.softmax(x, -1)),
    "log_softmax": (hand_log_softmax, tg.nn.log_softmax, lambda t, x: t.log_softmax(x, -1)),
    "logsumexp": (hand_logsumexp, lib_logsumexp, lambda t, x: t.logsumexp(x, -1)),
}


@contextlib.contextmanager
def rule_off():
    """The VJP without the cancelled-shift rule: the max is differentiated."""
    with mock.patch("te_grad.autodiff.cancelled_shifts", lambda *a, **k: set()):
        yield


def te_grad_fn(build, threads, xv, hv, off=False):
    x = tg.placeholder((ROWS, COLS), name="X")
    with rule_off() if off else contextlib.nullcontext():
        y = build(x)
        h = tg.placeholder(y.shape, name="H")
        (g,) = tg.gradient(y, [x], head=h)
    fwd = tg.build([y], [x], threads=threads)
    bwd = tg.build([g], [x, h], threads=threads)
    hv = hv if y.ndim == 2 else hv[:, 0].copy()

    def run():
        fwd(xv)
        return bwd(xv, hv)
    return run, tg.iterations(g)


def main(argv=None):
    args, torch, timer = script_options(argv, __doc__.split("\n\n")[0], OPS, Timer(2, 10, 1.0))
    print(f"# hand-written max shift, {ROWS}x{COLS} float32, {args.threads} threads, {cpu_name()}")
    print(f"{'op':12s} {'hand ms':>8s} {'rule off':>8s} {'tg.nn ms':>8s} {'torch ms':>8s} {'hand/nn':>8s} "
          f"{'off/nn':>7s} {'hand/torch':>10s} {'iters hand':>11s} {'off':>9s} {'nn':>9s}")
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    hv = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    for op, (hand, lib, tfn) in OPS.items():
        if args.ops and op not in args.ops:
            continue
        (g_hand, i_hand), (g_off, i_off), (g_lib, i_lib) = (
            te_grad_fn(hand, args.threads, xv, hv), te_grad_fn(hand, args.threads, xv, hv, off=True),
            te_grad_fn(lib, args.threads, xv, hv))
        np.testing.assert_allclose(g_hand(), g_lib(), rtol=1e-3, atol=1e-5)
        fns = {"hand": g_hand, "off": g_off, "lib": g_lib}
        if torch is not None:
            tx = torch.from_numpy(xv.copy()).requires_grad_()
            th = torch.from_numpy(hv if op != "logsumexp" else hv[:, 0].copy())

            def torch_run(tx=tx, th=th, tfn=tfn):
                return torch.autograd.grad(tfn(torch, tx), [tx], th)
            np.testing.assert_allclose(g_hand(), torch_run()[0].numpy(), rtol=1e-3, atol=1e-5)
            fns["torch"] = torch_run
        t = {k: v["ms"] for k, v in timer(fns).items()}
        tt = t.get("torch", float("nan"))
        print(f"{op:12s} {t['hand']:8.3f} {t['off']:8.3f} {t['lib']:8.3f} {tt:8.3f} {t['hand'] / t['lib']:8.2f} "
              f"{t['off'] / t['lib']:7.2f} {t['hand'] / tt:10.2f} {i_hand:11d} {i_off:9d} {i_lib:9d}", flush=True)


if __name__ == "__main__":
    main()
