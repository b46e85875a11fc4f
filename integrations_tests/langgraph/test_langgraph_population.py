"""Triage and a population fix through the LangGraph adapter, on planted populations of two
failure modes: a ``create_agent`` travel desk and a supervisor with two workers.

Planted truth (``integrations_tests/support/two_mode_travel.py``). Each recorded run's
request is drawn at random, ``rushed`` with probability ``PI = 1/2``, and runs are recorded
until ``N`` of them failed (booked business against the policy). A rushed run fails with
probability ``p_skip = 0.3`` (it skipped the policy), a comfort run with ``p_business = 0.2``
(it booked business with the policy in view), so a failing run is rushed with probability

    share(rushed) = PI·p_skip / (PI·p_skip + (1 − PI)·p_business) = 0.15 / 0.25 = 0.6

and comfort with 0.4: the planted shares each group's interval must cover. Where they
commit: a failing rushed run at the policy decision (the desk's step 0, a ``search_fares``
call instead of ``read_policy``; the supervisor's step 1, ``policy_agent``'s reply without
reading it), rescue ``1 − p_skip = 0.7``; a failing comfort run at the booking (the desk's
step 2, ``book_flight``; the supervisor's step 5, ``booking_agent``'s), rescue
``1 − p_business = 0.8``. Every other step does what it sees, so its rescue is 0.

Tolerances. The shares' intervals are ``car.triage``'s own (Wilson at ``1 − α/G``, jointly
``≥ 1 − α``); each run's locus is a contrastive answer whose family-wise error is ``≤ α``, so a
group holding a run of the other mode is a failure of that guarantee, not noise. The seeds
are fixed, so each test is deterministic. The budgets (``K`` rollouts per step and arm, 16 on
the desk, 8 on the supervisor's twice longer runs) keep the file well under a minute; with
them every run is decided here, which the assertions do not require (an undecided run is
counted, and only the shares' coverage depends on it).
``book_flight`` charges a card: it is declared a side effect, so no branch books for real
(the ledger ``BOOKED`` does not grow), and branches get the simulator's answer.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from car_adapters.langgraph import CarCallback, CarChatModel, CarMiddleware, LangGraphAgent
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from integrations_tests.support import two_mode_travel as tt

PI = 0.5  # the chance a recorded request is the rushed one
N = 24  # failing runs in the desk's population
N_SUPERVISOR = 20  # failing runs in the supervisor's (each run is twice as long)
SHARE = {"rushed": 0.6, "comfort": 0.4}  # the planted shares (module docstring)
ALPHA = 0.05
pytestmark = pytest.mark.slow  # tens of seconds: thousands of branches through LangGraph


def failing_runs(app: Any, n: int, seed: int) -> list[car.Trajectory]:
    """The first ``n`` failing runs of requests drawn rushed with probability ``PI``."""
    rng, cb, runs = np.random.default_rng(seed), CarCallback(), []
    for i in range(50 * n):  # P(fail) = 0.25 a run: 50·n tries miss n failures with p < 1e-9
        mode = "rushed" if rng.random() < PI else "comfort"
        app.invoke(tt.inputs(mode), {"configurable": {"thread_id": f"trip-{seed}-{i}"},
                                     "callbacks": [cb]})
        assert cb.run is not None
        if tt.booked_business(cb.run):
            runs.append(cb.run)
            if len(runs) == n:
                return runs
    raise AssertionError(f"fewer than {n} failing runs")


def by_mode(runs: list[car.Trajectory]) -> dict[str, set[str]]:
    return {m: {r.id for r in runs if tt.mode_of(r) == m} for m in SHARE}


def check_accounting(tri: Any, runs: list[car.Trajectory]) -> None:
    """Every run is in exactly one group, or undecided, or without a cause."""
    placed = [i for g in tri.groups for i in g.runs] + list(tri.undecided) + list(tri.no_cause)
    assert sorted(placed) == sorted(r.id for r in runs)
    assert sum(g.n for g in tri.groups) + len(tri.undecided) + len(tri.no_cause) == len(runs)
    assert tri.runs_total == len(runs)


@pytest.fixture(scope="module")
def desk() -> dict[str, Any]:
    """The ReAct desk, its failing population and its triage (``K = 16`` per step)."""
    mw = CarMiddleware()
    app = tt.react_desk(tt.TwoModeTravelModel(rng_seed=0), InMemorySaver(), [mw])
    runs = failing_runs(app, N, seed=1)
    agent = LangGraphAgent(app, model=mw, safe_tools=tt.SAFE_TOOLS,
                           side_effect_tools=tt.SIDE_EFFECT_TOOLS, simulators=tt.simulators())
    booked = len(tt.BOOKED)
    tri = car.triage(runs, agent, outcome=tt.booked_business, rollouts=16, alpha=ALPHA, seed=0)
    assert len(tt.BOOKED) == booked  # no branch booked a fare for real
    return {"runs": runs, "agent": agent, "triage": tri}


def test_triage_recovers_each_mode_of_the_react_desk(desk: dict[str, Any]) -> None:
    runs, tri = desk["runs"], desk["triage"]
    modes = by_mode(runs)
    check_accounting(tri, runs)
    assert not tri.no_cause  # both modes have a cause, rescue 0.7 and 0.8
    where = {"rushed": (0, "search_fares"), "comfort": (2, "book_flight")}
    assert len(tri.groups) == 2
    for mode, (step, tool) in where.items():
        group = next(g for g in tri.groups if g.step == step)
        assert (group.agent, group.node, group.tool) == ("travel_desk", "model", tool)
        assert group.label == f"step {step}, agent travel_desk, node model, tool {tool}"
        assert set(group.runs) <= modes[mode]  # no run of the other mode in it
        lo, hi = group.share_ci
        assert lo <= SHARE[mode] <= hi, (mode, group.share, group.share_ci)
        assert group.share == pytest.approx(group.n / N)
    assert tri.level == pytest.approx(1 - ALPHA / (2 + bool(tri.undecided)))


def test_the_policy_fix_rescues_the_rushed_mode_only(desk: dict[str, Any]) -> None:
    """The instruction ``FIX`` is read only by the policy decision. Branched at each run's
    locus (the triage's), the arm without it re-decides that step; the arm with it adds the
    line there. A rushed run fails without it with probability ``p_skip`` and never with it,
    so its rescue is ``p_skip``; a comfort run's booking does not read the line and both arms
    draw the same uniform there (shared noise), so every pair agrees: rescue exactly 0. The
    planted pooled rescue over the ``N`` runs is therefore

        θ = (1/N) Σ_i rescue_i = p_skip · n_rushed / N,

    and its stratified Hoeffding interval with ``K = 16`` pairs per run has half-width
    ``sqrt(2 ln(2/α) · N/K) / N`` (one fix, so level ``1 − α``)."""
    runs, agent, tri = desk["runs"], desk["agent"], desk["triage"]
    modes = by_mode(runs)
    k, p_skip = 16, tt.TwoModeTravelModel().p_skip
    booked = len(tt.BOOKED)
    fix = car.fix_population(runs, agent, outcome=tt.booked_business,
                             candidates=[car.Fix.instruction(tt.FIX)], triage=tri,
                             rollouts=k, alpha=ALPHA, seed=0)
    assert len(tt.BOOKED) == booked
    [est] = fix.candidates
    rows = {r.run_id: r for r in est.per_run}
    located = {r.run_id for r in tri.per_run if r.locus is not None}
    tested = [i for i, r in rows.items() if r.n]
    assert set(tested) == located and est.runs_tested == len(tested)  # the rest: no locus
    theta = p_skip * len(modes["rushed"] & set(tested)) / len(tested)
    lo, hi = est.rescue_ci
    assert lo <= theta <= hi, (est.rescue, est.rescue_ci, theta)
    half = math.sqrt(2 * math.log(2 / ALPHA) * len(tested) / k) / len(tested)
    assert est.rescue is not None and hi - est.rescue == pytest.approx(half)
    assert modes["comfort"] <= set(est.not_rescued)  # the other mode: none rescued
    assert not set(est.rescued) & modes["comfort"]
    for i in modes["comfort"] & set(tested):
        assert rows[i].rescue == 0.0 and rows[i].step == 2
    for i in modes["rushed"] & set(tested):
        assert rows[i].p_fail_with == 0.0 and rows[i].step == 0  # the line reached step 0


def test_triage_names_the_agent_each_mode_commits_in() -> None:
    """The supervisor app: the rushed mode commits in ``policy_agent`` (step 1, its reply
    without the policy: no tool), the comfort mode in ``booking_agent`` (step 5,
    ``book_flight``). ``K = 8`` per step (runs of 8 steps: 56 to 64 rollouts a run). The fix
    of the desk's test, branched at each run's locus, must reach the policy worker's decision
    inside its subgraph (its system prompt is prepended there): a rushed run never fails
    with it, a comfort run's pairs all agree."""
    model = CarChatModel(inner=tt.TwoModeTravelModel(rng_seed=0))
    with pytest.warns(Warning):  # create_supervisor uses the deprecated create_react_agent
        app = tt.supervisor_desk(model, InMemorySaver())
    runs = failing_runs(app, N_SUPERVISOR, seed=2)
    modes = by_mode(runs)
    assert [s.meta.get("agent") for s in runs[0].steps][:2] == ["supervisor", "policy_agent"]
    agent = LangGraphAgent(app, model=model, safe_tools=tt.SAFE_TOOLS,
                           side_effect_tools=tt.SIDE_EFFECT_TOOLS, simulators=tt.simulators())
    booked = len(tt.BOOKED)
    tri = car.triage(runs, agent, outcome=tt.booked_business, rollouts=8, alpha=ALPHA, seed=0)
    check_accounting(tri, runs)
    assert not tri.no_cause and len(tri.groups) == 2
    where = {"rushed": (1, "policy_agent", None), "comfort": (5, "booking_agent", "book_flight")}
    for mode, (step, name, tool) in where.items():
        group = next(g for g in tri.groups if g.agent == name)
        assert (group.step, group.node, group.tool) == (step, "model", tool)
        assert set(group.runs) <= modes[mode]
        lo, hi = group.share_ci
        assert lo <= SHARE[mode] <= hi, (mode, group.share, group.share_ci)
    fix = car.fix_population(runs, agent, outcome=tt.booked_business,
                             candidates=[car.Fix.instruction(tt.FIX)], triage=tri,
                             rollouts=8, alpha=ALPHA, seed=0)
    assert len(tt.BOOKED) == booked  # no branch booked a fare for real
    [est] = fix.candidates
    rows = {r.run_id: r for r in est.per_run}
    assert modes["comfort"] <= set(est.not_rescued)
    for r in est.per_run:
        if r.n and r.run_id in modes["comfort"]:
            assert r.rescue == 0.0
        elif r.n:
            assert r.p_fail_with == 0.0 and r.step == 1
    tested = [i for i, r in rows.items() if r.n]
    theta = tt.TwoModeTravelModel().p_skip * len(modes["rushed"] & set(tested)) / len(tested)
    lo, hi = est.rescue_ci
    assert lo <= theta <= hi
