"""An OpenAI Agents SDK app whose tools come from a real MCP server (``Agent(mcp_servers=...)``)
is attributed with no tool named, and no branch reaches the server's side effects.

The server (``mcp_travel_server.py``, FastMCP over stdio) is connected by the user, as the SDK
shows (``async with MCPServerStdio(...) as server``), and stays connected while CAR attributes;
the estimator runs off the server's loop (``asyncio.to_thread``). ``search_fares`` is annotated
``readOnlyHint: true`` (safe: it runs live on branches); ``book_flight`` and ``send_itinerary``
carry no annotations, so, as the MCP specification defaults, they are side effects: each real
call appends a line to the server's ledger, and branches add none.

The planted model: step 0 searches; step 1 books the over-budget flex fare with probability
``P_FLEX`` = 0.25, else asks the traveller about the saver fare and stops; step 2 e-mails the
booking it got back; step 3 reports. A failing run (flex booked) has rescue(1) = 1 - 0.25 =
0.75 and rescue 0 at every later step (the booking is held), so the locus is step 1. A branch
either books the flex fare again, the identical call, answered from the record, or books
nothing, so no simulator is needed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from agents import (
    Agent,
    HostedMCPTool,
    Runner,
    StopAtTools,
    function_tool,
    set_tracing_disabled,
)
from agents.mcp import MCPServerStdio, create_static_tool_filter
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel, final_state

import car_core as car
from car_core.engine.execution import Sequential
from car_core.errors import AdapterError, AgentMismatch, BranchesFailed

set_tracing_disabled(True)  # no trace export from tests (it would need an API key)

SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_travel_server.py"
ROOT = Path(__file__).resolve().parents[2]
P_FLEX = 0.25
FLEX, SAVER = "TP-flex", "TP-saver"
ROLLOUTS = 16


def lines(ledger: Path) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines()]


def server(ledger: Path, **kw: Any) -> MCPServerStdio:
    return MCPServerStdio(params={"command": sys.executable, "args": [str(SERVER), str(ledger)]},
                          name="travel", **kw)


def call(name: str, args: dict[str, Any], cid: str) -> dict[str, Any]:
    return assistant(None, [tool_call(cid, name, args)])


def decide(messages: list[dict[str, Any]], tools: list[str], rng: np.random.Generator) -> Any:
    k = sum(1 for m in messages if m["role"] == "assistant")
    if k == 0:
        return call("search_fares", {"destination": "LIS"}, "call_search")
    if k == 1:
        if rng.random() < P_FLEX:
            return call("book_flight", {"fare_id": FLEX}, "call_book")
        return f"{FLEX} is over your budget; shall I book {SAVER} instead?"
    if k == 2:
        booked = json.loads(str(messages[-1]["content"]))  # what the server answered
        return call("send_itinerary", {"booking_id": booked["booking_id"]}, "call_mail")
    return "Booked and sent."


def booked_flex(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "book_flight" and FLEX in c["function"]["arguments"]
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())


def travel_agent(*servers: MCPServerStdio, seed: int = 0) -> Agent[Any]:
    return Agent(name="travel_desk", instructions="Book the cheapest fare within budget.",
                 model=ScriptedModel(decide, seed=seed), mcp_servers=list(servers))


async def record_failure(agent: Agent[Any]) -> car.Trajectory:
    rec = CarRecorder()
    for _ in range(40):  # P_FLEX = 0.25: no failure in 40 tries has probability 1e-5
        await Runner.run(agent, "A flight to Lisbon under 150, please.", hooks=rec)
        if booked_flex(rec.run):
            return rec.run
    raise AssertionError("the planted model never booked the flex fare")


def connected(ledger: Path, body: Callable[[MCPServerStdio], Awaitable[None]]) -> None:
    async def main() -> None:
        async with server(ledger) as s:
            await body(s)
    asyncio.run(main())


def test_mcp_tools_are_classified_from_their_annotations_and_branches_write_nothing(
        tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"

    async def body(s: MCPServerStdio) -> None:
        agent = travel_agent(s)
        run = await record_failure(agent)
        recorded = lines(ledger)
        assert recorded[-2:] == [{"tool": "book_flight", "fare_id": FLEX},
                                 {"tool": "send_itinerary", "booking_id": f"BK-{FLEX}"}]
        assert run.meta["tools"] == {"travel_desk": ["book_flight", "search_fares",
                                                     "send_itinerary"]}
        wrapped = OpenAIAgentsAgent(agent)  # no tool named: the server's annotations classify
        # built on the servers' loop, the wrapper lists them only when the loop is free
        res = await asyncio.to_thread(car.contrastive, run, wrapped, outcome=booked_flex,
                                      rollouts=ROLLOUTS, seed=0, progress=False)
        assert wrapped.safety.safe_tools == {"search_fares"}
        # unannotated, and named by no one: a side effect, not refused
        assert wrapped.safety.side_effect_tools == {"book_flight", "send_itinerary"}
        assert "readOnlyHint=true" in wrapped.safety.derived["search_fares"]
        assert "no annotations" in wrapped.safety.derived["book_flight"]
        assert wrapped.caveats == ()
        assert res.locus == 1, res
        assert lines(ledger) == recorded  # no branch booked or mailed anything
        # a branch from step 0 runs the read-only search on the server, live, and the
        # identical booking and e-mail that follow it get their recorded results
        dist = await asyncio.to_thread(car.intervene, run, wrapped, car.do_resample(0),
                                       outcome=booked_flex, rollouts=4, seed=0, progress=False)
        assert all(SAVER in str(t.steps[0].observation) for t in dist.trajectories)
        assert lines(ledger) == recorded
        # the estimator called on the servers' own loop would wait forever: refused
        with pytest.raises(AdapterError, match="to_thread"):
            car.intervene(run, OpenAIAgentsAgent(agent), car.do_resample(2),
                          outcome=booked_flex, rollouts=1, seed=0, progress=False)

    connected(ledger, body)


def test_a_read_only_mcp_tool_flagging_an_error_on_branches_is_never_scored(
        tmp_path: Path) -> None:
    """A server sends a failed call back as a result flagged ``isError``, which the SDK hands the
    model as ordinary output: with the fares service down where CAR runs, every branch that
    re-decides the search was told of an error where the record got fares, and its reply to
    that error was scored (a user trial read an 83% rescue of a lookup whose rescue is 0). Such
    a branch is a failure; a record made while the service was down too is scored."""
    ledger = tmp_path / "ledger.jsonl"
    down = Path(f"{ledger}.down")

    async def body(s: MCPServerStdio) -> None:
        agent = travel_agent(s)
        run = await record_failure(agent)
        recorded = lines(ledger)
        wrapped = OpenAIAgentsAgent(agent)
        down.touch()
        with pytest.raises(BranchesFailed, match="safe tool 'search_fares' ran live at step 0 "
                                                 "and returned an error") as info:
            await asyncio.to_thread(car.contrastive, run, wrapped, outcome=booked_flex,
                                    rollouts=ROLLOUTS, seed=0, search="full", progress=False)
        assert all(f.task.plan.start == 0 for f in info.value.failures)
        assert all("isError" in f.error and "fares service unavailable" in f.error
                   for f in info.value.failures)
        assert lines(ledger) == recorded
        # recorded while the service was down: the branches' identical error is no drift
        rec = CarRecorder()
        await Runner.run(agent, "A flight to Lisbon under 150, please.", hooks=rec)
        assert "fares service unavailable" in str(rec.run.steps[0].observation)
        dist = await asyncio.to_thread(car.intervene, rec.run, wrapped, car.do_resample(0),
                                       outcome=booked_flex, rollouts=4, seed=0, progress=False)
        assert not dist.failures and len(dist.trajectories) == 4

    connected(ledger, body)


FACTORY = """
from pathlib import Path
from car_adapters.openai_agents import OpenAIAgentsAgent, connect_in_background
from integrations_tests.openai_agents.test_openai_agents_mcp import (
    booked_flex as outcome, server, travel_agent)

