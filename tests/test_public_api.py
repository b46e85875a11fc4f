"""The public API is exactly ``car_core.__all__``: a name that disappears or appears undocumented
fails here, so a change to it is always deliberate. Every other public-looking name in the
package namespace is listed below as intentionally not exported. In ``car_adapters`` every
``__all__`` resolves, each framework subpackage exports what DESIGN.md documents, and importing
the package itself loads no framework."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import types
from pathlib import Path

import car_core
from car_core import _moved

ROOT = Path(__file__).resolve().parents[1]

PUBLIC = [
    "Action", "Agent", "Budget", "ContrastiveSettings", "FunctionAgent", "History", "Interval",
    "Intervention", "Lineage", "Observation", "Outcome", "RunStore", "ShapleySettings", "Step",
    "Trajectory", "action_match_rate",
    "assert_locus", "assert_no_locus", "assert_rescues",
    "ContextAttribution", "context_attribution", "context_sources",
    "Candidate", "RepairRanking", "repairs", "remove_sources", "add_instruction",
    "guard_observation", "export_pairs",
    "Sequential", "AsyncioExecutor", "RayExecutor",
    "contrastive", "do_action", "do_context", "do_observation", "do_policy", "do_resample",
    "intervene", "record", "shapley", "triage", "Fix", "fix_population",
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
    # Submodules become attributes once imported; they are reached by their dotted name (a
    # flat path of 0.8 imported through its alias is the module at its new home).
    homes = {n: f"car_core.{_moved.MOVED.get(n, n)}" for n in names}
    submodules = {n for n in names if isinstance(getattr(car_core, n), types.ModuleType)
                  and getattr(car_core, n).__name__ == homes[n]}
    unlisted = names - submodules - set(car_core.__all__) - NOT_EXPORTED
    assert unlisted == set(), f"export these in __all__ or list them in NOT_EXPORTED: {unlisted}"
    assert NOT_EXPORTED <= names  # a stale entry fails too


CORE_MODULES = {".".join(("car_core", *p.relative_to(ROOT / "car_core").with_suffix("").parts))
                .removesuffix(".__init__") for p in (ROOT / "car_core").rglob("*.py")}


def imports_of(path: Path) -> set[str]:
    """Every car_core module a source file imports, as the dotted name it imports; a name taken
    from a package that is itself a module (``from car_core import formatting``) counts as that
    module, so a submodule cannot slip in through its package."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("car_core")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.startswith("car_core"):
            subs = {f"{node.module}.{a.name}" for a in node.names} & CORE_MODULES
            found |= subs
            if len(subs) < len(node.names):
                found.add(node.module)
    return found


# The framework and model adapters reach the core only through its public API and the adapter
# contract. (The demo app is a program built on CAR, not an adapter: it also uses the report.)
ADAPTER_MAY_IMPORT = {"car_core", "car_core.contract", "car_core.errors", "car_core.testing"}


# The pytest plugin is a tool built on CAR too: it writes the report, collects what car.record
# records, names who decided a step as the assertions do and groups the failing tests'
# attributions as car.triage groups its own.
PLUGIN_MAY_IMPORT = ADAPTER_MAY_IMPORT | {"car_core.report", "car_core.engine.replay",
                                          "car_core.assertions", "car_core.formatting",
                                          "car_core.estimators.triage"}


def test_adapters_import_the_core_only_through_the_contract() -> None:
    sources = [p for p in sorted((ROOT / "adapters").rglob("*.py"))
               if "demo" not in p.relative_to(ROOT).parts]
    assert len(sources) > 8
    seen = {str(p.relative_to(ROOT)): imports_of(p) - (
        PLUGIN_MAY_IMPORT if "pytest_plugin" in p.parts else ADAPTER_MAY_IMPORT)
        for p in sources}
    assert {p: m for p, m in seen.items() if m} == {}


