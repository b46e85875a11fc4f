"""Several runs of a population at once (``runs_at_once``) in ``car.triage``,
``car.fix_population``, ``car triage`` and ``car fix --runs``, on the planted two-mode
population (``TwoModeDesk``; see ``tests/test_triage.py`` and ``tests/test_population_fix.py``
for the planted loci and rescues).

What is checked is exact, not statistical: every run draws from its own seed under the cap it
would get one run after another (``car_core.estimators._population``), so the results for
``runs_at_once`` 1 and 4 are equal to the last digit, with or without a binding total, and the
rollouts spent never pass the total. The one timed check is a ratio in one process: runs that
wait on a model server (``LATENCY`` per model call) finish sooner four at a time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import car_core as car
from car_core import defaults
from car_core.errors import InvalidInput
from car_core.estimators._population import Purse, runs_at_once_for
from car_core.fix_results import PopulationFix
from car_core.model.trajectory import History
from car_core.store import RunStore
from car_core.testing.synthetic_population import TwoModeDesk
from car_core.triage_results import TriageResult

DESK = TwoModeDesk()
K = 16
LATENCY = 0.02  # seconds per model call: a hosted model's round trip, scaled down
AGENT = "car_core.testing.synthetic_population:TwoModeDesk"


def car_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def population() -> list[car.Trajectory]:
    return DESK.population(5, 3, seed=0, ids="concurrency")


class _Counting:
    """The desk's policy, noting which threads called it (a run in flight per pool thread)."""

    def __init__(self, policy: Any, latency: float = 0.0) -> None:
        self.policy, self.latency = policy, latency
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, history: History, rng: np.random.Generator) -> Any:
        with self.lock:
            self.threads.add(threading.current_thread().name)
        if self.latency:
            time.sleep(self.latency)  # the model server's answer is on its way
        return self.policy(history, rng)

    def step_meta(self) -> dict[str, Any]:
        return dict(self.policy.step_meta())


@dataclass
class _HostedDesk(car.FunctionAgent):
    """The desk behind a model server: its branches wait, so CAR runs them concurrently."""

    prefers_concurrency = True


def _desk(latency: float = 0.0, hosted: bool = False) -> tuple[car.FunctionAgent, _Counting]:
    made = DESK.agent()
    policy = _Counting(made.policy, latency)
    cls = _HostedDesk if hosted else car.FunctionAgent
    return cls(policy=policy, environment=made.environment, is_final=made.is_final,
               max_steps=made.max_steps, name=made.name), policy


class _Progress(list[tuple[int, str, str]]):
    """``progress(done, total, row | run_id)`` calls: done, the run, the calling thread."""

    def __call__(self, done: int, total: int, row: Any) -> None:
        self.append((done, getattr(row, "run_id", row), threading.current_thread().name))


def _pool_threads(policy: _Counting) -> set[str]:
    return {t for t in policy.threads if t.startswith("car-run")}


def test_the_default_is_chosen_from_the_agent_and_a_bad_value_is_refused():
    assert runs_at_once_for(None, _desk()[0]) == 1  # in process: threads gain nothing
    assert runs_at_once_for(None, _desk(hosted=True)[0]) == defaults.RUNS_AT_ONCE
    assert runs_at_once_for(3, _desk()[0]) == 3
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(InvalidInput, match="runs_at_once"):
            car.triage([], DESK.agent(), outcome=DESK.outcome, runs_at_once=bad)


