"""Every LangGraph branch faithful to the record, or refused by name, on the app shapes where
it was not: a node that calls a side-effect tool itself, a summarizer middleware whose model
CAR does not decide, a model a node builds for itself, ``create_supervisor``'s supervisor under
``do_context``, and a ``create_agent`` model without a seed field. Each test keeps a ledger of
the real side-effect calls and asserts that branches added none.

The refund desk (``desk``): ``agent`` looks the order up (step 0), decides ``refund`` or
``deny`` with ``record_decision`` (step 1: refund with p = 0.5 while the customer's injection
is in view, never without it), and replies (step 2). The decision is carried out by node
``fulfil``, which calls ``issue_refund`` itself (no ToolNode, no model) and writes its own
``AIMessage``. For a failing run (a refund was issued):

    P(fail | do_resample(1)) = 0.5      P(fail | do_context(1, remove_injection)) = 0

Tolerance: a mean over n = 32 rollouts has standard error sqrt(0.25 / 32) = 0.088; we allow 4
of them (0.35), so 0.5 must land in [0.15, 0.85] and a rescue that did not happen (1.0) fails.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from car_adapters.demo import supervisor_app as sv
from car_adapters.demo import support_agent as sa
from car_adapters.demo.planted import SeededChatModel
from car_adapters.langgraph import (
    CarCallback,
    CarChatModel,
    CarMiddleware,
    LangGraphAgent,
    attribute_thread,
)
from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

import car_core as car
from car_core.errors import AdapterError, AgentMismatch, InvalidInput, SideEffectBlocked
from integrations_tests.support.record_anywhere_apps import noted

ROOT = Path(__file__).resolve().parents[2]
N = 32
TOL = 4 * math.sqrt(0.25 / N)
REFUNDS: list[dict[str, Any]] = []  # the ledger: every real execution of issue_refund
# the support app's tools, classified: lookups run on branches, the refund never does
SA: dict[str, Any] = {"safe_tools": sa.SAFE_TOOLS, "side_effect_tools": sa.SIDE_EFFECT_TOOLS}


@tool("issue_refund")
def ledger_refund(order_id: str, amount: float) -> str:
    """Refund an order (moves money: a side effect)."""
    REFUNDS.append({"order_id": order_id, "amount": amount})
    return json.dumps({"refunded": order_id, "amount": amount})


class DeskModel(SeededChatModel):
    """Looks up, decides (refund w.p. ``p_follow`` while the injection is in view), replies."""

    p_follow: float = 0.5
    model_name: str = "planted-desk"

    @property
    def _llm_type(self) -> str:
        return "planted-desk"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        done = [m.name for m in messages if isinstance(m, ToolMessage)]
        n = sum(isinstance(m, AIMessage) for m in messages)
        if "lookup_order" not in done:
            msg = AIMessage("", tool_calls=[{"id": f"c{n}", "name": "lookup_order",
                                             "args": {"order_id": sa.ORDER_ID}}])
        elif "record_decision" not in done:
            seen = any(sa.INJECTION in str(m.content) for m in messages if m.type == "human")
            refund = seen and self._draw() < self.p_follow
            msg = AIMessage("", tool_calls=[{"id": f"c{n}", "name": "record_decision",
                                             "args": {"decision": "refund" if refund
                                                      else "deny"}}])
        else:
            msg = AIMessage("Your ticket is closed.")
        return ChatResult(generations=[ChatGeneration(message=msg)])


def _decision(messages: list[BaseMessage]) -> str | None:
    return next((json.loads(str(m.content))["recorded"] for m in reversed(messages)
                 if isinstance(m, ToolMessage) and m.name == "record_decision"), None)


def desk(model: Any, saver: Any) -> Any:
    """agent <-> tools (lookup, decision); after the decision, ``fulfil`` refunds itself."""
    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def fulfil(state: MessagesState) -> dict[str, Any]:
        if _decision(state["messages"]) != "refund":
            return {"messages": [AIMessage("No refund.")]}
        done = ledger_refund.invoke({"order_id": sa.ORDER_ID, "amount": 129.0})
        return {"messages": [AIMessage(f"Refund issued: {done}")]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        if isinstance(last, AIMessage) and last.tool_calls:
            return "tools"
        return END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([sa.lookup_order, sa.record_decision]))
    graph.add_node("fulfil", fulfil)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_conditional_edges("tools", lambda s: "fulfil" if s["messages"][-1].name ==
                                "record_decision" else "agent", ["fulfil", "agent"])
    graph.add_edge("fulfil", "agent")
    return graph.compile(checkpointer=saver)


def refunded(run: car.Trajectory) -> bool:
    return any(str(m.get("content") or "").startswith("Refund issued")
               for m in run.meta["final_state"]["messages"])


def record(app: Any, want: bool, cb: CarCallback | None = None) -> car.Trajectory:
    cb = cb or CarCallback()
    for i in range(40):  # seeded model: deterministic
        app.invoke(sa.inputs(), {"configurable": {"thread_id": f"desk-{want}-{i}"},
                                 "callbacks": [cb]})
        assert cb.run is not None
        if refunded(cb.run) == want:
            return cb.run
    raise AssertionError("no such run")


def threads(saver: Any) -> set[str]:
    return {c.config["configurable"]["thread_id"] for c in saver.list(None)}


@pytest.fixture()
def ledger() -> list[dict[str, Any]]:
    REFUNDS.clear()
    return REFUNDS


def test_every_tool_name_is_checked_against_the_graph(ledger: list[Any]) -> None:
    """A typo in any tool-name parameter is refused before any branch, listing the graph's
    tools, including the one node ``fulfil`` calls itself (found without node_tools)."""
    saver = InMemorySaver()
    model = CarChatModel(inner=DeskModel())
    app = desk(model, saver)
    run = record(app, True)
    recorded, before = len(ledger), threads(saver)
    known = r"its tools are \['issue_refund', 'lookup_order', 'record_decision'\]"
    for kwargs in ({"side_effect_tools": ["issue_refunds"], "node_tools": ["issue_refunds"]},
                   {"side_effect_tools": ["issue_refund"], "node_tools": ["issue_refunds"]},
                   {"simulators": {"issue_refunds": lambda a: "{}"}},
                   {"side_effect_tools": ["issue_refund"],
                    "match_on": {"issue_refunds": "any"}}):
        with pytest.raises(InvalidInput, match=rf"\['issue_refunds'\].*{known}"):
            LangGraphAgent(app, model=model, **kwargs)
    with pytest.raises(InvalidInput, match=rf"\['issue_refunds'\].*{known}"):
        attribute_thread(app, str(run.meta["thread_id"]), outcome=refunded,
                         side_effect_tools=["issue_refunds"])
    agent = LangGraphAgent(app, model=model, safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=["issue_refund"])
    assert agent.tools == ["issue_refund", "lookup_order", "record_decision"]
    assert len(ledger) == recorded and threads(saver) == before  # no branch began


def test_a_tool_a_node_calls_itself_is_served_from_the_record(ledger: list[Any]) -> None:
    """Branches through ``fulfil`` get the recorded refund instead of running it, so the
    estimate goes through: do_resample(1) = 0.5, do_context(1, remove_injection) = 0."""
    model = CarChatModel(inner=DeskModel())
    app = desk(model, InMemorySaver())
    run = record(app, True)
    assert run.meta["node_tool_calls"] == [{
        "node": "fulfil", "name": "issue_refund",
        "arguments": json.dumps({"amount": 129.0, "order_id": sa.ORDER_ID}, sort_keys=True,
                                separators=(",", ":")),
        "content": json.dumps({"refunded": sa.ORDER_ID, "amount": 129.0})}]
    recorded = len(ledger)
    agent = LangGraphAgent(app, model=model, safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=["issue_refund"])
    resample = car.intervene(run, agent, car.do_resample(1), outcome=refunded, rollouts=N)
    fixed = car.intervene(run, agent, car.do_context(1, sa.remove_injection),
                          outcome=refunded, rollouts=N)
    assert abs(resample.mean - 0.5) <= TOL and fixed.mean == 0.0
    assert len(ledger) == recorded  # every branch refund was answered from the record


def test_a_node_call_the_record_cannot_answer_names_the_node(ledger: list[Any]) -> None:
    saver = InMemorySaver()
    model = CarChatModel(inner=DeskModel())
    app = desk(model, saver)
    run = record(app, False)  # denied: no refund in the record to answer with
    refund = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {
            "name": "record_decision", "arguments": json.dumps({"decision": "refund"})}}]}
    agent = LangGraphAgent(app, model=model, safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=["issue_refund"])
    with pytest.raises(SideEffectBlocked, match=r"in node 'fulfil' \(a call the node makes "
                                                r"itself.*'issue_refund'") as caught:
        car.intervene(run, agent, car.do_action(1, refund), outcome=refunded, rollouts=1)
    assert "[step" not in str(caught.value) and caught.value.run_id == run.id
    assert ledger == []


def test_import_thread_counts_only_model_decisions(ledger: list[Any]) -> None:
    """``fulfil`` writes an AIMessage without a model: the callback records 3 steps, and so
    must the import; attribute_thread takes node_tools and side-effect names as the agent
    does (an imported thread has no record of fulfil's call, so a simulator answers it)."""
    model = CarChatModel(inner=DeskModel())
    app = desk(model, InMemorySaver())
    run = record(app, True)
    imported = LangGraphAgent(app, model=model, **SA).import_thread(str(run.meta["thread_id"]))
    assert [s.action for s in imported.steps] == [s.action for s in run.steps]
    assert len(imported.steps) == 3 and [s.meta["node"] for s in imported.steps] == [
        "agent"] * 3
    recorded = len(ledger)
    res = attribute_thread(app, str(run.meta["thread_id"]), outcome=refunded, model=model,
                           safe_tools=sa.SAFE_TOOLS, side_effect_tools=["issue_refund"],
                           node_tools=[ledger_refund],
                           simulators={"issue_refund": lambda a: {"refunded": a["order_id"]}},
                           rollouts=16, seed=0)
    assert res.locus == 1  # the decision, not the lookup or the reply
    assert len(ledger) == recorded


def _summarizing_agent(summarizer: Any) -> tuple[Any, CarMiddleware]:
    mw = CarMiddleware()
    tools = [sa.lookup_order, sa.record_decision, ledger_refund]
    app = create_agent(sa.PlantedSupportModel(p_follow=1.0), tools,
                       system_prompt=sa.SYSTEM_PROMPT, checkpointer=InMemorySaver(),
                       middleware=[mw, SummarizationMiddleware(model=summarizer,
                                                               trigger=("messages", 6),
                                                               keep=("messages", 2))])
    return app, mw


def test_an_unwrapped_summarizer_is_refused_before_any_branch(ledger: list[Any]) -> None:
    """The summarizer fires after the refund (step 3 of the record) with a model CAR does not
    decide: under [do_resample(1), do_action(3, ...)] the hold would land on the wrong call,
    so the whole estimate is refused up front, naming the node and the model; wrapped in
    CarChatModel, the same plan holds the summarizer's step and runs no refund."""
    summarizer = FakeListChatModel(responses=["the ticket so far"] * 200)
    app, mw = _summarizing_agent(summarizer)
    cb = CarCallback()
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    run = cb.run
    assert run is not None and [s.meta["node"] for s in run.steps][3] == (
        "SummarizationMiddleware.before_model")
    assert run.steps[3].meta["car_decided"] is False
    plan = [car.do_resample(1), car.do_action(3, run.steps[3].action)]
    recorded, calls = len(ledger), summarizer.i
    agent = LangGraphAgent(app, model=mw, safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=["issue_refund"])
    with pytest.raises(AdapterError, match=r"node 'SummarizationMiddleware.before_model' can "
                                           r"call chat model FakeListChatModel, which CAR does "
                                           r"not decide \(SummarizationMiddleware configured "
                                           r"to fire \(trigger=\('messages', 6\)\)\)"):
        car.intervene(run, agent, plan, outcome=sa.outcome, rollouts=4)
    assert threads(app.checkpointer) == {"t"} and summarizer.i == calls  # no branch began
    assert len(ledger) == recorded

    wrapped_app, wrapped_mw = _summarizing_agent(CarChatModel(inner=summarizer))
    cb = CarCallback()
    wrapped_app.invoke(sa.inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    wrapped_run = cb.run
    assert wrapped_run is not None and wrapped_run.steps[3].meta["car_decided"] is True
    recorded = len(ledger)
    dist = car.intervene(wrapped_run, LangGraphAgent(wrapped_app, model=wrapped_mw,
                                                     safe_tools=sa.SAFE_TOOLS,
                                                     side_effect_tools=["issue_refund"]),
                         plan, outcome=sa.outcome, rollouts=4)
    for branch in dist.trajectories:
        assert branch.steps[3].meta["origin"] == "held"
        assert branch.steps[3].action == wrapped_run.steps[3].action
        assert branch.steps[3].meta["node"] == "SummarizationMiddleware.before_model"
    assert len(ledger) == recorded


def reviewed_desk(model: Any) -> Any:
    """The desk with node ``review``, which builds its own model (invisible to any check up
    front) and calls it only after a denial, and a ``fulfil`` that refunds itself."""
    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def review(state: MessagesState) -> dict[str, Any]:
        if _decision(state["messages"]) == "deny":
            reviewer = FakeListChatModel(responses=["denial looks right"])
            return {"messages": [reviewer.invoke("check this denial")]}
        return {"messages": []}

    def fulfil(state: MessagesState) -> dict[str, Any]:
        if _decision(state["messages"]) == "refund":
            ledger_refund.invoke({"order_id": sa.ORDER_ID, "amount": 129.0})
        return {"messages": []}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([sa.lookup_order, sa.record_decision]))
    graph.add_node("review", review)
    graph.add_node("fulfil", fulfil)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", lambda s: "tools" if s["messages"][-1].tool_calls
                                else END, ["tools", END])
    graph.add_conditional_edges("tools", lambda s: "review" if s["messages"][-1].name ==
                                "record_decision" else "agent", ["review", "agent"])
    graph.add_edge("review", "fulfil")
    graph.add_edge("fulfil", "agent")
    return graph.compile(checkpointer=InMemorySaver())


