"""``car.triage`` and ``car triage`` when a run's attribution stops part-way: branches that
fail (``BranchesFailed``, as from a flaky model) and caps that tripped (wall time) before a
resume with larger ones.

The population is ``TwoModeDesk``'s (see ``test_triage.py``); the failures are planted by a
wrapper whose ``branch`` raises once it has run ``ok`` branches, so every later branch fails
and each attribution stops on the failed share after spending a few rollouts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import car_core as car
from car_core.store import RunStore
from car_core.testing.synthetic_population import TwoModeDesk

DESK = TwoModeDesk()
K = 16


@pytest.fixture(scope="module")
def population() -> list[car.Trajectory]:
    # fixed ids: each run's seed is drawn from its id, and fresh ones every session made the
    # outcome vary (one clean CI run drew an id whose first run stayed undecided at n·K)
    return DESK.population(3, 2, seed=0, ids="stops")


class FailsAfter:
    """``base`` whose branches raise once ``ok`` of them have run; every call is counted."""

    def __init__(self, base: Any, ok: int) -> None:
        self.base, self.ok, self.calls = base, ok, 0
        self.name = base.name

    def start(self, context: Any, noise: Any) -> car.Trajectory:
        return self.base.start(context, noise)

    def branch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        self.calls += 1
        if self.calls > self.ok:
            raise RuntimeError("upstream model 500: flaky")
        return self.base.branch(run, plan, noise)


def _branches(store: RunStore) -> int:
    return int(store.db.execute("SELECT count(*) FROM runs WHERE parent_id IS NOT NULL")
               .fetchone()[0])


def test_a_run_its_failed_branches_stopped_is_charged_what_it_spent(population, tmp_path):
    """A user trial's triage of four runs under a total of 30 rollouts stored 55 branches and
    said "0 rollouts spent now": a run whose attribution raised ``BranchesFailed`` part-way was
    charged nothing, so every next run got the whole total again. Each such run is charged
    the rollouts (tokens, cost) its attribution spent, the total stays a hard cap, and the
    triage's count is the sum of its rows'."""
    total = 30
    agent = FailsAfter(DESK.agent(), ok=12)
    with RunStore(tmp_path / "car.db") as store:
        res = car.triage(population, agent, outcome=DESK.outcome, rollouts=K,
                         budget=car.Budget(rollouts=total), store=store, runs_at_once=1)
        stored = _branches(store)
    stopped = [r for r in res.per_run if "branches failed" in (r.reason or "")
               or "they may leave out" in (r.reason or "")]
    assert stopped, [r.reason for r in res.per_run]
    assert all(r.rollouts_used > 0 and r.resumable for r in stopped)
    assert res.rollouts_used == sum(r.rollouts_used for r in res.per_run if not r.reused)
    assert stored <= res.rollouts_used <= total
    # every pass's count holds this call's, failed branches included: a trial's read "293
    # rollouts spent now, 205 by every pass" (the store keeps no failed branch)
    assert res.rollouts_now is not None and res.rollouts_now > stored
    assert res.rollouts_in_all == res.rollouts_now


def test_cli_says_how_to_resume_runs_failed_branches_stopped_and_exits_5(population,
                                                                         tmp_path):
    """Every run stopped by failing branches: each row said "resume the attribution", but the
    command printed no ``--resume`` line and exited 1 ("nothing attributable"). The agent under
    test failed (exit 5, as ``car attribute`` exits), and the triage's resume command is
    printed; it resumes the stopped attributions once the agent is fixed."""
    (tmp_path / "flaky_desk.py").write_text(textwrap.dedent('''
        from car_core.testing.synthetic_population import TwoModeDesk

        DESK = TwoModeDesk()
        outcome = DESK.outcome


        class Flaky:
            def __init__(self, broken):
                self.base, self.broken = DESK.agent(), broken
                self.name = self.base.name

            def start(self, context, noise):
                return self.base.start(context, noise)

            def branch(self, run, plan, noise):
                if self.broken:
                    raise RuntimeError("upstream model 500: flaky")
                return self.base.branch(run, plan, noise)


        def make():
            return Flaky(broken=True)


        def make_fixed():
            return Flaky(broken=False)
    '''))
    runs = population[:2]
    with RunStore(tmp_path / "car.db") as store:
        for r in runs:
            store.save(r)
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(Path(__file__).parents[1])}

    def car_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)

    ids = [r.id for r in runs]
    proc = car_cli("triage", *ids, "--agent", "flaky_desk:make", "--outcome",
                   "flaky_desk:outcome", "--rollouts", str(K), "--no-progress")
    assert proc.returncode == 5, (proc.stdout, proc.stderr)
    assert "could not be attributed" in proc.stdout
    # the cause in the summary line, which clips a reason: a trial's read "(first: the…)"
    assert "upstream model 500" in proc.stdout.splitlines()[0], proc.stdout
    assert "rollouts spent now" in proc.stdout and " 0 rollouts spent now" not in proc.stdout
    tid = proc.stdout.rsplit("triage ", 1)[1].split()[0]
    assert f"--resume {tid}" in proc.stderr, proc.stderr
    fixed = car_cli("triage", "--resume", tid, "--agent", "flaky_desk:make_fixed",
                    "--outcome", "flaky_desk:outcome", "--rollouts", str(K), "--no-progress")
    assert fixed.returncode == 0, (fixed.stdout, fixed.stderr)
    assert "2 of 2 failed run(s)" in fixed.stdout or "the only place" in fixed.stdout \
        or "places in all" in fixed.stdout


class Slow:
    """``base`` whose branches each take ``seconds``: a wall-time cap trips after a few."""

    def __init__(self, base: Any, seconds: float) -> None:
        self.base, self.seconds = base, seconds
        self.name = base.name

    def start(self, context: Any, noise: Any) -> car.Trajectory:
        return self.base.start(context, noise)

    def branch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        import time
        time.sleep(self.seconds)
        return self.base.branch(run, plan, noise)


@pytest.mark.parametrize("then", [None, 300.0])
def test_a_run_the_clock_cut_short_is_continued_by_a_resume_with_more_time(
        population, tmp_path, then):
    """A user trial's triage stopped on ``--max-seconds``; resumed with a larger one, it read
    the runs the clock had cut short back as finished ("(read back)"), still undecided, and
    exited 0: only a larger rollout cap continued an undecided attribution. A run stopped by
    a cap (here wall time) that is now larger, or gone, is continued; one resumed with a cap
    no larger is read back."""
    runs = population[:2]
    agent = Slow(DESK.agent(), 0.03)  # the same agent throughout: its branches are kept
    with RunStore(tmp_path / "car.db") as store:
        first = car.triage(runs, agent, outcome=DESK.outcome, rollouts=K,
                           budget=car.Budget(wall_time=0.1), store=store, triage_id="t-clock",
                           runs_at_once=1)
        agent.seconds = 0.0
        cut = first.per_run[0]
        assert cut.answer == "undecided" and "wall-time" in (cut.reason or ""), cut
        # a wall-time cap no larger than the one that stopped it: read back, as it was
        again = car.triage(runs, agent, outcome=DESK.outcome, rollouts=K,
                           per_run=car.Budget(wall_time=0.05), store=store,
                           triage_id="t-clock", runs_at_once=1)
        assert again.per_run[0].reused and again.per_run[0].answer == "undecided"
        more = car.triage(runs, agent, outcome=DESK.outcome, rollouts=K,
                          budget=None if then is None else car.Budget(wall_time=then),
                          store=store, triage_id="t-clock", runs_at_once=1)
    row = more.per_run[0]
    assert not row.reused and row.locus is not None, row
    assert not more.undecided


def test_a_spent_wall_time_total_says_its_unit():
    """The reason a run was skipped read "the triage's total wall-time budget of 10 is spent":
    ten what? Seconds, said."""
    import time

    from car_core.estimators._population import Purse
    purse = Purse(car.Budget(wall_time=0.01, rollouts=100))
    time.sleep(0.02)
    assert purse.cap(car.Budget(rollouts=10), 1, True)[1] == (
        "the triage's total wall-time budget of 0.01 s is spent")
    spent = Purse(car.Budget(rollouts=1), "population fix")
    assert spent.cap(car.Budget(rollouts=10), 1, True)[1] == (
        "the population fix's total rollouts budget of 1 is spent")
