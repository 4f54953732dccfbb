"""Gradient checking for operator authors: te_grad's gradients vs finite differences.

:func:`check_gradients` differentiates an output with a random head, evaluates
the gradients with the reference evaluator and compares them, in float64,
with central finite differences of ``<head, output>``: element by element for
small inputs, and along random directions (the dot-product identity
``<head, J v> == <J^T head, v>``) for every input. It raises AssertionError
with the worst element on a mismatch.

:func:`second_order` builds the program of a Hessian-vector product from
first-order gradients (the gradient of ``<grads, v>``), raw or simplified.
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
