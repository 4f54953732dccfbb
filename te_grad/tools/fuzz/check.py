"""Every stage of te_grad checked against the others on one random program.

The witnesses are independent: the raw vector-Jacobian product is checked
against float64 central finite differences of ``<head, output>``; the
simplified gradient (isl) against the raw one, both by the reference
evaluator; the compiled kernels (LLVM), forward and gradients, in float64 and
in float32, against the evaluator; and in float64 once more, built with every
operand copy made whatever its size and for a machine with tiny caches, so that
the copies and cache tiles that large operands get are exercised as well. Every kernel is
built with its intermediates poisoned (NaN when allocated, the compile option ``poison``), so a
tensor written only where its readers use it (:mod:`simplify.unread`) shows any read outside.

Second order (programs with ``SECOND``): ``D = <V, g>`` over the simplified first-order
gradients ``g``, differentiated again; the raw second order against central differences
of ``<V, raw g>``, the simplified against the raw, the compiled against the evaluator.
Every compiled kernel is also called with ``out=`` naming an input, a view overlapping an
input in part, and one array for two outputs: each must be refused. An invalid program
(``INVALID``: a read out of bounds under a condition on data) must be refused by the
kernel wherever the evaluator refuses it, and computed alike where the data never take
the read. :func:`check` returns the first disagreement as an :class:`Outcome` (``kind``
says which witnesses disagree), or ``ok`` / ``rejected``; ``notes`` name the constructs
the program exercised.
"""
from __future__ import annotations

import traceback
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np

from ... import dsl
from ...errors import InternalError, SimplificationWarning, UserError
from ...graph import topo_order
from ... import ops
from ... import dtypes
from ...ir import ComputeOp, Read, Reduce, ScatterOp, Select
from .program import Program

#: outcomes that are not failures ("rejected": an invalid program that every stage refused)
PASSING = ("ok", "fd-unstable", "rejected")


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


def _feed(ns, rng: np.random.Generator, dtype: str, sizes=None) -> Dict:
    from ...sizes import concrete_shape
    feed = {x: rng.uniform(-1.0, 1.0, size=concrete_shape(x.shape, sizes or {})).astype(dtype)
            for x in ns["INPUTS"]}
    for ids, high in ns["IDS"].items():
        feed[ids] = rng.integers(0, high, size=ids.shape).astype(ids.dtype)
    for rowptr in ns.get("ROWPTRS", ()):  # a CSR row pointer: sorted ids in [0, E]
        feed[rowptr] = np.sort(feed[rowptr])
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
    from ...evaluator import evaluate
    return float(np.sum(evaluate([out], feed)[0] * head_value))


def _directions(x, rng, units_up_to: int):
    """Two random directions in the space of ``x`` (a tensor of fixed shape, or an array),
    and every unit vector when ``x`` has at most ``units_up_to`` elements."""
    directions = [rng.standard_normal(x.shape) for _ in range(2)]
    if x.size <= units_up_to:
        for idx in np.ndindex(*x.shape):
            e = np.zeros(x.shape)
            e[idx] = 1.0
            directions.append(e)
    return directions


