"""What ``CarCallback`` keeps of a run when it converts each message once: the same record as a
conversion per step would make, byte for byte, and a message changed between model calls
recorded as each call saw it."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

import car_core as car


def _recorded(store: Any = None) -> tuple[CarCallback, car.Trajectory]:
    app = sa.build_app(sa.PlantedSupportModel(rng_seed=0), InMemorySaver())
    cb = CarCallback(store=store)
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    assert cb.run is not None
    return cb, cb.run


def test_steps_share_each_message_and_seal_as_separate_copies_would(tmp_path: Any) -> None:
    cb, run = _recorded(tmp_path / "runs.db")
    assert len(run.steps) >= 3
    first, later = run.steps[0].state, run.steps[-1].state
    assert later[0] is first[0]  # one dict per message, not one per step
    copied = car.Trajectory.new(
        context=copy.deepcopy(run.context), id=run.id, created_at=run.created_at,
        steps=[dataclasses.replace(copy.deepcopy(s), digest="") for s in run.steps],
        agent=run.agent, status=run.status, meta=copy.deepcopy(run.meta))
    assert copied.to_json() == run.to_json()
    with car.RunStore(tmp_path / "runs.db", readonly=True) as store:
        assert store.load(run.id).to_json() == run.to_json()


def test_a_message_changed_between_model_calls_is_recorded_as_each_call_saw_it() -> None:
    model = FakeListChatModel(responses=["first", "second"])

    def ask(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def edit_then_ask(state: MessagesState) -> dict[str, Any]:
        state["messages"][0].content = "edited in place"  # a node that rewrites history
        return ask(state)

    graph = StateGraph(MessagesState)
    graph.add_node("ask", ask)
    graph.add_node("edit_then_ask", edit_then_ask)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", "edit_then_ask")
    app = graph.compile(checkpointer=InMemorySaver())
    cb = CarCallback()
    app.invoke({"messages": [("user", "original")]},
               {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    run = cb.run
    assert run is not None and len(run.steps) == 2
    assert run.steps[0].state[0]["content"] == "original"
    assert run.steps[1].state[0]["content"] == "edited in place"
    assert run.meta["final_state"]["messages"][0]["content"] == "edited in place"
