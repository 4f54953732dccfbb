"""simplify.linear: canonical linear index arithmetic with // and % by constants folded.

Every rewrite is checked by evaluating the expression before and after on
integer points, negative values included (floor semantics).
"""
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

import te_grad as tg
from te_grad import dsl
from te_grad.ir import Var
from te_grad.transform import substitute
from simplify.linear import coefficient, normalize

A, B, C = Var("a"), Var("b"), Var("c")


def value(e, env):
    """``e`` evaluated at the integer point ``env`` (``{Var: int}``) by the reference evaluator."""
    closed = substitute(e, {v: dsl.const(x) for v, x in env.items()})
    t = tg.compute((), lambda: dsl.cast("int64", closed), name="probe")
    return int(tg.evaluate([t], {})[0])


def test_class_substitution_folds_division():
    for p in range(2):
        j = 2 * A + p
        assert normalize(j // 2).same_as(A)
        assert normalize(j % 2).same_as(dsl.const(p))
        assert normalize((j + 1) // 2).same_as(A if p == 0 else A + 1)


def test_linear_terms_cancel_and_print_in_order():
    assert str(normalize(2 * (2 * A + 1) - 2 * (A + B) + 1)) == "2 * a - 2 * b + 3"
    assert str(normalize(2 * A + 1 - 2 * (A + B))) == "1 - 2 * b"
    assert normalize(A * B + A - A).same_as(A * B)


def test_conditions_on_constants_fold():
    assert normalize((2 * A + 1) % 2 == 1).same_as(dsl.const(True))
    e = dsl.if_then_else((2 * A) % 2 == 1, A, B)
    assert normalize(e).same_as(B)


def test_coefficient():
    assert coefficient(3 * A - B + 2, A) == 3
    assert coefficient(3 * A - B + 2, B) == -1
    assert coefficient(A // 2, A) is None
    assert coefficient(B // 2, A) == 0


_atoms = st.sampled_from([A, B, C])


def _expr():
    leaf = st.one_of(_atoms, st.integers(-7, 7).map(dsl.const))

    def extend(sub):
        return st.one_of(
            st.tuples(sub, sub).map(lambda p: p[0] + p[1]),
            st.tuples(sub, sub).map(lambda p: p[0] - p[1]),
            st.tuples(sub, st.integers(-4, 4)).map(lambda p: p[0] * p[1]),
            st.tuples(sub, st.integers(1, 5)).map(lambda p: p[0] // p[1]),
            st.tuples(sub, st.integers(1, 5)).map(lambda p: p[0] % p[1]),
            st.tuples(sub, sub).map(lambda p: dsl.minimum(p[0], p[1])),
        )
    return st.recursive(leaf, extend, max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(_expr(), st.tuples(st.integers(-9, 9), st.integers(-9, 9), st.integers(-9, 9)))
def test_normalize_preserves_value(e, point):
    env = dict(zip([A, B, C], point))
    assert value(normalize(e), env) == value(e, env), f"{e} -> {normalize(e)} at {point}"


def test_normalize_preserves_value_on_a_grid_of_class_substitutions():
    for m, p, k in itertools.product((2, 3, 4), range(4), range(-3, 4)):
        if p >= m:
            continue
        j = m * A + p
        for e in ((j + k) // m, (j + k) % m, (2 * j + k) // m, (j - B + k) // m):
            n = normalize(e)
            for a, b in itertools.product(range(-3, 4), range(-2, 3)):
                assert value(n, {A: a, B: b}) == value(e, {A: a, B: b}), f"{e} -> {n}"
