"""``car.triage`` and ``car triage`` against a planted population: failed runs from two failure
modes (``TwoModeDesk``: the early mode commits at step 1, a ``read_policy`` call by the
``intake`` agent; the late one at step 4, an ``issue_refund`` call by ``refunds``) in known
proportions.

Tolerances. The planted shares are exact (14 of 24 runs are early), so the check is the
interval's own: each share's Wilson interval at level 1 − α/G covers the share of the runs
triaged, which equals the planted one when every run is traced to its mode. Each run's locus
is itself a test at FWER α = 0.05 with rescue 1 − p_bad = 0.7 on a deterministic outcome, so
with ``K = 16`` per step (96 rollouts for 6 steps) the betting test confirms in a few pairs;
the membership of each group is asserted exactly, which a wrong locus would break.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _estimator_helpers import Preflighted

import car_core as car
from car_core.errors import InvalidInput, RunNotFound
from car_core.estimators import triage as car_triage
from car_core.estimators.contrastive import rollout_budget
from car_core.store import RunStore
from car_core.store.triages import (
    POPULATION,
    load_triage,
    select_runs,
    triage_attribution_id,
)
from car_core.testing import synthetic as syn
from car_core.testing.synthetic_population import TwoModeDesk
from car_core.triage_results import CSV_COLUMNS, TriageResult

DESK = TwoModeDesk()
N_EARLY, N_LATE = 14, 10
K = 16
AGENT = "car_core.testing.synthetic_population:TwoModeDesk"
GROUP_KEYS = {"label", "step", "agent", "node", "tool", "share", "share_ci", "runs"}


@pytest.fixture(scope="module")
def population() -> list[car.Trajectory]:
    return DESK.population(N_EARLY, N_LATE, seed=0, ids="triage")


def _branches(store: RunStore) -> int:
    return int(store.db.execute("SELECT count(*) FROM runs WHERE parent_id IS NOT NULL")
               .fetchone()[0])


def _accounted(res: TriageResult) -> list[str]:
    return [i for g in res.groups for i in g.runs] + list(res.undecided) + list(res.no_cause)


def test_recovers_each_planted_mode_with_its_share_step_agent_and_tool(population, tmp_path):
    with RunStore(tmp_path / "car.db") as store:
        res = car.triage(population, DESK.agent(), outcome=DESK.outcome, rollouts=K,
                         store=store, triage_id="t-planted")
    early = {r.id for r in population if r.context["mode"] == "early"}
    late = {r.id for r in population if r.context["mode"] == "late"}
    assert len(res.groups) == 2 and not res.undecided and not res.no_cause
    by_step = {g.step: g for g in res.groups}
    for mode, ids, planted in (("early", early, N_EARLY), ("late", late, N_LATE)):
        g = by_step[DESK.step_of(mode)]
        assert set(g.runs) == ids
        assert (g.agent, g.node, g.tool) == (DESK.agent_of(mode), DESK.agent_of(mode),
                                             DESK.tool_of(mode))
        share = planted / (N_EARLY + N_LATE)
        assert g.share == pytest.approx(share)
        assert g.share_ci[0] <= share <= g.share_ci[1]
        assert g.share_ci[0] > 0.1  # an interval of width ~1 would cover anything
    # G = 2 categories (no undecided, no no-cause): each interval at 1 − 0.05/2
    assert res.level == pytest.approx(1 - 0.05 / 2)
    assert sorted(_accounted(res)) == sorted(r.id for r in population)


def test_every_run_is_accounted_for_and_runs_without_a_locus_say_why(population):
    runs = population[:3] + population[-3:]
    # two rollouts can neither confirm a locus nor rule a cause out: each run is undecided,
    # because the budget ran out or because its one gate pair, level, is too few to say "no
    # cause" (once it said so); either way it says why
    res = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K,
                     per_run=car.Budget(rollouts=2))
    assert res.groups == () and res.no_cause == ()
    assert sorted(_accounted(res)) == sorted(r.id for r in runs)
    for row in res.per_run:
        assert row.answer == "undecided" and row.run_id in res.undecided
        assert row.rollouts_used <= 2
        assert "budget" in (row.reason or "") or "too few re-runs to rule out" in (
            row.reason or ""), row.reason


def test_total_budget_stops_before_spending_and_resume_reads_finished_runs_back(
        population, tmp_path):
    runs = population[:4] + population[-4:]
    with RunStore(tmp_path / "car.db") as store:
        first = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K,
                           budget=car.Budget(rollouts=150), store=store, triage_id="t-resume")
        assert first.truncated and first.rollouts_used <= 150
        skipped = [r.run_id for r in first.per_run if r.answer == "skipped"]
        assert skipped and set(skipped) <= set(first.undecided)
        assert store.attribution("t-resume").status == "truncated"
        before = _branches(store)
        done = {r.run_id: len(store.branches(r.attribution_id)) for r in first.per_run
                if r.locus is not None}
        assert done and all(done.values())
        second = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K,
                            store=store, triage_id="t-resume")
        assert not second.truncated and not second.undecided
        assert {r.run_id for r in second.per_run if r.reused} >= done.keys()
        # the runs that finished drew no branch; the others drew at most what they used (a
        # resumed attribution also counts the branches it read back from its journal)
        assert done == {r.run_id: len(store.branches(r.attribution_id))
                        for r in second.per_run if r.run_id in done}
        assert 0 < _branches(store) - before <= second.rollouts_used
        # a third time: everything is read back, no branch is drawn
        again = _branches(store)
        third = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K,
                           store=store, triage_id="t-resume")
        assert _branches(store) == again and third.rollouts_used == 0
        assert all(r.reused for r in third.per_run)
        assert third.to_dict()["groups"] == second.to_dict()["groups"]
        ids = {r.attribution_id for r in third.per_run}
        assert ids == {triage_attribution_id("t-resume", r.id) for r in runs}


def test_the_triage_is_stored_as_an_attribution_and_exports(population, tmp_path):
    runs = population[:2] + population[-2:]
    with RunStore(tmp_path / "car.db") as store:
        res = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K, store=store)
        row = store.attribution(res.triage_id)
        assert (row.method, row.run_id, row.status) == ("triage", POPULATION, "complete")
        assert load_triage(store, res.triage_id).to_dict() == res.to_dict()
        assert res.triage_id in store.attribution_ids()
    rows = list(csv.reader(io.StringIO(res.to_csv())))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == 1 + len(res.groups)


def test_label_hook_and_grouping_by_agent(population):
    runs = population[:3] + population[-2:]
    res = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K,
                     label=lambda run, result: f"mode {run.context['mode']}")
    assert {g.label: len(g.runs) for g in res.groups} == {"mode early": 3, "mode late": 2}
    res = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K, by=("agent",))
    assert {g.label: g.agent for g in res.groups} == {"agent intake": "intake",
                                                      "agent refunds": "refunds"}


def test_a_label_that_cannot_work_is_said_before_or_without_losing_the_triage(population,
                                                                              tmp_path):
    """A trial's label took one argument: it was called once every run was attributed and
    ended in "internal error ... report it", the triage left interrupted with no way on. A
    label that cannot take ``(run, result)`` is refused before any branch; one that raises
    says so, and the same triage id reads every attribution back, nothing re-run."""
    from car_core.errors import InvalidInput
    runs = population[:3]
    with RunStore(tmp_path / "car.db") as store:
        with pytest.raises(InvalidInput, match="does not take \\(run, result\\)"):
            car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K, store=store,
                       label=lambda run: "one argument")
        assert _branches(store) == 0

        def broken(run: car.Trajectory, result: object) -> str:
            raise KeyError("team")

        with pytest.raises(InvalidInput, match="the label function raised KeyError") as said:
            car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K, store=store,
                       label=broken, triage_id="t-label")
        assert "run the same triage again" in (said.value.hint or "")
        kept = _branches(store)
        again = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K, store=store,
                           label=lambda run, result: "fixed", triage_id="t-label")
        assert [g.label for g in again.groups] == ["fixed"] and _branches(store) == kept


def test_select_runs_filters_by_agent_outcome_and_ids(population, tmp_path):
    other = syn.pivot().failing_run(0)
    passed = next(r for r in (car.record(DESK.agent(), context={"mode": "late"},
                                         outcome=DESK.outcome, seed=s) for s in range(50))
                  if not r.failed)
    with RunStore(tmp_path / "car.db") as store:
        for r in [*population[:3], other, passed]:
            store.save(r)
        assert set(select_runs(store, agent="two-mode-desk")) == {r.id for r in population[:3]}
        assert select_runs(store, agent="two-mode-desk", outcome="passed") == [passed.id]
        assert select_runs(store, ids=[other.id, population[0].id]) == [other.id,
                                                                         population[0].id]
        with pytest.raises(RunNotFound):
            select_runs(store, ids=["nope"])


def car_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_triage_by_run_list_and_by_agent_name_with_stable_json(population, tmp_path):
    runs = population[:2] + population[-2:]
    other = syn.pivot().failing_run(0)
    with RunStore(tmp_path / "car.db") as store:
        for r in [*runs, other]:
            store.save(r)
    listed = car_cli("triage", runs[0].id, runs[-1].id, "--agent", AGENT, "--rollouts",
                     str(K), "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert {"groups", "undecided", "no_cause"} <= data.keys()
    assert all(GROUP_KEYS <= g.keys() for g in data["groups"])
    assert sorted(i for g in data["groups"] for i in g["runs"]) == sorted([runs[0].id,
                                                                           runs[-1].id])
    # by agent name: the pivot run (another agent) is not triaged
    named = car_cli("triage", "--agent-name", "two-mode-desk", "--agent", AGENT,
                    "--rollouts", str(K), cwd=tmp_path)
    assert named.returncode == 0, named.stderr
    assert "4 run(s)" in named.stdout and "step 1" in named.stdout
    tid = named.stdout.rsplit("triage ", 1)[1].split()[0]
    listed_all = car_cli("attributions", "--json", cwd=tmp_path)
    assert any(a["id"] == tid and a["method"] == "triage"
               for a in json.loads(listed_all.stdout))
    exported = car_cli("export", "triage", tid, "--format", "csv", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.splitlines()[0] == ",".join(CSV_COLUMNS)
    # resumed: every run is read back
    again = car_cli("triage", "--resume", tid, "--agent", AGENT, "--rollouts", str(K),
                    "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert all(r["reused"] for r in json.loads(again.stdout)["per_run"])


def _passing_run() -> car.Trajectory:
    from car_core.engine.replay import record
    return next(r for r in (record(DESK.agent(), context={"mode": "early"},
                                   outcome=DESK.outcome, seed=s) for s in range(100))
                if not r.failed)


def test_a_run_given_that_did_not_fail_is_left_out_of_the_counts(population, tmp_path):
    """A run that passed is no failure to place: it was counted undecided and the sentence
    said "1 of 2 failed run(s)"; the CLI dropped it without a word. Python lists it apart from
    the population; the CLI says it left it out."""
    fine = _passing_run()
    runs = [population[0], fine]
    res = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K)
    assert res.not_failed == (fine.id,) and res.runs_total == 1
    assert fine.id not in _accounted(res) and sorted(_accounted(res)) == [population[0].id]
    assert res.summary().endswith("; 1 run(s) given did not fail and were left out")
    assert "(not failed)" in res.to_csv()
    assert TriageResult.from_dict(res.to_dict()).not_failed == (fine.id,)
    with RunStore(tmp_path / "car.db") as store:
        for r in runs:
            store.save(r)
    proc = car_cli("triage", population[0].id, fine.id, "--agent", AGENT, "--rollouts",
                   str(K), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (f"left out 1 run(s) named: did not fail (its stored outcome): {fine.id}"
            in proc.stderr)
    assert "1 run(s)" in proc.stdout


def test_cli_refuses_an_empty_selection(population, tmp_path):
    with RunStore(tmp_path / "car.db") as store:
        store.save(population[0])
    proc = car_cli("triage", "--agent-name", "nobody", "--agent", AGENT, cwd=tmp_path)
    assert proc.returncode == 2 and "--agent-name 'nobody' is no stored run's agent" in proc.stderr
    # a trial's triage said "agent support" of its runs and --agent-name support matched none:
    # the stored name is the adapter's; the error names the agents the store holds
    assert f"the store's: {population[0].agent!r}" in proc.stderr


def test_cli_refuses_label_and_by_together(population, tmp_path):
    """``--label`` replaces ``--by``: given both, the fields were dropped without a word."""
    with RunStore(tmp_path / "car.db") as store:
        store.save(population[0])
    proc = car_cli("triage", population[0].id, "--agent", AGENT, "--by", "step",
                   "--label", "anything:label", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "--label replaces --by" in proc.stderr
    with RunStore(tmp_path / "car.db") as store:
        assert store.attributions() == []


def test_cli_says_a_token_cap_that_counted_nothing(population, tmp_path):
    """The planted desk's branches report no usage: --max-tokens capped nothing, said."""
    with RunStore(tmp_path / "car.db") as store:
        store.save(population[0])
    proc = car_cli("triage", population[0].id, "--agent", AGENT, "--max-tokens", "50",
                   "--json", cwd=tmp_path)
    res = json.loads(proc.stdout)
    assert res["tokens"] == 0 and res["rollouts_used"] > 0, proc.stderr
    assert "--max-tokens capped nothing" in " ".join(proc.stderr.split())


