"""Apps whose branches cannot run, refused by name before any branch (no model call, no
branch thread, no attribution stored), rather than after branches ran:

- an app compiled with ``interrupt_before`` / ``interrupt_after`` on a node a branch reaches
  (LangGraph's customer-support tutorial, part 3): each branch would stop there for a person
  nobody is to answer;
- a ``create_agent`` app whose ``HumanInTheLoopMiddleware`` gates a tool: a branch whose model
  calls it would stop the same way;
- an app compiled with a node cache (``cache=``) whose model node has a ``CachePolicy``: each
  branch's re-decided node would be answered from the cache, a copy and not a re-draw;
- an app with ``async def`` nodes on a sync-only checkpointer (``SqliteSaver``): LangGraph runs
  such an app only under ``ainvoke``, which that checkpointer cannot serve.

The app is the support agent (``car_adapters.demo.support_agent``) with ``p_follow = 1``, so
the recorded run always fails (a refund) and every branch would call the planted model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel, CarMiddleware, LangGraphAgent
from car_adapters.langgraph.saver import sync_only
from langchain.agents import create_agent
from langchain.agents.middleware import (
    HumanInTheLoopMiddleware,
    LLMToolSelectorMiddleware,
    ModelCallLimitMiddleware,
    ToolCallLimitMiddleware,
)
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage
from langgraph.cache.memory import InMemoryCache
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import CachePolicy, Command, interrupt

import car_core as car
from car_core.engine.agent import agent_fingerprint
from car_core.errors import AdapterError
from car_core.model.interventions import compile_plan
from car_core.model.seeding import branch_noise

NOISE = branch_noise(0, 0, "refused-up-front", True)
SA: dict[str, Any] = {"safe_tools": sa.SAFE_TOOLS, "side_effect_tools": sa.SIDE_EFFECT_TOOLS}
USER = {"configurable": {"thread_id": "user"}}


def support_graph(model: CarChatModel, *, run_async: bool = False) -> StateGraph[Any]:
    """The support graph behind an ``intake`` node that runs before the first model call;
    ``run_async``: the model node is an ``async def``."""
    bound = model.bind_tools(sa.TOOLS)

    def prompt(state: MessagesState) -> list[BaseMessage]:
        return [SystemMessage(sa.SYSTEM_PROMPT), *state["messages"]]

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(prompt(state))]}

    async def async_agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(prompt(state))]}

    graph = StateGraph(MessagesState)
    graph.add_node("intake", lambda state: {})
    graph.add_node("agent", async_agent if run_async else agent)
    graph.add_node("tools", ToolNode(sa.TOOLS))
    graph.add_edge(START, "intake")
    graph.add_edge("intake", "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph


def approved(app: Any) -> None:
    """Run the ticket on thread ``user`` as the tutorial does: a person approves every time
    the app stops (``invoke(None, config)`` resumes a graph stopped before or after a node,
    ``Command(resume=...)`` one a node's ``interrupt()`` stopped)."""
    app.invoke(sa.inputs(), USER)
    for _ in range(10):
        snapshot = app.get_state(USER)
        if not snapshot.next:
            return
        app.invoke(Command(resume="approved") if snapshot.interrupts else None, USER)
    raise AssertionError("the app kept stopping")


def branch_threads(saver: Any) -> set[str]:
    return {c.config["configurable"]["thread_id"] for c in saver.list(None)} - {"user"}


class Paused:
    """The support graph compiled with ``compile_kw`` (interrupts) on an InMemorySaver, its
    ticket run with approvals, and the run imported from the thread."""

    def __init__(self, **compile_kw: Any) -> None:
        self.model = sa.PlantedSupportModel(p_follow=1.0)
        self.wrapper = CarChatModel(inner=self.model)
        self.saver = InMemorySaver()
        self.app = support_graph(self.wrapper).compile(checkpointer=self.saver, **compile_kw)
        approved(self.app)
        self.agent = LangGraphAgent(self.app, model=self.wrapper, **SA)
        self.run = self.agent.import_thread("user")
        assert sa.outcome(self.run) and len(self.run.steps) == 4

    def attribute(self, store: Any) -> Any:
        return car.contrastive(self.run, self.agent, outcome=sa.outcome, rollouts=4, seed=0,
                               store=store, progress=False)


@pytest.mark.parametrize(("compile_kw", "stop"), [
    ({"interrupt_before": ["tools"]}, "before node 'tools' (interrupt_before)"),
    ({"interrupt_after": ["tools"]}, "after node 'tools' (interrupt_after)"),
    ({"interrupt_before": "*"}, "before node 'agent' (interrupt_before)"),
], ids=["before", "after", "before-every-node"])
def test_an_interrupt_a_branch_reaches_is_refused_before_any_branch(
        store: Any, compile_kw: dict[str, Any], stop: str) -> None:
    paused = Paused(**compile_kw)
    calls = paused.model.calls
    with pytest.raises(AdapterError, match="stops for human input") as refused:
        paused.attribute(store)
    assert stop in str(refused.value) and "no branch runs" in str(refused.value)
    assert refused.value.hint and "without" in refused.value.hint
    # refused before any branch: no model call, no branch thread, no attribution
    assert paused.model.calls == calls
    assert branch_threads(paused.saver) == set()
    assert store.runs(branches=True) == [] and store.attributions() == []
    # every way into a branch refuses it the same way, without writing a checkpoint
    plan = compile_plan(paused.run, car.do_resample(1))
    with pytest.raises(AdapterError, match="stops for human input"):
        paused.agent.check_plan(paused.run, plan)
    with pytest.raises(AdapterError, match="stops for human input"):
        paused.agent.branch(paused.run, plan, NOISE)
    assert paused.model.calls == calls and branch_threads(paused.saver) == set()


@pytest.mark.parametrize("mode", ["batched", "per_call"])
def test_an_approval_gate_is_refused_before_any_branch(store: Any, mode: str) -> None:
    """A trial's attribution ran four branches before the first one stopped at the gate; the
    same app built without it attributes the run (``force_agent``: the gate is a node of the
    graph, so the fingerprint differs), the gated refund named a side effect by the user."""
    model = sa.PlantedSupportModel(p_follow=1.0)
    saver = InMemorySaver()

    def build(gate: bool) -> Any:
        middleware: list[Any] = [CarMiddleware()]
        if gate:
            middleware.append(HumanInTheLoopMiddleware(
                interrupt_on={"issue_refund": True, "lookup_order": False},
                interrupt_mode=mode))
        return create_agent(model, sa.TOOLS, middleware=middleware, checkpointer=saver)

    gated = build(True)
    gated.invoke(sa.inputs(), USER)
    for _ in range(5):  # a person approves every refund the model asks for
        asked = gated.get_state(USER).interrupts
        if not asked:
            break
        yes = {"type": "approve"}
        gated.invoke(Command(resume={"decisions": [yes]} if mode == "batched"
                             else {i.id: yes for i in asked}), USER)
    agent = LangGraphAgent(gated, **SA)
    run = agent.import_thread("user")
    assert sa.outcome(run)
    calls = model.calls
    with pytest.raises(AdapterError, match=r"asks a person to approve 'issue_refund' "
                                           r"\(HumanInTheLoopMiddleware in node ") as refused:
        car.contrastive(run, agent, outcome=sa.outcome, rollouts=4, seed=0, store=store,
                        progress=False)
    assert "no branch runs" in str(refused.value)
    assert refused.value.hint and "force_agent=True" in refused.value.hint
    assert model.calls == calls and branch_threads(saver) == set()
    assert store.runs(branches=True) == [] and store.attributions() == []
    plain = LangGraphAgent(build(False), **SA)
    dist = car.intervene(run, plain, car.do_resample(1), outcome=sa.outcome, rollouts=2,
                         seed=0, progress=False, force_agent=True)
    assert dist.n == 2 and model.calls > calls


def test_a_cached_model_node_is_refused_before_any_branch(store: Any) -> None:
    """An audit's app cached its model node (``CachePolicy``, ``compile(cache=...)``): the
    branches' re-decided node came from the cache, and CAR read a rescue of 1 where the
    planted one was 0.5. The same graph compiled without the cache attributes the run."""
    model = sa.PlantedSupportModel(p_follow=1.0)
    wrapper = CarChatModel(inner=model)
    graph = support_graph(wrapper)
    graph.nodes["agent"] = dataclasses.replace(graph.nodes["agent"],
                                               cache_policy=CachePolicy(ttl=600))
    saver = InMemorySaver()
    app = graph.compile(checkpointer=saver, cache=InMemoryCache())
    app.invoke(sa.inputs(), USER)
    agent = LangGraphAgent(app, model=wrapper, **SA)
    run = agent.import_thread("user")
    calls = model.calls
    with pytest.raises(AdapterError, match=r"node 'agent' is cached \(its CachePolicy, "
                                           r"compile\(cache=\.\.\.\)\)") as refused:
        car.contrastive(run, agent, outcome=sa.outcome, rollouts=4, seed=0, store=store,
                        progress=False)
    assert "no branch runs" in str(refused.value) and "without cache=" in (refused.value.hint or "")
    assert model.calls == calls and branch_threads(saver) == set()
    assert store.runs(branches=True) == [] and store.attributions() == []
    plain = LangGraphAgent(support_graph(wrapper).compile(checkpointer=saver), model=wrapper,
                           **SA)
    assert run.meta["agent_fingerprint"] == agent_fingerprint(plain)
    dist = car.intervene(run, plain, car.do_resample(1), outcome=sa.outcome, rollouts=2,
                         seed=0, progress=False)
    assert dist.n == 2 and model.calls > calls


@pytest.mark.parametrize("limited", ["model", "tool", "thread", "not reached"])
def test_a_per_run_call_limit_the_run_reached_is_refused_before_any_branch(
        store: Any, limited: str) -> None:
    """An audit's ``ModelCallLimitMiddleware(run_limit=2)`` cut the app's third model call
    off, but a branch forked at step 1 counted from 0 (the count is an ``UntrackedValue``, out
    of the checkpoints) and made it: P(fail) read 0.71 for a truth of 0.5. The support run
    makes 4 model calls and 3 tool calls: limits of 4 and 3 were reached. A ``thread_limit``
    is counted in the checkpoints, and a limit the run stayed below is a safety net: both
    branch."""
    model = sa.PlantedSupportModel(p_follow=1.0)
    middleware: Any = {"model": ModelCallLimitMiddleware(run_limit=4),
                       "tool": ToolCallLimitMiddleware(run_limit=3),
                       "thread": ModelCallLimitMiddleware(thread_limit=50),
                       "not reached": ModelCallLimitMiddleware(run_limit=50)}[limited]
    saver = InMemorySaver()
    app = create_agent(model, sa.TOOLS, checkpointer=saver,
                       middleware=[CarMiddleware(), middleware])
    app.invoke(sa.inputs(), USER)
    agent = LangGraphAgent(app, **SA)
    run = agent.import_thread("user")
    calls = model.calls
    if limited in ("thread", "not reached"):
        dist = car.intervene(run, agent, car.do_resample(1), outcome=sa.outcome, rollouts=2,
                             seed=0, progress=False)
        assert dist.n == 2 and model.calls > calls
        return
    name = type(middleware).__name__
    limit = middleware.run_limit
    with pytest.raises(AdapterError, match=rf"{name}\(run_limit={limit}\) in node ") as refused:
        car.contrastive(run, agent, outcome=sa.outcome, rollouts=4, seed=0, store=store,
                        progress=False)
    assert "thread_limit" in (refused.value.hint or "")
    assert model.calls == calls and branch_threads(saver) == set()


class Selector(FakeMessagesListChatModel):
    """``LLMToolSelectorMiddleware``'s model: picks every tool, through the schema tool the
    middleware binds."""

    def bind_tools(self, tools: Any, **kw: Any) -> Any:
        return self.bind(**kw)


def test_a_second_model_call_in_the_model_nodes_task_is_refused_by_name(store: Any) -> None:
    """``LLMToolSelectorMiddleware`` asks its model which tools to offer before each call of
    the agent's model, in the same node task: an audit read "the checkpoint step 2 was
    scheduled from does not match the record: the run comes from a different graph or
    thread" of the very app and thread. The shape is named first."""
    model = sa.PlantedSupportModel(p_follow=1.0)
    pick = AIMessage("", tool_calls=[{"id": "sel", "name": "ToolSelectionResponse",
                                      "args": {"tools": [t.name for t in sa.TOOLS]}}])
    selector = Selector(responses=[pick] * 20)
    saver = InMemorySaver()
    app = create_agent(model, sa.TOOLS, checkpointer=saver, middleware=[
        LLMToolSelectorMiddleware(model=selector, max_tools=3)])
    recorder = CarCallback(app=app)
    app.invoke(sa.inputs(), {**USER, "callbacks": [recorder]})
    run = recorder.run
    assert run is not None and sa.outcome(run)
    agent = LangGraphAgent(app, **SA)
    calls = model.calls
    with pytest.raises(AdapterError, match=r"node 'model' made several model calls in one "
                                           r"task \(steps \d+ and \d+\)"):
        car.contrastive(run, agent, outcome=sa.outcome, rollouts=4, seed=0, store=store,
                        progress=False)
    assert model.calls == calls and branch_threads(saver) == set()


def test_an_interrupt_in_a_subgraph_is_refused_by_its_subgraph() -> None:
    model = sa.PlantedSupportModel(p_follow=1.0)
    wrapper = CarChatModel(inner=model)
    desk = support_graph(wrapper).compile(interrupt_before=["tools"], name="desk")
    parent = StateGraph(MessagesState)
    parent.add_node("desk", desk)
    parent.add_edge(START, "desk")
    saver = InMemorySaver()
    app = parent.compile(checkpointer=saver)
    approved(app)
    agent = LangGraphAgent(app, model=wrapper, **SA)
    run = agent.import_thread("user")
    calls = model.calls
    with pytest.raises(AdapterError, match="before node 'tools' of subgraph 'desk' "
                                           r"\(interrupt_before\)"):
        agent.preflight(run)
    assert model.calls == calls and branch_threads(saver) == set()


def test_a_subgraph_with_memory_of_its_own_is_refused_before_any_branch() -> None:
    """``compile(checkpointer=True)``: a user trial's branches ran the subgraph without the
    memory it keeps across invocations (no step caused the failure, CAR said) or skipped it
    (a rescue of 1 at a step never re-decided). The same subgraph compiled without it is
    forked like any other."""
    model = sa.PlantedSupportModel(p_follow=1.0)
    wrapper = CarChatModel(inner=model)

    def app_with(checkpointer: Any) -> Any:
        desk = support_graph(wrapper).compile(checkpointer=checkpointer, name="desk")
        parent = StateGraph(MessagesState)
        parent.add_node("desk", desk)
        parent.add_edge(START, "desk")
        return parent.compile(checkpointer=InMemorySaver())

    calls = model.calls
    with pytest.raises(AdapterError, match=r"subgraph\(s\) \['desk'\] are compiled with "
                                           "checkpointer=True"):
        LangGraphAgent(app_with(True), model=wrapper, **SA)
    assert model.calls == calls
    LangGraphAgent(app_with(None), model=wrapper, **SA)


def test_the_same_graph_compiled_without_interrupts_attributes_the_run() -> None:
    """What the refusal tells the user to do: the graph compiled for attribution without its
    interrupts has the fingerprint the run was stamped with (interrupts are no part of it, so
    runs stored before stay attributable), and its branches run from the run's checkpoints."""
    paused = Paused(interrupt_before=["tools"])
    plain = support_graph(paused.wrapper).compile(checkpointer=paused.saver)
    agent = LangGraphAgent(plain, model=paused.wrapper, **SA)
    assert paused.run.meta["agent_fingerprint"] == agent_fingerprint(agent)
    calls = paused.model.calls
    dist = car.intervene(paused.run, agent, car.do_resample(1), outcome=sa.outcome,
                         rollouts=2, seed=0, progress=False)
    assert dist.n == 2 and paused.model.calls > calls
    assert branch_threads(paused.saver) == set()


def test_an_interrupt_no_branch_reaches_is_no_refusal() -> None:
    """``intake`` runs once, before the first model call: no branch starts before it or comes
    back to it, so stopping after it stops no branch."""
    paused = Paused(interrupt_after=["intake"])
    branch = paused.agent.branch(paused.run, compile_plan(paused.run, car.do_resample(1)),
                                 NOISE)
    assert branch.status == "complete" and len(branch.steps) == 4
    assert branch_threads(paused.saver) == set()


def test_an_interrupt_a_node_calls_stops_its_branch_in_plain_words() -> None:
    """``interrupt()`` inside a node may or may not fire (here: only after a refund), so it is
    no refusal up front; a branch it stops is refused there, saying which node stopped it."""
    model = sa.PlantedSupportModel(p_follow=1.0)
    wrapper = CarChatModel(inner=model)
    graph = support_graph(wrapper)

    def review(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, ToolMessage) and last.name == "issue_refund":
            interrupt("approve the refund?")
        return {}

    graph.add_node("review", review)
    graph.edges.discard(("tools", "agent"))
    graph.add_edge("tools", "review")
    graph.add_edge("review", "agent")
    saver = InMemorySaver()
    app = graph.compile(checkpointer=saver)
    approved(app)
    agent = LangGraphAgent(app, model=wrapper, **SA)
    run = agent.import_thread("user")
    agent.preflight(run)
    with pytest.raises(AdapterError) as stopped:
        agent.branch(run, compile_plan(run, car.do_resample(1)), NOISE)
    text = str(stopped.value)
    assert "a branch from step 1 stopped for human input at node 'review' (interrupt())" in text
    assert "[step 0]" not in text and "intervene after the interrupt" not in text
    assert branch_threads(saver) == set()


# -- async nodes on a sync-only checkpointer ---------------------------------------------------

@pytest.fixture()
def async_recorded(tmp_path: Path) -> Iterator[tuple[Any, CarChatModel, Any, car.Trajectory]]:
    """The support graph with an ``async def`` model node, its ticket run with ``ainvoke`` on
    an ``AsyncSqliteSaver``, then the same graph over the same file on a sync ``SqliteSaver``
    (the trial's ``make_async``), and the run imported from it."""
    path = tmp_path / "checkpoints.db"
    model = sa.PlantedSupportModel(p_follow=1.0)
    wrapper = CarChatModel(inner=model)
    graph = support_graph(wrapper, run_async=True)

    async def record() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
            await graph.compile(checkpointer=saver).ainvoke(sa.inputs(), USER)

    asyncio.run(record())
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    app = graph.compile(checkpointer=saver)
    agent = LangGraphAgent(app, model=wrapper, **SA)
    yield model, wrapper, agent, agent.import_thread("user")
    conn.close()


def test_async_nodes_on_a_sync_only_checkpointer_are_refused_before_any_branch(
        async_recorded: tuple[Any, CarChatModel, Any, car.Trajectory], store: Any) -> None:
    model, _, agent, run = async_recorded
    assert sa.outcome(run) and len(run.steps) == 4
    calls = model.calls
    with pytest.raises(AdapterError, match="async nodes") as refused:
        car.contrastive(run, agent, outcome=sa.outcome, rollouts=4, seed=0, store=store,
                        progress=False)
    text = str(refused.value)
    assert "'agent'" in text and "SqliteSaver is sync-only" in text
    assert refused.value.hint and "AsyncSqliteSaver" in refused.value.hint
    # the way out from `car attribute`, whose factory has no event loop of the user's
    assert "open_in_background(" in refused.value.hint
    assert model.calls == calls
    assert branch_threads(agent.saver) == set()
    assert store.runs(branches=True) == [] and store.attributions() == []
    with pytest.raises(AdapterError, match="sync-only"):
        agent.branch(run, compile_plan(run, car.do_resample(1)), NOISE)
    assert model.calls == calls


def test_which_checkpointers_are_sync_only(tmp_path: Path) -> None:
    """Read from the class, never by calling a coroutine method: ``SqliteSaver`` overrides
    ``aget_tuple`` only to raise, ``PostgresSaver`` keeps the base one that raises."""
    conn = sqlite3.connect(tmp_path / "c.db", check_same_thread=False)
    assert sync_only(SqliteSaver(conn))
    assert sync_only(PostgresSaver.__new__(PostgresSaver))
    assert not sync_only(InMemorySaver())
    assert not sync_only(AsyncSqliteSaver.__new__(AsyncSqliteSaver))
    conn.close()
