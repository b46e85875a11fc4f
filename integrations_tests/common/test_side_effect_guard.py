"""Side-effect tools on ``ChatAgent`` and ``LlamaIndexAgent``: names are checked against the
agent's tools before anything runs, and a ledger of real tool calls stays at zero on branches.

The planted chat agent looks order 42 up (step 0), then refunds it with probability 0.8 (step
1, the failure) or answers; so P(fail | do_resample(1)) = 0.8 and every refund on a branch is
the recorded call ``issue_refund(order_id="42")``, which the record can answer.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest
from car_adapters.common.messages import assistant, tool_call
from car_adapters.llamaindex import LlamaIndexAgent, ScriptedLLM
from car_adapters.models.chat_agent import ChatAgent, ChatFunctionAgent
from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent

import car_core as car
from car_core.engine.agent import AgentCaveat
from car_core.errors import InvalidInput, InvalidIntervention, SideEffectBlocked

P_REFUND = 0.8
ROLLOUTS = 32


class Ledger:
    """Counts every real call of each tool."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def tools(self) -> dict[str, Any]:
        def lookup_order(order_id: str) -> dict[str, Any]:
            self.calls["lookup_order"] = self.calls.get("lookup_order", 0) + 1
            return {"order_id": order_id, "status": "shipped"}

        def issue_refund(order_id: str) -> dict[str, Any]:
            self.calls["issue_refund"] = self.calls.get("issue_refund", 0) + 1
            return {"order_id": order_id, "refunded": True}
        return {"lookup_order": lookup_order, "issue_refund": issue_refund}


def planted(history: car.History, rng: np.random.Generator) -> dict[str, Any]:
    k = history.index
    if k == 0:
        return assistant(None, [tool_call("call_0_0", "lookup_order", {"order_id": "42"})])
    if k == 1 and rng.random() < P_REFUND:
        return assistant(None, [tool_call("call_1_0", "issue_refund", {"order_id": "42"})])
    return assistant("Order 42 has shipped.")


def refunded(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "issue_refund" for s in run.steps
               for c in (s.action or {}).get("tool_calls") or ())


def test_chat_agent_refuses_a_misspelt_side_effect_tool_listing_its_tools() -> None:
    ledger = Ledger()
    with pytest.raises(InvalidInput, match="issue-refund") as err:
        ChatAgent(planted, ledger.tools(), side_effect_tools=["issue-refund"])
    assert "issue_refund" in str(err.value) and "lookup_order" in str(err.value)
    with pytest.raises(InvalidInput, match="refund_order"):
        ChatAgent(planted, ledger.tools(), simulators={"refund_order": lambda a: "ok"})
    assert ledger.calls == {}


def test_chat_agent_refuses_a_forced_action_calling_no_tool_of_its_own() -> None:
    """A ``do_action`` calling a tool the agent does not have got "error: no tool named ..."
    on every branch, which went on and read as a rescue; it is refused before any branch."""
    ledger = Ledger()
    agent = ChatAgent(planted, ledger.tools(), safe_tools=["lookup_order"],
                      side_effect_tools=["issue_refund"])
    run = car.record(agent, context="Where is order 42?", outcome=refunded, seed=0)
    ledger.calls.clear()
    typo = assistant(None, [tool_call("c", "lookup-order", {"order_id": "42"})])
    with pytest.raises(InvalidIntervention, match=r"calls \['lookup-order'\], but the app has "
                                                  r"no such tool \(its tools: \['issue_refund', "
                                                  r"'lookup_order'\]\)"):
        car.intervene(run, agent, car.do_action(1, typo), outcome=refunded, rollouts=4)
    assert ledger.calls == {}


def test_chat_agent_never_runs_a_side_effect_tool_on_a_branch() -> None:
    ledger = Ledger()
    agent = ChatAgent(planted, ledger.tools(), safe_tools=["lookup_order"],
                      side_effect_tools=["issue_refund"])
    assert isinstance(agent, ChatFunctionAgent) and isinstance(agent, car.FunctionAgent)
    run = car.record(agent, context="Where is order 42?", outcome=refunded, seed=0)
    assert refunded(run) and ledger.calls == {"lookup_order": 1, "issue_refund": 1}
    ledger.calls.clear()

    dist = car.intervene(run, agent, car.do_resample(1), outcome=refunded, rollouts=ROLLOUTS,
                         seed=0)
    # analytic P(fail | resample 1) = 0.8; 4 standard errors of a 32-rollout mean
    assert abs(dist.mean - P_REFUND) <= 4 * math.sqrt(P_REFUND * (1 - P_REFUND) / ROLLOUTS)
    assert 0 < dist.mean < 1
    assert ledger.calls.get("issue_refund", 0) == 0           # never ran on a branch...
    assert all(t.steps[1].observation == run.steps[1].observation  # ...answered from the record
               for t in dist.trajectories if refunded(t))
    car.contrastive(run, agent, outcome=refunded, rollouts=16, seed=1, search="full")
    assert ledger.calls.get("issue_refund", 0) == 0

    other = assistant(None, [tool_call("call_1_0", "issue_refund", {"order_id": "7"})])
    with pytest.raises(SideEffectBlocked, match="issue_refund"):
        car.intervene(run, agent, car.do_action(1, other), outcome=refunded, rollouts=1)
    simulated = ChatAgent(planted, ledger.tools(), safe_tools=["lookup_order"],
                          simulators={"issue_refund": lambda a: {"simulated": a["order_id"]}})
    dist = car.intervene(run, simulated, car.do_action(1, other), outcome=refunded, rollouts=2)
    assert dist.trajectories[0].steps[1].observation[0]["content"] == '{"simulated": "7"}'
    assert ledger.calls.get("issue_refund", 0) == 0

    # left unclassified on purpose (a sandbox), the same branches do run the real tool: the
    # ledger can tell, and the result says so
    unguarded = ChatAgent(planted, ledger.tools(), unclassified="live")
    with pytest.warns(AgentCaveat, match="issue_refund"):
        live = car.intervene(run, unguarded, car.do_action(1, other), outcome=refunded,
                             rollouts=2)
    assert ledger.calls["issue_refund"] == 2
    assert "issue_refund" in live.caveats[0] and "caveat: unclassified tools ran live" in str(live)


