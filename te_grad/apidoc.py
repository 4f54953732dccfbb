"""The API reference, generated from the docstrings: ``python -m te_grad.apidoc > docs/API.md``.

Every public name of ``te_grad`` (``__all__``), of ``te_grad.nn`` and of the other
public modules is listed with its signature and docstring. The framework bridges
(``te_grad.torch``, ``te_grad.jax``) are read from their source, so the reference
is generated the same without PyTorch or JAX installed. ``tests/test_docs_and_cli.py``
checks that every public function has a docstring and that docs/API.md is current.
"""
from __future__ import annotations

import ast
import inspect
import os
import textwrap
from typing import List

import te_grad

#: modules documented by importing them, and modules read from their source
IMPORTED = ["te_grad", "te_grad.nn", "te_grad.testing", "te_grad.fuzz"]
FROM_SOURCE = ["te_grad/torch.py", "te_grad/jax.py"]
OPTIONAL = ["te_grad.train", "te_grad.export"]


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _doc(obj) -> str:
    return textwrap.dedent(inspect.getdoc(obj) or "").strip()


def missing_docstrings() -> List[str]:
    """Public functions and classes of the imported modules that have no docstring."""
    out = []
    for mod_name in IMPORTED + [m for m in OPTIONAL if _importable(m)]:
        mod = __import__(mod_name, fromlist=["_"])
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and not inspect.getdoc(obj):
                out.append(f"{mod_name}.{name}")
    return out


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def _section(mod_name: str) -> List[str]:
    mod = __import__(mod_name, fromlist=["_"])
    lines = [f"## `{mod_name}`", "", _doc(mod), ""]
    for name in getattr(mod, "__all__", []):
        obj = getattr(mod, name)
        if inspect.ismodule(obj) or not (callable(obj) or inspect.isclass(obj)):
            continue
        kind = "class" if inspect.isclass(obj) else "function"
        lines += [f"### `{mod_name}.{name}{_signature(obj)}`" if kind == "function" else
                  f"### class `{mod_name}.{name}`", "", _doc(obj) or "(no docstring)", ""]
    return lines


def _source_section(path: str) -> List[str]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(te_grad.__file__)))
    with open(os.path.join(root, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    mod_name = path[:-3].replace("/", ".")
    lines = [f"## `{mod_name}`", "", (ast.get_docstring(tree) or "").strip(), ""]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if not doc:
                continue
            if isinstance(node, ast.FunctionDef):
                args = ast.unparse(node.args)
                lines += [f"### `{mod_name}.{node.name}({args})`", "", doc.strip(), ""]
            else:
                lines += [f"### class `{mod_name}.{node.name}`", "", doc.strip(), ""]
    return lines


def render() -> str:
    lines = ["# API reference", "",
             "Generated from the docstrings by `python -m te_grad.apidoc > docs/API.md`; do not edit.", ""]
    for mod_name in IMPORTED:
        lines += _section(mod_name)
    for path in FROM_SOURCE:
        lines += _source_section(path)
    for mod_name in OPTIONAL:
        if _importable(mod_name):
            lines += _section(mod_name)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
