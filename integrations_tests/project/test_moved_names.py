"""Public names of ``car_adapters`` that moved keep working for one release, and say where they
went: the flat modules of 0.1 (``car_adapters._moved``) and the step-meta helpers that left the
LangGraph recorder (``callback`` → ``step_meta``). ``OpenAIAgentsAgent(context=...)``, which
no keyword can stand in for, is refused with the way forward. CAR's own code and tests use the
new homes only (pyproject turns a ``car_adapters`` deprecation warning into an error)."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import car_adapters
import pytest
from agents import Agent
from car_adapters import _moved
from car_adapters.langgraph import callback, step_meta
from car_adapters.openai_agents import OpenAIAgentsAgent

from car_core.errors import InvalidInput

ROOT = Path(__file__).resolve().parents[2]
# every flat module of 0.1 that moved, with its new home
MOVED_MODULES = {
    "car_adapters.chat_agent": "car_adapters.models.chat_agent",
    "car_adapters.local": "car_adapters.models.local",
    "car_adapters.server_policy": "car_adapters.models.server_policy",
    "car_adapters.chat_messages": "car_adapters.common.messages",
    "car_adapters.chat_branch": "car_adapters.common.branch",
    "car_adapters.fingerprint": "car_adapters.common.fingerprint",
    "car_adapters.run_keeping": "car_adapters.common.run_keeping",
    "car_adapters.pytest_integrations": "car_adapters.pytest_plugin.integrations",
    "car_adapters.pytest_recording": "car_adapters.pytest_plugin.recording",
    "car_adapters.support_agent": "car_adapters.demo.support_agent",
}
MOVED_FROM_CALLBACK = ["PUSH", "DEFAULT_GRAPH_NAME", "NODE_INPUT", "agent_of", "is_send_task",
                       "builds_input", "task_key"]


def test_the_shim_table_is_the_list_above() -> None:
    assert {f"car_adapters.{old}": f"car_adapters.{new}"
            for old, new in _moved.MOVED.items()} == MOVED_MODULES


@pytest.fixture
def forget(monkeypatch: pytest.MonkeyPatch):
    """Drop an old path from the module cache (restored afterwards), so importing it runs the
    shim again and warns, as it does in a fresh interpreter."""
    def drop(old: str) -> None:
        monkeypatch.delitem(sys.modules, old, raising=False)
        monkeypatch.delattr(car_adapters, old.rpartition(".")[2], raising=False)
    return drop


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_module_path_is_its_new_module_and_warns_where_it_went(old: str, forget) -> None:
    new = MOVED_MODULES[old]
    forget(old)
    with pytest.warns(DeprecationWarning, match=f"^{old} moved to {new}; import it from there"):
        aliased = importlib.import_module(old)
    assert aliased is importlib.import_module(new)


def test_from_imports_of_an_old_path_warn_and_give_the_same_objects(forget) -> None:
    forget("car_adapters.chat_agent")
    with pytest.warns(DeprecationWarning, match="car_adapters.models.chat_agent"):
        from car_adapters.chat_agent import ChatAgent
    from car_adapters.models.chat_agent import ChatAgent as new
    assert ChatAgent is new
    forget("car_adapters.chat_messages")
    with pytest.warns(DeprecationWarning, match="car_adapters.common.messages"):
        from car_adapters import chat_messages
    from car_adapters.common import messages
    assert chat_messages is messages


@pytest.mark.parametrize("name", MOVED_FROM_CALLBACK)
def test_a_step_meta_helper_under_its_old_name_is_the_same_and_warns(name: str) -> None:
    home = f"car_adapters.langgraph.step_meta.{name}"
    with pytest.warns(DeprecationWarning, match=f"callback.{name} moved to {home}"):
        old = getattr(callback, name)
    assert old is getattr(step_meta, name)


def test_from_callback_import_of_a_moved_helper_still_works() -> None:
    with pytest.warns(DeprecationWarning, match="step_meta.builds_input"):
        from car_adapters.langgraph.callback import builds_input
    assert builds_input is step_meta.builds_input


def test_a_name_callback_never_had_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        callback.no_such_name  # noqa: B018 - the attribute access is the test


def test_the_removed_context_keyword_is_refused_with_what_to_use() -> None:
    with pytest.raises(InvalidInput, match="context=.*was removed") as info:
        OpenAIAgentsAgent(Agent(name="desk"), context={"seat": None})
    assert "context_factory" in str(info.value)
    assert isinstance(info.value, ValueError)


def _imported_modules(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every module path a file imports, relative imports resolved against ``module``."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def test_car_itself_imports_no_old_path() -> None:
    """Adapters, tests, examples and benchmarks import moved modules from their new homes, and
    no module reads a step-meta helper from the recorder."""
    stale = []
    for folder in ("adapters", "integrations_tests", "tests", "examples", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue
            rel = path.relative_to(ROOT).with_suffix("").parts
            module = ".".join(("car_adapters", *rel[1:])) if folder == "adapters" else \
                ".".join(rel)
            is_package = path.name == "__init__.py"
            module = module.removesuffix(".__init__")
            tree = ast.parse(path.read_text(encoding="utf-8"))
            imported = _imported_modules(tree, module, is_package)
            stale += [f"{path.relative_to(ROOT)}: {m}" for m in imported
                      if m in MOVED_MODULES
                      or m in {f"car_adapters.langgraph.callback.{n}" for n in MOVED_FROM_CALLBACK}]
    assert stale == []
