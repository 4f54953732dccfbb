"""Every notebook in notebooks/ runs headless without a cell error, and is stored with its outputs."""
import json
import pathlib
import sys

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def _ids(paths):
    return [p.name for p in paths]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_stored_with_outputs(path):
    """Saved executed, so that it reads well where it is rendered without being run."""
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, f"{path.name} has no code cell"
    counts = [c["execution_count"] for c in code]
    assert all(isinstance(n, int) for n in counts), f"{path.name} has cells that were not executed"
    assert counts == sorted(counts), f"{path.name} was not executed top to bottom"
    for c in code:
        assert not any(o["output_type"] == "error" for o in c["outputs"]), \
            f"{path.name} was saved with an error in cell {c['execution_count']}"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """A ``python3`` kernelspec that runs this interpreter (so the notebooks see this te_grad)."""
    pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[test]')")
    pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[test]')")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install -e '.[test]')")
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (te_grad tests)", "language": "python"}))
    return str(root)


#: optional modules a notebook cannot run without (the others skip their optional parts themselves)
NEEDS = {"05_training.ipynb": ["sklearn"]}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_executes_without_error(path, kernel_env, monkeypatch):
    for module in NEEDS.get(path.name, []):
        pytest.importorskip(module, reason=f"{path.name} needs {module} (pip install -e '.[examples]')")
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("JUPYTER_PATH", kernel_env)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend draws the figures
    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except CellExecutionError as err:
        pytest.fail(f"{path.name}: a cell raised\n{err}", pytrace=False)
