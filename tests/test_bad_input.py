"""Every bad input raises a car_core.errors type whose message says what to do, before any
model or tool is called and without touching what is stored."""

from __future__ import annotations

import dataclasses

import pytest

import car_core as car
from car_core.errors import (
    CarError,
    CorruptRun,
    EnvironmentError_,
    InvalidBudget,
    InvalidInput,
    InvalidIntervention,
    OutcomeError,
    PolicyError,
    RunNotFound,
    StepOutOfRange,
)
from car_core.testing import count_calls


def intervene(run, agent, items, outcome, **kw):
    return car.intervene(run, agent, items, outcome=outcome, rollouts=kw.pop("rollouts", 4),
                         progress=False, **kw)


def test_unknown_run_id(store) -> None:
    with pytest.raises(RunNotFound, match="list the stored runs") as info:
        store.load("no-such-run")
    assert isinstance(info.value, KeyError) and info.value.run_id == "no-such-run"


@pytest.mark.parametrize("make", [
    lambda: car.do_resample(6), lambda: car.do_action(17, "x"),
    lambda: car.do_observation(6, "x"), lambda: car.do_context(9, lambda h: h),
    lambda: car.do_policy(6, print),
])
def test_a_step_past_the_end(pivot_model, pivot_run, make) -> None:
    c = count_calls(pivot_model.agent())
    with pytest.raises(StepOutOfRange, match="intervene on a step between 0 and 5") as info:
        intervene(pivot_run, c.agent, make(), pivot_model.outcome)
    assert isinstance(info.value, IndexError)
    assert c.both.calls == 0


def test_do_observation_on_a_step_that_called_no_tool(pivot_model, pivot_run) -> None:
    last = len(pivot_run) - 1          # the final answer: no tool was called
    assert not pivot_run.steps[last].observed
    c = count_calls(pivot_model.agent())
    with pytest.raises(InvalidIntervention, match="intervene on a step that called a tool"):
        intervene(pivot_run, c.agent, car.do_observation(last, "x"), pivot_model.outcome)
    assert c.both.calls == 0


def test_a_corrupt_run_is_refused_before_anything_runs(store, pivot_model, pivot_run) -> None:
    steps = list(pivot_run.steps)
    steps[2] = dataclasses.replace(steps[2], action={**steps[2].action, "choice": "good"})
    edited = dataclasses.replace(pivot_run, steps=tuple(steps))
    c = count_calls(pivot_model.agent())
    with pytest.raises(CorruptRun, match="record it again") as info:
        intervene(edited, c.agent, car.do_resample(3), pivot_model.outcome)
    assert info.value.step == 2 and c.both.calls == 0
    with pytest.raises(CorruptRun):
        car.action_match_rate(edited, c.agent)
    with pytest.raises(CorruptRun):
        store.save(edited)
    assert store.runs(branches=True) == []


@pytest.mark.parametrize("outcome,phrase", [
    (lambda run: 1.5, "return a float in \\[0, 1\\] or a bool"),
    (lambda run: -0.1, "return a float in \\[0, 1\\] or a bool"),
    (lambda run: float("nan"), "return a float in \\[0, 1\\] or a bool"),
    (lambda run: "yes", "return a float in \\[0, 1\\] or a bool"),
    (lambda run: None, "return a float in \\[0, 1\\] or a bool"),
    (lambda run: 1 / 0, "fix the outcome function"),
    (lambda run, rng: run.steps[99], "fix the outcome function"),
])
def test_a_bad_outcome_function(store, pivot_model, pivot_run, outcome, phrase: str) -> None:
    with pytest.raises(OutcomeError, match=phrase):
        intervene(pivot_run, pivot_model.agent(), car.do_resample(2), outcome)
    with pytest.raises(OutcomeError, match=phrase):
        car.record(pivot_model.agent(), outcome=outcome, store=store)
    # the run that happened is kept whole and unscored (its side effects are done); nothing
    # half-recorded, and no branch, is stored
    [kept] = store.runs(branches=True)
    assert kept["outcome"] is None and kept["n_steps"] == len(pivot_run.steps)
    assert store.load(kept["id"]).outcome is None


