"""Deep tensor graphs: chains of thousands of compute stages (unrolled recurrences).

Every walk over the tensor graph (construction, autodiff, simplification, verification,
printing, evaluation, iteration counts, scheduling, code generation, the build cache)
is iterative, and no stage builds expressions whose depth grows with the number of
stages (an adjoint summing thousands of contributions is a balanced tree), so a chain
of 10,000 stages differentiates, simplifies, evaluates and builds on the default stack.

Each case runs in a fresh Python process with the default recursion limit and the
main thread's default stack: a walk that recursed once per stage would raise
RecursionError there. The case also checks that the limit was never raised (te_grad
raises it only for deep *expressions*, see :mod:`te_grad.deep`; a chain is not one).
"""
import os
import subprocess
import sys
import time

import numpy as np

import te_grad as tg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
S = 8  # elements per stage


# -- the recurrences and their numpy references ------------------------------------------

def tanh_chain(n, dtype="float32"):
    """``h_{t+1}[i] = tanh(h_t[i] * W[i] + X[i])``, ``n`` stages."""
    X = tg.placeholder((S,), dtype=dtype, name="X")
    W = tg.placeholder((S,), dtype=dtype, name="W")
    H0 = tg.placeholder((S,), dtype=dtype, name="H0")
    h = H0
    for t in range(n):
        h = tg.compute((S,), lambda i, p=h: tg.tanh(p[i] * W[i] + X[i]), name=f"h{t + 1}")
    return [X, W, H0], h


def tanh_reference(n, x, w, h0, head):
    """Forward and reverse mode of :func:`tanh_chain` in float64: ``(h_n, [dX, dW, dH0])``."""
    x, w, h = (np.asarray(a, np.float64) for a in (x, w, h0))
    hs = [h]
    for _ in range(n):
        h = np.tanh(h * w + x)
        hs.append(h)
    dx, dw, dh = np.zeros(S), np.zeros(S), np.asarray(head, np.float64)
    for t in range(n, 0, -1):
        dz = dh * (1 - hs[t] ** 2)
        dx += dz
        dw += dz * hs[t - 1]
        dh = dz * w
    return hs[-1], [dx, dw, dh]


def mix_chain(n, dtype="float32"):
    """``T_{t+1}[i] = sum_k T_t[(i + k) % S] * C[k] + X[i]`` (k < 2), ``n`` stages: each stage
    a reduction over shifted reads, so the stages are not element-wise copies of each other."""
    X = tg.placeholder((S,), dtype=dtype, name="X")
    C = tg.placeholder((2,), dtype=dtype, name="C")
    T0 = tg.placeholder((S,), dtype=dtype, name="T0")
    T = T0
    for t in range(n):
        k = tg.reduce_axis((0, 2), name="k")
        T = tg.compute((S,), lambda i, p=T, k=k: tg.sum(p[(i + k) % S] * C[k], axis=k) + X[i],
                       name=f"T{t + 1}")
    return [X, C, T0], T


def mix_reference(n, x, c, t0, head):
    """Forward and reverse mode of :func:`mix_chain` in float64: ``(T_n, [dX, dC, dT0])``."""
    x, c, T = (np.asarray(a, np.float64) for a in (x, c, t0))
    Ts = [T]
    for _ in range(n):
        T = c[0] * T + c[1] * np.roll(T, -1) + x
        Ts.append(T)
    dx, dc, dT = np.zeros(S), np.zeros(2), np.asarray(head, np.float64)
    for t in range(n, 0, -1):
        prev = Ts[t - 1]
        dx += dT
        dc += [np.sum(dT * prev), np.sum(dT * np.roll(prev, -1))]
        dT = c[0] * dT + c[1] * np.roll(dT, 1)
    return Ts[-1], [dx, dc, dT]


def _values(rng):
    """Inputs that keep both recurrences bounded and their gradients far from zero."""
    return {"tanh": [rng.uniform(-0.5, 0.5, S), rng.uniform(0.5, 1.0, S), rng.uniform(-1, 1, S)],
            "mix": [rng.uniform(-0.1, 0.1, S), np.array([0.55, 0.4]), rng.uniform(-1, 1, S)]}


CHAINS = {"tanh": (tanh_chain, tanh_reference), "mix": (mix_chain, mix_reference)}


def _close(got, want, rtol, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.max(np.abs(want))))
    err = float(np.max(np.abs(got - want)))
    assert np.all(np.isfinite(got)) and err <= rtol * scale, f"{what}: |error| {err:.3g} (scale {scale:.3g})"


# -- the cases, each run in a fresh process ----------------------------------------------

