"""Command line: ``python -m te_grad demo``."""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def demo(out=sys.stdout) -> int:
    """Differentiate a strided, padded conv2d, print its formulas and check the gradient."""
    import te_grad as tg
    from te_grad.testing import check_gradients

    def say(*args):
        print(*args, file=out)

    X = tg.placeholder((4, 32, 32, 32), name="X")
    W = tg.placeholder((32, 32, 3, 3), name="W")
    Y = tg.nn.conv2d(X, W, stride=2, padding=1)
    say("# a strided, padded conv2d written as an index formula")
    say(tg.show(Y))
    rng = np.random.default_rng(0)
    x = rng.standard_normal(X.shape).astype("float32")
    w = rng.standard_normal(W.shape).astype("float32")
    t0 = time.perf_counter()
    (y,) = tg.evaluate([Y], {X: x, W: w})
    say(f"\nevaluated with the numpy reference evaluator: output {y.shape} {y.dtype} "
        f"in {time.perf_counter() - t0:.3f} s, sum {float(y.sum()):.4f}")

    say("\n# its gradient (vector-Jacobian product), derived automatically and simplified by isl")
    t0 = time.perf_counter()
    dY = tg.placeholder(Y.shape, name="dY")
    res = tg.differentiate(Y, [X, W], head=dY)
    t_diff = time.perf_counter() - t0
    raw = tg.differentiate(Y, [X, W], head=dY, simplify=False)
    say(tg.show(res[0]).splitlines()[-1])
    fwd, n_raw, n_simp = tg.iterations(Y), tg.iterations(list(raw)), tg.iterations(list(res))
    say(f"\ninnermost iterations (exact): forward {fwd:,}; raw VJP {n_raw:,}; simplified {n_simp:,} "
        f"({n_simp / fwd:.2f}x the forward, {n_raw / n_simp:,.0f}x fewer than raw; "
        f"derived and simplified in {t_diff:.2f} s)")

    Xs = tg.placeholder((1, 2, 7, 7), dtype="float64", name="X")
    Ws = tg.placeholder((3, 2, 3, 3), dtype="float64", name="W")
    Ys = tg.nn.conv2d(Xs, Ws, stride=2, padding=1)
    feed = {Xs: rng.standard_normal(Xs.shape), Ws: rng.standard_normal(Ws.shape)}
    t0 = time.perf_counter()
    check_gradients(Ys, [Xs, Ws], feed, full_limit=0, directions=2)
    say(f"gradients of a small float64 instance match central finite differences "
        f"({time.perf_counter() - t0:.2f} s)")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m te_grad", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="differentiate a strided conv2d and check it")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo()
    return 2


if __name__ == "__main__":
    sys.exit(main())
