"""car_core's modules import one another without a cycle, counting imports made inside
functions: a lazy import that dodges a cycle still ties the two modules together, and the
order of imports in ``car_core/__init__.py`` must not be what keeps ``import car_core`` working.

The graph is read from the source with ``ast``. Importing ``a.b.c`` also runs ``a/b/__init__``,
so a submodule import adds an edge to every package above it except those the importing
module sits in (Python has started them before it); ``from . import x`` adds an edge to ``x``
when it is a module (and to the package only for names that are not modules).
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "car_core"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (anywhere in its source)."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    packages = {module_name(p, root) for p in root.rglob("__init__.py")}
    top = root.name
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
