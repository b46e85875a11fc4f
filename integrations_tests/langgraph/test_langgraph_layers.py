"""LangGraph's brancher never reaches into its recorder: the modules that check and run a branch
(``refusals``, ``branch_state``, ``importer``) import neither ``callback`` nor any module that
does; what both need to read from a step's ``meta`` lives in ``step_meta``. Read from the source
with ``ast`` (imports inside functions count), so the test loads no framework."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

PACKAGE = "car_adapters.langgraph"
RECORDER = f"{PACKAGE}.callback"
BRANCHING = ("refusals", "branch_state", "importer")


def _folder() -> Path:
    """The package's folder, found without importing it (its ``__init__`` loads LangGraph)."""
    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def package_imports(source: str) -> set[str]:
    """The modules of ``car_adapters.langgraph`` a module of it imports (``from .x import y``,
    ``from . import x``, or spelled absolutely), anywhere in its source."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith(PACKAGE + "."))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                origin = f"{PACKAGE}.{node.module}" if node.module else PACKAGE
            elif node.level == 0 and node.module and node.module.startswith(PACKAGE):
                origin = node.module
            else:
                continue  # another package (``..common``, car_core, a framework)
            if origin == PACKAGE:  # ``from . import x``: x is a module of the package
                out.update(f"{PACKAGE}.{a.name}" for a in node.names)
            else:
                out.add(origin)
    return out


def reached(start: str, sources: dict[str, str]) -> set[str]:
    """Every module of the package that importing ``start`` runs, through any chain of its
    modules' own imports (the package's ``__init__`` left out: it wires every part)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in package_imports(sources.get(todo.pop(), "")):
            if target not in seen and target != PACKAGE:
                seen.add(target)
                todo.append(target)
    return seen


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return {f"{PACKAGE}.{p.stem}": p.read_text() for p in _folder().glob("*.py")
            if p.stem != "__init__"}


@pytest.mark.parametrize("module", BRANCHING)
def test_a_branching_module_never_reaches_the_recorder(module: str,
                                                       sources: dict[str, str]) -> None:
    name = f"{PACKAGE}.{module}"
    assert name in sources, f"{name} is gone: update BRANCHING"
    assert RECORDER not in reached(name, sources)


def test_the_walk_finds_the_recorder_when_it_is_imported(sources: dict[str, str]) -> None:
    """The check can fail: a relative, a ``from . import`` and an absolute import of the
    recorder, direct or through another module, are each found."""
    for spelling in ("from .callback import CarCallback", "from . import callback",
                     f"import {RECORDER}", f"from {RECORDER} import agent_of"):
        assert RECORDER in reached("probe", {**sources, "probe": spelling})
    through = {**sources, f"{PACKAGE}.middle": "from .callback import CarCallback",
               "probe": "from .middle import x"}
    assert RECORDER in reached("probe", through)
    assert RECORDER in reached(f"{PACKAGE}.agent", sources)  # the agent wires both: it does