def test_adapters_reach_no_core_module_through_an_attribute() -> None:
    """``car.interventions.compile_plan`` reaches a module the import check never sees."""
    modules = {m.removeprefix("car_core.").split(".")[0] for m in CORE_MODULES} - {"car_core"}
    reached = {}
    for p in sorted((ROOT / "adapters").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in {"car", "car_core"} and node.attr in modules \
                    and node.attr not in {"errors", "contract", "testing"}:
                reached.setdefault(str(p.relative_to(ROOT)), set()).add(node.attr)
    assert reached == {}


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
    for name in ("AsyncioExecutor", "Budget", "FunctionAgent", "History", "Interval", "Lineage",
                 "Outcome", "RayExecutor", "RunStore", "Sequential", "Step", "Trajectory"):
        assert isinstance(getattr(car_core, name), type), name


def test_function_agent_satisfies_the_agent_protocol() -> None:
    agent = car_core.FunctionAgent(policy=lambda h, rng: None)
    assert isinstance(agent, car_core.Agent)


def test_version_is_set() -> None:
    assert car_core.__version__.count(".") == 2


def test_the_adapter_contract_exports_what_it_imports() -> None:
    """``car_core.contract`` is the adapters' front door: every name it lists resolves, and
    every name it brings in for them is listed (typing helpers and submodules aside)."""
    from car_core import contract
    assert len(contract.__all__) == len(set(contract.__all__))
    assert [n for n in contract.__all__ if not hasattr(contract, n)] == []
    typing_names = {"annotations", "Any", "Protocol", "runtime_checkable"}
    brought = {n for n, v in vars(contract).items() if not n.startswith("_")
               and not isinstance(v, types.ModuleType) and getattr(v, "__module__", "")
               != "car_core.contract"} - typing_names
    assert brought - set(contract.__all__) == set()


# --- car_adapters --------------------------------------------------------------------------

ADAPTERS = ROOT / "adapters"  # imported as car_adapters
# What DESIGN.md documents each adapter module as exporting (each may export more).
DOCUMENTED = {
    "car_adapters.langgraph": {"CarCallback", "LangGraphAgent"},
    "car_adapters.llamaindex": {"CarRecorder", "LlamaIndexAgent"},
    "car_adapters.openai_agents": {"CarRecorder", "OpenAIAgentsAgent"},
    "car_adapters.openai": {"OpenAIPolicy"},
    "car_adapters.ollama": {"OllamaPolicy"},
}
FRAMEWORKS = ("langchain", "langchain_core", "langgraph", "llama_index", "agents", "openai",
              "ollama", "llama_cpp")


def adapter_modules() -> dict[str, list[str] | None]:
    """``car_adapters`` module -> its ``__all__`` as the source spells it (None without one)."""
    out: dict[str, list[str] | None] = {}
    for path in sorted(ADAPTERS.rglob("*.py")):
        parts = ["car_adapters", *path.relative_to(ADAPTERS).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names = None
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                names = list(ast.literal_eval(node.value))
        out[".".join(parts)] = names
    return out


def run_python(code: str) -> object:
    """What ``code`` prints as JSON, run in a fresh interpreter (this one stays framework-free)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout)


def test_every_car_adapters_all_resolves() -> None:
    exported = {m: names for m, names in adapter_modules().items() if names is not None}
    assert DOCUMENTED.keys() <= exported.keys()
    assert {m: names for m, names in exported.items() if len(names) != len(set(names))} == {}
    missing = run_python(
        "import importlib, json\n"
        f"exported = {exported!r}\n"
        "out = {}\n"
        "for m, names in exported.items():\n"
        "    mod = importlib.import_module(m)\n"
        "    out[m] = [n for n in names if not hasattr(mod, n)]\n"
        "print(json.dumps(out))")
    assert isinstance(missing, dict)
    assert {m: names for m, names in missing.items() if names} == {}


def test_each_subpackage_that_re_exports_declares_all() -> None:
    """A subpackage ``__init__`` that imports names from its modules says which are public."""
    modules = adapter_modules()
    packages = [p for p in sorted(ADAPTERS.rglob("__init__.py")) if p.parent != ADAPTERS]
    assert len(packages) >= 6
    undeclared = []
    for path in packages:
        name = "car_adapters." + ".".join(path.parent.relative_to(ADAPTERS).parts)
        re_exports = any(isinstance(node, ast.ImportFrom) and node.level
                         for node in ast.parse(path.read_text(encoding="utf-8")).body)
        if re_exports and modules[name] is None:
            undeclared.append(name)
    assert undeclared == []


def test_documented_adapter_names_are_exported() -> None:
    modules = adapter_modules()
    assert {m: sorted(names - set(modules[m] or ())) for m, names in DOCUMENTED.items()
            if names - set(modules[m] or ())} == {}


def test_importing_car_adapters_loads_no_framework() -> None:
    """The package (so its ``__init__`` imports no framework, nor a framework subpackage) and
    its framework-free parts (shared glue, model policies) load no framework: each framework
    subpackage brings its own when imported."""
    loaded = run_python("import json, sys, car_adapters, car_adapters.common, "
                        "car_adapters.models; print(json.dumps(sorted(sys.modules)))")
    assert isinstance(loaded, list) and "car_adapters.common" in loaded
    assert [m for m in loaded if m.split(".")[0] in FRAMEWORKS] == []
