"""The per-step view of a plan a LangGraph branch reads (``car_adapters.langgraph.plan``): what
it says about each step matches the ``Plan`` it was read from."""

from __future__ import annotations

from typing import Any

import pytest
from car_adapters.langgraph.plan import BranchPlan, tool_content

import car_core as car
from car_core.contract import Origin
from car_core.model.interventions import compile_plan

CALL = {"role": "assistant", "content": "",
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "lookup", "arguments": "{}"}}]}


@pytest.fixture(scope="module")
def run() -> car.Trajectory:
    agent = car.FunctionAgent(policy=lambda history, rng: CALL,
                              environment=lambda history, action, rng: "found", max_steps=5)
    return car.record(agent, context="go", outcome=lambda t: 1.0, seed=0)


def test_a_plan_read_per_step_keeps_what_each_step_is_given(run: car.Trajectory) -> None:
    def edit(messages: Any) -> Any:
        return messages

    plan = compile_plan(run, [car.do_resample(1), car.do_context(3, edit),
                              car.do_observation(1, "at the branch step"),
                              car.do_observation(4, {"raw": 1})])
    view = BranchPlan.of(plan)
    assert view.start == 1 and view.edit is None and view.edits_later
    assert dict(view.observations) == {1: "at the branch step", 4: {"raw": 1}}
    assert dict(view.later_observations) == {4: {"raw": 1}}
    # a forced result at a later step holds that step's recorded action: CAR must decide it
    assert dict(view.actions) == dict(plan.forced_actions) and 4 in view.actions
    assert view.needs_control and not view.changes_start
    assert [view.origin(j) for j in range(5)] == [plan.origin(j) for j in range(5)]
    assert view.origin(3) == Origin.EDITED


def test_a_later_forced_action_needs_car_to_decide_the_model_calls(run: car.Trajectory) -> None:
    view = BranchPlan.of(compile_plan(run, [car.do_resample(1), car.do_action(3, CALL)]))
    assert view.needs_control and not view.changes_start
    at_start = BranchPlan.of(compile_plan(run, car.do_action(2, CALL)))
    assert at_start.changes_start and not at_start.needs_control


def test_forced_results_record_what_the_graph_got_and_other_values_as_given(
        run: car.Trajectory) -> None:
    view = BranchPlan.of(compile_plan(run, [car.do_observation(1, ["text"]),
                                            car.do_observation(2, {"raw": 1})]))
    got = [{"role": "tool", "tool_call_id": "c1", "content": "text"}]
    assert view.recorded_observation(1, got) == got  # strings: the results the graph got
    assert view.recorded_observation(2, got) == {"raw": 1}  # anything else: exactly as given
    assert view.recorded_observation(3, got) == got  # not forced
    assert tool_content(None, {"raw": 1}) == '{"raw": 1}'
    assert tool_content("given", {"raw": 1}) == "given"
