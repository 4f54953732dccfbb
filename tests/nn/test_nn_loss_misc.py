"""te_grad.nn embedding and losses against numpy, and structural rules every op follows."""
import numpy as np
import pytest

import te_grad as tg
from te_grad import nn

from nn_helpers import close, ev, ph, random_arrays
from te_grad.graph import topo_order
from te_grad.ir import Binary, Compare, ComputeOp, Const, Read, Reduce, Select, Unary, Var
from te_grad.visitor import Visitor

RNG = np.random.default_rng(3)
rand = random_arrays(4)


# ---------------------------------------------------------------------------
# embedding
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("ids_shape", [(), (4,), (2, 3), (2, 1, 2)])
@pytest.mark.parametrize("ids_dtype", ["int32", "int64"])
def test_embedding(ids_shape, ids_dtype):
    V, D = 6, 3
    T, I = ph((V, D), "T"), ph(ids_shape, "I", ids_dtype)
    table = rand((V, D))
    ids = RNG.integers(0, V, size=ids_shape).astype(ids_dtype)
    out = nn.embedding(T, I)
    assert out.shape == ids_shape + (D,) and out.dtype == "float64"
    np.testing.assert_array_equal(ev(out, {T: table, I: ids}), table[ids])


def test_embedding_float32_table_and_repeated_ids():
    T, I = ph((3, 2), "T", "float32"), ph((5,), "I", "int32")
    table = rand((3, 2), "float32")
    ids = np.array([2, 2, 0, 1, 2], dtype="int32")
    np.testing.assert_array_equal(ev(nn.embedding(T, I), {T: table, I: ids}), table[ids])


@pytest.mark.parametrize("shape,ind_shape,axis", [((5,), (3,), 0), ((4, 5), (2, 3), 1), ((4, 5), (), 0),
                                                  ((3, 4, 2), (5,), -2), ((3, 4, 2), (2, 2), 2)])
def test_take(shape, ind_shape, axis):
    X, I = ph(shape, "X"), ph(ind_shape, "I", "int64")
    x = rand(shape)
    ind = RNG.integers(0, shape[axis], size=ind_shape).astype("int64")
    out = nn.take(X, I, axis)
    want = np.take(x, ind, axis=axis)
    assert out.shape == want.shape
    np.testing.assert_array_equal(ev(out, {X: x, I: ind}), want)


def test_embedding_id_out_of_range_is_an_error():
    T, I = ph((3, 2), "T"), ph((2,), "I", "int64")
    with pytest.raises(tg.TeGradError, match="outside tensor T"):
        tg.evaluate([nn.embedding(T, I)], {T: rand((3, 2)), I: np.array([0, 3])})


# ---------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 2)])
def test_mse_loss(shape):
    P, Q = ph(shape, "P"), ph(shape, "Q")
    p, q = rand(shape), rand(shape)
    out = nn.mse_loss(P, Q)
    assert out.shape == ()
    close(ev(out, {P: p, Q: q}), np.mean((p - q) ** 2))


def bce_ref(p, t):
    with np.errstate(divide="ignore"):
        lp, lq = np.maximum(np.log(p), -100.0), np.maximum(np.log(1.0 - p), -100.0)
    return np.mean(-(t * lp + (1.0 - t) * lq))


@pytest.mark.parametrize("shape", [(1,), (6,), (2, 3)])
def test_binary_cross_entropy(shape):
    P, T = ph(shape, "P"), ph(shape, "T")
    p = RNG.uniform(0.01, 0.99, size=shape)
    t = RNG.uniform(0.0, 1.0, size=shape)
    out = nn.binary_cross_entropy(P, T)
    assert out.shape == ()
    close(ev(out, {P: p, T: t}), bce_ref(p, t))


def test_binary_cross_entropy_clamps_the_logarithm():
    P, T = ph((4,), "P"), ph((4,), "T")
    p, t = np.array([0.0, 1.0, 1.0, 0.5]), np.array([1.0, 0.0, 1.0, 0.5])
    got = ev(nn.binary_cross_entropy(P, T), {P: p, T: t})
    assert np.isfinite(got)
    close(got, bce_ref(p, t))  # (100 + 100 + 0 + log 2) / 4


