"""te_grad.nn layout ops and broadcast arithmetic against numpy."""
import numpy as np
import pytest

import te_grad as tg
from te_grad import nn

RNG = np.random.default_rng(2)


def ph(shape, name, dtype="float64"):
    return tg.placeholder(shape, dtype, name)


def rand(shape, dtype="float64"):
    if np.dtype(dtype).kind == "i":
        return RNG.integers(-5, 6, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def ev(t, feed):
    out = tg.evaluate([t], feed)[0]
    assert out.dtype == np.dtype(t.dtype) and out.shape == t.shape
    return out


def same(got, want):
    """Layout ops move values: results must be bit-identical."""
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------
# reshape / flatten / transpose
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape,newshape", [
    ((2, 3, 4), (6, 4)), ((2, 3, 4), (4, 6)), ((2, 3, 4), (24,)), ((2, 3, 4), (2, 12)),
    ((2, 3, 4), (-1, 3)), ((6,), (2, 3)), ((6,), (1, 6, 1)), ((1, 6, 1), (3, 2)),
    ((4, 6), (2, 2, 3, 2)), ((3, 4, 5), (5, 4, 3)), ((2, 1, 3), (3, 2)), ((1,), ()),
    ((), (1, 1)), ((5, 7), (7, 5)), ((2, 3, 4), (2, -1, 2)), ((1, 1), (1,)),
])
def test_reshape(shape, newshape):
    X = ph(shape, "X")
    x = rand(shape)
    same(ev(nn.reshape(X, newshape), {X: x}), x.reshape(newshape))


def test_reshape_merges_and_splits_blocks_separately():
    X = ph((2, 3, 4, 5), "X")
    text = tg.show(nn.reshape(X, (6, 20)))
    assert "X[i // 3, i % 3, j // 5, j % 5]" in text


@pytest.mark.parametrize("shape", [(4,), (2, 3), (2, 3, 4), (1, 2, 3, 4), (3, 1)])
def test_flatten(shape):
    X = ph(shape, "X")
    x = rand(shape)
    out = nn.flatten(X)
    assert out.name == "flatten"
    same(ev(out, {X: x}), x.reshape(shape[0], -1))


@pytest.mark.parametrize("shape,axes", [((2, 3), None), ((2, 3, 4), None), ((2, 3, 4), (1, 0, 2)),
                                        ((2, 3, 4), (2, 0, 1)), ((2, 3, 4), (-1, 0, -2)),
                                        ((1, 2, 3, 4), (0, 3, 1, 2)), ((5,), (0,)), ((), None)])
def test_transpose(shape, axes):
    X = ph(shape, "X")
    x = rand(shape)
    same(ev(nn.transpose(X, axes), {X: x}), np.transpose(x, axes))


# ---------------------------------------------------------------------------
# concat / split
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("shapes,axis", [
    ([(2, 3)], 0), ([(2, 3), (4, 3)], 0), ([(2, 3), (2, 1), (2, 5)], 1), ([(2, 3), (2, 1), (2, 5)], -1),
    ([(1, 2, 3), (1, 2, 3), (1, 2, 3), (1, 2, 3)], 1), ([(3,), (0,), (2,)], 0), ([(2, 0), (2, 2)], 1),
])
def test_concat(shapes, axis):
    xs = [rand(s) for s in shapes]
    Xs = [ph(s, f"X{t}") for t, s in enumerate(shapes)]
    same(ev(nn.concat(Xs, axis), dict(zip(Xs, xs))), np.concatenate(xs, axis))


def test_concat_promotes_dtypes():
    A, B = ph((2,), "A", "float32"), ph((3,), "B", "float64")
    a, b = rand((2,), "float32"), rand((3,))
    out = nn.concat([A, B])
    assert out.dtype == "float64"
    same(ev(out, {A: a, B: b}), np.concatenate([a.astype("float64"), b]))
    E = ph((0,), "E", "float64")
    assert nn.concat([A, E]).dtype == "float64"  # an empty input still takes part in promotion
    assert nn.concat([E, E]).shape == (0,)


@pytest.mark.parametrize("shape,ios,axis", [
    ((6, 2), 3, 0), ((6, 2), 1, 0), ((2, 6), [2, 5], 1), ((2, 6), [0, 3, 3, 8], -1),
    ((3, 4, 5), [1], 1), ((4,), 4, 0), ((4,), [], 0),
])
def test_split(shape, ios, axis):
    X = ph(shape, "X")
    x = rand(shape)
    parts = nn.split(X, ios, axis)
    want = np.split(x, ios, axis)
    assert isinstance(parts, list) and len(parts) == len(want)
    for p, w in zip(parts, want):
        same(ev(p, {X: x}), w)


