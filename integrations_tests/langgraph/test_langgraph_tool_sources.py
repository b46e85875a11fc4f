"""LangGraph branches say where each tool result came from (``meta["tool_sources"]``, by tool
call id): the record, the user's simulator, a forced result, or the tool, run live; held steps
carry none, and the marks survive the store.

The support app (``car_adapters.demo.support_agent``) looks the order up (step 0, safe), records
a decision (step 1, safe), issues the refund (step 2, a side effect) and replies (step 3) in its
failing run. Forcing step 2's action pins which call the branch makes, so each source is
reached deterministically; a ledger simulator counts the simulated calls.
"""

from __future__ import annotations

import json
from typing import Any

from car_adapters.common.messages import assistant, tool_call
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.contract import Origin, ToolSource, same_action
from car_core.store import RunStore

SIMULATED: list[dict[str, Any]] = []


def simulate_refund(arguments: dict[str, Any]) -> str:
    SIMULATED.append(arguments)
    return json.dumps({"simulated_refund": arguments["amount"]})


def failing_run(app: Any) -> car.Trajectory:
    cb = CarCallback()
    for i in range(50):  # p = 0.3 per ticket; the model is seeded, so this is deterministic
        app.invoke(sa.inputs(), {"configurable": {"thread_id": f"user-{i}"}, "callbacks": [cb]})
        if sa.outcome(cb.run):
            assert cb.run is not None
            return cb.run
    raise AssertionError("no failing run in 50 tickets")


def stored(store: RunStore, dist: Any) -> car.Trajectory:
    branch = dist.trajectories[0]
    store.save(branch)
    return store.load(branch.id)


def test_each_branch_tool_result_says_where_it_came_from(store: RunStore) -> None:
    wrapper = CarChatModel(inner=sa.PlantedSupportModel(rng_seed=0))
    app = sa.build_app(wrapper, InMemorySaver())
    run = failing_run(app)
    assert [c["function"]["name"] for c in run.steps[2].action["tool_calls"]] == ["issue_refund"]
    agent = LangGraphAgent(app, model=wrapper, safe_tools=sa.SAFE_TOOLS,
                           simulators={"issue_refund": simulate_refund})
    SIMULATED.clear()

    # (a) step 2 decided again makes the identical recorded refund: served from the record;
    # steps 0-1 are held, copied whole, so they carry no mark
    same = car.intervene(run, agent, car.do_resample(2), outcome=sa.outcome, rollouts=1)
    branch = stored(store, same)
    assert [s.meta["origin"] for s in branch.steps[:3]] == [Origin.HELD, Origin.HELD,
                                                           Origin.LIVE]
    assert same_action(branch.steps[2].action, run.steps[2].action)
    assert all("tool_sources" not in s.meta for s in branch.steps[:2])
    ids = [c["id"] for c in branch.steps[2].action["tool_calls"]]
    assert branch.steps[2].meta["tool_sources"] == {ids[0]: ToolSource.RECORD}
    assert branch.steps[2].observation[0]["content"] == run.steps[2].observation[0]["content"]
    assert SIMULATED == []

    # (b) a refund the record cannot answer goes to the simulator
    other = assistant(None, [tool_call("call_2", "issue_refund",
                                       {"order_id": sa.ORDER_ID, "amount": 10.0})])
    branch = stored(store, car.intervene(run, agent, car.do_action(2, other),
                                         outcome=sa.outcome, rollouts=1))
    assert branch.steps[2].meta["tool_sources"] == {"call_2": ToolSource.SIMULATOR}
    assert json.loads(branch.steps[2].observation[0]["content"]) == {"simulated_refund": 10.0}
    assert SIMULATED == [{"order_id": sa.ORDER_ID, "amount": 10.0}]

    # (c) the safe lookup, decided again at step 0, runs live
    branch = stored(store, car.intervene(run, agent, car.do_resample(0), outcome=sa.outcome,
                                         rollouts=1))
    first = branch.steps[0]
    assert first.meta["origin"] == Origin.LIVE
    assert first.meta["tool_sources"] == {c["id"]: ToolSource.LIVE
                                          for c in first.action["tool_calls"]}
    assert first.meta["tool_sources"]

    # a result do_observation gave is marked forced
    given = json.dumps({"recorded": "deny"})
    branch = stored(store, car.intervene(run, agent, car.do_observation(1, [given]),
                                         outcome=sa.outcome, rollouts=1))
    assert branch.steps[1].meta["tool_sources"] == {"call_1": ToolSource.FORCED}
