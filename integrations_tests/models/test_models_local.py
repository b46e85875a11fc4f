"""The embedded SmolLM2 model, in-process, for real: tool calls, seeds, faithfulness, budgets.

Every model call here is a real llama.cpp decode on one CPU thread (about half a second), so
agents take at most two steps and replies are capped at a few dozen tokens.
"""

from __future__ import annotations

import json

import pytest
from car_adapters.models.chat_agent import ChatAgent, history_messages, make_action, tool_schema
from car_adapters.models.local import MODEL, LocalChatModel, LocalPolicy, model_path
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

import car_core as car
from car_core.errors import SideEffectBlocked
from car_core.testing import count_calls, run_conformance

TOOLS = [tool_schema("lookup_order", "Look up the status of an order",
                     {"order_id": {"type": "string"}})]
CONTEXT = [{"role": "system", "content": "You are a support agent. Use tools to answer."},
           {"role": "user", "content": "Where is order 42?"}]
ORDERS = {"lookup_order": lambda order_id: {"order_id": order_id, "status": "shipped"}}
SAFE = ["lookup_order"]  # a lookup: safe to run on a branch


def called_no_tool(run: car.Trajectory) -> bool:
    """Failure for these tests: the agent's first reply called no tool."""
    return not run.steps[0].action["tool_calls"]


@pytest.fixture(scope="module")
def tool_run() -> car.Trajectory:
    agent = ChatAgent(LocalPolicy(TOOLS, max_tokens=48), ORDERS, safe_tools=SAFE, max_steps=2)
    return car.record(agent, context=CONTEXT, outcome=called_no_tool, seed=7)


def test_model_ships_inside_the_package() -> None:
    assert model_path().endswith(".gguf")


def test_grammar_makes_the_tiny_model_call_the_tool_with_valid_arguments(
        tool_run: car.Trajectory) -> None:
    first = tool_run.steps[0]
    call = first.action["tool_calls"][0]
    assert call["id"] == "call_0_0"
    assert call["function"]["name"] == "lookup_order"
    assert set(json.loads(call["function"]["arguments"])) == {"order_id"}
    # the environment ran the tool and answered that call by id
    assert first.observation[0]["tool_call_id"] == "call_0_0"
    assert json.loads(first.observation[0]["content"])["status"] == "shipped"


def test_step_meta_carries_model_usage_and_seed(tool_run: car.Trajectory) -> None:
    meta = tool_run.steps[0].meta
    assert meta["model"] == MODEL and meta["origin"] == "live"
    assert meta["usage"]["prompt_tokens"] > 20 and meta["usage"]["completion_tokens"] > 0
    assert isinstance(meta["seed"], int) and meta["params"]["max_tokens"] == 48


def test_same_seed_replays_every_step_exactly(tool_run: car.Trajectory) -> None:
    agent = ChatAgent(LocalPolicy(TOOLS, max_tokens=48), ORDERS, safe_tools=SAFE, max_steps=2)
    match = car.action_match_rate(tool_run, agent, replays=1)
    assert match.per_step == (1.0,) * len(tool_run.steps)


def test_different_seeds_sample_different_replies() -> None:
    agent = ChatAgent(LocalPolicy(temperature=1.0, max_tokens=12), max_steps=1)
    replies = {car.record(agent, context="Tell me about cats.", outcome=lambda r: 0.0,
                          seed=s).steps[0].action["content"] for s in range(3)}
    # at temperature 1 three 12-token continuations from different seeds coinciding would
    # mean the seed is ignored
    assert len(replies) >= 2


def test_a_reply_cut_off_by_max_tokens_is_a_recorded_failure_not_a_crash() -> None:
    agent = ChatAgent(LocalPolicy(TOOLS, max_tokens=4), ORDERS, safe_tools=SAFE, max_steps=2)
    run = car.record(agent, context=CONTEXT, outcome=called_no_tool, seed=0)
    action = run.steps[0].action
    assert action["finish_reason"] == "length" and "max_tokens=4" in action["error"]
    assert action["tool_calls"] == [] and len(run.steps) == 1 and run.outcome.value == 1.0


@pytest.mark.parametrize("calls, problem", [
    ([("lookup_order", "{not json")], "not JSON"),
    ([("refund_everyone", {})], "unknown tool"),
    ([("lookup_order", "[1, 2]")], "not an object"),
])
def test_malformed_tool_calls_become_an_error_field(calls: list, problem: str) -> None:
    action = make_action(3, None, calls, "tool_calls", TOOLS, 64)
    assert action["tool_calls"] == [] and problem in action["error"]


def test_a_tool_error_is_an_observation_but_a_blocked_side_effect_stops_the_run() -> None:
    def refund(order_id: str) -> str:
        raise SideEffectBlocked("issue_refund may not run on a branch")

    def broken(order_id: str) -> str:
        raise RuntimeError("database down")

    def policy(history: car.History, rng: object) -> dict:
        return make_action(history.index, None, [("lookup_order", {"order_id": "42"})],
                           "tool_calls", TOOLS, 64)

    run = car.record(ChatAgent(policy, {"lookup_order": broken}, safe_tools=SAFE, max_steps=1),
                     context=CONTEXT, outcome=called_no_tool)
    assert run.steps[0].observation[0]["content"] == "error: database down"
    with pytest.raises(SideEffectBlocked, match="issue_refund"):
        car.record(ChatAgent(policy, {"lookup_order": refund}, safe_tools=SAFE, max_steps=1),
                   context=CONTEXT, outcome=called_no_tool)