def test_an_outcome_that_is_not_callable(pivot_model, pivot_run) -> None:
    with pytest.raises(InvalidInput, match="pass outcome=lambda run"):
        intervene(pivot_run, pivot_model.agent(), car.do_resample(2), 0.5)


@pytest.mark.parametrize("make,phrase", [
    (lambda: car.do_resample(-1), "steps are numbered from 0"),
    (lambda: car.do_action(-3, "x"), "steps are numbered from 0"),
    (lambda: car.do_resample("2"), "pass the index of the step"),
    (lambda: car.do_resample(True), "pass the index of the step"),
    (lambda: car.do_resample(2.0), "pass the index of the step"),
    (lambda: car.do_action(1, (1, 2)), "a tuple must become a list"),
    (lambda: car.do_action(1, {"at": object()}), "do_action payload is not a JSON value"),
    (lambda: car.do_observation(1, {1: "int key"}), "JSON objects only have string keys"),
    (lambda: car.do_observation(1, float("inf")), "use None or a string for NaN/inf"),
    (lambda: car.do_context(1, "not callable"), "pass a function that takes the state"),
    (lambda: car.do_policy(1, None), "pass the policy to swap in"),
])
def test_a_malformed_intervention(make, phrase: str) -> None:
    with pytest.raises(InvalidIntervention, match=phrase):
        make()


@pytest.mark.parametrize("rollouts", [0, -1, 1.5, True, "8"])
def test_fewer_than_one_rollout(pivot_model, pivot_run, rollouts) -> None:
    with pytest.raises(InvalidInput, match="pass rollouts=K with K >= 1"):
        intervene(pivot_run, pivot_model.agent(), car.do_resample(2), pivot_model.outcome,
                  rollouts=rollouts)


def test_fewer_than_one_replay(pivot_model, pivot_run) -> None:
    with pytest.raises(InvalidInput, match="pass replays >= 1"):
        car.action_match_rate(pivot_run, pivot_model.agent(), replays=0)


def test_something_that_is_not_a_run(pivot_model) -> None:
    with pytest.raises(InvalidInput, match="record one with car.record"):
        intervene({"steps": []}, pivot_model.agent(), car.do_resample(0), pivot_model.outcome)


@pytest.mark.parametrize("field,value", [("rollouts", 0), ("tokens", -5), ("cost", 0.0),
                                         ("wall_time", -1.0)])
def test_a_budget_that_cannot_pay_for_anything(field: str, value: float) -> None:
    with pytest.raises(InvalidBudget, match="positive value, or None"):
        car.Budget(**{field: value})


def test_a_function_agent_without_a_policy() -> None:
    with pytest.raises(InvalidInput, match="pass policy=lambda history, rng"):
        car.FunctionAgent(policy="not callable")
    with pytest.raises(InvalidInput, match="max_steps=0"):
        car.FunctionAgent(policy=lambda h, r: None, max_steps=0)
    for steps in (None, "3", 2.5, True):  # caught here, not as a TypeError in the first run
        with pytest.raises(InvalidInput, match="max_steps="):
            car.FunctionAgent(policy=lambda h, r: None, max_steps=steps)
    with pytest.raises(InvalidInput, match="is_final must be callable"):
        car.FunctionAgent(policy=lambda h, r: None, is_final=3)


def test_a_policy_that_raises_or_returns_garbage_names_its_step(pivot_model, pivot_run) -> None:
    def flaky(history, rng):
        if history.index == 4:
            raise RuntimeError("model down")
        return {"ok": True}

    # another agent than the run's on purpose: force_agent skips the recorded-agent check
    agent = car.FunctionAgent(policy=flaky, max_steps=6)
    with pytest.raises(PolicyError, match="fix the policy") as info:
        intervene(pivot_run, agent, car.do_resample(3), pivot_model.outcome, force_agent=True)
    assert info.value.step == 4
    agent = car.FunctionAgent(policy=lambda h, r: {"set": {1, 2}}, max_steps=6)
    with pytest.raises(PolicyError, match="a tuple must become a list") as info:
        intervene(pivot_run, agent, car.do_resample(3), pivot_model.outcome, force_agent=True)
    assert info.value.step == 3


