"""A function tool whose own body runs an agent (``await Runner.run(billing, ...)``) is a nested
run, like an agent tool (``as_tool``): a branch cannot guard the tools inside it. A user trial's
safe ``lookup_order`` ran its billing agent's ``refund`` for real on every branch, and naming
``refund`` in side_effect_tools was refused as a tool the app did not have. The agents a tool's
function names are found as a guardrail's are; the tool is then refused by name before any
branch where it would run live and its agents reach a side effect, and answered from the record
where it is one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, function_tool
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel
from car_adapters.openai_agents.reruns import branch_reruns

import car_core as car
from car_core.errors import AdapterError, UnclassifiedTools


class Desk:
    """A desk agent whose ``lookup_order`` tool asks a billing agent (run in the tool's body)
    to settle the order; the billing agent reads the account, then refunds. ``ledger`` is the
    real refunds, ``looked`` the reads, ``billing_calls`` the billing model's calls."""

    def __init__(self) -> None:
        self.ledger: list[str] = []
        self.looked: list[str] = []
        self.billing_calls = 0

    def app(self) -> Agent[Any]:
        @function_tool
        def refund(order_id: str) -> str:
            """Refund the customer (moves money)."""
            self.ledger.append(order_id)
            return "refunded"

        @function_tool
        def read_account(order_id: str) -> str:
            """Read the order's account (reads only)."""
            self.looked.append(order_id)
            return "paid"

        def settle(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
            self.billing_calls += 1
            done = [m for m in messages if m["role"] == "tool"]
            if not done:
                return assistant(None, [tool_call("b1", "read_account", {"order_id": "7"})])
            if len(done) == 1:
                return assistant(None, [tool_call("b2", "refund", {"order_id": "7"})])
            return "settled"

        billing = Agent(name="billing", model=ScriptedModel(settle),
                        tools=[read_account, refund])

        @function_tool
        async def lookup_order(order_id: str) -> str:
            """Look an order up (the app says it only reads)."""
            done = await Runner.run(billing, f"settle order {order_id}")
            return f"order {order_id}: {done.final_output}"

        def desk(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
            if not any(m["role"] == "tool" for m in messages):
                return assistant(None, [tool_call("d1", "lookup_order", {"order_id": "7"})])
            return "on its way" if rng.random() < 0.5 else "lost"

        return Agent(name="desk", model=ScriptedModel(desk), tools=[lookup_order])


def failed(run: car.Trajectory) -> bool:
    return True  # every run fails: these tests count what branches do


def _recorded(desk: Desk, tmp_path: Path) -> car.Trajectory:
    rec = CarRecorder(store=tmp_path / "runs.db", outcome=failed)
    Runner.run_sync(desk.app(), "where is order 7?", hooks=rec)
    assert desk.ledger == ["7"]
    return rec.run


def test_a_safe_function_tool_that_runs_a_refunding_agent_is_refused_before_any_branch(
        tmp_path: Path) -> None:
    desk = Desk()
    run = _recorded(desk, tmp_path)
    with pytest.raises(AdapterError, match=r"function tool 'lookup_order' would run agent\(s\) "
                                           r"\['billing'\] live .*\['refund'\]: a branch cannot "
                                           r"guard tools inside a nested run"):
        agent = OpenAIAgentsAgent(desk.app(), safe_tools=["lookup_order", "read_account"],
                                  side_effect_tools=["refund"])
        car.contrastive(run, agent, outcome=failed, rollouts=4, seed=0)
    assert desk.ledger == ["7"]  # the recording's only


def test_the_tools_of_the_agent_a_function_tool_runs_must_be_classified(tmp_path: Path) -> None:
    desk = Desk()
    run = _recorded(desk, tmp_path)
    with pytest.raises(UnclassifiedTools) as got:
        car.contrastive(run, OpenAIAgentsAgent(desk.app(), safe_tools=["lookup_order"]),
                        outcome=failed, rollouts=4, seed=0)
    assert got.value.tools == ("read_account", "refund")
    assert desk.ledger == ["7"]


def test_a_function_tool_answered_from_the_record_never_runs_its_agent(tmp_path: Path) -> None:
    desk = Desk()
    run = _recorded(desk, tmp_path)
    calls = desk.billing_calls
    agent = OpenAIAgentsAgent(desk.app(), side_effect_tools=["lookup_order"])
    res = car.contrastive(run, agent, outcome=failed, rollouts=4, seed=0)
    assert res.rollouts_used > 0
    assert desk.ledger == ["7"] and desk.billing_calls == calls  # nothing inside ran


def test_a_function_tool_whose_agent_only_reads_runs_live_but_is_never_run_again(
        tmp_path: Path) -> None:
    desk = Desk()
    run = _recorded(desk, tmp_path)
    calls = desk.billing_calls
    app = desk.app()
    agent = OpenAIAgentsAgent(app, safe_tools=["lookup_order", "read_account", "refund"])
    res = car.contrastive(run, agent, outcome=failed, rollouts=4, seed=0)
    assert res.rollouts_used > 0
    assert desk.billing_calls > calls  # the nested agent ran, as the user said it may
    # telling a tool's error apart runs safe tools again, never a whole nested run
    reruns = branch_reruns(agent.agents, {}, None, agent.safety, lambda: None)
    assert "lookup_order" in agent.safety.safe_tools and not reruns.can("lookup_order")
