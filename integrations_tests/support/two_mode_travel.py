"""A travel desk whose planted model fails in two modes, as a ReAct agent and as a supervisor
with two workers: the population the LangGraph triage and population-fix tests are run on.

The travel policy allows economy only; the failure is a booked business fare. The traveller's
request decides the mode:

- ``RUSHED`` ("urgent"): the decision whether to read the policy skips it with probability
  ``p_skip`` (never while a system message says ``FIX``); whoever books then has no policy in
  view and books business. Reading it, the fare is economy for sure.
- ``COMFORT`` ("a long flight"): the policy is always read, and the booking decision picks
  business anyway with probability ``p_business``, whatever the system messages say.

So a failing run commits at the policy decision in the first mode (rescue ``1 − p_skip``) and
at the booking in the second (rescue ``1 − p_business``), every other step being fixed by what
it sees. ``book_flight`` charges a card (a side effect: written to ``BOOKED``); reading the
policy and searching fares only read. One model class serves every role, which it tells
apart by the tools bound to it, as ``car_adapters.demo.supervisor_app``'s does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from car_adapters.demo.planted import SeededChatModel
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

RUSHED = "URGENT: book me the next flight to Lisbon, no time to waste."
COMFORT = "Book me a flight to Tokyo; it is a long flight, so make it comfortable."
MODES = {"rushed": RUSHED, "comfort": COMFORT}
POLICY = "Travel policy: economy fares only, for every trip."
FIX = "Always read the travel policy before you search for fares."
ECONOMY, BUSINESS = "economy", "business"
BOOKED: list[dict[str, Any]] = []  # the ledger: every real book_flight call
SAFE_TOOLS = ["read_policy", "search_fares"]
SIDE_EFFECT_TOOLS = ["book_flight"]


@tool
def read_policy(topic: str) -> str:
    """Read the company's travel policy (reads only)."""
    return POLICY


@tool
def search_fares(destination: str) -> str:
    """The fares to a destination (reads only)."""
    return json.dumps([{"fare": ECONOMY, "price": 420}, {"fare": BUSINESS, "price": 2900}])


@tool
def book_flight(fare: str) -> str:
    """Book a fare and charge the traveller's card (a side effect)."""
    BOOKED.append({"fare": fare})
    return json.dumps({"booked": fare, "charged": True})


def simulators() -> dict[str, Any]:
    """What a branch's bookings answer that the record cannot: no card is charged."""
    return {"book_flight": lambda a: json.dumps({"booked": a["fare"], "charged": False})}


class TwoModeTravelModel(SeededChatModel):
    """The planted model of the module docstring, for the ReAct desk and every role of the
    supervisor app (told apart by the tools bound)."""

    p_skip: float = 0.3
    p_business: float = 0.2
    model_name: str = "planted-two-mode-travel"

    @property
    def _llm_type(self) -> str:
        return "planted-two-mode-travel"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        names = [getattr(t, "name", None) or getattr(t, "__name__", str(t)) for t in tools]
        return self.bind(tools=[{"type": "function", "function": {"name": n}} for n in names],
                         **kwargs)

    def decide(self, messages: Sequence[BaseMessage], tools: Sequence[str]) -> AIMessage:
        done = [m.name for m in messages if isinstance(m, ToolMessage)]
        cid = f"call-{len(messages)}-{'-'.join(sorted(tools))[:16]}"
        text = " ".join(str(m.content) for m in messages)
        if "transfer_to_policy_agent" in tools:  # the supervisor
            for worker in ("policy_agent", "booking_agent"):
                if f"transfer_to_{worker}" not in done:
                    return _call(cid, f"transfer_to_{worker}", {})
            return AIMessage("All done.")
        if "read_policy" in tools and "read_policy" not in done and "search_fares" not in done \
                and "No policy" not in text:
            if self._skips(messages):  # the policy decision: rushed runs may skip it
                if "search_fares" in tools:
                    return _call(cid, "search_fares", {"destination": "LIS"})
                return AIMessage("No policy applies; book whatever suits.")
            return _call(cid, "read_policy", {"topic": "flights"})
        if "book_flight" not in tools:  # the policy worker, having read it
            return AIMessage(f"Policy says: {POLICY}")
        if "search_fares" not in done:
            return _call(cid, "search_fares", {"destination": _destination(messages)})
        if "book_flight" not in done:  # the booking decision
            seen = POLICY in text
            business = not seen or (COMFORT in text and self._draw() < self.p_business)
            return _call(cid, "book_flight", {"fare": BUSINESS if business else ECONOMY})
        return AIMessage("Booked.")

    def _skips(self, messages: Sequence[BaseMessage]) -> bool:
        rushed = any(RUSHED in str(m.content) for m in messages if m.type == "human")
        told = any(FIX in str(m.content) for m in messages if m.type == "system")
        u = self._draw()  # drawn in both modes, so the noise streams stay aligned
        return rushed and not told and u < self.p_skip

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        names = [t["function"]["name"] for t in kwargs.get("tools") or ()]
        return ChatResult(generations=[ChatGeneration(message=self.decide(messages, names))])


def _call(cid: str, name: str, args: dict[str, Any]) -> AIMessage:
    return AIMessage("", tool_calls=[{"id": cid, "name": name, "args": args}])


def _destination(messages: Sequence[BaseMessage]) -> str:
    return "NRT" if any(COMFORT in str(m.content) for m in messages) else "LIS"


def react_desk(model: Any, checkpointer: Any, middleware: Sequence[Any] = ()) -> Any:
    """The single-agent desk: ``create_agent`` (named ``travel_desk``) with the three tools."""
    return create_agent(model, [read_policy, search_fares, book_flight], name="travel_desk",
                        middleware=list(middleware), checkpointer=checkpointer)


def supervisor_desk(model: Any, checkpointer: Any) -> Any:
    """A ``langgraph_supervisor`` app over a policy worker and a booking worker."""
    from langgraph_supervisor import create_supervisor
    policy = create_agent(model, [read_policy], name="policy_agent",
                          system_prompt="You look up the travel policy and report it.")
    booking = create_agent(model, [search_fares, book_flight], name="booking_agent",
                           system_prompt="You book flights within the travel policy.")
    return create_supervisor([policy, booking], model=model,
                             prompt="Route to policy_agent, then booking_agent."
                             ).compile(checkpointer=checkpointer)


def inputs(mode: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": MODES[mode]}]}


def mode_of(run: Any) -> str:
    """The mode a recorded run was asked in (its first user message)."""
    first = json.dumps(run.context)
    return "rushed" if "URGENT" in first else "comfort"


def booked_business(run: Any) -> bool:
    """The failure: a business fare booked, against the policy."""
    return any(c["function"]["name"] == "book_flight"
               and json.loads(c["function"]["arguments"]).get("fare") == BUSINESS
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())
