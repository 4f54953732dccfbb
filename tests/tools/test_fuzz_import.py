"""Random torch.nn.Modules through the PyTorch importer (te_grad/tools/fuzz/torch_models.py, torch_check.py).

A fixed budget runs here: no failure, and every family of constructs generated;
``python -m te_grad fuzz --torch --programs N`` runs any number.
"""
import io
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from te_grad.tools.fuzz import torch_check, torch_models  # noqa: E402
from te_grad.tools.fuzz.torch_check import check, refused_ops, script  # noqa: E402
from te_grad.tools.fuzz.torch_models import FAMILIES, generate  # noqa: E402


def test_a_fixed_budget_of_modules_passes_and_covers_every_family():
    out = io.StringIO()
    result = torch_check.run(12, seed=0, out=out, progress_every=0)
    text = out.getvalue()
    assert sum(result["counts"].values()) == 12
    assert not result["failures"], text
    assert result["counts"].get("ok", 0) >= 6, text
    missing = [f for f in FAMILIES if not result["families"].get(f)]
    assert not missing, f"families never generated: {missing}\n{text}"


def test_the_generator_draws_flattened_linear_layers_on_a_dynamic_batch():
    """nn.MultiheadAttention's output projection (the batch second, the rows flattened, a linear
    layer, the rows restored) is drawn with a dynamic batch, and it is imported as one."""
    specs = [s for s in map(generate, range(60)) if s.dynamic_batch
             and any(n["op"] == "flat_linear" and n["swap"] for n in s.nodes)]
    assert len(specs) >= 3
    outcome = check(specs[0])
    assert outcome.kind == "ok", outcome


def test_the_generator_draws_constants_made_in_forward_one_per_mode():
    """A tensor made in ``forward`` with other values in training than in evaluation: both
    programs lift theirs under the same name, and each mode must read its own."""
    specs = [s for s in map(generate, range(120)) if any(n["op"].endswith("_constant") for n in s.nodes)]
    assert len(specs) >= 3
    outcome = check(specs[0])
    assert outcome.kind == "ok", outcome


def _after_a_parameter(spec, node):
    """Whether a parameter's layer is among the values ``node`` is computed from."""
    first = len(spec.shapes) - len(spec.nodes)  # the inputs' values come first
    todo, seen = list(node["args"]), set()
    while todo:
        v = todo.pop()
        if v in seen or v < first:
            continue
        seen.add(v)
        up = spec.nodes[v - first]
        if up["op"] in ("linear", "flat_linear", "conv2d", "matmul_param", "sdpa", "embedding") or \
                up["op"].endswith("_param"):
            return True
        todo += up["args"]
    return False


@pytest.mark.parametrize("how", ["detach", "no_grad"])
def test_the_generator_draws_detached_operands(how):
    """An operand cut from the gradient by ``.detach()`` or by a ``torch.no_grad()`` block: the
    gradients checked against PyTorch's must not flow through it."""
    specs = [s for s in map(generate, range(300)) if any(n["op"].endswith("_stop") and n["how"] == how
                                                         and _after_a_parameter(s, n) for n in s.nodes)]
    assert len(specs) >= 3
    outcome = check(specs[0])
    assert outcome.kind == "ok", outcome


@pytest.mark.parametrize("how", ["zero", "gate", "like"])
def test_the_generator_draws_parameters_whose_gradient_is_zero(how):
    """``0 * p.sum()`` (PyTorch's grad of ``p`` zeros: weight decay moves ``p``), ``x * (p > 0)``
    and ``zeros_like(p)`` (grad None: ``p`` stays); the step's weight decay tells them apart."""
    specs = [s for s in map(generate, range(300)) if any(n["op"] == "add_cut" and n["how"] == how
                                                         for n in s.nodes)]
    assert len(specs) >= 3
    outcome = check(specs[0])
    assert outcome.kind == "ok", outcome


@pytest.mark.parametrize("stat", ["running_mean", "running_var"])
def test_the_generator_draws_batch_norm_statistics_read_after_their_update(stat):
    """A module reading a batch norm layer's running statistic after the training step updated
    it: PyTorch records no gradient through the update (the fuzzer found te_grad's gradients
    and steps off there, ``mismatch-grad-evaluator`` and ``mismatch-step-params``)."""
    specs = [s for s in map(generate, range(500)) if s.grad_training and
             any(n["op"] == "bn_stat" and n["stat"] == stat for n in s.nodes)]
    assert len(specs) >= 3
    outcome = check(specs[0])
    assert outcome.kind == "ok", outcome