def test_group_results_groups_finished_attributions_as_triage_does(population):
    runs = population[:3] + population[-2:]
    tri = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K)
    done = [(r, car.contrastive(r, DESK.agent(), outcome=DESK.outcome, rollouts=K,
                                early_stop=True)) for r in runs]
    grouped = car_triage.group_results(done)
    assert grouped.to_dict()["groups"] == tri.to_dict()["groups"]
    assert grouped.rollouts_used == sum(res.rollouts_used for _, res in done)
    # a run that got no attribution counts as undecided, with why: G grows by one
    more = car_triage.group_results(done, unattributed={"test_x": "no run recorded"})
    assert more.undecided == ("test_x",) and more.runs_total == len(runs) + 1
    assert more.level == pytest.approx(1 - 0.05 / 3)
    assert [g.runs for g in more.groups] == [g.runs for g in tri.groups]
    assert next(r.reason for r in more.per_run if r.run_id == "test_x") == \
        "not attributed: no run recorded"
    shapley = car.shapley(runs[0], DESK.agent(), outcome=DESK.outcome, budget=48)
    with pytest.raises(InvalidInput, match="no locus to group"):
        car_triage.group_results([(runs[0], shapley)])


def test_cli_selects_the_runs_of_one_pytest_session(population, tmp_path):
    tagged = {"s1": population[:2], "s2": [population[2], population[-1]]}
    with RunStore(tmp_path / "car.db") as store:
        for session, runs in tagged.items():
            for r in runs:
                store.save(replace(r, meta={**r.meta, "test": f"t.py::{r.id}",
                                            "test_session": session}))
        assert select_runs(store, session="s2") == [r.id for r in tagged["s2"]]
    proc = car_cli("triage", "--session", "s1", "--agent", AGENT, "--rollouts", str(K),
                   "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert sorted(r["run_id"] for r in data["per_run"]) == sorted(r.id for r in tagged["s1"])
    none = car_cli("triage", "--session", "s3", "--agent", AGENT, cwd=tmp_path)
    assert none.returncode == 2 and "nothing to triage" in none.stderr


def test_a_run_refused_before_any_branch_names_no_attribution(population, tmp_path):
    """A run whose outcome check refuses it (a judge that mislabelled the record) stores no
    attribution: its row names none (the triage page once listed an id the store lacked)."""
    runs = population[:3]
    refused = runs[1].id

    def outcome(run: car.Trajectory) -> float:
        return 0.0 if run.id == refused else DESK.outcome(run)

    with RunStore(tmp_path / "car.db") as store:
        tri = car.triage(runs, DESK.agent(), outcome=outcome, rollouts=K, store=store)
        rows = {r.run_id: r for r in tri.per_run}
        assert rows[refused].answer == "undecided" and rows[refused].attribution_id is None
        reason = rows[refused].reason or ""
        assert "not attributed" in reason
        # its row says both causes in a few lines, the one likely in a population first (a
        # trial's rows led with a thousand characters on making the outcome see a failure)
        assert reason.index("may have mislabelled it") < reason.index("cannot see the failure")
        assert f"`car attribute {refused}` says how" in reason and len(reason) < 500
        for r in runs:
            if r.id != refused:
                assert store.attribution_exists(rows[r.id].attribution_id)


def test_every_run_is_preflighted_before_any_branch(population, tmp_path):
    """The agent's preflight sees every run before the first branch: a shape that stops the
    triage (an ``InvalidInput``) is raised with no branch run and no other run's attribution
    left interrupted, whichever run it is; a run's own trouble (an ``AdapterError``) makes
    that run's row, named, and the others are attributed."""
    from car_core.errors import AdapterError, InvalidInput
    runs = population[:4]
    stops = Preflighted(DESK.agent(), {runs[3].id: InvalidInput("a graph shape CAR cannot fork")})
    with RunStore(tmp_path / "car.db") as store:
        with pytest.raises(InvalidInput, match="cannot fork"):
            car.triage(runs, stops, outcome=DESK.outcome, rollouts=K, store=store,
                       runs_at_once=2)
        assert stops.branches == 0 and _branches(store) == 0
        # only the triage's own row: no run's attribution began
        assert [store.attribution(a).method for a in store.attribution_ids()] == ["triage"]
    one = Preflighted(DESK.agent(), {runs[2].id: AdapterError("this thread's checkpoint is gone")})
    res = car.triage(runs, one, outcome=DESK.outcome, rollouts=K, runs_at_once=2)
    rows = {r.run_id: r for r in res.per_run}
    assert rows[runs[2].id].answer == "undecided" and rows[runs[2].id].attribution_id is None
    assert "checkpoint is gone" in (rows[runs[2].id].reason or "")
    assert all(rows[r.id].locus is not None for r in runs if r.id != runs[2].id)


def test_a_refusal_that_holds_for_every_run_stops_the_triage(population, tmp_path):
    """A refusal the agent says holds for every run (``every_run``: where CAR was called, not
    which run) stops the triage: a trial called ``car.triage`` on the event loop its
    ``AsyncSqliteSaver`` is bound to, and got back a "complete" triage, stored, with every
    run undecided. It is raised before any branch."""
    from car_core.errors import AdapterError
    runs = population[:3]
    on_loop = AdapterError("AsyncSqliteSaver runs on this event loop, which CAR would block",
                           every_run=True)
    everyone = Preflighted(DESK.agent(), {r.id: on_loop for r in runs})
    with RunStore(tmp_path / "car.db") as store:
        with pytest.raises(AdapterError, match="runs on this event loop"):
            car.triage(runs, everyone, outcome=DESK.outcome, rollouts=K, store=store)
        assert everyone.branches == 0
        # no run's attribution began, and the triage is not stored as complete
        rows = [store.attribution(a) for a in store.attribution_ids()]
        assert [r.method for r in rows] == ["triage"] and rows[0].status != "complete"


def test_a_model_server_down_stops_the_triage_and_it_resumes(population, tmp_path):
    """The agent's model server goes down after the first run: every later run would be
    undecided for it, so the triage stops (``ModelUnavailable``, as an attribution does), and
    the same triage id finishes once it is back, reading the first run back. A user trial saw
    every run undecided and no way to resume the triage. From Python the stop says to resume
    the triage by its id, not the stopped run's own attribution (whose id it named)."""
    from car_core.engine.agent import FunctionAgent
    from car_core.errors import RESUME_SAME_ID, ModelUnavailable

    runs = population[:3]
    inner = DESK.agent()
    down = {"now": False}

    def policy(history, rng):
        if down["now"]:
            raise ModelUnavailable("connection refused: the model server is down",
                                   hint=f"start it, then {RESUME_SAME_ID}")
        return inner.policy(history, rng)

    agent = FunctionAgent(policy=policy, environment=inner.environment,
                          is_final=inner.is_final, max_steps=inner.max_steps,
                          name=inner.name)
    seen: list[str] = []

    def progress(done, total, row):
        seen.append(row.run_id)
        down["now"] = True  # after the first run

    with RunStore(tmp_path / "car.db") as store:
        with pytest.raises(ModelUnavailable, match="the model server is down") as info:
            car.triage(runs, agent, outcome=DESK.outcome, rollouts=K, store=store,
                       triage_id="t1", progress=progress, runs_at_once=1)
        assert seen == [runs[0].id]
        assert ('start it, then resume the triage: run car.triage(...) again with '
                'triage_id="t1" and the same store=, or `car triage ... --resume t1`'
                ) in str(info.value)
        assert "attribution_id=" not in str(info.value)
        down["now"] = False
        done = car.triage(runs, agent, outcome=DESK.outcome, rollouts=K, store=store,
                          triage_id="t1", runs_at_once=1)
    rows = {r.run_id: r for r in done.per_run}
    assert rows[runs[0].id].reused and not rows[runs[1].id].reused
    assert all(r.answer != "undecided" or "server" not in (r.reason or "")
               for r in done.per_run)


def test_runs_an_error_stopped_are_not_called_undecided(population):
    """A user trial's triage whose every run was refused (a shape the agent cannot branch)
    said "5 undecided", which reads as "a larger budget would tell": it says they could not be
    attributed, and why."""
    from car_core.errors import AdapterError
    runs = population[:3]
    refused = Preflighted(DESK.agent(), {r.id: AdapterError("its checkpoints are gone")
                                         for r in runs})
    res = car.triage(runs, refused, outcome=DESK.outcome, rollouts=K)
    assert res.summary() == ("none of the 3 failed run(s) was traced to a step: 3 could not be "
                             "attributed (the first: its checkpoints are gone)")
    assert refused.branches == 0
    one = Preflighted(DESK.agent(), {runs[0].id: AdapterError("its checkpoints are gone")})
    mixed = car.triage(runs, one, outcome=DESK.outcome, rollouts=K)
    assert mixed.summary().endswith(
        "1 could not be attributed (the first: its checkpoints are gone)")


def test_a_triage_running_now_is_listed_as_running_and_held(population, tmp_path):
    """A first-hour trial's `car attributions` listed a triage still running as "interrupted":
    its row held no lease. It holds one while it runs (a second triage of the same id is
    refused), and gives it up when it ends, however it ends."""
    from car_core.errors import AttributionBusy
    runs = population[:2]
    seen: list[bool] = []
    with RunStore(tmp_path / "car.db") as store:
        def progress(done, total, row):
            with RunStore(tmp_path / "car.db") as other:
                seen.append(other.running_now("t-live"))
                with pytest.raises(AttributionBusy):
                    car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K,
                               store=other, triage_id="t-live")

        car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K, store=store,
                   triage_id="t-live", progress=progress, runs_at_once=1)
        assert seen == [True, True] and not store.running_now("t-live")