@pytest.mark.parametrize("budget", [None, car.Budget(rollouts=300), car.Budget(rollouts=150)])
def test_triage_four_at_once_equals_one_after_another(population, tmp_path, budget):
    got, seen, threads = {}, {}, {}
    for n in (1, 4):
        agent, policy = _desk(latency=0.002)  # a run lasts long enough for others to start
        rows = _Progress()
        with RunStore(tmp_path / f"{n}.db") as store:
            res = car.triage(population, agent, outcome=DESK.outcome, rollouts=K,
                             budget=budget, store=store, triage_id="t", runs_at_once=n,
                             progress=rows)
            # stored as it ran: the same triage again reads the finished attributions back
            again = car.triage(population, agent, outcome=DESK.outcome, rollouts=K,
                               budget=budget, store=store, triage_id="t", runs_at_once=n)
        located = {r.run_id for r in res.per_run if r.locus is not None}
        assert located and {r.run_id for r in again.per_run if r.reused} >= located
        assert budget is not None or again.rollouts_used == 0
        got[n], seen[n], threads[n] = res.to_dict(), rows, _pool_threads(policy)
    assert got[1] == got[4]
    assert [r.run_id for r in TriageResult.from_dict(got[4]).per_run] == \
        [r.id for r in population]  # the runs' order, whichever finished first
    for n in (1, 4):  # progress once per run, on the caller's thread
        assert [d for d, _, _ in seen[n]] == list(range(1, len(population) + 1))
        assert sorted(i for _, i, _ in seen[n]) == sorted(r.id for r in population)
        assert {t for _, _, t in seen[n]} == {threading.current_thread().name}
    assert not threads[1]
    own = 6 * K  # each run's own cap: n·K rollouts
    if budget is None or budget.rollouts >= 2 * own:  # the total pays for two runs at once
        assert len(threads[4]) >= 2  # several runs were in flight
    if budget is not None:  # never past the total, however many runs were in flight
        assert got[4]["rollouts_used"] <= budget.rollouts
    if budget is not None and budget.rollouts == 150:  # 150 pays for about three runs
        rows4 = TriageResult.from_dict(got[4]).per_run
        skipped = [r.run_id for r in rows4 if r.answer == "skipped"]
        assert got[4]["truncated"] and skipped
        assert set(skipped) <= set(got[4]["undecided"])
        assert skipped == [r.run_id for r in rows4[-len(skipped):]]  # the runs not reached


def test_hosted_runs_four_at_once_take_well_under_the_time_of_one_after_another(population):
    # Eight runs of similar length, each a sequence of rounds whose time is LATENCY per live
    # step: four at a time they need two waves of rounds instead of eight, an ideal ratio of
    # 2/8 = 0.25; 0.6 leaves room for the CPU work (one interpreter) and the last stragglers.
    runs = population
    took, got = {}, {}
    for n in (1, 4):
        agent, _ = _desk(LATENCY, hosted=True)
        started = time.monotonic()
        res = car.triage(runs, agent, outcome=DESK.outcome, rollouts=K, runs_at_once=n)
        took[n], got[n] = time.monotonic() - started, res
    assert [r.rollouts_used for r in got[1].per_run] == \
        [r.rollouts_used for r in got[4].per_run]
    assert got[1].to_dict() == got[4].to_dict()
    assert took[4] <= 0.6 * took[1], took


@pytest.fixture(scope="module")
def loci(population) -> car.TriageResult:
    return car.triage(population, DESK.agent(), outcome=DESK.outcome, rollouts=K)


@pytest.mark.parametrize("budget", [None, 2 * 8 * 3 + 5])
def test_fix_population_four_at_once_equals_one_after_another(population, loci, tmp_path,
                                                              budget):
    # two arms (with and without the fix) of 8 pairs per run: 16 rollouts a run, so a total
    # of 53 pays for three runs and the other five are untested
    got, threads = {}, {}
    for n in (1, 4):
        agent, policy = _desk(latency=0.002)  # a run lasts long enough for others to start
        done = _Progress()
        with RunStore(tmp_path / f"{n}.db") as store:
            res = car.fix_population(population, agent, outcome=DESK.outcome,
                                     candidates=[car.Fix.instruction(DESK.fix)], triage=loci,
                                     rollouts=8, budget=budget, store=store, fix_id="f",
                                     runs_at_once=n,
                                     progress=done)
        # a line per run tested, none for the runs the budget never reached
        tested = sum(1 for r in res.candidates[0].per_run if r.n)
        assert tested == (len(population) if budget is None else 3)
        assert [d for d, _, _ in done] == list(range(1, tested + 1))
        got[n], threads[n] = res.to_dict(), _pool_threads(policy)
    assert got[1] == got[4]
    assert len(threads[4]) >= 2 and not threads[1]
    (cand,) = PopulationFix.from_dict(got[4]).candidates
    assert [r.run_id for r in cand.per_run] == [r.id for r in population]
    if budget is not None:
        assert got[4]["rollouts_used"] <= budget and got[4]["truncated"]
        assert cand.runs_tested == 3 and len(cand.untested) == len(population) - 3
        assert all("cannot pay" in (r.reason or "") for r in cand.per_run if not r.n)