def test_an_environment_that_raises_names_its_step() -> None:
    def tool(history, action, rng):
        raise TimeoutError("tool timed out")

    agent = car.FunctionAgent(policy=lambda h, r: "call", environment=tool, max_steps=2)
    with pytest.raises(EnvironmentError_, match="fix the environment") as info:
        car.record(agent, outcome=lambda r: 0.0)
    assert info.value.step == 0


def test_a_context_edit_that_returns_the_wrong_type(pivot_model, pivot_run) -> None:
    with pytest.raises(InvalidIntervention, match="takes and returns a car.History"):
        intervene(pivot_run, pivot_model.agent(), car.do_context(2, lambda h: [h]),
                  pivot_model.outcome)


def test_every_error_is_a_car_error() -> None:
    import car_core.errors as errors
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), CarError)


def test_a_context_edit_that_raises(pivot_model, pivot_run) -> None:
    def broken(h):
        raise KeyError("messages")

    with pytest.raises(InvalidIntervention, match="fix the edit") as info:
        intervene(pivot_run, pivot_model.agent(), car.do_context(2, broken), pivot_model.outcome)
    assert info.value.step == 2


def test_a_budget_that_stops_every_rollout(pivot_model, pivot_run) -> None:
    from car_core.errors import BudgetExhausted
    with pytest.raises(BudgetExhausted, match="raise the budget"):
        intervene(pivot_run, pivot_model.agent(), car.do_resample(2), pivot_model.outcome,
                  budget=car.Budget(wall_time=1e-12))


def test_an_agent_that_returns_something_other_than_a_trajectory(pivot_model,
                                                                   pivot_run) -> None:
    from car_core.errors import AgentError

    class Sloppy(car.FunctionAgent):
        def start(self, context, noise):
            return {"steps": []}

        def branch(self, run, plan, noise):
            return [s.action for s in run.steps]

    base = pivot_model.agent()
    agent = Sloppy(policy=base.policy, max_steps=6, name=base.name)
    with pytest.raises(AgentError, match="must return car.Trajectory"):
        car.record(agent, outcome=pivot_model.outcome)
    with pytest.raises(AgentError, match="must return car.Trajectory"):
        intervene(pivot_run, agent, car.do_resample(1), pivot_model.outcome)


@pytest.mark.parametrize("seed", [-1, 1.5, "0", None, True])
def test_a_seed_that_is_not_a_non_negative_integer(pivot_model, pivot_run, seed) -> None:
    c = count_calls(pivot_model.agent())
    with pytest.raises(InvalidInput, match="pass seed=0, 1, 2"):
        intervene(pivot_run, c.agent, car.do_resample(2), pivot_model.outcome, seed=seed)
    with pytest.raises(InvalidInput, match="pass seed=0, 1, 2"):
        car.record(c.agent, outcome=pivot_model.outcome, seed=seed)
    assert c.both.calls == 0


def test_a_numpy_integer_seed_is_accepted(pivot_model, pivot_run) -> None:
    import numpy as np
    run = car.record(pivot_model.agent(), outcome=pivot_model.outcome, seed=np.int64(3))
    assert run.seed == 3 and type(run.seed) is int


@pytest.mark.parametrize("level", [0.0, 1.0, 95])
def test_a_confidence_level_outside_zero_one_fails_before_any_rollout(pivot_model, pivot_run,
                                                                      level) -> None:
    c = count_calls(pivot_model.agent())
    with pytest.raises(InvalidInput, match="use e.g. 0.95"):
        intervene(pivot_run, c.agent, car.do_resample(2), pivot_model.outcome, level=level)
    assert c.both.calls == 0