# ---------------------------------------------------------------------------
# pad / strided_slice
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape,pad_width", [
    ((3,), 1), ((3,), (1, 2)), ((2, 3), ((0, 1), (2, 0))), ((2, 3), ((1, 1),)), ((2, 3), (0, 0)),
    ((1, 2, 3, 3), ((0, 0), (0, 0), (1, 1), (2, 1))), ((2, 2), [[1, 0], [0, 3]]),
])
@pytest.mark.parametrize("value", [0.0, -2.5])
def test_pad(shape, pad_width, value):
    X = ph(shape, "X")
    x = rand(shape)
    same(ev(nn.pad(X, pad_width, value), {X: x}),
         np.pad(x, pad_width, mode="constant", constant_values=value))


def test_pad_int_tensor():
    X = ph((2, 2), "X", "int32")
    x = rand((2, 2), "int32")
    same(ev(nn.pad(X, 1, value=7), {X: x}), np.pad(x, 1, constant_values=7))


@pytest.mark.parametrize("shape,begin,end,strides", [
    ((6,), [1], [5], None), ((6,), [0], [6], [2]), ((7,), [1], [7], [3]), ((5, 6), [1, 0], [4, 6], [1, 2]),
    ((5, 6), [-4], [-1], None), ((5, 6), [0, 10], [5, 20], None), ((4, 5, 6), [1, 2], [3, 5], [1, 2]),
    ((6,), [5], [None], [-1]), ((6,), [None], [None], [-2]), ((5, 6), [4, 1], [0, 6], [-2, 2]),
    ((6,), [4], [2], None), ((3, 4), [None, -1], [None, None], [None, -3]),
])
def test_strided_slice(shape, begin, end, strides):
    X = ph(shape, "X")
    x = rand(shape)
    steps = strides or [None] * len(begin)
    sl = tuple(slice(b, e, s) for b, e, s in zip(begin, end, steps))
    same(ev(nn.strided_slice(X, begin, end, strides), {X: x}), x[sl])


# ---------------------------------------------------------------------------
# broadcast arithmetic
# ---------------------------------------------------------------------------

BINARY = [
    (nn.add, np.add), (nn.subtract, np.subtract), (nn.multiply, np.multiply),
    (nn.divide, np.divide), (nn.maximum, np.maximum), (nn.minimum, np.minimum),
]


@pytest.mark.parametrize("op,ref", BINARY, ids=[b[0].__name__ for b in BINARY])
@pytest.mark.parametrize("sa,sb", [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)),
                                   ((1,), (2, 3)), ((), (2, 3)), ((2, 3), ()), ((5, 1, 1), (1, 2, 1))])