@pytest.mark.parametrize("shown", [False, True])
def test_progress_takes_a_bool_as_the_other_estimators_do(population, capsys, shown):
    """``car.contrastive(progress=False)`` is accepted, and a user trial passed the same to
    ``car.triage``: it was called as a function after the first run's attribution was spent
    (``TypeError: 'bool' object is not callable``). False prints nothing; True a line per
    run on stderr, the one ``car triage`` prints on a terminal."""
    runs = population[:2]
    res = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K, progress=shown,
                     runs_at_once=1)
    lines = capsys.readouterr().err.splitlines()
    if not shown:
        assert lines == []
    else:
        # each run's line, its rollouts, and the time so far (and left, until the last)
        assert [line.split(" · ")[0] for line in lines] == [
            car_triage.progress_line(i + 1, 2, row) for i, row in enumerate(res.per_run)]
        assert lines[0].startswith(f"[1/2] run {runs[0].id}: ")
        assert f", {res.per_run[0].rollouts_used} rollouts · " in lines[0]
        assert re.search(r" · \d+ s so far, about \d+ s left$", lines[0]), lines[0]
        assert re.search(r" · \d+ s so far$", lines[1]), lines[1]


def test_a_paced_line_says_the_time_so_far_and_left():
    """A trial's triage of 28 runs printed one bare line per run for four minutes."""
    from car_core.engine.progress import Paced, duration
    now = [100.0]
    paced = Paced(lambda done, total: f"[{done}/{total}]", clock=lambda: now[0])
    now[0] = 190.0
    assert paced(3, 10) == "[3/10] · 1 min 30 s so far, about 3 min 30 s left"
    now[0] = 400.0
    assert paced(10, 10) == "[10/10] · 5 min 00 s so far"
    assert (duration(42.4), duration(3 * 3600 + 5 * 60)) == ("42 s", "3 h 05 min")


