"""LangGraph branches as coroutines: ``abranch`` is ``branch`` for the same plan and noise,
concurrent branches keep to their own plan and noise, async-only tools work, and the default
executor follows the model (concurrent when it waits on a server, sequential in process) without
changing any result.

The app is the travel desk (``car_adapters.demo.travel_desk``) on ``create_agent`` with
``CarMiddleware``: step 1 books the over-budget flex fare with probability ``p_flex`` = 0.25, so
in a failing run rescue(1) = 0.75, later steps' rescue is 0 and the locus is step 1. Its side
effects append to a ledger file: branches add no line.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from car_adapters.demo import travel_desk as td
from car_adapters.langgraph import CarCallback, CarMiddleware, LangGraphAgent
from car_adapters.langgraph.model import waits_on_server
from car_adapters.models.local import LocalChatModel
from langchain.agents import create_agent
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import BaseTool, tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.engine.execution import AsyncioExecutor, Sequential, default_executor
from car_core.model.interventions import compile_plan
from car_core.model.seeding import branch_noise


def app_of(model: Any, tools: list[BaseTool]) -> tuple[Any, CarMiddleware]:
    mw = CarMiddleware()
    return create_agent(model, tools, middleware=[mw], checkpointer=InMemorySaver()), mw


def record_failure(app: Any, invoke: Callable[[Any, dict[str, Any]], Any]) -> car.Trajectory:
    cb = CarCallback()
    for i in range(40):  # p_flex = 0.25: no failure in 40 tries has probability 1e-5
        invoke(td.inputs(), {"configurable": {"thread_id": f"trip-{i}"}, "callbacks": [cb]})
        assert cb.run is not None
        if td.booked_flex(cb.run):
            return cb.run
    raise AssertionError("the planted model never booked the flex fare")


def travel_agent(app: Any, mw: CarMiddleware) -> LangGraphAgent:
    return LangGraphAgent(app, model=mw, side_effect_tools=list(td.SIDE_EFFECT_TOOLS),
                          safe_tools=list(td.SAFE_TOOLS), simulators=td.simulators())


def key(t: car.Trajectory) -> list[tuple[Any, Any, Any, Any]]:
    """What a branch decided and saw, step by step, and how (origin, the per-step seed)."""
    return [(s.action, s.observation, s.meta.get("origin"), s.meta.get("seed"))
            for s in t.steps]


def ledger_lines(ledger: Path) -> int:
    return len(ledger.read_text(encoding="utf-8").splitlines()) if ledger.exists() else 0


@pytest.fixture()
def sync_desk(tmp_path: Path) -> tuple[Any, CarMiddleware, car.Trajectory, Path]:
    ledger = tmp_path / "ledger.jsonl"
    app, mw = app_of(td.TravelModel(rng_seed=1), td.sync_tools(ledger))
    return app, mw, record_failure(app, app.invoke), ledger


def saver_booking() -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "book_flight", "arguments": json.dumps({"fare_id": td.SAVER})}}]}


def test_abranch_is_branch_for_the_same_plan_and_noise(sync_desk: Any) -> None:
    app, mw, run, ledger = sync_desk
    agent = travel_agent(app, mw)
    before = ledger_lines(ledger)
    plans = [car.do_resample(k) for k in range(len(run.steps))]
    plans += [car.do_action(1, saver_booking()),
              car.do_observation(0, json.dumps(td.FARES["LIS"][:1]))]
    for i, intervention in enumerate(plans):
        plan = compile_plan(run, intervention)
        for r in range(3):
            noise = branch_noise(0, r, f"arm{i}", True)
            assert key(asyncio.run(agent.abranch(run, plan, noise))) == key(
                agent.branch(run, plan, noise))
    assert ledger_lines(ledger) == before


class Rendezvous(td.TravelModel):
    """The travel model whose first two calls wait for each other: two branches started
    together are both inside a model call before either goes on."""

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        self.__dict__["meet"] = {"arrived": 0, "event": None}

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        meet = self.__dict__["meet"]
        if meet["arrived"] < 2:
            meet["arrived"] += 1
            if meet["event"] is None:
                meet["event"] = asyncio.Event()
            if meet["arrived"] < 2:
                await meet["event"].wait()
            else:
                meet["event"].set()
        return await super()._agenerate(messages, stop, run_manager, **kwargs)


def test_concurrent_branches_keep_their_own_plan_and_noise(tmp_path: Path) -> None:
    """Branch A re-draws step 1 under one noise, branch B is forced to book the saver fare
    at step 1 under another; run together, interleaved inside their model calls, each gives
    exactly what it gives alone."""
    ledger = tmp_path / "ledger.jsonl"
    model = Rendezvous(rng_seed=1)
    app, mw = app_of(model, td.sync_tools(ledger))
    run = record_failure(app, app.invoke)
    before = ledger_lines(ledger)
    agent = travel_agent(app, mw)
    a = (compile_plan(run, car.do_resample(1)), branch_noise(0, 0, "a", True))
    b = (compile_plan(run, car.do_action(1, saver_booking())), branch_noise(0, 1, "b", True))

    async def together() -> list[car.Trajectory]:
        return list(await asyncio.gather(agent.abranch(run, *a), agent.abranch(run, *b)))

    model.__dict__["meet"].update(arrived=0, event=None)
    got_a, got_b = asyncio.run(together())
    assert model.__dict__["meet"]["arrived"] == 2  # both were inside a model call at once
    assert key(got_a) == key(agent.branch(run, *a))
    assert key(got_b) == key(agent.branch(run, *b))
    assert got_a.steps[1].meta["seed"] == a[1].int_seed(1)  # A's own noise at its own step
    assert got_b.steps[1].meta["origin"] == "forced"
    assert json.loads(got_b.steps[1].action["tool_calls"][0]["function"]["arguments"]) == {
        "fare_id": td.SAVER}
    assert got_b.steps[2].meta["seed"] == b[1].int_seed(2)
    assert ledger_lines(ledger) == before


def async_tools(ledger: Path) -> list[BaseTool]:
    """The travel tools as ``async def`` tools with no sync twin."""
    sync = {t.name: t for t in td.sync_tools(ledger)}

    @tool
    async def search_fares(destination: str) -> str:
        """The fares to a destination airport, cheapest first (reads only)."""
        return str(sync["search_fares"].func(destination))  # type: ignore[misc]

    @tool
    async def book_flight(fare_id: str) -> str:
        """Book a fare and charge the traveller's card (a side effect)."""
        return str(sync["book_flight"].func(fare_id))  # type: ignore[misc]

    @tool
    async def send_itinerary(booking_id: str) -> str:
        """E-mail the itinerary of a booking to the traveller (a side effect)."""
        return str(sync["send_itinerary"].func(booking_id))  # type: ignore[misc]

    return [search_fares, book_flight, send_itinerary]


