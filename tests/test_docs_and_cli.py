"""The README's example runs as written, and the command line works."""
import io
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_example_runs():
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})


def test_readme_starts_with_the_two_commands():
    lines = [l.strip() for l in (ROOT / "README.md").read_text().splitlines() if l.strip()]
    assert lines[1] == "pip install -e . && python -m te_grad demo"
    assert lines[2] == 'pip install -e ".[test]" && pytest'


def test_demo_in_process():
    from te_grad.__main__ import demo
    out = io.StringIO()
    assert demo(out) == 0
    text = out.getvalue()
    assert "conv2d[n, c, h, w] = sum(" in text
    assert "dX[j0, j1, j2, j3] = sum(dY[j0, c, h, w] * W[" in text
    assert "match central finite differences" in text
    assert "compiled dX agrees with the reference evaluator" in text and "backward (dX and dW)" in text


def test_bench_command_runs_and_checks(capsys):
    from te_grad.__main__ import main
    assert main(["bench", "--quick", "--ops", "bias_add", "--no-torch", "--no-jax"]) == 0
    assert "bias_add" in capsys.readouterr().out


def test_module_entry_point():
    done = subprocess.run([sys.executable, "-m", "te_grad", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "demo" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "te_grad", "nonsense"], capture_output=True, text=True)
    assert bad.returncode != 0


def test_version_and_help_without_markup():
    import te_grad
    done = subprocess.run([sys.executable, "-m", "te_grad", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"te_grad {te_grad.__version__}"
    for args in (["--help"], ["fuzz", "--help"], ["show", "--help"]):
        text = subprocess.run([sys.executable, "-m", "te_grad", *args], capture_output=True, text=True).stdout
        assert "``" not in text and ":func:" not in text, text


def test_every_public_function_is_documented_and_the_reference_is_current():
    from te_grad.apidoc import missing_docstrings, render
    assert missing_docstrings() == []
    assert (ROOT / "docs" / "API.md").read_text() == render(), \
        "docs/API.md is stale: python -m te_grad.apidoc > docs/API.md"


def test_license_matches_setup_cfg():
    cfg = (ROOT / "setup.cfg").read_text()
    assert "license = Apache-2.0" in cfg
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0" in text


def test_notebook_install_hints_pin_torch():
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        text = nb.read_text()
        for m in re.finditer(r"pip install[^\"\\n]*", text):
            if "torch" in m.group(0):
                assert "torch==2.13.0" in m.group(0), (nb.name, m.group(0))
