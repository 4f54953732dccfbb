"""Every user error is a tg.UserError (a tg.TeGradError) naming what is wrong."""
import numpy as np
import pytest

import te_grad as tg
from te_grad import ir


def user_error(fn, *needles):
    """Call ``fn``; it must raise a UserError whose message contains every needle."""
    with pytest.raises(tg.TeGradError) as info:
        fn()
    err = info.value
    assert isinstance(err, tg.UserError), type(err)
    assert not isinstance(err, tg.InternalError)
    msg = str(err)
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


def test_exception_hierarchy():
    assert issubclass(tg.UserError, tg.TeGradError) and issubclass(tg.InternalError, tg.TeGradError)
    assert issubclass(tg.UserError, ValueError)
    assert issubclass(tg.InternalError, RuntimeError)
    assert not issubclass(tg.UserError, tg.InternalError)
    assert not issubclass(tg.InternalError, tg.UserError)


# ---------------------------------------------------------------------------
# building expressions
# ---------------------------------------------------------------------------


def test_wrong_number_of_indices():
    X = tg.placeholder((3, 4), name="Xmat")
    i = ir.Var("i")
    user_error(lambda: X[i], "Xmat", "2 dimensions", "1 indices")
    user_error(lambda: X[i, i, i], "Xmat", "3 indices")
    S = tg.placeholder((), name="S")
    user_error(lambda: S[i], "S", "0 dimensions")
    user_error(lambda: tg.compute((3,), lambda i: X[i], name="T"), "Xmat")


def test_float_used_as_an_index():
    X = tg.placeholder((3,), name="X")
    F = tg.placeholder((3,), name="Fidx")
    user_error(lambda: tg.compute((3,), lambda i: X[F[i]]), "Fidx[i]", "X", "float32")
    user_error(lambda: tg.compute((3,), lambda i: X[i / 2]), "index 0 of tensor X", "float32")
    user_error(lambda: tg.compute((3,), lambda i: X[1.5]), "tensor X", "1.5")
    user_error(lambda: tg.compute((3,), lambda i: X[F]), "Fidx", "X")
    user_error(lambda: tg.compute((3,), lambda i: X[i > 0]), "X", "bool")
    user_error(lambda: X[0:2], "X", "slice")
    user_error(lambda: X[None], "X")
    user_error(lambda: X[...], "X")


def test_constant_index_out_of_bounds():
    X = tg.placeholder((3, 4), name="Xc")
    i = ir.Var("i")
    user_error(lambda: X[3, i], "Xc", "3", "dimension 0", "[3, 4]")
    user_error(lambda: X[i, 4], "Xc", "4", "dimension 1")
    user_error(lambda: X[i, -1], "Xc", "-1")
    user_error(lambda: X[tg.const(7), i], "Xc", "7")


def test_reduce_axis_used_outside_its_reduction():
    X = tg.placeholder((3, 4), name="X")
    k = tg.reduce_axis(4, "kk")
    user_error(lambda: tg.compute((3,), lambda i: X[i, k], name="Out"), "'kk'", "Out", "outside")
    user_error(lambda: tg.compute((3,), lambda i: tg.sum(X[i, k], axis=k) + X[i, k]), "'kk'")
    # used in where= of a reduction over another axis
    l = tg.reduce_axis(3, "l")
    user_error(lambda: tg.compute((3,), lambda i: tg.sum(X[l, 0], axis=l, where=k > 0)), "'kk'")


def test_same_axis_reduced_twice_in_nested_reductions():
    X = tg.placeholder((4, 4), name="X")
    k = tg.reduce_axis(4, "kn")
    user_error(lambda: tg.compute((4,), lambda i: tg.sum(X[i, k] * tg.max(X[k, k], axis=k), axis=k),
                                  name="Nest"), "'kn'", "twice", "Nest")
    user_error(lambda: tg.sum(X[k, k], axis=[k, k]), "twice")


