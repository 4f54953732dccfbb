"""Compiled kernels never give a silently wrong answer.

- A read guarded by a condition on data (the taken branch of an ``if_then_else``, a
  reduction's ``where``) whose index can leave its tensor: the static bounds proof cannot
  decide it, so the kernel checks it where it runs and fails exactly where the reference
  evaluator raises (also from C, and in gradients); it never reads outside the buffer.
- ``out=`` arrays sharing memory with an input or with each other are refused.
- Inputs may be given by placeholder name.
"""
import numpy as np
import pytest

import te_grad as tg
from simplify import simplify
from te_grad.testing import check_out_overlaps_refused

RNG = np.random.default_rng(7)


def _guarded_plain():
    X = tg.placeholder((4, 4), name="X")
    Y = tg.compute((4,), lambda i: tg.if_then_else(X[0, 0] > 0.5, 1.0, X[i + 3, i]), name="Y")
    return [Y], [X]


def _guarded_in_reduction():
    X = tg.placeholder((4, 4), name="X")
    k = tg.reduce_axis((0, 4), "k")
    R = tg.compute((4,), lambda i: tg.sum(tg.if_then_else(X[0, 0] > 0.5, 0.0, X[i + k, k]), axis=k), name="R")
    return [R], [X]


def _guarded_by_where():
    X = tg.placeholder((4, 4), name="X")
    k = tg.reduce_axis((0, 4), "k")
    W = tg.compute((4,), lambda i: tg.sum(X[i + k, 0], axis=k, where=X[k, 1] < 0.5), name="W")
    return [W], [X]


def _guarded_by_and():
    X = tg.placeholder((4, 4), name="X")
    Y = tg.compute((4,), lambda i: tg.if_then_else((X[0, 0] < 0.5) & (X[i + 3, i] > -5.0), 1.0, 0.0),
                   name="Y")
    return [Y], [X]


def _guarded_transpose():  # large enough to be tiled as a transpose (8 x 8 register blocks)
    X = tg.placeholder((64, 64), name="X")
    T = tg.compute((64, 64), lambda i, j: tg.if_then_else(X[0, 0] > 0.5, 1.0, X[j, i + 1]), name="T")
    return [T], [X]


def _guarded_gradient():
    X = tg.placeholder((4, 4), name="X")
    W = tg.placeholder((4,), name="W")
    Y = tg.compute((4,), lambda i: tg.if_then_else(X[0, 0] > 0.5, W[i], W[i] * X[i + 3, i]), name="Y")
    H = tg.placeholder((4,), name="H")
    dW, = tg.differentiate(Y, [W], head=H)
    return [dW], [X, W, H]


PROGRAMS = {"plain": _guarded_plain, "reduction": _guarded_in_reduction, "where": _guarded_by_where,
            "and": _guarded_by_and, "transpose": _guarded_transpose, "gradient": _guarded_gradient}


def _feeds(inputs, safe: bool):
    """Values for which the guarded read stays inside X (``safe``: X is all ones) or leaves it."""
    out = []
    for t in inputs:
        if t.name == "X":
            out.append(np.full(t.shape, 1.0 if safe else 0.0, dtype=t.dtype))
        else:
            out.append(RNG.standard_normal(t.shape).astype(t.dtype))
    return out


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_guarded_read_fails_where_the_evaluator_raises(name):
    outs, inputs = PROGRAMS[name]()
    kern = tg.build(outs, inputs)
    for safe in (True, False):
        arrays = _feeds(inputs, safe)
        feed = dict(zip(inputs, arrays))
        if safe:
            want = tg.evaluate(outs, feed)
            got = kern(*arrays)
            got = got if isinstance(got, tuple) else (got,)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-6)
            continue
        with pytest.raises(tg.UserError, match="outside tensor X"):
            tg.evaluate(outs, feed)
        with pytest.raises(tg.UserError, match="out of range .* of tensor X .*a read under a condition on the data"):
            kern(*arrays)


