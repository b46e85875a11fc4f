"""Model policies over real HTTP on loopback, with the official clients and no mocks.

- ``OpenAIPolicy`` against llama.cpp's own OpenAI-compatible server over the embedded model;
- ``OllamaPolicy`` with the ``ollama`` client against our Ollama-protocol server;
- retries, timeouts, a server that is down, an unknown model and a missing API key against a
  scripted stub server or a closed port.
"""

from __future__ import annotations

import json
import pickle
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from car_adapters.models.chat_agent import ChatAgent, tool_schema
from car_adapters.models.local import MODEL
from car_adapters.models.ratelimit import Backoff, RateLimiter
from car_adapters.ollama import OllamaPolicy
from car_adapters.openai import OpenAIPolicy

import car_core as car
from car_core.errors import InvalidInput, ModelUnavailable
from car_core.testing import FakeClock
from integrations_tests.support.servers import (
    OllamaServer,
    StubOpenAIServer,
    free_port,
    llama_server,
)

TOOLS = [tool_schema("lookup_order", "Look up the status of an order",
                     {"order_id": {"type": "string"}})]
CONTEXT = [{"role": "system", "content": "You are a support agent. Use tools to answer."},
           {"role": "user", "content": "Where is order 42?"}]
ORDERS = {"lookup_order": lambda order_id: {"order_id": order_id, "status": "shipped"}}
SAFE = ["lookup_order"]  # a lookup: safe to run on a branch
LOOKUP = {"type": "function", "function": {"name": "lookup_order"}}


def no_call(run: car.Trajectory) -> bool:
    return not run.steps[0].action["tool_calls"]


@pytest.fixture(scope="module")
def llama_url() -> Iterator[str]:
    with llama_server(start_timeout=120) as url:
        yield url


@pytest.fixture(scope="module")
def ollama_host() -> Iterator[str]:
    with OllamaServer() as server:
        yield server.host


# -- OpenAIPolicy against llama.cpp's server ------------------------------------------------
def test_openai_policy_makes_a_tool_call_through_llama_cpp_server(llama_url: str) -> None:
    policy = OpenAIPolicy(MODEL, base_url=llama_url, tools=TOOLS, tool_choice=LOOKUP,
                          max_tokens=40, temperature=0.7)
    run = car.record(ChatAgent(policy, ORDERS, safe_tools=SAFE, max_steps=1), context=CONTEXT,
                     outcome=no_call, seed=2)
    step = run.steps[0]
    call = step.action["tool_calls"][0]
    # the server's random call id is replaced by a stable one and kept in meta
    assert call["id"] == "call_0_0" and step.meta["tool_call_ids"][0] != "call_0_0"
    assert call["function"]["name"] == "lookup_order"
    assert isinstance(json.loads(call["function"]["arguments"]), dict)
    assert step.meta["usage"]["prompt_tokens"] > 0 and step.meta["retries"] == 0
    assert step.meta["served_model"] == MODEL


def test_openai_policy_seed_reaches_llama_cpp_server(llama_url: str) -> None:
    policy = OpenAIPolicy(MODEL, base_url=llama_url, temperature=1.0, max_tokens=12)
    agent = ChatAgent(policy, max_steps=1)
    runs = [car.record(agent, context="Tell me about cats.", outcome=lambda r: 0.0, seed=s)
            for s in (0, 0, 1, 2)]
    texts = [r.steps[0].action["content"] for r in runs]
    assert texts[0] == texts[1]  # same seed, same sample
    assert len(set(texts[1:])) >= 2  # three seeds at temperature 1 do not all coincide
    assert car.action_match_rate(runs[0], agent, replays=2).rate == 1.0


# -- OllamaPolicy against our Ollama-protocol server -----------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_ollama_policy_tool_call_with_the_real_client(ollama_host: str, stream: bool) -> None:
    policy = OllamaPolicy(MODEL, host=ollama_host, tools=TOOLS, max_tokens=40, stream=stream)
    run = car.record(ChatAgent(policy, ORDERS, safe_tools=SAFE, max_steps=1), context=CONTEXT,
                     outcome=no_call, seed=5)
    step = run.steps[0]
    assert step.action["tool_calls"][0]["id"] == "call_0_0"  # Ollama calls carry no id
    assert step.action["tool_calls"][0]["function"]["name"] == "lookup_order"
    assert step.meta["usage"]["prompt_tokens"] > 0 and step.meta["usage"]["completion_tokens"] > 0
    assert step.observation[0]["tool_call_id"] == "call_0_0"


