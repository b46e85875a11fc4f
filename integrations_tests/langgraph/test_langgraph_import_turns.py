"""A thread the app was invoked on several times (a conversation) is imported one turn at a
time, as ``CarCallback`` records each invocation. Imported whole, a branch of turn 1 ended
with turn 1 and never sent turn 2's message: a user trial's branches never reached turn 2's
refund and were scored as rescues, naming a turn-1 reply the cause with 100%."""

from __future__ import annotations

import pytest
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, LangGraphAgent
from langgraph.checkpoint.memory import InMemorySaver

from car_core.errors import AdapterError, InvalidInput

TURNS = ["Hi, I have a question about my order.",
         "It arrived broken. Can I get a refund?"]


def _conversation() -> tuple[LangGraphAgent, list[list[dict[str, object]]]]:
    """The support app invoked twice on one thread, each turn recorded by the callback."""
    app = sa.build_app(sa.PlantedSupportModel(rng_seed=3), InMemorySaver())
    cb = CarCallback()
    for text in TURNS:
        app.invoke(sa.inputs(text), {"configurable": {"thread_id": "chat"}, "callbacks": [cb]})
    agent = LangGraphAgent(app, safe_tools=list(sa.SAFE_TOOLS),
                           side_effect_tools=[t.name for t in sa.TOOLS
                                              if t.name not in sa.SAFE_TOOLS])
    return agent, [[s.action for s in run.steps] for run in cb.runs]


def test_a_thread_of_several_turns_is_refused_whole_and_named() -> None:
    agent, _ = _conversation()
    with pytest.raises(AdapterError, match="thread 'chat' holds 2 turns .* turn=-1"):
        agent.import_thread("chat")


def test_each_turn_imports_as_the_callback_recorded_that_invocation() -> None:
    agent, recorded = _conversation()
    assert len(recorded) == 2 and all(recorded)
    for turn in (0, 1, -1):
        run = agent.import_thread("chat", turn=turn)
        assert [s.action for s in run.steps] == recorded[turn]
    last = agent.import_thread("chat", turn=-1)
    said = [m["content"] for m in last.steps[0].state if m.get("role") == "user"]
    assert said == TURNS  # turn 1 is held as what the conversation already holds
    assert last.meta["final_state"]["messages"][-1]["role"] == "assistant"
    first = agent.import_thread("chat", turn=0)
    assert [m["content"] for m in first.meta["final_state"]["messages"]
            if m.get("role") == "user"] == TURNS[:1]  # that turn's own end, not the thread's
    with pytest.raises(InvalidInput, match="turn=2, but thread 'chat' holds 2 turn"):
        agent.import_thread("chat", turn=2)
