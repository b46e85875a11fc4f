"""``car triage --resume``: a setting left out is the triage's own, as ``car attribute
--resume`` takes the attribution's, and the advice after runs that used up their re-runs
doubles the re-runs those runs actually had.

The population is ``TwoModeDesk``'s (see ``test_triage.py``). With ``--rollouts 1`` a run's
attribution has one rollout per step, too few for the betting test to decide anything at
FWER 0.05 (it needs several pairs), so every run ends undecided on its own cap: the case the
advice is for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import car_core as car
from car_core.store import RunStore
from car_core.store.triages import load_triage
from car_core.testing.synthetic_population import TwoModeDesk

DESK = TwoModeDesk()
AGENT = "car_core.testing.synthetic_population:TwoModeDesk"


@pytest.fixture(scope="module")
def population() -> list[car.Trajectory]:
    return DESK.population(1, 1, seed=0, ids="resume")


def car_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _advice(stderr: str) -> str:
    assert "used up their re-runs before a step was decided" in stderr, stderr
    return stderr.rsplit("\n  car ", 1)[1].split("\n")[0]


def test_a_resume_without_flags_keeps_the_triages_settings_and_advice(population, tmp_path):
    """A trial's `--resume` without `--rollouts` ran on the default 32 where the triage had
    64, stored 32, and advised `--rollouts 64`: what had already run."""
    with RunStore(tmp_path / "car.db") as store:
        for r in population:
            store.save(r)
    first = car_cli("triage", *(r.id for r in population), "--agent", AGENT, "--rollouts", "1",
                    "--alpha", "0.1", "--seed", "7", "--by", "step", "--json", cwd=tmp_path)
    assert first.returncode in (0, 1), first.stderr
    tid = json.loads(first.stdout)["triage_id"]
    again = car_cli("triage", "--resume", tid, "--agent", AGENT, cwd=tmp_path)
    assert again.returncode in (0, 1), again.stderr
    with RunStore(tmp_path / "car.db") as store:
        params = store.attribution(tid).params
    assert (params["rollouts"], params["alpha"], params["seed"], params["by"]) == (
        1, 0.1, 7, ["step"])
    assert "--rollouts 2" in _advice(again.stderr)
    # nothing was re-run: the runs' own caps are the same, so each is read back
    assert "0 rollouts spent now" in again.stdout, again.stdout


def test_the_advice_doubles_the_larger_of_the_triages_and_this_calls_rollouts(
        population, tmp_path):
    """A resume with a smaller `--rollouts` reads the runs back as they were: twice its K
    would point at what already ran."""
    with RunStore(tmp_path / "car.db") as store:
        for r in population:
            store.save(r)
    first = car_cli("triage", *(r.id for r in population), "--agent", AGENT, "--rollouts", "2",
                    "--json", cwd=tmp_path)
    tid = json.loads(first.stdout)["triage_id"]
    again = car_cli("triage", "--resume", tid, "--agent", AGENT, "--rollouts", "1",
                    cwd=tmp_path)
    assert again.returncode in (0, 1), again.stderr
    assert "--rollouts 4" in _advice(again.stderr)


def test_help_says_a_resume_takes_the_triages_settings(tmp_path):
    shown = car_cli("triage", "--help", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.replace("│", " ").split())
    assert "on --resume the triage's" in text, text


def _branches(store: RunStore) -> int:
    return int(store.db.execute("SELECT count(*) FROM runs WHERE parent_id IS NOT NULL")
               .fetchone()[0])


def test_a_resume_counts_only_the_branches_it_ran_as_spent_now(population, tmp_path):
    """A trial's resume said "1791 rollouts spent now" where about 900 were branches the
    first pass ran, read back from the store, and its page gave the last call's count as the
    triage's. K = 2 leaves both runs undecided; K = 8 resumes them from their branches."""
    runs = DESK.population(2, 2, seed=0, ids="spent")
    from car_core.cli.triage import spent_words
    from car_core.report.triage_page import triage_view
    with RunStore(tmp_path / "car.db") as store:
        first = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=2, store=store,
                           triage_id="t")
        paid = _branches(store)
        assert first.rollouts_now == first.rollouts_in_all == first.rollouts_used == paid
        second = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=8, store=store,
                            triage_id="t")
        assert second.rollouts_now == _branches(store) - paid > 0
        assert second.rollouts_in_all == _branches(store)
        # the rows still count what each estimate used, its read-back branches included
        assert second.rollouts_used > second.rollouts_now
        assert spent_words(second) == (f"{second.rollouts_now} rollouts spent now, "
                                       f"{second.rollouts_in_all} by every pass of this triage")
        assert triage_view(load_triage(store, "t"))["rollouts"] == _branches(store)
