"""A framework's own agent passed where CAR wants its wrapper is refused by name, before any
branch, with the wrapper to use. A trial passed an OpenAI Agents SDK ``Agent`` to
``car.contrastive``: it was refused as "recorded with another agent", and with
``force_agent=True`` every branch failed on a missing ``branch``."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent
from car_adapters.llamaindex import ScriptedLLM
from langgraph.graph import END, START, StateGraph
from llama_index.core.agent.workflow import FunctionAgent as LlamaFunctionAgent
from llama_index.core.tools import FunctionTool
from typing_extensions import TypedDict

import car_core as car
from car_core.errors import InvalidInput
from car_core.testing import synthetic as syn


class State(TypedDict):
    n: int


def _graph() -> Any:
    g = StateGraph(State)
    g.add_node("step", lambda s: {"n": s["n"] + 1})
    g.add_edge(START, "step")
    g.add_edge("step", END)
    return g.compile()


def _lookup(order_id: str) -> str:
    """Look an order up."""
    return order_id


UNWRAPPED = {
    "OpenAIAgentsAgent(agent": lambda: Agent(name="triage", instructions="help"),
    "LangGraphAgent(app": _graph,
    "LlamaIndexAgent(workflow": lambda: LlamaFunctionAgent(
        tools=[FunctionTool.from_defaults(_lookup)], llm=ScriptedLLM([])),
}


@pytest.mark.parametrize("wrapper", sorted(UNWRAPPED))
@pytest.mark.parametrize("force", [False, True])
def test_a_framework_agent_passed_as_it_is_is_refused_with_its_wrapper(wrapper: str,
                                                                       force: bool) -> None:
    m = syn.pivot()
    run = m.failing_run(0)
    calls: list[Any] = []

    def outcome(r: car.Trajectory) -> float:
        calls.append(r)
        return m.outcome(r)

    with pytest.raises(InvalidInput) as err:
        car.contrastive(run, UNWRAPPED[wrapper](), outcome=outcome, rollouts=4,
                        force_agent=force, progress=False)
    assert "not a CAR agent" in str(err.value)
    assert wrapper in err.value.hint and err.value.hint.startswith("wrap it: from car_adapters")
    assert not calls  # refused before the record was even scored, let alone a branch


def test_an_object_of_no_framework_is_told_what_an_agent_is() -> None:
    run = syn.pivot().failing_run(0)
    with pytest.raises(InvalidInput) as err:
        car.intervene(run, object(), [car.do_resample(1)], outcome=lambda r: 1.0, rollouts=2)
    assert "builtins.object, not a CAR agent" in str(err.value)
    assert "car.FunctionAgent" in err.value.hint
