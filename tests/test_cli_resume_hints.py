"""``car attribute`` offers "Resume with" only where a resume can end otherwise (an
interruption, a budget, a model server that was down, branches that failed), and a stop that a
resume would repeat leaves no empty ``running`` attribution behind."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from car_core.cli import kit
from car_core.errors import (
    AttributionBusy,
    BranchesFailed,
    CorruptRun,
    ModelUnavailable,
    OutcomeError,
)
from car_core.model.trajectory import Trajectory
from car_core.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
PIVOT = "car_core.synthetic:pivot"
ENV = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(ROOT)}

USER_CODE = '''
import sys
import car_core.testing.synthetic as syn

outcome = syn.pivot().outcome

def broken_outcome(run):
    raise ValueError("no score")

class InternalServerError(Exception):
    status_code = 503

CALLS = [0]

def judge_down(run, rng):
    CALLS[0] += 1
    if CALLS[0] > 10:  # down after the attribution began
        raise InternalServerError("judge unavailable")
    return outcome(run, rng)

def agent_exits():
    agent = syn.pivot().agent()
    def policy(history, rng):
        sys.exit(0)
    agent.policy = policy
    return agent
'''


def car(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=folder, env=ENV,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def folder(tmp_path: Path, pivot_run: Trajectory) -> Path:
    with RunStore(tmp_path / "car.db") as s:
        s.save(pivot_run)
    (tmp_path / "user_code.py").write_text(USER_CODE)
    return tmp_path


def attributions(folder: Path) -> list[tuple[str, str]]:
    with RunStore(folder / "car.db") as s:
        return [(a.id, str(a.status)) for a in s.attributions()]


@pytest.mark.parametrize(("agent", "outcome", "code", "said"), [
    (PIVOT, "user_code:broken_outcome", kit.USAGE, "the outcome function raised"),
    ("user_code:agent_exits", "user_code:outcome", kit.AGENT,
     "the agent's code called sys.exit(0)")])
def test_a_stop_a_resume_would_repeat_offers_no_resume_and_leaves_no_row(
        folder, pivot_run, agent, outcome, code, said):
    proc = car(folder, "attribute", pivot_run.id, "--agent", agent, "--outcome", outcome,
               "--rollouts", "4")
    assert proc.returncode == code, proc.stderr
    assert said in proc.stderr
    assert "Resume with" not in proc.stderr and "--resume" not in proc.stderr
    assert attributions(folder) == []  # no `running` row with nothing in it


def test_a_model_server_down_prints_one_resume_command(folder, pivot_run):
    """The error line of a stop the command offers its own "Resume with" for carries no resume
    command of its own (it said "`car attribute ... --resume ID`" above the real one)."""
    proc = car(folder, "attribute", pivot_run.id, "--agent", PIVOT, "--outcome",
               "user_code:judge_down", "--rollouts", "4")
    assert proc.returncode == kit.AGENT, proc.stderr
    [(aid, _)] = attributions(folder)
    assert "outcome's server failed" in proc.stderr and "Resume with:" in proc.stderr
    assert proc.stderr.count("--resume") == 1 and f"--resume {aid}" in proc.stderr, proc.stderr
    assert "attribution_id=" not in proc.stderr


def test_a_hand_edited_branch_offers_no_resume(folder, pivot_run):
    first = car(folder, "attribute", pivot_run.id, "--agent", PIVOT, "--rollouts", "16",
                "--budget", "12")
    assert first.returncode == kit.BUDGET, first.stderr  # a budget: resumable, and it says so
    assert "--resume" in first.stderr
    [(aid, _)] = attributions(folder)
    with sqlite3.connect(folder / "car.db") as conn:  # edit every stored branch by hand
        conn.execute("UPDATE steps SET action = '\"edited\"' WHERE run_id IN "
                     "(SELECT id FROM runs WHERE attribution_id = ?)", [aid])
    again = car(folder, "attribute", pivot_run.id, "--agent", PIVOT, "--budget", "24",
                "--resume", aid)
    assert again.returncode == kit.STORE, again.stderr
    assert "changed after saving" in again.stderr or "digest" in again.stderr, again.stderr
    assert "Resume with" not in again.stderr
    assert [a for a, _ in attributions(folder)] == [aid]  # its branches keep it


def test_an_attribution_busy_in_another_process_offers_no_resume(folder, pivot_run):
    with RunStore(folder / "car.db") as holder:  # this process runs it (a live lease)
        aid = holder.begin_attribution(pivot_run.id, "contrastive",
                                       {"seed": 0, "alpha": 0.05, "rollouts": 4})
        proc = car(folder, "attribute", pivot_run.id, "--agent", PIVOT, "--resume", aid)
        assert proc.returncode == kit.STORE, proc.stderr
        assert "is being run by process" in proc.stderr
        assert "Resume with" not in proc.stderr
        assert attributions(folder) == [(aid, "running")]  # the holder's row is left alone


def test_the_resumable_stops_are_a_small_table():
    """What may offer a resume, and what may not: by type, the table the command reads."""
    assert kit.resumable(KeyboardInterrupt()) and kit.resumable(MemoryError())
    assert kit.resumable(ModelUnavailable("down")) and kit.resumable(BranchesFailed("x"))
    for exc in (OutcomeError("bad"), CorruptRun("edited"), AttributionBusy("busy"),
                SystemExit(0), ValueError("bug")):
        assert not kit.resumable(exc), exc
