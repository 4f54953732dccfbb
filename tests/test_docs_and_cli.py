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