def sce_ref(x, labels):
    m = x.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]
    return np.mean(lse - x[np.arange(len(labels)), labels])


@pytest.mark.parametrize("n,c", [(1, 1), (1, 4), (5, 3)])
@pytest.mark.parametrize("label_dtype", ["int32", "int64"])
def test_softmax_cross_entropy(n, c, label_dtype):
    X, L = ph((n, c), "X"), ph((n,), "L", label_dtype)
    x = rand((n, c)) * 3
    labels = RNG.integers(0, c, size=n).astype(label_dtype)
    out = nn.softmax_cross_entropy(X, L)
    assert out.shape == ()
    close(ev(out, {X: x, L: labels}), sce_ref(x, labels))


def test_softmax_cross_entropy_is_stable():
    X, L = ph((2, 3), "X"), ph((2,), "L", "int64")
    x = np.array([[1000.0, 0.0, -1000.0], [5000.0, 5001.0, 4999.0]])
    labels = np.array([2, 1])
    got = ev(nn.softmax_cross_entropy(X, L), {X: x, L: labels})
    assert np.isfinite(got)
    close(got, sce_ref(x, labels))
    X32 = ph((2, 3), "X", "float32")
    got32 = ev(nn.softmax_cross_entropy(X32, L), {X32: x.astype("float32"), L: labels})
    close(got32, sce_ref(x, labels), "float32")


def test_losses_float32():
    P, Q = ph((3, 4), "P", "float32"), ph((3, 4), "Q", "float32")
    p = RNG.uniform(0.1, 0.9, size=(3, 4)).astype("float32")
    q = RNG.uniform(0.0, 1.0, size=(3, 4)).astype("float32")
    close(ev(nn.mse_loss(P, Q), {P: p, Q: q}), np.mean((p - q).astype("float64") ** 2), "float32")
    close(ev(nn.binary_cross_entropy(P, Q), {P: p, Q: q}), bce_ref(p.astype("float64"), q), "float32")


# ---------------------------------------------------------------------------
# structure: one top-level reduction per compute, quasi-affine indices and guards
# ---------------------------------------------------------------------------

def _graphs():
    X4, W = ph((2, 4, 7, 7), "X"), ph((6, 2, 3, 3), "W")
    X2, M = ph((3, 5), "X"), ph((4, 5), "M")
    X3 = ph((2, 3, 4), "X")
    G, I = ph((5,), "G"), ph((2, 3), "I", "int32")
    L = ph((3,), "L", "int64")
    yield "dense", nn.dense(X2, M, ph((4,), "b"))
    yield "matmul", nn.matmul(X2, M, transpose_b=True)
    yield "batch_matmul", nn.batch_matmul(X3, ph((2, 4, 3), "B"))
    yield "conv2d", nn.conv2d(X4, W, stride=2, padding=(1, 0, 2, 1), dilation=(1, 2), groups=2,
                              bias=ph((6,), "b"))
    yield "conv2d", nn.conv2d(X4, ph((8, 1, 3, 3), "W"), padding=1, groups=4)
    yield "conv2d_transpose", nn.conv2d_transpose(X4, ph((4, 3, 3, 3), "W"), stride=2, padding=1,
                                                  output_padding=1, groups=2)
    yield "max_pool2d", nn.max_pool2d(X4, 3, 2, 1, dilation=2)
    yield "avg_pool2d", nn.avg_pool2d(X4, 3, 2, (1, 0, 1, 1), count_include_pad=False)
    yield "global_avg_pool2d", nn.global_avg_pool2d(X4)
    yield "global_max_pool2d", nn.global_max_pool2d(X4)
    for name in ("relu", "leaky_relu", "sigmoid", "tanh", "gelu"):
        yield name, getattr(nn, name)(X3)
    yield "softmax", nn.softmax(X3, axis=1)
    yield "log_softmax", nn.log_softmax(X3, axis=-1)
    yield "layer_norm", nn.layer_norm(X2, G, G)
    yield "batch_norm", nn.batch_norm(X4, ph((4,), "g"), ph((4,), "b"))
    yield "reshape", nn.reshape(X3, (4, 6))
    yield "flatten", nn.flatten(X4)
    yield "transpose", nn.transpose(X3, (2, 0, 1))
    yield "concat", nn.concat([X3, X3, X3], axis=2)
    yield "split", nn.split(X3, [1, 3], axis=2)[1]
    yield "pad", nn.pad(X3, ((0, 1), (2, 0), (1, 1)))
    yield "strided_slice", nn.strided_slice(X3, [1, 2], [None, 0], [1, -2])
    for name in ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power"):
        yield name, getattr(nn, name)(X3, ph((3, 1), "Y"))
    yield "bias_add", nn.bias_add(X4, ph((4,), "b"))
    yield "embedding", nn.embedding(M, I)
    yield "take", nn.take(X3, I, axis=1)
    yield "mse_loss", nn.mse_loss(X2, X2)
    yield "binary_cross_entropy", nn.binary_cross_entropy(X2, X2)
    yield "softmax_cross_entropy", nn.softmax_cross_entropy(X2, L)


