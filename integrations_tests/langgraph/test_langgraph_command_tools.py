"""LangGraph: a side-effect tool that returned a ``Command`` writing graph state besides its tool
message is refused by name before any branch unless a simulator answers it.

A branch's call identical to a recorded one is answered from the record, which holds the tool
message only: the ``booked`` channel the tool wrote would be silently missing on the branch. The
app is the travel desk of ``test_langgraph_state_simulators`` (``book_flight`` writes ``booked``),
its model counting the calls it answers so a test sees that no branch ran.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import pytest
from car_adapters.langgraph import CarCallback, LangGraphAgent, final_state
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import InjectedState, ToolRuntime
from langgraph.types import Command

import car_core as car
from car_core.errors import AdapterError
from car_core.testing import SideEffectLedger
from integrations_tests.langgraph.test_langgraph_state_simulators import (
    DeskState,
    over_budget,
    simulate_booking,
)
from integrations_tests.support import final_state_apps as desk

CALLS: list[int] = []


class CountingDesk(desk.PlantedDesk):
    def _generate(self, messages: list[Any], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> Any:
        CALLS.append(1)
        return super()._generate(messages, stop, run_manager, **kwargs)


def record(ledger: SideEffectLedger, as_json: bool = True) -> tuple[Any, car.Trajectory]:
    """``as_json=False``: the tool writes ``booked`` as a set, which JSON cannot hold."""
    @tool
    def book_flight(flight: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Book a flight (spends money: a side effect)."""
        ledger.note("book_flight", {"flight": flight})
        return Command(update={"booked": flight if as_json else {flight}, "messages": [ToolMessage(
            json.dumps({"booked": flight, "price": desk.FARES[flight]}),
            tool_call_id=tool_call_id)]})

    app = create_agent(CountingDesk(), [desk.search_flights, book_flight],
                       state_schema=DeskState, checkpointer=InMemorySaver())
    cb = CarCallback()
    app.invoke(desk.inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    assert cb.run is not None and final_state(cb.run)["booked"] is not None
    assert not as_json or final_state(cb.run)["booked"] == "LX1"
    ledger.reset()
    CALLS.clear()
    return app, cb.run


@pytest.fixture
def ledger() -> SideEffectLedger:
    return SideEffectLedger(["book_flight"])


def test_the_record_names_the_tools_whose_command_wrote_state(ledger: SideEffectLedger) -> None:
    _, run = record(ledger)
    assert run.meta["state_writing_tools"] == ["book_flight"]
    [(cid, write)] = run.meta["state_writes"].items()
    assert write == {"tool": "book_flight", "update": {"booked": "LX1"},
                     "messages_key": "messages"}
    assert any(c["id"] == cid for s in run.steps for c in s.action.get("tool_calls") or ())
    plain = desk.build_app(desk.PlantedDesk(), InMemorySaver())
    cb = CarCallback()
    plain.invoke(desk.inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    assert cb.run is not None and "state_writing_tools" not in cb.run.meta


def test_an_identical_call_replays_the_recorded_state_write_without_a_simulator(
        ledger: SideEffectLedger) -> None:
    """The recorded booking action forced at its step: the branch's ``book_flight`` call is
    the recorded one, so the record answers it with its tool message and its ``booked`` write;
    the tool never runs."""
    app, run = record(ledger)
    agent = LangGraphAgent(app, safe_tools=["search_flights"], side_effect_tools=["book_flight"])
    [k] = [j for j, s in enumerate(run.steps)
           if any(c["function"]["name"] == "book_flight"
                  for c in s.action.get("tool_calls") or ())]
    dist = car.intervene(run, agent, car.do_action(k, run.steps[k].action),
                         outcome=over_budget, rollouts=1)
    assert dist.n == 1 and dist.mean == 1.0
    assert final_state(dist.trajectories[0])["booked"] == final_state(run)["booked"] == "LX1"
    assert ledger.count() == 0


def test_a_state_write_the_record_cannot_hold_as_json_is_refused_before_any_branch(
        ledger: SideEffectLedger) -> None:
    app, run = record(ledger, as_json=False)
    assert [w["update"] for w in run.meta["state_writes"].values()] == [None]
    agent = LangGraphAgent(app, safe_tools=["search_flights"], side_effect_tools=["book_flight"])
    for query in (lambda: car.intervene(run, agent, car.do_resample(0), outcome=over_budget,
                                        rollouts=2),
                  lambda: car.contrastive(run, agent, outcome=over_budget, rollouts=2)):
        with pytest.raises(AdapterError, match="'book_flight'") as refused:
            query()
        assert "simulators={'book_flight'" in (refused.value.hint or "")
        assert "safe_tools" in (refused.value.hint or "")
    assert CALLS == []   # no branch decided anything
    assert ledger.count() == 0


def test_with_a_simulator_the_identical_call_writes_state_again(ledger: SideEffectLedger) -> None:
    """From step 1 the planted model books LX1 again, the recorded call: the simulator, not the
    record, answers it, so the branch's ``booked`` channel holds the booking as the record's
    does."""
    app, run = record(ledger)
    agent = LangGraphAgent(app, safe_tools=["search_flights"], side_effect_tools=["book_flight"],
                           simulators={"book_flight": simulate_booking})
    dist = car.intervene(run, agent, car.do_resample(1), outcome=over_budget, rollouts=2)
    assert dist.n == 2 and dist.mean == 1.0
    for branch in dist.trajectories:
        assert final_state(branch)["booked"] == "LX1"
    assert CALLS and ledger.count() == 0


def test_a_simulator_that_cannot_write_the_state_is_refused_before_any_branch(
        ledger: SideEffectLedger) -> None:
    """An audit's refund tool wrote ``refunded`` with a ``Command`` and its simulator took the
    arguments only (``fn(arguments)``, the docs' usual form): every branch that refunded less
    got the simulator's text and no write, its outcome read the key as missing, and CAR said
    "no single step caused the failure" where the step rescued half. A state-writing tool's
    simulator must take ``ctx``, whether or not the record replays the identical call."""
    app, run = record(ledger)
    agent = LangGraphAgent(app, safe_tools=["search_flights"], side_effect_tools=["book_flight"],
                           simulators={"book_flight": lambda args: "booked"})
    with pytest.raises(AdapterError, match=r"the simulator of 'book_flight' takes only the "
                                           r"arguments") as refused:
        car.contrastive(run, agent, outcome=over_budget, rollouts=2)
    assert "fn(arguments, ctx)" in (refused.value.hint or "")
    assert CALLS == [] and ledger.count() == 0


def test_a_side_effect_tool_reading_graph_state_needs_a_simulator_that_sees_it() -> None:
    """An audit's refund tool refunded ``state["approved"]`` (``InjectedState``), its model
    arguments the same whatever was approved: a branch that approved 40 had its call answered
    from the record, "refunded 900", and CAR said "no single step caused the failure" where
    the approval step rescued half, also with ``match_on="exact"``. Such a tool is refused
    when wrapped unless its simulator takes ``ctx`` (the injected values are in it)."""
    @tool
    def issue_refund(order_id: str, state: Annotated[dict[str, Any], InjectedState]) -> str:
        """Refund the approved amount of an order (a side effect)."""
        return f"refunded {state.get('approved')} on {order_id}"

    app = create_agent(CountingDesk(), [desk.search_flights, issue_refund],
                       checkpointer=InMemorySaver())
    for given in ({}, {"simulators": {"issue_refund": lambda args: "refunded"}}):
        with pytest.raises(AdapterError, match=r"side-effect tool 'issue_refund' reads graph "
                                               r"state \(InjectedState 'state'\)") as refused:
            LangGraphAgent(app, safe_tools=["search_flights"],
                           side_effect_tools=["issue_refund"], **given)
        assert "fn(arguments, ctx)" in (refused.value.hint or "")
    LangGraphAgent(app, safe_tools=["search_flights"], side_effect_tools=["issue_refund"],
                   simulators={"issue_refund": lambda args, ctx: "refunded"})
    LangGraphAgent(app, safe_tools=["search_flights", "issue_refund"])  # runs live: it sees it


def test_a_side_effect_tool_reading_its_runtimes_state_needs_a_simulator_that_sees_it(
) -> None:
    """The same refund read through ``ToolRuntime`` (``runtime.state["approved"]``) was answered
    from the record by its model arguments alone, blind to the branch's state. A side-effect
    tool whose code reads its runtime's ``state`` is refused like an ``InjectedState`` one; one
    that reads only the runtime's ``context`` (which branches keep) is not."""
    @tool
    def issue_refund(order_id: str, runtime: ToolRuntime) -> str:
        """Refund the approved amount of an order (a side effect)."""
        return f"refunded {runtime.state.get('approved')} on {order_id}"

    @tool
    def send_receipt(order_id: str, runtime: ToolRuntime[dict[str, str]]) -> str:
        """Mail a receipt to the user the run is for (a side effect)."""
        return f"mailed {order_id} to {runtime.context['email']}"

    app = create_agent(CountingDesk(), [desk.search_flights, issue_refund, send_receipt],
                       checkpointer=InMemorySaver())
    with pytest.raises(AdapterError, match=r"side-effect tool 'issue_refund' reads graph "
                                           r"state \(ToolRuntime 'runtime', whose state it "
                                           r"reads\)") as refused:
        LangGraphAgent(app, safe_tools=["search_flights"],
                       side_effect_tools=["issue_refund", "send_receipt"])
    assert "fn(arguments, ctx)" in (refused.value.hint or "")
    LangGraphAgent(app, safe_tools=["search_flights"],
                   side_effect_tools=["issue_refund", "send_receipt"],
                   simulators={"issue_refund": lambda args, ctx: "refunded"})


def test_a_state_writing_tool_named_safe_is_not_refused(ledger: SideEffectLedger) -> None:
    app, run = record(ledger)
    agent = LangGraphAgent(app, safe_tools=["search_flights", "book_flight"])
    dist = car.intervene(run, agent, car.do_resample(1), outcome=over_budget, rollouts=1)
    assert dist.n == 1 and final_state(dist.trajectories[0])["booked"] == "LX1"
    assert ledger.count() == 1   # it ran live, as safe tools do
