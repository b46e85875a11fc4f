"""A tool a node reaches through a module (``tools.lookup.invoke(...)``, as the customer-support
tutorial's Part 3 does with ``A.fetch_user_flight_information``) is one of the graph's tools:
a user trial could not classify it ("not tools of this graph") although branches would run it.
"""

from __future__ import annotations

from car_adapters.langgraph import LangGraphAgent

import integrations_tests.langgraph.test_langgraph_node_calls as calls
from integrations_tests.langgraph.test_langgraph_node_calls import Notes, notes_app


def through_the_module(call: dict[str, object]) -> str:
    return str(calls.note_tool.invoke(call["args"]))


def test_a_tool_reached_through_a_module_is_found_and_classified() -> None:
    app = notes_app(Notes(), through_the_module)
    agent = LangGraphAgent(app, side_effect_tools=["save_note"])
    assert agent.tools == ["save_note"] and agent.safety.guards("save_note")