def _fd_check(out, inputs, feed, head_value, grads, rng):
    """Raw gradients against central finite differences: elementwise for small inputs, and
    along two random directions. Returns "fd-unstable" when the differences themselves
    disagree between step sizes (a kink or a jump within a step: not te_grad's error)."""
    unstable = False
    for x, g in zip(inputs, grads):
        base = feed[x]
        for v in _directions(base, rng, units_up_to=12):
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
    notes: List[str] = []
    from codegen.options import compile_options
    try:
        # poisoned intermediates: a point of a tensor written only on its region
        # (simplify.unread) that some stage still reads shows as NaN in the outputs
        with warnings.catch_warnings(record=True) as caught, compile_options(poison=True):
            warnings.simplefilter("always", SimplificationWarning)
            ns = program.build("float64")
            out, inputs = ns["OUT"], ns["INPUTS"]
            ids = list(ns["IDS"])
            if ns.get("SIZE") is not None:
                status = _check_sized(ns, rng, compile_)
                fallbacks = sum(1 for w in caught if issubclass(w.category, SimplificationWarning))
                return Outcome(status, fallbacks=fallbacks, notes=["a size variable"] + (
                    ["a product over a run-time extent"] if ns.get("SIZED_PRODUCT") else []))
            feed = _feed(ns, rng, "float64")
            head = dsl.placeholder(out.shape, dtype="float64", name="head")
            head_value = rng.standard_normal(out.shape)
            feed[head] = head_value
            if ns.get("INVALID") is not None:
                return Outcome(_check_refused(out, inputs, ids, head, feed, compile_),
                               notes=["a read out of bounds under a data condition"])

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
                # half the programs (by their text) on the narrow machine
                narrow = zlib.crc32(program.source.encode()) % 2 == 1
                every = _built_with_every_copy([out] + list(res), order, narrow)
                got = every(*[feed[t] for t in order])
                got = got if isinstance(got, tuple) else (got,)
                _close(got[0], y, 1e-9, f"compiled {out.name} (every copy, small caches) vs evaluator",
                       "mismatch-compiled-forward", 1e-12)
                for x, c, s in zip(inputs, got[1:], simp_values):
                    _close(c, s, 1e-8, f"compiled d{x.name} (every copy, small caches) vs evaluator",
                           "mismatch-compiled-f64", 1e-12)
                _check_float32(program, feed, head_value, y, simp_values)
                if _check_aliasing(kern, order, feed):
                    notes.append("out= aliasing refused")
                # an identity copy of the program that the kernel has no stage for: read through
                from simplify.inline import identity_copy
                copies = {t.name for t in topo_order([out]) if identity_copy(t)}
                if copies - {cs.stage.tensor.name for cs in kern.stages}:
                    notes.append("an identity copy read through (simplify.inline)")
                # by the stages' names: the loop text (Kernel.loops) prints a shared subexpression
                # once per use, exponential in a DAG's depth
                if any(cs.stage.tensor.name.endswith("_panels") for cs in every.stages):
                    notes.append("an operand copied in panels (codegen.packing)")
            if ns.get("SECOND"):
                status = _worse(status, _second_order(out, inputs, ids, head, feed, res, rng, compile_))
                notes.append("second order")
                if any(isinstance(t.op, ScatterOp) for t in topo_order(list(res))):
                    notes.append("second order through a scatter")
        if any(isinstance(e, Reduce) and ops.reduction(e.combiner).indexed
               for t in topo_order([out]) if isinstance(t.op, ComputeOp) for e in _nodes(t.op.body)):
            notes.append("an argmax / argmin index")
        if _pins_an_output_by_data(out):
            notes.append("a where pinning an output index by data (a COO scatter)")
        if _conditional_index(out):
            notes.append("a conditional index (if_then_else inside an index)")
        if "XM" in ns:
            notes.append("a causal or band mask (zeros carried across tensors)")
        from simplify.unread import written_regions
        if written_regions([out] + list(res)):
            notes.append("a tensor written only where it is read (simplify.unread)")
        if "XS" in ns:
            notes.append("a subexpression shared level after level (a DAG)")
        fallbacks = sum(1 for w in caught if issubclass(w.category, SimplificationWarning))
        return Outcome(status, fallbacks=fallbacks, notes=notes)
    except _Mismatch as m:
        return Outcome(m.kind, m.detail, fallbacks)
    except InternalError:
        return Outcome("internal-error", traceback.format_exc(limit=-6), fallbacks)
    except UserError:
        return Outcome("user-error", traceback.format_exc(limit=-6), fallbacks)
    except Exception:  # noqa: BLE001 - a crash of any kind is what this looks for
        return Outcome("crash", traceback.format_exc(limit=-6), fallbacks)


def _out_of_bounds(e: UserError) -> bool:
    text = str(e)
    return any(w in text for w in ("bound", "outside", "out of range", "leave"))


def _refused(run):
    """``(True, None)`` if ``run`` refused with an out-of-bounds UserError, else ``(False,
    its result)``; any other error is a failure."""
    try:
        return False, run()
    except UserError as e:
        if _out_of_bounds(e):
            return True, None
        raise _Mismatch("invalid-accepted", f"refused for another reason: {e}") from None


