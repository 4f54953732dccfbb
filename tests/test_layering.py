"""The floors of the house, read from the imports (function-level ones included).

An AST walk over every module of ``te_grad/``, ``simplify/`` and ``codegen/`` gives the
import graph. What it enforces today:

- nothing in ``simplify/`` or ``codegen/`` imports a name from the facade
  (``te_grad/__init__.py``): they import the modules below it (``te_grad.ir``,
  ``te_grad.version``, ...);
- the oracle (``te_grad.evaluator``) is imported by no module of ``simplify/`` or
  ``codegen/`` but the loop interpreter (:data:`ORACLE_USERS`), itself a witness: iteration
  counts and reduce bounds come from integer arithmetic on the IR
  (:func:`te_grad.intervals.index_values`), argument checks from :mod:`codegen.argcheck`;
- no two modules import each other (a cycle of two) beyond the pairs of the core listed in
  :data:`MUTUAL`, and the largest import cycle does not grow past :data:`LARGEST_CYCLE`
  modules (the bottom of ``te_grad/`` is still one circle, closed by function-level
  imports: both may only shrink, down to no cycle at all).
"""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("te_grad", "simplify", "codegen")

#: the only module of simplify/ and codegen/ that imports the oracle: the loop interpreter, a witness
ORACLE_USERS = {"codegen.interpret"}
#: the most modules one import cycle may hold
LARGEST_CYCLE = 71
#: pairs of modules that still import each other (the IR core and its sugar, printing, display)
MUTUAL = {("te_grad", "te_grad.residuals"), ("te_grad.dsl", "te_grad.ir"), ("te_grad.dsl", "te_grad.ops"),
          ("te_grad.graph", "te_grad.ir"), ("te_grad.ir", "te_grad.printer"), ("te_grad.ir", "te_grad.symbolic")}


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


def test_nothing_below_the_facade_imports_it():
    modules = _modules()
    facade_names = set()
    for m, p in modules.items():
        if not m.startswith(("simplify", "codegen")):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "te_grad" and not node.level:
                facade_names |= {f"{m}: {a.name}" for a in node.names if f"te_grad.{a.name}" not in modules}
            if isinstance(node, ast.Import) and any(a.name == "te_grad" for a in node.names):
                facade_names.add(f"{m}: import te_grad")
    assert not facade_names, sorted(facade_names)


def test_the_oracle_is_a_witness_not_a_library():
    graph = _graph()
    users = {m for m, deps in graph.items() if m.startswith(("simplify", "codegen")) and "te_grad.evaluator" in deps}
    assert users == ORACLE_USERS, f"users of the oracle: {sorted(users)} (only {sorted(ORACLE_USERS)})"


def test_no_two_modules_import_each_other_and_the_circle_does_not_grow():
    graph = _graph()
    pairs = {(a, b) for a in graph for b in graph[a] if a < b and a in graph.get(b, [])}
    assert pairs <= MUTUAL, f"modules that import each other: {sorted(pairs - MUTUAL)}"
    # the exporter and the disk cache read the version from te_grad.version, not the facade;
    # the translation validator scans domains, the isl bridge no longer calls it back
    assert not [m for m in graph if m.startswith(("simplify", "codegen")) and "te_grad" in graph[m]]
    assert "simplify.validate" not in graph["simplify.isl_bridge"]
    largest = max((len(c) for c in _cycles(graph)), default=0)
    assert largest <= LARGEST_CYCLE, f"an import cycle of {largest} modules (at most {LARGEST_CYCLE})"


def test_the_walk_sees_function_level_imports():
    """The walk is not blind: a function-level import is an edge, and a made-up cycle is found."""
    graph = _graph()
    assert "te_grad.version" in graph["codegen.export"]  # imported inside header()
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
