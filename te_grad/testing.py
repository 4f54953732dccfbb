"""Gradient checking for operator authors: te_grad's gradients vs finite differences.

:func:`check_gradients` differentiates an output with a random head, evaluates
the gradients with the reference evaluator and compares them, in float64,
with central finite differences of ``<head, output>``: element by element for
small inputs, and along random directions (the dot-product identity
``<head, J v> == <J^T head, v>``) for every input. It raises AssertionError
with the worst element on a mismatch.


:func:`second_order` builds the program of a Hessian-vector product from
first-order gradients (the gradient of ``<grads, v>``), raw or simplified.
:func:`check_out_overlaps_refused` checks that a compiled kernel refuses ``out=``
arrays that share memory with its inputs or with each other.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from . import dsl
from .autodiff import differentiate
from .errors import UserError
from .evaluator import evaluate
from .ir import Tensor


def random_feed(tensors: Sequence[Tensor], rng: np.random.Generator, low=-1.0, high=1.0) -> Dict:
    """Random float64-friendly values for the given placeholders (ints in [0, 2))."""
    feed = {}
    for t in tensors:
        if t.dtype.startswith("float"):
            feed[t] = rng.uniform(low, high, size=t.shape).astype(t.dtype)
        elif t.dtype == "bool":
            feed[t] = rng.integers(0, 2, size=t.shape).astype(bool)
        else:
            feed[t] = rng.integers(0, 2, size=t.shape).astype(t.dtype)
    return feed


def second_order(grads: Sequence[Tensor], wrt: Sequence[Tensor], simplify: bool = True,
                 name: str = "v") -> Tuple[List[Tensor], Tensor, Sequence[Tensor]]:
    """The second-order program of first-order gradients ``grads``: ``(directions, D, result)``.

    ``directions`` are new placeholders ``v_a`` shaped like each ``grads[a]``, ``D`` the 0-d
    ``sum over a, j of grads[a][j] * v_a[j]``, and ``result`` ``tg.differentiate(D, wrt,
    simplify=simplify)``: with ``grads`` the gradients of ``f`` with respect to ``xs``
    (simplified or raw) and ``wrt = xs``, ``result[b]`` is the Hessian-vector product
    ``sum over a of d2f / dxs[b] dxs[a] . v_a``. Check it against central finite
    differences of the evaluated ``grads`` (:func:`te_grad.evaluate`) along ``wrt``."""
    grads = list(grads)
    if not grads:
        raise UserError("second_order needs at least one gradient")
    directions, terms = [], []
    for a, g in enumerate(grads):
        if not isinstance(g, Tensor) or not g.dtype.startswith("float"):
            raise UserError(f"second_order: {g!r} is not a float gradient tensor")
        v = dsl.placeholder(g.shape, dtype=g.dtype, name=f"{name}{a}" if len(grads) > 1 else name)
        directions.append(v)
        if g.ndim == 0:
            terms.append(g[()] * v[()])
        else:
            axes = [dsl.reduce_axis((0, n), name=f"k{d}") for d, n in enumerate(g.shape)]
            terms.append(dsl.sum(g[tuple(axes)] * v[tuple(axes)], axes))
    total = terms[0]
    for t in terms[1:]:
        total = total + dsl.cast(total.dtype, t)
    objective = dsl.compute((), lambda: total, name="D")
    return directions, objective, differentiate(objective, list(wrt), simplify=simplify)


def _objective(output: Tensor, head_value: np.ndarray, feed: Dict) -> float:
    y = evaluate([output], feed)[0]
    return float(np.sum(y.astype(np.float64) * head_value))


def check_gradients(output: Tensor, inputs: Sequence[Tensor], feed: Dict, *, eps: float = 1e-6,
                    rtol: float = 1e-5, atol: float = 1e-7, full_limit: int = 64, directions: int = 2,
                    seed: int = 0, simplify: bool = True, grads: Sequence[Tensor] = None,
                    head: Tensor = None, head_value: np.ndarray = None,
                    values: Sequence[np.ndarray] = None) -> Sequence[np.ndarray]:
    """Assert that te_grad's gradients of ``output`` match central finite differences.

    Inputs must be float64 placeholders (finite differences in float32 are
    too coarse to check anything). Inputs with at most ``full_limit`` elements
    are checked element by element; every input is checked along
    ``directions`` random directions. ``grads``/``head`` may be given to check
    gradients built elsewhere (``grads`` computed with head tensor ``head``);
    ``head_value`` fixes the head's value; ``values`` gives gradient values to
    check instead of evaluating ``grads`` (e.g. from a compiled kernel run
    with ``head_value``). Returns the checked gradient values.
    """
    rng = np.random.default_rng(seed)
    for x in inputs:
        if x.dtype != "float64":
            raise UserError(f"check_gradients needs float64 inputs; {x.name} is {x.dtype}")
    if grads is None:
        head = dsl.placeholder(output.shape, dtype=output.dtype, name="head")
        grads = list(differentiate(output, list(inputs), head=head, simplify=simplify))
    if head_value is None:
        head_value = rng.standard_normal(output.shape)
    feed = dict(feed)
    feed[head] = np.asarray(head_value).astype(head.dtype)
    got = [np.asarray(v) for v in values] if values is not None else evaluate(list(grads), feed)
    for x, g in zip(inputs, got):
        base = feed[x]
        if x.size <= full_limit:
            numeric = np.zeros(x.shape)
            for idx in np.ndindex(*x.shape):
                numeric[idx] = _central(output, head_value, feed, x, base, _unit(x.shape, idx), eps)
            _assert_close(g, numeric, rtol, atol, f"gradient of {output.name} w.r.t. {x.name}")
        for _ in range(directions):
            v = rng.standard_normal(x.shape)
            numeric = _central(output, head_value, feed, x, base, v, eps)
            analytic = float(np.sum(g * v))
            _assert_close(np.array(analytic), np.array(numeric), rtol, atol * max(1, x.size) ** 0.5,
                          f"directional derivative of {output.name} along a random direction of {x.name}")
    return got


def _unit(shape, idx):
    e = np.zeros(shape)
    e[idx] = 1.0
    return e


def _central(output, head_value, feed, x, base, v, eps) -> float:
    plus, minus = dict(feed), dict(feed)
    plus[x] = base + eps * v
    minus[x] = base - eps * v
    return (_objective(output, head_value, plus) - _objective(output, head_value, minus)) / (2 * eps)


def _assert_close(got, want, rtol, atol, what):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    err = np.abs(got - want)
    bound = atol + rtol * np.abs(want)
    if not np.all(err <= bound) or not np.all(np.isfinite(got)):
        worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.ndim else ()
        where = [int(i) for i in worst]
        raise AssertionError(f"{what}: te_grad gives {float(got[worst]):.10g} at {where} but finite "
                             f"differences give {float(want[worst]):.10g} (|error| {float(err[worst]):.3g})")


def _overlapping(first, second, shift: int):
    """Two C-contiguous arrays ``(shape, dtype)`` in one byte buffer, the second starting
    ``shift`` bytes after the first (so they overlap when ``shift`` is below the first's size)."""
    (shape_a, dt_a), (shape_b, dt_b) = first, second
    size_a = int(np.prod(shape_a, dtype=np.int64)) * np.dtype(dt_a).itemsize
    size_b = int(np.prod(shape_b, dtype=np.int64)) * np.dtype(dt_b).itemsize
    raw = np.zeros(shift + max(size_a, size_b) + 64, dtype=np.uint8)
    base = -raw.ctypes.data % 64  # 64-byte aligned, shift a multiple of both itemsizes
    a = raw[base:base + size_a].view(dt_a).reshape(shape_a)
    b = raw[base + shift:base + shift + size_b].view(dt_b).reshape(shape_b)
    return a, b


def check_out_overlaps_refused(kernel, arrays: Sequence[np.ndarray]) -> int:
    """Check that ``kernel`` (from ``tg.build``), called with valid input ``arrays`` (one per
    input, in order), refuses every ``out=`` that shares memory with an input or with another
    out array: whole and partial overlaps (an out array starting inside the other buffer).
    Raises AssertionError naming the case the kernel accepted or answered with anything but
    a UserError; returns the number of cases checked. The kernel is never run on overlapping
    buffers unless it fails to refuse them."""
    arrays = [np.asarray(a) for a in arrays]
    outputs = list(kernel.outputs)
    cases = 0

    def fresh():
        return [np.empty(t.shape, dtype=t.dtype) for t in outputs]

    def expect_refusal(what, args, outs):
        try:
            kernel(*args, out=outs)
        except UserError:
            return
        except Exception as err:  # noqa: BLE001 - anything but a UserError is the failure reported
            raise AssertionError(f"out= overlapping {what}: {type(err).__name__}: {err}") from err
        raise AssertionError(f"out= overlapping {what} was accepted")

    for k, t in enumerate(outputs):
        spec_t = (t.shape, t.dtype)
        size_t = t.size * np.dtype(t.dtype).itemsize
        for j, x in enumerate(kernel.inputs):
            size_x = x.size * np.dtype(x.dtype).itemsize
            if not size_t or not size_x:
                continue
            step = np.dtype(x.dtype).itemsize * np.dtype(t.dtype).itemsize
            for shift in sorted({0, (size_x // 2) // step * step}):
                given, out = _overlapping((x.shape, x.dtype), spec_t, shift)
                given[...] = arrays[j]
                outs = fresh()
                outs[k] = out
                args = list(arrays)
                args[j] = given
                expect_refusal(f"input {x.name} (output {t.name}, {shift} bytes in)", args, outs)
                cases += 1
        for m in range(k):
            u = outputs[m]
            size_u = u.size * np.dtype(u.dtype).itemsize
            if not size_t or not size_u:
                continue
            step = np.dtype(u.dtype).itemsize * np.dtype(t.dtype).itemsize
            for shift in sorted({0, (size_u // 2) // step * step}):
                first, second = _overlapping((u.shape, u.dtype), spec_t, shift)
                outs = fresh()
                outs[m], outs[k] = first, second
                expect_refusal(f"outputs {u.name} and {t.name} ({shift} bytes in)", arrays, outs)
                cases += 1
    return cases
