"""OpenAI Agents SDK branches say where each tool result came from (``meta["tool_sources"]``,
by tool call id): the record, the user's simulator, a forced result, or the tool, run live;
held steps carry none, and the marks survive the store.

The scripted helpdesk reads the ticket (step 0, safe), grants mallory admin rights (step 1, a
side effect) and replies (step 2), the same way every time, so each source is reached
deterministically; a counter records the real calls.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from agents import Agent, Runner, function_tool, set_tracing_disabled
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel

import car_core as car
from car_core.contract import Origin, ToolSource
from car_core.store import RunStore

set_tracing_disabled(True)  # no trace export from tests (it would need an API key)
CALLS: Counter[str] = Counter()


@function_tool
def fetch_ticket() -> str:
    """Read the ticket."""
    CALLS["fetch_ticket"] += 1
    return "Printer broken."


@function_tool
def escalate(user: str) -> str:
    """Grant a user admin rights (a side effect)."""
    CALLS["escalate"] += 1
    return f"{user} is now admin"


def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    k = sum(1 for m in messages if m["role"] == "assistant")
    if k == 0:
        return assistant(None, [tool_call("call_0", "fetch_ticket", {})])
    if k == 1:
        return assistant(None, [tool_call("call_1", "escalate", {"user": "mallory"})])
    return "escalated"


def escalated(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "escalate" for s in run.steps
               for c in (s.action or {}).get("tool_calls") or ())


def stored(store: RunStore, dist: Any) -> car.Trajectory:
    branch = dist.trajectories[0]
    store.save(branch)
    return store.load(branch.id)


def ids(step: car.Step) -> list[str]:
    return [c["id"] for c in step.action["tool_calls"]]


def test_each_branch_tool_result_says_where_it_came_from(store: RunStore) -> None:
    app = Agent(name="Helpdesk", instructions="You are a helpdesk agent.",
                model=ScriptedModel(decide, seed=0), tools=[fetch_ticket, escalate])
    rec = CarRecorder()
    Runner.run_sync(app, "Please handle ticket 7.", hooks=rec)
    run = rec.run
    assert run is not None and escalated(run)
    agent = OpenAIAgentsAgent(app, safe_tools=["fetch_ticket"],
                              simulators={"escalate": lambda a: f"simulated {a['user']}"})
    CALLS.clear()

    # (a) step 1 decided again makes the identical recorded call: served from the record
    branch = stored(store, car.intervene(run, agent, car.do_resample(1), outcome=escalated,
                                         rollouts=1))
    assert [s.meta["origin"] for s in branch.steps[:2]] == [Origin.HELD, Origin.LIVE]
    assert "tool_sources" not in branch.steps[0].meta  # held: copied whole
    assert branch.steps[1].meta["tool_sources"] == {ids(branch.steps[1])[0]: ToolSource.RECORD}
    assert CALLS == Counter()

    # (b) a call the record cannot answer goes to the simulator
    other = assistant(None, [tool_call("call_1", "escalate", {"user": "eve"})])
    branch = stored(store, car.intervene(run, agent, car.do_action(1, other),
                                         outcome=escalated, rollouts=1))
    assert branch.steps[1].meta["tool_sources"] == {"call_1": ToolSource.SIMULATOR}
    assert branch.steps[1].observation[0]["content"] == "simulated eve"

    # (c) the safe read, decided again at step 0, runs live
    branch = stored(store, car.intervene(run, agent, car.do_resample(0), outcome=escalated,
                                         rollouts=1))
    assert branch.steps[0].meta["tool_sources"] == {ids(branch.steps[0])[0]: ToolSource.LIVE}
    assert branch.steps[1].meta["tool_sources"] == {ids(branch.steps[1])[0]: ToolSource.RECORD}
    assert CALLS == Counter({"fetch_ticket": 1})  # escalate never ran on a branch

    # a result do_observation gave is marked forced
    branch = stored(store, car.intervene(run, agent, car.do_observation(1, ["denied"]),
                                         outcome=escalated, rollouts=1))
    assert branch.steps[1].meta["tool_sources"] == {ids(branch.steps[1])[0]: ToolSource.FORCED}
