"""LangGraph: a simulator may return a state update as a tool can, and a side-effect tool's
recorded content blocks come back as blocks on a branch.

The travel desk of ``final_state_apps`` (search in content blocks at step 0, the planted
booking at step 1: the expensive flight with probability ``p_expensive``, a reply at step 2),
here with ``book_flight`` returning a ``Command`` that writes the booked flight into a state
channel of its own (``booked``) as well as answering the call, the way LangGraph tools update
state. The failure is read from that channel, so a branch fails only if its simulator wrote it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import pytest
from car_adapters.langgraph import CarCallback, LangGraphAgent, final_state
from langchain.agents import AgentState, create_agent
from langchain_core.messages import ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import car_core as car
from car_core.testing import SideEffectLedger
from integrations_tests.support import final_state_apps as desk

CHEAP = {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "book_flight", "arguments": '{"flight":"TP2"}'}}]}


class DeskState(AgentState[Any]):
    booked: str | None


def build(ledger: SideEffectLedger, p_expensive: float = 1.0) -> Any:
    @tool
    def book_flight(flight: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Book a flight (spends money: a side effect)."""
        ledger.note("book_flight", {"flight": flight})
        return Command(update={"booked": flight, "messages": [ToolMessage(
            json.dumps({"booked": flight, "price": desk.FARES[flight]}),
            tool_call_id=tool_call_id)]})

    return create_agent(desk.PlantedDesk(p_expensive=p_expensive),
                        [desk.search_flights, book_flight], state_schema=DeskState,
                        checkpointer=InMemorySaver())


def simulate_booking(arguments: dict[str, Any], ctx: dict[str, Any]) -> Command:
    """``book_flight`` without the booking: the same state update."""
    flight = arguments["flight"]
    return Command(update={"booked": flight, "messages": [ToolMessage(
        json.dumps({"booked": flight, "price": desk.FARES[flight]}),
        tool_call_id=ctx["tool_call_id"])]})


def over_budget(run: car.Trajectory) -> bool:
    booked = final_state(run).get("booked")
    return booked is not None and desk.FARES[booked] > desk.BUDGET


def record(app: Any) -> car.Trajectory:
    cb = CarCallback()
    app.invoke(desk.inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    assert cb.run is not None
    return cb.run


@pytest.fixture
def ledger() -> SideEffectLedger:
    return SideEffectLedger(["book_flight"])


def test_a_simulator_returns_a_state_update_as_the_tool_does(ledger: SideEffectLedger) -> None:
    app = build(ledger)
    run = record(app)
    assert final_state(run)["booked"] == "LX1" and over_budget(run)
    assert ledger.count() == 1
    ledger.reset()
    agent = LangGraphAgent(app, safe_tools=["search_flights"], side_effect_tools=["book_flight"],
                           simulators={"book_flight": simulate_booking})
    dist = car.intervene(run, agent, car.do_action(1, CHEAP), outcome=over_budget, rollouts=2)
    assert dist.n == 2 and dist.mean == 0.0
    for branch in dist.trajectories:
        assert final_state(branch)["booked"] == "TP2"   # the simulator's update reached state
        (answer,) = [m for m in final_state(branch)["messages"]
                     if isinstance(m, ToolMessage) and m.tool_call_id == "call_1"]
        assert json.loads(answer.content) == {"booked": "TP2", "price": 300}
    assert ledger.count() == 0


def test_an_async_simulator_is_awaited(ledger: SideEffectLedger) -> None:
    app = build(ledger)
    run = record(app)
    ledger.reset()

    async def simulate(arguments: dict[str, Any], ctx: dict[str, Any]) -> Command:
        return simulate_booking(arguments, ctx)

    agent = LangGraphAgent(app, safe_tools=["search_flights"], side_effect_tools=["book_flight"],
                           simulators={"book_flight": simulate})
    dist = car.intervene(run, agent, car.do_action(1, CHEAP), outcome=over_budget, rollouts=1)
    assert final_state(dist.trajectories[0])["booked"] == "TP2"
    assert ledger.count() == 0


def test_recorded_content_blocks_of_a_guarded_tool_come_back_as_blocks() -> None:
    """``search_flights`` (content blocks) guarded: the branch from step 0 makes the recorded
    call again and is answered from the record with the list of blocks the tool gave, so the
    app's rule reads them on the branch as on the record."""
    app = desk.build_app(desk.PlantedDesk(), InMemorySaver())
    cb = CarCallback()
    app.invoke(desk.inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    run = cb.run
    assert run is not None
    before = len(desk.BOOKINGS)
    agent = LangGraphAgent(app, side_effect_tools=["search_flights", "book_flight"],
                           simulators={"book_flight": desk.simulated_booking})
    dist = car.intervene(run, agent, car.do_resample(0), outcome=desk.outcome, rollouts=2)
    assert dist.n == 2 and dist.mean == 1.0
    for branch in dist.trajectories:
        state = final_state(branch)
        (search,) = [m for m in state["messages"]
                     if isinstance(m, ToolMessage) and m.name == "search_flights"]
        assert search.content == [{"type": "text", "text": "LX1 to Lisbon: 900 EUR"},
                                  {"type": "text", "text": "TP2 to Lisbon: 300 EUR"}]
        assert desk.quoted_fares(state) == ["LX1 to Lisbon: 900 EUR", "TP2 to Lisbon: 300 EUR"]
    assert len(desk.BOOKINGS) == before   # the recorded booking was answered from the record