def test_non_affine_index_is_checked():
    X = tg.placeholder((10,), name="X")
    k = tg.reduce_axis((0, 4), "k")
    Y = tg.compute((4,), lambda i: tg.sum(X[i * k + 2], axis=k), name="Y")  # reaches X[11]
    k2 = tg.reduce_axis((0, 4), "k")
    Z = tg.compute((4,), lambda i: tg.sum(tg.if_then_else(i * k2 < 6, X[i * k2 + 1], 0.0), axis=k2), name="Z")
    x = np.arange(10, dtype=np.float32)
    with pytest.raises(tg.UserError, match="outside tensor X"):
        tg.evaluate([Y], {X: x})
    with pytest.raises(tg.UserError, match="index 11 is out of range .* tensor X .*non-affine index"):
        tg.build([Y], [X])(x)
    np.testing.assert_array_equal(tg.build([Z], [X])(x), tg.evaluate([Z], {X: x})[0])


def test_guarded_read_is_reported_by_simplify_and_checked():
    outs, _ = _guarded_plain()
    found = []
    simplify(outs, runtime=found)
    assert [str(c) for c in found] == ["X[i + 3, i] in Y"]


def test_proven_reads_keep_their_code():
    X = tg.placeholder((4, 4), name="X")
    Y = tg.compute((4,), lambda i: tg.if_then_else(X[0, 0] > 0.5, 1.0, X[i, 3 - i]), name="Y")
    found = []
    simplify([Y], runtime=found)
    assert found == []
    assert tg.build([Y], [X]).bound_checks is False


def test_exported_guarded_read_returns_the_index_error(tmp_path):
    from test_export import run_exported
    outs, inputs = _guarded_plain()
    kern = tg.build(outs, inputs)
    arrays = _feeds(inputs, safe=True)
    rc, _, got = run_exported(kern, arrays, "host", tmp_path, "guarded")
    assert rc == 0
    np.testing.assert_array_equal(got[0], kern(*arrays))
    rc, info, _ = run_exported(kern, _feeds(inputs, safe=False), "host", tmp_path, "guarded")
    assert rc == 1  # GUARDED_ERROR_INDEX
    assert kern.buffers[info[0]].name == "X" and info[1:3] == [0, 4]


# ---------------------------------------------------------------------------
# out= overlapping the inputs or another output
# ---------------------------------------------------------------------------

def _square():
    X = tg.placeholder((4, 4), name="X")
    shifted = tg.compute((4, 4), lambda i, j: X[(i + 1) % 4, j], name="shifted")
    transposed = tg.compute((4, 4), lambda i, j: X[j, i], name="transposed")
    return X, shifted, transposed


@pytest.mark.parametrize("which", ["shifted", "transposed"])
def test_out_aliasing_an_input_is_refused(which):
    X, shifted, transposed = _square()
    kern = tg.build([shifted if which == "shifted" else transposed], [X])
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    want = kern(x)
    with pytest.raises(tg.UserError, match=f"output {which} .*input X"):
        kern(x, out=x)
    np.testing.assert_array_equal(x, np.arange(16).reshape(4, 4))  # untouched
    big = np.zeros(40, np.float32)
    view_in, view_out = big[:16].reshape(4, 4), big[8:24].reshape(4, 4)  # partial overlap
    view_in[...] = x
    with pytest.raises(tg.UserError, match="shares memory"):
        kern(view_in, out=view_out)
    rows = np.zeros((4, 32), np.float32)
    rows[:, :4] = x
    inside = rows.reshape(-1)[4:20].reshape(4, 4)  # within the input's span, no common element
    assert np.may_share_memory(rows[:, :4], inside)
    np.testing.assert_array_equal(kern(rows[:, :4], out=inside), want)


def test_out_arrays_sharing_memory_are_refused():
    X, shifted, transposed = _square()
    kern = tg.build([shifted, transposed], [X])
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    o = np.empty((4, 4), np.float32)
    with pytest.raises(tg.UserError, match="output transposed .*output shifted"):
        kern(x, out=(o, o))
    both = np.empty(24, np.float32)
    with pytest.raises(tg.UserError, match="shares memory"):
        kern(x, out=(both[:16].reshape(4, 4), both[8:].reshape(4, 4)))
    a, b = np.empty((4, 4), np.float32), np.empty((4, 4), np.float32)
    got = kern(x, out=(a, b))
    assert got[0] is a and got[1] is b
    np.testing.assert_array_equal(b, x.T)


def test_lean_run_refuses_overlaps_too():
    X, shifted, _ = _square()
    kern = tg.build([shifted], [X])
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    with pytest.raises(tg.UserError, match="shares memory"):
        kern.run([x], [x])
    out = np.empty_like(x)
    kern.run([x], [out])
    np.testing.assert_array_equal(out, np.roll(x, -1, axis=0))