def _scripted(_m: Any, _t: Any, _r: Any) -> str:
    return "done"


def test_llamaindex_agent_refuses_a_misspelt_side_effect_tool() -> None:
    def issue_refund(order_id: str) -> str:
        """Refund an order."""
        raise AssertionError("must never run")

    def lookup_order(order_id: str) -> str:
        """Look an order up."""
        raise AssertionError("must never run")

    agent = FunctionAgent(tools=[lookup_order, issue_refund], llm=ScriptedLLM(_scripted))
    with pytest.raises(InvalidInput, match="issue-refund") as err:
        LlamaIndexAgent(agent, side_effect_tools=["issue-refund"])
    assert "issue_refund" in str(err.value) and "lookup_order" in str(err.value)
    with pytest.raises(InvalidInput, match="refund"):
        LlamaIndexAgent(agent, simulators={"refund": lambda a: "ok"})
    assert LlamaIndexAgent(agent, safe_tools=["lookup_order"],
                           side_effect_tools=["issue_refund"]).safety.guards("issue_refund")


def test_agent_workflow_checks_names_against_every_agents_tools() -> None:
    def refund(amount: int) -> str:
        """Refund the customer."""
        return str(amount)

    def route(topic: str) -> str:
        """Route a ticket."""
        return topic

    triage = FunctionAgent(name="triage", description="routes", tools=[route],
                           llm=ScriptedLLM(_scripted), can_handoff_to=["billing"])
    billing = FunctionAgent(name="billing", description="refunds", tools=[refund],
                            llm=ScriptedLLM(_scripted))
    flow = AgentWorkflow(agents=[triage, billing], root_agent="triage")
    assert LlamaIndexAgent(flow, safe_tools=["route"],
                           side_effect_tools=["refund"]).safety.guards("refund")
    with pytest.raises(InvalidInput, match="refunds") as err:
        LlamaIndexAgent(flow, side_effect_tools=["refunds"])
    assert "'refund'" in str(err.value) and "'route'" in str(err.value)


def test_llamaindex_ledger_stays_at_zero_on_branches() -> None:
    from car_adapters.llamaindex import CarRecorder
    ledger = Ledger()
    tools = ledger.tools()

    def lookup_order(order_id: str) -> str:
        """Look an order up."""
        return str(tools["lookup_order"](order_id))

    def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return str(tools["issue_refund"](order_id))

    def decide(messages: list[dict[str, Any]], names: list[str], rng: Any) -> Any:
        k = sum(1 for m in messages if m["role"] == "assistant")
        if k == 0:
            return assistant(None, [tool_call("c0", "lookup_order", {"order_id": "42"})])
        if k == 1 and rng.random() < P_REFUND:
            return assistant(None, [tool_call("c1", "issue_refund", {"order_id": "42"})])
        return "Order 42 has shipped."

    agent = FunctionAgent(tools=[lookup_order, issue_refund], llm=ScriptedLLM(decide))
    rec = CarRecorder().attach()
    try:
        async def main() -> None:
            await agent.run(user_msg="Where is order 42?")
        asyncio.run(main())
    finally:
        rec.detach()
    run = rec.run
    assert refunded(run) and ledger.calls["issue_refund"] == 1
    ledger.calls.clear()
    guarded = LlamaIndexAgent(agent, safe_tools=["lookup_order"],
                              side_effect_tools=["issue_refund"])
    dist = car.intervene(run, guarded, car.do_resample(1), outcome=refunded, rollouts=ROLLOUTS,
                         seed=0)
    assert abs(dist.mean - P_REFUND) <= 4 * math.sqrt(P_REFUND * (1 - P_REFUND) / ROLLOUTS)
    assert 0 < dist.mean and ledger.calls.get("issue_refund", 0) == 0
