"""Standard LangGraph agent shapes with planted stochastic models: ``create_agent`` (with and
without CAR's middleware), ``create_react_agent`` v1 and v2, and a ``langgraph-supervisor`` app
whose workers are subgraphs, on the callback and the ``import_thread`` paths.

Support shapes (``car_adapters.demo.support_agent``): the decision at step 1 refunds with
p = 0.3 when the injection is visible, 0 without. Supervisor (``supervisor_app``): the account
worker's ``flag_account`` at step 4 closes with p = 0.5 when the injection is visible; step 5
(``close_account``) only carries it out. Analytically, for a failing run:

    P(fail | do_resample(decision)) = P(fail | do_context(decision, identity)) = p
    P(fail | do_context(decision, remove_injection)) = 0      P(fail | do_resample(5)) = 1

Tolerance: an arm's mean over n = 48 rollouts has standard error sqrt(p(1-p)/n) (0.066 at
p = 0.3); we allow 4 of them (0.26). A do_context that ends branches early (0.0) or
an edit not applied lands outside; arms at 0 or 1 are exact.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from car_adapters.demo import supervisor_app as sv
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel, CarMiddleware, LangGraphAgent
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import create_react_agent
from langgraph.types import Command

import car_core as car
from car_core.errors import InvalidInput
from car_core.testing import run_conformance

# the support app's tools, classified: lookups run on branches, the refund never does
SA: dict[str, Any] = {"safe_tools": sa.SAFE_TOOLS, "side_effect_tools": sa.SIDE_EFFECT_TOOLS}

N = 48


@contextlib.contextmanager
def _no_warning() -> Iterator[None]:
    yield


def tol(p: float) -> float:
    return 4 * math.sqrt(p * (1 - p) / N)


def support_app(shape: str, model: Any) -> tuple[Any, Any]:
    saver = InMemorySaver()
    if shape.startswith("create_agent"):
        mw = CarMiddleware() if shape.endswith("middleware") else None
        app = create_agent(model, sa.TOOLS, system_prompt=sa.SYSTEM_PROMPT, checkpointer=saver,
                           middleware=[mw] if mw else [])
        return app, mw
    with pytest.warns(Warning):  # create_react_agent is deprecated in favour of create_agent
        app = create_react_agent(model, sa.TOOLS, prompt=sa.SYSTEM_PROMPT, checkpointer=saver,
                                 version=shape[-2:])
    return app, None


def failing(app: Any, inputs: dict[str, Any], outcome: Any) -> car.Trajectory:
    cb = CarCallback()
    for i in range(60):  # seeded models: deterministic
        app.invoke(inputs, {"configurable": {"thread_id": f"user-{i}"}, "callbacks": [cb]})
        if outcome(cb.run):
            assert cb.run is not None
            return cb.run
    raise AssertionError("no failing run")


@pytest.mark.parametrize("shape", ["create_agent", "create_agent_middleware",
                                   "react_v1", "react_v2"])
def test_support_shapes_identity_edit_matches_resample(shape: str) -> None:
    app, mw = support_app(shape, sa.PlantedSupportModel(rng_seed=0))
    run = failing(app, sa.inputs(), sa.outcome)
    agent = LangGraphAgent(app, model=mw, safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    resample = car.intervene(run, agent, car.do_resample(1), outcome=sa.outcome, rollouts=N)
    same = car.intervene(run, agent, car.do_context(1, lambda m: m), outcome=sa.outcome,
                         rollouts=N, seed=1)
    fixed = car.intervene(run, agent, car.do_context(1, sa.remove_injection),
                          outcome=sa.outcome, rollouts=N)
    assert abs(resample.mean - 0.3) <= tol(0.3) and abs(same.mean - 0.3) <= tol(0.3)
    assert fixed.mean == 0.0
    assert all(len(t.steps) >= 3 for t in same.trajectories)  # the model decided again


def test_middleware_holds_later_steps_and_seeds() -> None:
    """do_action at the decision with a held later step needs control: the middleware gives it
    (the plain create_agent app names what to add)."""
    app, mw = support_app("create_agent_middleware", sa.PlantedSupportModel(rng_seed=0))
    run = failing(app, sa.inputs(), sa.outcome)
    agent = LangGraphAgent(app, model=mw, **SA)
    held = [car.do_resample(1), car.do_action(2, run.steps[2].action)]
    assert car.intervene(run, agent, held, outcome=sa.outcome, rollouts=8).mean == 1.0
    assert agent.couples_noise
    plain, _ = support_app("create_agent", sa.PlantedSupportModel(rng_seed=0))
    run2 = failing(plain, sa.inputs(), sa.outcome)
    with pytest.raises(car.errors.AdapterError, match="CarMiddleware"):
        car.intervene(run2, LangGraphAgent(plain, **SA), [car.do_resample(1),
                                                    car.do_action(2, run2.steps[2].action)],
                      outcome=sa.outcome, rollouts=2)


def test_an_unknown_side_effect_name_lists_the_graph_tools() -> None:
    app, _ = support_app("create_agent", sa.PlantedSupportModel(rng_seed=0))
    with pytest.raises(InvalidInput, match=r"\['issue_refnd'\].*'issue_refund', 'lookup_order'"):
        LangGraphAgent(app, side_effect_tools=["issue_refnd"])


@pytest.mark.parametrize(("kind", "path"), [("supervisor", "callback"),
                                           ("supervisor", "import_thread"),
                                           ("swarm", "import_thread")])
def test_multi_agent_apps_fork_inside_worker_subgraphs(kind: str, path: str) -> None:
    """langgraph-supervisor (decision at step 4) and langgraph-swarm (research hands off
    itself, so the decision is step 2); the import path must rebuild the callback's steps."""
    with pytest.warns(Warning) if kind == "supervisor" else _no_warning():
        build = sv.build_app if kind == "supervisor" else sv.build_swarm
        app = build(sv.PlantedAgentModel(rng_seed=1), InMemorySaver())
    run = failing(app, sv.inputs(), sv.outcome)
    agent = LangGraphAgent(app, safe_tools=sv.SAFE_TOOLS, side_effect_tools=["close_account"])
    if path == "import_thread":
        imported = agent.import_thread(str(run.meta["thread_id"]))
        assert [s.action for s in imported.steps] == [s.action for s in run.steps]
        run = imported
    agents = (["supervisor", "research_agent", "research_agent", "supervisor"]
              if kind == "supervisor" else ["research_agent", "research_agent"])
    k = len(agents)
    assert [s.meta["agent"] for s in run.steps][:k + 3] == [*agents, *["account_agent"] * 3]
    closed = len(sv.CLOSED)
    n = 32  # 4 standard errors at p = 0.5: 0.35, so an early-ending branch (0.0) lands outside
    resample = car.intervene(run, agent, car.do_resample(k), outcome=sv.outcome, rollouts=n)
    same = car.intervene(run, agent, car.do_context(k, lambda m: m), outcome=sv.outcome,
                         rollouts=n, seed=1)
    fixed = car.intervene(run, agent, car.do_context(k, sv.remove_injection),
                          outcome=sv.outcome, rollouts=16)
    after = car.intervene(run, agent, car.do_resample(k + 1), outcome=sv.outcome, rollouts=8)
    four_se = 4 * math.sqrt(0.25 / n)
    assert abs(resample.mean - 0.5) <= four_se and abs(same.mean - 0.5) <= four_se
    assert fixed.mean == 0.0 and after.mean == 1.0
    # every branch that closed the account was answered from the record (the note is free
    # text, re-worded at random: matched on account_id by default)
    assert len(sv.CLOSED) == closed


