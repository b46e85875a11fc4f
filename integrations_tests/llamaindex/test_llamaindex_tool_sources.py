"""LlamaIndex branches say where each tool result came from (``meta["tool_sources"]``, by tool
call id): the record, the user's simulator, a forced result, or the tool, run live; held steps
carry none, and the marks survive the store.

The scripted agent looks order 42 up (step 0, safe), refunds it (step 1, a side effect) and
replies (step 2), the same way every time, so each source is reached deterministically; a
ledger counts the real calls.
"""

from __future__ import annotations

import asyncio
from typing import Any

from car_adapters.common.messages import assistant, tool_call
from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, ScriptedLLM
from llama_index.core.agent.workflow import FunctionAgent

import car_core as car
from car_core.contract import Origin, ToolSource
from car_core.store import RunStore

CALLS: dict[str, int] = {}


def lookup_order(order_id: str) -> str:
    """Look an order up."""
    CALLS["lookup_order"] = CALLS.get("lookup_order", 0) + 1
    return f"order {order_id}: shipped"


def issue_refund(order_id: str) -> str:
    """Refund an order."""
    CALLS["issue_refund"] = CALLS.get("issue_refund", 0) + 1
    return f"refunded {order_id}"


def decide(messages: list[dict[str, Any]], names: list[str], rng: Any) -> Any:
    k = sum(1 for m in messages if m["role"] == "assistant")
    if k == 0:
        return assistant(None, [tool_call("c0", "lookup_order", {"order_id": "42"})])
    if k == 1:
        return assistant(None, [tool_call("c1", "issue_refund", {"order_id": "42"})])
    return "Refunded."


def refunded(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "issue_refund" for s in run.steps
               for c in (s.action or {}).get("tool_calls") or ())


def recorded(agent: FunctionAgent) -> car.Trajectory:
    rec = CarRecorder().attach()
    try:
        async def main() -> None:
            await agent.run(user_msg="Refund order 42")
        asyncio.run(main())
    finally:
        rec.detach()
    assert rec.run is not None
    return rec.run


def stored(store: RunStore, dist: Any) -> car.Trajectory:
    branch = dist.trajectories[0]
    store.save(branch)
    return store.load(branch.id)


def ids(step: car.Step) -> list[str]:
    return [c["id"] for c in step.action["tool_calls"]]


def test_each_branch_tool_result_says_where_it_came_from(store: RunStore) -> None:
    app = FunctionAgent(tools=[lookup_order, issue_refund], llm=ScriptedLLM(decide))
    run = recorded(app)
    assert [len(s.action.get("tool_calls") or ()) for s in run.steps] == [1, 1, 0]
    agent = LlamaIndexAgent(app, safe_tools=["lookup_order"],
                            simulators={"issue_refund": lambda a: f"simulated {a['order_id']}"})
    CALLS.clear()

    # (a) step 1 decided again makes the identical recorded call: served from the record
    branch = stored(store, car.intervene(run, agent, car.do_resample(1), outcome=refunded,
                                         rollouts=1))
    assert [s.meta["origin"] for s in branch.steps[:2]] == [Origin.HELD, Origin.LIVE]
    assert "tool_sources" not in branch.steps[0].meta  # held: copied whole
    assert branch.steps[1].meta["tool_sources"] == {ids(branch.steps[1])[0]: ToolSource.RECORD}
    assert "tool_sources" not in branch.steps[2].meta  # the reply called no tool
    assert CALLS == {}

    # (b) a refund the record cannot answer goes to the simulator
    other = assistant(None, [tool_call("c1", "issue_refund", {"order_id": "7"})])
    branch = stored(store, car.intervene(run, agent, car.do_action(1, other), outcome=refunded,
                                         rollouts=1))
    assert branch.steps[1].meta["tool_sources"] == {"c1": ToolSource.SIMULATOR}
    assert branch.steps[1].observation[0]["content"] == "simulated 7"

    # (c) the safe lookup, decided again at step 0, runs live
    branch = stored(store, car.intervene(run, agent, car.do_resample(0), outcome=refunded,
                                         rollouts=1))
    assert branch.steps[0].meta["tool_sources"] == {ids(branch.steps[0])[0]: ToolSource.LIVE}
    assert branch.steps[1].meta["tool_sources"] == {ids(branch.steps[1])[0]: ToolSource.RECORD}
    assert CALLS == {"lookup_order": 1}  # the refund never ran on a branch

    # a result do_observation gave is marked forced
    branch = stored(store, car.intervene(run, agent, car.do_observation(1, ["refund failed"]),
                                         outcome=refunded, rollouts=1))
    assert branch.steps[1].meta["tool_sources"] == {ids(branch.steps[1])[0]: ToolSource.FORCED}
