"""Reverse mode over an expression DAG: a node shared by several parents gets the sum of
their contributions and passes it on once (``te_grad/autodiff/rules.backprop``), so the
gradient of ``e = f(e, e, e)`` over 14 levels (a tree of 3**14 nodes, whose adjoint summed
path by path was once deeper than te_grad's expression limit) is derived, simplified and
compiled at once, and it is right: against float64 finite differences of the reference
evaluator and against the evaluator's value of the raw (unsimplified) VJP."""
import signal

import numpy as np
import pytest

import te_grad as tg
from te_grad.evaluator import evaluate
from te_grad.ir import Binary

DEPTH = 14


def _chain(e):
    for _ in range(DEPTH):
        e = tg.tanh(e) * e + e * 0.5
    return e


def _chain_np(e):
    for _ in range(DEPTH):
        e = np.tanh(e) * e + e * 0.5
    return e


def test_the_gradient_of_a_deep_dag_is_derived_once_per_node():
    def ring(*_):
        raise TimeoutError
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(120)
    try:
        X = tg.placeholder((6,), dtype="float64", name="X")
        Y = tg.compute((6,), lambda i: _chain(X[i] * 0.1), name="Y")
        k = tg.reduce_axis((0, 6), name="k")
        L = tg.compute((), lambda: tg.sum(Y[k], axis=k), name="L")
        raw, = tg.differentiate(L, [X], simplify=False)
        grad, = tg.differentiate(L, [X])
        kernel = tg.build([grad], inputs=[X])
    except TimeoutError:
        pytest.fail("reverse mode followed every path of a shared expression")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    x = np.linspace(-2.0, 2.5, 6)
    assert np.allclose(evaluate([Y], {X: x})[0], _chain_np(x * 0.1), rtol=1e-12, atol=1e-12)
    eps = 1e-6
    fd = np.array([(evaluate([L], {X: x + eps * u})[0] - evaluate([L], {X: x - eps * u})[0]) / (2 * eps)
                   for u in np.eye(6)])
    raw_value = evaluate([raw], {X: x})[0]
    np.testing.assert_allclose(raw_value, fd, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(evaluate([grad], {X: x})[0], raw_value, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(kernel(x), raw_value, rtol=1e-10, atol=1e-12)


def _branchy(e, levels):
    """``e`` used outside and inside both branches of a data-dependent ``if_then_else``, level
    after level: reverse mode reaches each level's ``e`` under three guard contexts (none,
    ``e > 0``, ``not e > 0``), which used to multiply to ``3 ** levels`` adjoints."""
    for _ in range(levels):
        e = tg.tanh(e) * e + tg.if_then_else(e > 0.0, e * 0.5, -e * 0.25)
    return e


def _branchy_np(e, levels):
    for _ in range(levels):
        e = np.tanh(e) * e + np.where(e > 0.0, e * 0.5, -e * 0.25)
    return e


def _nested(e, levels):
    """``e`` only inside the branches (``t`` and ``f`` of one select per level): each level's
    contexts are the two branches of the one below, nested."""
    for _ in range(levels):
        e = tg.if_then_else(tg.sin(e) > 0.0, tg.tanh(e) * 1.5, e * 0.5 + 0.1)
    return e


def _nested_np(e, levels):
    for _ in range(levels):
        e = np.where(np.sin(e) > 0.0, np.tanh(e) * 1.5, e * 0.5 + 0.1)
    return e


@pytest.mark.parametrize("chain, chain_np", [(_branchy, _branchy_np), (_nested, _nested_np)])
def test_guard_contexts_of_a_shared_node_merge(chain, chain_np):
    """The contexts of a node whose guards include another context's fold into it, and the
    two branches of one select into the context around them: the backprop of 12 such levels
    returns one adjoint (not 3**12 or 2**12), and the gradient is right, three ways."""
    from te_grad import dsl
    from te_grad.autodiff.rules import backprop
    levels = 12
    X = tg.placeholder((6,), dtype="float64", name="X")
    Y = tg.compute((6,), lambda i: chain(X[i], levels), name="Y")

    def ring(*_):
        raise TimeoutError
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(120)
    try:
        terms = backprop(Y.op.body, dsl.const(1.0, "float64"))
        assert [(r.tensor.name, len(g)) for r, g, _ in terms] == [("X", 0)]
        k = tg.reduce_axis((0, 6), name="k")
        L = tg.compute((), lambda: tg.sum(Y[k], axis=k), name="L")
        raw, = tg.differentiate(L, [X], simplify=False)
        grad, = tg.differentiate(L, [X])
        kernel = tg.build([grad], inputs=[X])
    except TimeoutError:
        pytest.fail("the guard contexts of a shared node multiplied")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    x = np.array([-1.3, -0.4, 0.2, 0.7, 1.1, 2.3])
    assert np.allclose(evaluate([Y], {X: x})[0], chain_np(x, levels), rtol=1e-12, atol=1e-12)
    eps = 1e-7
    fd = np.array([(evaluate([L], {X: x + eps * u})[0] - evaluate([L], {X: x - eps * u})[0]) / (2 * eps)
                   for u in np.eye(6)])
    raw_value = evaluate([raw], {X: x})[0]
    np.testing.assert_allclose(raw_value, fd, rtol=1e-5, atol=1e-6 * np.abs(fd).max())
    np.testing.assert_allclose(evaluate([grad], {X: x})[0], raw_value, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(kernel(x), raw_value, rtol=1e-10, atol=1e-12)


def test_contexts_under_unrelated_data_guards_join_without_evaluating_anything_more():
    """Guards that neither include one another nor are the two branches of one select (``a``
    and ``b`` of two different selects) join into one context whose guard is their lazy
    disjunction, the adjoint ``if_then_else(a, g1, 0) + if_then_else(b, g2, 0)``: the partial
    below the shared node (``1 / x`` of ``log(x)``) is evaluated only where one of the guards
    holds, as before, so ``x <= 0``, where neither holds, gives no NaN times 0."""
    from te_grad import dsl
    from te_grad.autodiff.rules import backprop
    X = tg.placeholder((4,), dtype="float64", name="X")
    W = tg.placeholder((4,), dtype="float64", name="W")

    def body(i):
        shared = tg.log(X[i])
        return tg.if_then_else(X[i] > 0.5, shared, 0.0) + tg.if_then_else(W[i] > 0.0, shared * 2.0, 0.0)
    Y = tg.compute((4,), body, name="Y")
    terms = backprop(Y.op.body, dsl.const(1.0, "float64"))
    (guards,) = [g for r, g, _ in terms if r.tensor is X]
    assert len(guards) == 1 and isinstance(guards[0], Binary) and guards[0].op == "or"
    (dX,) = tg.gradient(Y, [X])
    x, w = np.array([-1.0, 0.0, 0.7, 2.0]), np.array([-1.0, -1.0, 1.0, -1.0])
    got = tg.build([dX], [X, W])(x, w)
    want = np.where(x > 0.5, 1 / np.where(x > 0, x, 1), 0) + np.where(w > 0, 2 / np.where(x > 0, x, 1), 0)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(evaluate([dX], {X: x, W: w})[0], want, rtol=1e-12)


def _orders(e, levels):
    """Two guards on ``e`` nested in both orders under a third, level after level; ``p``
    divides by zero where neither ``c`` nor ``q`` holds, so it may be tested only where one
    does. ``e`` is reached under contexts no merge rule joins: they used to multiply by 4
    per level."""
    for _ in range(levels):
        c, q = e > 0.0, e > 1.0
        p = 7 // tg.if_then_else(c | q, 1, 0) > 0
        e = tg.if_then_else(c, tg.if_then_else(p, tg.if_then_else(q, tg.tanh(e), e * 0.5), e),
                            tg.if_then_else(q, tg.if_then_else(p, e * e, 0.0), e * 0.5 + 0.1))
    return e


def _orders_np(e, levels):
    for _ in range(levels):
        e = np.where(e > 1.0, np.tanh(e), np.where(e > 0.0, e * 0.5, e * 0.5 + 0.1))
    return e


def _alarm(seconds, what, fn):
    def ring(*_):
        raise TimeoutError
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        return fn()
    except TimeoutError:
        pytest.fail(what)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_contexts_that_no_rule_merges_do_not_multiply_level_after_level():
    """12 levels of :func:`_orders`: reverse mode keeps a bounded number of adjoints (4 reads
    of ``X``, not 4**12), and the gradient is right: the raw VJP against float64 finite
    differences, the simplified form against the raw, the kernel against the raw. No guard
    is tested off its path (``p`` would divide by zero)."""
    from te_grad import dsl
    from te_grad.autodiff.rules import backprop
    levels = 12
    X = tg.placeholder((6,), dtype="float64", name="X")
    Y = tg.compute((6,), lambda i: _orders(X[i], levels), name="Y")
    k = tg.reduce_axis((0, 6), name="k")
    L = tg.compute((), lambda: tg.sum(Y[k], axis=k), name="L")

    def derive():
        terms = backprop(Y.op.body, dsl.const(1.0, "float64"))
        raw, = tg.differentiate(L, [X], simplify=False)
        grad, = tg.differentiate(L, [X])
        return terms, raw, grad, tg.build([grad], inputs=[X])
    terms, raw, grad, kernel = _alarm(120, "the guard contexts of a shared node multiplied", derive)
    assert len(terms) <= 4
    x = np.array([-2.3, -1.2, -0.4, 0.3, 0.9, 1.7])
    assert np.allclose(evaluate([Y], {X: x})[0], _orders_np(x, levels), rtol=1e-12)
    eps = 1e-7
    fd = np.array([(evaluate([L], {X: x + eps * u})[0] - evaluate([L], {X: x - eps * u})[0]) / (2 * eps)
                   for u in np.eye(6)])
    raw_value = evaluate([raw], {X: x})[0]
    np.testing.assert_allclose(raw_value, fd, rtol=1e-5, atol=1e-6 * np.abs(fd).max())
    np.testing.assert_allclose(evaluate([grad], {X: x})[0], raw_value, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(kernel(x), raw_value, rtol=1e-10, atol=1e-12)


def test_the_emitter_shares_values_across_nested_branches_it_cannot_flatten():
    """A select whose branches may divide by zero is emitted as branches; a value used on
    both sides of one, or after it, is emitted once, before the branches (it is safe
    everywhere), not once per path: 8 levels of :func:`_orders` build at once, in a module
    whose size grows with the levels, not with 2**levels."""
    def module_lines(levels):
        X = tg.placeholder((6,), dtype="float64", name="X")
        Y = tg.compute((6,), lambda i: _orders(X[i] * 0.5 + 0.1, levels), name="Y")
        kernel = tg.build([Y], [X])
        x = np.array([-2.3, -1.2, -0.4, 0.3, 0.9, 1.7])
        np.testing.assert_allclose(kernel(x), _orders_np(x * 0.5 + 0.1, levels), rtol=1e-13)
        return len(kernel.llvm_ir.splitlines())
    small, large = _alarm(60, "the emitter emitted shared values once per path",
                          lambda: (module_lines(2), module_lines(8)))
    assert large < 6 * small


def test_a_second_order_gradient_through_guards_that_divide_lifts_only_what_may_run_everywhere():
    """Second order through two levels of :func:`_orders` after a deep chain: the first-order
    gradient is deeper than a body is kept whole, so pieces of it are lifted into tensors of
    their own, computed everywhere. A piece reached by more paths than are tracked is taken
    as unguarded only by approximation, so it is lifted only if it can run everywhere; one
    holding ``p`` (a division by zero off its paths) stays in place. The Hessian-vector
    product: raw against finite differences of the raw first order, simplified against raw,
    the kernel against the evaluator."""
    X = tg.placeholder((4, 6), dtype="float64", name="X")

    def body(i, j):
        e = X[i, j] * 0.7
        for _ in range(3):
            e = e * tg.exp(-(e * e)) + e
            e = tg.if_then_else(tg.sin(e) > 0.0, tg.tanh(e), e * 0.5)
        return _orders(e, 2) * tg.exp(-(e * e)) + e
    Y = tg.compute((4, 6), body, name="Y")
    first, = tg.gradient(Y, [X])
    V = tg.placeholder((4, 6), dtype="float64", name="V")
    a, b = tg.reduce_axis((0, 4), name="a"), tg.reduce_axis((0, 6), name="b")
    D = tg.compute((), lambda: tg.sum(first[a, b] * V[a, b], axis=[a, b]), name="D")
    raw_first, = tg.gradient(Y, [X], simplify=False) if False else tg.differentiate(
        tg.compute((), lambda: tg.sum(Y[a, b], axis=[a, b]), name="S"), [X], simplify=False)
    Draw = tg.compute((), lambda: tg.sum(raw_first[a, b] * V[a, b], axis=[a, b]), name="Draw")

    def derive():
        raw, = tg.differentiate(D, [X], simplify=False)
        simp, = tg.differentiate(D, [X])
        return raw, simp, tg.build([simp], [X, V])
    raw, simp, kernel = _alarm(240, "second order through divide guards did not finish", derive)
    rng = np.random.default_rng(3)
    x, v = rng.uniform(-2.5, 2.5, (4, 6)), rng.standard_normal((4, 6))
    h = evaluate([raw], {X: x, V: v})[0]
    u = rng.standard_normal((4, 6))
    eps = 1e-6
    fd = (evaluate([Draw], {X: x + eps * u, V: v})[0] - evaluate([Draw], {X: x - eps * u, V: v})[0]) / (2 * eps)
    assert abs(float(np.sum(h * u)) - fd) <= 1e-5 * (1 + abs(fd))
    s = evaluate([simp], {X: x, V: v})[0]
    np.testing.assert_allclose(s, h, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(kernel(x, v), s, rtol=1e-9, atol=1e-12)


def test_the_evaluator_computes_a_node_under_nested_branches_once():
    """The reference evaluator evaluates a branch under the mask where it is taken; a node
    inside both branches of a select, level after level, is met under ``2 ** levels`` masks.
    Its value does not depend on the mask (no reduction, no read out of bounds below it), so
    it is computed once: 24 levels evaluate at once and match numpy."""
    def ring(*_):
        raise TimeoutError
    X = tg.placeholder((5,), dtype="float64", name="X")
    Y = tg.compute((5,), lambda i: _nested(X[i], 24), name="Y")
    x = np.array([-1.3, -0.4, 0.2, 0.7, 2.3])
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(60)
    try:
        got = evaluate([Y], {X: x})[0]
    except TimeoutError:
        pytest.fail("the evaluator computed a shared node once per mask")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    np.testing.assert_allclose(got, _nested_np(x, 24), rtol=1e-13)


def test_the_evaluator_still_refuses_a_read_out_of_bounds_under_a_shared_node():
    """A shared node whose read leaves the tensor somewhere depends on the mask (an error
    where the mask holds, nothing elsewhere): it is not reused across masks, so a read out of
    bounds on the taken side of a branch is still refused, though the same node was computed
    before, without error, under the other branch's mask."""
    X = tg.placeholder((4,), dtype="float64", name="X")
    I = tg.placeholder((4,), dtype="int64", name="I")

    def body(i):
        shared = X[I[i]] * 2.0
        return tg.if_then_else(X[i] > 0.0, shared, 0.0) + tg.if_then_else(X[i] < -2.0, shared, 1.0)
    Y = tg.compute((4,), body, name="Y")
    x = np.array([0.5, -1.0, 2.0, -3.0])
    ok = evaluate([Y], {X: x, I: np.array([1, 9, 3, 0])})[0]  # out of bounds only where neither is taken
    np.testing.assert_allclose(ok, [x[1] * 2 + 1.0, 1.0, x[3] * 2 + 1.0, x[0] * 2])
    with pytest.raises(tg.TeGradError, match="outside tensor X"):
        evaluate([Y], {X: x, I: np.array([1, 0, 3, 7])})  # out of bounds at i = 3, where X < -2


def test_branches_merge_only_when_the_other_guards_come_in_the_same_order():
    """A guard is tested only where the guards before it hold (``p`` below divides by a value
    that is 0 where neither ``c`` nor ``q`` holds). ``n`` is reached under ``(c, p, q)`` and
    ``(not c, q, p)``: merging the two branches of ``c`` into ``(p, q)`` would test ``p`` where
    no path does, so they stay apart, and the gradient is computed without a division by zero."""
    X = tg.placeholder((4,), dtype="float64", name="X")
    Z = tg.placeholder((4,), dtype="float64", name="Z")

    def body(i):
        n = X[i] * X[i]
        c, q = Z[i] > 0.0, Z[i] < -1.0
        p = 7 // tg.if_then_else(c | q, 1, 0) > 0  # divides by 0 where neither c nor q holds
        a = tg.if_then_else(p, tg.if_then_else(q, n, 0.0), 0.0)
        b = tg.if_then_else(q, tg.if_then_else(p, n, 0.0), 0.0)
        return tg.if_then_else(c, a, b)
    Y = tg.compute((4,), body, name="Y")
    k = tg.reduce_axis((0, 4), name="k")
    L = tg.compute((), lambda: tg.sum(Y[k], axis=k), name="L")
    grad, = tg.differentiate(L, [X])
    x, z = np.arange(1.0, 5.0), np.array([1.0, -2.0, 0.0, 1.0])
    want = np.where(z < -1.0, 2 * x, 0.0)  # only the branch not c, q, p carries n
    np.testing.assert_allclose(evaluate([grad], {X: x, Z: z})[0], want)
    np.testing.assert_allclose(tg.build([grad], [X, Z])(x, z), want)
