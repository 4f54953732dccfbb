"""docs/IMPORT.md's operator list is the one generated from te_grad.frontends.aten.RULES."""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_operator_list_in_docs_import_is_current():
    from te_grad.tools.importdoc import render
    text = (ROOT / "docs" / "IMPORT.md").read_text()
    assert text == render(text), "docs/IMPORT.md's operator list is stale: python -m te_grad.tools.importdoc"


def test_the_list_names_every_rule_once():
    from te_grad.frontends.aten import KEEP, RULES
    from te_grad.tools.importdoc import operator_list
    rows = [line for line in operator_list().splitlines() if line.startswith("| `")]
    listed = []
    for row in rows:
        base, overloads = row.split("|")[1].strip().strip("`"), row.split("|")[2]
        listed += [f"{base}.{o}" for o in overloads.replace("(*kept whole*)", "").replace("`", "").replace(" ", "")
                   .split(",")]
    assert sorted(listed) == sorted(RULES)
    for name in KEEP:
        if name in RULES:
            base, _, overload = name.rpartition(".")
            assert f"| `{base}` | " in operator_list() and f"`{overload}` (*kept whole*)" in operator_list()


def test_regeneration_rewrites_only_the_list(tmp_path, monkeypatch):
    from te_grad.frontends import aten
    from te_grad.tools import importdoc
    doc = tmp_path / "IMPORT.md"
    doc.write_text(f"# hand-written\n\n{importdoc.BEGIN}\nold list\n{importdoc.END}\n\nafter\n")
    assert importdoc.main(["--check", "--path", str(doc)]) == 1
    monkeypatch.setitem(aten.RULES, "aten.made_up_op.default", lambda t, x: x)   # a rule added later
    assert importdoc.main(["--path", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# hand-written\n\n") and text.endswith(f"{importdoc.END}\n\nafter\n")
    assert "| `aten.made_up_op` | `default` |" in text and "old list" not in text
    assert importdoc.main(["--check", "--path", str(doc)]) == 0
    doc.write_text("no markers\n")
    with pytest.raises(ValueError, match="marker"):
        importdoc.main(["--path", str(doc)])


def test_the_command_checks_the_doc():
    done = subprocess.run([sys.executable, "-m", "te_grad.tools.importdoc", "--check"], capture_output=True,
                          text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
