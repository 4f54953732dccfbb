"""te_grad ops follow dynamic shapes with one kernel built on size variables.

A dimension declared dynamic (``custom_op(..., dynamic_dims=...)``), or made symbolic by
torch.compile (default settings once it changes, ``dynamic=True``, ``mark_dynamic``), gets a
size variable: the key of a call names the variable, the graph is built on it, the fake
implementation returns symbolic output shapes, and one forward / backward kernel pair serves
every batch size. Each value test runs with tg.build's own kernels on size variables
("real") and with a stand-in made of exact kernels ("stand-in", tests/symbolic_builds.py),
and compares with PyTorch / JAX eager and float64 finite differences."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import te_grad as tg  # noqa: E402
import te_grad.torch as tgt  # noqa: E402
from te_grad.errors import UserError  # noqa: E402
from te_grad.frontends.base import NamedSizes  # noqa: E402
from symbolic_builds import use_builds  # noqa: E402

BATCHES = (3, 5, 8)
KINDS = ["real", "stand-in"]


def dense_tanh(x, w):
    """tanh(x @ w) and the batch mean of its rows: a size variable in a body (1 / n)."""
    n, c = x.shape
    k = tg.reduce_axis((0, c), "k")
    y = tg.compute((n, w.shape[1]), lambda i, j: tg.tanh(tg.sum(x[i, k] * w[k, j], axis=k)), name="y")
    r = tg.reduce_axis((0, n), "r")
    m = tg.compute((w.shape[1],), lambda j: tg.sum(y[r, j], axis=r) * (1.0 / n), name="m")
    return y, m


def torch_dense_tanh(x, w):
    y = torch.tanh(x @ w)
    return y, y.mean(0)


def diffs(x):
    """Differences of consecutive rows: the output's extent is n - 1."""
    n, c = x.shape
    return tg.compute((n - 1, c), lambda i, j: x[i + 1, j] * x[i + 1, j] - x[i, j], name="d")


def torch_diffs(x):
    return x[1:] * x[1:] - x[:-1]


_count = [0]


def fresh(fn, **options):
    _count[0] += 1
    return tgt.custom_op(f"tg_dynamic_shapes::{fn.__name__}_{_count[0]}", fn, **options)


# -- keys, graphs and shapes (no kernel) ---------------------------------------------------------
def test_declared_dims_name_a_size_variable_in_the_key_and_the_graph():
    op = fresh(dense_tanh, dynamic_dims={"x": 0})
    w = torch.randn(4, 2)
    keys = {op.key((torch.randn(b, 4), w)) for b in BATCHES}
    assert keys == {((("x_0", 4), "float32"), ((4, 2), "float32"))}
    spec = op.make_spec(keys.pop())
    assert spec.symbolic and list(spec.size_vars) == ["x_0"]
    n = spec.size_vars["x_0"]
    assert spec.inputs[0].shape[0] is n and spec.outputs[0].shape[0] is n
    assert NamedSizes({"x_0": 7}).shape(spec.outputs[0].shape) == (7, 2)
    # undeclared: exact keys, one per shape, as before
    plain = fresh(dense_tanh)
    assert plain.key((torch.randn(3, 4), w)) == (((3, 4), "float32"), ((4, 2), "float32"))


def test_equal_dynamic_extents_share_a_variable_and_other_extents_do_not():
    def pair(x, y):
        return tg.compute(x.shape, lambda i: x[i] + y[i], name="s")
    op = fresh(pair, dynamic_dims=["x", "y"])
    assert op.key((torch.randn(5), torch.randn(5))) == ((("x_0",), "float32"), (("x_0",), "float32"))
    assert op.key((torch.randn(5), torch.randn(6))) == ((("x_0",), "float32"), (("y_0",), "float32"))


def test_bad_dynamic_dims_are_user_errors():
    with pytest.raises(UserError, match="'z', which is not a tensor argument"):
        fresh(dense_tanh, dynamic_dims={"z": 0})
    with pytest.raises(UserError, match="must be a dimension"):
        fresh(dense_tanh, dynamic_dims={"x": -1})
    with pytest.raises(UserError, match="dynamic_dims must be a dict"):
        fresh(dense_tanh, dynamic_dims="x")
    op = fresh(dense_tanh, dynamic_dims={"x": 2})
    with pytest.raises(UserError, match="dimension 2 of x, which has 2 dimensions"):
        op.key((torch.randn(3, 4), torch.randn(4, 2)))


