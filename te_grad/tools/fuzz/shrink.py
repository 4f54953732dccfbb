"""Shrinking: a failing program made smaller while it still fails the same way.

Programs come from choice sequences (:mod:`.program`), and smaller choices mean
simpler programs, so shrinking works on the sequence: cut its tail, delete
chunks, lower single choices; each candidate that still fails with the same
kind of outcome replaces the current one.
"""
from __future__ import annotations

import time
from typing import Callable, List

from .program import Program, from_choices


def shrink(program: Program, still_fails: Callable[[Program], bool], budget_s: float = 60.0,
           max_tries: int = 400) -> Program:
    """The smallest program found (by choice count, then choice sum) for which ``still_fails``."""
    best = list(program.choices)
    best_program = program
    deadline = time.monotonic() + budget_s
    tries = 0

    def attempt(candidate: List[int]) -> bool:
        nonlocal best, best_program, tries
        if tries >= max_tries or time.monotonic() > deadline:
            return False
        tries += 1
        p = from_choices(candidate)
        key = (len(p.choices), sum(p.choices))
        if key >= (len(best), sum(best)) or p.source == best_program.source:
            return False
        if still_fails(p):
            best, best_program = list(p.choices), p
            return True
        return False

    improved = True
    while improved and tries < max_tries and time.monotonic() < deadline:
        improved = False
        for size in (len(best) // 2, 16, 8, 4, 2, 1):  # delete chunks
            if size < 1:
                continue
            start = 0
            while start < len(best):
                if attempt(best[:start] + best[start + size:]):
                    improved = True
                else:
                    start += size
        k = 0
        while k < len(best):  # lower single choices
            for smaller in (0, best[k] // 2, best[k] - 1):
                if 0 <= smaller < best[k] and attempt(best[:k] + [smaller] + best[k + 1:]):
                    improved = True
                    break
            k += 1
    return best_program
