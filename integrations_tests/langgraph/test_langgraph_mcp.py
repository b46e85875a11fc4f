"""A LangGraph app whose tools are served by a real MCP server is attributed, and no branch
reaches the server's side effects.

The server (``mcp_travel_server.py``, FastMCP over stdio) is started by langchain-mcp-adapters'
client for every tool session, as LangChain's docs show; its tools load as ``StructuredTool``s
with only a coroutine, so the app runs only under ``ainvoke`` and a branch must too. The app is
``create_agent`` with the planted travel model (``car_adapters.demo.travel_desk``): step 1 books
the over-budget flex fare with probability ``p_flex`` = 0.25, so in a failing run
rescue(1) = 0.75 and every later step's rescue is 0: the locus is step 1. ``book_flight`` and
``send_itinerary`` append to a ledger file on the server: branches add no line.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from car_adapters.demo import travel_desk as td
from car_adapters.langgraph import CarCallback, CarMiddleware, LangGraphAgent
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.engine.execution import Sequential
from car_core.errors import BranchesFailed

SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_travel_server.py"


def lines(ledger: Path) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines()]


def travel_app(ledger: Path, model: td.TravelModel | None = None
               ) -> tuple[Any, CarMiddleware, list[Any]]:
    client = MultiServerMCPClient({"travel": {"command": sys.executable,
                                              "args": [str(SERVER), str(ledger)],
                                              "transport": "stdio"}})
    tools = asyncio.run(client.get_tools())
    mw = CarMiddleware()
    app = create_agent(model or td.TravelModel(rng_seed=0), tools, middleware=[mw],
                       checkpointer=InMemorySaver())
    return app, mw, tools


def record_failure(app: Any) -> car.Trajectory:
    cb = CarCallback()

    async def ticket(i: int) -> None:
        await app.ainvoke(td.inputs(), {"configurable": {"thread_id": f"trip-{i}"},
                                        "callbacks": [cb]})

    for i in range(40):  # p_flex = 0.25: no failure in 40 tries has probability 1e-5
        asyncio.run(ticket(i))
        assert cb.run is not None
        if td.booked_flex(cb.run):
            return cb.run
    raise AssertionError("the planted model never booked the flex fare")


def test_mcp_tools_are_async_only_and_annotated(tmp_path: Path) -> None:
    _, _, tools = travel_app(tmp_path / "ledger.jsonl")
    by_name = {t.name: t for t in tools}
    assert sorted(by_name) == ["book_flight", "search_fares", "send_itinerary"]
    assert all(t.func is None and t.coroutine is not None for t in tools)
    assert (by_name["search_fares"].metadata or {}).get("readOnlyHint") is True
    assert not (by_name["book_flight"].metadata or {}).get("readOnlyHint")


def test_an_app_on_an_mcp_server_is_attributed_with_no_side_effect_on_branches(
        tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    app, mw, _ = travel_app(ledger)
    run = record_failure(app)
    recorded = lines(ledger)
    assert recorded[-2:] == [{"tool": "book_flight", "fare_id": td.FLEX},
                             {"tool": "send_itinerary", "booking_id": f"BK-{td.FLEX}"}]
    agent = LangGraphAgent(app, model=mw, side_effect_tools=list(td.SIDE_EFFECT_TOOLS),
                           safe_tools=list(td.SAFE_TOOLS), simulators=td.simulators())
    assert agent.is_async and not agent.prefers_concurrency  # in-process model: sequential
    res = car.contrastive(run, agent, outcome=td.booked_flex, rollouts=16, seed=0,
                          progress=False)
    assert res.locus == 1, res
    assert lines(ledger) == recorded  # no branch booked or mailed anything
    # a branch re-running step 0 calls the read-only search on the server, live
    dist = car.intervene(run, agent, car.do_resample(0), outcome=td.booked_flex, rollouts=2,
                         seed=0, progress=False)
    assert all("TP-saver" in str(t.steps[0].observation) for t in dist.trajectories)
    assert lines(ledger) == recorded


NOTES = itertools.count()


class RewordsAndGivesUp(td.TravelModel):
    """The planted travel model, booking the flex fare every time (so no step's rescue is above
    0), which words a new note on every search (no branch's search is the record's call) and,
    told the search failed, apologises instead of booking: a scored branch would count that as
    a rescue of the search."""

    p_flex: float = 1.0

    def decide(self, messages: Sequence[BaseMessage]) -> AIMessage:
        last = messages[-1] if messages else None
        if isinstance(last, ToolMessage) and last.status == "error":
            return AIMessage("Sorry, the fare search failed; please try again later.")
        msg = super().decide(messages)
        for c in msg.tool_calls:
            if c["name"] == "search_fares":
                c["args"] = {**c["args"], "reason": f"search #{next(NOTES)}"}
        return msg


@pytest.mark.parametrize(("mode", "why"), [
    # every other call fails: the branch's call fails, and answers when run again
    ("flaky", "and answered the same call when CAR ran it again"),
    # every call fails: the record's answered call fails too when run again
    ("gone", "and the record's answered call of it (arguments "),
])
def test_a_read_only_mcp_tools_error_that_is_not_the_calls_own_is_never_scored(
        tmp_path: Path, mode: str, why: str) -> None:
    """A user trial's read-only MCP tool failed now and then on branches, for re-worded
    arguments the record never used, and CAR took each error for the agent's doing: the
    agent's apology read as a rescue of the search ("step 0 caused the failure: 27%", where no
    step did). CAR now runs the call again, and the record's call: an error that goes away, or
    that the record's call now gets too, is the tool's world, and the branch is not scored."""
    ledger = tmp_path / "ledger.jsonl"
    app, mw, _ = travel_app(ledger, RewordsAndGivesUp(rng_seed=0))
    run = record_failure(app)
    recorded = lines(ledger)
    agent = LangGraphAgent(app, model=mw, side_effect_tools=list(td.SIDE_EFFECT_TOOLS),
                           safe_tools=list(td.SAFE_TOOLS), simulators=td.simulators())
    Path(f"{ledger}.{mode}").write_text("", encoding="utf-8")
    with pytest.raises(BranchesFailed) as info:
        car.contrastive(run, agent, outcome=td.booked_flex, rollouts=16, seed=0,
                        search="full", executor=Sequential(), progress=False)
    failures = info.value.failures
    # only the branches that re-decide the search call it live
    assert failures and all(f.task.plan.start == 0 for f in failures)
    assert all("safe tool 'search_fares' ran live at step 0" in f.error and why in f.error
               for f in failures), failures[0].error
    assert lines(ledger) == recorded  # the re-runs are of the read-only search alone