def _check_refused(out, inputs, ids, head, feed, compile_) -> str:
    """A program with a read that leaves its tensor at some point of the domain, under a
    condition on data. Where the read is taken, the evaluator refuses the program; then the
    compiler (statically) or the kernel (at run time) must refuse it too: a kernel never
    reads outside a buffer. Where the data never take it, the evaluator computes values,
    and the kernel gives the same ones (or the compiler refused the read statically).
    Forward and gradient alike. Returns "rejected" or "ok"."""
    import te_grad as tg
    order = inputs + ids + [head]
    grad_refused, res = _refused(lambda: tg.differentiate(out, inputs, head=head))  # the bounds proof
    rejected = grad_refused
    for what, tensors in (("forward", [out]), ("gradient", [] if grad_refused else list(res))):
        if not tensors:
            continue
        refused, want = _refused(lambda: tg.evaluate(tensors, feed))
        if not compile_:
            rejected |= refused
            continue
        kernel_refused, got = _refused(lambda: tg.build(tensors, inputs=order)(*[feed[t] for t in order]))
        if refused and not kernel_refused:
            raise _Mismatch("invalid-accepted", f"the compiled {what} read out of bounds where the "
                                                f"evaluator refused the read")
        if not kernel_refused:
            got = got if isinstance(got, tuple) else (got,)
            for t, g, w in zip(tensors, got, want):
                _close(g, w, 1e-8, f"compiled {t.name} vs evaluator (a read out of bounds never "
                                   f"taken)", "mismatch-compiled-f64", 1e-12)
        rejected |= refused or kernel_refused
    return "rejected" if rejected else "ok"


def _check_sized(ns, rng, compile_) -> str:
    """A program with a size variable: differentiated once (symbolic), then at each of its
    sizes the raw gradient against finite differences, the simplified against the raw, and
    the kernels of the graph specialized there, and the one symbolic kernel built for every
    size (also built with every copy and tiny caches, so that copies and cache tiles over
    run-time extents are made), against the evaluator."""
    import te_grad as tg
    from ...sizes import concrete_shape, specialize
    out, inputs, ids, n = ns["OUT"], ns["INPUTS"], list(ns["IDS"]), ns["SIZE"]
    head = dsl.placeholder(out.shape, dtype="float64", name="head")
    raw = tg.differentiate(out, inputs, head=head, simplify=False)
    res = tg.differentiate(out, inputs, head=head)
    status = "ok"
    symbolic = tg.build([out] + list(res), inputs=inputs + ids + [head]) if compile_ else None
    tiled = _built_with_every_copy([out] + list(res), inputs + ids + [head]) if compile_ else None
    for size in ns["SIZES"]:
        feed = _feed(ns, rng, "float64", {n: size})
        head_value = rng.standard_normal(concrete_shape(out.shape, {n: size}))
        feed[head] = head_value
        y = tg.evaluate([out], feed)[0]
        raw_values = tg.evaluate(list(raw), feed)
        status = _worse(status, _fd_check(out, inputs, feed, head_value, raw_values, rng))
        simp_values = tg.evaluate(list(res), feed)
        for x, r, v in zip(inputs, raw_values, simp_values):
            _close(v, r, 1e-9, f"simplified d{x.name} vs raw at n={size}", "mismatch-simplified-raw", 1e-12)
        if compile_:
            order = inputs + ids + [head]
            fixed, new = specialize([out] + list(res) + order, {n: size})
            kern = tg.build(fixed[:1 + len(res)], inputs=fixed[1 + len(res):])
            got = kern(*[feed[t] for t in order])
            got = got if isinstance(got, tuple) else (got,)
            _close(got[0], y, 1e-9, f"compiled {out.name} at n={size} vs evaluator", "mismatch-compiled-forward",
                   1e-12)
            for x, c, v in zip(inputs, got[1:], simp_values):
                _close(c, v, 1e-8, f"compiled d{x.name} at n={size} vs evaluator", "mismatch-compiled-f64", 1e-12)
            for what, kernel in (("symbolic kernel", symbolic), ("symbolic kernel for tiny caches", tiled)):
                got = kernel(*[feed[t] for t in order])
                got = got if isinstance(got, tuple) else (got,)
                _close(got[0], y, 1e-9, f"{what}'s {out.name} at n={size} vs evaluator",
                       "mismatch-compiled-forward", 1e-12)
                for x, c, v in zip(inputs, got[1:], simp_values):
                    _close(c, v, 1e-8, f"{what}'s d{x.name} at n={size} vs evaluator", "mismatch-compiled-f64",
                           1e-12)
    return status


