"""The public API is exactly ``car_core.__all__``: a name that disappears or appears undocumented
fails here, so a change to it is always deliberate. Every other public-looking name in the
package namespace is listed below as intentionally not exported."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import car_core

ROOT = Path(__file__).resolve().parents[1]

PUBLIC = [
    "Action", "Agent", "Budget", "ContrastiveSettings", "FunctionAgent", "History", "Interval",
    "Intervention", "Lineage", "Observation", "Outcome", "RunStore", "ShapleySettings", "Step",
    "Trajectory", "action_match_rate",
    "assert_locus", "assert_no_locus", "assert_rescues",
    "contrastive", "do_action", "do_context", "do_observation", "do_policy", "do_resample",
    "intervene", "record", "shapley",
]


# Names in car_core's namespace that are deliberately not in __all__.
NOT_EXPORTED = {
    "annotations",  # the `from __future__ import annotations` feature flag
    "JSON",  # the alias Action and Observation are exported as; typing only
}


def test_every_public_name_is_exported_or_listed_as_not() -> None:
    # pytest's assertion rewriting (it rewrites every module of a distribution that registers a
    # pytest plugin, as this one does) adds helpers named "@py_…", which no import can reach
    names = {n for n in vars(car_core) if not n.startswith("_") and n.isidentifier()}
    # Submodules become attributes once imported; they are reached by their dotted name.
    submodules = {n for n in names if isinstance(getattr(car_core, n), types.ModuleType)
                  and getattr(car_core, n).__name__ == f"car_core.{n}"}
    unlisted = names - submodules - set(car_core.__all__) - NOT_EXPORTED
    assert unlisted == set(), f"export these in __all__ or list them in NOT_EXPORTED: {unlisted}"
    assert NOT_EXPORTED <= names  # a stale entry fails too


def imports_of(path: Path) -> set[str]:
    """Every car_core module a source file imports, as the dotted name it imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("car_core")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.startswith("car_core"):
            found.add(node.module)
    return found


# The framework and model adapters reach the core only through its public API and the adapter
# contract. (The demo app is a program built on CAR, not an adapter: it also uses the report.)
ADAPTER_MAY_IMPORT = {"car_core", "car_core.contract", "car_core.errors", "car_core.testing"}


# The pytest plugin is a tool built on CAR too: it writes the report, collects what car.record
# records and names who decided a step as the assertions do.
PLUGIN_MAY_IMPORT = ADAPTER_MAY_IMPORT | {"car_core.report", "car_core.replay",
                                          "car_core.assertions"}


def test_adapters_import_the_core_only_through_the_contract() -> None:
    sources = [p for p in sorted((ROOT / "adapters").rglob("*.py"))
               if "demo" not in p.relative_to(ROOT).parts]
    assert len(sources) > 8
    seen = {str(p.relative_to(ROOT)): imports_of(p) - (
        PLUGIN_MAY_IMPORT if "pytest_plugin" in p.parts else ADAPTER_MAY_IMPORT)
        for p in sources}
    assert {p: m for p, m in seen.items() if m} == {}


def test_all_is_pinned() -> None:
    assert sorted(car_core.__all__) == sorted(PUBLIC)
    assert len(car_core.__all__) == len(set(car_core.__all__))


def test_every_public_name_resolves() -> None:
    for name in PUBLIC:
        assert getattr(car_core, name) is not None, name


def test_callables_and_types_are_what_design_md_says() -> None:
    for name in ("action_match_rate", "assert_locus", "assert_no_locus", "assert_rescues",
                 "contrastive", "do_action", "do_context",
                 "do_observation", "do_policy", "do_resample", "intervene", "record", "shapley"):
        assert callable(getattr(car_core, name)), name
    for name in ("Budget", "FunctionAgent", "History", "Interval", "Lineage", "Outcome",
                 "RunStore", "Step", "Trajectory"):
        assert isinstance(getattr(car_core, name), type), name


def test_function_agent_satisfies_the_agent_protocol() -> None:
    agent = car_core.FunctionAgent(policy=lambda h, rng: None)
    assert isinstance(agent, car_core.Agent)


def test_version_is_set() -> None:
    assert car_core.__version__.count(".") == 2
