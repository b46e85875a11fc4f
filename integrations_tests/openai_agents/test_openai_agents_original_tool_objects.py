"""A tool's body that calls a side-effect tool's own object (``await write_audit.on_invoke_tool(
ctx, args)``, one tool reusing another): a branch runs copies of the app's tools, so that call
went to the user's original object and ran live. A user trial's safe ``lookup_order`` wrote the
real audit log on every branch. While branches run, the original objects of side-effect tools
answer a call made inside a branch as the branch answers the tool (the record, a simulator, or
``SideEffectBlocked``) and pass any other call through; afterwards they are as they were."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agents import Agent, RunContextWrapper, Runner, function_tool
from agents.tool_context import ToolContext
from car_adapters.common.messages import ToolSafety, assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel, originals
from car_adapters.openai_agents.agent_tools import function_of

import car_core as car
from car_core.engine.execution import AsyncioExecutor
from car_core.errors import SideEffectBlocked
from car_core.testing import SideEffectLedger


class Desk:
    """A desk agent whose safe ``lookup_order`` writes an audit entry through the side-effect
    tool ``write_audit``'s own object; the model may then call ``write_audit`` itself.
    ``ledger`` counts the real audit writes; ``outside`` makes the simulator also call the
    original object from a thread of its own (outside any branch)."""

    def __init__(self, outside: bool = False) -> None:
        self.ledger = SideEffectLedger(["write_audit"])
        self.simulated: list[str] = []
        self.outside = outside
        self.seen_guarded: list[bool] = []
        self.in_flight: list[int] = []  # branches holding the object at each simulated call

        def _write_audit(entry: str) -> str:
            """Write an entry to the audit log (a side effect)."""
            self.ledger.note("write_audit", entry)
            return "audited"

        self.write_audit = write_audit = function_tool(_write_audit, name_override="write_audit")
        self.own = write_audit.on_invoke_tool

        @function_tool
        async def lookup_order(ctx: RunContextWrapper[Any], order_id: str) -> str:
            """Look an order up (read only, says the app)."""
            args = json.dumps({"entry": f"looked up {order_id}"})
            tc = ToolContext(context=ctx.context, tool_name="write_audit",
                             tool_call_id="nested", tool_arguments=args)
            await write_audit.on_invoke_tool(tc, args)
            return f"order {order_id}: kettle"

        self.lookup_order = lookup_order

    def app(self, seed: int = 0, latency_s: float = 0.0) -> Agent[Any]:
        def desk(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
            n = sum(1 for m in messages if m["role"] == "tool")
            if n == 0:
                return assistant(None, [tool_call("d1", "lookup_order", {"order_id": "7"})])
            if n == 1 and rng.random() < 0.5:
                return assistant(None, [tool_call("d2", "write_audit",
                                                  {"entry": "refund-5000"})])
            return "done"

        return Agent(name="desk", model=ScriptedModel(desk, seed=seed, latency_s=latency_s),
                     tools=[self.lookup_order, self.write_audit])

    def simulate(self, arguments: Any) -> str:
        self.simulated.append(json.dumps(arguments, sort_keys=True) if not
                              isinstance(arguments, str) else arguments)
        if self.outside:  # the user's own call, from outside any branch, runs for real
            self.seen_guarded.append(self.write_audit.on_invoke_tool is not self.own)
            held = originals._HELD.get(id(self.write_audit))
            self.in_flight.append(held.branches if held is not None else 0)
            args = json.dumps({"entry": "outside"})
            tc = ToolContext(context=None, tool_name="write_audit", tool_call_id="own",
                             tool_arguments=args)
            t = threading.Thread(target=lambda: asyncio.run(
                self.write_audit.on_invoke_tool(tc, args)))
            t.start()
            t.join()
        return "audited"


def audited(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "write_audit"
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())


def _recorded(desk: Desk, tmp_path: Path) -> car.Trajectory:
    rec = CarRecorder(store=tmp_path / "runs.db", outcome=audited)
    for seed in range(30):
        Runner.run_sync(desk.app(seed), "where is order 7?", hooks=rec)
        if audited(rec.run):
            return rec.run
    raise AssertionError("no run called write_audit")


def _unchanged(desk: Desk) -> None:
    assert desk.write_audit.on_invoke_tool is desk.own  # the user's object as it was
    assert desk.write_audit.__wrapped__.__name__ == "_write_audit"


def test_a_safe_tool_calling_a_side_effect_tools_object_is_simulated_on_branches(
        tmp_path: Path) -> None:
    desk = Desk()
    run = _recorded(desk, tmp_path)
    before = len(desk.ledger.calls)
    agent = OpenAIAgentsAgent(desk.app(), safe_tools=["lookup_order"],
                              side_effect_tools=["write_audit"],
                              simulators={"write_audit": desk.simulate})
    res = car.contrastive(run, agent, outcome=audited, rollouts=8, seed=0)
    assert res.rollouts_used > 0
    assert len(desk.ledger.calls) == before  # no real audit write during attribution
    assert any("looked up 7" in s for s in desk.simulated)  # the nested call was answered
    _unchanged(desk)


def test_without_a_simulator_the_branch_stops_with_side_effect_blocked(tmp_path: Path) -> None:
    desk = Desk()
    run = _recorded(desk, tmp_path)
    before = len(desk.ledger.calls)
    agent = OpenAIAgentsAgent(desk.app(), safe_tools=["lookup_order"],
                              side_effect_tools=["write_audit"])
    with pytest.raises(SideEffectBlocked, match="write_audit"):
        car.contrastive(run, agent, outcome=audited, rollouts=8, seed=0)
    assert len(desk.ledger.calls) == before
    _unchanged(desk)


def test_concurrent_branches_guard_the_object_and_a_call_outside_them_runs_live(
        tmp_path: Path) -> None:
    desk = Desk(outside=True)
    run = _recorded(desk, tmp_path)
    before = len(desk.ledger.calls)
    agent = OpenAIAgentsAgent(desk.app(latency_s=0.01), safe_tools=["lookup_order"],
                              side_effect_tools=["write_audit"],
                              simulators={"write_audit": desk.simulate})
    res = car.contrastive(run, agent, outcome=audited, rollouts=8, seed=0,
                          executor=AsyncioExecutor(4))
    assert res.rollouts_used > 0
    assert desk.seen_guarded and all(desk.seen_guarded)  # guarded while branches ran
    assert max(desk.in_flight) > 1  # several branches held it at once
    # the only real writes are the calls made outside any branch, one per simulated call
    assert [a for _, a in desk.ledger.calls[before:]] == ["outside"] * len(desk.simulated)
    _unchanged(desk)


def test_a_copy_made_while_guarded_binds_the_tools_own_invoker() -> None:
    desk = Desk()
    quiet: Any = SimpleNamespace(safety=ToolSafety())  # a branch that answers no tool
    args = json.dumps({"entry": "mine"})
    tc = ToolContext(context=None, tool_name="write_audit", tool_call_id="c",
                     tool_arguments=args)
    with originals.guarded([desk.write_audit], quiet), \
            originals.guarded([desk.write_audit], quiet):
        assert desk.write_audit.on_invoke_tool is not desk.own
        assert dataclasses.replace(desk.write_audit).__wrapped__.__name__ == "_write_audit"
        assert function_of(desk.write_audit).__name__ == "_write_audit"
        asyncio.run(desk.write_audit.on_invoke_tool(tc, args))  # not answered here: it runs
    assert desk.ledger.calls == [("write_audit", "mine")]
    _unchanged(desk)