def test_ollama_streaming_and_not_give_the_same_action(ollama_host: str) -> None:
    actions = [car.record(ChatAgent(OllamaPolicy(MODEL, host=ollama_host, temperature=1.0,
                                                 max_tokens=16, stream=stream), max_steps=1),
                          context="Tell me about cats.", outcome=lambda r: 0.0,
                          seed=4).steps[0].action for stream in (False, True)]
    assert actions[0] == actions[1] and actions[0]["content"]


def test_ollama_policy_replays_a_two_step_run_exactly(ollama_host: str) -> None:
    agent = ChatAgent(OllamaPolicy(MODEL, host=ollama_host, tools=TOOLS, max_tokens=40), ORDERS,
                      safe_tools=SAFE, max_steps=2)
    run = car.record(agent, context=CONTEXT, outcome=no_call, seed=9)
    assert car.action_match_rate(run, agent, replays=1).rate == 1.0
    # the second step saw the tool result in Ollama's message shape
    assert run.steps[1].meta["usage"]["prompt_tokens"] > run.steps[0].meta["usage"][
        "prompt_tokens"]


def test_ollama_cut_off_reply_is_recorded(ollama_host: str) -> None:
    policy = OllamaPolicy(MODEL, host=ollama_host, tools=TOOLS, max_tokens=3)
    run = car.record(ChatAgent(policy, ORDERS, safe_tools=SAFE, max_steps=2), context=CONTEXT,
                     outcome=no_call, seed=0)
    assert run.steps[0].action["finish_reason"] == "length" and run.outcome.value == 1.0


def test_ollama_unknown_model_says_to_pull_it(ollama_host: str) -> None:
    policy = OllamaPolicy("no-such-model", host=ollama_host, max_retries=0)
    with pytest.raises(ModelUnavailable, match="ollama pull no-such-model"):
        car.record(ChatAgent(policy), context="hi", outcome=lambda r: 0.0)


def test_ollama_server_down_is_model_unavailable() -> None:
    policy = OllamaPolicy(MODEL, host=f"http://127.0.0.1:{free_port()}", max_retries=1,
                          backoff=0.05, retry_time=2)
    with pytest.raises(ModelUnavailable, match="ollama serve"):
        car.record(ChatAgent(policy), context="hi", outcome=lambda r: 0.0)


# -- retries, timeouts and bad input against a scripted stub -----------------------------------
def test_openai_policy_retries_500_then_succeeds() -> None:
    with StubOpenAIServer(failures=[500, 503]) as stub:
        policy = OpenAIPolicy("stub-model", base_url=stub.base_url, backoff=0.05)
        run = car.record(ChatAgent(policy), context="hi there", outcome=lambda r: 0.0)
        assert stub.hits == 3
    step = run.steps[0]
    assert step.action["content"] == "echo: hi there"
    assert step.meta["retries"] == 2 and step.meta["system_fingerprint"] == "stub-fp"


def test_openai_policy_waits_as_long_as_the_servers_retry_after() -> None:
    with StubOpenAIServer(failures=[429], retry_after="0.4") as stub:
        policy = OpenAIPolicy("stub-model", base_url=stub.base_url, backoff=0.01)
        started = time.monotonic()
        run = car.record(ChatAgent(policy), context="hi", outcome=lambda r: 0.0)
        waited = time.monotonic() - started
    # the server's 0.4 s, not the policy's own 0.01 s backoff
    assert run.steps[0].meta["retries"] == 1 and stub.hits == 2 and waited >= 0.4


