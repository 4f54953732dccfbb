"""Second order through data-dependent reads: gradients of gradients that hold scatters.

A simplified gradient of a gather ``Y[i] = f(X[I[i]])`` is a scatter
``dX[I[i]] += ...``; its own gradient (a Hessian-vector product) goes back through
the scatter, whose VJP is a gather. Every second-order gradient here is checked
against float64 central finite differences of the first-order gradient evaluated
by the reference evaluator (and the first example against its analytic value),
in its raw and simplified forms, evaluated and compiled.
"""
import numpy as np
import pytest

import te_grad as tg
from te_grad import ir
from te_grad.autodiff import VJP_RULES, vjp_of_op
from te_grad.errors import InternalError
from te_grad.testing import second_order

EPS = 1e-6


def _fd_second_order(grads, directions, wrt, feed, eps=EPS):
    """Central differences, along each element of each ``wrt``, of ``sum_a <grads[a], v_a>``
    with the first-order ``grads`` evaluated by the reference evaluator."""
    def objective(f):
        vals = tg.evaluate(list(grads), f)
        return sum(float(np.sum(g * f[v])) for g, v in zip(vals, directions))
    out = []
    for x in wrt:
        base = feed[x]
        num = np.zeros(x.shape)
        for idx in np.ndindex(*x.shape):
            plus, minus = dict(feed), dict(feed)
            plus[x] = base.copy()
            plus[x][idx] += eps
            minus[x] = base.copy()
            minus[x][idx] -= eps
            num[idx] = (objective(plus) - objective(minus)) / (2 * eps)
        out.append(num)
    return out