def test_size_expressions_evaluate_on_symints():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    env = ShapeEnv()
    s = env.create_unbacked_symint()
    n = tg.var("x_0")
    got = NamedSizes({"x_0": s}).shape((2 * n + 1, n - 1, n // 2, 4))
    assert [str(g.node.expr) if isinstance(g, torch.SymInt) else g for g in got][3] == 4
    assert all(isinstance(g, torch.SymInt) for g in got[:3])
    assert str(got[0].node.expr).replace(" ", "") in ("2*u0+1", "1+2*u0")


def _graph_output_shapes(fn, *args, **compile_options):
    """The shapes dynamo's graph records for the te_grad op's results (example values)."""
    seen = []

    def backend(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function" and "tg_dynamic_shapes" in str(node.target):
                seen.append([tuple(v.shape) for v in node.meta["example_value"]])
        return gm.forward
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, **compile_options)
    for a in args:
        compiled(*a)
    return seen


@pytest.mark.parametrize("kind", KINDS)
def test_the_fake_implementation_returns_symbolic_shapes(monkeypatch, kind):
    use_builds(monkeypatch, kind)
    op = fresh(diffs)
    seen = _graph_output_shapes(lambda x: op(x), *[(torch.randn(b, 4),) for b in BATCHES], dynamic=True)
    assert op.static_reason is None
    assert len(seen) == 1  # one graph for every batch size
    d0, d1 = seen[0][0]
    assert isinstance(d0, torch.SymInt) and isinstance(d1, torch.SymInt)  # dynamic=True: every dim
    assert str(d0.node.expr).replace(" ", "").endswith("-1") or str(d0.node.expr).startswith("-1")
    assert op.dynamic == {0: frozenset({0, 1})}  # learned: later eager calls use the same kernel
    assert op.key((torch.randn(6, 4),)) == ((("x_0", "x_1"), "float32"),)


# -- values, gradients and build counts -----------------------------------------------------------
def _check_dense(op, run, batches=BATCHES):
    w = torch.randn(4, 2, dtype=torch.float32, requires_grad=True)
    for b in batches:
        x = torch.randn(b, 4, requires_grad=True)
        y, m = run(op, x, w)
        (y.square().sum() + m.sum()).backward()
        x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        y2, m2 = torch_dense_tanh(x2, w2)
        (y2.square().sum() + m2.sum()).backward()
        torch.testing.assert_close(y, y2, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m, m2, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(w.grad, w2.grad, rtol=1e-4, atol=1e-4)
        w.grad = None


def _compiled(**options):
    torch._dynamo.reset()
    return torch.compile(lambda op, x, w: op(x, w), **options)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["eager", "default", "dynamic", "mark_dynamic"])
def test_one_kernel_pair_for_every_batch_size(monkeypatch, kind, how):
    made = use_builds(monkeypatch, kind)
    if how == "eager":
        op = fresh(dense_tanh, dynamic_dims={"x": 0})
        run = lambda op, x, w: op(x, w)  # noqa: E731
    elif how == "default":  # dynamo makes the batch symbolic once it changes; declared, no exact kernel first
        op = fresh(dense_tanh, dynamic_dims={"x": 0})
        run = _compiled()
    elif how == "dynamic":
        op = fresh(dense_tanh)
        run = _compiled(dynamic=True)
    else:
        op = fresh(dense_tanh)
        inner = _compiled()

        def run(op, x, w):
            torch._dynamo.mark_dynamic(x, 0)
            return inner(op, x, w)
    _check_dense(op, run)
    assert op.static_reason is None
    assert made["exact"] == []
    assert len(made["symbolic"]) == 2, made  # the forward kernel and the backward kernel, once
    symbolic = [k for k in op._specs.keys() if any(isinstance(e, str) for shape, _ in k for e in shape)]
    assert len(symbolic) == 1, op._specs.keys()


@pytest.mark.parametrize("kind", KINDS)
def test_default_compile_builds_at_most_one_exact_kernel_pair_before_the_batch_turns_symbolic(monkeypatch, kind):
    made = use_builds(monkeypatch, kind)
    op = fresh(dense_tanh)
    _check_dense(op, _compiled(), batches=BATCHES + (11,))
    assert op.static_reason is None
    assert len(made["exact"]) <= 2 and len(made["symbolic"]) == 2, made


@pytest.mark.parametrize("kind", KINDS)
def test_an_output_extent_n_minus_1_under_compile(monkeypatch, kind):
    made = use_builds(monkeypatch, kind)
    op = fresh(diffs)
    torch._dynamo.reset()
    run = torch.compile(lambda op, x: op(x), dynamic=True)
    for b in BATCHES:
        x = torch.randn(b, 4, requires_grad=True)  # 4: no batch size (duck sizing would join them)
        y = run(op, x)
        y.square().sum().backward()
        x2 = x.detach().clone().requires_grad_()
        torch_diffs(x2).square().sum().backward()
        assert y.shape == (b - 1, 4)
        torch.testing.assert_close(y, torch_diffs(x2), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-4)
    assert made["exact"] == [] and len(made["symbolic"]) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_in_float64_at_three_batch_sizes(monkeypatch, kind):
    made = use_builds(monkeypatch, kind)
    op = fresh(dense_tanh, dynamic_dims={"x": 0})
    w = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    for b in BATCHES:
        x = torch.randn(b, 4, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda x, w: op(x, w), (x, w), eps=1e-6, atol=1e-6)  # finite differences
    assert made["exact"] == [] and len(made["symbolic"]) == 2


def test_an_op_that_cannot_be_built_on_size_variables_falls_back_to_exact_kernels(monkeypatch):
    made = use_builds(monkeypatch, "stand-in")

    def fixed_rows(x):  # needs its extent as a Python int
        rows = int(x.shape[0])
        return tg.compute((rows,), lambda i: x[i] * 2.0, name="y")
    op = fresh(fixed_rows, dynamic_dims={"x": 0})
    with pytest.warns(RuntimeWarning, match="exact kernels per shape"):
        y = op(torch.ones(3))
    torch.testing.assert_close(y, torch.full((3,), 2.0))
    assert op.static_reason is not None and "TypeError" in op.static_reason
    torch.testing.assert_close(op(torch.ones(4)), torch.full((4,), 2.0))
    assert len(made["exact"]) == 4 and made["symbolic"] == []  # forward and backward, per shape


# -- JAX -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_jax_op_builds_once_for_every_batch_size_under_jit(monkeypatch, kind):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import te_grad.jax as tgj
    made = use_builds(monkeypatch, kind)
    f = tgj.custom_op(dense_tanh, dynamic_dims={"x": 0})

    def loss(f):
        def run(x, w):
            y, m = f(x, w)
            return (y ** 2).sum() + m.sum()
        return run

    def reference(x, w):
        y = jnp.tanh(x @ w)
        return y, y.mean(0)
    step = jax.jit(jax.value_and_grad(loss(f), argnums=(0, 1)))
    want = jax.value_and_grad(loss(reference), argnums=(0, 1))  # JAX eager
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    for b in BATCHES:
        x = rng.standard_normal((b, 4)).astype(np.float32)
        (v, (gx, gw)), (v2, (gx2, gw2)) = step(x, w), want(x, w)
        np.testing.assert_allclose(v, v2, rtol=1e-5)
        np.testing.assert_allclose(gx, gx2, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(gw, gw2, rtol=1e-4, atol=1e-5)
    assert f.static_reason is None
    assert made["exact"] == [] and len(made["symbolic"]) == 2, made


def test_jax_shape_polymorphism_is_a_clear_user_error(monkeypatch):
    jax = pytest.importorskip("jax")
    import te_grad.jax as tgj
    use_builds(monkeypatch, "stand-in")
    f = tgj.custom_op(dense_tanh)
    b = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, 4"), np.float32)
    with pytest.raises(UserError, match="symbolic dimension b.*use jax.jit"):
        jax.export.export(jax.jit(lambda x, w: f(x, w)[0]))(b, jax.ShapeDtypeStruct((4, 2), np.float32))


def test_the_residuals_of_a_symbolic_graph_are_chosen_as_at_a_fixed_size(monkeypatch):
    """The saving policy judges a symbolic tensor's cost per element at a representative size:
    layer norm saves its mean and variance on size variables as at fixed sizes."""
    use_builds(monkeypatch, "real")

    def saved(n, m):
        x = tg.placeholder((n, m), name="x")
        g, b = tg.placeholder((m,), name="gamma"), tg.placeholder((m,), name="beta")
        return sorted(t.name for t in tg.build_vjp([tg.nn.layer_norm(x, g, b)], [x, g, b]).saved)
    assert saved(tg.var("n"), tg.var("m")) == saved(tg.var("n"), 8) == saved(16, 8)
    assert saved(16, 8) == ["layer_norm_mean", "layer_norm_var"]
