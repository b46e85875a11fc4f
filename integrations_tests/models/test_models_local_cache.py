"""The embedded model's prefix cache and its LlamaIndex LLM, for real (llama.cpp on one thread).

The cache must not change a single reply: a prompt evaluated on top of a cached prefix gives
the reply a cold evaluation gives, for every seed, and it must actually be used (the usage
counts the prompt tokens it did not evaluate again).
"""

from __future__ import annotations

import asyncio

import pytest
from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent
from car_adapters.llamaindex.embedded import LocalLLM
from car_adapters.models import local
from car_adapters.models.chat_agent import tool_schema
from llama_index.core.agent.workflow import FunctionAgent

from car_core.contract import Noise

TOOLS = [tool_schema("check_refund_policy", "Check whether an order may be refunded",
                     {"order_id": {"type": "string"}}),
         tool_schema("issue_refund", "Refund an order (moves money)",
                     {"order_id": {"type": "string"}})]
SYSTEM = {"role": "system", "content": "You are a support agent. Check the refund policy "
                                       "before refunding anything. " * 4}
ASK = {"role": "user", "content": "My order A1001 arrived late. Please refund it."}
LATER = [SYSTEM, ASK,
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "call_0_0", "type": "function", "function": {
                 "name": "check_refund_policy", "arguments": '{"order_id": "A1001"}'}}]},
         {"role": "tool", "tool_call_id": "call_0_0", "name": "check_refund_policy",
          "content": '{"refund_allowed": false, "reason": "outside the 30-day window"}'}]


def _replies(messages: list[dict], seeds: range, enabled: bool,
             monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    monkeypatch.setattr(local.PrefixCache, "enabled", enabled)
    out = []
    for s in seeds:
        r = local.generate(messages, tools=TOOLS, seed=s, temperature=0.9, max_tokens=32)
        out.append((r["raw"], r["usage"]["cached_tokens"]))
    return out


def test_a_cached_prefix_gives_exactly_the_cold_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    seeds = range(4)
    cold = _replies(LATER, seeds, False, monkeypatch)
    # warm the cache with a prompt that shares only the system message and the request
    _replies([SYSTEM, ASK], range(1), True, monkeypatch)
    warm = _replies(LATER, seeds, True, monkeypatch)
    assert [t for t, _ in warm] == [t for t, _ in cold]
    assert all(n == 0 for _, n in cold)
    # each warm call reused at least the shared system message and request (whole blocks)
    shared = len(local.load_model().tokenize(str(SYSTEM["content"]).encode())) // local.BLOCK
    assert all(n >= shared * local.BLOCK > 0 for _, n in warm)


def test_llamaindex_agent_runs_on_the_embedded_model_and_replays_its_steps() -> None:
    def check_refund_policy(order_id: str) -> str:
        """Check whether an order may be refunded."""
        return '{"refund_allowed": false}'

    llm = LocalLLM(seed=3, fresh_tools=True, max_tokens=40)
    agent = FunctionAgent(name="desk", tools=[check_refund_policy], llm=llm,
                          system_prompt=str(SYSTEM["content"]))
    async def ask() -> None:
        await agent.run(user_msg=str(ASK["content"]))

    rec = CarRecorder().attach()
    try:
        asyncio.run(ask())
    finally:
        rec.detach()
    run = rec.run
    assert run.steps and llm.calls == len(run.steps)
    first = run.steps[0].action
    # the grammar only allows the offered tool or an answer
    assert first.get("tool_calls") or first.get("content")
    for call in first.get("tool_calls") or ():
        assert call["function"]["name"] == "check_refund_policy"
    # re-deciding a recorded state with the same branch noise gives the same decision, and
    # other noise can give another (the seed reaches the model)
    wrapped = LlamaIndexAgent(agent, safe_tools=["check_refund_policy"])
    again = [wrapped.redecide(run, 0, Noise(11)) for _ in range(2)]
    assert again[0] == again[1]
