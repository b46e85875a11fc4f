"""An estimate on the asyncio executor that one branch stops leaves nothing of the others behind.

The app (the support graph of ``car_adapters.demo.support_agent``) keeps its checkpoints in an
``AsyncSqliteSaver`` opened on an event loop of its own thread, as ``open_in_background`` opens
it for ``car attribute``, so every branch runs on that loop. At step 1 the planted model draws
u: below 0.5 it refunds an amount made of u, which the record cannot answer (the branch stops the
estimate with ``SideEffectBlocked``), else it checks the order's history, a safe tool that waits
and, cancelled, takes a while to close and raises as it goes (an MCP session's task group does).
A user trial saw the estimate stop while such branches still ran: the CLI exited, the saver was
closed under them, "Task exception was never retrieved" tracebacks followed and their
``car-branch-*`` threads stayed in the user's checkpoint database for good.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

import car_core as car
from car_core.engine.execution import AsyncioExecutor
from car_core.errors import SideEffectBlocked

T = TypeVar("T")
ROLLOUTS = 8  # all in flight at once; P(no branch of either kind) = 2 * 0.5**8, seeds fixed


class Probe:
    """How many history checks started, and how many finished their cleanup; they wait only
    once ``waits`` is set (on branches, not while the run is recorded)."""

    def __init__(self) -> None:
        self.started = self.ended = 0
        self.waits = False


PROBE = Probe()


@tool
async def check_history(order_id: str) -> str:
    """Look through an order's earlier refunds (slow)."""
    PROBE.started += 1
    try:
        await asyncio.sleep(60 if PROBE.waits else 0)
    except asyncio.CancelledError:
        await asyncio.sleep(0.3)  # closing its session takes a while
        raise RuntimeError("the history session closed while it was cancelled") from None
    finally:
        PROBE.ended += 1
    return "no earlier refunds"


class RefundOrCheck(sa.PlantedSupportModel):
    """Step 0 looks the order up; step 1 refunds 100·u (u < 0.5, slowly, so the checks are
    under way) or checks the history; step 2 replies."""

    def decide(self, messages: Any) -> AIMessage:
        last = next((m for m in reversed(messages) if isinstance(m, ToolMessage)), None)
        if last is None or last.name != "lookup_order":
            return super().decide(messages)
        n_ai = sum(isinstance(m, AIMessage) for m in messages)
        u = self._draw()
        if u < 0.5:
            time.sleep(0.3)
            call = {"name": "issue_refund", "args": {"order_id": sa.ORDER_ID,
                                                      "amount": round(100 * u, 2)}}
        else:
            call = {"name": "check_history", "args": {"order_id": sa.ORDER_ID}}
        return AIMessage("", tool_calls=[{"id": f"call_{n_ai}", **call}])


class AppLoop:
    """An event loop in a thread of its own, reporting what would be logged to ``errors``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _, context: self.errors.append(context))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def settle(self) -> None:
        """Wait until nothing but this runs on the loop, then let dead tasks be collected."""
        async def idle() -> None:
            for _ in range(100):
                if asyncio.all_tasks() <= {asyncio.current_task()}:
                    return
                await asyncio.sleep(0.05)
        self.run(idle())
        gc.collect()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def app_loop() -> Iterator[AppLoop]:
    loop = AppLoop()
    yield loop
    loop.close()


def branch_threads(saver: Any) -> set[str]:
    return {c.config["configurable"]["thread_id"] for c in saver.list(None)
            if c.config["configurable"]["thread_id"].startswith("car-branch-")}


def test_a_stopped_estimate_waits_for_every_branch_in_flight(app_loop: AppLoop,
                                                             tmp_path: Path) -> None:
    opened = AsyncSqliteSaver.from_conn_string(str(tmp_path / "checkpoints.db"))
    saver = app_loop.run(opened.__aenter__())
    open_ = True
    try:
        wrapper = CarChatModel(inner=RefundOrCheck(rng_seed=0))
        app = sa.build_app(wrapper, saver, tools=[*sa.TOOLS, check_history])
        cb = CarCallback()
        for i in range(20):
            app_loop.run(app.ainvoke(sa.inputs(), {"configurable": {"thread_id": f"user-{i}"},
                                                   "callbacks": [cb]}))
            if sa.outcome(cb.run):
                break
        run = cb.run
        assert run is not None and sa.outcome(run)
        agent = LangGraphAgent(app, model=wrapper, side_effect_tools=sa.SIDE_EFFECT_TOOLS,
                               safe_tools=[*sa.SAFE_TOOLS, "check_history"])
        PROBE.started = PROBE.ended = 0
        PROBE.waits = True
        with pytest.raises(SideEffectBlocked, match="issue_refund"):
            car.intervene(run, agent, car.do_resample(1), outcome=sa.outcome,
                          rollouts=ROLLOUTS, seed=0, executor=AsyncioExecutor(ROLLOUTS),
                          progress=False)
        assert PROBE.started > 0  # branches were in flight when the estimate stopped
        assert PROBE.ended == PROBE.started  # each was awaited through its cleanup
        assert branch_threads(saver) == set()  # and deleted its thread before the call returned
        # what the CLI does next: exit, closing the saver (``open_in_background``'s atexit)
        app_loop.run(opened.__aexit__(None, None, None))
        open_ = False
        app_loop.settle()
        assert [c.get("message") for c in app_loop.errors] == []  # no unretrieved exception
    finally:
        PROBE.waits = False
        if open_:
            app_loop.run(opened.__aexit__(None, None, None))