def _check_both_forms(first, wrt, inputs, feed, want, fallbacks_allowed=False):
    """The raw and simplified second-order forms of ``first``, evaluated and compiled, against
    ``want`` (and each other)."""
    got = {}
    for simplify in (False, True):
        directions, _, res = second_order(first, wrt, simplify=simplify)
        assert directions[0].shape == first[0].shape
        tg.verify(list(res))
        if simplify and not fallbacks_allowed:
            assert res.fallbacks == []
        feed_v = dict(feed)
        for v, val in zip(directions, _directions_values(first)):
            feed_v[v] = val
        values = tg.evaluate(list(res), feed_v)
        for g, w in zip(values, want):  # finite differences: an error relative to the scale
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7 * max(1.0, np.abs(w).max()))
        kern = tg.build(list(res), inputs=list(inputs) + directions)
        compiled = kern(*[feed_v[t] for t in list(inputs) + directions])
        compiled = [compiled] if isinstance(compiled, np.ndarray) else list(compiled)
        for c, g in zip(compiled, values):
            np.testing.assert_allclose(c, g, rtol=1e-10, atol=1e-12)
        got[simplify] = values
    for a, b in zip(got[False], got[True]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def _directions_values(first):
    rng = np.random.default_rng(7)
    return [rng.standard_normal(g.shape) for g in first]


def _fd_want(first, wrt, feed):
    vals = _directions_values(first)
    directions = [tg.placeholder(g.shape, dtype=g.dtype, name=f"v{a}") for a, g in enumerate(first)]
    f = dict(feed)
    f.update(zip(directions, vals))
    return _fd_second_order(first, directions, wrt, f)


# -- the example: tanh through a gather ------------------------------------------------------

def _tanh_gather():
    X = tg.placeholder((6,), dtype="float64", name="X")
    I = tg.placeholder((4,), dtype="int64", name="I")
    Y = tg.compute((4,), lambda i: tg.tanh(X[I[i]]), name="Y")
    return X, I, Y


def test_hessian_vector_product_through_a_scattered_gradient():
    X, I, Y = _tanh_gather()
    dX, = tg.differentiate(Y, [X])
    assert isinstance(dX.op, ir.ScatterOp)  # the simplified gradient of a gather
    V = tg.placeholder((6,), dtype="float64", name="V")
    k = tg.reduce_axis((0, 6), "k")
    D = tg.compute((), lambda: tg.sum(dX[k] * V[k], axis=k), name="D")
    ids = np.array([0, 2, 2, 5])
    x = np.linspace(-1, 1, 6)
    feed = {X: x, I: ids, V: np.ones(6)}
    t = np.tanh(x[ids])
    analytic = np.zeros(6)
    np.add.at(analytic, ids, -2 * t * (1 - t ** 2))
    assert np.abs(analytic).max() > 0.5
    numeric, = _fd_second_order([dX], [V], [X], feed)
    np.testing.assert_allclose(numeric, analytic, rtol=1e-6, atol=1e-8)
    values = {}
    for simplify in (False, True):
        h, = tg.differentiate(D, [X], simplify=simplify)
        got, = tg.evaluate([h], feed)
        np.testing.assert_allclose(got, analytic, rtol=1e-10, atol=1e-12)
        compiled = tg.build([h], inputs=[X, I, V])(x, ids, np.ones(6))
        np.testing.assert_allclose(compiled, analytic, rtol=1e-10, atol=1e-12)
        values[simplify] = got
    np.testing.assert_allclose(values[False], values[True], rtol=1e-12, atol=1e-14)
    # a general direction, through the helper that builds the second-order program
    _check_both_forms([dX], [X], [X, I], {X: x, I: ids}, _fd_want([dX], [X], {X: x, I: ids}))


# -- products and maxima through gathers, repeated ids ----------------------------------------

def _gathers(kind):
    X = tg.placeholder((6,), dtype="float64", name="X")
    I = tg.placeholder((5,), dtype="int64", name="I")
    J = tg.placeholder((5,), dtype="int64", name="J")
    if kind == "product":
        Y = tg.compute((5,), lambda i: X[I[i]] * X[J[i]], name="Y")
    elif kind == "maximum":
        Y = tg.compute((5,), lambda i: tg.maximum(X[I[i]] * X[J[i]], tg.sin(X[J[i]])), name="Y")
    elif kind == "reduction":  # a sum over the gathered values inside a nonlinearity
        k = tg.reduce_axis((0, 5), "k")
        Y = tg.compute((5,), lambda i: tg.exp(tg.sum(X[I[k]] * X[J[i]], axis=k) * 0.3), name="Y")
    elif kind == "running":  # a gather and an affine read in a triangular reduction
        k = tg.reduce_axis((0, 4), "k")
        Y = tg.compute((5,), lambda i: tg.sum(tg.sin(X[I[i]]) * X[k + 2], axis=k, where=k <= i), name="Y")
    else:
        raise AssertionError(kind)
    ids = np.array([0, 2, 2, 5, 2])     # repeated ids
    jds = np.array([1, 2, 3, 3, 0])     # I[1] == J[1]: X[2] * X[2]
    x = np.random.default_rng(3).standard_normal(6)
    return X, I, J, Y, {X: x, I: ids, J: jds}


@pytest.mark.parametrize("kind", ["product", "maximum", "reduction", "running"])
def test_second_order_through_gathers(kind):
    X, I, J, Y, feed = _gathers(kind)
    head = tg.placeholder((5,), dtype="float64", name="head")
    feed[head] = np.random.default_rng(4).standard_normal(5)
    dX, = tg.differentiate(Y, [X], head=head)
    assert any(isinstance(t.op, ir.ScatterOp) for t in tg.graph.topo_order([dX]))
    want = _fd_want([dX], [X], feed)
    assert np.abs(want[0]).max() > 0.1
    _check_both_forms([dX], [X], [X, I, J, head], feed, want)


def test_second_order_through_a_table_read_at_data_rows_with_a_weight():
    """A 2-D scatter (rows at data ids, a trailing axis) and a mixed second derivative."""
    T = tg.placeholder((5, 3), dtype="float64", name="T")
    W = tg.placeholder((3,), dtype="float64", name="W")
    ids = tg.placeholder((4,), dtype="int64", name="ids")
    Y = tg.compute((4, 3), lambda i, c: tg.tanh(T[ids[i], c] * W[c]), name="Y")
    rng = np.random.default_rng(5)
    feed = {T: rng.standard_normal((5, 3)), W: rng.standard_normal(3), ids: np.array([4, 1, 4, 0])}
    dT, dW = tg.differentiate(Y, [T, W])
    assert isinstance(dT.op, ir.ScatterOp)
    want = _fd_want([dT, dW], [T, W], feed)
    _check_both_forms([dT, dW], [T, W], [T, W, ids], feed, want)


def test_second_order_through_a_running_sum_of_a_gather():
    """A scatter whose axes' bounds depend on each other (a triangular domain)."""
    X = tg.placeholder((6,), dtype="float64", name="X")
    I = tg.placeholder((4,), dtype="int64", name="I")
    k = tg.reduce_axis((0, 4), "k")
    Y = tg.compute((4,), lambda i: tg.sum(tg.sin(X[I[k]]), axis=k, where=k <= i), name="Y")
    feed = {X: np.random.default_rng(6).standard_normal(6), I: np.array([5, 1, 5, 3])}
    dX, = tg.differentiate(Y, [X])
    want = _fd_want([dX], [X], feed)
    assert np.abs(want[0]).max() > 0.1
    _check_both_forms([dX], [X], [X, I], feed, want)


def test_second_order_where_only_part_of_the_scattered_gradient_is_used():
    """The adjoint of the scatter is zero outside rows 2..4: points scattering elsewhere are
    left out of the gather (and the answer is still right)."""
    from te_grad.testing import check_gradients
    X, I, Y = _tanh_gather()
    dX, = tg.differentiate(Y, [X])
    V = tg.placeholder((3,), dtype="float64", name="V")
    k = tg.reduce_axis((0, 3), "k")
    D = tg.compute((), lambda: tg.sum(dX[k + 2] * V[k], axis=k), name="D")
    feed = {X: np.linspace(-1, 1, 6), I: np.array([0, 2, 4, 5]), V: np.array([1.0, 2.0, 3.0])}
    for simplify in (False, True):
        got, = check_gradients(D, [X], feed, simplify=simplify)
        assert got[0] == 0 and got[5] == 0 and abs(got[4]) > 0.1  # rows 0 and 5: outside what D reads


def test_a_scatter_with_a_reduction_in_its_value():
    """out[dst[e]] += exp(sum over c of W[e, c] tanh(x[c])), written as a ScatterOp: the nested
    reduction is lifted as in a compute's body."""
    from te_grad.testing import check_gradients
    x = tg.placeholder((3,), dtype="float64", name="x")
    W = tg.placeholder((4, 3), dtype="float64", name="W")
    dst = tg.placeholder((4,), dtype="int64", name="dst")
    e, c = tg.reduce_axis((0, 4), "e"), tg.reduce_axis((0, 3), "c")
    value = tg.exp(tg.sum(W[e, c] * tg.tanh(x[c]), axis=c))
    S = ir.Tensor("S", (5,), "float64", ir.ScatterOp((e,), (dst[e],), value))
    feed = {x: np.array([0.3, -0.2, 0.5]), W: np.random.default_rng(0).standard_normal((4, 3)),
            dst: np.array([1, 4, 1, 0])}
    for simplify in (False, True):
        gx, gW = check_gradients(S, [x, W], feed, simplify=simplify)
        assert np.abs(gx).max() > 0.1 and np.abs(gW).max() > 0.1


# -- every op kind has a reverse rule -------------------------------------------------------

def _op_classes():
    return [c for name, c in vars(ir).items()
            if isinstance(c, type) and name.endswith("Op") and c.__module__ == ir.__name__]


def test_every_tensor_op_class_has_a_reverse_rule():
    classes = _op_classes()
    assert {c.__name__ for c in classes} >= {"PlaceholderOp", "ComputeOp", "ScatterOp"}
    for c in classes:
        assert c in VJP_RULES, f"{c.__name__} has no reverse rule"


def test_an_op_kind_without_a_rule_is_an_error_not_a_zero_gradient():
    class StrangeOp:
        def __init__(self, source):
            self.source = source

        def inputs(self):
            return (self.source,)

    X = tg.placeholder((3,), dtype="float64", name="X")
    S = ir.Tensor("S", (3,), "float64", StrangeOp(X))
    Y = tg.compute((3,), lambda i: S[i] * 2.0, name="Y")
    with pytest.raises(InternalError, match="no reverse rule for S.*StrangeOp"):
        tg.differentiate(Y, [X], simplify=False)
    with pytest.raises(InternalError, match="StrangeOp"):
        vjp_of_op(S, tg.placeholder((3,), dtype="float64", name="dS"))


# -- index_add written as the gradient of a gather, inside PyTorch and JAX -------------------

N_NODES = 5


def index_add(x, w, src, dst):
    """out[n, j] = sum over edges e with dst[e] == n of tanh(x[src[e], j]) * w[e]: the gradient
    of the gather h[dst[e], j] with the messages as its head."""
    E, F = w.shape[0], x.shape[1]
    msg = tg.compute((E, F), lambda e, j: tg.tanh(x[src[e], j]) * w[e], name="msg")
    h = tg.placeholder((N_NODES, F), dtype=x.dtype, name="h")
    gathered = tg.compute((E, F), lambda e, j: h[dst[e], j], name="gathered")
    out, = tg.gradient(gathered, [h], head=msg)
    return out


def _index_add_numpy(x, w, src, dst):
    out = np.zeros((N_NODES, x.shape[1]))
    np.add.at(out, dst, np.tanh(x[src]) * w[:, None])
    return out


def _index_add_args():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((N_NODES, 3))
    w = rng.standard_normal(6)
    src = np.array([0, 1, 1, 4, 2, 0])
    dst = np.array([3, 3, 0, 1, 3, 4])   # repeated destinations add up
    return x, w, src, dst


def test_index_add_as_a_gradient_is_a_scatter_whose_gradient_is_right():
    X = tg.placeholder((N_NODES, 3), dtype="float64", name="x")
    W = tg.placeholder((6,), dtype="float64", name="w")
    S = tg.placeholder((6,), dtype="int64", name="src")
    Dd = tg.placeholder((6,), dtype="int64", name="dst")
    out = index_add(X, W, S, Dd)
    assert isinstance(out.op, ir.ScatterOp)
    x, w, src, dst = _index_add_args()
    feed = {X: x, W: w, S: src, Dd: dst}
    np.testing.assert_allclose(tg.evaluate([out], feed)[0], _index_add_numpy(x, w, src, dst), rtol=1e-12)
    from te_grad.testing import check_gradients
    check_gradients(out, [X, W], feed)
    check_gradients(out, [X, W], feed, simplify=False)


def test_index_add_as_a_gradient_in_pytorch():
    torch = pytest.importorskip("torch")
    import te_grad.torch as tgt
    op = tgt.custom_op("te_grad_tests::index_add_via_gradient", index_add)
    x, w, src, dst = _index_add_args()
    args = (torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True),
            torch.tensor(src), torch.tensor(dst))
    y = op(*args)
    np.testing.assert_allclose(y.detach().numpy(), _index_add_numpy(x, w, src, dst), rtol=1e-12)
    head = torch.tensor(np.random.default_rng(9).standard_normal(y.shape))
    (y * head).sum().backward()
    assert args[0].grad.abs().max() > 0.1 and args[1].grad.abs().max() > 0.1
    assert torch.autograd.gradcheck(op, args)
    # and against PyTorch's own index_add_
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ref = torch.zeros(N_NODES, 3, dtype=torch.float64).index_add(
        0, torch.tensor(dst), torch.tanh(xt[torch.tensor(src)]) * wt[:, None])
    (ref * head).sum().backward()
    torch.testing.assert_close(args[0].grad, xt.grad)
    torch.testing.assert_close(args[1].grad, wt.grad)


