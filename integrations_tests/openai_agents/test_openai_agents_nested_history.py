"""A run recorded with ``RunConfig(nest_handoff_history=True)`` is attributed only with that run
config: the SDK hands the agent after a handoff a summary of the conversation instead of its
items, and an agent built without it branches on the raw history. A user trial that left
``run_config=`` out got an earlier step named as a cause it was not, with no warning."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel

import car_core as car
from car_core.errors import AdapterError

NESTED = RunConfig(nest_handoff_history=True)
SEEN: list[list[str]] = []  # the roles the refunds agent's calls saw


@function_tool
def lookup_order(order_id: str) -> str:
    """Look an order up (reads only)."""
    return "kettle, 40 EUR"


def triage(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
    if not any(m["role"] == "tool" for m in messages):
        return assistant(None, [tool_call("c0", "lookup_order", {"order_id": "7"})])
    return assistant(None, [tool_call("c1", "transfer_to_refunds", {})])


def refunds(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
    SEEN.append([m["role"] for m in messages])
    return "refund of 40 EUR approved"


def app() -> Agent[Any]:
    desk = Agent(name="refunds", model=ScriptedModel(refunds))
    return Agent(name="triage", model=ScriptedModel(triage), tools=[lookup_order],
                 handoffs=[desk])


def test_a_run_recorded_with_nested_handoff_history_needs_that_run_config() -> None:
    rec = CarRecorder()
    Runner.run_sync(app(), "refund order 7", hooks=rec, run_config=NESTED)
    run = rec.run
    recorded = SEEN[-1]
    assert "tool" not in recorded  # the refunds agent saw the summary, not the tool items
    with pytest.raises(AdapterError, match=r"nested handoff history .* run_config"):
        car.intervene(run, OpenAIAgentsAgent(app(), safe_tools=["lookup_order"]),
                      car.do_resample(1), outcome=lambda r: 1.0, rollouts=2)
    SEEN.clear()
    car.intervene(run, OpenAIAgentsAgent(app(), run_config=NESTED, safe_tools=["lookup_order"]),
                  car.do_resample(1), outcome=lambda r: 1.0, rollouts=2)
    assert SEEN and all(roles == recorded for roles in SEEN)  # branches see what it saw
