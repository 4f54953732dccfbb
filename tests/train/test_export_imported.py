"""Exported training steps of models imported from PyTorch, run from C on the host and on
aarch64 under qemu: the losses and the final state equal the Python trainer's (and PyTorch's).

The tests of aarch64 skip only where its cross compiler or qemu is missing, and never in CI
(``TE_GRAD_REQUIRE_ALL=1`` turns a skip into a failure; .ci/run installs them)."""
import shutil
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import te_grad as tg  # noqa: E402
import te_grad.torch as tgt  # noqa: E402
from te_grad import train  # noqa: E402

CROSS = {
    "host": ("cc", []),
    "aarch64-linux-gnu": ("aarch64-linux-gnu-gcc", ["qemu-aarch64"]),
}
STEPS, BATCH, LR = 5, 6, 0.05


def toolchain(target):
    cc, runner = CROSS[target]
    missing = [tool for tool in [cc] + runner if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (Debian: gcc-aarch64-linux-gnu "
                    "libc6-dev-arm64-cross qemu-user)")
    return cc, runner


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        h = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(h.flatten(1))


class TwoInputs(torch.nn.Module):
    """Two inputs, a frozen parameter and a buffer the program never mutates."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(5, 4)
        self.b = torch.nn.Linear(3, 4)
        self.shift = torch.nn.Parameter(torch.linspace(-1, 1, 4), requires_grad=False)
        self.register_buffer("scale", torch.tensor([0.5, 1.0, 1.5, 2.0]))

    def forward(self, x, z):
        return torch.tanh(self.a(x)) * self.scale + self.b(z) + self.shift


def driver(name, inputs, targets, has_accuracy, steps, lr) -> str:
    """A C program: read STEPS batches from data.bin, run NAME_step on each from the initial
    state, print each loss, write the final state blob to state.bin."""
    up = name.upper()
    lines = ["#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>", f'#include "{name}.h"', "",
             "static void get(FILE *f, void *p, size_t n) { if (fread(p, 1, n, f) != n) { "
             "fprintf(stderr, \"data.bin is short\\n\"); exit(3); } }",
             "int main(void) {", '  FILE *f = fopen("data.bin", "rb");', "  if (!f) return 3;",
             f"  void *state[2] = {{malloc({up}_STEP_STATE_IN_BYTES), malloc({up}_STEP_STATE_IN_BYTES)}};",
             f"  memcpy(state[0], {name}_initial_state, {up}_STEP_STATE_IN_BYTES);",
             "  int cur = 0;"]
    args = []
    for k, a in enumerate(list(inputs) + list(targets)):
        lines.append(f"  void *b{k} = malloc({a.nbytes});")
        args.append(f"b{k}")
    lines += [f"  for (int s = 0; s < {steps}; s++) {{"]
    lines += [f"    get(f, b{k}, {a.nbytes});" for k, a in enumerate(list(inputs) + list(targets))]
    lines += ["    float loss" + (", accuracy;" if has_accuracy else ";"),
              f"    int rc = {name}_step({', '.join(args)}, (int64_t)(s + 1), {lr}f, (float)(s + 1), "
              f"state[cur], state[1 - cur], &loss{', &accuracy' if has_accuracy else ''});",
              "    if (rc) { fprintf(stderr, \"step %d: rc %d\\n\", s + 1, rc); return 1; }",
              "    cur = 1 - cur;", '    printf("loss %.9g\\n", loss);', "  }",
              '  FILE *o = fopen("state.bin", "wb");',
              f"  fwrite(state[cur], 1, {up}_STEP_STATE_IN_BYTES, o);", "  fclose(o);", "  return 0;", "}"]
    return "\n".join(lines) + "\n"


def run_exported(trainer, batches, target, tmp_path, name):
    """The exported step run from C on ``batches`` ([(inputs..., targets...)]): losses and final
    state (by name), read with the layout export returns."""
    cc, runner = toolchain(target)
    work = tmp_path / target
    work.mkdir()
    files = trainer.export(str(work / name), target=target)
    n_in = len(trainer.inputs)
    first = batches[0]
    (work / "main.c").write_text(driver(name, first[:n_in], first[n_in:], files["has_accuracy"], len(batches), LR))
    with open(work / "data.bin", "wb") as f:
        for batch in batches:
            for a in batch:
                np.ascontiguousarray(a).tofile(f)
    prog = work / "prog"
    done = subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-O1", "-static", "-I", str(work), "-o", str(prog),
                           str(work / "main.c"), files["object"], "-lm"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    done = subprocess.run(runner + [str(prog)], cwd=work, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    losses = [float(line.split()[1]) for line in done.stdout.splitlines()]
    blob = (work / "state.bin").read_bytes()
    assert len(blob) == files["state_bytes"]
    state = {}
    for key, (offset, shape) in files["layout"].items():
        dtype = np.dtype(files["dtypes"][key])
        count = int(np.prod(shape, dtype=np.int64))
        state[key] = np.frombuffer(blob, dtype, count, offset).reshape(shape)
    return losses, state


def cnn_batches():
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((BATCH, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, BATCH).astype(np.int64))
            for _ in range(STEPS)]


def torch_losses(net, batches, loss_fn, momentum=0.0):
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=momentum)
    net.train()
    losses = []
    for *xs, y in batches:
        opt.zero_grad()
        loss = loss_fn(net(*map(torch.from_numpy, xs)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def python_run(trainer, batches):
    losses = [trainer.update(*b) for b in batches]
    return losses, {**trainer.params, **trainer.states}


@pytest.mark.parametrize("target", sorted(CROSS))
def test_imported_cnn_with_batch_norm_trains_from_c_like_python(target, tmp_path):
    torch.manual_seed(0)
    net = SmallCNN()
    batches = cnn_batches()
    model = tgt.import_model(net, (torch.from_numpy(batches[0][0]),))
    x = model.input_placeholders()[0]
    y = tg.placeholder((BATCH,), "int64", name="y")
    trainer = train.Trainer(model, inputs=[x], targets=[y], loss=tg.nn.softmax_cross_entropy,
                            optimizer=train.SGD(lr=LR, momentum=0.9), progress=False)
    c_losses, c_state = run_exported(trainer, batches, target, tmp_path, "cnn")
    py_losses, py_state = python_run(trainer, batches)
    assert len(c_losses) == STEPS
    np.testing.assert_allclose(c_losses, py_losses, rtol=1e-5, atol=1e-6)
    assert set(c_state) == set(py_state)
    assert c_state["bn.num_batches_tracked"].dtype == np.int64 and int(c_state["bn.num_batches_tracked"]) == STEPS
    for key, want in py_state.items():
        np.testing.assert_allclose(c_state[key], want, rtol=1e-5, atol=1e-6, err_msg=key)
    # and both are PyTorch's
    want = torch_losses(net, batches, torch.nn.functional.cross_entropy, momentum=0.9)
    np.testing.assert_allclose(c_losses, want, rtol=1e-4, atol=1e-5)
    sd = net.state_dict()
    for key in ("bn.running_mean", "bn.running_var", "conv.weight", "fc.bias"):
        np.testing.assert_allclose(c_state[key], sd[key].numpy(), rtol=1e-4, atol=1e-5, err_msg=key)
    assert int(sd["bn.num_batches_tracked"]) == int(c_state["bn.num_batches_tracked"])


def test_two_inputs_frozen_parameter_and_read_only_buffer_are_carried(tmp_path):
    torch.manual_seed(1)
    net = TwoInputs()
    rng = np.random.default_rng(4)
    batches = [(rng.standard_normal((BATCH, 5)).astype(np.float32), rng.standard_normal((BATCH, 3)).astype(np.float32),
                rng.standard_normal((BATCH, 4)).astype(np.float32)) for _ in range(STEPS)]
    model = tgt.import_model(net, tuple(torch.from_numpy(a) for a in batches[0][:2]))
    x, z = model.input_placeholders()
    y = tg.placeholder((BATCH, 4), name="y")
    trainer = train.Trainer(model, inputs=[x, z], targets=[y], loss=tg.nn.mse_loss,
                            optimizer=train.SGD(lr=LR), progress=False)
    assert {"shift", "scale"} <= set(trainer.states)   # states the step reads and never writes
    c_losses, c_state = run_exported(trainer, batches, "host", tmp_path, "two")
    py_losses, py_state = python_run(trainer, batches)
    np.testing.assert_allclose(c_losses, py_losses, rtol=1e-5, atol=1e-7)
    for key, want in py_state.items():
        np.testing.assert_allclose(c_state[key], want, rtol=1e-5, atol=1e-7, err_msg=key)
    np.testing.assert_array_equal(c_state["shift"], net.shift.detach().numpy())
    np.testing.assert_array_equal(c_state["scale"], net.scale.numpy())
    want = torch_losses(net, batches, torch.nn.functional.mse_loss)
    np.testing.assert_allclose(c_losses, want, rtol=1e-4, atol=1e-6)


def test_the_fine_tuning_example_prints_the_python_trainers_losses(tmp_path):
    """examples/finetune end to end: prepare.py exports, the host compiler builds finetune.c,
    its printed losses are the Python trainer's (and PyTorch's), for all steps and fewer."""
    import importlib.util
    import os
    import sys
    cc, _ = toolchain("host")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    where = os.path.join(root, "examples", "finetune")
    out = tmp_path / "build"
    steps = 6
    subprocess.run([sys.executable, os.path.join(where, "prepare.py"), str(out), "--steps", str(steps)],
                   check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root})
    prog = out / "finetune"
    subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-O2", "-I", str(out), "-o", str(prog),
                    os.path.join(where, "finetune.c"), str(out / "finetune.o"), "-lm"],
                   check=True, capture_output=True, text=True)
    done = subprocess.run([str(prog), str(out / "finetune_data.bin")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    c_losses = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step")]
    py_losses = [float(line.split()[-1]) for line in (out / "python_losses.txt").read_text().splitlines()]
    assert len(c_losses) == len(py_losses) == steps
    np.testing.assert_allclose(c_losses, py_losses, rtol=1e-4, atol=2e-6)
    assert f"batch norm saw {steps} batches" in done.stdout
    done = subprocess.run([str(prog), str(out / "finetune_data.bin"), "2"], capture_output=True, text=True)
    assert done.returncode == 0 and [line.split()[-1] for line in done.stdout.splitlines()[:2]] == \
        [f"{v:.6f}" for v in py_losses[:2]] and "batch norm saw 2 batches" in done.stdout
    # the same network and batches in PyTorch, its first convolution frozen
    spec = importlib.util.spec_from_file_location("finetune_prepare", os.path.join(where, "prepare.py"))
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    net = prepare.network()
    rng = np.random.default_rng(0)
    batches = [prepare.make_batch(rng) for _ in range(steps)]
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=prepare.LR, momentum=prepare.MOMENTUM)
    want = []
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        want.append(loss.item())
    np.testing.assert_allclose(c_losses, want, rtol=1e-4, atol=1e-5)
