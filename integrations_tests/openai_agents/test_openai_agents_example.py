"""The OpenAI Agents SDK triage example does what its docstring says, from Python and from the
``car`` command line, on its default fake models."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import car_core as car

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "openai_agents_triage.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("openai_agents_triage", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_example_names_the_refunds_decision_from_python_and_the_cli(tmp_path: Any) -> None:
    ex = load_example()
    store = tmp_path / "runs.db"
    out = ex.main(["--rollouts", "32", "--store", str(store)])
    run = out["run"]
    assert ex.outcome(run) and [s.meta["agent"] for s in run.steps] == [
        "triage", "triage", "refunds", "refunds"]
    assert out["locus"] == 2                    # the refunds decision, not the lookup
    # Analytic arms: resampling step 2 over-refunds with P_FOLLOW = 0.5, and with the note
    # gone with P_UNPROMPTED = 0.05. With n = 32 the standard errors are sqrt(0.25/32) = 0.088
    # and sqrt(0.0475/32) = 0.039; the tolerance is 4 of them.
    n = 32
    assert abs(out["factual"] - ex.P_FOLLOW) <= 4 * math.sqrt(0.25 / n)
    assert abs(out["rescued"] - ex.P_UNPROMPTED) <= 4 * math.sqrt(0.05 * 0.95 / n)
    assert car.RunStore(store).load(run.id).to_dict() == run.to_dict()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    proc = subprocess.run(
        [sys.executable, "-m", "car_core.cli", "attribute", run.id, "--store", str(store),
         "--agent", "examples.openai_agents_triage:make_agent",
         "--outcome", "examples.openai_agents_triage:outcome", "--rollouts", "32", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["locus"] == 2
    with car.RunStore(store) as s:
        assert [a.id for a in s.attributions(run.id)] == [result["attribution_id"]]


def test_edit_removes_only_the_injection() -> None:
    ex = load_example()
    msgs = [{"role": "user", "content": ex.REQUEST},
            {"role": "tool", "tool_call_id": "c", "name": "lookup_order", "content": ex.ORDER}]
    edited = ex.remove_injection(msgs)
    assert edited[0] == msgs[0]
    assert ex.INJECTION not in edited[1]["content"] and "40 EUR" in edited[1]["content"]
