"""A te_grad op called eagerly from PyTorch does its per-call work once: the graph, the key,
the kernels' plans and the lean call plan are made on the first call of a shape and only
looked up after; a plain eager call runs the kernels directly, anything else (a dispatch
mode, a tensor subclass, torch.compile) still goes through torch's dispatcher; a kernel whose
plan is run on the calling thread does not wake the thread team."""
import numpy as np
import pytest

import te_grad as tg

torch = pytest.importorskip("torch")
import te_grad.torch as tgt  # noqa: E402
from te_grad.frontends.base import FrontendOp  # noqa: E402


def _mul(x, w):
    return tg.compute(x.shape, lambda *i: x[i] * w[i], name="y")


def _two(x):
    return tg.compute(x.shape, lambda *i: x[i] * x[i], name="sq"), tg.compute(x.shape, lambda *i: tg.exp(x[i]),
                                                                               name="ex")


class _Counts:
    """Calls of the slow path's steps, counted by wrapping them."""

    def __init__(self, monkeypatch, op):
        from codegen.kernel import Kernel
        import te_grad.torch as mod
        self.n = {"bind": 0, "signature": 0, "make_spec": 0, "plan": 0, "lean": 0}

        def counting(name, fn):
            def wrapped(*a, **k):
                self.n[name] += 1
                return fn(*a, **k)
            return wrapped
        monkeypatch.setattr(op, "bind", counting("bind", op.bind))
        monkeypatch.setattr(op, "signature", counting("signature", op.signature))
        monkeypatch.setattr(op, "make_spec", counting("make_spec", op.make_spec))
        monkeypatch.setattr(Kernel, "_plan_records", counting("plan", Kernel._plan_records))
        if hasattr(mod, "_Lean"):  # the eager call plan, made once per spec
            monkeypatch.setattr(mod._Lean, "__init__", counting("lean", mod._Lean.__init__))


def test_a_tiny_op_keys_builds_and_plans_once(monkeypatch):
    op = tgt.custom_op("tg_bridge_overhead::mul", _mul)
    counts = _Counts(monkeypatch, op)
    x = torch.randn(4, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    h = torch.randn(4)
    first = torch.autograd.grad(op(x, w), (x, w), h)  # the first call of the shape: built once
    assert counts.n["signature"] == 1 and counts.n["make_spec"] == 1 and counts.n["lean"] <= 1
    before = dict(counts.n)
    for _ in range(20):
        gx, gw = torch.autograd.grad(op(x, w), (x, w), h)
        with torch.no_grad():
            y = op(x, w)
    assert counts.n == before, f"per-call slow path: {counts.n} after {before}"
    for got in (first, (gx, gw)):
        torch.testing.assert_close(got[0], h * w, rtol=0, atol=0)
        torch.testing.assert_close(got[1], h * x, rtol=0, atol=0)
    torch.testing.assert_close(y, x.detach() * w.detach(), rtol=0, atol=0)
    # another shape is keyed and built once; going back to the first is a lookup, not a build
    x5, w5 = torch.randn(5), torch.randn(5)
    op(x5, w5)
    op(x, w)
    assert counts.n["make_spec"] == before["make_spec"] + 1 and counts.n["signature"] == before["signature"] + 1


def test_the_backward_uses_the_spec_of_its_forward_even_once_dropped():
    op = tgt.custom_op("tg_bridge_overhead::mul_dropped", _mul, max_shapes=1)
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    y = op(x, w)
    op(torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64))  # drops the shape of y
    assert len(op._specs) == 1
    y.backward(torch.ones(4, dtype=torch.float64))
    torch.testing.assert_close(x.grad, w.detach(), rtol=0, atol=0)
    torch.testing.assert_close(w.grad, x.detach(), rtol=0, atol=0)


def test_two_outputs_one_unused_and_non_contiguous_inputs():
    op = tgt.custom_op("tg_bridge_overhead::two", _two)
    base = torch.randn(4, 3, dtype=torch.float64)
    x = base.t().requires_grad_()  # not contiguous: copied once for the kernels
    sq, ex = op(x)
    torch.testing.assert_close(sq, x.detach() ** 2)
    gx, = torch.autograd.grad(ex.sum(), x)  # sq's gradient is None: zeros
    torch.testing.assert_close(gx, torch.exp(x.detach()))
    sq, ex = op(x)
    gx, = torch.autograd.grad((sq * 3).sum() + ex.sum(), x)
    torch.testing.assert_close(gx, 6 * x.detach() + torch.exp(x.detach()))


def test_a_dispatch_mode_or_a_subclass_still_goes_through_torch_ops():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    op = tgt.custom_op("tg_bridge_overhead::mul_modes", _mul)
    x, w = torch.randn(4), torch.randn(4)
    op(x, w)
    with Seen() as mode:
        y = op(x, w)
    assert any("tg_bridge_overhead.mul_modes_fwd" in name for name in mode.ops), mode.ops
    torch.testing.assert_close(y, x * w, rtol=0, atol=0)

    class Sub(torch.Tensor):
        pass
    calls = []

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            calls.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})
    y = op(x.as_subclass(Logged), w)
    assert any("mul_modes_fwd" in c for c in calls), calls
    np.testing.assert_allclose(np.asarray(y.detach().as_subclass(torch.Tensor)), (x * w).numpy(), rtol=0)


def test_create_graph_behaves_as_through_the_dispatcher():
    """A backward that builds a graph runs NAME_bwd, which has no derivative: using it is torch's error."""
    op = tgt.custom_op("tg_bridge_overhead::sq", lambda x: tg.compute(x.shape, lambda *i: x[i] * x[i], name="y"))
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    g, = torch.autograd.grad(op(x).sum(), x, create_graph=True)
    torch.testing.assert_close(g, 2 * x.detach())
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="sq_bwd"):
        g.sum().backward()


def test_a_kernel_run_on_the_calling_thread_wakes_no_worker(monkeypatch):
    from codegen import team as team_mod
    crew = team_mod.team(2)
    wakes = []
    monkeypatch.setattr(team_mod.Team, "wake", lambda self: wakes.append(1))
    monkeypatch.setattr(crew, "sleepers", 1)  # as if a worker slept: a shared run must wake it
    x = tg.placeholder((4,), name="x")
    tiny = tg.build([tg.compute((4,), lambda i: x[i] * 2.0, name="y")], [x], threads=2)
    big_x = tg.placeholder((1 << 18,), name="x")
    big = tg.build([tg.compute((1 << 18,), lambda i: tg.exp(big_x[i]), name="y")], [big_x], threads=2)
    a = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(tiny(a), a * 2)
    assert not any(r.chunks for r in tiny.plan()) and wakes == []
    b = np.linspace(-1, 1, 1 << 18, dtype=np.float32)
    np.testing.assert_allclose(big(b), np.exp(b), rtol=1e-6)
    if any(r.chunks for r in big.plan()):  # shared among the threads: the sleeping worker is woken
        assert wakes == [1]
