"""car_core stays framework-neutral: importing it loads no framework or model client, and no
source file in it imports one (dependencies point adapters → car_core only)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "car_core"
FORBIDDEN = ("langchain", "langchain_core", "langgraph", "llama_index", "openai", "ollama",
             "llama_cpp", "ray", "car_adapters",
             "agents")  # the OpenAI Agents SDK imports as `agents`
# The Ray executor is an optional backend inside car_core (DESIGN.md, "execution"): only its own
# module may import ray, and only ``make_executor("ray")`` imports that module, which the
# fresh-interpreter check below proves by finding ray unloaded after importing car_core.
OPTIONAL_BACKENDS = {"engine/ray_executor.py": {"ray"}}


def forbidden(module: str) -> bool:
    top = module.split(".")[0]
    return top in FORBIDDEN or top.startswith("langchain")


def test_importing_car_core_loads_no_framework() -> None:
    code = ("import json, sys, car_core, car_core.testing, car_core.testing.synthetic, "
            "car_core.store, "
            "car_core.engine.execution; "
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=CORE.parent)
    loaded = json.loads(out.stdout)
    assert "car_core" in loaded
    assert [m for m in loaded if forbidden(m)] == []


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_no_core_source_imports_a_framework() -> None:
    sources = sorted(CORE.rglob("*.py"))
    assert len(sources) > 10
    offenders = {}
    for p in sources:
        name = str(p.relative_to(CORE))
        allowed = OPTIONAL_BACKENDS.get(name, set())
        offenders[name] = [m for m in imported_modules(p)
                           if forbidden(m) and m.split(".")[0] not in allowed]
    assert {p: m for p, m in offenders.items() if m} == {}


def test_the_checker_sees_a_framework_import(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("import os\ndef f():\n    from langgraph.graph import StateGraph\n")
    assert [m for m in imported_modules(sample) if forbidden(m)] == ["langgraph.graph"]