def _worse(a: str, b: str) -> str:
    return a if a != "ok" else b


def _inner(g, v):
    """``sum(g * v)`` over every element, as a 0-d expression."""
    if not g.shape:
        return g[()] * v[()]
    axes = [dsl.reduce_axis((0, n), name=f"v{d}") for d, n in enumerate(g.shape)]
    return dsl.sum(g[tuple(axes)] * v[tuple(axes)], axis=axes)


def _second_order(out, inputs, ids, head, feed, first, rng, compile_) -> str:
    """Second order: ``D = <V, gradient>`` over the *simplified* first-order gradients
    (scatters, gathers, folded forms: each must be differentiable again), and its gradient
    with respect to the inputs (a Hessian-vector product), raw and simplified. The raw
    second order is checked against central finite differences of the *raw* first-order
    gradient (itself checked against finite differences of the forward); the simplified
    against the raw, both by the evaluator; the compiled kernel against the evaluator."""
    import te_grad as tg
    from ...evaluator import evaluate
    vs = [dsl.placeholder(x.shape, dtype="float64", name=f"V{k}") for k, x in enumerate(inputs)]
    for v in vs:
        feed[v] = rng.standard_normal(v.shape)

    def contraction(grads):
        def body():
            total = None
            for g, v in zip(grads, vs):
                term = _inner(g, v)
                total = term if total is None else total + term
            return total
        return dsl.compute((), body, name="D")

    d = contraction(list(first))
    raw_first = tg.differentiate(out, inputs, head=head, simplify=False)
    d_raw_first = contraction(list(raw_first))
    raw = tg.differentiate(d, inputs, simplify=False)
    raw_values = evaluate(list(raw), feed)
    unstable = False
    for x, h in zip(inputs, raw_values):
        base = feed[x]
        for u in _directions(x, rng, units_up_to=4):
            def fd(eps):
                plus, minus = dict(feed), dict(feed)
                plus[x], minus[x] = base + eps * u, base - eps * u
                return float(evaluate([d_raw_first], plus)[0] - evaluate([d_raw_first], minus)[0]) / (2 * eps)
            want = fd(1e-5)
            got = float(np.sum(h * u))
            tol = 1e-6 + 1e-5 * (abs(want) + float(np.sum(np.abs(h * u))))
            if not np.isfinite(got) or abs(got - want) > tol:
                coarse, fine = fd(1e-4), fd(1e-6)
                if abs(coarse - want) > 10 * tol or abs(fine - want) > 10 * tol:
                    unstable = True
                    continue
                raise _Mismatch("mismatch-second-order-fd", f"d<V, d<head, {out.name}>/dX>/d{x.name} along "
                                f"{'e' + str(list(np.argwhere(u)[0])) if np.count_nonzero(u) == 1 else 'a random direction'}: "
                                f"raw second order gives {got:.12g}, finite differences of the first "
                                f"order {want:.12g}")
    simp = tg.differentiate(d, inputs)
    simp_values = evaluate(list(simp), feed)
    for x, r, s in zip(inputs, raw_values, simp_values):
        _close(s, r, 1e-9, f"simplified second-order d{x.name} vs raw", "mismatch-second-order-simplified", 1e-12)
    if compile_:
        order = inputs + ids + [head] + vs
        got = tg.build([d] + list(simp), inputs=order)(*[feed[t] for t in order])
        dv = evaluate([d], feed)[0]
        _close(got[0], dv, 1e-9, "compiled <V, gradient> vs evaluator", "mismatch-second-order-compiled", 1e-12)
        for x, c, s in zip(inputs, got[1:], simp_values):
            _close(c, s, 1e-8, f"compiled second-order d{x.name} vs evaluator", "mismatch-second-order-compiled",
                   1e-12)
    return "fd-unstable" if unstable else "ok"