def case_differentiate(kind, n):
    """Differentiate (simplified, verified when TE_GRAD_VERIFY is set) and evaluate an
    ``n``-stage chain; show it and count its iterations."""
    make, reference = CHAINS[kind]
    inputs, y = make(n)
    head = tg.placeholder((S,), name="head")
    clock = time.perf_counter()
    res = tg.differentiate(y, inputs, head=head)
    took = {"differentiate": time.perf_counter() - clock}
    rng = np.random.default_rng(1)
    vals = [v.astype(np.float32) for v in _values(rng)[kind]]
    head_value = rng.uniform(-1, 1, S).astype(np.float32)
    feed = dict(zip(inputs, vals))
    feed[head] = head_value
    clock = time.perf_counter()
    got = tg.evaluate([y] + list(res), feed)
    took["evaluate"] = time.perf_counter() - clock
    want_y, want_grads = reference(n, *vals, head_value)
    _close(got[0], want_y, 1e-4, f"{kind} chain of {n}: the output")
    for x, g, w in zip(inputs, got[1:], want_grads):
        _close(g, w, 1e-3, f"{kind} chain of {n}: the gradient of {x.name}")
    assert max(abs(float(np.max(np.abs(w)))) for w in want_grads[:2]) > 0.1  # a real check
    clock = time.perf_counter()
    text = tg.show(list(res))
    took["show"] = time.perf_counter() - clock
    assert text.count("\n") >= n and f"{y.name}[" in tg.show(y)
    assert tg.iterations([y]) >= n * S
    return took


def case_build(kind, n):
    """Build the forward and the gradients of an ``n``-stage chain in one kernel, and as a
    VJP pair; compare with the reference; the build is stored in and read back from the
    persistent cache."""
    import codegen
    from codegen.options import current_options
    make, reference = CHAINS[kind]
    inputs, y = make(n)
    head = tg.placeholder((S,), name="head")
    grads = list(tg.differentiate(y, inputs, head=head))
    rng = np.random.default_rng(2)
    vals = [v.astype(np.float32) for v in _values(rng)[kind]]
    head_value = rng.uniform(-1, 1, S).astype(np.float32)
    want_y, want_grads = reference(n, *vals, head_value)
    clock = time.perf_counter()
    kern = tg.build([y] + grads, inputs=inputs + [head])
    took = {"build": time.perf_counter() - clock}
    got = kern(*vals, head_value)
    _close(got[0], want_y, 1e-4, f"{kind} chain of {n}: the compiled output")
    for x, g, w in zip(inputs, got[1:], want_grads):
        _close(g, w, 1e-3, f"{kind} chain of {n}: the compiled gradient of {x.name}")
    cached = codegen._cached_build([y] + grads, inputs + [head], current_options())
    assert cached is not None, "the build of a deep chain was not stored in the cache"
    for a, b in zip(cached(*vals, head_value), got):
        np.testing.assert_array_equal(a, b)
    clock = time.perf_counter()
    vjp = tg.build_vjp([y], inputs)
    took["build_vjp"] = time.perf_counter() - clock
    outs, res = vjp.run_forward(*vals)
    _close(outs[0], want_y, 1e-4, f"{kind} chain of {n}: the VJP's forward")
    for x, g, w in zip(inputs, vjp.run_backward(res, vals, [head_value]), want_grads):
        _close(g, w, 1e-3, f"{kind} chain of {n}: the VJP's gradient of {x.name}")
    return took


def run_case(name, *args, timeout=600):
    """Run ``case_<name>(*args)`` in a fresh interpreter; returns the timings it reports."""
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r}); "
            f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
            "limit = sys.getrecursionlimit()\n"
            "import test_deep_graphs as m\n"
            f"took = m.case_{name}(*{args!r})\n"
            "assert sys.getrecursionlimit() == limit, 'te_grad raised the recursion limit'\n"
            "print('TOOK', took)\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"case {name}{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    line = [x for x in proc.stdout.splitlines() if x.startswith("TOOK")][-1]
    return line[5:]


# -- the tests ----------------------------------------------------------------------------

def test_tanh_chain_of_10000_stages_differentiates_and_evaluates():
    run_case("differentiate", "tanh", 10_000)


def test_mixing_chain_of_5000_reduction_stages_differentiates_and_evaluates():
    run_case("differentiate", "mix", 5_000)


def test_chains_of_1000_stages_build_with_their_gradients():
    run_case("build", "tanh", 1_000)
    run_case("build", "mix", 1_000)


def test_short_chains_match_finite_differences():
    from te_grad.testing import check_gradients
    rng = np.random.default_rng(3)
    for kind, (make, _) in CHAINS.items():
        inputs, y = make(12, dtype="float64")
        feed = dict(zip(inputs, _values(rng)[kind]))
        check_gradients(y, inputs, feed, rtol=1e-6, atol=1e-9)


def test_adjoint_of_a_widely_read_tensor_is_a_shallow_sum():
    """X is read by every stage: its adjoint sums n contributions as a balanced tree (depth
    about log n, not n), whose terms read back in order."""
    from simplify.rewrite import summands
    from te_grad.autodiff.vjp import sum_contributions
    X = tg.placeholder((S,), name="X")
    parts = [tg.compute((S,), lambda i, c=c: X[i] * float(c), name=f"c{c}") for c in range(1000)]
    total = sum_contributions(X, parts)
    assert total.op.body.depth < 40
    assert [r.tensor for r in summands(total.op.body)] == parts
    got = tg.evaluate([total], {X: np.ones(S, np.float32)})[0]
    np.testing.assert_allclose(got, np.full(S, sum(range(1000)), np.float32))