GRAPHS = list(_graphs())


def _has_reduce(e) -> bool:
    found = []

    class V(Visitor):
        def visit_Reduce(self, node):
            found.append(node)

    V().visit(e)
    return bool(found)


def _quasi_affine(e) -> bool:
    if isinstance(e, Var):
        return True
    if isinstance(e, Const):
        return isinstance(e.value, int)
    if isinstance(e, Unary) and e.op == "neg":
        return _quasi_affine(e.a)
    if isinstance(e, Binary):
        if e.op in ("add", "sub"):
            return _quasi_affine(e.a) and _quasi_affine(e.b)
        if e.op == "mul":
            return _quasi_affine(e.a) and _quasi_affine(e.b) and \
                (isinstance(e.a, Const) or isinstance(e.b, Const))
        if e.op in ("floordiv", "floormod"):
            return _quasi_affine(e.a) and isinstance(e.b, Const)
    return False


def _affine_condition(c) -> bool:
    if isinstance(c, Compare):
        return _quasi_affine(c.a) and _quasi_affine(c.b)
    if isinstance(c, Binary) and c.op in ("and", "or"):
        return _affine_condition(c.a) and _affine_condition(c.b)
    if isinstance(c, Unary) and c.op == "not":
        return _affine_condition(c.a)
    return isinstance(c, Const)


class _IndexChecker(Visitor):
    def __init__(self):
        self.bad, self.data_dependent = [], []

    def visit_Read(self, node: Read):
        for ix in node.indices:
            if _has_read(ix):
                self.data_dependent.append(node)
            elif not _quasi_affine(ix):
                self.bad.append(node)
            self.visit(ix)

    def visit_Select(self, node: Select):
        if not _has_read(node.cond) and not _affine_condition(node.cond):
            self.bad.append(node.cond)
        self.generic_visit(node)


def _has_read(e) -> bool:
    if isinstance(e, Read):
        return True
    return any(_has_read(c) for c in e.children())


@pytest.mark.parametrize("op,out", GRAPHS, ids=[f"{g[0]}-{t}" for t, g in enumerate(GRAPHS)])
def test_structure(op, out):
    computes = [t for t in topo_order([out]) if isinstance(t.op, ComputeOp)]
    assert computes[-1] is out
    for t in computes:
        body = t.op.body
        # meaningful names: every tensor is named after an op of te_grad.nn
        assert t.name != "compute"
        assert t.name.split("_")[0] in {n.split("_")[0] for n in nn.__all__} | {"batch", "layer"}, t.name
        # at most one reduction per compute, and only at the top level
        if isinstance(body, Reduce):
            assert not _has_reduce(body.body), f"nested reduction in {t.name}"
            assert body.where is None or not _has_reduce(body.where)
        else:
            assert not _has_reduce(body), f"reduction below the top of {t.name}"
        checker = _IndexChecker()
        checker.visit(body)
        assert not checker.bad, f"non quasi-affine index or guard in {t.name}: {checker.bad}"
        if op not in ("embedding", "take", "softmax_cross_entropy", "max_pool2d", "global_max_pool2d"):
            assert not checker.data_dependent, t.name
    assert out.name.startswith(op)
    assert tg.show(out)  # every op prints