def _check_aliasing(kern, order, feed) -> bool:
    """A kernel's outputs must not overlap its inputs or each other (its stage functions
    assume they do not): ``out=`` naming an input, a view of one, or one array twice, is
    refused with a UserError, never computed into. True if some overlap was tried."""
    arrays = [np.array(feed[t], order="C") for t in order]  # 0-d stays 0-d
    shapes = [(tuple(o.shape), np.dtype(o.dtype)) for o in kern.outputs]
    tried = False
    for k, t in enumerate(order):
        if t.shape and (tuple(t.shape), np.dtype(t.dtype)) == shapes[0]:
            out = [arrays[k]] + [np.empty(s, d) for s, d in shapes[1:]]
            _expect_refusal(kern, arrays, tuple(out) if len(out) > 1 else out[0], f"out= naming input {t.name}")
            tried = True
            break
    for k, t in enumerate(order):  # a view that overlaps an input in part
        if t.shape and np.dtype(t.dtype) == shapes[0][1] and t.size > 1 and 1 <= int(np.prod(shapes[0][0])) < t.size:
            view = arrays[k].reshape(-1)[1:1 + int(np.prod(shapes[0][0]))].reshape(shapes[0][0])
            out = [view] + [np.empty(s, d) for s, d in shapes[1:]]
            _expect_refusal(kern, arrays, tuple(out) if len(out) > 1 else out[0],
                            f"out= overlapping input {t.name} in part")
            tried = True
            break
    for a in range(len(shapes)):
        for b in range(a + 1, len(shapes)):
            if shapes[a] == shapes[b] and shapes[a][0]:
                shared = np.empty(shapes[a][0], shapes[a][1])
                out = [np.empty(s, d) for s, d in shapes]
                out[a] = out[b] = shared
                _expect_refusal(kern, arrays, tuple(out), f"out= with outputs {a} and {b} one array")
                return True
    return tried


def _expect_refusal(kern, arrays, out, what):
    try:
        kern(*arrays, out=out)
    except UserError as e:
        if "overlap" in str(e) or "shares memory" in str(e):
            return
        raise _Mismatch("aliasing-accepted", f"{what}: refused for another reason: {e}") from None
    raise _Mismatch("aliasing-accepted", f"{what}: the kernel accepted it")


#: a machine whose caches are small enough for the loops of small programs to be tiled
SMALL_CACHES = dict(vector_bits=512, vector_registers=32, l1_bytes=1024, l2_bytes=2048)
#: the same with 128-bit vectors and 16 registers: rows of a few elements span several
#: registers, so register blocks of small programs jam their split axis for the most
#: accumulators, with remainders (:func:`codegen.register_blocking.accumulate_nest`)
NARROW_SMALL_CACHES = dict(SMALL_CACHES, vector_bits=128, vector_registers=16)


def _built_with_every_copy(outputs, order, narrow: bool = False):
    """The kernel built with every operand copy made whatever its size, split axes jammed down
    to one block, the loops tiled for tiny caches (with 128-bit vectors if ``narrow``), and
    every run of stages split among 3 threads: the copies, jams, tiles and thread splits,
    made on large operands only by default, are then exercised on small random programs too."""
    import dataclasses
    import te_grad as tg
    from codegen import packing
    from codegen.machine import Machine
    with packing.using(dataclasses.replace(packing.EVERY_COPY, min_parallel_work=0)):
        return tg.build(outputs, inputs=order, threads=3,
                        machine=Machine(**(NARROW_SMALL_CACHES if narrow else SMALL_CACHES)))


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


def _pins_an_output_by_data(out) -> bool:
    """Whether a reduction of the program has a ``where`` conjunct ``data == i (+ c)`` on an
    output variable ``i`` of its compute (:func:`simplify.solve.pinned_value`)."""
    from simplify.affine import conjuncts
    from simplify.solve import pinned_value
    for t in topo_order([out]):
        if isinstance(t.op, ComputeOp):
            for e in _nodes(t.op.body):
                if isinstance(e, Reduce) and any(pinned_value(c, ax) is not None
                                                 for c in conjuncts(e.where) for ax in t.op.axes):
                    return True
    return False


def _conditional_index(out) -> bool:
    """Whether a read of the program has an index holding an integer ``if_then_else``."""
    for t in topo_order([out]):
        if isinstance(t.op, ComputeOp):
            for e in _nodes(t.op.body):
                if isinstance(e, Read) and any(isinstance(n, Select) and dtypes.is_int(n.dtype)
                                               for ix in e.indices for n in _nodes(ix)):
                    return True
    return False


def _nodes(expr):
    """Every node of ``expr`` (an explicit stack: depth does not matter)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        yield e
        stack.extend(e.children())
