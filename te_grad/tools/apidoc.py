"""The API reference, generated from the docstrings: ``python -m te_grad.tools.apidoc > docs/API.md``.

Every public name of ``te_grad`` (``__all__``), of ``te_grad.nn`` and of the other
public modules is listed with its signature and docstring; a class with its constructor's
signature (unless te_grad makes it, as ``tg.build`` makes a ``codegen.Kernel``) and its
public methods and properties that have a docstring. The framework frontends
(``te_grad.torch``, ``te_grad.jax``) and their base (``te_grad.frontends.base``) are read
from their source, so the reference is generated the same without PyTorch or JAX installed. ``tests/tools/test_docs_and_cli.py``
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
IMPORTED = ["te_grad", "te_grad.nn", "te_grad.testing", "te_grad.tools.fuzz", "codegen"]
#: classes whose instances te_grad makes (their constructors are no API)
MADE_BY_TE_GRAD = {"codegen.Kernel": "tg.build", "te_grad.Tensor": "tg.placeholder and tg.compute",
                   "te_grad.Expr": "indexing tensors and the scalar functions",
                   "te_grad.DifferentiationResult": "tg.differentiate", "te_grad.RowGradient": "tg.row_gradient",
                   "te_grad.tools.fuzz.Outcome": "the fuzzer", "te_grad.tools.fuzz.Program": "the fuzzer"}
FROM_SOURCE = ["te_grad/torch.py", "te_grad/jax.py", "te_grad/frontends/base.py"]
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
        if not inspect.isclass(obj):
            lines += [f"### `{mod_name}.{name}{_signature(obj)}`", "", _doc(obj) or "(no docstring)", ""]
            continue
        qualified = f"{mod_name}.{name}"
        if qualified in MADE_BY_TE_GRAD:
            heading = f"### class `{qualified}` (made by {MADE_BY_TE_GRAD[qualified]})"
        elif issubclass(obj, BaseException):
            heading = f"### class `{qualified}`"
        else:
            heading = f"### class `{qualified}{_signature(obj).replace(' -> None', '')}`"
        lines += [heading, "", _doc(obj) or "(no docstring)", ""] + _members(obj)
    return lines


def _members(cls) -> List[str]:
    """The class's own public methods and properties that have a docstring, in source order."""
    lines = []
    for name, member in vars(cls).items():
        if name.startswith("_") and name != "__call__":
            continue
        if isinstance(member, property):
            doc, heading = member.__doc__, f"#### `{cls.__name__}.{name}` (property)"
        elif isinstance(member, (staticmethod, classmethod)) or inspect.isfunction(member):
            fn = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            sig = _signature(fn)
            if not isinstance(member, staticmethod):
                sig = sig.replace("(self, ", "(", 1).replace("(self)", "()", 1).replace("(cls, ", "(", 1) \
                    .replace("(cls)", "()", 1)
            call = f"{cls.__name__}{sig}" if name == "__call__" else f"{cls.__name__}.{name}{sig}"
            doc, heading = fn.__doc__, f"#### `{call}`"
        else:
            continue
        if doc:
            lines += [heading, "", textwrap.dedent(inspect.cleandoc(doc)).strip(), ""]
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
             "Generated from the docstrings by `python -m te_grad.tools.apidoc > docs/API.md`; do not edit.", ""]
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
