"""The replay engine: held prefix (no calls), exact replay, common random numbers, seeds,
action-match rate, and the conformance suite run against FunctionAgent."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pytest

import car_core as car
from car_core.engine.replay import drive
from car_core.errors import ConformanceFailure, InvalidBudget, InvalidInput, PolicyError
from car_core.model.interventions import Plan
from car_core.model.seeding import Noise
from car_core.testing import (
    CallCounter,
    Choice,
    Counters,
    DictEnvironment,
    ScriptedPolicy,
    SideEffectLedger,
    check_forced_values,
    check_identity_edit,
    check_prefix_makes_no_calls,
    check_replay_reproduces,
    check_same_noise_same_branch,
    count_calls,
    run_conformance,
)
from car_core.testing import synthetic as syn
from car_core.testing._conformance import sign_flip_p as _sign_flip_p

K = 16


def branches(run, agent, interventions, outcome, seed=0, coupled=True, rollouts=K):
    return car.intervene(run, agent, interventions, outcome=outcome, rollouts=rollouts,
                         seed=seed, coupled=coupled, progress=False)


# -- the held prefix is served from the record ----------------------------------------------
@pytest.mark.parametrize("k", range(6))
def test_resample_calls_nothing_before_its_step(pivot_model, pivot_run, k: int) -> None:
    c = count_calls(pivot_model.agent())
    dist = branches(pivot_run, c.agent, car.do_resample(k), pivot_model.outcome)
    n = len(pivot_run)
    assert sorted(set(c.policy.steps)) == list(range(k, n))
    assert c.policy.calls == K * (n - k)
    # the final step calls no tool
    assert sorted(set(c.environment.steps)) == list(range(k, n - 1))
    assert c.environment.calls == K * (n - 1 - k)
    for t in dist.trajectories:
        assert [s.action for s in t.steps[:k]] == [s.action for s in pivot_run.steps[:k]]
        assert [s.observation for s in t.steps[:k]] == [s.observation
                                                         for s in pivot_run.steps[:k]]
        assert [s.meta["origin"] for s in t.steps] == ["held"] * k + ["live"] * (n - k)


def test_forced_observation_calls_no_tool_at_its_step(pivot_model, pivot_run) -> None:
    c = count_calls(pivot_model.agent())
    branches(pivot_run, c.agent, car.do_observation(3, {"ack": "forced"}), pivot_model.outcome)
    assert set(c.policy.steps) == {4, 5}           # step 3 keeps its recorded action
    assert set(c.environment.steps) == {4}         # step 3's observation is the forced one


def test_forced_action_runs_its_tool_live(pivot_model, pivot_run) -> None:
    c = count_calls(pivot_model.agent())
    branches(pivot_run, c.agent, car.do_action(3, pivot_run.steps[3].action),
             pivot_model.outcome)
    assert set(c.policy.steps) == {4, 5}
    assert set(c.environment.steps) == {3, 4}


# -- exact replay -----------------------------------------------------------------------------
@pytest.mark.parametrize("model", list(syn.catalogue().values()), ids=lambda m: m.name)
def test_replay_with_everything_held_reproduces_the_run(model: syn.SyntheticSCM) -> None:
    run = model.failing_run()
    c = count_calls(model.agent())
    dist = branches(run, c.agent, [], model.outcome, rollouts=3)
    assert c.both.calls == 0
    for t in dist.trajectories:
        assert [s.action for s in t.steps] == [s.action for s in run.steps]
        assert [(s.observed, s.observation) for s in t.steps] == [(s.observed, s.observation)
                                                                   for s in run.steps]
        assert t.status == run.status
    check_replay_reproduces(model.agent(), run)


def test_record_is_reproducible_from_its_seed(pivot_model) -> None:
    a = car.record(pivot_model.agent(), context={"x": 1}, outcome=pivot_model.outcome, seed=42)
    b = car.record(pivot_model.agent(), context={"x": 1}, outcome=pivot_model.outcome, seed=42)
    assert a.id != b.id and a.digest == b.digest and a.outcome == b.outcome
    assert a.seed == 42


# -- seeds and common random numbers -------------------------------------------------------
def free_model() -> syn.SyntheticSCM:
    """Five free coin-flip steps: every live step visibly consumes its own noise."""
    return syn.no_cause(n_steps=5)


def actions(t: car.Trajectory, start: int = 0) -> list[str]:
    return [s.action["choice"] for s in t.steps[start:]]


def test_coupled_arms_share_noise_on_steps_they_do_not_intervene_on() -> None:
    model = free_model()
    run = model.failing_run()
    agent = model.agent()
    first = {**run.steps[0].action, "choice": "good"}
    second = {**run.steps[0].action, "choice": "bad"}
    a, b = (car.intervene(run, agent, car.do_action(0, x), outcome=model.outcome, rollouts=32,
                          seed=9, progress=False, twins=8) for x in (first, second))
    assert a.coupled and b.coupled  # measured: each branch and its twin agreed
    for ta, tb in zip(a.trajectories, b.trajectories, strict=True):
        assert actions(ta, 1) == actions(tb, 1)
        assert ta.steps[0].observation["latency_ms"] == tb.steps[0].observation["latency_ms"]
        assert ta.outcome == tb.outcome   # the judge's draw is shared as well


def test_uncoupled_arms_draw_their_own_noise() -> None:
    model = free_model()
    run = model.failing_run()
    agent = model.agent()
    first = {**run.steps[0].action, "choice": "good"}
    second = {**run.steps[0].action, "choice": "bad"}
    a = branches(run, agent, car.do_action(0, first), model.outcome, seed=9, coupled=False,
                 rollouts=32)
    b = branches(run, agent, car.do_action(0, second), model.outcome, seed=9, coupled=False,
                 rollouts=32)
    assert not a.coupled and not b.coupled
    # four fair coin flips agree by chance with probability 1/16 per rollout; with shared
    # noise they would agree in all 32
    same = sum(actions(ta, 1) == actions(tb, 1) for ta, tb in zip(a.trajectories, b.trajectories,
                                                                   strict=True))
    assert same < 16


def test_rollouts_of_one_arm_are_independent_draws() -> None:
    model = free_model()
    run = model.failing_run()
    dist = branches(run, model.agent(), car.do_resample(0), model.outcome, rollouts=32)
    distinct = {tuple(actions(t)) for t in dist.trajectories}
    assert len(distinct) > 16   # 32 draws from 32 equally likely sequences


def test_the_same_root_seed_gives_identical_results(pivot_model, pivot_run) -> None:
    a = branches(pivot_run, pivot_model.agent(), car.do_resample(1), pivot_model.outcome, seed=3)
    b = branches(pivot_run, pivot_model.agent(), car.do_resample(1), pivot_model.outcome, seed=3)
    c = branches(pivot_run, pivot_model.agent(), car.do_resample(1), pivot_model.outcome, seed=4)
    assert a.values == b.values and a.mean == b.mean and a.ci == b.ci
    assert [t.digest for t in a.trajectories] == [t.digest for t in b.trajectories]
    assert [t.digest for t in a.trajectories] != [t.digest for t in c.trajectories]


def test_an_agent_that_does_not_couple_noise_is_reported_uncoupled(pivot_model,
                                                                   pivot_run) -> None:
    agent = dataclasses.replace(pivot_model.agent(), couples_noise=False)
    dist = branches(pivot_run, agent, car.do_resample(1), pivot_model.outcome, coupled=True)
    assert dist.coupled is False
    assert dist.to_dict()["coupled"] is False


# -- the outcome distribution ---------------------------------------------------------------
def test_distribution_reports_wilson_interval_and_lineage(pivot_model, pivot_run) -> None:
    dist = branches(pivot_run, pivot_model.agent(), car.do_resample(2), pivot_model.outcome)
    assert dist.n == K == len(dist.values) == dist.rollouts_used
    assert dist.mean == sum(dist.values) / K
    lo, hi = dist.ci
    assert 0 <= lo <= dist.mean <= hi <= 1
    assert not dist.truncated
    for r, t in enumerate(dist.trajectories):
        assert t.lineage.parent_id == pivot_run.id
        assert t.lineage.branch_step == 2 and t.lineage.rollout == r
        assert list(t.lineage.interventions) == [{"kind": "resample", "step": 2}]
        t.verify()


@pytest.mark.parametrize("budget", [car.Budget(rollouts=4), 4])  # as the estimators take it
def test_a_rollout_budget_truncates_and_says_so(pivot_model, pivot_run, budget) -> None:
    dist = car.intervene(pivot_run, pivot_model.agent(), car.do_resample(2),
                         outcome=pivot_model.outcome, rollouts=10, budget=budget,
                         progress=False)
    assert dist.n == 4 and dist.rollouts_used == 4 and dist.truncated
    assert "rollout budget of 4" in dist.budget_note


def test_a_budget_that_is_neither_a_count_nor_a_budget_is_refused(pivot_model, pivot_run):
    with pytest.raises(InvalidBudget, match="neither a rollout count"):
        car.intervene(pivot_run, pivot_model.agent(), car.do_resample(2),
                      outcome=pivot_model.outcome, rollouts=10, budget="4", progress=False)


# -- action-match rate --------------------------------------------------------------------------
@pytest.mark.parametrize("model", list(syn.catalogue().values()), ids=lambda m: m.name)
def test_a_seeded_policy_redecides_every_recorded_state_exactly(model) -> None:
    run = model.failing_run()
    match = car.action_match_rate(run, model.agent(), replays=3)
    assert match.rate == 1.0 and match.per_step == (1.0,) * len(run)


def test_match_rate_skips_steps_the_policy_did_not_decide(pivot_model, pivot_run) -> None:
    dist = branches(pivot_run, pivot_model.agent(), car.do_policy(4, pivot_model.policy),
                    pivot_model.outcome, rollouts=1)
    branch = dist.trajectories[0]
    assert [s.meta["origin"] for s in branch.steps] == ["held"] * 4 + ["policy-swapped"] * 2
    match = car.action_match_rate(branch, pivot_model.agent(), replays=1)
    assert match.steps == () and match.per_step == ()
    recorded = car.action_match_rate(pivot_run, pivot_model.agent(), replays=1)
    assert recorded.steps == tuple(range(6))


def test_an_unseeded_policy_has_a_low_match_rate() -> None:
    calls = itertools.count()
    agent = car.FunctionAgent(policy=lambda h, rng: next(calls), max_steps=4)
    run = car.record(agent, outcome=lambda r: 0.0, seed=0)
    match = car.action_match_rate(run, agent, replays=2)
    assert match.per_step == (0.0, 0.0, 0.0, 0.0)


# -- the fakes --------------------------------------------------------------------------------
def test_scripted_policy_and_dict_environment_drive_an_agent() -> None:
    policy = ScriptedPolicy(["search", Choice([("buy", 0.25), ("wait", 0.75)])], after="stop")
    env = DictEnvironment({"search": "3 results", "buy": "bought", "wait": "waited"})
    agent = car.FunctionAgent(policy=policy, environment=env, is_final=lambda a: a == "stop")
    runs = [car.record(agent, outcome=lambda r: r.steps[1].action == "buy", seed=s)
            for s in range(400)]
    assert all([s.action for s in r.steps] in (["search", "buy", "stop"],
                                               ["search", "wait", "stop"]) for r in runs)
    assert all(r.steps[0].observation == "3 results" and not r.steps[2].observed for r in runs)
    # P(buy) = 0.25; 4.5 standard errors of 400 draws: 4.5 * sqrt(0.25 * 0.75 / 400) ≈ 0.097
    assert abs(sum(r.failed for r in runs) / 400 - 0.25) <= 0.098


def test_a_script_that_runs_out_says_how_to_extend_it() -> None:
    agent = car.FunctionAgent(policy=ScriptedPolicy(["a"]), max_steps=3)
    with pytest.raises(PolicyError, match="extend the script"):
        car.record(agent, outcome=lambda r: 0.0)


def test_call_counter_records_the_step_of_each_call() -> None:
    counter = CallCounter(ScriptedPolicy({}, after="x"))
    agent = car.FunctionAgent(policy=counter, max_steps=3)
    car.record(agent, outcome=lambda r: 0.0)
    assert counter.steps == [0, 1, 2] and counter.calls == 3
    counter.reset()
    assert counter.calls == 0


# -- the conformance suite ------------------------------------------------------------------
@pytest.mark.parametrize("model", list(syn.catalogue().values()), ids=lambda m: m.name)
def test_function_agent_passes_the_conformance_suite(model: syn.SyntheticSCM) -> None:
    def make():
        c = count_calls(model.agent())
        return c.agent, c.both

    ran = run_conformance(make, context={"scm": model.name}, outcome=model.outcome, seed=1)
    assert ran == ["replay", "prefix", "lineage", "forced", "noise", "identity", "stop",
                   "coupling"]


class Reexecuting(car.FunctionAgent):
    """A broken agent: it ignores the held prefix and runs every branch from scratch."""

    def branch(self, run, plan, noise):
        return drive(self, dataclasses.replace(run, steps=()),
                     dataclasses.replace(plan, start=0), noise)


def test_conformance_catches_an_agent_that_re_executes_the_prefix(pivot_model,
                                                                   pivot_run) -> None:
    c = count_calls(pivot_model.agent())
    agent = Reexecuting(policy=c.policy, environment=c.environment, is_final=c.agent.is_final,
                        max_steps=6)
    with pytest.raises(ConformanceFailure, match="re-executed held step"):
        check_prefix_makes_no_calls(agent, pivot_run, c.both, steps=[3])
    with pytest.raises(ConformanceFailure, match="replay"):
        check_replay_reproduces(agent, pivot_run)


class IgnoresObservations(car.FunctionAgent):
    """A broken agent: forced observations are dropped."""

    def branch(self, run, plan, noise):
        return drive(self, run, dataclasses.replace(plan, forced_observations={}), noise)


def test_conformance_catches_an_agent_that_drops_forced_observations(pivot_model,
                                                                      pivot_run) -> None:
    base = pivot_model.agent()
    agent = IgnoresObservations(policy=base.policy, environment=base.environment,
                                is_final=base.is_final, max_steps=6)
    with pytest.raises(ConformanceFailure, match="did not replace the observation"):
        check_forced_values(agent, pivot_run)


class IgnoresForcedActions(car.FunctionAgent):
    """A broken agent: forced actions are dropped and the policy decides instead."""

    def branch(self, run, plan, noise):
        held = {k: a for k, a in plan.forced_actions.items() if k < plan.start}
        return drive(self, run, dataclasses.replace(plan, forced_actions=held), noise)


def test_conformance_catches_an_agent_that_drops_forced_actions(pivot_model, pivot_run) -> None:
    # The last step of the pivot run re-decides its recorded action under any noise (it copies
    # the pivot), so only forcing a different action can tell this agent from a working one.
    base = pivot_model.agent()
    agent = IgnoresForcedActions(policy=base.policy, environment=base.environment,
                                 is_final=base.is_final, max_steps=6)
    with pytest.raises(ConformanceFailure, match="did not put the forced action"):
        check_forced_values(agent, pivot_run)


def test_conformance_catches_an_agent_whose_noise_is_not_its_own() -> None:
    rng = np.random.default_rng(0)   # global state instead of the engine's noise
    agent = car.FunctionAgent(policy=lambda h, _: int(rng.integers(1000)), max_steps=3)
    run = car.record(agent, outcome=lambda r: 0.0)
    with pytest.raises(ConformanceFailure, match="same noise differ"):
        check_same_noise_same_branch(agent, run)


class EndsAtTheEditedStep(car.FunctionAgent):
    """A broken agent: a branch with a context edit stops after the held prefix, so the model
    never decides again and any edit looks like a rescue."""

    def branch(self, run, plan, noise):
        if not plan.context_edits:
            return super().branch(run, plan, noise)
        return drive(dataclasses.replace(self, max_steps=plan.start), run, plan, noise)


class OverridesEditedSteps(car.FunctionAgent):
    """A broken agent: an edited step is decided "good" whatever the policy would draw. Its
    noise is not coupled, so only the outcome distribution can give it away."""

    def branch(self, run, plan, noise):
        if not plan.context_edits:
            return super().branch(run, plan, noise)
        k, policy = min(plan.context_edits), self.policy
        good = {**run.steps[k].action, "choice": "good"}
        fixed = dataclasses.replace(
            self, policy=lambda h, rng: good if h.index == k else policy(h, rng))
        return drive(fixed, run, plan, noise)


def test_identity_check_catches_an_edited_branch_that_ends_at_the_prefix(pivot_model,
                                                                         pivot_run) -> None:
    base = pivot_model.agent()
    agent = EndsAtTheEditedStep(policy=base.policy, environment=base.environment,
                                is_final=base.is_final, max_steps=6, name=base.name)
    with pytest.raises(ConformanceFailure, match="no step 2 decided again"):
        check_identity_edit(agent, pivot_run, pivot_model.outcome, steps=[2], rollouts=4)


def test_identity_check_catches_an_edit_that_moves_the_outcome(pivot_model, pivot_run) -> None:
    # P(fail | do_resample(2)) = 0.3, P(fail | this agent's unchanged edit) = 0. Over 64
    # independent pairs about 19 differ (sd 3.7), all by -1: the sign-flip p-value is about
    # 2^(1 - m) for m differing pairs, below alpha = 1e-3 once m >= 11 (P(m < 11) < 0.01).
    base = pivot_model.agent()
    agent = OverridesEditedSteps(policy=base.policy, environment=base.environment,
                                 is_final=base.is_final, max_steps=6, couples_noise=False,
                                 name=base.name)
    with pytest.raises(ConformanceFailure, match="sign-flip p"):
        check_identity_edit(agent, pivot_run, pivot_model.outcome, steps=[2], rollouts=64)
    # the same check passes the working agent, coupled or not
    for coupled in (True, False):
        working = dataclasses.replace(base, couples_noise=coupled)
        check_identity_edit(working, pivot_run, pivot_model.outcome, steps=[2], rollouts=64)


def test_identity_check_compares_actions_under_shared_noise(pivot_model, pivot_run) -> None:
    """A coupled agent whose edited step draws other noise is caught by its actions, without
    statistics."""
    base = pivot_model.agent()

    class OtherNoise(car.FunctionAgent):
        def branch(self, run, plan, noise):
            if plan.context_edits:
                noise = Noise(noise.seed + 1000, noise.key)
            return super().branch(run, plan, noise)

    agent = OtherNoise(policy=base.policy, environment=base.environment,
                       is_final=base.is_final, max_steps=6, name=base.name)
    with pytest.raises(ConformanceFailure, match="under the same noise"):
        check_identity_edit(agent, pivot_run, pivot_model.outcome, steps=[0], rollouts=16)


def test_sign_flip_test_keeps_its_false_alarm_rate() -> None:
    # 2000 null data sets (two arms with one law, p = 0.4, 32 pairs) tested at alpha = 0.05:
    # the rejection rate is at most 0.05 (a permutation test is exact up to discreteness),
    # plus 3 standard errors of 2000 draws, 3 * sqrt(0.05 * 0.95 / 2000) = 0.015.
    rng = np.random.default_rng(0)
    rejected = 0
    for _ in range(2000):
        a, b = rng.random(32) < 0.4, rng.random(32) < 0.4
        rejected += _sign_flip_p(a.astype(float) - b, rng, flips=999) < 0.05
    assert rejected / 2000 <= 0.05 + 0.015
    assert _sign_flip_p([0.0] * 10, rng) == 1.0
    assert _sign_flip_p([-1.0] * 16, rng) < 1e-3  # 2^-15 exactly, up to the Monte Carlo floor


def test_the_ledger_catches_a_side_effect_run_on_a_branch(pivot_model) -> None:
    ledger = SideEffectLedger(["ack"])

    def make():
        base = pivot_model.agent()
        return dataclasses.replace(base, environment=ledger.wrap("ack", base.environment))

    with pytest.raises(ConformanceFailure, match=r"side-effects: the forced check's branches "
                                                 r"ran side-effect tool\(s\) \['ack'\]"):
        run_conformance(make, context={"scm": "pivot"}, outcome=pivot_model.outcome,
                        side_effects=ledger)
    assert ledger.calls and all(name == "ack" for name, _ in ledger.calls)


def test_a_ledger_that_counts_nothing_is_refused(pivot_model) -> None:
    with pytest.raises(InvalidInput, match="saw no call of \\['refund'\\]"):
        run_conformance(pivot_model.agent, context={"scm": "pivot"},
                        outcome=pivot_model.outcome, side_effects=SideEffectLedger(["refund"]))
    with pytest.raises(InvalidInput, match="not one of the ledger's tools"):
        SideEffectLedger(["refund"]).note("email")


def test_check_prefix_accepts_counters_that_cannot_tell_the_step(pivot_model,
                                                                  pivot_run) -> None:
    base = pivot_model.agent()
    blind = CallCounter(base.policy, step_of=lambda *a, **k: None)
    agent = dataclasses.replace(base, policy=blind)
    check_prefix_makes_no_calls(agent, pivot_run, Counters(blind), steps=[4], calls_per_step=1)
    assert blind.calls == 2   # steps 4 and 5


def test_drive_with_the_record_noise_reproduces_the_record(pivot_model, pivot_run) -> None:
    again = drive(pivot_model.agent(), dataclasses.replace(pivot_run, steps=()),
                  Plan(start=0), Noise(pivot_run.seed))
    assert [s.action for s in again.steps] == [s.action for s in pivot_run.steps]
    assert [s.observation for s in again.steps] == [s.observation for s in pivot_run.steps]


def test_a_context_edit_that_drops_a_step_is_applied_once(pivot_model, pivot_run) -> None:
    calls = []

    def forget_last(h: car.History) -> car.History:
        calls.append(h.index)
        return car.History(h.context, h.steps[:-1], h.index - 1)

    dist = branches(pivot_run, pivot_model.agent(), car.do_context(3, forget_last),
                    pivot_model.outcome, rollouts=2)
    assert calls == [3, 3]   # once per branch, not again when step 3 comes round
    for t in dist.trajectories:
        assert [(s.index, s.meta["origin"]) for s in t.steps] == [
            (0, "held"), (1, "held"), (2, "edited"), (3, "live"), (4, "live"), (5, "live")]


def test_intervene_says_failed_branches_apart_from_a_budget_that_ran_out() -> None:
    """Branches that raise are left out and said as such; the result is not "truncated" (the
    budget did not run out), which it once said whenever a branch failed."""
    m = syn.pivot()
    run = m.failing_run(0)

    def flaky(history: Any, rng: np.random.Generator) -> Any:
        if history.index == 2 and rng.random() < 0.06:  # the same noise on the retry
            raise RuntimeError("model server returned 500")
        return m.policy(history, rng)

    agent = car.FunctionAgent(policy=flaky, environment=m.environment,
                              is_final=lambda a: bool(a.get("final")), max_steps=m.n_steps,
                              name="synthetic:pivot")
    res = car.intervene(run, agent, car.do_resample(2), outcome=m.outcome, rollouts=64,
                        seed=0, progress=False)
    assert res.failures and len(res.failures) <= 6  # within the 10% an estimate leaves out
    assert res.n == 64 - len(res.failures) and not res.truncated
    said = str(res)
    assert f"; {len(res.failures)} failed branch(es) left out" in said
    assert "budget that ran out" not in said and "(truncated)" not in said
