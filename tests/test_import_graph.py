"""The import graph between the project's files, computed from the source (every `import` and `from ... import`,
at module level or inside a function): no cycle between files, no import from a lower package to a higher one,
and click imported by the command line (cli/) alone.

The packages stand in layers: contract (names and columns) at the bottom; engine (models in, numbers out),
panels (scenarios and frames as data) and stats (tables in, statistics out; no torch) above it, none importing
another; readouts (the run driver and the studies) above those; organisms (adapters trained on the studies' own
reads) above readouts; cli, the command line, on top. A package imports only packages below it.
"""

import ast
from pathlib import Path

import pytest

from tests.helpers import ROOT

LAYERS = {"contract": 0, "engine": 1, "panels": 1, "stats": 1, "readouts": 2, "organisms": 3, "cli": 4}
"""Each package's floor: a package imports its own modules and those of packages on lower floors."""
THIRD_PARTY_BANNED = {"stats": {"torch", "transformers", "accelerate", "peft"}, "panels": {"torch", "transformers"},
                      "contract": {"torch", "transformers"}}
"""Libraries a lower package never imports: the statistics run without torch, panels and contract are data."""
COMMAND_LINE = "cli"
"""The one package that imports click."""


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str) -> set[str]:
    """Every absolute name the source imports: `import a.b` gives a.b, `from a import b` gives a.b (the module a.b
    where b is a submodule, else a name in module a)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def import_graph(sources: dict[str, str]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(file edges, outside imports): for each module, the project modules it imports (a name resolved to the
    longest project module it names) and the top-level names of everything else it imports."""
    def owner(name: str) -> str | None:
        while name and name not in sources:
            name = name.rpartition(".")[0]
        return name or None

    edges, outside = {}, {}
    for module, source in sources.items():
        names = imports_of(source)
        edges[module] = {o for o in map(owner, names) if o is not None and o != module}
        outside[module] = {n.split(".")[0] for n in names if owner(n) is None}
    return edges, outside


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def violations(edges: dict[str, set[str]], outside: dict[str, set[str]]) -> list[str]:
    """Every import that breaks the layers, a banned library, or click outside the command line; one line each."""
    out = []
    for module in sorted(edges):
        package = module.split(".")[0]
        for target in sorted(edges[module]):
            other = target.split(".")[0]
            if other != package and LAYERS[other] >= LAYERS[package]:
                out.append(f"{module} imports {target}: {other} is not below {package}")
        for name in sorted(outside[module]):
            if name in THIRD_PARTY_BANNED.get(package, ()):
                out.append(f"{module} imports {name}, which {package} never imports")
            if name == "click" and package != COMMAND_LINE:
                out.append(f"{module} imports click: only {COMMAND_LINE}/ does")
    return out


def project_sources() -> dict[str, str]:
    return {module_name(p, ROOT): p.read_text(encoding="utf-8")
            for package in LAYERS for p in sorted((ROOT / package).rglob("*.py"))}


def test_every_package_is_in_a_layer():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages <= set(LAYERS), f"give these packages a floor in LAYERS: {sorted(packages - set(LAYERS))}"


def test_no_import_cycle_between_files():
    edges, _ = import_graph(project_sources())
    assert not cycles(edges), "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles(edges))


def test_no_import_breaks_the_layers():
    found = violations(*import_graph(project_sources()))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("sources, kind, expect", [
    ({"readouts.a": "import readouts.b", "readouts.b": "def f():\n    from readouts.a import x"}, "cycle",
     [["readouts.a", "readouts.b"]]),
    ({"readouts.a": "from readouts import b", "readouts.b": "import readouts.c", "readouts.c": "from readouts.a import f"},
     "cycle", [["readouts.a", "readouts.b", "readouts.c"]]),
    ({"engine.a": "def f():\n    from readouts.b import g", "readouts.b": ""}, "layer",
     ["engine.a imports readouts.b: readouts is not below engine"]),
    ({"engine.a": "import panels.b", "panels.b": ""}, "layer", ["engine.a imports panels.b: panels is not below engine"]),
    ({"readouts.a": "from organisms.b import c", "organisms.b": ""}, "layer",
     ["readouts.a imports organisms.b: organisms is not below readouts"]),
    ({"readouts.a": "import click"}, "layer", ["readouts.a imports click: only cli/ does"]),
    ({"stats.a": "def f():\n    import torch.nn"}, "layer", ["stats.a imports torch, which stats never imports"]),
    ({"cli.a": "import click\nfrom readouts.b import c", "readouts.b": "from engine.d import e", "engine.d": ""}, "layer", []),
])
def test_the_checks_find_planted_faults(sources, kind, expect):
    edges, outside = import_graph(sources)
    assert (cycles(edges) if kind == "cycle" else violations(edges, outside)) == expect
