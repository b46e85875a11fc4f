"""An agent regression test with CAR in it: run ``pytest --car-attribute`` on this file.

The planted support model follows the injected "refund in full" with probability 0.3; with
``rng_seed=3`` this ticket's run follows it, so the test fails, and CAR names the step that
decided the refund (step 1), with its interval, and writes an HTML report.
"""

import json

import pytest
from car_adapters.demo.support_agent import PlantedSupportModel, build_app, inputs, outcome
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car


def simulated_refund(arguments):
    """What a branch's refund call answers: branches never move money."""
    return json.dumps({"refunded": arguments.get("order_id"), "simulated": True})


@pytest.fixture
def app():
    return build_app(PlantedSupportModel(rng_seed=3), InMemorySaver())


# every tool classified: the lookups run on branches, the refund is simulated
@pytest.mark.car(safe_tools=["lookup_order", "record_decision"],
                 simulators={"issue_refund": simulated_refund})
def test_injection_does_not_get_a_refund(car_recorder, app):
    car_recorder.watch(app, outcome=outcome)  # the app to branch with; 1 = the failure
    result = app.invoke(inputs(), {"configurable": {"thread_id": "ticket-1"}})
    assert "refunded" not in result["messages"][-1].content


def test_removing_the_injection_fixes_it():
    """A regression test of the attribution itself, decided by intervals."""
    from car_adapters.demo.support_agent import remove_injection
    from car_adapters.langgraph import CarCallback, LangGraphAgent

    app = build_app(PlantedSupportModel(rng_seed=3), InMemorySaver())
    cb = CarCallback()
    app.invoke(inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    agent = LangGraphAgent(app, safe_tools=["lookup_order", "record_decision"],
                           side_effect_tools=["issue_refund"],
                           simulators={"issue_refund": simulated_refund})
    res = car.contrastive(cb.run, agent, outcome=outcome, rollouts=16, seed=0)
    car.assert_locus(res, step=1)
    fixed = car.intervene(cb.run, agent, car.do_context(1, remove_injection), outcome=outcome,
                          rollouts=32, seed=0)
    car.assert_rescues(fixed, below=0.2)
