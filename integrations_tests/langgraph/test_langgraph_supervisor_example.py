"""The supervisor example does what its docstring says, run as a user runs it: the script itself
(whose name is the ``langgraph_supervisor`` library's, first on ``sys.path``), then the ``car``
command on the run it stored, then the HTML report.

Planted truth (``car_adapters.demo.supervisor_app``, the example's default model): step 4 is
``account_agent``'s decision ``flag_account``, "close" with p = 0.5 while the injection that
``research_agent`` passed on is in view; step 5 is the mechanical ``close_account``. For a
failing run: rescue(4) = 1 - 0.5 = 0.5 and rescue(k) = 0 elsewhere, so the locus is 4; Shapley
over {4}, {5} and the other steps: phi_4 = phi_5 = 0.25, phi_rest = 0 (v(S) = 1 when 4 or 5 is
held, else 0.5); without the injection step 4 never closes: P(fail) = 0 exactly.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import car_core as car

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "langgraph_supervisor.py"
LABEL = "account_agent, step 4 (its 1st decision)"


def car_cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_example_script_cli_and_report_name_the_acting_worker(tmp_path: Path) -> None:
    folder = tmp_path / "car-supervisor"
    # Run as `python examples/langgraph_supervisor.py` from another folder: examples/ is first on
    # sys.path, where the script's name would shadow the library it imports.
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--dir", str(folder), "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["agents"] == ["supervisor", "research_agent", "research_agent", "supervisor",
                             "account_agent", "account_agent", "account_agent", "supervisor"]
    assert out["locus"] == 4 and out["locus_label"] == LABEL
    assert re.search(r"Step 4 \(account_agent called \w+\(.*, its 1st decision\) caused the "
                     r"failure: re-deciding it avoids the failure in \d+% of re-runs",
                     proc.stdout), proc.stdout
    lo, hi = out["rescue_ci"]  # contrastive's own 95% family-wise interval
    assert 0 < lo <= 0.5 <= hi
    # Shapley (budget 160, exact mode): only v({}) and v({rest}) are random (p = 0.5, variance
    # 0.25), weighed by 1/3 and 1/6 in phi_i; with >= 160/8 = 20 rollouts per coalition
    # se(phi) <= sqrt(0.25/20 * (1/9 + 1/36)) = 0.042, and we allow 4 of them.
    tol = 4 * math.sqrt(0.25 / 20 * (1 / 9 + 1 / 36))
    phi4, phi5, rest = out["shapley"]
    assert abs(phi4 - 0.25) <= tol and abs(phi5 - 0.25) <= tol and abs(rest) <= tol
    assert out["shapley_labels"][0] == LABEL
    assert out["rescued"] == 0.0  # the injection removed from what step 4 sees
    assert out["closed_on_branches"] == 0  # the ledger: close_account never ran on a branch

    run_id = out["run_id"]
    store = str(folder / "car.db")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160",
           "CAR_SUPERVISOR_DIR": str(folder)}
    spec = ["--agent", "examples.langgraph_supervisor:make",
            "--outcome", "examples.langgraph_supervisor:outcome"]
    attributed = car_cli("attribute", run_id, "--store", store, *spec, "--rollouts", "32",
                         "--json", cwd=ROOT, env=env)
    assert attributed.returncode == 0, attributed.stderr
    result = json.loads(attributed.stdout)
    assert result["locus"] == 4 and result["locus_label"] == LABEL
    lo, hi = result["steps"][4]["ci"]
    assert 0 < lo <= 0.5 <= hi
    text = car_cli("attribute", run_id, "--store", store, *spec, "--rollouts", "16",
                   cwd=ROOT, env=env)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("Step 4 (account_agent called "), text.stdout
    assert "its 1st decision) caused the failure" in text.stdout.splitlines()[0]

    report = tmp_path / "report.html"
    made = car_cli("report", run_id, "--store", store, "--out", str(report), cwd=ROOT, env=env)
    assert made.returncode == 0, made.stderr
    html = report.read_text()
    assert LABEL in html and "node model" in html
    assert "You manage accounts." in html  # the system prompt step 4 decided under
    with car.RunStore(folder / "car.db") as s:  # the CLI stored its attributions beside the run
        ids = [a.id for a in s.attributions(run_id)]
    assert result["attribution_id"] in ids


def test_the_example_refuses_to_stand_in_for_the_library() -> None:
    """Imported under the library's name (``car attribute --agent langgraph_supervisor:make``
    from ``examples/``), the example would replace the library in the whole process."""
    spec = importlib.util.spec_from_file_location("langgraph_supervisor", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with pytest.raises(ImportError, match="examples.langgraph_supervisor"):
        spec.loader.exec_module(module)


def test_the_cli_points_a_shadowing_agent_spec_at_the_dotted_name(tmp_path: Path) -> None:
    store = car.RunStore(tmp_path / "car.db")
    run = car.record(car.FunctionAgent(policy=lambda h, rng: "a", max_steps=1), context="c",
                     outcome=lambda r: 1.0, seed=0)
    store.save(run)
    store.close()
    proc = car_cli("attribute", run.id, "--store", str(tmp_path / "car.db"),
                   "--agent", "langgraph_supervisor:make",
                   "--outcome", "langgraph_supervisor:outcome",
                   cwd=EXAMPLE.parent, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode != 0
    assert "--agent examples.langgraph_supervisor:make" in proc.stderr