@pytest.mark.parametrize("op", ["max_dim", "min_dim", "cumsum", "prod", "std", "cdist", "index", "index_from_end", "add_mask",
                                "count_mask", "flip", "repeat", "upsample", "group_norm", "leaky_relu", "elu", "relu6",
                                "hardtanh", "hardswish", "softplus", "mish", "bilinear", "bilinear_aligned", "roll",
                                "adaptive_max_pool2d", "adaptive_max_pool2d_overlapping", "clamp", "pow_scalar",
                                "max_of_all"])
def test_the_generator_draws_each_operator_it_names(op):
    """Each construct the generator names is drawn (a flip of the batch axis under a dynamic
    batch among the flips, bilinear upsampling with its corners aligned or not, indices
    counted from the end, adaptive max pooling to a size not dividing the input's) and such a
    module passes."""
    def named(n, s):
        if op.startswith("bilinear"):
            return n["op"] == "upsample" and n["mode"] == "bilinear" and n["align_corners"] == op.endswith(
                "aligned")
        if op == "adaptive_max_pool2d_overlapping":
            return n["op"] == "adaptive_max_pool2d" and any(
                a % b for a, b in zip(s.shapes[n["args"][0]][2:], n["size"]))
        if op == "max_of_all":
            return n["op"].endswith("_keepdim") and n["reduce"] in ("max", "min")
        if op == "count_mask":
            return n["op"].endswith("_mask") and n["how"] == "count"
        if op == "index_from_end":
            return n["op"] == "index" and min(n["rows"] + n["cols"]) < 0
        return n["op"] == op

    def drawn(s):
        return any(named(n, s) and (op != "flip" or (0 in n["dims"] and s.dynamic_batch)) for n in s.nodes)
    specs = [s for s in map(generate, range(400)) if drawn(s)]
    assert len(specs) >= 3
    outcome = check(specs[0])
    assert outcome.kind == "ok", outcome


@pytest.mark.parametrize("form", ["grad", "stop", "none", "probe"])
def test_the_generator_draws_modules_of_several_outputs(form):
    """Modules returning a tuple: an extra output the loss reads with its gradient, under
    ``stop_gradient`` (PyTorch's ``.detach()``) or not at all, and a probe (a linear layer on
    detached features) returned beside the main output."""
    def drawn(s):
        if len(s.outputs) < 2:
            return False
        if form == "probe":
            return any(n["op"] == "probe" for n in s.nodes)
        return form in s.reads[1:]
    specs = [s for s in map(generate, range(120)) if drawn(s)]
    assert len(specs) >= 3
    outcome = check(specs[0])
    assert outcome.kind == "ok", outcome


def test_an_output_read_only_under_stop_gradient_moving_its_parameters_is_caught(monkeypatch):
    """A Trainer that let every output of an imported model count for which parameters PyTorch
    gives a gradient (not only those the loss reads differentiably) decays a parameter that
    only a stopped output reaches: the step's parameters disagree with PyTorch's."""
    from te_grad.train import trainer as trainer_module

    def every_output(self, out, adjoints):
        outs = out if isinstance(out, (tuple, list)) else [out]
        return self.model.params_with_gradient(list(range(len(outs))))
    spec = next(s for s in map(generate, range(400))
                if s.reads == ["stop", "stop"] and any(n["op"] == "probe" for n in s.nodes))
    assert check(spec).kind == "ok"
    monkeypatch.setattr(trainer_module.Trainer, "_params_with_gradient", every_output)
    outcome = check(spec)
    assert outcome.kind == "mismatch-step-params", outcome


@pytest.mark.parametrize("broken", ["predict", "update"])
def test_a_kernel_wrong_only_at_another_batch_size_is_caught(monkeypatch, broken):
    """A module imported with a dynamic batch is also run at another batch size: a prediction
    off there, or a step that does nothing there, is a failure (``mismatch-other-batch``)."""
    from te_grad import train
    spec = next(s for s in map(generate, range(100)) if s.dynamic_batch and s.ids is None and len(s.outputs) == 1)
    real = getattr(train.Trainer, broken)

    def wrong(self, *arrays):
        if arrays[0].shape[0] == spec.batch:
            return real(self, *arrays)
        return real(self, *arrays) * 1.01 if broken == "predict" else None
    monkeypatch.setattr(train.Trainer, broken, wrong)
    outcome = check(spec)
    assert outcome.kind == "mismatch-other-batch", outcome
    monkeypatch.setattr(train.Trainer, broken, real)
    assert check(spec).kind == "ok"


def test_modules_are_reproducible_and_valid():
    a, b = generate(77), generate(77)
    assert a.describe() == b.describe() and a.nodes == b.nodes
    net = torch_models.build_module(a)
    arrays, tensors = torch_check._inputs(a, __import__("numpy").random.default_rng(0))
    outs = torch_check._listed(net(*tensors))
    assert len(outs) == len(a.outputs) == len(a.reads)
    for out, v in zip(outs, a.outputs):
        assert tuple(out.shape) == a.shapes[v] and str(out.dtype) == f"torch.{a.dtype}"


