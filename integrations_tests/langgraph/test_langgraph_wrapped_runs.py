"""Graph runs started inside the user's own runnable (an eval harness that ``abatch``-es the
app, a ``prompt | app`` sequence) are each recorded as a run of their own: keyed by the
outermost chain, thirty concurrent runs of an eval set were stored as one run of every
input's steps interleaved, and attributed as one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car

TICKETS = [f"Ticket {i}: my order arrived damaged, what can you do?" for i in range(4)]


def _texts(run: car.Trajectory) -> set[str]:
    """Every user message any step of ``run`` decided from."""
    return {m["content"] for s in run.steps for m in s.state if m.get("role") == "user"}


def _config(cb: CarCallback) -> dict[str, Any]:
    return {"callbacks": [cb]}


def _each_run_is_one_ticket(runs: list[car.Trajectory], threads: list[str]) -> None:
    assert len(runs) == len(TICKETS)
    assert sorted(_texts(r).pop() for r in runs) == sorted(TICKETS)
    assert all(len(_texts(r)) == 1 for r in runs)  # no run holds another ticket's steps
    assert sorted(str(r.meta["thread_id"]) for r in runs) == sorted(threads)
    for r in runs:
        assert {s.meta["thread_id"] for s in r.steps} == {r.meta["thread_id"]}
        assert r.context == {"messages": r.steps[0].state}


def test_an_eval_harness_that_batches_the_app_records_one_run_per_input(
        tmp_path: Path) -> None:
    app = sa.build_app(sa.PlantedSupportModel(rng_seed=0), InMemorySaver())
    threads = [f"case-{i}" for i in range(len(TICKETS))]

    async def evaluate(cases: list[str], config: RunnableConfig) -> list[Any]:
        return await app.abatch(
            [sa.inputs(c) for c in cases],
            [{**config, "configurable": {"thread_id": t}} for t in threads])

    cb = CarCallback(store=tmp_path / "runs.db", app=app)
    asyncio.run(RunnableLambda(evaluate).ainvoke(TICKETS, _config(cb)))
    cb.flush()
    _each_run_is_one_ticket(cb.runs, threads)
    with car.RunStore(tmp_path / "runs.db", readonly=True) as store:
        assert len(store.runs()) == len(TICKETS)  # the harness itself is no run


def test_a_sequence_ending_in_the_app_records_the_app_run_with_its_own_input() -> None:
    def app() -> Any:  # the same planted draws each time
        return sa.build_app(sa.PlantedSupportModel(rng_seed=0), InMemorySaver())

    direct = CarCallback()
    app().invoke(sa.inputs(TICKETS[0]), {"configurable": {"thread_id": "d"},
                                         "callbacks": [direct]})
    cb = CarCallback()
    chain = RunnableLambda(sa.inputs) | app()
    chain.invoke(TICKETS[0], {"configurable": {"thread_id": "d"}, "callbacks": [cb]})
    assert len(cb.runs) == 1
    run, want = cb.runs[0], direct.run
    assert want is not None
    assert [s.action for s in run.steps] == [s.action for s in want.steps]
    assert run.context == want.context


def test_a_subgraph_run_inside_a_graph_node_stays_in_its_parent_run() -> None:
    inner = sa.build_app(sa.PlantedSupportModel(rng_seed=0))
    from langgraph.graph import START, MessagesState, StateGraph

    outer = StateGraph(MessagesState)
    outer.add_node("desk", inner)
    outer.add_edge(START, "desk")
    app = outer.compile(checkpointer=InMemorySaver())
    cb = CarCallback()
    RunnableLambda(lambda t, config: app.invoke(sa.inputs(t), config)).invoke(
        TICKETS[1], {"configurable": {"thread_id": "s"}, "callbacks": [cb]})
    assert len(cb.runs) == 1
    assert len(cb.runs[0].steps) >= 2
    assert {s.meta["node"] for s in cb.runs[0].steps} == {"agent"}
