"""Register blocks' jam factors: the products the choice decides, each schedule side by side.

    python benchmarks/jams.py [--threads 1] [--rounds 40]
    git show a58c839:codegen/register_blocking.py > /tmp/register_blocking_before.py
    python benchmarks/jams.py --before /tmp/register_blocking_before.py --models encoder resnet_small

Without ``--models``: a linear layer ``(batch, 64, 128) @ (128, 512)`` with ``batch`` a size
variable, called at batch 16, built three times in this process and the calls interleaved
(medians of ``--rounds``): with the jam te_grad chooses (``codegen.register_blocking``),
with a vector load weighed as one broadcast (``VECTOR_LOAD_COST = 1``), and with the jam of
``--before`` (a ``register_blocking.py`` of another version; default: the greedy choice this
version keeps for rows of one register, which is what earlier versions chose on a run-time
split loop); then the same product reading ``W`` as it lies (no copy in panels,
``panels.NO_PANELS``) against a copy packed in panels of 16 columns given as input, and
PyTorch's ``matmul``. Printed: ms and GFLOP/s.

``--models``: the training steps of :mod:`import_models`'s models (SGD with momentum), built
with the jam chosen now and with ``--before``'s, their steps interleaved with eager PyTorch's
(medians of ``--rounds``): ms and the ratios.
"""
import argparse
import importlib.util
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import codegen  # noqa: E402
import codegen.register_blocking as rb  # noqa: E402
import te_grad as tg  # noqa: E402
from codegen.loopir import RegisterBlocked, loops  # noqa: E402


def before_choice(path):
    """``_jam_choices`` of another version's module at ``path``, or this version's greedy
    choice (the one it keeps for rows of one register)."""
    if path is None:
        chosen = rb._jam_choices
        return lambda outer, bounds, store, par, axes, most, row=None, inner=None: \
            chosen(outer, bounds, store, par, axes, most, min(row, 1) if row else row, inner)
    spec = importlib.util.spec_from_file_location("codegen._register_blocking_before", path)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    return lambda outer, bounds, store, par, axes, most, row=None, inner=None: \
        old._jam_choices(outer, bounds, store, par, axes, most, row)


def built(make, choice=None, cost=None):
    """``make()``'s result built with ``choice`` as ``_jam_choices`` and ``cost`` as
    ``VECTOR_LOAD_COST`` (both restored after)."""
    keep = rb._jam_choices, rb.VECTOR_LOAD_COST
    rb._jam_choices = choice or keep[0]
    rb.VECTOR_LOAD_COST = cost or keep[1]
    try:
        with codegen.compile_options(disk_cache=False, jit_cache=0):
            return make()
    finally:
        rb._jam_choices, rb.VECTOR_LOAD_COST = keep


def interleaved(runs, rounds):
    for f in runs.values():
        for _ in range(3):
            f()
    times = {k: [] for k in runs}
    order = list(runs.items())
    for r in range(rounds):  # each round starts at the next variant: none always follows the same one
        for k, f in order[r % len(order):] + order[:r % len(order)]:
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: float(np.median(v)) for k, v in times.items()}


def jams_of(kern, t):
    return [[(j.var.name, j.factor) for j in lp.kind.jams] for s in kern.stages if s.stage.tensor is t
            for lp in loops(s.stage.body) if isinstance(lp.kind, RegisterBlocked)]


