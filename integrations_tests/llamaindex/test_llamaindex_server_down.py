"""A model server that dies in the middle of a LlamaIndex attribution, over real HTTP.

The same product rule as for ``ChatAgent`` (``test_models_server_down``): the attribution stops
with ``ModelUnavailable`` instead of failing every remaining branch, the branches that finished
stay in the store, and a resume with the same ``attribution_id`` once the server is back gives
the uninterrupted result, calling the model only for the branches that were missing.

The agent is a LlamaIndex ``FunctionAgent`` whose LLM talks to the stub OpenAI-compatible
server of ``test_models_server_down`` through the official ``openai`` client (``AsyncOpenAI``,
no retries of its own): a dead server surfaces as the client's own ``APIConnectionError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai
import pytest
from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, step_rng
from car_adapters.llamaindex._messages import from_dict, to_dicts
from car_adapters.openai import wire_messages
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, ChatResponse
from llama_index.core.bridge.pydantic import PrivateAttr

import car_core as car
from car_core.engine.execution import Executor, Sequential
from car_core.errors import ModelUnavailable
from car_core.store import RunStore
from integrations_tests.models.test_models_server_down import TOOLS, ModelServer
from integrations_tests.support.dying_server import Counted, comparable
from integrations_tests.support.llamaindex_stub import AsyncReplyLLM
from integrations_tests.support.servers import free_port, halfway

ROLLOUTS = 8


class LoopbackLLM(AsyncReplyLLM):
    """A function-calling LLM over an OpenAI-compatible server. The request seed comes from
    the CAR step's noise on a branch (so branches are coupled), else from a counter."""

    base_url: str = ""
    uses_car_noise: bool = True
    _count: int = PrivateAttr(default=0)

    async def _reply(self, messages: Sequence[ChatMessage]) -> ChatResponse:
        rng = step_rng()
        self._count += 1
        seed = int(rng.integers(2**31 - 1)) if rng is not None else 3 * self._count
        client = openai.AsyncOpenAI(api_key="loopback", base_url=self.base_url,
                                    max_retries=0, timeout=2.0)
        async with client:
            resp = await client.chat.completions.create(
                model="stub-model", messages=wire_messages(to_dicts(messages)),  # type: ignore
                seed=seed, tools=TOOLS)  # type: ignore[arg-type]
        msg = resp.choices[0].message
        out = {"role": "assistant", "content": msg.content, "tool_calls": [
            {"id": c.id, "type": "function",
             "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in msg.tool_calls or ()]}
        return ChatResponse(message=from_dict(out))


def lookup_order(order_id: str) -> str:
    """Look up the status of an order."""
    return f'{{"order_id": "{order_id}", "status": "shipped"}}'


def issue_refund(order_id: str) -> str:
    """Refund an order."""
    return f'{{"order_id": "{order_id}", "refunded": true}}'


def make_agent(base_url: str) -> FunctionAgent:
    return FunctionAgent(tools=[lookup_order, issue_refund], llm=LoopbackLLM(base_url=base_url),
                         system_prompt="You are a support agent. Never refund shipped orders.")


def refunded(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "issue_refund" for s in run.steps
               for c in (s.action or {}).get("tool_calls") or ())


def attribute(store: RunStore, run: car.Trajectory, base_url: str, aid: str,
              executor: Executor) -> Any:
    agent = LlamaIndexAgent(make_agent(base_url), safe_tools=["lookup_order"],
                            side_effect_tools=["issue_refund"])
    return car.contrastive(run, agent, outcome=refunded,
                           rollouts=ROLLOUTS, seed=5, store=store, attribution_id=aid,
                           executor=executor, search="full", progress=False)


@pytest.fixture
def port() -> int:
    return free_port()


def test_llamaindex_attribution_stops_on_an_outage_and_resumes(
        tmp_path: Path, port: int, servers: list[ModelServer]) -> None:
    servers.append(ModelServer(port))
    rec = CarRecorder().attach()
    try:
        agent = make_agent(servers[0].base_url)

        async def main() -> None:
            await agent.run(user_msg="Where is order 42?")
        asyncio.run(main())  # seeds 3, 6: lookup, then a refund (6 % 3 == 0)
    finally:
        rec.detach()
    run = rec.run
    assert refunded(run) and len(run.steps) == 3

    counted = Counted(lambda: servers[-1])
    with RunStore(tmp_path / "reference.db") as ref_store:
        reference = attribute(ref_store, run, servers[0].base_url, "reference", counted)
    assert reference.locus == 1 and not reference.failures
    total = sum(counted.calls.values())
    order = list(counted.calls)

    # die after answering the first call of a branch half-way through that needs two or more
    done, spent = halfway(order, counted.calls)
    assert 0 < len(done) < len(order)
    servers[0].stop()
    servers.append(ModelServer(port, answers=spent + 1))
    db = tmp_path / "car.db"
    with RunStore(db) as store, pytest.raises(ModelUnavailable, match="model server") as err:
        attribute(store, run, servers[-1].base_url, "interrupted", Sequential())
    assert "resume" in str(err.value)
    # the server that went down is named, by its address only (a trial's message named none)
    assert f"the model server at http://127.0.0.1:{port} failed at step" in str(err.value)
    with RunStore(db) as store:
        stored = {(b["arm"], b["rollout"]) for b in store.branches("interrupted")}
        assert sorted(stored) == sorted(done)  # the finished branches, and only them
        assert store.attribution("interrupted").status == "running"

    assert servers[-1].stopped.wait(10)
    servers.append(ModelServer(port))
    with RunStore(db) as store:
        resumed = attribute(store, run, servers[-1].base_url, "interrupted", Sequential())
        assert store.attribution("interrupted").status == "complete"
    assert comparable(resumed) == comparable(reference)
    assert servers[-1].answered == total - spent  # only the missing branches called the model
