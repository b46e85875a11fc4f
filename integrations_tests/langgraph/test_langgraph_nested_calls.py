"""Side effects a LangGraph safe tool's own code reaches, kept off the branches.

A user trial found a safe lookup whose body invoked the audit tool with a config of its own
(``audit_log.invoke(..., config={"configurable": {"thread_id": ...}})``, as a sub-agent run on
its own thread does): LangChain hands such a call that config alone, the branch's guard was
looked up by thread id only, and the audit tool ran for real on every branch. An audit tool
found only inside the lookup's code could not be named either. The guard now also follows the
branch the code runs in, and tools found in other tools' code are classified like the graph's.

The planted agent looks order Z9 up w.p. 0.7, else A1 (its own draws: seeds mean nothing), and
apologises when the lookup found nothing; every lookup is audited. Each audit writes a ledger
line; none may be written while an attribution runs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from langchain.agents import create_agent
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.errors import AdapterError, UnclassifiedTools
from integrations_tests.langgraph.test_langgraph_rerun_guard import Planted, apologised


class Desk:
    """The audit tool, writing ``ledger``, and a lookup that audits through ``audit``."""

    def __init__(self, ledger: Path, audit: Callable[[BaseTool, str], Any]) -> None:
        @tool
        def audit_log(entry: str) -> str:
            """Write an audit entry."""
            with ledger.open("a", encoding="utf-8") as f:
                f.write(entry + "\n")
            return "logged"

        @tool
        def lookup_order(order_id: str) -> str:
            """Look an order up."""
            audit(audit_log, f"looked up {order_id}")
            return "no such order" if order_id != "A1" else "order A1: shipped"

        self.audit_log, self.lookup_order, self.ledger = audit_log, lookup_order, ledger

    def app(self, given: bool) -> tuple[Any, CarChatModel]:
        model = CarChatModel(inner=Planted(rng=random.Random(7)))
        tools = [self.lookup_order, self.audit_log] if given else [self.lookup_order]
        return create_agent(model, tools, checkpointer=InMemorySaver()), model

    def lines(self) -> int:
        return len(self.ledger.read_text(encoding="utf-8").splitlines()) if \
            self.ledger.exists() else 0


def record(app: Any) -> car.Trajectory:
    cb = CarCallback()
    for i in range(40):  # 0.7 a run
        app.invoke({"messages": [{"role": "user", "content": "Where is my order?"}]},
                   {"configurable": {"thread_id": f"t{i}"}, "callbacks": [cb]})
        if cb.run is not None and apologised(cb.run):
            return cb.run
    raise AssertionError("no failing run recorded")


def own_config(audit_log: BaseTool, entry: str) -> Any:
    return audit_log.invoke({"entry": entry},
                            config={"configurable": {"thread_id": "audit-thread"}})


def plain_invoke(audit_log: BaseTool, entry: str) -> Any:
    return audit_log.invoke({"entry": entry})


@pytest.mark.parametrize("given", [True, False])
@pytest.mark.parametrize("audit", [own_config, plain_invoke])
def test_a_side_effect_a_safe_tools_code_invokes_never_runs_on_a_branch(
        tmp_path: Path, audit: Callable[[BaseTool, str], Any], given: bool) -> None:
    """Whether the agent was given the audit tool or only the lookup's code holds it, and
    whether the call passes a config of its own: answered from the record, never run."""
    desk = Desk(tmp_path / "audit.log", audit)
    app, model = desk.app(given)
    run = record(app)
    recorded = desk.lines()
    agent = LangGraphAgent(app, model=model, safe_tools=["lookup_order"],
                           side_effect_tools=["audit_log"], match_on={"audit_log": "any"})
    car.contrastive(run, agent, outcome=apologised, rollouts=8, seed=0, progress=False)
    assert desk.lines() == recorded


def test_a_tool_only_a_tools_code_calls_must_be_classified(tmp_path: Path) -> None:
    desk = Desk(tmp_path / "audit.log", plain_invoke)
    app, model = desk.app(given=False)
    with pytest.raises(UnclassifiedTools, match=r"\['audit_log'\]"):
        LangGraphAgent(app, model=model, safe_tools=["lookup_order"])


@pytest.mark.parametrize("given", [True, False])
def test_a_safe_tool_calling_a_side_effects_function_attribute_is_refused(
        tmp_path: Path, given: bool) -> None:
    """``audit_log.func(...)`` runs the tool's code past ``BaseTool.run``, where no guard is."""
    desk = Desk(tmp_path / "audit.log", lambda audit_log, entry: audit_log.func(entry=entry))
    app, model = desk.app(given)
    with pytest.raises(AdapterError, match=r"tool 'lookup_order' calls the function of "
                                           r"side-effect tool\(s\) \['audit_log'\]"):
        LangGraphAgent(app, model=model, safe_tools=["lookup_order"],
                       side_effect_tools=["audit_log"])


def test_a_sub_agents_tools_a_safe_tool_runs_are_classified_with_the_graphs(
        tmp_path: Path) -> None:
    """A lookup that asks a billing sub-agent (its own graph, on its own thread): the
    sub-agent's ``refund`` runs wherever the lookup runs, so it must be classified, and can be
    named, before any branch."""
    @tool
    def refund(order_id: str) -> str:
        """Refund an order (moves money)."""
        return "refunded"

    billing = create_agent(Planted(rng=random.Random(1)), [refund],
                           checkpointer=InMemorySaver())

    @tool
    def lookup_order(order_id: str) -> str:
        """Look an order up, asking billing."""
        billing.invoke({"messages": [{"role": "user", "content": order_id}]},
                       {"configurable": {"thread_id": "billing-1"}})
        return "order A1: shipped"

    model = CarChatModel(inner=Planted(rng=random.Random(7)))
    app = create_agent(model, [lookup_order], checkpointer=InMemorySaver())
    with pytest.raises(UnclassifiedTools, match=r"\['refund'\]"):
        LangGraphAgent(app, model=model, safe_tools=["lookup_order"])
    agent = LangGraphAgent(app, model=model, safe_tools=["lookup_order"],
                           side_effect_tools=["refund"])
    assert agent.safety.guards("refund")
