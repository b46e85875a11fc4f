"""Sizes with bounds: a rollout count or budget past ``defaults.MAX_ROLLOUTS`` /
``defaults.MAX_BUDGET`` is refused before anything runs (a typed error naming the bound and
the flag that raises it), and a resume never silently shrinks a finished attribution."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from car_core import defaults
from car_core.errors import InvalidBudget
from car_core.model.budget import check_bound
from car_core.model.trajectory import Step, Trajectory
from car_core.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
PIVOT = "car_core.synthetic:pivot"
ENV = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)}

# An agent factory that leaves a mark when it is called: a refusal "before anything runs"
# must come before the user's code is even loaded.
MARKING = '''
from pathlib import Path
import car_core.testing.synthetic as syn

def make():
    Path("factory-called").write_text("yes")
    return syn.pivot()
'''


def car(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=folder, env=ENV,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def folder(tmp_path: Path, pivot_run: Trajectory) -> Path:
    with RunStore(tmp_path / "car.db") as s:
        s.save(pivot_run)
    (tmp_path / "marking.py").write_text(MARKING)
    return tmp_path


def test_the_bounds_are_generous_and_documented():
    assert defaults.MAX_ROLLOUTS == 100_000 and defaults.MAX_BUDGET == 10_000_000
    check_bound(defaults.MAX_ROLLOUTS, defaults.MAX_ROLLOUTS, "--rollouts", "--max-rollouts")
    with pytest.raises(InvalidBudget, match="above the bound of 100,000") as err:
        check_bound(defaults.MAX_ROLLOUTS + 1, defaults.MAX_ROLLOUTS, "--rollouts",
                    "--max-rollouts")
    assert "--max-rollouts 100001" in str(err.value)


@pytest.mark.parametrize(("args", "bound", "flag"), [
    (["intervene", "RUN", "--do", "resample:1", "--rollouts", str(2**63)], "100,000",
     "--max-rollouts"),
    (["attribute", "RUN", "--rollouts", str(10**6)], "100,000", "--max-rollouts"),
    # 60,000 per arm is within its bound, but over 200 steps that is 12,000,000 in all
    (["attribute", "LONG", "--rollouts", "60000"], "10,000,000", "--max-budget"),
    (["attribute", "RUN", "--method", "shapley", "--budget", str(2**70)], "10,000,000",
     "--max-budget"),
])
def test_a_size_past_its_bound_is_refused_before_anything_runs(folder, pivot_run, args, bound,
                                                                 flag):
    long_run = Trajectory.new(context="ctx", steps=[Step(i, i, None, False)
                                                    for i in range(200)])
    with RunStore(folder / "car.db") as s:
        s.save(long_run)
    args = [{"RUN": pivot_run.id, "LONG": long_run.id}.get(a, a) for a in args]
    proc = car(folder, *args, "--agent", "marking:make")
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("car: error: ") and "\n" not in line, proc.stderr
    assert f"above the bound of {bound}" in line and flag in line
    assert not (folder / "factory-called").exists()  # refused before the agent was built
    with RunStore(folder / "car.db") as s:
        assert s.attributions() == [] and len(s.runs(branches=True)) == 2


def test_a_bound_raised_knowingly_lets_the_size_run(folder, pivot_run):
    base = ["intervene", pivot_run.id, "--agent", PIVOT, "--do", "resample:1", "--json"]
    refused = car(folder, *base, "--rollouts", "5", "--max-rollouts", "4")
    assert refused.returncode == 2 and "--max-rollouts 5" in refused.stderr
    ran = car(folder, *base, "--rollouts", "5", "--max-rollouts", "5")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["n"] == 5
    # a huge count under a small cap is no slip: the cap is what runs
    capped = car(folder, *base, "--rollouts", str(10**9), "--budget", "3")
    assert capped.returncode == 3, capped.stderr
    assert json.loads(capped.stdout)["n"] == 3


def test_a_resume_that_would_shrink_a_finished_result_is_refused_unless_replace(folder,
                                                                              pivot_run):
    first = car(folder, "attribute", pivot_run.id, "--agent", PIVOT, "--rollouts", "16",
                "--json")
    assert first.returncode == 0, first.stderr
    done = json.loads(first.stdout)
    aid, used = done["attribution_id"], done["rollouts_used"]
    smaller = car(folder, "attribute", pivot_run.id, "--agent", PIVOT, "--rollouts", "4",
                  "--resume", aid)
    assert smaller.returncode == 2, smaller.stderr
    assert f"already has a complete result from {used} rollouts" in smaller.stderr
    assert "--replace" in smaller.stderr
    with RunStore(folder / "car.db") as s:  # the earlier result is kept
        kept = s.attribution(aid)
        assert kept.result is not None and kept.result.rollouts_used == used
    again = car(folder, "attribute", pivot_run.id, "--agent", PIVOT, "--resume", aid, "--json")
    assert again.returncode == 0, again.stderr  # its own settings: the same result
    assert json.loads(again.stdout)["rollouts_used"] == used
    replaced = car(folder, "attribute", pivot_run.id, "--agent", PIVOT, "--rollouts", "4",
                   "--resume", aid, "--replace", "--json")
    assert replaced.returncode != 2, replaced.stderr  # it ran
    assert json.loads(replaced.stdout)["rollouts_used"] <= 4 * len(pivot_run.steps)


def test_replace_without_resume_is_refused_before_anything_runs(folder, pivot_run):
    """``--replace`` lets a resume replace a finished result; alone it replaces nothing, and
    accepting it silently let a user believe an earlier result was being started over."""
    proc = car(folder, "attribute", pivot_run.id, "--agent", "marking:make", "--replace")
    assert proc.returncode == 2, proc.stderr
    assert "--replace" in proc.stderr and "--resume" in proc.stderr
    assert not (folder / "factory-called").exists()
    with RunStore(folder / "car.db") as s:
        assert s.attributions() == []


@pytest.mark.parametrize("extra", [[], ["--rollouts", "8"], ["--budget", "50"],
                                   ["--method", "shapley"]])
def test_a_run_with_no_steps_is_named_as_such_before_any_budget(folder, extra):
    """A run stopped before its first step (an input guardrail) has n = 0, so n·K is 0: the
    command says the run has no steps, as ``car.contrastive`` does, never that a budget the
    user did not give (``rollouts=0``) cannot pay, and before the agent is even loaded."""
    empty = Trajectory.new(context="stopped by an input guardrail", steps=[])
    with RunStore(folder / "car.db") as s:
        s.save(empty)
    ran = car(folder, "attribute", empty.id, "--agent", "marking:make", *extra)
    assert ran.returncode == 1, ran.stderr
    assert "the run has no steps, so no step can be blamed" in ran.stderr
    assert "cannot pay" not in ran.stderr
    assert not (folder / "factory-called").exists()