def test_a_paced_line_times_runs_that_go_several_at_once_as_lanes():
    """A trial's fix went four runs at a time: its first line, at 30 s, said "about 7 min 00 s
    left" (30 s for each of 14 runs), and it ended at 93 s. Four lanes of 30-second runs: when
    the first ends, the other three of its wave are about done and the fifth run has just
    begun; its 30 s and the ten queued runs' 300 s, over four lanes: 82.5 s."""
    from car_core.engine.progress import Paced
    now = [0.0]
    paced = Paced(lambda done, total: f"[{done}/{total}]", clock=lambda: now[0], at_once=4)
    now[0] = 30.0
    assert paced(1, 15) == "[1/15] · 30 s so far, about 1 min 22 s left"
    assert paced(4, 15).endswith("about 1 min 22 s left")  # the other three of the wave
    now[0] = 60.0  # the second wave: as fast
    assert paced(8, 15) == "[8/15] · 1 min 00 s so far, about 52 s left"


def test_a_paced_line_times_runs_from_when_they_began():
    """A trial's triage of three runs, three lanes, a total budget the first two held: the
    third began when the first ended (20 s), and at 25 s, with the second done too, the line
    read "about 0 s left" (the lanes had it running since 0 s); it ended at 44 s. Timed from
    its start: 22.5 s a run, 5 s of it gone."""
    from car_core.engine.progress import Paced
    now = [0.0]
    paced = Paced(lambda done, total: f"[{done}/{total}]", clock=lambda: now[0], at_once=3)
    paced.started()
    paced.started()
    now[0] = 20.0
    assert paced(1, 3) == "[1/3] · 20 s so far, about 20 s left"  # the second's 0, the third's
    paced.started()
    now[0] = 25.0
    assert paced(2, 3) == "[2/3] · 25 s so far, about 18 s left"