class _NoJitter(random.Random):
    """Draws the top of every jitter range, so the waits are the deterministic 0.1, 0.2, 0.4."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_openai_policy_gives_up_within_its_retry_time() -> None:
    with StubOpenAIServer(failures=[500] * 50) as stub:
        policy = OpenAIPolicy("stub-model", base_url=stub.base_url, retry_time=0.5,
                              max_retries=50,
                              backoff=Backoff(max_attempts=51, base=0.1, rng=_NoJitter()))
        started = time.monotonic()
        with pytest.raises(ModelUnavailable, match="still failing after"):
            car.record(ChatAgent(policy), context="hi", outcome=lambda r: 0.0)
        # backoff 0.1, 0.2 fit in 0.5 s; the next (0.4) would not, so it stops after 3 tries
        assert stub.hits == 3 and time.monotonic() - started < 2.0


def test_retries_wait_a_jittered_share_of_the_backoff() -> None:
    """Branches that failed together must not come back together: each wait is drawn from
    [0, base * 2^attempt], so two policies with different draws wait differently."""
    waits: list[list[float]] = []
    for seed in (1, 2):
        with StubOpenAIServer(failures=[500, 503, 500]) as stub:
            policy = OpenAIPolicy("stub-model", base_url=stub.base_url,
                                  backoff=Backoff(base=0.2, rng=random.Random(seed)))
            policy.sleep = (mine := []).append  # type: ignore[method-assign]
            run = car.record(ChatAgent(policy), context="hi", outcome=lambda r: 0.0)
        assert run.steps[0].meta["retries"] == 3 and stub.hits == 4
        assert all(0 <= w <= 0.2 * 2 ** i for i, w in enumerate(mine))
        waits.append(mine)
    assert waits[0] != waits[1]


def test_the_limiter_counts_the_tokens_the_server_reported() -> None:
    """The stub reports 13 tokens a call; under a 10-tokens-per-minute limit the second call
    waits for the first to leave the 60-second window, on the limiter's clock. On the estimate
    alone (~2 tokens for "hi" and max_tokens=1) both would fit at once."""
    clock = FakeClock()
    limiter = RateLimiter(tokens_per_minute=10, clock=clock, sleep=clock.sleep)
    with StubOpenAIServer() as stub:
        policy = OpenAIPolicy("stub-model", base_url=stub.base_url, max_tokens=1,
                              limiter=limiter)
        for _ in range(2):
            car.record(ChatAgent(policy), context="hi", outcome=lambda r: 0.0)
        assert stub.hits == 2
    assert clock.now >= 60.0


def test_a_429_pauses_every_branch_on_the_limiter() -> None:
    clock = FakeClock()
    limiter = RateLimiter(requests_per_minute=100, clock=clock, sleep=clock.sleep)
    paused: list[float] = []
    limiter.pause = paused.append  # type: ignore[method-assign]
    with StubOpenAIServer(failures=[429], retry_after="3") as stub:
        policy = OpenAIPolicy("stub-model", base_url=stub.base_url, limiter=limiter)
        policy.sleep = clock.sleep  # type: ignore[method-assign]
        run = car.record(ChatAgent(policy), context="hi", outcome=lambda r: 0.0)
    assert paused == [3.0] and run.steps[0].meta["retries"] == 1


# -- policies travel to other processes (Ray workers) without their client or key -------------
def test_a_pickled_policy_rebuilds_its_client_and_never_carries_the_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-car-pickle-0123456789abcdef"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with StubOpenAIServer() as stub:
        policy = OpenAIPolicy("stub-model", base_url=stub.base_url, api_key=secret)
        car.record(ChatAgent(policy), context="hi", outcome=lambda r: 0.0)  # builds the client
        shipped = pickle.dumps(policy)
        assert secret.encode() not in shipped
        landed = pickle.loads(shipped)
        run = car.record(ChatAgent(landed), context="hello again", outcome=lambda r: 0.0)
        assert run.steps[0].action["content"] == "echo: hello again" and stub.hits == 2
        # the worker's own environment provides the key; the one passed in code stayed behind
        assert stub.authorization == "Bearer not-needed"


def test_a_pickled_hosted_policy_without_a_key_where_it_lands_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    landed = pickle.loads(pickle.dumps(OpenAIPolicy("gpt-4o-mini", api_key="sk-only-here")))
    with pytest.raises(ModelUnavailable, match="on every worker too"):
        car.record(ChatAgent(landed), context="hi", outcome=lambda r: 0.0)


def test_what_cannot_travel_is_refused_when_pickled() -> None:
    import openai
    own = OpenAIPolicy("m", client=openai.OpenAI(api_key="x", base_url="http://127.0.0.1:1/v1"))
    with pytest.raises(InvalidInput, match="its own client"):
        pickle.dumps(own)
    limited = OllamaPolicy(MODEL, host="http://127.0.0.1:1", limiter=RateLimiter(concurrency=2))
    with pytest.raises(InvalidInput, match="one process only"):
        pickle.dumps(limited)


def test_a_pickled_ollama_policy_replays_the_same_run(ollama_host: str) -> None:
    policy = OllamaPolicy(MODEL, host=ollama_host, tools=TOOLS, max_tokens=64)
    run = car.record(ChatAgent(policy, ORDERS, safe_tools=SAFE), context=CONTEXT, outcome=no_call,
                     seed=3)
    landed = pickle.loads(pickle.dumps(policy))
    again = car.record(ChatAgent(landed, ORDERS, safe_tools=SAFE), context=CONTEXT,
                       outcome=no_call, seed=3)
    assert [s.action for s in again.steps] == [s.action for s in run.steps]


def test_openai_policy_honours_its_timeout() -> None:
    with StubOpenAIServer(delay=3.0) as stub:
        policy = OpenAIPolicy("stub-model", base_url=stub.base_url, timeout=0.3,
                              max_retries=0)
        started = time.monotonic()
        with pytest.raises(ModelUnavailable, match="Timeout"):
            car.record(ChatAgent(policy), context="hi", outcome=lambda r: 0.0)
        assert time.monotonic() - started < 2.0


def test_openai_policy_server_down_says_to_start_it() -> None:
    policy = OpenAIPolicy("m", base_url=f"http://127.0.0.1:{free_port()}/v1", max_retries=1,
                          backoff=0.05)
    with pytest.raises(ModelUnavailable, match="start the server"):
        car.record(ChatAgent(policy), context="hi", outcome=lambda r: 0.0)


def test_openai_policy_unknown_model() -> None:
    with StubOpenAIServer() as stub:
        policy = OpenAIPolicy("gpt-nonexistent", base_url=stub.base_url)
        with pytest.raises(ModelUnavailable, match="no model 'gpt-nonexistent'"):
            car.record(ChatAgent(policy), context="hi", outcome=lambda r: 0.0)


def test_hosted_model_without_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelUnavailable, match="OPENAI_API_KEY"):
        OpenAIPolicy("gpt-4o-mini")
    with pytest.raises(InvalidInput):
        OpenAIPolicy("", base_url="http://127.0.0.1:1/v1")


def test_the_api_key_reaches_the_server_but_never_the_store(tmp_path: Path) -> None:
    secret = "sk-car-test-0123456789abcdef"
    with StubOpenAIServer() as stub:
        policy = OpenAIPolicy("stub-model", base_url=stub.base_url, api_key=secret,
                              tools=TOOLS)
        run = car.record(ChatAgent(policy, ORDERS, safe_tools=SAFE), context="hi",
                         outcome=lambda r: 0.0)
        assert stub.authorization == f"Bearer {secret}"  # the key was really used
    with car.RunStore(tmp_path / "runs.db") as store:
        store.save(run)
        stored = json.dumps(store.load(run.id).to_dict())
    assert secret not in json.dumps(run.to_dict()) and secret not in stored
    # nor in any file SQLite wrote (the database and its WAL)
    for f in tmp_path.iterdir():
        assert secret.encode() not in f.read_bytes(), f.name


def test_prices_put_a_cost_on_each_step() -> None:
    with StubOpenAIServer() as stub:
        policy = OpenAIPolicy("stub-model", base_url=stub.base_url, prices=(2.0, 8.0))
        run = car.record(ChatAgent(policy), context="hi", outcome=lambda r: 0.0)
    # the stub reports 10 prompt and 3 completion tokens
    assert run.steps[0].meta["cost"] == pytest.approx((10 * 2.0 + 3 * 8.0) / 1e6)


def test_chat_agents_over_a_server_default_to_concurrent_branches() -> None:
    from car_adapters.models.local import LocalPolicy

    from car_core.engine.execution import AsyncioExecutor, Sequential, default_executor
    remote = [OpenAIPolicy("m", base_url="http://127.0.0.1:1/v1"),
              OllamaPolicy(MODEL, host="http://127.0.0.1:1")]
    for policy in remote:
        assert isinstance(default_executor(ChatAgent(policy)), AsyncioExecutor)
    # the embedded model decodes under one lock: threads would only wait on each other
    assert isinstance(default_executor(ChatAgent(LocalPolicy())), Sequential)


def test_wire_messages_send_tool_turns_without_null_content() -> None:
    from car_adapters.openai import wire_messages
    msgs = wire_messages([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0_0", "type": "function",
         "function": {"name": "lookup_order", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_0_0", "name": "lookup_order", "content": "ok"}])
    assert msgs[0]["content"] == "" and msgs[0]["tool_calls"][0]["id"] == "call_0_0"
    assert msgs[1] == {"role": "tool", "tool_call_id": "call_0_0", "content": "ok"}