def test_named_parts_of_composite_ops():
    X = ph((2, 3), "X")
    names = lambda t: [s.name for s in topo_order([t]) if not s.is_placeholder]  # noqa: E731
    assert names(nn.softmax(X)) == ["softmax_max", "softmax_exp", "softmax_sum", "softmax"]
    assert names(nn.log_softmax(X)) == ["log_softmax_max", "log_softmax_sum", "log_softmax"]
    assert names(nn.layer_norm(X)) == ["layer_norm_mean", "layer_norm_var", "layer_norm"]
    assert names(nn.avg_pool2d(ph((1, 1, 4, 4), "P"), 2)) == ["avg_pool2d_sum", "avg_pool2d"]
    assert names(nn.dense(X, ph((4, 3), "W"), ph((4,), "b"))) == ["dense", "dense_bias"]
    x4, w4, b4 = ph((1, 2, 3, 3), "X"), ph((2, 2, 1, 1), "W"), ph((2,), "b")
    assert names(nn.conv2d(x4, w4, bias=b4)) == ["conv2d", "conv2d_bias"]
    assert names(nn.conv2d_transpose(x4, w4, bias=b4)) == ["conv2d_transpose", "conv2d_transpose_bias"]


def test_all_is_exported():
    for name in nn.__all__:
        assert callable(getattr(nn, name))
        assert getattr(nn, name).__doc__, name


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------

P, Q = ph((3, 4), "P"), ph((3, 4), "Q")
ERRORS = [
    (lambda: nn.embedding(ph((5, 2), "T"), ph((3,), "F")), "embedding: ids F must have dtype int32 or int64"),
    (lambda: nn.embedding(ph((5,), "T"), ph((3,), "I", "int32")), "embedding: table T must be 2-D"),
    (lambda: nn.embedding(ph((0, 2), "T"), ph((3,), "I", "int32")), "embedding: table T has no rows"),
    (lambda: nn.embedding(ph((5, 2), "T"), [1, 2]), "embedding: ids must be a tensor"),
    (lambda: nn.take(P, ph((2,), "F")), "take: indices F must have dtype int32 or int64"),
    (lambda: nn.take(P, ph((2,), "I", "int32"), axis=2), "take: axis 2 is out of range"),
    (lambda: nn.take(ph((2, 0), "E"), ph((2,), "I", "int32"), axis=1), "take: axis 1 of E is empty"),
    (lambda: nn.mse_loss(P, ph((4, 3), "R")), r"mse_loss: pred P has shape \[3, 4\] but target R"),
    (lambda: nn.mse_loss(P, ph((3, 4), "R", "int32")), "mse_loss: target R must have a float dtype"),
    (lambda: nn.mse_loss(ph((0,), "E"), ph((0,), "F")), "mse_loss: pred E is empty"),
    (lambda: nn.binary_cross_entropy(P, ph((3,), "R")), "binary_cross_entropy: prob P has shape"),
    (lambda: nn.softmax_cross_entropy(P, ph((3,), "L")), "softmax_cross_entropy: labels L must have dtype int"),
    (lambda: nn.softmax_cross_entropy(P, ph((4,), "L", "int32")),
     "softmax_cross_entropy: labels L has 4 entries but logits P has 3 rows"),
    (lambda: nn.softmax_cross_entropy(ph((3,), "V"), ph((3,), "L", "int32")),
     "softmax_cross_entropy: logits V must be 2-D"),
    (lambda: nn.softmax_cross_entropy(P, ph((3, 1), "L", "int32")), "softmax_cross_entropy: labels L must be 1-D"),
]


@pytest.mark.parametrize("build,match", ERRORS)
def test_errors(build, match):
    with pytest.raises(tg.TeGradError, match=match):
        build()


def test_label_out_of_range_is_an_error():
    X, L = ph((2, 3), "X"), ph((2,), "L", "int32")
    with pytest.raises(tg.TeGradError, match="outside tensor X"):
        tg.evaluate([nn.softmax_cross_entropy(X, L)], {X: rand((2, 3)), L: np.array([0, 3], "int32")})