def test_purse_holds_the_caps_of_the_runs_in_flight():
    purse = Purse(car.Budget(rollouts=100, tokens=1000))
    own = car.Budget(rollouts=40)
    first, why = purse.cap(own, slots=4, alone=True)
    assert why is None and first.rollouts == 40 and first.tokens == 250  # tokens: a share
    held = purse.hold(first)
    second, _ = purse.cap(own, slots=3, alone=False)
    assert second.rollouts == 40 and second.tokens == 250  # ceil(750 / 3)
    purse.hold(second)
    # 20 rollouts left while two runs hold 80: the third waits for one of them
    assert purse.cap(own, slots=2, alone=False)[1] == "the runs in flight hold what is left"
    purse.settle(held, rollouts=30, tokens=100, cost=0.0)  # the first spent 30 of its 40
    assert purse.free_rollouts() == 30  # 100 - 30 spent - 40 held
    assert purse.cap(car.Budget(rollouts=25), slots=2, alone=False)[0].rollouts == 25
    assert purse.cap(own, slots=2, alone=False)[1] is not None  # 30 < 40: still waits
    # with none in flight a run gets what is left, as one after another
    alone, why = Purse(car.Budget(rollouts=30)).cap(own, slots=1, alone=True)
    assert why is None and alone.rollouts == 30
    spent = Purse(car.Budget(rollouts=30))
    spent.settle(spent.hold(alone), rollouts=30, tokens=0, cost=0.0)
    assert spent.cap(own, slots=1, alone=True)[1] == \
        "the triage's total rollouts budget of 30 is spent"


def test_cli_runs_at_once_is_parsed_and_refused_below_one(population, tmp_path):
    runs = population[:2]
    with RunStore(tmp_path / "car.db") as store:
        for r in runs:
            store.save(r)
    ids = [r.id for r in runs]
    ok = car_cli("triage", *ids, "--agent", AGENT, "--rollouts", str(K), "--runs-at-once", "2",
                 "--json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert sorted(i for g in json.loads(ok.stdout)["groups"]
                  for i in g["runs"]) == sorted(ids)
    for args in (["triage", *ids], ["fix", "--runs", *ids, "--instruction", DESK.fix]):
        bad = car_cli(*args, "--agent", AGENT, "--runs-at-once", "0", cwd=tmp_path)
        assert bad.returncode == 2 and "--runs-at-once" in bad.stderr
    fixed = car_cli("fix", "--runs", *ids, "--agent", AGENT, "--instruction", DESK.fix,
                    "--rollouts", "8", "--runs-at-once", "2", "--json", cwd=tmp_path)
    assert fixed.returncode in (0, 1), fixed.stderr
    one = car_cli("fix", ids[0], "--agent", AGENT, "--instruction", DESK.fix,
                  "--runs-at-once", "2", cwd=tmp_path)
    assert one.returncode != 0
    assert "--runs-at-once is for a population" in one.stderr
    quiet = car_cli("fix", ids[0], "--agent", AGENT, "--instruction", DESK.fix,
                    "--no-progress", cwd=tmp_path)
    assert quiet.returncode == 2 and "--no-progress is for a population" in quiet.stderr


class _InterruptAfter(_Counting):
    """The desk's policy that presses Ctrl-C (SIGINT to the main thread, which wakes it where
    it waits on the runs) once, after ``calls`` model calls, and counts the calls after it."""

    def __init__(self, policy: Any, calls: int) -> None:
        super().__init__(policy, latency=0.002)
        self.calls, self.made, self.after = calls, 0, 0

    def __call__(self, history: History, rng: np.random.Generator) -> Any:
        with self.lock:
            self.made += 1
            if self.made == self.calls:
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
            elif self.made > self.calls:
                self.after += 1
        return super().__call__(history, rng)