def test_async_only_tools_are_attributed_on_either_path(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    app, mw = app_of(td.TravelModel(rng_seed=1), async_tools(ledger))
    run = record_failure(app, lambda v, c: asyncio.run(app.ainvoke(v, c)))
    before = ledger_lines(ledger)
    agent = travel_agent(app, mw)
    assert agent.is_async
    for executor in (Sequential(), AsyncioExecutor(4)):
        res = car.contrastive(run, agent, outcome=td.booked_flex, rollouts=16, seed=0,
                              executor=executor, progress=False)
        assert res.locus == 1, res
    assert ledger_lines(ledger) == before


def test_results_for_a_seed_do_not_depend_on_the_executor(sync_desk: Any) -> None:
    app, mw, run, ledger = sync_desk
    agent = travel_agent(app, mw)
    before = ledger_lines(ledger)
    got = []
    for executor in (Sequential(), AsyncioExecutor(16), AsyncioExecutor(3)):
        res = car.contrastive(run, agent, outcome=td.booked_flex, rollouts=16, seed=3,
                              executor=executor, progress=False)
        got.append((res.locus, res.rollouts_used,
                    [(s.step, s.effect, s.ci) for s in res.steps]))
    assert got[0][0] == 1
    assert got[1] == got[0] and got[2] == got[0]
    assert ledger_lines(ledger) == before


def test_a_settled_branch_ends_early_on_the_async_path_too(sync_desk: Any) -> None:
    app, mw, run, _ = sync_desk
    agent = travel_agent(app, mw)

    def outcome(t: car.Trajectory) -> bool:
        return td.booked_flex(t)

    outcome.settled = lambda t: any(  # type: ignore[attr-defined]
        c["function"]["name"] == "book_flight"
        for s in t.steps for c in (s.action or {}).get("tool_calls") or ())
    runs = {}
    for executor in (Sequential(), AsyncioExecutor(4)):
        dist = car.intervene(run, agent, car.do_resample(1), outcome=outcome, rollouts=4,
                             seed=0, executor=executor, progress=False)
        runs[type(executor).__name__] = [(t.status, len(t.steps), t.outcome.value)
                                         for t in dist.trajectories]
    assert runs["Sequential"] == runs["AsyncioExecutor"]
    assert all(status == "settled" and n == 2 for status, n, _ in runs["Sequential"])


def test_the_default_executor_follows_the_model(tmp_path: Path) -> None:
    tools = td.sync_tools(tmp_path / "ledger.jsonl")
    in_process = travel_agent(*app_of(td.TravelModel(), tools))
    assert not in_process.prefers_concurrency
    assert isinstance(default_executor(in_process), Sequential)
    hosted = travel_agent(*app_of(td.TravelModel(remote=True), tools))
    assert hosted.prefers_concurrency
    executor = default_executor(hosted)
    assert isinstance(executor, AsyncioExecutor) and executor.concurrency == 16
    server = ChatOpenAI(model="gpt-4o-mini", api_key="sk-not-used",  # type: ignore[arg-type]
                        base_url="http://127.0.0.1:9/v1")
    app, _ = app_of(server, tools)
    unwrapped = LangGraphAgent(app, side_effect_tools=list(td.SIDE_EFFECT_TOOLS),
                               safe_tools=list(td.SAFE_TOOLS))
    assert unwrapped.prefers_concurrency
    assert waits_on_server(server) and not waits_on_server(LocalChatModel())
