"""Where the thread team cuts a shared run: the chunks of this version against another's.

    git show fd496b6:codegen/team_ir.py > /tmp/team_ir_before.py
    python benchmarks/team_chunks.py --before /tmp/team_ir_before.py [--models encoder resnet_small]
        [--threads 2] [--rounds 40] [--no-eager]

A shared run's parallel range is cut into one chunk per thread at multiples of its stages'
block size (``codegen.regions.chunk_bounds``). The training steps of :mod:`import_models`'s
models (SGD with momentum) run on two thread teams in this process: one made from this
version's ``codegen/team_ir.py``, one from ``--before``'s (the team's native runtime, which
computes the chunk bounds). The kernels are the same; each step runs on one team or the
other, interleaved with eager PyTorch's step at the same thread count (medians of
``--rounds``). Printed: ms and the ratios.
"""
import argparse
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import codegen.team as team_module  # noqa: E402
from jams import compare_models  # noqa: E402


def team_from(path: str, threads: int):
    """A thread team whose native runtime is made by the ``team_ir.py`` at ``path``."""
    spec = importlib.util.spec_from_file_location("codegen._team_ir_before", path)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    keep = team_module.team_ir
    team_module.team_ir = old
    try:
        crew = team_module.Team()
        crew.reserve(threads)
    finally:
        team_module.team_ir = keep
    return crew


class OnTeam:
    """A trainer whose steps run on ``crew`` (the process's team while it runs)."""

    def __init__(self, trainer, crew):
        self.trainer, self.crew = trainer, crew

    def update(self, *batch):
        team_module._team = self.crew
        self.trainer.update(*batch)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the team_ir.py of the version to compare with")
    ap.add_argument("--models", nargs="+", default=["encoder", "resnet_small"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--no-eager", action="store_true",
                    help="the two teams alone (eager PyTorch's threads, spinning after its step, slow "
                         "whichever team runs next)")
    args = ap.parse_args()
    now = team_module.team(args.threads)
    before = team_from(args.before, args.threads)
    compare_models(args.models, args.threads, args.rounds,
                   {"before": lambda make: OnTeam(make(), before), "after": lambda make: OnTeam(make(), now)},
                   eager=not args.no_eager)


if __name__ == "__main__":
    main()