@pytest.mark.parametrize("at_once", [1, 2])
def test_a_triage_tells_its_printed_progress_when_each_run_began(population, at_once):
    """A total budget that pays one run at a time: each run begins when the one before it
    ended, which only the triage knows (with two lanes the second waits for budget, not for
    a lane). The pace's clock counts branches, so a run's branches fall between its start and
    its end: told after the run (one at a time runs it as it is submitted), a trial's every
    line read "about 0 s left"."""
    from car_core.engine.progress import Paced, PacedPrinter
    agent = Preflighted(DESK.agent(), {})
    lines: list[str] = []
    printer = PacedPrinter(Paced(car_triage.progress_line, clock=lambda: agent.branches,
                                 at_once=at_once), lines.append)
    runs = population[:3]
    each = rollout_budget(len(runs[0].steps), K, None)[0]
    car.triage(runs, agent, outcome=DESK.outcome, rollouts=K, runs_at_once=at_once,
               budget=car.Budget(rollouts=int(each.rollouts * 1.5)), progress=printer)
    began, ended = printer.paced.began, printer.paced.ends
    assert len(lines) == 3 and len(began) == len(ended) >= 2
    assert all(end > start for start, end in zip(began, ended, strict=True)), (began, ended)
    assert all(began[i + 1] >= ended[i] for i in range(len(began) - 1))


