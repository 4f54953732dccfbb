"""Print raw vs simplified gradient iteration counts for the reference suite.

    python benchmarks/iterations.py [--ops dense,softmax,...]

For each op: exact innermost iterations of the forward, of the raw VJP and of
the simplified VJP (all float inputs), the cheap-gradient ratio
(simplified - total gradient size) / forward, and the time to differentiate
and simplify.
"""
import argparse
import sys
import time

import te_grad as tg
from te_grad.suite import SUITE, workload


def measure(name: str):
    w = workload(name)
    t0 = time.perf_counter()
    grads = tg.gradient(w.output, w.inputs)
    t_simplify = time.perf_counter() - t0
    raw = tg.gradient(w.output, w.inputs, simplify=False)
    fwd = tg.iterations(w.output)
    simp = tg.iterations(grads)
    size = sum(g.size for g in grads)
    return dict(op=name, forward=fwd, raw=tg.iterations(raw), simplified=simp,
                ratio=(simp - size) / fwd, seconds=t_simplify)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=",".join(SUITE), help="comma-separated op names")
    args = parser.parse_args(argv)
    header = f"{'op':<18}{'forward':>14}{'raw VJP':>22}{'simplified':>14}{'ratio':>8}{'raw/simpl.':>14}{'time s':>8}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    for name in args.ops.split(","):
        r = measure(name)
        worst = max(worst, r["ratio"])
        print(f"{r['op']:<18}{r['forward']:>14,}{r['raw']:>22,}{r['simplified']:>14,}{r['ratio']:>8.2f}"
              f"{r['raw'] / r['simplified']:>14.3g}{r['seconds']:>8.2f}", flush=True)
    print(f"\nworst cheap-gradient ratio: {worst:.2f} (promise: <= 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
