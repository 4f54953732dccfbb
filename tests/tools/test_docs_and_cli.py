"""The README's example runs as written, and the command line works."""
import io
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_readme_example_runs():
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})


def test_readme_starts_with_the_two_commands():
    lines = [l.strip() for l in (ROOT / "README.md").read_text().splitlines() if l.strip()]
    assert lines[1] == "pip install -e . && python -m te_grad demo"
    assert lines[2] == 'pip install -e ".[test]" && pytest -n auto'
    # CI runs the same command, quietly
    assert 'pip install --quiet -e ".[test]" && pytest -q -n auto\n' in (ROOT / ".ci" / "run").read_text()


def test_demo_in_process():
    from te_grad.tools.cli import demo
    out = io.StringIO()
    assert demo(out) == 0
    text = out.getvalue()
    assert "conv2d[n, c, h, w] = sum(" in text
    assert "dX[j0, j1, j2, j3] = sum(dY[j0, c, h, w] * W[" in text
    assert "match central finite differences" in text
    assert "compiled dX agrees with the reference evaluator" in text and "backward (dX and dW)" in text


def test_bench_command_runs_and_checks(capsys):
    from te_grad.tools.cli import main
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
    from te_grad.tools.apidoc import missing_docstrings, render
    assert missing_docstrings() == []
    assert (ROOT / "docs" / "API.md").read_text() == render(), \
        "docs/API.md is stale: python -m te_grad.tools.apidoc > docs/API.md"


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


def test_the_reference_covers_the_kernel_the_trainer_and_the_constructors():
    from te_grad.tools.apidoc import render
    text = render()
    flat = " ".join(text.split())
    for phrase in ["keyword arguments by placeholder name", "out= must not overlap any input or other output"]:
        assert phrase in flat, phrase
    for needle in ["### class `codegen.Kernel` (made by tg.build)", "#### `Kernel.loops` (property)",
                   "#### `Kernel.export(path", "#### `Kernel.profile(arrays", "### `codegen.build(outputs",
                   "#### `Trainer.update(*batch", "#### `Trainer.fit(", "#### `Trainer.load(path",
                   "#### `Trainer.save(path", "#### `Trainer.predict(", "#### `Trainer.export(path",
                   "### class `te_grad.train.Trainer(model, inputs",
                   "### class `te_grad.train.Adam(lr: 'float' = 0.001, betas=(0.9, 0.999)",
                   "### class `te_grad.train.Linear(in_features", "#### `Tensor.ndim` (property)"]:
        assert needle in text, needle
    # tg.build's options are described where it points
    build_doc = text[text.index("### `te_grad.build("):]
    assert "codegen.build" in build_doc[:1500] and "fast_math" in build_doc[:1500]


def test_no_document_points_to_a_markdown_file_the_project_does_not_have():
    import re
    files = [ROOT / "README.md", *ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"),
             *(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "notebooks").glob("*.md")]
    for package in ("te_grad", "codegen", "simplify", "examples", "benchmarks"):
        files += list((ROOT / package).rglob("*.py"))
    dangling = []
    for path in files:
        for name in set(re.findall(r"[\w./-]*[A-Za-z_]\w*\.md\b", path.read_text(errors="ignore"))):
            if not any(base.joinpath(name).exists() for base in (ROOT, path.parent, ROOT / "docs")):
                dangling.append(f"{path.relative_to(ROOT)}: {name}")
    assert dangling == []


def test_readme_sizes_example_runs(capsys):
    """The example of "Sizes known at run time": one kernel for three sizes, checked against
    the oracle inside the example, and the count as a function of n."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Sizes known at run time"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "(n,)" in out and "208 * n | 7696" in out


def test_readme_import_example_runs():
    """The example of "Whole models from PyTorch": five steps of an imported CNN give PyTorch's
    loss and running statistics (checked inside the example)."""
    import pytest
    pytest.importorskip("torch")
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Whole models from PyTorch"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
