"""The frontends' base (te_grad/frontends/base.py) carries what they share, free of any framework.

A frontend for plain numpy arrays, written here in a few lines on top of
:class:`te_grad.frontends.base.FrontendOp`, gets the per-shape specs and their bounded
cache, the attribute and argument checks, the dtype table and the backward masks from
the base; its gradients are checked against float64 finite differences."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import te_grad as tg
from te_grad.errors import UserError
from te_grad.frontends.base import FrontendOp, Spec, dtype_table

ROOT = pathlib.Path(__file__).resolve().parents[2]


class NumpyOp(FrontendOp):
    """The whole of a frontend: how to read an argument, and how to run forward and backward."""
    framework = "numpy"
    dtypes = dtype_table(np.dtype)

    def shape_dtype(self, name, a):
        if not isinstance(a, np.ndarray):
            raise UserError(f"argument {name} must be a numpy array, got {type(a).__name__}")
        return a.shape, a.dtype

    def fast_key(self, args):
        return tuple((a.shape, a.dtype.str) for a in args)

    def forward(self, *args):
        """``(outputs, saved)``: the outputs and the residuals the backward reads."""
        self.check_arity(args)
        outputs, saved = self.spec(*args).vjp.run_forward(*args)
        return outputs, saved

    def backward(self, args, saved, heads, requested):
        """One gradient per input (``None`` where not ``requested`` or not differentiable)."""
        spec = self.spec(*args)
        needs = spec.needs(requested)
        vjp = spec.backward_for(needs)
        grads = vjp.backward(*spec.backward_arguments(vjp, args, saved, heads)) if any(needs) else []
        return spec.spread(grads if isinstance(grads, (list, tuple)) else [grads], needs)


def scaled_exp(x, w, scale=2.0):
    return tg.compute(x.shape, lambda i: tg.exp(x[i]) * w[i] * scale, name="y")


def gather_rows(table, ids):
    k = tg.reduce_axis(table.shape[1], "k")
    return tg.compute(ids.shape, lambda i: tg.sum(table[ids[i], k] * table[ids[i], k], axis=k), name="g")


def _finite_difference(f, args, k, head, eps=1e-6):
    x = args[k]
    grad = np.zeros_like(x)
    for j in np.ndindex(x.shape):
        plus, minus = [a.copy() for a in args], [a.copy() for a in args]
        plus[k][j] += eps
        minus[k][j] -= eps
        grad[j] = (np.sum(f(*plus) * head) - np.sum(f(*minus) * head)) / (2 * eps)
    return grad


def test_specs_are_built_once_per_shape_and_the_least_recent_is_dropped(monkeypatch):
    monkeypatch.setenv("TE_GRAD_CACHE", "0")
    op = NumpyOp(scaled_exp, max_shapes=2)
    made = []
    real = op.make_spec
    monkeypatch.setattr(op, "make_spec", lambda key: made.append(key) or real(key))
    x3, x4, x5 = (np.linspace(-1.0, 1.0, n) for n in (3, 4, 5))
    first = op.spec(x3, x3)
    assert op.spec(x3.copy(), x3) is first and len(made) == 1  # same shapes and dtypes: the same spec
    assert op.spec(x3.astype(np.float32), x3) is not first  # another dtype: another spec
    assert len(made) == 2 and op._specs.keys()[-1] == (((3,), "float32"), ((3,), "float64"))
    op.spec(x4, x4)  # a third key: the least recently used (x3 float64) is dropped, its fast key too
    assert len(op._specs) == 2 and (((3,), "float64"), ((3,), "float64")) not in op._specs
    assert len(op._seen) == 2 and all(s is not first for s in op._seen.values())
    assert op.spec(x3, x3) is not first and len(made) == 4  # rebuilt when seen again
    op.max_shapes = 1
    assert len(op._specs) == 1 and op.max_shapes == 1
    op.spec(x5, x5)
    assert op._specs.keys() == [(((5,), "float64"), ((5,), "float64"))]
    with pytest.raises(UserError, match="max_shapes must be a positive int"):
        op.max_shapes = 0


def test_attributes_and_arguments_are_checked_by_the_base():
    with pytest.raises(UserError,
                       match=r"\['sclae'\] are not attributes of scaled_exp \(its attributes: \['scale'\]\)"):
        NumpyOp(scaled_exp, sclae=3.0)
    with pytest.raises(UserError, match=r"^mylib::op: \['sclae'\] are not attributes"):
        NumpyOp(scaled_exp, label="mylib::op", sclae=3.0)
    with pytest.raises(UserError, match="takes no tensor arguments"):
        NumpyOp(lambda scale=1.0: None)
    op = NumpyOp(scaled_exp, scale=3.0)
    assert op.names == ["x", "w"] and op.attrs == {"scale": 3.0}
    x = np.linspace(-1.0, 1.0, 4)
    with pytest.raises(UserError, match=r"scaled_exp takes 2 arrays \(x, w\), got 1"):
        op.forward(x)
    with pytest.raises(UserError, match="argument w must be a numpy array, got list"):
        op.spec(x, [1.0, 2.0])
    with pytest.raises(UserError, match="argument x has dtype float16; te_grad supports float32, float64, int32"):
        op.spec(x.astype(np.float16), x)
    (y,), _ = op.forward(x, x)
    np.testing.assert_allclose(y, np.exp(x) * x * 3.0, rtol=1e-12)  # the attribute reached fn


def test_an_output_the_framework_cannot_receive_is_refused():
    class Float64Only(NumpyOp):
        framework = "the float64 framework"
        dtypes = {np.dtype("float64"): "float64", np.dtype("int64"): "int64"}

    op = Float64Only(lambda x: tg.compute(x.shape, lambda i: x[i] > 0, name="positive"))
    with pytest.raises(UserError, match="output positive has dtype bool, which the float64 framework cannot"):
        op.spec(np.zeros(3))


def test_backward_masks_pick_the_gradients_and_match_finite_differences(monkeypatch):
    monkeypatch.setenv("TE_GRAD_CACHE", "0")
    op = NumpyOp(scaled_exp)
    rng = np.random.default_rng(0)
    x, w, head = rng.normal(size=(3, 5))
    (y,), saved = op.forward(x, w)
    f = lambda a, b: np.exp(a) * b * 2.0  # noqa: E731
    expect = [_finite_difference(f, [x, w], k, head) for k in range(2)]
    spec = op.spec(x, w)
    for requested in [(True, True), (True, False), (False, True)]:
        got = op.backward([x, w], saved, [head], requested)
        for g, e, n in zip(got, expect, requested):
            if n:
                np.testing.assert_allclose(g, e, rtol=1e-7, atol=1e-9)
            else:
                assert g is None
    assert op.backward([x, w], saved, [head], (False, False)) == (None, None)
    # one VJP per mask; the mask of every differentiable input is the forward's own
    assert spec.backward_for((True, True)) is spec.vjp
    assert spec.backward_for((True, False)) is spec.backward_for((True, False)) is not spec.vjp
    assert [t.name for t in spec.backward_for((False, True)).wrt] == ["w"]


def test_integer_inputs_get_no_gradient(monkeypatch):
    monkeypatch.setenv("TE_GRAD_CACHE", "0")
    op = NumpyOp(gather_rows)
    rng = np.random.default_rng(1)
    table, ids, head = rng.normal(size=(4, 3)), np.array([2, 0, 2, 3, 1], dtype=np.int64), rng.normal(size=5)
    (g,), saved = op.forward(table, ids)
    np.testing.assert_allclose(g, (table[ids] ** 2).sum(axis=1), rtol=1e-12)
    spec = op.spec(table, ids)
    assert spec.differentiable == [True, False] and spec.needs((True, True)) == (True, False)
    d_table, d_ids = op.backward([table, ids], saved, [head], (True, True))
    assert d_ids is None
    f = lambda t, i: (t[i] ** 2).sum(axis=1)  # noqa: E731
    np.testing.assert_allclose(d_table, _finite_difference(f, [table, ids], 0, head), rtol=1e-7, atol=1e-9)


def test_the_base_is_all_a_frontend_needs():
    """A frontend defines how to read one argument, and nothing of the base's caches or checks."""
    own = {name for name in vars(NumpyOp) if not name.startswith("__")}
    assert own == {"framework", "dtypes", "shape_dtype", "fast_key", "forward", "backward"}
    assert Spec.spread([1, 2], (True, False, True)) == (1, None, 2)


def test_neither_the_facade_nor_the_base_imports_a_framework():
    code = ("import sys, te_grad, te_grad.frontends, te_grad.frontends.base; "
            "print(sorted(m for m in ('torch', 'jax') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    import ast
    for path in (ROOT / "te_grad" / "frontends").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.split(".")[0] in ("torch", "jax")], (path.name, names)
