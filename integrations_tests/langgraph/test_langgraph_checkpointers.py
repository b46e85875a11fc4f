"""The LangGraph adapter on the checkpointers people deploy: SqliteSaver's async twin
(AsyncSqliteSaver, over aiosqlite) and PostgresSaver / AsyncPostgresSaver against a real
PostgreSQL server the tests start themselves (the ``postgres_dsn`` fixture), with apps driven by
``invoke``/``stream`` and ``ainvoke``/``astream``.

The app is the support agent of ``car_adapters.demo.support_agent``: the decision at step 1 is
"refund" with probability 0.3 after the injection (failure = a refund was issued), every other
step is deterministic. For a failing run, analytically: P(fail | factual) = 1,
P(fail | do_resample(1)) = 0.3, so the rescue of step 1 is 0.7 and step 1 is the locus (steps 2
and 3 only carry the decision out: rescue 0); removing the injection gives P(fail) = 0 exactly.
The multi-agent app is the supervisor of ``car_adapters.demo.supervisor_app``
(``langgraph-supervisor`` over two ``create_agent`` workers, three checkpoint namespaces): step 4
is ``account_agent``'s decision, "close" with p = 0.5 while the injection is in view, step 5 the
mechanical ``close_account``; for a failing run rescue(4) = 0.5, every other rescue is 0, so the
locus is 4, and without the injection P(fail) = 0 exactly.
The rescue interval is contrastive's own (95%, family-wise across the steps it tests), so the
truth falls outside it with probability at most 0.05 for a given seed; the seeds are fixed, so
each test is deterministic.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from car_adapters.demo import supervisor_app as sv
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from langchain_core.messages import SystemMessage
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import car_core as car
from car_core.errors import AdapterError
from car_core.testing import SideEffectLedger, run_conformance

ROLLOUTS = 24
RESCUE = 1.0 - 0.3


@pytest.fixture
def ledger(monkeypatch: pytest.MonkeyPatch) -> SideEffectLedger:
    """Counts every real call of ``issue_refund``."""
    book = SideEffectLedger(sa.SIDE_EFFECT_TOOLS)
    monkeypatch.setattr(sa.issue_refund, "func", book.wrap("issue_refund", sa.issue_refund.func))
    return book


def async_app(model: Any, saver: Any) -> Any:
    """The support graph with an async model node (so only ainvoke/astream can run it)."""
    bound = model.bind_tools(sa.TOOLS)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke([SystemMessage(sa.SYSTEM_PROMPT),
                                                  *state["messages"]])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(sa.TOOLS))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


def threads(saver: Any) -> set[str]:
    return {c.config["configurable"]["thread_id"] for c in saver.list(None)}


def attribute(run: car.Trajectory, agent: LangGraphAgent, ledger: SideEffectLedger) -> None:
    """What a user does with a recorded failing run; checked against the analytic truth."""
    before = threads(agent.saver)
    ledger.reset()
    res = car.contrastive(run, agent, outcome=sa.outcome, rollouts=ROLLOUTS, seed=0,
                          progress=False)
    assert res.locus == 1
    low, high = res.steps[1].ci
    assert low <= RESCUE <= high, (res.steps[1].effect, res.steps[1].ci)
    rescued = car.intervene(run, agent, car.do_context(1, sa.remove_injection),
                            outcome=sa.outcome, rollouts=8, seed=0, progress=False)
    assert rescued.mean == 0.0
    assert ledger.count() == 0  # refunds on branches were answered from the record
    assert threads(agent.saver) == before  # every branch thread was deleted again


def first_failure(invoke: Callable[[str], Any], cb: CarCallback, tries: int = 50,
                  outcome: Callable[[car.Trajectory], Any] = sa.outcome) -> car.Trajectory:
    """The first recorded run that fails; the planted model's rng is seeded, so which ticket
    fails is deterministic (p = 0.3 per support ticket, 0.5 per supervisor ticket)."""
    tag = uuid.uuid4().hex[:8]  # one database serves several tests: keep their threads apart
    for i in range(tries):
        invoke(f"ticket-{tag}-{i}")
        if cb.run is not None and outcome(cb.run):
            return cb.run
    raise AssertionError(f"no failing run in {tries} tickets")


async def afirst_failure(invoke: Callable[[str], Any], cb: CarCallback, tries: int = 50,
                         outcome: Callable[[car.Trajectory], Any] = sa.outcome
                         ) -> car.Trajectory:
    tag = uuid.uuid4().hex[:8]
    for i in range(tries):
        await invoke(f"ticket-{tag}-{i}")
        if cb.run is not None and outcome(cb.run):
            return cb.run
    raise AssertionError(f"no failing run in {tries} tickets")


def config(thread_id: str, cb: CarCallback) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}, "callbacks": [cb]}


def test_postgres_saver_with_a_streamed_app(postgres_dsn: str, ledger: SideEffectLedger) -> None:
    with PostgresSaver.from_conn_string(postgres_dsn) as saver:
        saver.setup()
        wrapper = CarChatModel(inner=sa.PlantedSupportModel(rng_seed=0))
        app = sa.build_app(wrapper, saver)
        cb = CarCallback()
        run = first_failure(lambda t: list(app.stream(sa.inputs(), config(t, cb))), cb)
        assert ledger.count("issue_refund") == 1  # the user's own run refunded for real
        assert len(run.steps) == 4 and run.steps[0].meta["checkpoint_id"]
        importer = LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS,
                                  side_effect_tools=sa.SIDE_EFFECT_TOOLS)
        imported = importer.import_thread(run.meta["thread_id"])
        assert [s.action for s in imported.steps] == [s.action for s in run.steps]
        attribute(run, LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS, model=wrapper,
                                      side_effect_tools=ledger.names),
                  ledger)


def async_case(open_saver: Callable[[], Any], drive: str, ledger: SideEffectLedger, *,
               conformance: bool = False) -> None:
    """Record with ``ainvoke`` or ``astream`` inside the event loop the saver runs on, then
    attribute (and with ``conformance``, run the whole conformance suite) from a worker thread
    while that loop keeps running."""
    async def main() -> None:
        async with open_saver() as saver:
            if isinstance(saver, AsyncPostgresSaver):  # creates its tables
                await saver.setup()
            model = sa.PlantedSupportModel(rng_seed=0)
            wrapper = CarChatModel(inner=model)
            app = async_app(wrapper, saver)
            cb = CarCallback()

            async def invoke(thread_id: str) -> None:
                if drive == "ainvoke":
                    await app.ainvoke(sa.inputs(), config(thread_id, cb))
                else:
                    async for _ in app.astream(sa.inputs(), config(thread_id, cb)):
                        pass

            run = await afirst_failure(invoke, cb)
            assert ledger.count("issue_refund") == 1 and len(run.steps) == 4
            agent = LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS, model=wrapper,
                                   side_effect_tools=ledger.names)
            calls = model.calls
            with pytest.raises(AdapterError, match="asyncio.to_thread"):  # would deadlock
                car.intervene(run, agent, car.do_resample(1), outcome=sa.outcome, rollouts=2,
                              progress=False)
            assert model.calls == calls  # refused before any branch ran
            if conformance:  # while the ledger still holds the recorded run's real call
                ran = await asyncio.to_thread(
                    run_conformance, lambda: agent, run=run, outcome=sa.outcome,
                    side_effects=ledger)
                assert ran == ["replay", "lineage", "forced", "noise", "identity", "async",
                               "stop", "coupling", "fingerprint-in-process", "side-effects"]
            await asyncio.to_thread(attribute, run, agent, ledger)

    asyncio.run(main())


def test_async_sqlite_saver_with_ainvoke(tmp_path: Path, ledger: SideEffectLedger) -> None:
    path = str(tmp_path / "checkpoints.db")
    async_case(lambda: AsyncSqliteSaver.from_conn_string(path), "ainvoke", ledger)
    with sqlite3.connect(path) as conn:  # the same file reads back with the sync saver
        assert threads(SqliteSaver(conn))


def test_async_postgres_saver_with_astream(postgres_dsn: str, ledger: SideEffectLedger) -> None:
    async_case(lambda: AsyncPostgresSaver.from_conn_string(postgres_dsn), "astream", ledger,
               conformance=True)


def test_an_async_saver_whose_loop_has_ended_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "checkpoints.db")
    kept: dict[str, Any] = {}

    async def main() -> None:
        async with AsyncSqliteSaver.from_conn_string(path) as saver:
            wrapper = CarChatModel(inner=sa.PlantedSupportModel(p_follow=1.0))
            app = async_app(wrapper, saver)
            cb = CarCallback()
            await app.ainvoke(sa.inputs(), config("gone", cb))
            kept.update(app=app, run=cb.run)

    asyncio.run(main())
    agent = LangGraphAgent(kept["app"], safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    with pytest.raises(AdapterError, match="not running"):
        car.intervene(kept["run"], agent, car.do_resample(1), outcome=sa.outcome, rollouts=2,
                      progress=False)



# -- the supervisor app: the same savers under a multi-agent graph ---------------------------------
SUPERVISOR_RESCUE = 1.0 - 0.5
LABEL = "account_agent, step 4 (its 1st decision)"


@pytest.fixture
def closings(monkeypatch: pytest.MonkeyPatch) -> SideEffectLedger:
    """Counts every real call of ``close_account``."""
    book = SideEffectLedger(["close_account"])
    monkeypatch.setattr(sv.close_account, "func",
                        book.wrap("close_account", sv.close_account.func))
    return book


def supervisor(model: Any, saver: Any) -> Any:
    with warnings.catch_warnings():  # create_supervisor calls the deprecated create_react_agent
        warnings.simplefilter("ignore", DeprecationWarning)
        return sv.build_app(model, saver)


def attribute_supervisor(run: car.Trajectory, agent: LangGraphAgent,
                         closings: SideEffectLedger) -> None:
    """Which agent and which step, checked against the planted truth, with no real closing."""
    assert [s.meta["agent"] for s in run.steps][3:6] == ["supervisor", "account_agent",
                                                         "account_agent"]
    before = threads(agent.saver)
    closings.reset()
    res = car.contrastive(run, agent, outcome=sv.outcome, rollouts=ROLLOUTS, seed=0,
                          progress=False)
    assert res.locus == 4 and res.locus_label == LABEL
    low, high = res.steps[4].ci
    assert 0 < low <= SUPERVISOR_RESCUE <= high, (res.steps[4].effect, res.steps[4].ci)
    rescued = car.intervene(run, agent, car.do_context(4, sv.remove_injection),
                            outcome=sv.outcome, rollouts=8, seed=0, progress=False)
    assert rescued.mean == 0.0
    assert closings.count() == 0  # closings on branches were answered from the record
    assert threads(agent.saver) == before  # every branch thread, all namespaces, deleted


def test_postgres_saver_with_a_supervisor_streaming_its_subgraphs(
        postgres_dsn: str, closings: SideEffectLedger) -> None:
    with PostgresSaver.from_conn_string(postgres_dsn) as saver:
        saver.setup()
        wrapper = CarChatModel(inner=sv.PlantedAgentModel(rng_seed=1))
        app = supervisor(wrapper, saver)
        cb = CarCallback()
        run = first_failure(lambda t: list(app.stream(sv.inputs(), config(t, cb),
                                                      subgraphs=True)), cb,
                            tries=40, outcome=sv.outcome)
        assert closings.count("close_account") == 1  # the user's own run closed it for real
        agent = LangGraphAgent(app, safe_tools=sv.SAFE_TOOLS, model=wrapper,
                               side_effect_tools=["close_account"])
        imported = agent.import_thread(run.meta["thread_id"])
        assert [s.action for s in imported.steps] == [s.action for s in run.steps]
        assert [s.meta["agent"] for s in imported.steps] == [s.meta["agent"] for s in run.steps]
        attribute_supervisor(run, agent, closings)
        closings.reset()  # the import_thread path is guarded too
        res = car.contrastive(imported, agent, outcome=sv.outcome, rollouts=ROLLOUTS, seed=0,
                              progress=False)
        assert res.locus == 4 and res.locus_label == LABEL and closings.count() == 0


def supervisor_async_case(open_saver: Callable[[], Any], drive: str,
                          closings: SideEffectLedger) -> None:
    """Record the supervisor app with ``ainvoke`` or ``astream`` (subgraph updates included)
    inside the saver's event loop, then attribute from a worker thread while it runs."""
    async def main() -> None:
        async with open_saver() as saver:
            if isinstance(saver, AsyncPostgresSaver):
                await saver.setup()
            wrapper = CarChatModel(inner=sv.PlantedAgentModel(rng_seed=1))
            app = supervisor(wrapper, saver)
            cb = CarCallback()

            async def invoke(thread_id: str) -> None:
                if drive == "ainvoke":
                    await app.ainvoke(sv.inputs(), config(thread_id, cb))
                else:
                    async for _ in app.astream(sv.inputs(), config(thread_id, cb),
                                               stream_mode="updates", subgraphs=True):
                        pass

            run = await afirst_failure(invoke, cb, tries=40, outcome=sv.outcome)
            assert closings.count("close_account") == 1 and len(run.steps) == 8
            agent = LangGraphAgent(app, safe_tools=sv.SAFE_TOOLS, model=wrapper,
                                   side_effect_tools=["close_account"])
            with pytest.raises(AdapterError, match="asyncio.to_thread"):  # would deadlock
                car.intervene(run, agent, car.do_resample(4), outcome=sv.outcome, rollouts=2,
                              progress=False)
            assert closings.count() == 1  # refused before any branch ran
            await asyncio.to_thread(attribute_supervisor, run, agent, closings)

    asyncio.run(main())


def test_async_sqlite_saver_with_a_supervisor_on_ainvoke(
        tmp_path: Path, closings: SideEffectLedger) -> None:
    path = str(tmp_path / "checkpoints.db")
    supervisor_async_case(lambda: AsyncSqliteSaver.from_conn_string(path), "ainvoke", closings)


def test_async_postgres_saver_with_a_supervisor_on_astream(
        postgres_dsn: str, closings: SideEffectLedger) -> None:
    supervisor_async_case(lambda: AsyncPostgresSaver.from_conn_string(postgres_dsn), "astream",
                          closings)
