"""The printer: deterministic, deduplicated names, Python precedence, readable reductions."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import te_grad as tg
from te_grad import ir
from te_grad.printer import expr_to_str, show_html


def build_graph():
    A = tg.placeholder((64, 32), name="A")
    B = tg.placeholder((32, 16), name="B")
    k = tg.reduce_axis((0, 32), name="k")
    C = tg.compute((64, 16), lambda i, j: tg.sum(A[i, k] * B[k, j], axis=k), name="C")
    T1 = tg.compute((64, 16), lambda i, j: tg.maximum(C[i, j], 0.0), name="T")
    T2 = tg.compute((16, 64), lambda i, j: T1[j, i] * 2.0 + C[j, i], name="T")
    return T2


def test_show_is_deterministic():
    a, b = tg.show(build_graph()), tg.show(build_graph())
    assert a == b
    assert tg.show([build_graph()]) == a


def test_show_of_a_matmul_reads_like_python():
    text = tg.show(build_graph())
    assert text.splitlines() == [
        "input A: float32[64, 32]",
        "input B: float32[32, 16]",
        "C[i, j] = sum(A[i, k] * B[k, j] for k in range(32))    # float32[64, 16]",
        "T[i, j] = maximum(C[i, j], 0.0)    # float32[64, 16]",
        "T_1[i, j] = T[j, i] * 2.0 + C[j, i]    # float32[16, 64]",
    ]


def test_two_placeholders_with_one_name():
    X1 = tg.placeholder((3,), name="X")
    X2 = tg.placeholder((3,), name="X")
    T = tg.compute((3,), lambda i: X1[i] - X2[i], name="T")
    assert tg.show(T).splitlines() == [
        "input X: float32[3]",
        "input X_1: float32[3]",
        "T[i] = X[i] - X_1[i]    # float32[3]",
    ]
    # names that already carry a suffix do not collide
    Y1 = tg.placeholder((3,), name="Y")
    Y2 = tg.placeholder((3,), name="Y_1")
    Y3 = tg.placeholder((3,), name="Y")
    U = tg.compute((3,), lambda i: Y1[i] + Y2[i] + Y3[i], name="U")
    assert tg.show(U).splitlines()[-1] == "U[i] = Y[i] + Y_1[i] + Y_2[i]    # float32[3]"


def test_two_axes_with_one_name_in_one_formula():
    X = tg.placeholder((3, 3), name="X")
    ii = tg.reduce_axis(3, name="i")
    T = tg.compute((3,), lambda i: tg.sum(X[i, ii], axis=ii), name="T")
    assert tg.show(T).splitlines()[-1] == "T[i] = sum(X[i, i_1] for i_1 in range(3))    # float32[3]"
    a, b = ir.Var("i"), ir.Var("i")
    assert expr_to_str(a + b * a) == "i + i_1 * i"
    # each formula has its own scope for axis names
    U = tg.compute((3,), lambda i: T[i] + 1.0, name="U")
    assert tg.show(U).splitlines()[-1] == "U[i] = T[i] + 1.0    # float32[3]"


def test_precedence_of_arithmetic():
    a, b, c = (ir.Var(n, "float32") for n in "abc")
    i, j, k = (ir.Var(n) for n in "ijk")
    cases = [
        (a - (b - c), "a - (b - c)"),
        (a - b - c, "a - b - c"),
        ((a + b) * c, "(a + b) * c"),
        (a + b * c, "a + b * c"),
        (a / (b * c), "a / (b * c)"),
        (a / b * c, "a / b * c"),
        (-(a + b), "-(a + b)"),
        (-a * b, "-a * b"),
        (-(a * b), "-(a * b)"),
        (a ** b ** c, "a ** b ** c"),
        ((a ** b) ** c, "(a ** b) ** c"),
        ((-a) ** b, "(-a) ** b"),
        (-(a ** b), "-a ** b"),
        (a ** -b, "a ** (-b)"),
        (i // (j * k), "i // (j * k)"),
        (i // j * k, "i // j * k"),
        ((i + 1) % 3, "(i + 1) % 3"),
        (i - -1, "i - -1"),
        (tg.maximum(i + 1, j) * 2, "maximum(i + 1, j) * 2"),
        (tg.exp(a + b) * c, "exp(a + b) * c"),
        (tg.cast("float32", i) * a, "float32(i) * a"),
    ]
    for e, want in cases:
        assert expr_to_str(e) == want
        assert str(e) == want


def test_precedence_of_conditions():
    i, j, k = (ir.Var(n) for n in "ijk")
    cases = [
        ((i < j) & (j < k), "(i < j) & (j < k)"),
        ((i < j) | (j < k) & (k < 3), "(i < j) | (j < k) & (k < 3)"),
        (((i < j) | (j < k)) & (k < 3), "((i < j) | (j < k)) & (k < 3)"),
        (~(i < j), "~(i < j)"),
        (~((i < j) & (j < k)), "~((i < j) & (j < k))"),
        (i + 1 < j * 2, "i + 1 < j * 2"),
        ((i < j) == (j < k), "(i < j) == (j < k)"),
        (tg.all(i >= 0, i < 4), "(i >= 0) & (i < 4)"),
        (tg.if_then_else(i == j, 1.0, 0.0), "if_then_else(i == j, 1.0, 0.0)"),
    ]
    for e, want in cases:
        assert expr_to_str(e) == want


def test_reductions_print_as_generator_expressions():
    X = tg.placeholder((4, 5, 6), name="X")
    k = tg.reduce_axis((1, 5), "k")
    l = tg.reduce_axis(6, "l")
    T = tg.compute((4,), lambda i: tg.max(X[i, k, l], axis=[k, l], where=k < l), name="T")
    assert tg.show(T).splitlines()[-1] == \
        "T[i] = max(X[i, k, l] for k in range(1, 5) for l in range(6) if k < l)    # float32[4]"
    i = ir.Var("i")
    t = ir.ReduceAxis("t", "int64", tg.const(0), i + 1)
    assert expr_to_str(tg.sum(X[i, 0, t] * 2.0, axis=t) + 1.0) == \
        "sum(X[i, 0, t] * 2.0 for t in range(i + 1)) + 1.0"


def test_nested_reductions_with_one_axis_name():
    X = tg.placeholder((4, 4), name="X")
    k_outer, k_inner = tg.reduce_axis(4, "k"), tg.reduce_axis(4, "k")
    T = tg.compute((4,), lambda i: tg.sum(X[i, k_outer] * tg.max(X[k_outer, k_inner], axis=k_inner),
                                          axis=k_outer), name="T")
    assert tg.show(T).splitlines()[-1] == (
        "T[i] = sum(X[i, k] * max(X[k, k_1] for k_1 in range(4)) for k in range(4))    # float32[4]")


def test_constants_and_scalars():
    S = tg.placeholder((), name="S")
    T = tg.compute((), lambda: S[()] * -1.5 + tg.const(True, "float32"), name="T")
    assert tg.show(T).splitlines() == ["input S: float32[]", "T = S[()] * -1.5 + 1.0    # float32[]"]
    i = ir.Var("i")
    assert expr_to_str(tg.if_then_else(i < 0, tg.const(-np.inf), tg.const(np.inf))) == \
        "if_then_else(i < 0, -inf, inf)"
    assert expr_to_str((i < 0) & True) == "(i < 0) & True"


def test_repr_and_html():
    X = tg.placeholder((3,), name="X")
    i = ir.Var("i")
    e = X[i] * 2.0 + 1.0
    assert repr(e) == "X[i] * 2.0 + 1.0"
    assert repr(i) == "i"
    assert repr(tg.reduce_axis(3, "k")) == "k"
    T = tg.compute((3,), lambda i: tg.if_then_else(X[i] < 0.0, X[i], 0.0), name="T")
    html = show_html(T)
    assert html.startswith("<pre>") and "&lt;" in html and "<pre>" not in html[5:]


# ---------------------------------------------------------------------------
# property: the printed text of an index expression is Python with the same value
# ---------------------------------------------------------------------------


def _trees():
    leaves = st.one_of(st.sampled_from(["i", "j"]), st.integers(-5, 5))
    ops = st.sampled_from(["+", "-", "*", "//", "%", "min", "max", "neg", "<", "&"])
    return st.recursive(leaves, lambda sub: st.tuples(ops, sub, sub), max_leaves=10)


def _build(t, i, j):
    """(expression, is_condition); conditions become ints with if_then_else when needed."""
    if t in ("i", "j"):
        return (i if t == "i" else j), False
    if isinstance(t, int):
        return tg.const(t), False
    op, a, b = t
    x, xc = _build(a, i, j)
    if op == "neg":
        return (-tg.if_then_else(x, 1, 0) if xc else -x), False
    y, yc = _build(b, i, j)
    if op == "&":
        return ((x if xc else x > 0) & (y if yc else y < 2)), True
    x = tg.if_then_else(x, 1, 0) if xc else x
    y = tg.if_then_else(y, 1, 0) if yc else y
    if op == "<":
        return x < y, True
    if op in ("//", "%"):
        y = tg.maximum(y, 1) if not isinstance(y, ir.Const) or y.value == 0 else y
    fn = {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "//": lambda: x // y,
          "%": lambda: x % y, "min": lambda: tg.minimum(x, y), "max": lambda: tg.maximum(x, y)}
    return fn[op](), False


@settings(max_examples=100, deadline=None)
@given(_trees())
def test_printed_expressions_evaluate_like_python(tree):
    i, j = ir.Var("i"), ir.Var("j")
    text = expr_to_str(_build(tree, i, j)[0])
    U = tg.compute((4, 3), lambda i, j: _build(tree, i, j)[0], name="U")
    assert tg.show(U) == f"U[i, j] = {text}    # {U.dtype}[4, 3]"
    got = tg.evaluate([U], {})[0]
    env = {"minimum": min, "maximum": max,
           "if_then_else": lambda c, t, f: t if c else f}
    for a in range(4):
        for b in range(3):
            want = eval(text, dict(env), {"i": a, "j": b})  # noqa: S307 - text made by the printer
            assert int(got[a, b]) == int(want), (text, a, b)