def test_variable_from_another_compute():
    X = tg.placeholder((3,), name="X")
    stash = []
    tg.compute((3,), lambda outer: stash.append(outer) or X[outer], name="First")
    user_error(lambda: tg.compute((3,), lambda i: X[stash[0]], name="Second"),
               "'outer'", "Second", "another compute")
    loose = ir.Var("loose")
    user_error(lambda: tg.compute((3,), lambda i: X[i] * loose), "'loose'")


def test_bad_reduction_arguments():
    X = tg.placeholder((3,), name="X")
    i = ir.Var("i")
    k = tg.reduce_axis(3, "k")
    user_error(lambda: tg.sum(X[k], axis=i), "tg.sum", "reduce_axis")
    user_error(lambda: tg.max(X[k], axis=3), "tg.max")
    user_error(lambda: tg.sum(X[k], axis=[]), "tg.sum", "at least one")
    user_error(lambda: tg.sum(X[k] > 0, axis=k), "tg.sum", "condition")
    user_error(lambda: tg.min(X[k], axis=k, where=X[k]), "where=", "tg.min", "float32")
    user_error(lambda: tg.reduce_axis((3, 1), name="back"), "'back'", "[3, 1)")
    user_error(lambda: tg.reduce_axis((0, 2.5), name="frac"), "'frac'")
    user_error(lambda: tg.reduce_axis("abc", name="s"), "'abc'")
    user_error(lambda: tg.reduce_axis((1, 2, 3)), "(1, 2, 3)")


def test_unknown_intrinsic_and_bad_arity():
    X = tg.placeholder((3,), name="X")
    i = ir.Var("i")
    user_error(lambda: tg.call("foo", X[i]), "'foo'", "exp")
    user_error(lambda: tg.call("exp", X[i], X[i]), "tg.exp", "2")
    user_error(lambda: tg.call("log"), "tg.log", "0")


