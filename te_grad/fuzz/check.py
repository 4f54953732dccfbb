"""Every stage of te_grad checked against the others on one random program.

The witnesses are independent: the raw vector-Jacobian product is checked
against float64 central finite differences of ``<head, output>``; the
simplified gradient (isl) against the raw one, both by the reference
evaluator; the compiled kernels (LLVM), forward and gradients, in float64 and
in float32, against the evaluator; and in float64 once more, built with every
operand copy made whatever its size and for a machine with tiny caches, so that
the copies and cache tiles that large operands get are exercised as well. :func:`check` returns the first disagreement
as an :class:`Outcome` (``kind`` says which witnesses disagree), or ``ok``.
"""
from __future__ import annotations

import traceback
import warnings
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np

from .. import dsl
from ..errors import InternalError, SimplificationWarning, UserError
from .program import Program

#: outcomes that are not failures
PASSING = ("ok", "fd-unstable")


@dataclass
class Outcome:
    kind: str                 # "ok", "fd-unstable", "mismatch-...", "internal-error", "user-error", "crash"
    detail: str = ""
    fallbacks: int = 0        # simplifications that fell back to a form correct by construction
    notes: List[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.kind not in PASSING


class _Mismatch(Exception):
    def __init__(self, kind, detail):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def _feed(ns, rng: np.random.Generator, dtype: str) -> Dict:
    feed = {x: rng.uniform(-1.0, 1.0, size=x.shape).astype(dtype) for x in ns["INPUTS"]}
    for ids, high in ns["IDS"].items():
        feed[ids] = rng.integers(0, high, size=ids.shape).astype(ids.dtype)
    return feed


def _close(got, want, rtol, what, kind, atol=0.0):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise _Mismatch(kind, f"{what}: shape {got.shape} vs {want.shape}")
    bad_nan = np.isnan(got) != np.isnan(want)
    if np.any(bad_nan):
        at = np.argwhere(bad_nan)[0]
        raise _Mismatch(kind, f"{what}: NaN in one only at {list(map(int, at))}: {got[tuple(at)]} vs "
                              f"{want[tuple(at)]}")
    finite = np.isfinite(want) & np.isfinite(got)
    if np.any(np.isinf(got) != np.isinf(want)) or np.any((np.isinf(got) & (got != want))):
        raise _Mismatch(kind, f"{what}: infinite values differ")
    scale = float(np.max(np.abs(want[finite]))) if np.any(finite) else 0.0
    err = np.where(finite, np.abs(got - want), 0.0)
    bound = atol + rtol * (scale + 1e-300)
    if np.any(err > bound):
        at = np.unravel_index(int(np.argmax(err - bound)), err.shape) if err.ndim else ()
        raise _Mismatch(kind, f"{what}: {float(got[at]):.12g} vs {float(want[at]):.12g} at "
                              f"{list(map(int, at))} (|error| {float(err[at]):.3g}, scale {scale:.3g})")


def _objective(out, head_value, feed):
    from ..evaluator import evaluate
    return float(np.sum(evaluate([out], feed)[0] * head_value))


def _fd_check(out, inputs, feed, head_value, grads, rng):
    """Raw gradients against central finite differences: elementwise for small inputs, and
    along two random directions. Returns "fd-unstable" when the differences themselves
    disagree between step sizes (a kink or a jump within a step: not te_grad's error)."""
    unstable = False
    for x, g in zip(inputs, grads):
        base = feed[x]
        directions = [rng.standard_normal(x.shape) for _ in range(2)]
        if x.size <= 12:
            for idx in np.ndindex(*x.shape):
                e = np.zeros(x.shape)
                e[idx] = 1.0
                directions.append(e)
        for v in directions:
            def fd(eps):
                plus, minus = dict(feed), dict(feed)
                plus[x], minus[x] = base + eps * v, base - eps * v
                return (_objective(out, head_value, plus) - _objective(out, head_value, minus)) / (2 * eps)
            want = fd(1e-6)
            got = float(np.sum(g * v))
            tol = 1e-6 + 1e-5 * (abs(want) + float(np.sum(np.abs(g * v))))
            if not np.isfinite(got) or abs(got - want) > tol:
                coarse, fine = fd(1e-5), fd(1e-7)
                if abs(coarse - want) > tol or abs(fine - want) > 10 * tol:
                    unstable = True
                    continue
                raise _Mismatch("mismatch-raw-fd", f"d<head, {out.name}>/d{x.name} along "
                                f"{'e' + str(list(np.argwhere(v)[0])) if np.count_nonzero(v) == 1 else 'a random direction'}: "
                                f"raw VJP gives {got:.12g}, finite differences {want:.12g}")
    return "fd-unstable" if unstable else "ok"


def check(program: Program, seed: int = 0, compile_: bool = True) -> Outcome:
    """Run every differential check on ``program`` (see the module docstring)."""
    import te_grad as tg
    rng = np.random.default_rng(seed)
    fallbacks = 0
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SimplificationWarning)
            ns = program.build("float64")
            out, inputs = ns["OUT"], ns["INPUTS"]
            ids = list(ns["IDS"])
            feed = _feed(ns, rng, "float64")
            head = dsl.placeholder(out.shape, dtype="float64", name="head")
            head_value = rng.standard_normal(out.shape)
            feed[head] = head_value
            y = tg.evaluate([out], feed)[0]
            if not np.all(np.isfinite(y)):
                raise _Mismatch("generator", "the forward value is not finite")
            raw = tg.differentiate(out, inputs, head=head, simplify=False)
            raw_values = tg.evaluate(list(raw), feed)
            status = _fd_check(out, inputs, feed, head_value, raw_values, rng)
            res = tg.differentiate(out, inputs, head=head)
            simp_values = tg.evaluate(list(res), feed)
            for x, r, s in zip(inputs, raw_values, simp_values):
                _close(s, r, 1e-9, f"simplified d{x.name} vs raw", "mismatch-simplified-raw", 1e-12)
            if compile_:
                order = inputs + ids + [head]
                kern = tg.build([out] + list(res), inputs=order)
                got = kern(*[feed[t] for t in order])
                got = got if isinstance(got, tuple) else (got,)
                _close(got[0], y, 1e-9, f"compiled {out.name} (float64) vs evaluator",
                       "mismatch-compiled-forward", 1e-12)
                for x, c, s in zip(inputs, got[1:], simp_values):
                    _close(c, s, 1e-8, f"compiled d{x.name} (float64) vs evaluator",
                           "mismatch-compiled-f64", 1e-12)
                got = _compiled_with_every_copy([out] + list(res), order, feed)
                _close(got[0], y, 1e-9, f"compiled {out.name} (every copy, small caches) vs evaluator",
                       "mismatch-compiled-forward", 1e-12)
                for x, c, s in zip(inputs, got[1:], simp_values):
                    _close(c, s, 1e-8, f"compiled d{x.name} (every copy, small caches) vs evaluator",
                           "mismatch-compiled-f64", 1e-12)
                _check_float32(program, feed, head_value, y, simp_values)
        fallbacks = sum(1 for w in caught if issubclass(w.category, SimplificationWarning))
        return Outcome(status, fallbacks=fallbacks)
    except _Mismatch as m:
        return Outcome(m.kind, m.detail, fallbacks)
    except InternalError:
        return Outcome("internal-error", traceback.format_exc(limit=-6), fallbacks)
    except UserError:
        return Outcome("user-error", traceback.format_exc(limit=-6), fallbacks)
    except Exception:  # noqa: BLE001 - a crash of any kind is what this looks for
        return Outcome("crash", traceback.format_exc(limit=-6), fallbacks)