def test_ctrl_c_stops_the_runs_in_flight_and_a_resume_finishes_them(population, tmp_path):
    """Ctrl-C reaches the caller's thread only. The runs in flight on the pool's threads stop
    before their next rollout (they once ran to their end first: minutes on a hosted model),
    keep their branches and stay open; the same triage again finishes them with the answers
    an uninterrupted triage gives."""
    made = DESK.agent()
    policy = _InterruptAfter(made.policy, calls=40)  # a few branches into the first two runs
    agent = car.FunctionAgent(policy=policy, environment=made.environment,
                              is_final=made.is_final, max_steps=made.max_steps, name=made.name)
    with RunStore(tmp_path / "car.db") as store:
        with pytest.raises(KeyboardInterrupt):
            car.triage(population, agent, outcome=DESK.outcome, rollouts=K, store=store,
                       triage_id="t", runs_at_once=2)
        # each run in flight finishes at most the branch it is in (one step at a time here)
        assert policy.after <= 2 * made.max_steps
        stored = [a for a in store.attributions() if a.method == "contrastive"]
        assert len(stored) == 2 and all(a.status == "running" for a in stored)
        assert all(store.branches(a.id) for a in stored)  # the branches run are kept
        resumed = car.triage(population, DESK.agent(), outcome=DESK.outcome, rollouts=K,
                             store=store, triage_id="t", runs_at_once=2)
    whole = car.triage(population, DESK.agent(), outcome=DESK.outcome, rollouts=K)
    assert [(r.answer, r.locus) for r in resumed.per_run] == \
        [(r.answer, r.locus) for r in whole.per_run]


_PRESSES_CTRL_C = '''
import signal, threading
import car_core as car
from car_core.testing.synthetic_population import TwoModeDesk
DESK = TwoModeDesk()
CALLS = [0]

class Presses:
    """The desk's policy; on its 40th call it presses Ctrl-C (SIGINT to the main thread)."""
    def __init__(self, policy):
        self.policy, self.lock = policy, threading.Lock()
    def __call__(self, history, rng):
        with self.lock:
            CALLS[0] += 1
            if CALLS[0] == 40:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        return self.policy(history, rng)
    def step_meta(self):
        return dict(self.policy.step_meta())

def agent():
    made = DESK.agent()
    return car.FunctionAgent(policy=Presses(made.policy), environment=made.environment,
                             is_final=made.is_final, max_steps=made.max_steps, name=made.name)

def outcome(run):
    return DESK.outcome(run)
'''


def test_cli_triage_stopped_by_ctrl_c_says_how_to_resume(population, tmp_path):
    """``car triage`` stopped by Ctrl-C with runs in flight ends 130 with the command that
    resumes it (the triage id was known only inside the call before), and that command
    finishes the triage."""
    (tmp_path / "presses.py").write_text(_PRESSES_CTRL_C)
    with RunStore(tmp_path / "car.db") as store:
        for r in population[:4]:
            store.save(r)
    args = ["triage", "--agent", "presses:agent", "--outcome", "presses:outcome",
            "--rollouts", str(K), "--runs-at-once", "2"]
    stopped = car_cli(*args, cwd=tmp_path)
    assert stopped.returncode == 130, stopped.stderr
    assert "car: error: interrupted" in stopped.stderr
    hint = stopped.stderr.split("Resume with:", 1)[1].split()
    assert hint[:2] == ["car", "triage"] and hint[-2] == "--resume"
    (tmp_path / "again.py").write_text(_PRESSES_CTRL_C.replace("== 40", "== -1"))
    again = [a.replace("presses:", "again:") for a in hint[1:]]
    done = car_cli(*again, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["triage_id"] == hint[-1]


def test_ctrl_c_stops_a_population_fixs_runs_in_flight(population, loci, tmp_path):
    """The same for ``car.fix_population``: its runs in flight stop before their next rollout
    and the same fix again measures every run, as one that was never stopped."""
    made = DESK.agent()
    policy = _InterruptAfter(made.policy, calls=40)
    agent = car.FunctionAgent(policy=policy, environment=made.environment,
                              is_final=made.is_final, max_steps=made.max_steps, name=made.name)
    fixes = [car.Fix.instruction(DESK.fix)]
    with RunStore(tmp_path / "car.db") as store:
        with pytest.raises(KeyboardInterrupt):
            car.fix_population(population, agent, outcome=DESK.outcome, candidates=fixes,
                               triage=loci, rollouts=8, store=store, fix_id="f",
                               runs_at_once=2)
        assert policy.after <= 2 * made.max_steps
        resumed = car.fix_population(population, DESK.agent(), outcome=DESK.outcome,
                                     candidates=fixes, triage=loci, rollouts=8, store=store,
                                     fix_id="f", runs_at_once=2)
    whole = car.fix_population(population, DESK.agent(), outcome=DESK.outcome,
                               candidates=fixes, triage=loci, rollouts=8)
    assert resumed.candidates[0].rescue == whole.candidates[0].rescue
    assert resumed.candidates[0].rescued == whole.candidates[0].rescued