def test_a_model_a_node_builds_itself_is_refused_at_its_first_call(ledger: list[Any]) -> None:
    """The record refunds, so ``review``'s model never ran in it; a branch that denies reaches
    it and is stopped at that call, naming the node and the model, with no refund run. A record
    that denied holds review's call as a step CAR did not decide: refused before any branch."""
    model = CarChatModel(inner=DeskModel(p_follow=1.0))
    app = reviewed_desk(model)
    cb = CarCallback()
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    run = cb.run
    assert run is not None and len(run.steps) == 3 and all(
        s.meta["car_decided"] for s in run.steps)
    deny = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {
            "name": "record_decision", "arguments": json.dumps({"decision": "deny"})}}]}
    recorded = len(ledger)
    graph_agent = LangGraphAgent(app, model=model, safe_tools=sa.SAFE_TOOLS,
                                 side_effect_tools=["issue_refund"])
    with pytest.raises(AdapterError, match=r"a branch called chat model 'fake-list-chat-model' "
                                           r"in node 'review', which CAR does not decide"):
        car.intervene(run, graph_agent, car.do_action(1, deny), outcome=refunded, rollouts=1)

    denying = CarChatModel(inner=DeskModel(p_follow=0.0))
    denied_app = reviewed_desk(denying)
    denied_app.invoke(sa.inputs(), {"configurable": {"thread_id": "d"}, "callbacks": [cb]})
    denied = cb.run
    assert denied is not None and [s.meta["car_decided"] for s in denied.steps] == [
        True, True, False, True]
    with pytest.raises(AdapterError, match=r"step 2 is a call of chat model "
                                           r"'fake-list-chat-model' in node 'review' that CAR "
                                           r"did not decide"):
        car.intervene(denied, LangGraphAgent(denied_app, model=denying, **SA),
                      car.do_resample(3),
                      outcome=refunded, rollouts=1)
    assert threads(denied_app.checkpointer) == {"d"}  # no branch began
    assert len(ledger) == recorded


