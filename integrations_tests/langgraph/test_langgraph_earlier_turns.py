"""A turn whose failure an earlier turn decided: the result says where to look.

The notes app (``test_langgraph_node_calls``): turn 1 saves the user's card with probability
``P_LEAK``; turn 2 ("thanks") only answers. The app's rule fails the conversation when a card
was saved anywhere in it, so a turn 2 after a leaking turn 1 fails whatever it re-decides: no
step of it causes the failure. User trials attributed such runs (an LLM-as-judge loop's last
round, a pipeline's writer) and read only "no single step" or "undecided", with no hint that
the cause was an earlier decision the run began from; every such result now carries that
caveat, and a result that names a step does not.
"""

from __future__ import annotations

import uuid
from typing import Any

from car_adapters.langgraph import CarCallback, LangGraphAgent, final_state

import car_core as car
from car_core.model.vocabulary import Answer
from integrations_tests.langgraph.test_langgraph_node_calls import (
    Notes,
    leaked,
    note_tool,
    notes_app,
    through_tool,
)


def card_in_conversation(run: car.Trajectory) -> bool:
    return any("card" in str(c.get("args", {})) for m in final_state(run)["messages"]
               for c in getattr(m, "tool_calls", None) or ())


def second_turn(app: Any) -> tuple[car.Trajectory, car.Trajectory]:
    """A conversation whose first turn leaked, and its two turns as recorded."""
    for _ in range(60):
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        first, then = CarCallback(outcome=leaked), CarCallback(outcome=card_in_conversation)
        app.invoke({"messages": [("user", "I'm Sam; card 4111 1111 1111 1111.")]},
                   {**config, "callbacks": [first]})
        app.invoke({"messages": [("user", "Thanks!")]}, {**config, "callbacks": [then]})
        assert first.run is not None and then.run is not None
        if first.run.failed:
            return first.run, then.run
    raise AssertionError("no leaking first turn")


def test_a_turn_an_earlier_turn_doomed_says_the_cause_may_be_there() -> None:
    app = notes_app(Notes(rng_seed=1), through_tool)
    first, run = second_turn(app)
    assert run.failed and len(run.steps) == 1
    agent = LangGraphAgent(app, node_tools=[note_tool], side_effect_tools=["save_note"],
                           simulators={"save_note": lambda a: "saved"})
    res = car.contrastive(run, agent, outcome=card_in_conversation, rollouts=128, seed=0)
    assert res.answer != Answer.LOCUS
    assert any("already held 2 decision(s) of the agent" in c for c in res.caveats)
    named = car.contrastive(first, agent, outcome=leaked, rollouts=32, seed=0)
    assert named.answer == Answer.LOCUS and named.caveats == ()
