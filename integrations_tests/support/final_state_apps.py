"""A ``create_agent`` travel desk whose business rule reads the app's own objects, for the
``final_state`` tests (imported by them, and by ``car attribute --agent/--outcome`` in a
subprocess).

The desk searches flights (step 0: the tool answers in content blocks), books one (step 1: the
planted choice, the expensive flight with probability ``p_expensive``) and confirms (step 2).
The failure, over budget, is decided at step 1 and nowhere else:

    P(fail | step 1 re-drawn) = p_expensive        P(fail | step 1 as recorded, expensive) = 1
"""

from __future__ import annotations

import json
import os
import sqlite3
from typing import Any

from car_adapters.demo.planted import SeededChatModel
from car_adapters.langgraph import LangGraphAgent, final_state
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

FARES = {"LX1": 900, "TP2": 300}
BUDGET = 500
REQUEST = "Fly me to Lisbon."
BOOKINGS: list[str] = []  # every real booking made in this process


@tool
def search_flights(city: str) -> list[dict[str, Any]]:
    """The flights to ``city`` with their fares, one text block per flight."""
    return [{"type": "text", "text": f"{flight} to {city}: {fare} EUR"}
            for flight, fare in FARES.items()]


@tool
def book_flight(flight: str) -> str:
    """Book a flight (spends money: a side effect)."""
    BOOKINGS.append(flight)
    return json.dumps({"booked": flight, "price": FARES[flight]})


def simulated_booking(args: dict[str, Any]) -> str:
    """What ``book_flight`` answers, without booking: the branches' simulator."""
    return json.dumps({"booked": args["flight"], "price": FARES[args["flight"]]})


class PlantedDesk(SeededChatModel):
    """Deterministic but for the booking (step 1): the expensive flight with probability
    ``p_expensive``."""

    p_expensive: float = 1.0

    @property
    def _llm_type(self) -> str:
        return "planted-desk"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[Any], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        decided = sum(isinstance(m, AIMessage) for m in messages)
        if decided == 0:
            msg = AIMessage("", tool_calls=[{"id": "call_0", "name": "search_flights",
                                             "args": {"city": "Lisbon"}}])
        elif decided == 1:
            flight = "LX1" if self._draw() < self.p_expensive else "TP2"
            msg = AIMessage("", tool_calls=[{"id": "call_1", "name": "book_flight",
                                             "args": {"flight": flight}}])
        else:
            msg = AIMessage("Booked, have a good trip.")
        return ChatResult(generations=[ChatGeneration(message=msg)])


def build_app(model: Any, checkpointer: Any) -> Any:
    return create_agent(model, [search_flights, book_flight], checkpointer=checkpointer)


def inputs() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": REQUEST}]}


# -- the app's own business rules: they read LangChain message objects ---------------------------
def over_budget(state: dict[str, Any]) -> bool:
    """The failure: the bookings in the graph state cost more than the budget."""
    spent = sum(json.loads(m.content)["price"] for m in state["messages"]
                if isinstance(m, ToolMessage) and m.name == "book_flight")
    return spent > BUDGET


def quoted_fares(state: dict[str, Any]) -> list[str]:
    """The text blocks of every flight search in the graph state."""
    return [block["text"] for m in state["messages"]
            if isinstance(m, ToolMessage) and m.name == "search_flights"
            for block in m.content]


def outcome(run: Any) -> bool:
    """``over_budget`` over the app's own final state: CAR's outcome for this app."""
    return over_budget(final_state(run))


# -- for ``car attribute --agent final_state_apps:make`` in another process ---------------------
CHECKPOINTS = "CAR_FINAL_STATE_CHECKPOINTS"  # the SQLite checkpoint file the run was recorded in


def sqlite_app(path: str, p_expensive: float) -> Any:
    from langgraph.checkpoint.sqlite import SqliteSaver
    saver = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    return build_app(PlantedDesk(p_expensive=p_expensive), saver)


def make() -> LangGraphAgent:
    """The desk whose booking is expensive one time in five, over the recorded checkpoints."""
    return LangGraphAgent(sqlite_app(os.environ[CHECKPOINTS], 0.2),
                          safe_tools=["search_flights"], side_effect_tools=["book_flight"],
                          simulators={"book_flight": simulated_booking})
