"""A travel desk on ``create_agent``: a planted stochastic model, a read-only fare search and two
tools with side effects (a booking that charges a card, an e-mailed itinerary).

The traveller asks for the cheapest flight to Lisbon. ``TravelModel`` searches the fares (step
0), books one (step 1), e-mails the itinerary of that booking (step 2) and answers (step 3). Its
one random choice is at the booking: the refundable "flex" fare (over the traveller's budget:
the failure) with probability ``p_flex``, else the cheapest fare. So, for a failing run,

    P(fail | factual) = 1    P(fail | do_resample(1)) = p_flex    rescue(1) = 1 - p_flex

and every later step only carries out what step 1 decided (rescue 0): step 1 is the point of
commitment. The tools come either as plain LangChain tools (``sync_tools``) or from the MCP
server ``integrations_tests/support/mcp_travel_server.py``; both write one line per side effect
to a ledger file. ``latency_s`` makes every model call wait as a hosted model does
(``asyncio.sleep`` on the async path, ``time.sleep`` on the sync one) and ``remote`` says so to CAR.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, tool
from pydantic import PrivateAttr

from .planted import SeededChatModel

REQUEST = "Book me the cheapest flight to Lisbon (LIS) and e-mail me the itinerary."
FLEX, SAVER = "TP-flex", "TP-saver"
FARES = {"LIS": [{"fare_id": SAVER, "price": 89, "refundable": False},
                 {"fare_id": FLEX, "price": 412, "refundable": True}]}
SIDE_EFFECT_TOOLS = ("book_flight", "send_itinerary")
SAFE_TOOLS = ("search_fares",)


class _Calls:
    """A thread-safe count of real model calls, shared by a model and its per-step copies."""

    def __init__(self) -> None:
        self.n = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self.n += 1


class TravelModel(SeededChatModel):
    """The planted travel agent (see the module docstring). ``calls`` counts the real calls,
    shared with the copies CAR makes to set a per-step seed."""

    p_flex: float = 0.25
    latency_s: float = 0.0
    remote: bool = False  # True: CAR treats it as a model behind a server (it waits like one)
    model_name: str = "planted-travel"
    _count: _Calls = PrivateAttr(default_factory=_Calls)

    @property
    def calls(self) -> int:
        return self._count.n

    @property
    def _llm_type(self) -> str:
        return "planted-travel"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(**kwargs)

    def decide(self, messages: Sequence[BaseMessage]) -> AIMessage:
        ai = [m for m in messages if isinstance(m, AIMessage)]
        call_id = f"call_{len(ai)}"
        if not ai:
            return AIMessage("", tool_calls=[{"id": call_id, "name": "search_fares",
                                              "args": {"destination": "LIS"}}])
        if len(ai) == 1:
            fare = FLEX if self._draw() < self.p_flex else SAVER
            return AIMessage("", tool_calls=[{"id": call_id, "name": "book_flight",
                                              "args": {"fare_id": fare}}])
        if len(ai) == 2:
            fare = ai[1].tool_calls[0]["args"]["fare_id"]
            return AIMessage("", tool_calls=[{"id": call_id, "name": "send_itinerary",
                                              "args": {"booking_id": f"BK-{fare}"}}])
        sent = [m for m in messages if isinstance(m, ToolMessage)]
        return AIMessage(f"Booked and sent ({len(sent)} tool results).")

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self._count.add()
        if self.latency_s:
            time.sleep(self.latency_s)
        return ChatResult(generations=[ChatGeneration(message=self.decide(messages))])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self._count.add()
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return ChatResult(generations=[ChatGeneration(message=self.decide(messages))])


def booked_flex(run: Any) -> bool:
    """The failure: the run booked the flex fare, over the traveller's budget."""
    return any(c["function"]["name"] == "book_flight"
               and json.loads(c["function"]["arguments"]).get("fare_id") == FLEX
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())


def simulators() -> dict[str, Any]:
    """What a branch's side-effect calls answer that the record cannot: no card is charged and
    no mail leaves."""
    return {"book_flight": lambda a: json.dumps({"booking_id": f"BK-{a['fare_id']}",
                                                 "charged": False, "simulated": True}),
            "send_itinerary": lambda a: json.dumps({"sent": a["booking_id"],
                                                    "simulated": True})}


def sync_tools(ledger: Path) -> list[BaseTool]:
    """The three tools as plain LangChain tools, side effects written to ``ledger``."""
    def note(kind: str, **fields: Any) -> None:
        with ledger.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"tool": kind, **fields}) + "\n")

    @tool
    def search_fares(destination: str) -> str:
        """The fares to a destination airport, cheapest first (reads only)."""
        return json.dumps(FARES.get(destination, []))

    @tool
    def book_flight(fare_id: str) -> str:
        """Book a fare and charge the traveller's card (a side effect)."""
        note("book_flight", fare_id=fare_id)
        return json.dumps({"booking_id": f"BK-{fare_id}", "charged": True})

    @tool
    def send_itinerary(booking_id: str) -> str:
        """E-mail the itinerary of a booking to the traveller (a side effect)."""
        note("send_itinerary", booking_id=booking_id)
        return json.dumps({"sent": booking_id})

    return [search_fares, book_flight, send_itinerary]


def inputs() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": REQUEST}]}


__all__ = ["FLEX", "SAFE_TOOLS", "SAVER", "SIDE_EFFECT_TOOLS", "TravelModel", "booked_flex",
           "inputs", "simulators", "sync_tools"]
