"""Identity copies read through (``simplify.inline``): imported models' training steps built
with the rule and without it, side by side.

    python benchmarks/identity_copies.py --models encoder --threads 1
    python benchmarks/identity_copies.py --models encoder --threads 2 --no-eager

Both steps are built in this process (the rule switched off for the second by replacing
``simplify.inline._forwardable``), their updates interleaved with eager PyTorch's
(:func:`jams.compare_models`, medians of ``--rounds``). ``--no-eager`` leaves eager out: at 2
threads on a machine with no spare core, PyTorch's threads spin after each step and take
te_grad's core.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import simplify.inline as inline  # noqa: E402
from jams import built, compare_models  # noqa: E402


def kept(make):
    """``make()`` built with every identity copy kept as a stage of its own."""
    rule = inline._forwardable
    inline._forwardable = lambda p, reads: False
    try:
        return built(make)
    finally:
        inline._forwardable = rule


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["encoder"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--no-eager", action="store_true")
    args = ap.parse_args()
    for threads in args.threads:
        compare_models(args.models, threads, args.rounds, {"read through": built, "kept": kept},
                       eager=not args.no_eager)


if __name__ == "__main__":
    main()