def test_floor_division_of_floats():
    X = tg.placeholder((3,), name="Xf")
    i = ir.Var("i")
    user_error(lambda: X[i] // 2, "'//'", "Xf[i]", "float32", "tg.floor")
    user_error(lambda: X[i] % 2.0, "'%'", "Xf[i]")
    user_error(lambda: 5 // X[i], "'//'", "Xf[i]")
    user_error(lambda: i // 2.0, "'//'")
    user_error(lambda: i // 0, "division by zero")
    user_error(lambda: i % tg.const(0), "division by zero")


def test_arithmetic_and_logic_on_the_wrong_kinds():
    i, j = ir.Var("i"), ir.Var("j")
    X = tg.placeholder((3,), name="X")
    user_error(lambda: (i < j) + (j < i), "two conditions", "i < j")
    user_error(lambda: (i < j) * (i > 0), "two conditions")
    user_error(lambda: -(i < j), "i < j", "~")
    user_error(lambda: ~i, "'~'", "int64")
    user_error(lambda: i & j, "'and'", "two conditions")
    user_error(lambda: (i < j) | X[i], "'or'")
    user_error(lambda: (i < j) < (j < i), "conditions")
    user_error(lambda: tg.if_then_else(i, 1.0, 0.0), "tg.if_then_else", "int64")
    user_error(lambda: tg.exp(i < j), "tg.exp", "condition")
    user_error(lambda: tg.maximum(i < j, j > i), "two conditions")
    user_error(lambda: tg.all(i < j, i + 1), "'and'")
    user_error(lambda: tg.all(i + 1), "tg.all", "i + 1")
    user_error(lambda: tg.any(X[i]), "tg.any", "X[i]")
    user_error(lambda: tg.logical_not(X[i]), "X[i]")


def test_expressions_have_no_python_truth_value():
    i, j = ir.Var("i"), ir.Var("j")
    X = tg.placeholder((3,), name="X")

    def branch():
        if i < j:
            return 1
        return 0
    user_error(branch, "i < j", "if_then_else")
    user_error(lambda: bool(X[i] + 1.0), "X[i] + 1.0")
    user_error(lambda: tg.compute((3,), lambda i: X[i] if X[i] > 0 else 0.0), "X[i] > 0")
    user_error(lambda: i > 0 and j > 0, "i > 0")
    user_error(lambda: min(i, j), "truth value")
    user_error(lambda: max(i, 3), "truth value")
    user_error(lambda: tg.compute((3,), lambda i: min(X[i], 0.0)), "X[i]")
    # i == j is TVM's structural check, not an error
    assert not bool(i == j) and bool(i == i)


def test_non_numbers_in_expressions():
    X = tg.placeholder((3,), name="Xs")
    i = ir.Var("i")
    user_error(lambda: X[i] + "a", "'a'", "str")
    user_error(lambda: X[i] + None, "None")
    user_error(lambda: X[i] + X, "tensor Xs", "Xs[...]")
    user_error(lambda: X[i] * [1, 2], "list")
    user_error(lambda: tg.const(X[i]), "X")
    user_error(lambda: tg.const("x"), "'x'")
    user_error(lambda: tg.const(1.5, "int32"), "1.5", "int32")
    user_error(lambda: tg.const(2 ** 40, "int32"), "int32", str(2 ** 40))
    user_error(lambda: iter(X), "Xs", "not iterable")
    user_error(lambda: [v for v in X], "Xs")


def test_unsupported_dtypes():
    user_error(lambda: tg.placeholder((3,), dtype="float16", name="H"), "float16", "float32")
    user_error(lambda: tg.placeholder((3,), dtype="complex64"), "complex64")
    user_error(lambda: tg.placeholder((3,), dtype="nonsense"), "nonsense")
    user_error(lambda: tg.cast("uint8", tg.const(1)), "uint8")
    user_error(lambda: tg.compute((3,), lambda i: i, dtype="float16"), "float16")


# ---------------------------------------------------------------------------
# tensors and compute
# ---------------------------------------------------------------------------


def test_bad_shapes():
    user_error(lambda: tg.placeholder((3, -1), name="Neg"), "'Neg'", "(3, -1)")
    user_error(lambda: tg.placeholder((2.0, 3), name="Flt"), "'Flt'", "2.0")
    user_error(lambda: tg.placeholder((True, 3), name="Bo"), "'Bo'")
    user_error(lambda: tg.placeholder("abc", name="Str"), "'Str'")
    user_error(lambda: tg.placeholder(None, name="Non"), "'Non'", "None")
    user_error(lambda: tg.placeholder(-2, name="Neg1"), "'Neg1'")
    user_error(lambda: tg.compute((3, -2), lambda i, j: 0.0, name="CNeg"), "'CNeg'")
    user_error(lambda: tg.compute((1.5,), lambda i: 0.0, name="CFlt"), "'CFlt'")
    # numpy integers are fine
    assert tg.placeholder((np.int64(3), np.int32(2))).shape == (3, 2)


def test_compute_lambda_with_wrong_arity():
    X = tg.placeholder((3, 4), name="X")
    user_error(lambda: tg.compute((3, 4), lambda i: X[i, 0], name="Ar"), "'Ar'", "2 dimensions", "1 index")
    user_error(lambda: tg.compute((3,), lambda i, j: X[i, j], name="Ar2"), "'Ar2'", "1 dimensions", "2 index")
    user_error(lambda: tg.compute((), lambda i: 0.0, name="Ar0"), "'Ar0'", "0 dimensions")


def test_compute_returning_the_wrong_thing():
    X = tg.placeholder((3,), name="Xw")
    user_error(lambda: tg.compute((3,), lambda i: (X[i], X[i]), name="Two"), "'Two'", "2 values")
    user_error(lambda: tg.compute((3,), lambda i: X, name="Whole"), "Xw")
    user_error(lambda: tg.compute((3,), lambda i: "text", name="Txt"), "'text'")


# ---------------------------------------------------------------------------
# evaluate and its feed
# ---------------------------------------------------------------------------


@pytest.fixture
def graph():
    A = tg.placeholder((2, 3), name="Ain")
    B = tg.placeholder((3,), dtype="int32", name="Bin")
    C = tg.compute((2, 3), lambda i, j: A[i, j] * B[j], name="Cout")
    return A, B, C


def test_feed_shape_mismatch(graph):
    A, B, C = graph
    b = np.zeros(3, np.int32)
    user_error(lambda: tg.evaluate([C], {A: np.zeros((3, 2), np.float32), B: b}), "Ain", "[2, 3]", "[3, 2]")
    user_error(lambda: tg.evaluate([C], {A: np.zeros(6, np.float32), B: b}), "Ain", "[6]")
    user_error(lambda: tg.evaluate([C], {A: np.zeros((2, 3), np.float32), B: 1}), "Bin", "[3]", "[]")


def test_feed_dtype_mismatch(graph):
    A, B, C = graph
    user_error(lambda: tg.evaluate([C], {A: np.zeros((2, 3)), B: np.zeros(3, np.int32)}),
               "Ain", "float32", "float64")
    user_error(lambda: tg.evaluate([C], {A: np.zeros((2, 3), np.float32), B: np.zeros(3, np.int64)}),
               "Bin", "int32", "int64")
    user_error(lambda: tg.evaluate([C], {A: [["a", "b", "c"]] * 2, B: np.zeros(3, np.int32)}), "Ain")


def test_missing_placeholder(graph):
    A, B, C = graph
    user_error(lambda: tg.evaluate([C], {A: np.zeros((2, 3), np.float32)}), "Bin")
    user_error(lambda: tg.evaluate([C], {}), "Ain", "Bin")


def test_feed_key_that_is_not_a_placeholder(graph):
    A, B, C = graph
    feed = {A: np.zeros((2, 3), np.float32), B: np.zeros(3, np.int32)}
    user_error(lambda: tg.evaluate([C], {**feed, C: np.zeros((2, 3), np.float32)}), "Cout", "not a placeholder")
    user_error(lambda: tg.evaluate([C], {**feed, "Ain": 1}), "'Ain'")


def test_evaluate_argument_types(graph):
    A, B, C = graph
    feed = {A: np.zeros((2, 3), np.float32), B: np.zeros(3, np.int32)}
    user_error(lambda: tg.evaluate(C, feed), "list")
    user_error(lambda: tg.evaluate([C, "x"], feed), "'x'")
    user_error(lambda: tg.evaluate([C], [(A, 1)]), "dict", "list")


def test_unused_placeholders_in_feed_are_ignored(graph):
    A, B, C = graph
    Unused = tg.placeholder((7,), name="Unused")
    out = tg.evaluate([C], {A: np.ones((2, 3), np.float32), B: np.arange(3, dtype=np.int32),
                            Unused: "not even an array"})[0]
    assert out.tolist() == [[0, 1, 2], [0, 1, 2]]


def test_runtime_errors_name_the_read():
    X = tg.placeholder((4,), name="Xrt")
    ids = tg.placeholder((2,), dtype="int64", name="ids")
    T = tg.compute((2,), lambda i: X[ids[i] * 2], name="Trt")
    msg = user_error(lambda: tg.evaluate([T], {X: np.zeros(4, np.float32), ids: np.array([1, 2])}),
                     "Xrt", "Trt", "[4]")
    assert "Xrt[ids[i] * 2]" in msg
    D = tg.compute((2,), lambda i: ids[i] // (ids[i] - 1), name="Div")
    user_error(lambda: tg.evaluate([D], {ids: np.array([0, 1])}), "division by zero", "Div")


def test_dtype_none_is_rejected():
    with pytest.raises(tg.UserError, match="dtype is required"):
        tg.placeholder((2,), dtype=None, name="X")


def test_lossy_list_feed_is_rejected():
    X = tg.placeholder((2,), dtype="int32", name="X")
    Y = tg.compute((2,), lambda i: X[i] * 2, name="Y")
    np.testing.assert_array_equal(tg.evaluate([Y], {X: [1.0, 2.0]})[0], [2, 4])
    with pytest.raises(tg.UserError, match="non-integral"):
        tg.evaluate([Y], {X: [1.5, 2.0]})


def test_whole_tensor_arithmetic_names_the_tensor():
    X = tg.placeholder((2,), name="X")
    for bad in (lambda: X + 1, lambda: 2 * X, lambda: -X, lambda: X / X):
        with pytest.raises(tg.UserError, match="whole tensor X"):
            bad()
