"""The floors of the house, read from the imports (function-level ones included).

An AST walk over every module of ``te_grad/``, ``simplify/`` and ``codegen/`` gives the
import graph; :data:`FLOORS` is the "may import" table, lowest floor first. A module may
import modules of its own floor or of a lower one, never of a higher one; and:

- there is no import cycle at all, inside a floor or across floors;
- nothing below the facade (``te_grad/__init__.py``) imports it, and nothing in the
  library imports the tools (``te_grad.tools``): both are higher floors;
- the oracle (``te_grad.evaluator``, the numpy reference evaluator) is a witness, not a
  library: below the facade only the loop interpreter (itself a witness) imports it;
  iteration counts and reduce bounds come from integer arithmetic on the IR
  (:func:`te_grad.intervals.index_values`), argument checks from :mod:`te_grad.argcheck`;
- the op records (``te_grad.ops``) are facts: they import only the base floor.
"""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("te_grad", "simplify", "codegen")

#: the floors, lowest first: ``(name, modules)``; a name ending in ``.`` is a package prefix
FLOORS = [
    ("base", {"te_grad.errors", "te_grad.dtypes", "te_grad.version", "te_grad.interop", "te_grad.argcheck",
              "te_grad.checking", "te_grad.collector"}),
    ("core", {"te_grad.ops", "te_grad.ir", "te_grad.graph", "te_grad.visitor", "te_grad.transform",
              "te_grad.deep", "te_grad.printer", "te_grad.verify", "te_grad.fingerprint", "te_grad.intervals",
              "te_grad.sizes"}),
    ("sugar", {"te_grad.dsl", "te_grad.lift"}),
    ("oracle", {"te_grad.evaluator"}),
    ("simplify", {"simplify", "simplify."}),
    ("codegen", {"codegen", "codegen."}),
    ("autodiff", {"te_grad.autodiff", "te_grad.autodiff."}),
    ("nn", {"te_grad.nn", "te_grad.nn."}),
    ("library", {"te_grad.residuals", "te_grad.symbolic", "te_grad.display"}),
    ("facade", {"te_grad"}),
    ("above", {"te_grad.train", "te_grad.train.", "te_grad.torch", "te_grad.torch_import", "te_grad.torch_dynamo",
               "te_grad.jax",
               "te_grad.frontends", "te_grad.frontends.", "te_grad.testing", "te_grad.suite",
               "te_grad.formulations"}),
    ("tools", {"te_grad.tools", "te_grad.tools.", "te_grad.__main__"}),
]
#: below the facade, the only modules that may import the oracle (witnesses themselves)
ORACLE_WITNESSES = {"codegen.interpret"}


def _modules():
    mods = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _imports(name, path, modules):
    """``[(imported module, [names imported from it])]`` of every import statement."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out.append((target, [a.name for a in node.names]))
    edges = []
    for target, names in out:
        subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
        edges += subs
        if target in modules and (not names or len(subs) < len(names)):
            edges.append(target)
    return edges


def _graph():
    modules = _modules()
    return {m: sorted(set(e for e in _imports(m, p, modules) if e in modules and e != m))
            for m, p in modules.items()}


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def _floor_of(module):
    """The rank of ``module``'s floor in :data:`FLOORS` (the longest matching entry wins)."""
    best, rank = -1, None
    for r, (_, members) in enumerate(FLOORS):
        for m in members:
            hit = module == m or (m.endswith(".") and module.startswith(m))
            if hit and len(m) > best:
                best, rank = len(m), r
    return rank


def test_every_module_has_a_floor():
    unplaced = sorted(m for m in _modules() if _floor_of(m) is None)
    assert not unplaced, f"modules in no floor of FLOORS: {unplaced}"


def test_no_module_imports_a_higher_floor():
    graph = _graph()
    upward = sorted(f"{m} ({FLOORS[_floor_of(m)][0]}) -> {d} ({FLOORS[_floor_of(d)][0]})"
                    for m, deps in graph.items() for d in deps
                    if _floor_of(m) is not None and _floor_of(d) is not None and _floor_of(d) > _floor_of(m))
    assert not upward, "imports from a lower floor to a higher one:\n" + "\n".join(upward)


def test_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles: {cycles}"


def test_nothing_below_the_facade_imports_it():
    modules = _modules()
    facade = _floor_of("te_grad")
    found = set()
    for m, p in modules.items():
        if _floor_of(m) >= facade:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "te_grad" and not node.level:
                found |= {f"{m}: {a.name}" for a in node.names if f"te_grad.{a.name}" not in modules}
            if isinstance(node, ast.ImportFrom) and node.level and node.module is None:
                pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
                base = ".".join(pkg.split(".")[:len(pkg.split(".")) - node.level + 1])
                if base == "te_grad":
                    found |= {f"{m}: from . import {a.name}" for a in node.names
                              if f"te_grad.{a.name}" not in modules}
            if isinstance(node, ast.Import) and any(a.name == "te_grad" for a in node.names):
                found.add(f"{m}: import te_grad")
    assert not found, sorted(found)


def test_the_oracle_is_a_witness_not_a_library():
    graph = _graph()
    facade = _floor_of("te_grad")
    users = {m for m, deps in graph.items() if "te_grad.evaluator" in deps and _floor_of(m) < facade}
    assert users == ORACLE_WITNESSES, f"modules below the facade using the oracle: {sorted(users)}"


def test_the_op_records_are_facts():
    assert set(_graph()["te_grad.ops"]) <= FLOORS[0][1]


def test_the_walk_sees_function_level_imports():
    """The walk is not blind: a function-level import is an edge, and a made-up cycle is found."""
    graph = _graph()
    assert "te_grad.version" in graph["codegen.export"]  # imported inside header()
    assert "codegen.kernel" in graph["te_grad.display"]  # imported inside install()
    assert _floor_of("te_grad.tools.fuzz.check") == len(FLOORS) - 1 and _floor_of("te_grad") == 9
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


def test_every_package_can_be_imported_first():
    """``import simplify`` (or ``codegen``, or a submodule) in a fresh interpreter before
    ``te_grad``: the facade's start-up imports the floors above the core, which import the
    package being initialized; each must work whichever is imported first."""
    import subprocess
    import sys
    for first in ("simplify", "codegen", "simplify.count", "codegen.kernel", "te_grad.ir"):
        code = (f"import {first}\nimport te_grad as tg\nx = tg.placeholder((3,), name='x')\n"
                "y = tg.compute((3,), lambda i: x[i] * 2.0, name='y')\n"
                "print(tg.simplify([y])[0].name)")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stdout.strip() == "y", f"import {first} first:\n{done.stderr[-2000:]}"
