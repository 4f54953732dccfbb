"""What translation validation costs: each reference op's gradient simplified with and without it.

    python benchmarks/validation_cost.py

Prints, per op, the time of ``tg.gradient`` (differentiation and simplification) with
every isl scan validated (the default) and with the check switched off, and the total.
"""
import time

import te_grad as tg
from simplify import validate
from te_grad.suite import SUITE


def timings(repeat: int = 3):
    out = {}
    for name in sorted(SUITE):
        best = float("inf")
        for _ in range(repeat):
            w = SUITE[name]("float32")
            t0 = time.perf_counter()
            tg.gradient(w.output, w.inputs)
            best = min(best, time.perf_counter() - t0)
        out[name] = best
    return out


def main():
    timings(1)  # warm up imports and caches
    on = timings()
    real = validate.check_nests
    validate.check_nests = lambda domain, nests: None
    try:
        off = timings()
    finally:
        validate.check_nests = real
    for name in sorted(on):
        print(f"{name:24s} {on[name] * 1e3:7.1f} ms   without validation {off[name] * 1e3:7.1f} ms")
    total_on, total_off = sum(on.values()), sum(off.values())
    print(f"total {total_on:.3f} s vs {total_off:.3f} s: validation adds {100 * (total_on / total_off - 1):.0f}%")


if __name__ == "__main__":
    main()
