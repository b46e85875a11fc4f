"""A recorder that cannot store its runs says so. A trial recorded 30 LangGraph runs onto a full
disk: none was stored, ``cb.run`` and ``cb.flush()`` returned, and the only sign was a log line.
Each framework's recorder now raises ``StoreError`` from ``flush()`` (and from reading ``run``)
once for the runs it could not store, which it keeps in ``runs``.

The store's connection is capped at its size now (``PRAGMA max_page_count``): SQLite answers a
write past it as it answers a full disk."""

# No ``from __future__ import annotations``: LlamaIndex finds a tool's parameters by their
# evaluated annotations.
import asyncio
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, function_tool, set_tracing_disabled
from car_adapters.common.messages import assistant, tool_call
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel
from car_adapters.llamaindex import CarRecorder as LlamaIndexRecorder
from car_adapters.llamaindex import ScriptedLLM
from car_adapters.openai_agents import CarRecorder as AgentsRecorder
from car_adapters.openai_agents import ScriptedModel
from langgraph.checkpoint.memory import InMemorySaver
from llama_index.core.agent.workflow import FunctionAgent

import car_core as car
from car_core.errors import StoreError

set_tracing_disabled(True)
PAD = "x" * 20_000  # a run this long needs pages the capped store does not have


def full_store(tmp_path: Path) -> car.RunStore:
    store = car.RunStore(tmp_path / "car.db")
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")
    return store


def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    if messages[-1]["role"] != "tool":
        return assistant(None, [tool_call("c0", "lookup", {"order": "7"})])
    return f"Done. {PAD}"


def test_langgraph_callback(tmp_path: Path) -> None:
    app = sa.build_app(CarChatModel(inner=sa.PlantedSupportModel(rng_seed=0)), InMemorySaver())
    cb = CarCallback(store=full_store(tmp_path))
    app.invoke(sa.inputs(sa.CUSTOMER_MESSAGE + PAD),
               {"configurable": {"thread_id": "t0"}, "callbacks": [cb]})
    with pytest.raises(StoreError, match=r"1 run\(s\) could not be stored: .*disk is full"):
        cb.flush()
    assert len(cb.runs) == 1 and len(cb.store_errors) == 1
    cb.flush()  # said once


def test_openai_agents_recorder(tmp_path: Path) -> None:
    @function_tool
    def lookup(order: str) -> str:
        """Look an order up."""
        return "a kettle"

    rec = AgentsRecorder(store=full_store(tmp_path))
    app = Agent(name="desk", tools=[lookup], model=ScriptedModel(decide))
    Runner.run_sync(app, "order 7", hooks=rec)
    with pytest.raises(StoreError, match=r"1 run\(s\) could not be stored"):
        rec.run  # noqa: B018 - reading it is what raises
    assert len(rec.runs) == 1
    rec.flush()


def test_llamaindex_recorder(tmp_path: Path) -> None:
    def lookup(order: str) -> str:
        """Look an order up."""
        return "a kettle"

    rec = LlamaIndexRecorder(store=full_store(tmp_path)).attach()
    try:
        agent = FunctionAgent(name="desk", system_prompt="Help.", tools=[lookup],
                              llm=ScriptedLLM(decide))
        async def go() -> None:
            await agent.run(user_msg="order 7")
        asyncio.run(go())
        with pytest.raises(StoreError, match=r"1 run\(s\) could not be stored"):
            rec.flush()
        assert len(rec.runs) == 1
    finally:
        rec.detach()
