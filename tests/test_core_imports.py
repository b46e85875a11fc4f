"""car_core's modules, and car_adapters' modules, import one another without a cycle, counting
imports made inside functions: a lazy import that dodges a cycle still ties the two modules
together, and the order of imports in a package's ``__init__.py`` must not be what keeps
importing it working. car_core's top floor (the report and the CLI) is imported by nothing
below it.

The graph is read from the source with ``ast``. Importing ``a.b.c`` also runs ``a/b/__init__``,
so a submodule import adds an edge to every package above it except those the importing
module sits in (Python has started them before it); ``from . import x`` adds an edge to ``x``
when it is a module (and to the package only for names that are not modules).
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "car_core"
ADAPTERS = CORE.parent / "adapters"  # imported as car_adapters
# The top floor: the report, the CLI and its kit. Only they and the package facade (which wires
# the report into the results' ``to_html``) may import them.
TOP_FLOOR = {"car_core.report", "car_core._clikit", "car_core.cli"}


def module_name(path: Path, root: Path, top: str) -> str:
    parts = [top, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path, top: str | None = None) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (anywhere in its source); ``top`` is
    the package's import name when it differs from its folder's."""
    top = top or root.name
    files = {module_name(p, root, top): p for p in sorted(root.rglob("*.py"))}
    packages = {module_name(p, root, top) for p in root.rglob("__init__.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if name in packages else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                submodules = {f"{origin}.{a.name}" for a in node.names} & files.keys()
                targets.update(submodules)
                if len(submodules) < len(node.names):  # some names come from origin itself
                    targets.add(origin)
        edges: set[str] = set()
        for target in targets:
            if target != top and not target.startswith(top + "."):
                continue
            parts = target.split(".")
            above = {".".join(parts[:i]) for i in range(2, len(parts))}
            edges.add(target)
            # the packages above the target run first, unless they are already running
            edges.update(p for p in above if not name.startswith(p + "."))
        graph[name] = {t for t in edges if t in files and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_car_core_imports_have_no_cycle() -> None:
    graph = import_graph(CORE)
    assert len(graph) > 20
    assert "car_core.stats" in graph["car_core.replay"]  # the reader sees relative imports
    assert find_cycle(graph) is None


def test_car_adapters_imports_have_no_cycle() -> None:
    graph = import_graph(ADAPTERS, "car_adapters")
    assert len(graph) > 30
    # relative imports across subpackages resolve under the import name, not the folder's
    assert {"car_adapters.common", "car_adapters.common.run_keeping"} <= \
        graph["car_adapters.openai_agents.recorder"]
    assert find_cycle(graph) is None


def test_nothing_below_the_top_floor_imports_it() -> None:
    graph = import_graph(CORE)
    assert TOP_FLOOR <= graph.keys()
    reaching_up = {m: sorted(graph[m] & TOP_FLOOR) for m in graph
                   if m not in TOP_FLOOR | {"car_core"}}
    assert {m: up for m, up in reaching_up.items() if up} == {}


def test_the_checker_sees_a_lazy_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from .sub.b import g\n\ndef f():\n    return g()\n")
    (pkg / "sub" / "__init__.py").write_text("from .c import h\n")
    (pkg / "sub" / "b.py").write_text("def g():\n    return 1\n")
    # c reaches a only inside a function, and through the package: still a cycle
    (pkg / "sub" / "c.py").write_text("def h():\n    from .. import a\n    return a\n")
    assert find_cycle(import_graph(pkg)) == ["pkg.a", "pkg.sub", "pkg.sub.c", "pkg.a"]