def test_broadcast_binary(op, ref, sa, sb):
    A, B = ph(sa, "A"), ph(sb, "B")
    a, b = rand(sa), rand(sb) + (3.0 if op is nn.divide else 0.0)
    out = op(A, B)
    want = ref(a, b)
    assert out.shape == want.shape
    np.testing.assert_allclose(ev(out, {A: a, B: b}), want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("op,ref", BINARY + [(nn.power, np.power)],
                         ids=[b[0].__name__ for b in BINARY] + ["power"])
def test_broadcast_with_python_scalars(op, ref):
    A = ph((2, 3), "A", "float32")
    a = np.abs(rand((2, 3), "float32")) + 0.5
    left, right = op(A, 2.0), op(1.5, A)
    assert left.dtype == right.dtype == "float32"  # scalars are weakly typed
    np.testing.assert_allclose(ev(left, {A: a}), ref(a, np.float32(2.0)), rtol=1e-6)
    np.testing.assert_allclose(ev(right, {A: a}), ref(np.float32(1.5), a), rtol=1e-6)


def test_power_broadcast_float64():
    A, B = ph((3, 1), "A"), ph((4,), "B")
    a, b = np.abs(rand((3, 1))) + 0.1, rand((4,))
    np.testing.assert_allclose(ev(nn.power(A, B), {A: a, B: b}), a ** b, rtol=1e-12)


def test_integer_arithmetic_and_promotion():
    I, J = ph((2, 3), "I", "int32"), ph((3,), "J", "int64")
    F = ph((2, 3), "F", "float32")
    i, j, f = rand((2, 3), "int32"), rand((3,), "int64"), rand((2, 3), "float32")
    s = nn.add(I, J)
    assert s.dtype == "int64"
    same(ev(s, {I: i, J: j}), i.astype("int64") + j)
    same(ev(nn.multiply(I, 3), {I: i}), i * np.int32(3))
    assert nn.divide(I, 2).dtype == "float32"  # true division of integers gives float32
    assert nn.add(I, F).dtype == "float32"
    np.testing.assert_allclose(ev(nn.add(I, F), {I: i, F: f}), i + f, rtol=1e-6)


@pytest.mark.parametrize("shape,axis", [((2, 3), 1), ((2, 3, 4, 5), 1), ((2, 3, 4), -1), ((4, 2), 0)])
def test_bias_add(shape, axis):
    c = shape[axis]
    X, B = ph(shape, "X"), ph((c,), "B")
    x, b = rand(shape), rand((c,))
    bshape = [1] * len(shape)
    bshape[axis] = c
    same(ev(nn.bias_add(X, B, axis), {X: x, B: b}), x + b.reshape(bshape))


def test_broadcast_shape():
    assert nn.broadcast_shape("op", (2, 1, 4), (3, 1), ()) == (2, 3, 4)
    assert nn.broadcast_shape("op") == ()


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------

X = ph((2, 3, 4), "X")
ERRORS = [
    (lambda: nn.reshape(X, (5, 5)), r"reshape: cannot reshape X of shape \[2, 3, 4\] \(24 elements\)"),
    (lambda: nn.reshape(X, (-1, 5)), "reshape: cannot reshape X"),
    (lambda: nn.reshape(X, (-1, -1, 6)), "reshape: newshape must hold .* at most one -1"),
    (lambda: nn.reshape(X, (2, -2, 12)), "reshape: newshape must hold"),
    (lambda: nn.reshape(X, "ab"), "reshape: newshape must hold"),
    (lambda: nn.reshape(X, 2.5), "reshape: newshape must be a tuple"),
    (lambda: nn.flatten(ph((), "S")), "flatten: input S is 0-d"),
    (lambda: nn.transpose(X, (0, 1)), r"transpose: axes \(0, 1\) is not a permutation"),
    (lambda: nn.transpose(X, (0, 0, 1)), "transpose: axes .* is not a permutation"),
    (lambda: nn.transpose(X, (0, 1, 3)), "transpose: axis 3 is out of range"),
    (lambda: nn.transpose(X, 5), "transpose: axes must be a permutation"),
    (lambda: nn.concat([], 0), "concat: expects a non-empty list"),
    (lambda: nn.concat(X, 0), "concat: expects a non-empty list"),
    (lambda: nn.concat([X, ph((2, 4, 4), "Y")], 0), r"concat: Y of shape \[2, 4, 4\] does not match"),
    (lambda: nn.concat([X, ph((2, 3), "Y")], 0), "concat: Y of shape .* does not match"),
    (lambda: nn.concat([X, X], 3), "concat: axis 3 is out of range"),
    (lambda: nn.concat([X, 1.0], 0), "concat: every input must be a tensor"),
    (lambda: nn.split(X, 2, 1), "split: 2 sections do not divide axis 1 of X"),
    (lambda: nn.split(X, 0, 1), "split: 0 sections"),
    (lambda: nn.split(X, [2, 1], 1), r"split: split indices must be sorted"),
    (lambda: nn.split(X, [-1], 1), r"split: split indices must be sorted non-negative"),
    (lambda: nn.split(X, 1.5, 1), "split: indices_or_sections must be"),
    (lambda: nn.split(X, 1, -4), "split: axis -4 is out of range"),
    (lambda: nn.pad(X, -1), "pad: pad_width must be"),
    (lambda: nn.pad(X, ((1, 1), (1, 1))), "pad: pad_width must be"),
    (lambda: nn.pad(X, ((1, 1, 1),)), "pad: pad_width must be"),
    (lambda: nn.pad(X, 1, value="a"), "pad: value must be a number"),
    (lambda: nn.strided_slice(X, [0], [1], [0]), "strided_slice: strides must be non-zero"),
    (lambda: nn.strided_slice(X, [0, 0], [1], None), "strided_slice: begin .* must have the same"),
    (lambda: nn.strided_slice(X, [0] * 4, [1] * 4), "strided_slice: .*at most the rank 3"),
    (lambda: nn.strided_slice(X, [0.5], [1]), "strided_slice: begin must be a list of ints"),
    (lambda: nn.add(X, ph((3, 3), "Y")), r"add: shapes \[2, 3, 4\] and \[3, 3\] do not broadcast"),
    (lambda: nn.multiply(ph((2,), "A"), ph((3,), "B")), "multiply: shapes .* do not broadcast"),
    (lambda: nn.subtract(1.0, 2.0), "subtract: at least one operand must be a tensor"),
    (lambda: nn.divide(X, "a"), "divide: second operand must be a tensor or a Python number"),
    (lambda: nn.power([1], X), "power: first operand must be a tensor or a Python number"),
    (lambda: nn.bias_add(X, ph((4,), "B")), r"bias_add: bias B has length 4 but axis 1 of X has size 3"),
    (lambda: nn.bias_add(X, ph((3, 1), "B")), "bias_add: bias B must be 1-D"),
    (lambda: nn.bias_add(X, ph((3,), "B"), axis=3), "bias_add: axis 3 is out of range"),
]


@pytest.mark.parametrize("build,match", ERRORS)
def test_errors(build, match):
    with pytest.raises(tg.TeGradError, match=match):
        build()


def test_pad_value_must_fit_dtype():
    with pytest.raises(tg.TeGradError, match="pad: value 2.5 does not fit the dtype of I"):
        nn.pad(ph((2,), "I", "int32"), 1, value=2.5)
    P = nn.pad(ph((2,), "F", "float32"), 1, value=1)
    assert P.dtype == "float32"