def make():
    # the CLI calls this with no event loop to keep the server in: CAR keeps it connected
    return OpenAIAgentsAgent(travel_agent(connect_in_background(server(Path({ledger!r})))))
"""


NOTES = itertools.count()


def rewords_and_gives_up(messages: list[dict[str, Any]], tools: list[str],
                         rng: np.random.Generator) -> Any:
    """Books the flex fare every time (no step's rescue is above 0), words a new note on every
    search (no branch's search is the record's call) and, told the search failed, apologises
    instead of booking: a scored branch would count that as a rescue of the search."""
    k = sum(1 for m in messages if m["role"] == "assistant")
    if k == 0:
        return call("search_fares", {"destination": "LIS", "reason": f"search #{next(NOTES)}"},
                    "call_search")
    if k == 1 and SAVER not in str(messages[-1]["content"]):
        return "Sorry, the fare search failed; please try again later."
    if k == 1:
        return call("book_flight", {"fare_id": FLEX}, "call_book")
    return decide(messages, tools, rng)


@pytest.mark.parametrize(("mode", "why"), [
    # every other call fails: the branch's call fails, and answers when run again
    ("flaky", "and answered the same call when CAR ran it again"),
    # every call fails: the record's answered call fails too when run again
    ("gone", "and the record's answered call of it (arguments "),
    # the server process dies: the SDK tells the model only "Error invoking MCP tool ..."
    ("die", "safe tool 'search_fares' ran live at step 0"),
])
def test_a_read_only_mcp_tools_error_that_is_not_the_calls_own_is_never_scored(
        tmp_path: Path, mode: str, why: str) -> None:
    """A user trial's MCP server died during an attribution; the model had re-worded its
    read-only call, the SDK told it only "Error invoking MCP tool lookup_order on server
    'orders': ", and CAR took the error for the agent's doing: its apology read as a rescue
    ("step 0 caused the failure: 100%", where no step did). CAR now runs the call again, and
    the record's call: an error that goes away, or that the record's call now gets too, is
    the tool's world, and the branch is not scored."""
    ledger = tmp_path / "ledger.jsonl"

    async def body(s: MCPServerStdio) -> None:
        agent = Agent(name="travel_desk", instructions="Book the cheapest fare within budget.",
                      model=ScriptedModel(rewords_and_gives_up, seed=0), mcp_servers=[s])
        run = await record_failure(agent)
        recorded = lines(ledger)
        wrapped = OpenAIAgentsAgent(agent)
        Path(f"{ledger}.{mode}").write_text("", encoding="utf-8")
        with pytest.raises(BranchesFailed) as info:
            await asyncio.to_thread(car.contrastive, run, wrapped, outcome=booked_flex,
                                    rollouts=ROLLOUTS, seed=0, search="full",
                                    executor=Sequential(), progress=False)
        failures = info.value.failures
        # only the branches that re-decide the search call it live
        assert failures and all(f.task.plan.start == 0 for f in failures)
        assert all("safe tool 'search_fares' ran live at step 0" in f.error and why in f.error
                   for f in failures), failures[0].error
        assert lines(ledger) == recorded  # the re-runs are of the read-only search alone

    connected(ledger, body)


def test_the_cli_attributes_an_app_whose_mcp_server_a_factory_connects(tmp_path: Path) -> None:
    """``car attribute --agent app:make`` has no ``async with`` block for the server: the
    factory connects it with ``connect_in_background`` (a user trial found no documented way),
    and the answer and the ledger are those of the Python call."""
    ledger = tmp_path / "ledger.jsonl"
    (tmp_path / "travel_app.py").write_text(FACTORY.format(ledger=str(ledger)), encoding="utf-8")

    recorded_ids: list[str] = []

    async def body(s: MCPServerStdio) -> None:
        run = await record_failure(travel_agent(s))
        with car.RunStore(tmp_path / "car.db") as store:
            store.save(run)
        recorded_ids.append(run.id)

    connected(ledger, body)
    recorded = lines(ledger)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    args = ["attribute", recorded_ids[0], "--agent", "travel_app:make", "--outcome",
            "travel_app:outcome", "--rollouts", str(ROLLOUTS), "--json"]
    proc = subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["locus"] == 1
    assert lines(ledger) == recorded


def test_the_users_lists_win_over_the_annotations(tmp_path: Path) -> None:
    async def body(s: MCPServerStdio) -> None:
        wrapped = OpenAIAgentsAgent(travel_agent(s), side_effect_tools=["search_fares"])
        safety = await asyncio.to_thread(lambda: wrapped.safety)  # listed off the loop
        assert safety.side_effect_tools == {"search_fares", "book_flight", "send_itinerary"}
        assert safety.safe_tools == frozenset()
        # a server whose tools need approval: side effects, whatever their annotations
        async with server(tmp_path / "ledger.jsonl", require_approval="always") as gated:
            wrapped = OpenAIAgentsAgent(travel_agent(gated))
            safety = await asyncio.to_thread(lambda: wrapped.safety)
        assert safety.safe_tools == frozenset()
        assert "approval" in safety.derived["search_fares"]

    connected(tmp_path / "ledger.jsonl", body)


def test_a_server_whose_tools_changed_since_the_record_is_refused_before_any_branch(
        tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"

    async def body(s: MCPServerStdio) -> None:
        run = await record_failure(travel_agent(s))
        before = lines(ledger)
        filtered = server(ledger, tool_filter=create_static_tool_filter(
            blocked_tool_names=["send_itinerary"]))
        async with filtered:
            changed = travel_agent(filtered)
            with pytest.raises(AgentMismatch):
                await asyncio.to_thread(car.intervene, run, OpenAIAgentsAgent(changed),
                                        car.do_resample(1), outcome=booked_flex, rollouts=2,
                                        seed=0, progress=False)
        assert lines(ledger) == before

    connected(ledger, body)


def test_shapes_a_branch_cannot_serve_are_refused_by_name(tmp_path: Path) -> None:
    hosted = Agent(name="desk", model=ScriptedModel(decide), tools=[HostedMCPTool(
        tool_config={"type": "mcp", "server_label": "travel", "server_url": "http://x"})])
    with pytest.raises(AdapterError, match="HostedMCPTool"):
        OpenAIAgentsAgent(hosted)
    dynamic = server(tmp_path / "ledger.jsonl", tool_filter=lambda ctx, tool: True)
    with pytest.raises(AdapterError, match="filters its tools with a function"):
        OpenAIAgentsAgent(travel_agent(dynamic))


def test_servers_never_connected_are_refused_with_what_to_do() -> None:
    with pytest.raises(AdapterError, match="async with MCPServerStdio"):
        OpenAIAgentsAgent(travel_agent(server(Path("unused.jsonl"))))


# -- a function tool that needs approval --------------------------------------------------------
# The planted refund desk: step 0 looks the order up; step 1 refunds 400 (over the order's
# 40: the failure) with probability P_OVER = 0.25, else asks the customer and stops; step 2
# reports. ``refund`` needs approval: the recorded run stops there, a person approves, and the
# run goes on from ``result.to_state()``. As above, rescue(1) = 0.75 and 0 later: locus 1; a
# branch either makes the identical refund (answered from the record, no approval asked) or
# none.
P_OVER = 0.25


def refund_desk(refunds: list[float]) -> Agent[Any]:
    @function_tool
    def lookup(order: str) -> str:
        """Read an order."""
        return f"order {order}: 40 EUR"

    @function_tool(needs_approval=True)
    def refund(amount: float) -> str:
        """Refund the customer (a person approves each refund)."""
        refunds.append(amount)
        return f"refunded {amount}"

    def decide(messages: list[dict[str, Any]], tools: list[str],
               rng: np.random.Generator) -> Any:
        k = sum(1 for m in messages if m["role"] == "assistant")
        if k == 0:
            return call("lookup", {"order": "7"}, "call_lookup")
        if k == 1:
            if rng.random() < P_OVER:
                return call("refund", {"amount": 400}, "call_refund")
            return "The order was 40 EUR: how much should I refund?"
        return "Refunded."

    return Agent(name="refund_desk", model=ScriptedModel(decide, seed=3),
                 tools=[lookup, refund])


def refunded_over(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "refund" and json.loads(c["function"]["arguments"])
               ["amount"] > 100 for s in run.steps for c in (s.action or {}).get("tool_calls")
               or ())


def test_a_tool_that_needs_approval_is_a_side_effect_and_branches_never_ask() -> None:
    refunds: list[float] = []
    agent = refund_desk(refunds)

    async def record() -> car.Trajectory:
        rec = CarRecorder()
        for _ in range(40):  # P_OVER = 0.25: no failure in 40 tries has probability 1e-5
            result = await Runner.run(agent, "Refund order 7.", hooks=rec)
            if result.interruptions:  # the person approves the refund; the run goes on
                state = result.to_state()
                for item in result.interruptions:
                    state.approve(item)
                result = await Runner.run(agent, state, hooks=rec)
            if refunded_over(rec.run):
                return rec.run
        raise AssertionError("the planted model never refunded too much")

    run = asyncio.run(record())
    # the stop for approval and the resumed run are one recorded run
    assert [s.index for s in run.steps] == [0, 1, 2] and run.status == "complete"
    assert run.steps[1].observation[0]["content"] == "refunded 400.0"
    assert refunds[-1] == 400
    before = list(refunds)
    wrapped = OpenAIAgentsAgent(agent, safe_tools=["lookup"])  # refund named by no one
    assert wrapped.safety.side_effect_tools == {"refund"}
    assert "approval" in wrapped.safety.derived["refund"]
    res = car.contrastive(run, wrapped, outcome=refunded_over, rollouts=ROLLOUTS, seed=0,
                          progress=False)
    assert res.locus == 1, res
    assert refunds == before  # no branch refunded
    # branches that refund again get the recorded result and finish: nobody was asked
    dist = car.intervene(run, wrapped, car.do_action(1, run.steps[1].action),
                         outcome=refunded_over, rollouts=2, seed=0, progress=False)
    assert all(t.steps[1].observation[0]["content"] == "refunded 400.0"
               and t.steps[-1].action["content"] == "Refunded." for t in dist.trajectories)
    assert refunds == before
    with pytest.raises(AdapterError, match="need approval"):
        OpenAIAgentsAgent(agent, safe_tools=["lookup", "refund"])


def test_a_rejected_approval_that_stops_the_run_is_one_complete_run() -> None:
    """Under ``StopAtTools`` on the gated tool, a rejection ends the resumed run at once (its
    only hook ``on_agent_end``): a user trial's run was recorded as stopped by an error, its
    final output lost."""
    def decide(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
        return assistant(None, [tool_call("c1", "pay", {"amount": 20})])

    @function_tool(needs_approval=True)
    def pay(amount: int) -> str:
        """Pay a deposit (a side effect)."""
        return f"paid {amount}"

    agent = Agent(name="payer", model=ScriptedModel(decide, seed=0), tools=[pay],
                  tool_use_behavior=StopAtTools(stop_at_tool_names=["pay"]))

    async def record() -> car.Trajectory:
        rec = CarRecorder()
        result = await Runner.run(agent, "Pay the deposit.", hooks=rec)
        state = result.to_state()
        for item in result.interruptions:
            state.reject(item)
        result = await Runner.run(agent, state, hooks=rec)
        assert result.final_output == "Tool execution was not approved."
        return rec.run

    run = asyncio.run(record())
    assert run.status == "complete" and len(run.steps) == 1
    assert final_state(run)["final_output"] == "Tool execution was not approved."


def test_reading_the_run_inside_its_recording_block_says_the_block_holds_it() -> None:
    agent = Agent(name="payer", model=ScriptedModel(lambda m, t, r: "done", seed=0))
    rec = CarRecorder()
    with rec.recording(agent):
        Runner.run_sync(agent, "hello", hooks=rec)
        with pytest.raises(AdapterError, match="kept as the block ends"):
            rec.run  # noqa: B018 - reading it is what is tested
    assert rec.run.status == "complete"