def test_index_add_as_a_gradient_in_jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import te_grad.jax as tgj
    from jax.test_util import check_grads
    op = tgj.custom_op(index_add)
    x, w, src, dst = _index_add_args()
    xs, ws = jnp.asarray(x), jnp.asarray(w)
    srcs, dsts = jnp.asarray(src), jnp.asarray(dst)
    np.testing.assert_allclose(np.asarray(op(xs, ws, srcs, dsts)), _index_add_numpy(x, w, src, dst),
                               rtol=1e-12)
    head = jnp.asarray(np.random.default_rng(9).standard_normal((N_NODES, 3)))

    def loss(a, b):
        return (op(a, b, srcs, dsts) * head).sum()

    def reference(a, b):
        return (jnp.zeros((N_NODES, 3)).at[dsts].add(jnp.tanh(a[srcs]) * b[:, None]) * head).sum()

    gx, gw = jax.grad(loss, argnums=(0, 1))(xs, ws)
    rx, rw = jax.grad(reference, argnums=(0, 1))(xs, ws)
    assert float(jnp.abs(gx).max()) > 0.1 and float(jnp.abs(gw).max()) > 0.1
    np.testing.assert_allclose(np.asarray(gx), np.asarray(rx), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(rw), rtol=1e-10, atol=1e-12)
    check_grads(loss, (xs, ws), order=1, modes=["rev"], eps=1e-6)