def test_the_local_chat_agent_pickles_for_ray_workers(tool_run: car.Trajectory) -> None:
    import cloudpickle
    agent = cloudpickle.loads(cloudpickle.dumps(
        ChatAgent(LocalPolicy(TOOLS, max_tokens=48), ORDERS, safe_tools=SAFE, max_steps=2)))
    assert agent.policy.step_meta() == {}  # a fresh per-thread slot
    assert car.action_match_rate(tool_run, agent, replays=1).per_step == (1.0,) * len(
        tool_run.steps)


def test_history_messages_rebuild_the_state_a_step_decided_from(
        tool_run: car.Trajectory) -> None:
    msgs = history_messages(tool_run.history(1))
    assert msgs[:2] == CONTEXT
    assert msgs[2]["tool_calls"] == tool_run.steps[0].action["tool_calls"]
    assert msgs[3]["role"] == "tool" and msgs[3]["tool_call_id"] == "call_0_0"


@pytest.mark.slow
def test_chat_agent_on_the_embedded_model_passes_the_replay_contract() -> None:
    def make() -> tuple:
        counted = count_calls(ChatAgent(LocalPolicy(TOOLS, max_tokens=40), ORDERS, safe_tools=SAFE,
                                        max_steps=2))
        return counted.agent, counted.both
    # 4 identity rollouts per arm (each is a model call on 2 cores): the embedded model couples
    # its noise, so the exact per-pair checks (the step is decided again, with the resampled
    # branch's action under the same noise) carry the identity check here; with 4 pairs the
    # sign-flip test cannot reach alpha = 1e-3, which only costs power, never false alarms
    assert run_conformance(make, context=CONTEXT, outcome=called_no_tool, seed=3,
                           identity_rollouts=4) == [
        "replay", "prefix", "lineage", "forced", "noise", "identity", "stop", "coupling"]


def _one_step_run() -> tuple[car.FunctionAgent, car.Trajectory]:
    agent = ChatAgent(LocalPolicy(TOOLS, max_tokens=40), ORDERS, safe_tools=SAFE, max_steps=1)
    return agent, car.record(agent, context=CONTEXT, outcome=called_no_tool, seed=1)


def test_a_token_budget_stops_intervene_and_reports_the_tokens() -> None:
    agent, run = _one_step_run()
    # cached_tokens is the part of prompt_tokens the prefix cache reused, not extra spend
    def spent(t: car.Trajectory) -> int:
        u = t.steps[0].meta["usage"]
        return int(u["prompt_tokens"]) + int(u["completion_tokens"])

    per_call = spent(run)
    # room for about two rollouts of this one-decision agent, never six
    cap = int(2.5 * per_call)
    dist = car.intervene(run, agent, car.do_resample(0), outcome=called_no_tool, rollouts=6,
                         seed=0, budget=car.Budget(tokens=cap))
    assert dist.truncated and 1 <= dist.n < 6
    assert dist.tokens == sum(spent(t) for t in dist.trajectories)
    assert "token budget" in dist.budget_note


def test_a_cost_cap_prices_tokens_from_the_price_table() -> None:
    agent, run = _one_step_run()
    usage = run.steps[0].meta["usage"]
    prices = {MODEL: (1000.0, 2000.0)}  # per million tokens, so a call costs about 0.1
    per_call = (usage["prompt_tokens"] * 1000.0 + usage["completion_tokens"] * 2000.0) / 1e6
    dist = car.intervene(run, agent, car.do_resample(0), outcome=called_no_tool, rollouts=6,
                         seed=0, budget=car.Budget(cost=2.5 * per_call, prices=prices))
    assert dist.truncated and 1 <= dist.n < 6
    expected = sum((t.steps[0].meta["usage"]["prompt_tokens"] * 1000.0
                    + t.steps[0].meta["usage"]["completion_tokens"] * 2000.0) / 1e6
                   for t in dist.trajectories)
    assert dist.cost == pytest.approx(expected)
    assert "cost budget" in dist.budget_note


@tool
def lookup_order(order_id: str) -> str:
    """Look up the status of an order."""
    return "shipped"


def test_langchain_chat_model_calls_bound_tools_and_replays_with_its_seed() -> None:
    model = LocalChatModel(max_tokens=40, seed=11).bind_tools([lookup_order])
    messages = [SystemMessage("You are a support agent. Use tools to answer."),
                HumanMessage("Where is order 42?")]
    first = model.invoke(messages)
    again = model.invoke(messages)
    assert isinstance(first, AIMessage)
    assert first.tool_calls and first.tool_calls[0]["name"] == "lookup_order"
    assert set(first.tool_calls[0]["args"]) == {"order_id"}
    assert first.tool_calls == again.tool_calls  # the same state and seed: the same reply
    assert first.usage_metadata["input_tokens"] > 0
    # a history with the tool's answer is accepted and the next call is numbered 1
    follow = model.invoke(messages + [first, ToolMessage("shipped",
                                                         tool_call_id=first.tool_calls[0]["id"])])
    assert all(c["id"].startswith("call_1_") for c in follow.tool_calls)


def test_fresh_tools_leave_only_an_answer_once_every_tool_was_called() -> None:
    agent = ChatAgent(LocalPolicy(TOOLS, max_tokens=40, fresh_tools=True), ORDERS, safe_tools=SAFE,
                      max_steps=3)
    run = car.record(agent, context=CONTEXT, outcome=called_no_tool, seed=7)
    # one tool: after it is called the grammar only admits {"answer": ...}, so the run ends
    assert [bool(s.action["tool_calls"]) for s in run.steps] == [True, False]
    assert run.steps[1].action["content"] and "error" not in run.steps[1].action