#: a machine whose caches are small enough for the loops of small programs to be tiled
SMALL_CACHES = dict(vector_bits=512, vector_registers=32, l1_bytes=1024, l2_bytes=2048)


def _compiled_with_every_copy(outputs, order, feed):
    """The kernel's results when every operand copy is made whatever its size and the loops
    are tiled for tiny caches: the copies and tiles, made on large operands only by
    default, are then exercised on small random programs too."""
    import te_grad as tg
    from codegen import packing
    from codegen.machine import Machine
    with packing.using(packing.EVERY_COPY):
        kern = tg.build(outputs, inputs=order, machine=Machine(**SMALL_CACHES))
    got = kern(*[feed[t] for t in order])
    return got if isinstance(got, tuple) else (got,)


def _check_float32(program: Program, feed64, head_value, y64, grads64):
    """The same program in float32: compiled kernel against the float32 evaluator, both
    measured against the float64 values (a float32 result may be off by float32 rounding,
    but the kernel no more than ~20x the evaluator's own float32 error, plus a small floor)."""
    import te_grad as tg
    ns = program.build("float32")
    out, inputs = ns["OUT"], ns["INPUTS"]
    ids = list(ns["IDS"])
    head = dsl.placeholder(out.shape, dtype="float32", name="head")
    by_name = {t.name: v for t, v in feed64.items()}
    feed = {x: by_name[x.name].astype(np.float32) for x in inputs}
    feed.update({t: by_name[t.name] for t in ids})
    feed[head] = np.asarray(head_value, np.float32)
    res = tg.differentiate(out, inputs, head=head)
    want = tg.evaluate([out] + list(res), feed)
    order = inputs + ids + [head]
    got = tg.build([out] + list(res), inputs=order)(*[feed[t] for t in order])
    got = got if isinstance(got, tuple) else (got,)
    for name, c32, e32, ref in zip([out.name] + [f"d{x.name}" for x in inputs], got, want, [y64] + list(grads64)):
        ref = np.asarray(ref, np.float64)
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        err_c = np.abs(np.asarray(c32, np.float64) - ref)
        err_e = np.abs(np.asarray(e32, np.float64) - ref)
        bound = 2e-5 * (scale + 1.0) + 20 * err_e
        if np.any(~np.isfinite(err_c)) or np.any(err_c > bound):
            at = np.unravel_index(int(np.argmax(np.nan_to_num(err_c - bound, nan=np.inf))), err_c.shape) \
                if err_c.ndim else ()
            raise _Mismatch("mismatch-compiled-f32", f"compiled {name} (float32): {float(c32[at]):.8g}, "
                            f"float32 evaluator {float(e32[at]):.8g}, float64 {float(ref[at]):.12g} at "
                            f"{list(map(int, at))}")