def linear(args):
    m, k_, n, batch = 64, 128, 512, 16
    b = tg.var("batch", min=1)
    x = tg.placeholder((b, m, k_), name="X")
    w = tg.placeholder((k_, n), name="W")
    k = tg.reduce_axis(k_, "k")
    y = tg.compute((b, m, n), lambda i, j, l: tg.sum(x[i, j, k] * w[k, l], axis=k), name="Y")
    kernels = {"chosen": built(lambda: tg.build([y], [x, w], threads=args.threads)),
               "vector load = 1 broadcast": built(lambda: tg.build([y], [x, w], threads=args.threads), cost=1),
               "before": built(lambda: tg.build([y], [x, w], threads=args.threads), before_choice(args.before))}
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((batch, m, k_)).astype(np.float32)
    wv = rng.standard_normal((k_, n)).astype(np.float32)
    want = xv @ wv
    for name, kern in kernels.items():
        np.testing.assert_allclose(kern(xv, wv), want, rtol=1e-4, atol=1e-3)
        print(f"{name:28s} jams {jams_of(kern, y)}")
    rows = batch * m
    x2 = tg.placeholder((rows, k_), name="X2")
    p = tg.placeholder((n // 16, k_, 16), name="P")
    k2, k3 = tg.reduce_axis(k_, "k"), tg.reduce_axis(k_, "k")
    plain = tg.compute((rows, n), lambda i, l: tg.sum(x2[i, k2] * w[k2, l], axis=k2), name="plain")
    panel = tg.compute((rows, n // 16, 16), lambda i, lb, li: tg.sum(x2[i, k3] * p[lb, k3, li], axis=k3), name="panel")
    from panels import NO_PANELS  # W as it lies: te_grad would copy it in panels itself
    with codegen.compile_options(thresholds=NO_PANELS):
        kp = built(lambda: tg.build([plain], [x2, w], threads=args.threads))
    kq = built(lambda: tg.build([panel], [x2, p], threads=args.threads))
    x2v = xv.reshape(rows, k_)
    pv = np.ascontiguousarray(wv.reshape(k_, n // 16, 16).transpose(1, 0, 2))
    np.testing.assert_allclose(kq(x2v, pv).reshape(rows, n), want.reshape(rows, n), rtol=1e-4, atol=1e-3)
    runs = {name: (lambda kern=kern: kern(xv, wv)) for name, kern in kernels.items()}
    runs["W as it lies (2-D)"] = lambda: kp(x2v, wv)
    runs["W packed in panels of 16"] = lambda: kq(x2v, pv)
    try:
        import torch
        torch.set_num_threads(args.threads)
        xt, wt = torch.from_numpy(x2v), torch.from_numpy(wv)
        runs["PyTorch matmul"] = lambda: xt @ wt
    except ImportError:
        pass
    flops = 2 * rows * k_ * n
    for name, s in interleaved(runs, args.rounds).items():
        print(f"{name:28s} {s * 1e3:8.3f} ms {flops / s / 1e9:7.1f} GFLOP/s")


def compare_models(names, threads, rounds, variants, eager=True):
    """The training steps of :mod:`import_models`'s models ``names`` (SGD with momentum), each
    built by every ``variants[name](make)`` (``make()`` compiles the trainer), their steps
    interleaved with eager PyTorch's unless not ``eager`` (medians of ``rounds``): ms and each
    variant's ratio to the first and to eager."""
    import torch
    import torch.nn.functional as F

    import te_grad.torch as tgt
    from import_models import models as all_models
    from te_grad import train
    torch.set_num_threads(threads)
    for name in names:
        make, inputs, labels, batch = all_models()[name]
        torch.manual_seed(0)
        net = make()
        xs, ys = inputs(batch), labels(batch)
        model = tgt.import_model(net, xs)

        def trainer():
            yp = tg.placeholder(tuple(ys.shape), dtype="int64", name="y")
            tr = train.Trainer(model, inputs=model.input_placeholders(), targets=[yp],
                               loss=tg.nn.softmax_cross_entropy, optimizer=train.SGD(lr=0.01, momentum=0.9),
                               threads=threads, progress=False)
            tr.compile()
            return tr
        built_ = {k: build(trainer) for k, build in variants.items()}
        batch_args = [x.numpy() for x in xs] + [ys.numpy()]
        twin = make()
        twin.load_state_dict(net.state_dict())
        opt = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)

        def eager_step():
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(twin(*xs), ys).backward()
            opt.step()
        runs = {k: (lambda tr=tr: tr.update(*batch_args)) for k, tr in built_.items()}
        med = interleaved({**runs, "eager": eager_step} if eager else runs, rounds)
        first = next(iter(variants))
        parts = [f"{k} {med[k] * 1e3:.2f} ms" for k in med]
        ratios = [f"{k} / {first} {med[k] / med[first]:.3f}" for k in variants if k != first] + \
            [f"{k} / eager {med[k] / med['eager']:.2f}" for k in variants if eager]
        print(f"{name} threads={threads}: {', '.join(parts)} | {', '.join(ratios)}", flush=True)


def models(args):
    compare_models(args.models, args.threads, args.rounds,
                   {"before": lambda make: built(make, before_choice(args.before)), "after": built})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--before", help="a register_blocking.py whose _jam_choices is the 'before' schedule")
    ap.add_argument("--models", nargs="+", help="import_models.py's models to train with both schedules")
    args = ap.parse_args()
    if args.models:
        models(args)
    else:
        linear(args)


if __name__ == "__main__":
    main()