def test_runs_read_back_count_as_done_but_not_towards_the_pace():
    """A trial's resume read its finished runs back at once, and the next line said "about 0 s
    left", then "about 1 min 01 s left". Untimed runs (``untimed``) give no pace of their own."""
    from car_core.engine.progress import Paced
    now = [0.0]
    paced = Paced(lambda done, total, reused: f"[{done}/{total}]", clock=lambda: now[0],
                  untimed=lambda reused: reused)
    assert paced(1, 10, True) == "[1/10] · 0 s so far"
    assert paced(2, 10, True) == "[2/10] · 0 s so far"
    now[0] = 20.0
    assert paced(3, 10, False) == "[3/10] · 20 s so far, about 2 min 20 s left"


def test_progress_that_is_neither_a_bool_nor_a_function_is_refused_before_any_branch(
        population):
    agent = Preflighted(DESK.agent(), {})
    with pytest.raises(InvalidInput, match="progress must be True, False or a function"):
        car.triage(population[:1], agent, outcome=DESK.outcome, rollouts=K, progress="yes")
    assert agent.branches == 0


def test_each_run_of_a_triage_draws_its_own_noise() -> None:
    """A noisy judge (one taking ``rng``) drew the same numbers on every run's branches: all
    the attributions shared the triage's root seed, so the judge erred on the same (arm,
    rollout) in every run and the runs were not independent, as the shares' intervals need.
    Each run now draws from its own seed (the triage's and its id); the same triage again
    draws the same."""
    m = syn.pivot()
    runs = [replace(m.failing_run(0), id=f"run-{i}") for i in range(2)]
    def triaged() -> dict[str, dict[tuple[str, int], float]]:
        draws: dict[str, dict[tuple[str, int], float]] = {}

        def judge(r: car.Trajectory, rng: Any) -> float:
            value = float(rng.random())
            if r.lineage is not None:
                draws.setdefault(r.lineage.parent_id, {})[(r.lineage.arm, r.lineage.rollout)] \
                    = value
            return m.outcome(r, rng)
        car.triage(runs, m.agent(), outcome=judge, rollouts=8, seed=0, progress=False)
        return draws
    first = triaged()
    a, b = first["run-0"], first["run-1"]
    shared = set(a) & set(b)
    assert len(shared) >= 8
    assert sum(a[k] == b[k] for k in shared) == 0
    assert triaged() == first  # reproducible: the seeds come from the ids, not the clock


