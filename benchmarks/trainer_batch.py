"""The digits CNN's training step with one kernel for every batch size against one per size.

    python benchmarks/trainer_batch.py [--steps 300] [--threads 1] [--batch 64]

Trains ``te_grad.train.digits.model()`` with Adam on scikit-learn's 8x8 digits (random
images when scikit-learn is missing) twice from the same weights and batches: with the
batch a size variable (``dynamic_batch=True``, one step kernel) and with exact kernels
(``dynamic_batch=False``, one per batch size: the full batch and the ragged last one).
Prints the build time of each, the median and mean ms per step over ``--steps`` steps
(after one warm-up epoch), the ratio symbolic / fixed and the largest relative difference
between the two loss curves.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import te_grad as tg  # noqa: E402
from te_grad import train  # noqa: E402
from te_grad.train import digits  # noqa: E402


def data():
    try:
        x, y, _, _ = digits.load(0)
    except tg.UserError:
        rng = np.random.default_rng(0)
        x = rng.random((1438, 1, 8, 8), dtype=np.float32)
        y = rng.integers(0, 10, len(x)).astype(np.int64)
    return x, y


def run(dynamic, x, y, steps, batch, threads):
    xp = tg.placeholder((batch, 1, 8, 8), name="x")
    yp = tg.placeholder((batch,), dtype="int64", name="y")
    trainer = train.Trainer(digits.model(), inputs=[xp], targets=[yp], loss=tg.nn.softmax_cross_entropy,
                            optimizer=train.Adam(lr=1e-2), init=train.xavier_uniform(seed=0), threads=threads,
                            progress=False, dynamic_batch=dynamic)
    build_s = trainer.compile(batch, len(x) % batch or batch)
    order = []
    epoch = 0
    while len(order) < steps + 30:
        order += digits.batches(len(x), batch, epoch, 0)
        epoch += 1
    for idx in order[:30]:  # warm-up
        trainer.update(x[idx], y[idx])
    times, losses = [], []
    for idx in order[30:30 + steps]:
        t0 = time.perf_counter()
        losses.append(trainer.update(x[idx], y[idx]))
        times.append(time.perf_counter() - t0)
    return build_s, np.array(times) * 1e3, np.array(losses), len(trainer.kernels)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    x, y = data()
    print(f"digits CNN, batch {args.batch} (ragged last batch {len(x) % args.batch}), {args.steps} steps, "
          f"{args.threads} thread(s)")
    results = {}
    for name, dynamic in (("symbolic", True), ("fixed", False)):
        build_s, ms, losses, kernels = run(dynamic, x, y, args.steps, args.batch, args.threads)
        results[name] = (ms, losses)
        print(f"{name:9s}: {kernels} step kernel(s) built in {build_s:.2f} s; {np.median(ms):.3f} ms per step "
              f"(median), {ms.mean():.3f} ms (mean)")
    (ms_s, l_s), (ms_f, l_f) = results["symbolic"], results["fixed"]
    print(f"symbolic / fixed: {np.median(ms_s) / np.median(ms_f):.2f} (median), {ms_s.mean() / ms_f.mean():.2f} (mean); "
          f"loss curves differ by at most {np.max(np.abs(l_s - l_f) / np.abs(l_f)):.1e} (relative)")


if __name__ == "__main__":
    main()
