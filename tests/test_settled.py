"""Outcomes that say when a run is settled: branches stop there and score exactly the same.

The planted agent decides at step 0 between "refund" (probability P_REFUND) and "check"; at
each later step it draws one of the two again or a filler, for up to MAX_STEPS steps. The
outcome is 1 when the first of "refund" / "check" is "refund", so it is settled as soon as
either appears. Under common random numbers a branch draws the same action at every step it
reaches whether it stops early or not, so stopping must leave each branch's score, and hence
every estimate built from them, exactly unchanged, while calling the policy less.
"""

from __future__ import annotations

import dataclasses

import pytest

import car_core as car
from car_core.errors import InvalidInput, OutcomeError
from car_core.estimators.alternatives import NO_ACTION
from car_core.model.interventions import compile_plan
from car_core.model.seeding import Noise
from car_core.model.vocabulary import RunStatus

P_REFUND = 0.6
MAX_STEPS = 5


def _first(run: car.Trajectory) -> str | None:
    return next((s.action for s in run.steps if s.action in ("refund", "check")), None)


def plain_outcome(run: car.Trajectory) -> bool:
    return _first(run) == "refund"


def settled_outcome(run: car.Trajectory) -> bool:
    return _first(run) == "refund"


settled_outcome.settled = lambda run: _first(run) is not None  # type: ignore[attr-defined]


class Counted:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, history: car.History, rng) -> str:
        self.calls += 1
        u = rng.random()
        if history.index == 0:
            return "refund" if u < P_REFUND else "check"
        return "refund" if u < 0.2 else "check" if u < 0.4 else f"note-{history.index}"


def agent(policy: Counted) -> car.FunctionAgent:
    return car.FunctionAgent(policy=policy, environment=lambda h, a, rng: "ok",
                             max_steps=MAX_STEPS, name="settled-desk")


def failing_run() -> car.Trajectory:
    for seed in range(50):
        run = car.record(agent(Counted()), outcome=plain_outcome, seed=seed)
        if run.steps[0].action == "refund":
            return run
    raise AssertionError("no seed refunded first")


def test_a_branch_stops_where_the_outcome_is_settled_and_scores_the_same() -> None:
    run = failing_run()
    plan = compile_plan(run, [car.do_resample(0)])
    full, short = Counted(), Counted()
    for r in range(40):
        noise = Noise(7, (1, r))
        a = agent(full).branch(run, plan, noise)
        b = agent(short).branch(run, plan, noise, stop=settled_outcome.settled)
        assert plain_outcome(a) == plain_outcome(b)
        assert [s.action for s in b.steps] == [s.action for s in a.steps][:len(b.steps)]
        assert b.status == RunStatus.SETTLED and len(b.steps) == 1  # step 0 decides it
    assert short.calls == 40 < full.calls


def test_a_settled_held_prefix_calls_no_policy() -> None:
    run = failing_run()
    policy = Counted()
    b = agent(policy).branch(run, compile_plan(run, [car.do_resample(1)]), Noise(3),
                             stop=settled_outcome.settled)
    assert policy.calls == 0 and b.status == RunStatus.SETTLED
    assert [s.action for s in b.steps] == ["refund"]


def test_stop_is_not_asked_before_a_pending_edit_rewrites_the_history() -> None:
    """An edit at step 1 that drops the recorded refund: the held prefix said "settled", but
    the branch that actually runs decides step 0 again, so it must not stop before the edit."""
    run = failing_run()

    def drop_steps(h: car.History) -> car.History:
        return car.History(h.context, (), 0)

    plan = compile_plan(run, [car.do_context(1, drop_steps)])
    for r in range(20):
        a = agent(Counted()).branch(run, plan, Noise(100 + r))
        b = agent(Counted()).branch(run, plan, Noise(100 + r), stop=settled_outcome.settled)
        assert plain_outcome(a) == plain_outcome(b)
        assert b.steps[0].meta["origin"] == "edited"


def test_contrastive_is_unchanged_by_settling_and_calls_the_policy_less() -> None:
    """Same seed, same coupled noise: every branch scores the same, so the search takes the
    same path and every estimate is identical; only the policy calls differ, and with them
    what a branch that settled before a step shows it would have done there (nothing: the
    failure was decided at step 0, so a settled branch re-draws no later step)."""
    run = failing_run()
    full, short = Counted(), Counted()
    a = car.contrastive(run, agent(full), outcome=plain_outcome, rollouts=32, seed=1)
    b = car.contrastive(run, agent(short), outcome=settled_outcome, rollouts=32, seed=1)
    assert a.locus == b.locus
    assert a.rollouts_used == b.rollouts_used

    def estimates(s: car.StepEffect) -> tuple[object, ...]:
        return dataclasses.astuple(dataclasses.replace(s, alternatives=()))
    assert [estimates(s) for s in a.steps] == [estimates(s) for s in b.steps]
    for x, y in zip(a.steps, b.steps, strict=True):
        assert x.step == 0 or not y.alternatives or {
            alt.action for alt in y.alternatives if alt.share > 0} == {NO_ACTION}
        if x.step == 0:
            assert x.alternatives == y.alternatives
    assert short.calls < full.calls


def test_contrastive_with_a_settled_outcome_finds_the_planted_decision() -> None:
    """Planted truth: the failure is decided at step 0 (rescue 1 - P_REFUND = 0.4), and no
    later step can rescue it. With 5 steps and 32 rollouts per arm the budget is 160."""
    res = car.contrastive(failing_run(), agent(Counted()), outcome=settled_outcome,
                          rollouts=32, seed=0)
    assert res.locus == 0 and res.steps[0].ci[0] > 0


def test_a_settled_hook_that_is_not_callable_is_refused() -> None:
    def outcome(run: car.Trajectory) -> bool:
        return False

    outcome.settled = True  # type: ignore[attr-defined]
    with pytest.raises(InvalidInput, match="settled"):
        car.intervene(failing_run(), agent(Counted()), car.do_resample(0), outcome=outcome,
                      rollouts=2)


def test_a_settled_hook_that_raises_is_an_outcome_error() -> None:
    def outcome(run: car.Trajectory) -> bool:
        return plain_outcome(run)  # sees the recorded failure, so the run is branched

    def broken(run: car.Trajectory) -> bool:
        raise RuntimeError("boom")

    outcome.settled = broken  # type: ignore[attr-defined]
    with pytest.raises(OutcomeError, match="settled"):
        car.intervene(failing_run(), agent(Counted()), car.do_resample(0), outcome=outcome,
                      rollouts=2)