def test_a_triage_begun_on_one_root_seed_resumes_on_it(population, tmp_path,
                                                       monkeypatch) -> None:
    """A triage begun before runs drew seeds of their own (its stored params say nothing of
    "seeds") resumes its undecided runs on the root seed they began on: a resume on another
    seed is refused, so every interrupted run would have come back "not attributed"."""
    from car_core.model.json_values import dumps, loads
    from car_core.store.seals import attribution_seal
    runs = population[:2] + population[-2:]
    with RunStore(tmp_path / "car.db") as store:
        with monkeypatch.context() as old:  # the old rule: one root seed for every run
            old.setattr(car_triage, "run_seed", lambda seed, run_id: seed)
            first = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=1,
                               store=store, triage_id="t-old", progress=False)
        assert first.undecided
        row = dict(next(store.db.query("select * from attributions where id = 't-old'")))
        params = loads(row["params"])
        params.pop("seeds")
        row["params"] = dumps(params)
        row["seal"] = attribution_seal(row)
        store.db.table("attributions").update("t-old", {"params": row["params"],
                                                        "seal": row["seal"]})
        second = car.triage(runs, DESK.agent(), outcome=DESK.outcome, rollouts=K,
                            store=store, triage_id="t-old", progress=False)
        assert not any("seed" in (r.reason or "") for r in second.per_run), second.per_run
        assert {store.attribution(r.attribution_id).params["seed"]
                for r in second.per_run} == {0}
        assert store.attribution("t-old").params["seeds"] == "root"


def test_cli_triage_whose_runs_used_up_their_rollouts_says_how_to_go_on(population, tmp_path):
    """Runs left undecided by their own n·K said only "budget ran out" (a trial's six of six):
    the command line says how to go on, the same triage with twice the re-runs, and that
    command does go on from the branches kept."""
    runs = population[:2]
    with RunStore(tmp_path / "car.db") as store:
        for r in runs:
            store.save(r)
    first = car_cli("triage", *(r.id for r in runs), "--agent", AGENT, "--rollouts", "1",
                    cwd=tmp_path)
    assert "used up their re-runs before a step was decided" in first.stderr, first.stderr
    command = first.stderr.rsplit("\n  car ", 1)[1].split("\n")[0]
    assert "--rollouts 2" in command and "--resume" in command and "--rollouts 1" not in command
    again = car_cli(*shlex.split(command), cwd=tmp_path)
    assert again.returncode in (0, 1), again.stderr
    assert "Traceback" not in again.stderr


