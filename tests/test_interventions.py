"""The five interventions: validation, their compiled plan, their stored form, and the outcome
distribution each produces on planted models against its analytic value.

Tolerance: with K independent 0/1 rollouts the sample mean has standard error
sqrt(p(1-p)/K). Every estimate below must lie within 4.5 standard errors of the analytic p
(two-sided normal tail P(|Z| > 4.5) ≈ 7e-6 per check, and the seeds are fixed, so a pass is
deterministic and a real bias of that size cannot hide). When p is 0 or 1 the outcome is
deterministic and the estimate must equal it exactly.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import car_core as car
from car_core.engine.replay import OutcomeDistribution
from car_core.errors import InvalidIntervention, StepOutOfRange
from car_core.model.interventions import compile_plan, intervention_from_dict
from car_core.testing import DictEnvironment
from car_core.testing import synthetic as syn

K = 400


def tolerance(p: float, k: int = K) -> float:
    return 4.5 * math.sqrt(p * (1 - p) / k)


def assert_close(estimate: float, p: float, k: int = K) -> None:
    assert abs(estimate - p) <= tolerance(p, k), (estimate, p, tolerance(p, k))


def estimate(run, model, interventions, seed: int = 1) -> OutcomeDistribution:
    return car.intervene(run, model.agent(), interventions, outcome=model.outcome, rollouts=K,
                         seed=seed, progress=False)


MODELS = {name: m for name, m in syn.catalogue().items() if name != "late-pivot"}


def steps_of(model: syn.SyntheticSCM) -> list[tuple[str, int]]:
    return [(model.name, k) for k in range(model.n_steps)]


# -- each intervention against its analytic value ---------------------------------------------
@pytest.mark.parametrize("name,k", [c for m in MODELS.values() for c in steps_of(m)])
def test_resample_matches_the_analytic_arm(name: str, k: int) -> None:
    model = MODELS[name]
    run = model.failing_run()
    # steps < k held, k and later re-drawn: exactly the arm H_k
    assert_close(estimate(run, model, car.do_resample(k)).mean, model.arm(k))


@pytest.mark.parametrize("k", [0, 19, 20, 21, 23])
def test_resample_on_a_late_pivot_matches_the_analytic_arm(k: int) -> None:
    model = syn.late_pivot()
    run = model.failing_run()
    assert_close(estimate(run, model, car.do_resample(k)).mean, model.arm(k))


@pytest.mark.parametrize("name,k", [c for m in MODELS.values() for c in steps_of(m)])
def test_forcing_the_factual_action_matches_the_next_arm(name: str, k: int) -> None:
    model = MODELS[name]
    run = model.failing_run()
    # the factual action at k and the record before it: the arm H_{k+1}
    assert_close(estimate(run, model, car.do_action(k, run.steps[k].action)).mean,
                 model.arm(k + 1))


def good(run: car.Trajectory, k: int) -> dict:
    return {**run.steps[k].action, "choice": "good"}


@pytest.mark.parametrize("model,k,expected", [
    (syn.pivot(), 2, 0.0),                      # the pivot made good: later steps copy it
    (syn.noisy_pivot(), 2, 0.1),                # only the judge's flip remains
    (syn.and_game(), 0, 0.0),                   # AND needs step 0 bad
    (syn.or_game(), 0, 0.3),                    # OR still fails when step 1 (live) draws bad
    (syn.three_way(), 3, 0.0),
])
def test_forcing_a_different_action(model: syn.SyntheticSCM, k: int, expected: float) -> None:
    run = model.failing_run()
    dist = estimate(run, model, car.do_action(k, good(run, k)))
    assert_close(dist.mean, expected)
    assert all(t.steps[k].action["choice"] == "good" for t in dist.trajectories)


def observation_agent() -> car.FunctionAgent:
    """Step 0 asks a tool for a risk; step 1 goes bad with that probability. Failure = bad."""
    def policy(history: car.History, rng: np.random.Generator) -> dict:
        u = float(rng.random())
        if history.index == 0:
            return {"tool": "risk"}
        risk = history.steps[0].observation["risk"]
        return {"choice": "bad" if u < risk else "good"}

    return car.FunctionAgent(policy=policy,
                             environment=DictEnvironment({'{"tool":"risk"}': {"risk": 0.2}}),
                             is_final=lambda a: "choice" in a, max_steps=3)


def chose_bad(run: car.Trajectory) -> bool:
    return run.steps[-1].action.get("choice") == "bad"


def test_do_observation_replaces_what_the_tool_returned() -> None:
    agent = observation_agent()
    run = car.record(agent, context=None, outcome=chose_bad, seed=0)
    factual = car.intervene(run, agent, car.do_resample(1), outcome=chose_bad, rollouts=K,
                            seed=3, progress=False)
    assert_close(factual.mean, 0.2)
    forced = car.intervene(run, agent, car.do_observation(0, {"risk": 0.9}), outcome=chose_bad,
                           rollouts=K, seed=3, progress=False)
    assert_close(forced.mean, 0.9)
    for t in forced.trajectories:
        assert t.steps[0].action == run.steps[0].action   # the recorded action is kept
        assert t.steps[0].observation == {"risk": 0.9}
        assert t.steps[0].meta["origin"] == "held"


def context_agent() -> car.FunctionAgent:
    def policy(history: car.History, rng: np.random.Generator) -> dict:
        u = float(rng.random())
        return {"choice": "bad" if u < history.context["p"] else "good", "k": history.index}

    return car.FunctionAgent(policy=policy, is_final=lambda a: a["k"] == 1, max_steps=2)


@pytest.mark.parametrize("k", [0, 1])
def test_do_context_redecides_from_the_edited_state(k: int) -> None:
    agent = context_agent()
    run = car.record(agent, context={"p": 0.1}, outcome=chose_bad, seed=0)
    calls = []

    def riskier(h: car.History) -> car.History:
        calls.append(h.index)
        return dataclasses.replace(h, context={"p": 0.7})

    dist = car.intervene(run, agent, car.do_context(k, riskier), outcome=chose_bad, rollouts=K,
                         seed=5, progress=False)
    assert_close(dist.mean, 0.7)   # the last step decides from p = 0.7
    assert calls == [k] * K
    assert all(t.steps[k].meta["origin"] == "edited" for t in dist.trajectories)


def test_do_policy_swaps_the_policy_from_its_step_on() -> None:
    model = syn.pivot()
    run = model.failing_run()
    riskier = syn.pivot(p_bad=0.6)
    dist = estimate(run, model, car.do_policy(2, riskier.policy))
    assert_close(dist.mean, 0.6)
    assert {t.steps[3].meta["origin"] for t in dist.trajectories} == {"policy-swapped"}
    assert all(t.steps[1] == dataclasses.replace(run.steps[1], meta={**run.steps[1].meta,
               "origin": "held"}, digest=t.steps[1].digest) for t in dist.trajectories)


@pytest.mark.slow
@pytest.mark.parametrize("model", [syn.and_game(), syn.or_game(), syn.three_way()],
                         ids=lambda m: m.name)
def test_coalitions_match_the_analytic_game(model: syn.SyntheticSCM) -> None:
    """A coalition S: steps in S forced to their factual action, the others resampled."""
    run = model.failing_run()
    for size in range(model.n_steps + 1):
        for coalition in itertools.combinations(range(model.n_steps), size):
            items = [car.do_action(k, run.steps[k].action) if k in coalition
                     else car.do_resample(k) for k in range(model.n_steps)]
            assert_close(estimate(run, model, items, seed=11).mean, model.value(coalition))


def test_interventions_combine_across_kinds() -> None:
    model = syn.and_game()
    run = model.failing_run()
    # step 0 forced good → AND can no longer fail, whatever step 1 does
    assert estimate(run, model, [car.do_action(0, good(run, 0)), car.do_resample(1)]).mean == 0.0
    # step 0 re-drawn, step 1 held at bad: fails iff step 0 draws bad (0.3)
    assert_close(estimate(run, model, [car.do_resample(0), car.do_action(1, run.steps[1].action),
                                       car.do_observation(1, {"ack": "bad"})]).mean, 0.3)


# -- the compiled plan ------------------------------------------------------------------------
def test_plan_serves_steps_before_the_earliest_intervention_from_the_record(pivot_run) -> None:
    plan = compile_plan(pivot_run, [car.do_resample(4), car.do_action(2, {"x": 1})])
    assert plan.start == 2
    assert [plan.origin(k) for k in range(6)] == ["held", "held", "forced", "live", "live",
                                                  "live"]
    assert compile_plan(pivot_run, []).start == len(pivot_run)


def test_do_observation_holds_the_recorded_action(pivot_run) -> None:
    plan = compile_plan(pivot_run, car.do_observation(3, "x"))
    assert plan.forced_actions == {3: pivot_run.steps[3].action}
    assert plan.held == frozenset({3}) and plan.origin(3) == "held"


def test_factual_do_action_is_reported_as_held(pivot_run) -> None:
    plan = compile_plan(pivot_run, car.do_action(1, pivot_run.steps[1].action))
    assert plan.origin(1) == "held"
    assert compile_plan(pivot_run, car.do_action(1, {"other": 1})).origin(1) == "forced"


@pytest.mark.parametrize("items,phrase", [
    ([car.do_resample(1), car.do_action(1, "a")], "use one of do_resample"),
    ([car.do_action(1, "a"), car.do_action(1, "b")], "combine them into one"),
    ([car.do_policy(1, print), car.do_policy(2, print)], "swap the policy once"),
    (["not an intervention"], "build them with car.do_resample"),
])
def test_conflicting_interventions_are_refused(pivot_run, items, phrase: str) -> None:
    with pytest.raises(InvalidIntervention, match=phrase):
        compile_plan(pivot_run, items)


def test_an_intervention_past_the_end_is_refused(pivot_run) -> None:
    with pytest.raises(StepOutOfRange, match="between 0 and 5"):
        compile_plan(pivot_run, car.do_resample(6))


# -- the stored form ----------------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(), children,
                                                                       max_size=3),
    max_leaves=8)

interventions = st.one_of(
    st.builds(car.do_resample, st.integers(0, 50)),
    st.builds(car.do_action, st.integers(0, 50), json_values),
    st.builds(car.do_observation, st.integers(0, 50), json_values),
    st.builds(lambda k, label: car.do_context(k, lambda h: h, label=label), st.integers(0, 50),
              st.text(min_size=1)),
    st.builds(lambda k, label: car.do_policy(k, print, label=label), st.integers(0, 50),
              st.text(min_size=1)),
)


@given(interventions)
def test_stored_form_round_trips_through_json(item) -> None:
    stored = json.loads(json.dumps(item.to_dict()))
    back = intervention_from_dict(stored)
    assert back.to_dict() == item.to_dict()
    if item.kind in ("resample", "action", "observation"):
        assert back == item


def test_a_stored_callable_intervention_cannot_be_applied(pivot_run) -> None:
    back = intervention_from_dict(car.do_context(1, lambda h: h, label="drop").to_dict())
    with pytest.raises(InvalidIntervention, match="build it again"):
        compile_plan(pivot_run, back)
    back = intervention_from_dict(car.do_policy(1, print).to_dict())
    with pytest.raises(InvalidIntervention, match="build it again"):
        compile_plan(pivot_run, back)


def test_an_unknown_stored_kind_is_refused() -> None:
    with pytest.raises(InvalidIntervention, match="use one of resample"):
        intervention_from_dict({"kind": "teleport", "step": 1})


def test_a_plan_says_what_its_branch_does_in_words() -> None:
    """Messages about a failed branch name it by what it does: a trial's error read "arm
    hold<0" where "re-deciding from step 0 on" was meant."""
    run = syn.pivot().failing_run(seed=0)
    assert compile_plan(run, []).words() == "re-running the record with every step held"
    assert compile_plan(run, car.do_resample(2)).words() == "re-deciding from step 2 on"
    # a Shapley coalition: some steps re-drawn, the later ones outside it forced to the record
    coalition = compile_plan(run, [car.do_resample(1), car.do_resample(3),
                                   car.do_action(2, run.steps[2].action)])
    assert coalition.words() == "re-deciding steps 1, 3, the others held"
    forced = compile_plan(run, car.do_action(1, {"choice": "other"}))
    assert forced.words() == "step 1's action forced"
    assert compile_plan(run, car.do_observation(2, {"ok": False})).words() == (
        "step 2's observation replaced")
    assert compile_plan(run, car.do_context(1, lambda s: s, label="policy note")).words() == (
        "step 1's context edited (policy note)")
    assert compile_plan(run, car.do_policy(0, object(), label="careful")).words() == (
        "the policy swapped from step 0 on (careful)")