def test_overlap_check_for_built_kernels():
    X, shifted, transposed = _square()
    W = tg.placeholder((2, 8), name="W", dtype="float64")
    Z = tg.compute((2, 8), lambda i, j: W[i, j] * 2.0 + tg.cast("float64", X[j % 4, i]), name="Z")
    kern = tg.build([shifted, transposed, Z], [X, W])
    arrays = [RNG.standard_normal((4, 4)).astype(np.float32), RNG.standard_normal((2, 8))]
    assert check_out_overlaps_refused(kern, arrays) == 3 * 2 * 2 + 3 * 2  # whole and partial


# ---------------------------------------------------------------------------
# inputs by name
# ---------------------------------------------------------------------------

def _two_inputs():
    X = tg.placeholder((3,), name="X")
    W = tg.placeholder((3,), name="W")
    Z = tg.compute((3,), lambda i: X[i] * 10.0 + W[i], name="Z")
    return tg.build([Z], [X, W])


def test_inputs_by_name():
    kern = _two_inputs()
    x, w = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    want = x * 10 + w
    for got in (kern(x, w), kern(X=x, W=w), kern(W=w, X=x), kern(x, W=w)):
        np.testing.assert_array_equal(got, want)
    out = np.empty(3, np.float32)
    assert kern(W=w, X=x, out=out) is out


@pytest.mark.parametrize("args, named, message", [
    ((), {"Q": 1}, "no input named 'Q'"),
    (("x",), {"X": 1}, "'X' given both by position and by name"),
    ((), {"W": 1}, "missing input.* X"),
    (("x", "w"), {"W": 1}, "'W' given both by position and by name"),
])
def test_bad_named_inputs(args, named, message):
    kern = _two_inputs()
    values = {"x": np.zeros(3, np.float32), "w": np.zeros(3, np.float32)}
    with pytest.raises(tg.UserError, match=message):
        kern(*[values[a] for a in args], **{k: np.zeros(3, np.float32) for k in named})


def test_inputs_sharing_a_name_go_by_position():
    A = tg.placeholder((2,), name="A")
    B = tg.placeholder((2,), name="A")
    kern = tg.build([tg.compute((2,), lambda i: A[i] - B[i], name="D")], [A, B])
    with pytest.raises(tg.UserError, match="pass them by position"):
        kern(np.ones(2, np.float32), A=np.ones(2, np.float32))
    np.testing.assert_array_equal(kern(np.ones(2, np.float32), np.zeros(2, np.float32)), [1, 1])


def test_a_constant_producer_read_out_of_bounds_is_not_folded_away():
    """A producer read by an undecided read stays a buffer: folded into its reader (its
    value is the same at every index), the read would vanish with its check, and the
    kernel would answer where the evaluator refuses the read."""
    S0 = tg.compute((3, 2), lambda i, j: tg.const(1.5, "float64"), name="S0")
    X = tg.placeholder((3,), dtype="float64", name="X")
    S2 = tg.compute((3,), lambda i: tg.if_then_else(X[i] > 0.0, S0[i - 1, 0], tg.const(0.25, "float64")),
                    name="S2")
    kern = tg.build([S2], inputs=[X])
    taken = np.ones(3)
    with pytest.raises(tg.UserError, match="outside tensor S0"):
        tg.evaluate([S2], {X: taken})
    with pytest.raises(tg.UserError):
        kern(taken)
    never = -np.ones(3)  # the read is never taken: both compute the other branch
    np.testing.assert_array_equal(kern(never), tg.evaluate([S2], {X: never})[0])


@pytest.mark.parametrize("softmax", [False, True])  # a kernel whose table is its arguments; one with scratch
def test_run_pointers_refuses_a_wrong_count_of_addresses(softmax):
    """``run_pointers`` takes raw addresses: a missing one would leave a null entry in the
    kernel's table, so the counts are checked before anything runs."""
    X = tg.placeholder((3, 5), name="X")
    Y = tg.nn.softmax(X) if softmax else tg.compute((3, 5), lambda i, j: X[i, j] * 2.0, name="Y")
    kern = tg.build([Y], [X])
    a = RNG.standard_normal((3, 5)).astype("float32")
    out = np.empty((3, 5), dtype="float32")
    for ins, outs in (([], [out.ctypes.data]), ([a.ctypes.data], []), ([a.ctypes.data] * 2, [out.ctypes.data]),
                      ([a.ctypes.data, out.ctypes.data], [])):
        with pytest.raises(tg.UserError, match="run_pointers needs 1 input and 1 output addresses"):
            kern.run_pointers(ins, outs)
    kern.run_pointers([a.ctypes.data], [out.ctypes.data])
    np.testing.assert_allclose(out, tg.evaluate([Y], {X: a})[0], rtol=1e-5, atol=1e-7)


