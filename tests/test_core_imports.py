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
# The top floor: the report and the CLI, every module of both packages. Only they and the
# package facade (which wires the report into the results' ``to_html``) may import them.
TOP_PACKAGES = ("car_core.report", "car_core.cli")


def on_top_floor(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in TOP_PACKAGES)


def module_name(path: Path, root: Path, top: str) -> str:
    parts = [top, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path, top: str) -> tuple[dict[str, Path], set[str]]:
    files = {module_name(p, root, top): p for p in sorted(root.rglob("*.py"))}
    packages = {module_name(p, root, top) for p in root.rglob("__init__.py")}
    return files, packages


def _edges(node: ast.Import | ast.ImportFrom, name: str, files: dict[str, Path],
           packages: set[str], top: str) -> set[str]:
    """The modules of the package that running the import statement ``node`` in module
    ``name`` imports: the target, and the packages above it that are not already running."""
    package = name if name in packages else name.rpartition(".")[0]
    targets: set[str] = set()
    if isinstance(node, ast.Import):
        targets.update(a.name for a in node.names)
    else:
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
    return {t for t in edges if t in files and t != name}


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported (class bodies, module-level
    ``if`` / ``try`` included; function bodies and ``if TYPE_CHECKING:`` blocks not)."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) \
                and not _is_type_checking(node):
            todo.extend(ast.iter_child_nodes(node))
    return found


def function_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run only when a function is called."""
    return [node for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))]


def import_graph(root: Path, top: str | None = None, *, module_level: bool = False
                 ) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (anywhere in its source, or only
    at module level); ``top`` is the package's import name when it differs from its folder's."""
    top = top or root.name
    files, packages = _modules(root, top)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        nodes = module_level_imports(tree) if module_level else [
            n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        graph[name] = set().union(*(_edges(n, name, files, packages, top) for n in nodes))
    return graph


def loaded_with(graph: dict[str, set[str]], name: str) -> set[str]:
    """The package's modules that are loaded once ``name`` is: the packages above it (they run
    first) and everything their and its module-level imports reach."""
    parts = name.split(".")
    todo = [".".join(parts[:i]) for i in range(1, len(parts))] + [name]
    seen: set[str] = set()
    while todo:
        m = todo.pop()
        if m in seen or m not in graph:
            continue
        seen.add(m)
        todo.extend(graph[m])
    return seen - {name}


def imports_with_no_effect(root: Path, top: str | None = None) -> list[str]:
    """Function-level imports of modules already loaded by the time any function of the module
    can run: the package's own modules its module-level imports reach, and any module the file
    itself imports at module level (or a package above one). They read like cycle workarounds
    and work around nothing. (A third-party module loaded only through another module is not
    judged here.)"""
    top = top or root.name
    files, packages = _modules(root, top)
    graph = import_graph(root, top, module_level=True)
    found = []
    for name, path in files.items():
        loaded = loaded_with(graph, name)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        at_top = {m for node in module_level_imports(tree) for m in _absolute_with_parents(node)}
        for node in function_level_imports(tree):
            targets = _edges(node, name, files, packages, top)
            absolute = _absolute(node)
            if (targets and targets <= loaded) or (absolute and absolute <= at_top):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}")
    return found


def _absolute(node: ast.Import | ast.ImportFrom) -> set[str]:
    """The modules an absolute import statement loads by name (empty for a relative one)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    return {node.module} if node.level == 0 and node.module else set()


def _absolute_with_parents(node: ast.Import | ast.ImportFrom) -> set[str]:
    names = _absolute(node)
    return {".".join(m.split(".")[:i]) for m in names for i in range(1, m.count(".") + 2)}


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
    assert "car_core.stats" in graph["car_core.engine.replay"]  # the reader sees relative imports
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
    assert set(TOP_PACKAGES) <= graph.keys()
    reaching_up = {m: sorted(t for t in graph[m] if on_top_floor(t)) for m in graph
                   if not on_top_floor(m) and m != "car_core"}
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


# Every module of both packages is judged (the CLI's included: its lazy imports had no effect).
NOT_JUDGED: set[str] = set()


def test_no_function_level_import_is_of_a_module_already_loaded() -> None:
    found = imports_with_no_effect(CORE) + imports_with_no_effect(ADAPTERS, "car_adapters")
    assert [f for f in found if f.split(":")[0] not in NOT_JUDGED] == []


def test_the_checker_sees_an_import_with_no_effect(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("import json\nfrom . import b\n\ndef f():\n    from . import c\n"
                              "    import json\n    return c\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text("def g():\n    from . import a\n    import numpy\n")
    # a's `c` is loaded through b and its `json` at its top; c's `a` by the package's __init__;
    # c's numpy is a real deferral
    assert imports_with_no_effect(pkg) == ["pkg/a.py:5: from . import c",
                                           "pkg/a.py:6: import json",
                                           "pkg/c.py:2: from . import a"]