def test_the_checks_catch_a_wrong_rule(monkeypatch):
    """A rule broken on purpose must be a failure (a mismatch), not pass or be rejected."""
    from te_grad import nn
    from te_grad.frontends.aten import RULES
    monkeypatch.setitem(RULES, "aten.relu.default", lambda t, x: nn.sigmoid(x))
    spec = next(s for s in map(generate, range(200)) if any(n["op"] == "relu" for n in s.nodes))
    outcome = check(spec)
    assert outcome.kind.startswith("mismatch-forward"), outcome
    assert "check_seed" in script(spec, outcome) and f"check_seed({spec.seed})" in script(spec, outcome)


def test_float32_modules_are_measured_against_float64_pytorch():
    """float32 modules whose PyTorch float32 results carry rounding te_grad's do not (a bias
    gradient exactly zero that PyTorch's float32 gives as 2^-13; a layer norm over two elements
    whose gradients PyTorch's float32 has 4e-4 off) pass; a float32 rule broken on purpose,
    relu plus a hundredth of its input, is still a mismatch."""
    from te_grad import nn
    from te_grad.frontends.aten import RULES
    for seed in (2000006085, 2000006108):
        spec = generate(seed)
        assert spec.dtype == "float32"
        outcome = check(spec)
        assert outcome.kind == "ok", outcome
    spec = next(s for s in map(generate, range(400)) if s.dtype == "float32"
                and any(n["op"] == "relu" for n in s.nodes))
    with pytest.MonkeyPatch.context() as m:
        m.setitem(RULES, "aten.relu.default", lambda t, x: nn.add(nn.relu(x), nn.multiply(x, 1e-2)))
        outcome = check(spec)
    assert outcome.kind.startswith("mismatch"), outcome
    import numpy as np
    w = np.array([1.0, 2.0, 3.0])
    for got in (np.ones((2, 3), np.float32) * w, np.ones(2, np.float32)):  # broadcastable or not
        with pytest.raises(torch_check._Mismatch, match="shape"):
            torch_check._close(got, w, 1e-4, "output", "mismatch-forward-eval", w.astype(np.float32))


def test_refusals_are_counted_by_operator():
    assert refused_ops("import_model(M): 2 node(s) use ATen operators te_grad does not translate "
                       "(aten.foo.default, aten.bar.Tensor):\n  ...") == ["aten.foo.default", "aten.bar.Tensor"]
    assert refused_ops("import_model(M): aten.max_pool2d_with_indices.default at node m (f.py:3: x): "
                       "max_pool2d with ceil_mode=True is not translated") == ["aten.max_pool2d_with_indices.default"]
    # a rule disagreeing with PyTorch on a shape is te_grad's error, not a refusal
    assert refused_ops("import_model(M): aten.view.default at node v: te_grad gives shape [2], PyTorch [3]") == []


def test_the_command_line_and_torch_stays_out_of_te_grad():
    proc = subprocess.run([sys.executable, "-m", "te_grad", "fuzz", "--torch", "--programs", "1", "--seed", "3", "--no-compile"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 modules (seed 3)" in proc.stdout and "modules with linear" in proc.stdout
    code = "import sys, te_grad, te_grad.tools.fuzz; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_a_module_that_met_pytorch_s_batch_norm_backward_bug_passes():
    """PyTorch's reference is kept off its CPU batch norm backward bug: a gradient laid out
    channels-last read as if contiguous, wrong gradients (module 95000313: batch norm's output
    the query of scaled_dot_product_attention; PyTorch's own finite differences agree with
    te_grad). (The GroupNorm backward that crashed the process, module 91000391 when it was drawn,
    gets a contiguous input the same way.)"""
    spec = generate(95000313)
    assert [n["op"] for n in spec.nodes][-2:] == ["batch_norm2d", "sdpa"]
    outcome = check(spec)
    assert outcome.kind == "ok", outcome


@pytest.mark.parametrize("how", ["no_grad", "count"])
def test_a_module_through_torch_compile_with_te_grad_s_backend_passes(how):
    """``--dynamo``: a module through ``torch.compile`` with te_grad's backend at two batch
    sizes against PyTorch. Under the backend a ``torch.no_grad()`` block made the compiled call
    fail (``crash``); an int32 count is the chain of integer results that fell back node by node."""
    def drawn(s):
        return any(n["op"].endswith("_stop" if how == "no_grad" else "_mask") and n.get("how") == how
                   for n in s.nodes) and any(n["op"] in ("linear", "conv2d") for n in s.nodes) and len(s.nodes) < 9
    spec = next(s for s in map(generate, range(400)) if drawn(s))
    outcome = check(spec, dynamo=True)
    assert outcome.kind == "ok", outcome