def test_a_read_under_a_condition_that_folds_to_true_is_proven_as_an_unconditional_one():
    """``if_then_else(1.5 > 0.5, X[i + 1], ...)``: the bounds proof took the float comparison as
    a condition it could not decide and left the read to a run-time check, which the emitter
    makes only under guards it cannot decide; the scheduler folded the guard away, and the
    kernel read one row past X. The read is now refused when the kernel is built."""
    x = tg.placeholder((3, 1), dtype="float64", name="X")
    y = tg.compute((3, 3), lambda i, j: tg.if_then_else(tg.const(1.5, "float64") > tg.const(0.5, "float64"),
                                                        x[i + 1, 0], x[(j + 1) % 3, 0]), name="Y")
    with pytest.raises(tg.UserError, match="outside tensor X"):
        tg.evaluate([y], {x: np.ones((3, 1))})
    with pytest.raises(tg.UserError, match=r"X\[i \+ 1, 0\] in Y can go out of bounds"):
        tg.build([y], [x])
    # folded to false: the read never runs, the other branch is what is computed
    z = tg.compute((3, 3), lambda i, j: tg.if_then_else(tg.const(0.5, "float64") > tg.const(1.5, "float64"),
                                                        x[i + 1, 0], x[(j + 1) % 3, 0]), name="Z")
    xv = np.arange(3.0).reshape(3, 1)
    np.testing.assert_array_equal(tg.build([z], [x])(xv), tg.evaluate([z], {x: xv})[0])


def test_cutting_selects_on_ranges_keeps_every_guard_it_cannot_decide_and_integer_wrap_around():
    """split_select_ranges folds only quasi-affine select conditions and normalizes only
    indices: a read guarded by ``(j < 5) | data`` stays under that guard and is checked where it
    runs (folding it on ``j < 5`` made it unconditional and unchecked: a read past Y); a guard
    mixing a constant comparison and an index test is refused when built, as it reaches past
    X; integer arithmetic on data keeps its int32 wrap-around; float32 constants compare in
    float32."""
    x, y = tg.placeholder((64, 16), dtype="float64", name="X"), tg.placeholder((12,), dtype="float64", name="Y")
    z = tg.compute((64, 16), lambda i, j: tg.if_then_else((j < 5) | (x[i, j] > 0.5), y[(j + 10) % 16], 0.0),
                   name="Z")
    for off in ([], ["split_select_ranges"]):
        with pytest.raises(tg.UserError, match="out of range"):
            tg.build([z], [x, y], threads=1, disabled_passes=off)(np.zeros((64, 16)), np.arange(12.0))
    x3 = tg.placeholder((64, 3), dtype="float64", name="X")
    true = tg.const(1.5, "float64") > tg.const(0.5, "float64")
    w = tg.compute((64, 3), lambda i, j: tg.if_then_else(true & (j < 2), x3[i, j], x3[i, j + 2]), name="W")
    with pytest.raises(tg.UserError, match="can go out of bounds"):
        tg.build([w], [x3])
    a = tg.placeholder((64, 16), dtype="int32", name="A")
    wrap = tg.compute((64, 16), lambda i, j: tg.if_then_else(j < 8, (a[i, j] * 8 + 3) // 8, a[i, j]), name="V")
    av = np.full((64, 16), 2 ** 29 + 5, dtype="int32")
    np.testing.assert_array_equal(tg.build([wrap], [a], threads=1)(av), tg.evaluate([wrap], {a: av})[0])
    f = tg.placeholder((64, 16), dtype="float32", name="F")
    near = tg.const(0.1, "float32") >= tg.const(0.1000000001, "float32")   # true in float32
    u = tg.compute((64, 16), lambda i, j: tg.if_then_else(j < 8, f[i, j], 1.0) * tg.if_then_else(near, f[i, j], -f[i, j]),
                   name="U")
    fv = np.random.default_rng(0).standard_normal((64, 16)).astype("float32")
    np.testing.assert_array_equal(tg.build([u], [f], threads=1)(fv), tg.evaluate([u], {f: fv})[0])
