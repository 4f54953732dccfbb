"""Expressions that share subexpressions (a DAG, as second-order gradients are) cost what the
DAG costs, not what its tree costs: the LLVM emitter emits a shared node once per block, the
fingerprint refers back to a node met before, and the demand walk of the structural zeros
visits a shared node a bounded number of times.

The graphs below share each level three times, so their trees have about 3**depth nodes
while their DAGs have about 6 * depth.
"""
import re
import signal

import numpy as np
import pytest

import te_grad as tg
from codegen import stages_for
from codegen.llvm_module import emit_module
from simplify import simplify
from te_grad.fingerprint import fingerprint


def _chain(x, depth):
    e = x
    for _ in range(depth):
        e = tg.tanh(e) * e + e * 0.5  # e read three times
    return e


def _chain_np(x, depth):
    e = x
    for _ in range(depth):
        e = np.tanh(e) * e + e * 0.5
    return e


def _tree_size(e) -> int:
    memo = {}

    def size(x):
        if id(x) not in memo:
            memo[id(x)] = 1 + sum(size(c) for c in x.children())
        return memo[id(x)]
    return size(e)


def test_a_shared_subexpression_is_emitted_once():
    depth = 9
    X = tg.placeholder((16,), dtype="float64", name="X")
    Y = tg.compute((16,), lambda i: _chain(X[i], depth), name="Y")
    assert _tree_size(Y.op.body) > 3 ** depth  # the tree the emitter must not walk
    simplified = simplify([Y])
    text = emit_module(stages_for(simplified), {id(X): 0, id(simplified[0]): 1}, True)
    body = text[text.index("define"):]
    # one inline tanh per level (a float64 tanh is a few dozen instructions), not one per path
    assert body.count("fmul") < 60 * depth, body.count("fmul")
    assert len(re.findall(r"\n  ", body)) < 150 * depth
    x = np.linspace(-1.5, 1.5, 16)
    got = tg.build([Y], inputs=[X])(x)
    np.testing.assert_allclose(got, _chain_np(x, depth), rtol=1e-13, atol=1e-13)


def test_register_blocked_rows_do_not_share_a_value_of_another_row():
    # a matrix product's register block evaluates one expression per row and lane: the memo
    # must key the values by what their variables are bound to
    rng = np.random.default_rng(0)
    A = tg.placeholder((24, 40), dtype="float32", name="A")
    B = tg.placeholder((40, 32), dtype="float32", name="B")
    k = tg.reduce_axis((0, 40), name="k")
    C = tg.compute((24, 32), lambda i, j: tg.sum(tg.tanh(A[i, k]) * B[k, j] + A[i, k] * tg.tanh(A[i, k]),
                                                 axis=k), name="C")
    a, b = rng.standard_normal((24, 40)).astype(np.float32), rng.standard_normal((40, 32)).astype(np.float32)
    got = tg.build([C], inputs=[A, B])(a, b)
    want = np.tanh(a.astype(np.float64)) @ b + (a * np.tanh(a.astype(np.float64))).sum(1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


class _Hang(Exception):
    pass


def _with_alarm(seconds, fn):
    def ring(*_):
        raise _Hang
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _within(seconds, what):
    """Runs the decorated test with an alarm: a walk of the tree (3**40 nodes) never ends."""
    def wrap(test):
        def run(*args, **kwargs):
            try:
                return _with_alarm(seconds, lambda: test(*args, **kwargs))
            except _Hang:
                pytest.fail(what)
        run.__name__ = test.__name__
        return run
    return wrap


@_within(60, "the fingerprint (or the scope check of tg.compute) walked the tree of a shared expression")
def test_the_fingerprint_of_a_deep_dag_is_linear_in_the_dag():
    X = tg.placeholder((4,), dtype="float64", name="X")
    Y = tg.compute((4,), lambda i: _chain(X[i], 40), name="Y")  # a tree of 3**40 nodes
    key = fingerprint([Y], [X])
    Z = tg.compute((4,), lambda i: _chain(X[i], 39) * 1.0, name="Y")
    assert key == fingerprint([Y], [X])
    assert key != fingerprint([Z], [X])


def _count_walks(monkeypatch):
    from simplify import zeros
    calls = []
    real = zeros._Demand._walk
    monkeypatch.setattr(zeros._Demand, "_walk", lambda self, *a: (calls.append(1), real(self, *a))[1])
    return calls


def test_the_demand_walk_visits_a_shared_node_a_bounded_number_of_times(monkeypatch):
    from simplify import zeros
    calls = _count_walks(monkeypatch)
    n, depth = 24, 30

    @_within(120, "the demand walk followed every path of a shared expression")
    def carry():
        S = tg.placeholder((n, n), dtype="float64", name="S")
        V = tg.placeholder((n, 4), dtype="float64", name="V")
        M = tg.compute((n, n), lambda i, j: tg.if_then_else(j <= i, tg.exp(S[i, j]), 0.0), name="M")
        H = tg.compute((n, n), lambda i, j: _chain(M[i, j], depth), name="H")  # zero at zero: masked
        k = tg.reduce_axis((0, n), name="k")
        O = tg.compute((n, 4), lambda i, d: tg.sum(H[i, k] * V[k, d], axis=k), name="O")
        return zeros.carry_zeros([O])
    new = carry()
    assert new, "H and O were to be guarded by the mask"
    nodes = 6 * depth + 20
    assert 0 < len(calls) <= (zeros._Demand.MAX_VISITS + 1) * nodes, len(calls)
