"""Tools served over MCP are classified by their server's annotations, with nothing named.

The server is a real FastMCP server over stdio (``mcp_travel_server.py``, started by
langchain-mcp-adapters' client for each tool session): ``search_fares`` is annotated
``readOnlyHint: true``; ``book_flight`` and ``send_itinerary`` carry no annotations and write one
ledger line per real call. So ``LangGraphAgent(app)`` with no tool list runs the search live on
branches and never the other two, as the MCP specification's defaults say (a tool may modify its
environment unless annotated read-only). The same three tools as plain LangChain tools, even
with the same metadata, are not MCP tools: nothing classifies them, so the agent is refused.
The planted travel model (``car_adapters.demo.travel_desk``): step 0 searches, step 1 books the
over-budget flex fare with probability 0.25 (the failure), step 2 e-mails that booking, step 3
answers.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from car_adapters.common.messages import SAFE, SIDE_EFFECT
from car_adapters.demo import travel_desk as td
from car_adapters.langgraph import CarCallback, CarMiddleware, LangGraphAgent
from car_adapters.langgraph.tool_classes import mcp_tool_class
from langchain.agents import create_agent
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import convert_mcp_tool_to_langchain_tool
from langgraph.checkpoint.memory import InMemorySaver
from mcp.types import Tool, ToolAnnotations

import car_core as car
from car_core.errors import UnclassifiedTools

SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_travel_server.py"


def ledger_lines(ledger: Path) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines()]


def mcp_app(ledger: Path) -> tuple[Any, CarMiddleware]:
    client = MultiServerMCPClient({"travel": {"command": sys.executable,
                                              "args": [str(SERVER), str(ledger)],
                                              "transport": "stdio"}})
    tools = asyncio.run(client.get_tools())
    mw = CarMiddleware()
    return create_agent(td.TravelModel(rng_seed=0), tools, middleware=[mw],
                        checkpointer=InMemorySaver()), mw


def failing_run(app: Any) -> car.Trajectory:
    cb = CarCallback()
    for i in range(40):  # p_flex = 0.25: no failure in 40 tries has probability 1e-5
        asyncio.run(app.ainvoke(td.inputs(), {"configurable": {"thread_id": f"trip-{i}"},
                                              "callbacks": [cb]}))
        assert cb.run is not None
        if td.booked_flex(cb.run):
            return cb.run
    raise AssertionError("the planted model never booked the flex fare")


def test_a_real_servers_annotations_classify_its_tools_and_no_branch_books(
        tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    app, mw = mcp_app(ledger)
    run = failing_run(app)
    recorded = ledger_lines(ledger)
    assert recorded[-2:] == [{"tool": "book_flight", "fare_id": td.FLEX},
                             {"tool": "send_itinerary", "booking_id": f"BK-{td.FLEX}"}]
    agent = LangGraphAgent(app, model=mw)  # no tool named: the server's annotations decide
    assert agent.safety.safe_tools == {"search_fares"}
    assert agent.safety.side_effect_tools == {"book_flight", "send_itinerary"}
    assert "readOnlyHint=true" in agent.safety.derived["search_fares"]
    assert "no annotations" in agent.safety.derived["book_flight"]
    # branches from the e-mail step repeat the recorded call: answered, never sent again
    dist = car.intervene(run, agent, car.do_resample(2), outcome=td.booked_flex, rollouts=4,
                         seed=0, progress=False)
    assert dist.mean == 1.0 and dist.caveats == ()
    assert all(t.steps[2].observation == run.steps[2].observation for t in dist.trajectories)
    assert ledger_lines(ledger) == recorded
    # from step 0 the search (safe by its annotation) runs live on the server; the bookings
    # and e-mails the branches make are simulated
    simulated = LangGraphAgent(app, model=mw, simulators=td.simulators())
    dist = car.intervene(run, simulated, car.do_resample(0), outcome=td.booked_flex,
                         rollouts=4, seed=0, progress=False)
    assert all(td.SAVER in str(t.steps[0].observation) for t in dist.trajectories)
    assert ledger_lines(ledger) == recorded  # no branch booked or mailed anything


def test_plain_tools_with_the_same_metadata_are_not_taken_for_mcp_tools(tmp_path: Path) -> None:
    tools = td.sync_tools(tmp_path / "ledger.jsonl")
    tools[0].metadata = {"readOnlyHint": True}  # a plain tool claiming what MCP would say
    app = create_agent(td.TravelModel(rng_seed=0), tools, checkpointer=InMemorySaver())
    with pytest.raises(UnclassifiedTools) as err:
        LangGraphAgent(app)
    assert err.value.tools == ("book_flight", "search_fares", "send_itinerary")
    assert all(mcp_tool_class(t) is None for t in tools)


def test_the_users_lists_win_over_the_servers_annotations(tmp_path: Path) -> None:
    app, mw = mcp_app(tmp_path / "ledger.jsonl")
    agent = LangGraphAgent(app, model=mw, safe_tools=["send_itinerary"],
                           side_effect_tools=["search_fares"])
    assert agent.safety.safe_tools == {"send_itinerary"}
    assert agent.safety.side_effect_tools == {"search_fares", "book_flight"}
    assert set(agent.safety.derived) == {"book_flight"}


@pytest.mark.parametrize(("annotations", "kind"), [
    (ToolAnnotations(readOnlyHint=True), SAFE),
    (ToolAnnotations(readOnlyHint=True, openWorldHint=True), SAFE),
    (ToolAnnotations(readOnlyHint=False), SIDE_EFFECT),
    (ToolAnnotations(destructiveHint=False, idempotentHint=True), SIDE_EFFECT),
    (ToolAnnotations(title="Lookup"), SIDE_EFFECT),
    (None, SIDE_EFFECT),
])
def test_the_adapters_conversion_keeps_what_the_server_said(annotations: Any, kind: str) -> None:
    """Tools converted the adapter's way from the server's tool list (never called: the
    connection is not opened): read-only only when ``readOnlyHint`` is true."""
    server_tool = Tool(name="t", inputSchema={"type": "object", "properties": {}},
                       annotations=annotations)
    tool = convert_mcp_tool_to_langchain_tool(
        None, server_tool, connection={"transport": "stdio", "command": sys.executable,
                                       "args": [str(SERVER), "unused"]})
    said = mcp_tool_class(tool)
    assert said is not None and said.kind == kind, said
