"""The OpenAI Agents SDK adapter over real HTTP: the SDK's own chat-completions model against
llama.cpp's OpenAI-compatible server on loopback (the embedded model, no key, no mocks)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from car_adapters.models.local import MODEL
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent
from openai import AsyncOpenAI

import car_core as car
from integrations_tests.support.servers import llama_server

set_tracing_disabled(True)
KEY = "sk-local-test-key"


class EmptyContentTransport(httpx.AsyncHTTPTransport):
    """llama-cpp-python's server rejects ``"content": null`` on an assistant message that
    carries tool calls (the SDK sends null, as the OpenAI API allows): send "" instead."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/chat/completions"):
            body = json.loads(request.content)
            for m in body.get("messages", []):
                if m.get("content") is None:
                    m["content"] = ""
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
            request = httpx.Request("POST", request.url, headers=headers, json=body)
        return await super().handle_async_request(request)


@pytest.fixture(scope="module")
def llama_url() -> Iterator[str]:
    with llama_server(start_timeout=120) as url:
        yield url


def test_record_and_branch_through_llama_cpp_server(llama_url: str) -> None:
    lookups: list[str] = []

    @function_tool
    def lookup_order(order_id: str) -> str:
        """Look up the status of an order."""
        lookups.append(order_id)
        return json.dumps({"order_id": order_id, "status": "shipped"})

    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=AsyncOpenAI(
        base_url=llama_url, api_key=KEY, max_retries=0,
        http_client=httpx.AsyncClient(transport=EmptyContentTransport())))
    # tool_choice names the tool (the server's default chat format calls tools only then); the
    # SDK resets it after the call, so the second turn answers in text
    agent = Agent(name="Support", instructions="You are a support agent. Use tools to answer.",
                  model=model, tools=[lookup_order],
                  model_settings=ModelSettings(tool_choice="lookup_order", max_tokens=40,
                                               temperature=0.7))
    rec = CarRecorder()
    Runner.run_sync(agent, "Where is order 42?", hooks=rec, max_turns=4)
    run = rec.run
    assert len(run.steps) == 2 and run.status == "complete"
    assert run.steps[0].action["tool_calls"][0]["function"]["name"] == "lookup_order"
    assert run.steps[0].observation[0]["content"].startswith('{"order_id"')
    assert run.steps[1].action["content"] and run.steps[1].meta["model"] == MODEL
    assert run.steps[1].meta["usage"]["prompt_tokens"] > 0
    assert KEY not in json.dumps(run.to_dict())          # the key is never stored
    before = len(lookups)
    wrapped = OpenAIAgentsAgent(agent, side_effect_tools=["lookup_order"], max_turns=4)
    assert wrapped.couples_noise    # CAR's noise drives it (a per-step seed, checked below)
    dist = car.intervene(run, wrapped, car.do_resample(1),
                         outcome=lambda t: "shipped" not in str(t.steps[-1].action["content"]),
                         rollouts=2, seed=0)
    assert len(lookups) == before                        # the held tool call did not run
    for branch in dist.trajectories:
        assert [s.meta["origin"] for s in branch.steps] == ["held", "live"]
        assert branch.steps[1].meta["model"] == MODEL and branch.steps[1].action["content"]
        assert branch.steps[1].meta["usage"]["completion_tokens"] > 0
    # each branch step sends a seed drawn from the branch noise (ModelSettings.extra_args) and
    # llama.cpp honours it: the same seed gives the same sampled reply at temperature 0.7
    again = car.intervene(run, wrapped, car.do_resample(1), outcome=lambda t: 0.0, rollouts=2,
                          seed=0)
    assert [t.steps[1].action for t in again.trajectories] == [
        t.steps[1].action for t in dist.trajectories]