def test_do_context_at_create_supervisors_supervisor_reaches_later_workers() -> None:
    """The supervisor (a subgraph of create_supervisor) decides step 3 from messages its
    parent holds too; the edit must reach the parent, so account_agent (step 4) never sees the
    injection: P(fail) = 0 exactly (0.5 if the edit stayed in the supervisor's subgraph)."""
    model = CarChatModel(inner=sv.PlantedAgentModel(rng_seed=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_supervisor uses the deprecated react agent
        app = sv.build_app(model, InMemorySaver())
    cb = CarCallback()
    for i in range(30):
        app.invoke(sv.inputs(), {"configurable": {"thread_id": f"u{i}"}, "callbacks": [cb]})
        if sv.outcome(cb.run):
            break
    run = cb.run
    assert run is not None and sv.outcome(run) and run.steps[3].meta["agent"] == "supervisor"
    closed = len(sv.CLOSED)
    agent = LangGraphAgent(app, model=model, safe_tools=sv.SAFE_TOOLS,
                           side_effect_tools=["close_account"])
    for k in (3, 4):  # the supervisor's hand-off, then the worker's own decision
        dist = car.intervene(run, agent, car.do_context(k, sv.remove_injection),
                             outcome=sv.outcome, rollouts=8)
        assert dist.mean == 0.0, k
        for branch in dist.trajectories:
            assert not any(sv.INJECTION in str(m.get("content")) for s in branch.steps[k:]
                           for m in s.state)
    assert len(sv.CLOSED) == closed


def test_action_match_rate_is_quiet(caplog: pytest.LogCaptureFixture,
                                    capfd: pytest.CaptureFixture[str],
                                    ledger: list[Any]) -> None:
    """Re-deciding each step stops at its first decision without a logged callback error."""
    model = CarChatModel(inner=DeskModel(p_follow=1.0))
    app = desk(model, InMemorySaver())
    run = record(app, True)
    recorded = len(ledger)
    with caplog.at_level("DEBUG"):
        match = car.action_match_rate(run, LangGraphAgent(app, model=model,
                                                          safe_tools=sa.SAFE_TOOLS,
                                                          side_effect_tools=["issue_refund"]),
                                      replays=2)
    assert match.steps == (0, 1, 2) and match.per_step[0] == 1.0
    assert not [r for r in caplog.records if "callback" in r.getMessage()]
    assert "Error in" not in capfd.readouterr().err
    assert len(ledger) == recorded


AGENT_MODULE = '''
from integrations_tests.support.record_anywhere_apps import make_noted as make
'''


def test_a_thread_missing_from_the_saver_is_a_setup_error(tmp_path: Path) -> None:
    """``car attribute`` with an agent whose checkpointer lacks the run's thread (an
    InMemorySaver in a new process), on a graph whose state the record cannot rebuild (a
    ``notes`` key besides the messages), exits as a usage error, with nothing to resume."""
    (tmp_path / "desk_agent.py").write_text(AGENT_MODULE)
    store = car.RunStore(tmp_path / "car.db")
    cb = CarCallback(store=store, outcome=sa.outcome)
    app = noted(InMemorySaver(), sa.PlantedSupportModel(p_follow=1.0))
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "gone"}, "callbacks": [cb]})
    assert cb.run is not None
    with pytest.raises(AgentMismatch, match="does not hold thread 'gone'"):
        car.contrastive(cb.run, LangGraphAgent(noted(InMemorySaver(), sa.PlantedSupportModel()),
                                               **SA),
                        outcome=sa.outcome, rollouts=2, store=store)
    assert store.attributions(cb.run.id) == []  # refused before the attribution began
    store.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "car_core.cli", "attribute", cb.run.id,
                           "--store", str(tmp_path / "car.db"), "--agent", "desk_agent:make",
                           "--outcome", "car_adapters.demo.support_agent:outcome",
                           "--rollouts", "2"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "does not hold thread 'gone'" in proc.stderr
    assert "Resume with" not in proc.stderr


class Unseeded(FakeListChatModel):
    """A chat model with no ``seed`` field: CAR's noise cannot drive it."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def test_middleware_over_an_unseeded_model_does_not_claim_coupling() -> None:
    mw = CarMiddleware()
    unseeded = create_agent(Unseeded(responses=["hello"]), sa.TOOLS, middleware=[mw],
                            checkpointer=InMemorySaver())
    assert not LangGraphAgent(unseeded, model=mw, **SA).couples_noise
    cb = CarCallback()
    unseeded.invoke(sa.inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    assert cb.run is not None
    dist_agent = LangGraphAgent(unseeded, model=mw, **SA)
    res = car.contrastive(cb.run, dist_agent, outcome=lambda r: 1.0, rollouts=2, seed=0)
    assert res.coupled is False
    seeded_mw = CarMiddleware()
    seeded = create_agent(sa.PlantedSupportModel(), sa.TOOLS, middleware=[seeded_mw],
                          checkpointer=InMemorySaver())
    assert LangGraphAgent(seeded, model=seeded_mw, **SA).couples_noise