@pytest.mark.parametrize("shape", ["create_agent_middleware", "v1", "v2"])
def test_controlled_shapes_pass_the_conformance_suite(shape: str) -> None:
    """With CAR deciding the model calls (CarMiddleware or CarChatModel) every check runs; a
    plain app cannot hold later steps, which the replay check needs."""
    model = sa.PlantedSupportModel(rng_seed=0, p_follow=0.5)
    if shape == "create_agent_middleware":
        app, ctl = support_app(shape, model)
    else:
        ctl = CarChatModel(inner=model)
        with pytest.warns(Warning):  # create_react_agent is deprecated
            app = create_react_agent(ctl, sa.TOOLS, prompt=sa.SYSTEM_PROMPT,
                                     checkpointer=InMemorySaver(), version=shape)
    ran = run_conformance(
        lambda: LangGraphAgent(app, model=ctl, safe_tools=sa.SAFE_TOOLS,
                               side_effect_tools=sa.SIDE_EFFECT_TOOLS,
                               simulators={"issue_refund": lambda args: {"refunded": "sim"}}),
        context=sa.inputs(), outcome=sa.outcome, seed=0)
    assert ran == ["replay", "lineage", "forced", "noise", "identity", "async", "stop",
                   "coupling", "fingerprint"]


class Router(sa.PlantedSupportModel):
    """A triage model: always routes to support (deterministic)."""

    def decide(self, messages: Any) -> AIMessage:
        return AIMessage("route: support")


def hand_built(saver: Any, model: Any) -> Any:
    """A custom graph: a triage model node hands off with ``Command(goto=...)`` to the support
    agent, compiled without a checkpointer and added as a node (a subgraph that inherits the
    parent's checkpointer, so its checkpoints live in the ``support:<task>`` namespace)."""
    router = Router()

    def triage(state: MessagesState) -> Command[Any]:
        return Command(goto="support", update={"messages": [router.invoke(state["messages"])]})

    graph = StateGraph(MessagesState)
    graph.add_node("triage", triage, destinations=("support",))
    graph.add_node("support", sa.build_app(model))
    graph.add_edge(START, "triage")
    return graph.compile(checkpointer=saver)