def test_a_triage_summary_leaves_out_counts_of_none(population):
    """A trial's triage read "8 of 8 failed run(s) commit at step 3 (...); the only place, 0
    undecided, 0 with no cause": counts of none are left out, and a single place goes
    without saying."""
    from car_core.triage_results import TriageGroup, TriageResult
    group = TriageGroup(label="step 3", step=3, agent=None, node=None, tool=None,
                        share=1.0, share_ci=(0.68, 1.0), runs=tuple(f"r{i}" for i in range(8)))
    res = TriageResult(triage_id="t", runs_total=8, groups=(group,), undecided=(),
                       no_cause=(), per_run=(), alpha=0.05, level=0.95, interval="x", by=(),
                       rollouts_used=0, tokens=0, cost=0.0, truncated=False)
    assert res.summary() == ("8 of 8 failed run(s) commit at step 3 (100%, 68%–100% at 95% "
                             "jointly)")
    two = replace(res, runs_total=11, groups=(group, replace(group, label="step 1",
                                                                runs=("a", "b"))),
                  undecided=("u",))
    assert two.summary().endswith("jointly, the undecided counted either way); 2 places in "
                                  "all, 1 undecided")


def test_a_node_named_as_its_agent_is_said_once_in_a_group_label():
    """A LangGraph trial's ``create_agent`` app grouped its runs under "agent model, node
    model, tool issue_refund"."""
    from car_core.estimators.triage import _default_label
    by = ("step", "agent", "node", "tool")
    same = {"step": 1, "agent": "model", "node": "model", "tool": "issue_refund"}
    assert _default_label(same, by) == "step 1, agent model, tool issue_refund"
    other = dict(same, agent="billing")
    assert _default_label(other, by) == "step 1, agent billing, node model, tool issue_refund"
    assert _default_label(same, ("node",)) == "node model"  # asked for the node alone
    assert _default_label(same, ("agent",)) == "agent model"


def test_a_groups_interval_counts_the_undecided_runs_either_way(population):
    """A trial's triage at a small budget read "2 of 28 failed run(s) commit at step 1 (7%,
    1%–28% at 95% jointly)" with 24 runs undecided; the true share was 54%. Each undecided
    run may commit at any place, so a group's interval now reaches from Wilson's lower end
    for the runs decided there to Wilson's upper end for those plus the undecided: here it
    covers each planted mode's share, which Wilson's on the decided runs alone misses."""
    from car_core.stats import wilson
    res = car.triage(population, DESK.agent(), outcome=DESK.outcome, rollouts=5)
    n, u = res.runs_total, len(res.undecided)
    assert res.groups and u >= n // 3, (len(res.groups), u, n)
    planted = {DESK.step_of("early"): N_EARLY / n, DESK.step_of("late"): N_LATE / n}
    missed = 0
    for g in res.groups:
        k = len(g.runs)
        assert g.share_ci[0] == pytest.approx(wilson(k / n, n, res.level)[0])
        assert g.share_ci[1] == pytest.approx(wilson((k + u) / n, n, res.level)[1])
        assert g.share_ci[0] <= planted[g.step] <= g.share_ci[1], (g.step, g.share_ci)
        missed += wilson(k / n, n, res.level)[1] < planted[g.step]
    assert missed, "the decided runs alone should have missed a planted share here"
    assert "jointly, the undecided counted either way); " in res.summary()


def test_groups_that_differ_only_by_step_say_how_to_count_them_as_one():
    """A trial's two failure modes read as "3 places in all": one decision (send_email) came
    at step 2 of some runs and step 3 of longer ones. The result says how to group it as one;
    it says nothing where no two groups share their agent and tool."""
    from car_core.triage_results import TriageGroup, TriageResult

    def group(step: int, tool: str, n: int) -> TriageGroup:
        return TriageGroup(label=f"step {step}", step=step, agent="model", node="model",
                           tool=tool, share=n / 10, share_ci=(0.0, 1.0),
                           runs=tuple(f"{tool}{step}-{i}" for i in range(n)))

    def result(*groups: TriageGroup) -> TriageResult:
        return TriageResult(triage_id="t", runs_total=10, groups=groups, undecided=(),
                            no_cause=(), per_run=(), alpha=0.05, level=0.95, interval="x",
                            by=("step", "agent", "node", "tool"), rollouts_used=0, tokens=0,
                            cost=0.0, truncated=False)
    split = result(group(1, "issue_refund", 5), group(2, "send_email", 3),
                   group(3, "send_email", 2))
    # "may be": another trial's two real modes (a credit first, or after a lookup) were told
    # they "are one decision", and following it hid both
    assert split.split_hint() == (
        "steps 2 and 3 (agent model, tool send_email) may be one decision, made at a different "
        "step in runs of different lengths, or two different mistakes; if one, pass "
        "by=('agent', 'node', 'tool') to count them together")
    assert split.split_hint() in str(split)
    assert split.split_hint("cli").endswith("pass --by agent,node,tool to count them together")
    from car_core.report.triage_page import render_triage
    page = render_triage(split)
    assert ('<p class="detail" id="split">steps 2 and 3 (agent model, tool send_email) may be'
            in page)
    assert "(--by agent,node,tool)" in page
    assert result(group(1, "issue_refund", 5), group(2, "send_email", 5)).split_hint() is None
