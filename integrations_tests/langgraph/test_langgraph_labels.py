"""Who decided a step of a LangGraph run: the graph's own name when it was given one, else the
node that made the model call ("decided by LangGraph", the framework's default graph name,
would tell nothing); the recorded run and the imported thread agree."""

from __future__ import annotations

from typing import Any

import pytest
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, LangGraphAgent
from car_adapters.langgraph.step_meta import DEFAULT_GRAPH_NAME, agent_of
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.assertions import agent_of as agent_of_step
from car_core.model.trajectory import step_label


def support(name: str | None) -> Any:
    """The support graph compiled under ``name``; seed 3's first ticket refunds against
    policy."""
    return sa.build_app(sa.PlantedSupportModel(rng_seed=3), InMemorySaver(), name=name)


def record(app: Any) -> car.Trajectory:
    cb = CarCallback()
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "t1"}, "callbacks": [cb]})
    assert cb.run is not None and sa.outcome(cb.run)
    return cb.run


def test_the_default_graph_name_gives_way_to_the_node() -> None:
    assert agent_of(None, DEFAULT_GRAPH_NAME, "agent") == "agent"
    assert agent_of(None, "support_desk", "agent") == "support_desk"
    assert agent_of("", None, "agent") == "agent"
    assert agent_of("account_agent:1f3a", DEFAULT_GRAPH_NAME, "agent") == "account_agent"


@pytest.mark.parametrize(("name", "who"), [(None, "agent"), ("support_desk", "support_desk")])
def test_steps_are_labelled_by_the_graph_name_or_the_node(name: str | None, who: str) -> None:
    app = support(name)
    run = record(app)
    assert [s.meta["agent"] for s in run.steps] == [who] * len(run.steps)
    assert step_label(run, 1) == f"{who}, step 1 (its 2nd decision)"
    imported = LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS,
                              side_effect_tools=sa.SIDE_EFFECT_TOOLS).import_thread("t1")
    assert [s.meta["agent"] for s in imported.steps] == [who] * len(run.steps)
    assert agent_of_step(run, 1) == who  # what the plugin's headline says decided it