def test_command_handoff_into_a_subgraph_with_an_inherited_checkpointer() -> None:
    """Step 0 is triage (two model nodes in all), step 2 the planted decision inside the
    subgraph: p = 0.3 from there, 0 without the injection."""
    app = hand_built(InMemorySaver(), sa.PlantedSupportModel(rng_seed=0))
    run = failing(app, sa.inputs(), sa.outcome)
    assert [(s.meta["agent"], s.meta["node"]) for s in run.steps][:3] == [
        ("triage", "triage"), ("support", "agent"), ("support", "agent")]
    agent = LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS, side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    imported = agent.import_thread(str(run.meta["thread_id"]))
    assert [s.action for s in imported.steps] == [s.action for s in run.steps]
    resample = car.intervene(run, agent, car.do_resample(2), outcome=sa.outcome, rollouts=N)
    same = car.intervene(imported, agent, car.do_context(2, lambda m: m), outcome=sa.outcome,
                         rollouts=N, seed=1)
    fixed = car.intervene(run, agent, car.do_context(2, sa.remove_injection),
                          outcome=sa.outcome, rollouts=16)
    assert abs(resample.mean - 0.3) <= tol(0.3) and abs(same.mean - 0.3) <= tol(0.3)
    assert fixed.mean == 0.0


def test_forced_values_are_written_as_the_worker_node_in_its_namespace() -> None:
    """Without any model wrapper: do_action / do_observation at the account worker's decision
    are written as its ``model`` node inside its subgraph, and the branch goes on from there
    (a forced "keep", or a "keep" result, never closes: exact 0)."""
    with pytest.warns(Warning):
        app = sv.build_app(sv.PlantedAgentModel(rng_seed=1), InMemorySaver())
    run = failing(app, sv.inputs(), sv.outcome)
    agent = LangGraphAgent(app, safe_tools=sv.SAFE_TOOLS, side_effect_tools=["close_account"])
    keep = json.loads(json.dumps(run.steps[4].action))
    keep["tool_calls"][0]["function"]["arguments"] = json.dumps({"account_id": sv.ACCOUNT,
                                                                 "action": "keep"})
    forced = car.intervene(run, agent, car.do_action(4, keep), outcome=sv.outcome, rollouts=4)
    assert forced.mean == 0.0
    for t in forced.trajectories:
        call = t.steps[4].action["tool_calls"][0]["function"]
        assert json.loads(call["arguments"])["action"] == "keep"
        assert t.steps[4].meta["ns"] == run.steps[4].meta["ns"]
    told = car.intervene(run, agent, car.do_observation(4, [json.dumps({"flagged": "keep"})]),
                         outcome=sv.outcome, rollouts=4)
    assert told.mean == 0.0


class ParallelSupport(sa.PlantedSupportModel):
    """Decides and refunds in one message: ``record_decision`` and ``issue_refund`` as two
    parallel tool calls (p = 0.3 with the injection), which ``create_agent`` sends to its tools
    node as two ``Send`` tasks."""

    def decide(self, messages: Any) -> AIMessage:
        tools = [m for m in messages if m.type == "tool"]
        n = sum(isinstance(m, AIMessage) for m in messages)
        if not tools:
            return AIMessage("", tool_calls=[{"id": f"c{n}", "name": "lookup_order",
                                              "args": {"order_id": sa.ORDER_ID}}])
        if n == 1:
            injected = any(m.type == "human" and sa.INJECTION in str(m.content)
                           for m in messages)
            if injected and self._draw() < self.p_follow:
                return AIMessage("", tool_calls=[
                    {"id": f"c{n}a", "name": "record_decision", "args": {"decision": "refund"}},
                    {"id": f"c{n}b", "name": "issue_refund",
                     "args": {"order_id": sa.ORDER_ID, "amount": 129.0}}])
            return AIMessage("", tool_calls=[{"id": f"c{n}a", "name": "record_decision",
                                              "args": {"decision": "deny"}}])
        return AIMessage("Done.")


def test_parallel_tool_calls_sent_as_tasks_are_guarded() -> None:
    """The decision (step 1) makes both calls at once; the refund is answered from the record
    on every branch (ledger: the recorded one only), and P(fail | do_resample(1)) = 0.3."""
    refunds: list[dict[str, Any]] = []

    @tool("issue_refund")
    def ledger_refund(order_id: str, amount: float) -> str:
        """Refund an order (moves money: a side effect)."""
        refunds.append({"order_id": order_id, "amount": amount})
        return json.dumps({"refunded": order_id, "amount": amount})

    tools = [sa.lookup_order, sa.record_decision, ledger_refund]
    app = create_agent(ParallelSupport(rng_seed=0), tools, checkpointer=InMemorySaver())
    run = failing(app, sa.inputs(), sa.outcome)
    assert len(run.steps[1].action["tool_calls"]) == 2 and len(run.steps[1].observation) == 2
    assert len(refunds) == 1
    agent = LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS, side_effect_tools=["issue_refund"])
    dist = car.intervene(run, agent, car.do_resample(1), outcome=sa.outcome, rollouts=N)
    assert abs(dist.mean - 0.3) <= tol(0.3) and len(refunds) == 1
    refunded = [t for t in dist.trajectories if sa.outcome(t)]
    assert refunded and all(len(t.steps[1].observation) == 2 for t in refunded)
