"""Differential random-program testing of every te_grad stage.

``python -m te_grad fuzz --programs N --seed S`` generates ``N`` random valid programs
(:mod:`.program`), runs every check on each (:mod:`.check`: raw gradients against
finite differences, simplified against raw, compiled float64 and float32 against the
evaluator; second order through the simplified gradients' scatters against finite
differences of the first order; ``out=`` overlapping an input or another output refused;
reads out of bounds under data conditions refused by the kernel wherever the evaluator
refuses them), prints the count of each outcome and of the programs that exercised each
construct, and prints every failing program,
shrunk (:mod:`.shrink`), as a script that reproduces it. ``tests/tools/test_fuzz.py`` runs a
fixed budget of programs through hypothesis, which shrinks failures the same way.

``python -m te_grad fuzz --torch --programs N --seed S`` fuzzes the PyTorch importer instead
(:mod:`.torch_models` generates, :mod:`.torch_check` checks: the only modules here that import
torch, lazily): random small ``torch.nn.Module`` s (DAGs with residual adds of Linear,
Conv2d, batch and layer norms, activations, pools, broadcasting arithmetic, softmax, views,
slices, cat / chunk / split, matmul, reductions, attention, Embedding), in float32 or float64, with or without a dynamic
batch, imported with ``te_grad.torch.import_model`` and checked against PyTorch: the forward
in both modes, parameter gradients by the evaluator and compiled, one Trainer SGD step
(weights and batch norm statistics); with ``--dynamo``, each module also through
``torch.compile`` with te_grad's backend at two batch sizes. Operators te_grad refuses are
counted by name; every failure is printed as a script rebuilding the module from its seed.
``tests/tools/test_fuzz_import.py`` runs a fixed budget.
"""
from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Dict, List, Optional, TextIO

from .check import PASSING, Outcome, check
from .program import Program, from_choices, from_seed, generate
from .shrink import shrink

__all__ = ["Program", "Outcome", "PASSING", "check", "generate", "from_seed", "from_choices", "shrink", "run",
           "script", "programs"]


def script(program: Program, outcome: Outcome, seed: int) -> str:
    """A self-contained Python script that reruns ``program``'s checks."""
    detail = "\n".join("# " + line for line in outcome.detail.strip().splitlines()[-12:])
    return (f"# te_grad fuzz: {outcome.kind}\n{detail}\n"
            "from te_grad.tools.fuzz import Program, check\n\n"
            f"source = '''\n{program.source}'''\n"
            f"print(check(Program(source), seed={seed}))\n")


def _one(index: int, seed: int, compile_: bool):
    program = from_seed(seed * 1_000_003 + index)
    return index, program, check(program, seed=index, compile_=compile_)


def run(programs: int, seed: int = 0, out: Optional[TextIO] = None, compile_: bool = True,
        shrink_failures: bool = True, jobs: int = 1, progress_every: int = 100) -> Dict[str, int]:
    """Check ``programs`` random programs; print counts and failing scripts; return the counts."""
    out = sys.stdout if out is None else out
    counts: Counter = Counter()
    failures: List[tuple] = []
    fallbacks = 0
    constructs: Counter = Counter()
    start = time.monotonic()

    def record(index, program, outcome):
        nonlocal fallbacks
        counts[outcome.kind] += 1
        fallbacks += outcome.fallbacks
        constructs.update(set(outcome.notes))
        if outcome.failed:
            failures.append((index, program, outcome))
        done = sum(counts.values())
        if progress_every and done % progress_every == 0:
            elapsed = time.monotonic() - start
            print(f"[{done}/{programs}] {elapsed:.0f} s, " + ", ".join(f"{k}: {v}" for k, v in
                                                                   sorted(counts.items())), file=out, flush=True)

    if jobs > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(jobs) as pool:
            for result in pool.imap_unordered(_star, [(i, seed, compile_) for i in range(programs)], chunksize=4):
                record(*result)
    else:
        for i in range(programs):
            record(*_one(i, seed, compile_))
    elapsed = time.monotonic() - start
    print(f"\n{programs} programs (seed {seed}) in {elapsed:.0f} s", file=out)
    for kind in sorted(counts):
        print(f"  {kind:28s} {counts[kind]}", file=out)
    print(f"  simplifications that fell back (exact, not failures): {fallbacks}", file=out)
    for note in sorted(constructs):
        print(f"  programs with {note}: {constructs[note]}", file=out)
    for index, program, outcome in sorted(failures, key=lambda f: f[0]):
        if shrink_failures:
            program = shrink(program, lambda p: check(p, seed=index, compile_=compile_).kind == outcome.kind)
            outcome = check(program, seed=index, compile_=compile_)
        print(f"\n# --- program {index} ---\n{script(program, outcome, index)}", file=out)
    return dict(counts)


def _star(args):
    return _one(*args)


def programs():
    """A hypothesis strategy of random valid programs (hypothesis shrinks them choice by choice)."""
    from hypothesis import strategies as st

    @st.composite
    def strategy(draw):
        return generate(lambda n: draw(st.integers(0, n - 1)))

    return strategy()
