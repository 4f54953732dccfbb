"""``python -m te_grad import-check MODULE:FACTORY``: coverage table, outputs, gradients, timing."""
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from te_grad.tools.cli import main  # noqa: E402

MODELS = textwrap.dedent('''
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(4)
            self.fc = torch.nn.Linear(4 * 3 * 3, 5)

        def forward(self, x):
            h = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
            return self.fc(h.flatten(1))

    def make_net():
        return Net()

    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)
            self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 3))

        def forward(self, x, z):
            return torch.tanh(self.fc(x)).unsqueeze(1) * z * self.scale

    class Unsupported(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.linalg.qr(self.fc(x))[0]  # QR: no te_grad rule
''')


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    return str(path)


def test_a_supported_model_passes_every_check(models, capsys):
    rc = main(["import-check", f"{models}:make_net", "--input", "2x6x6", "--batch", "3", "--steps", "2"])
    text = capsys.readouterr().out
    assert rc == 0, text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.startswith("aten.")}
    assert rows["aten.convolution.default"] == ["2", "yes"]      # training and evaluation programs
    assert rows["aten._native_batch_norm_legit_functional.default"][-1] == "yes"
    assert "eval outputs [3, 5]: max relative error" in text
    assert "gradients of the cross entropy against random labels (6 parameters, training mode)" in text
    assert "te_grad" in text and "PyTorch" in text and "ms" in text
    assert float(text.split("eval outputs [3, 5]: max relative error ")[1].split()[0]) < 1e-4


def test_several_inputs_and_a_loss_of_squares(models, capsys):
    rc = main(["import-check", f"{models}:TwoInputs", "--input", "4", "--input", "2x3", "--batch", "3",
               "--steps", "1"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "inputs [[3, 4], [3, 2, 3]]" in text and "eval outputs [3, 2, 3]" in text
    assert "gradients of the sum of the outputs squared (3 parameters" in text


def test_an_unsupported_op_fails_with_the_table_and_its_source_line(models, capsys):
    rc = main(["import-check", f"{models}:Unsupported", "--input", "4"])
    text = capsys.readouterr().out
    assert rc == 1
    assert any(line.startswith("aten.linalg_qr.default") and line.split()[-1] == "NO" for line in text.splitlines())
    assert any(line.startswith("aten.linear.default") and line.split()[-1] == "yes" for line in text.splitlines())
    assert "models.py" in text and "torch.linalg.qr(self.fc(x))" in text
    assert "eval outputs" not in text


def test_values_that_disagree_fail(models, capsys, monkeypatch):
    from te_grad.frontends import aten
    monkeypatch.setitem(aten.RULES, "aten.relu.default", lambda t, x: x)   # a wrong translation
    rc = main(["import-check", f"{models}:make_net", "--input", "2x6x6", "--batch", "3", "--steps", "1"])
    text = capsys.readouterr().out
    assert rc == 1
    assert "FAILS" in text and "FAILED: outputs, gradients disagree with PyTorch" in text


def test_bad_arguments_are_errors(models, capsys):
    assert main(["import-check", "no_colon_here", "--input", "4"]) == 2
    assert "MODULE:FACTORY" in capsys.readouterr().err
    assert main(["import-check", f"{models}:missing", "--input", "4"]) == 2
    assert "no attribute 'missing'" in capsys.readouterr().err
    assert main(["import-check", f"{models}:make_net", "--input", "2xbad"]) == 2
    assert "whole numbers" in capsys.readouterr().err
    assert main(["import-check", f"{models}:make_net", "--input", "2x6x6", "--batch", "1"]) == 2
    assert main(["import-check", "no_such_module_te_grad:f", "--input", "4"]) == 2
    assert "cannot import module" in capsys.readouterr().err


def test_the_command_line_entry_point(models):
    done = subprocess.run([sys.executable, "-m", "te_grad", "import-check", f"{models}:Unsupported", "--input", "4"],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "aten.linalg_qr.default" in done.stdout
