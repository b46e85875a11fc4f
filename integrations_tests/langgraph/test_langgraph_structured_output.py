"""Structured output on ``langchain.agents.create_agent(model, tools, response_format=...)``.

The desk (``desk``): at step 0 the model refunds a guessed amount (9999 cents) without looking
the order up with probability ``p_skip``, else looks it up (step 0) and refunds the amount paid
(2500). Its last step answers with the ``Resolution`` schema, restating the refund's amount: a
call of the ``Resolution`` tool under ``ToolStrategy`` (a raw schema on a model without provider
output picks it too), a JSON text under ``ProviderStrategy`` (a raw schema picks it on a model
``create_agent`` knows supports it, such as ``gpt-4o``). create_agent's model node parses that
answer into ``state["structured_response"]``; the failure is a ``refund_cents`` other than 2500.

    P(fail | do_action(0, look the order up)) = 0     (the lookup gives the amount paid)
    P(fail | do_action(last, the answer with 2500)) = 0
    P(fail | the recorded last answer held) = 1        (a run that skipped the lookup)

Each of those is deterministic, so every rollout shows it.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from car_adapters.demo.planted import SeededChatModel
from car_adapters.langgraph import (
    CarCallback,
    CarChatModel,
    CarMiddleware,
    LangGraphAgent,
    final_state,
)
from langchain.agents import create_agent
from langchain.agents.structured_output import ProviderStrategy, ToolStrategy
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import BaseModel

import car_core as car
from car_core.errors import AdapterError

PAID = 2500
GUESSED = 9999
REFUNDS: list[int] = []  # every real execution of issue_refund (the side effect)
DESK_CALLS: list[int] = []  # every real call of the desk's model
# the user names the desk's own tools only; the Resolution schema tool is create_agent's
DESK_TOOLS: dict[str, Any] = {
    "safe_tools": ["lookup_order"], "side_effect_tools": ["issue_refund"],
    "simulators": {"issue_refund": lambda args: json.dumps(
        {"refunded_cents": args["amount_cents"], "simulated": True})}}


class Resolution(BaseModel):
    """The desk's final answer."""

    action: str
    refund_cents: int


@dataclasses.dataclass
class ResolutionRecord:
    """The desk's final answer, as a dataclass."""

    action: str
    refund_cents: int


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up (read-only)."""
    return json.dumps({"order_id": order_id, "paid_cents": PAID})


@tool
def issue_refund(order_id: str, amount_cents: int) -> str:
    """Refund money to the customer (moves money)."""
    REFUNDS.append(amount_cents)
    return json.dumps({"refunded_cents": amount_cents})


class Desk(SeededChatModel):
    """Skips the lookup with ``p_skip``, refunds, then answers with the schema (see above)."""

    p_skip: float = 0.0
    model_name: str = "planted-desk"
    schema_name: str = "Resolution"

    @property
    def _llm_type(self) -> str:
        return "planted-desk"

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        return self.bind(**kwargs)  # a provider's response_format reaches _generate

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        DESK_CALLS.append(len(messages))
        done = [m for m in messages if isinstance(m, ToolMessage)]
        call = f"c{uuid.uuid4().hex[:6]}"
        if not done:
            msg = (AIMessage("", tool_calls=[{"name": "issue_refund", "id": call, "args": {
                       "order_id": "A-17", "amount_cents": GUESSED}}])
                   if self._draw() < self.p_skip else
                   AIMessage("", tool_calls=[{"name": "lookup_order", "id": call,
                                              "args": {"order_id": "A-17"}}]))
        elif done[-1].name == "lookup_order":
            paid = json.loads(str(done[-1].content))["paid_cents"]
            msg = AIMessage("", tool_calls=[{"name": "issue_refund", "id": call,
                                             "args": {"order_id": "A-17", "amount_cents": paid}}])
        else:  # refunded: the answer restates the refund call's amount
            amount = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls
                      if c["name"] == "issue_refund"][-1]["args"]["amount_cents"]
            answer = {"action": "refund", "refund_cents": amount}
            msg = (AIMessage(json.dumps(answer)) if kwargs.get("response_format") is not None
                   else AIMessage("", tool_calls=[{"name": self.schema_name, "id": call,
                                                   "args": answer}]))
        return ChatResult(generations=[ChatGeneration(message=msg)])


def desk(response_format: Any, *, p_skip: float = 1.0, model_name: str = "planted-desk",
         middleware: bool = False) -> tuple[Any, CarMiddleware | None]:
    mw = CarMiddleware() if middleware else None
    strategy = isinstance(response_format, (ToolStrategy, ProviderStrategy))
    schema = response_format.schema if strategy else response_format
    model = Desk(p_skip=p_skip, model_name=model_name, schema_name=schema.__name__)
    app = create_agent(model, [lookup_order, issue_refund], response_format=response_format,
                       checkpointer=InMemorySaver(), middleware=[mw] if mw else [])
    return app, mw


def wrong_refund(run: car.Trajectory) -> bool:
    """The app's own rule, over the structured answer as JSON."""
    return bool(final_state(run)["structured_response"]["refund_cents"] != PAID)


def recorded(app: Any) -> car.Trajectory:
    cb = CarCallback(outcome=wrong_refund)
    app.invoke({"messages": [{"role": "user", "content": "Order A-17 arrived broken."}]},
               {"configurable": {"thread_id": f"rec-{uuid.uuid4().hex[:6]}"},
                "callbacks": [cb]})
    assert cb.run is not None
    return cb.run


def threads(app: Any) -> set[str]:
    return {str(c.config["configurable"]["thread_id"]) for c in app.checkpointer.list(None)}


def answer(run: car.Trajectory, cents: int) -> dict[str, Any]:
    """The run's last action with ``refund_cents`` set to ``cents``: the schema tool's call,
    or the JSON text a provider answers with."""
    action = json.loads(json.dumps(run.steps[-1].action))
    if action["tool_calls"]:
        action["tool_calls"][0]["function"]["arguments"] = json.dumps(
            {"action": "refund", "refund_cents": cents})
    else:
        action["content"] = json.dumps({"action": "refund", "refund_cents": cents})
    return action


LOOKUP = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c-look", "type": "function",
     "function": {"name": "lookup_order", "arguments": '{"order_id": "A-17"}'}}]}

STRATEGIES = {"ToolStrategy": (lambda s: ToolStrategy(s), "planted-desk"),
              "ProviderStrategy": (lambda s: ProviderStrategy(s), "planted-desk"),
              "raw schema": (lambda s: s, "planted-desk"),
              "raw schema, provider model": (lambda s: s, "gpt-4o")}


@pytest.fixture(autouse=True)
def ledgers() -> Iterator[None]:
    REFUNDS.clear()
    DESK_CALLS.clear()
    yield


@pytest.mark.parametrize("schema", [Resolution, ResolutionRecord])
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_final_state_gives_the_structured_response_as_its_json(strategy: str,
                                                                schema: type) -> None:
    """A pydantic model (or a dataclass) in the final state is its JSON dict, in the recorded
    run and on a branch alike, so the app's rule reads ``["refund_cents"]`` from either."""
    make, model_name = STRATEGIES[strategy]
    app, _ = desk(make(schema), model_name=model_name)
    run = recorded(app)
    assert final_state(run)["structured_response"] == {"action": "refund",
                                                       "refund_cents": GUESSED}
    assert run.meta["final_state"]["structured_response"]["refund_cents"] == GUESSED
    assert run.outcome is not None and run.outcome.value == 1.0  # the rule saw the failure
    dist = car.intervene(run, LangGraphAgent(app, **DESK_TOOLS), car.do_action(0, LOOKUP),
                         outcome=wrong_refund, rollouts=2, seed=0, progress=False)
    assert dist.n == 2 and dist.mean == 0.0
    for branch in dist.trajectories:
        assert final_state(branch)["structured_response"] == {"action": "refund",
                                                              "refund_cents": PAID}
    assert REFUNDS == [GUESSED]  # the recorded run's only: branches were simulated


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_the_schema_tool_is_classified_so_only_real_tools_are_named(strategy: str) -> None:
    """create_agent's structured-output tools never run (its model node parses their calls):
    they are classified safe from the app itself, whatever the strategy, so naming the real
    tools is enough; one named by the user (as an older refusal told them to) still is.
    ProviderStrategy offers no schema tool at all; a raw schema sets one up even for a model
    with provider output (create_agent decides at each call)."""
    make, model_name = STRATEGIES[strategy]
    app, _ = desk(make(Resolution), model_name=model_name)
    agent = LangGraphAgent(app, **DESK_TOOLS)  # no UnclassifiedTools for Resolution
    if strategy == "ProviderStrategy":
        assert agent.tools == ["issue_refund", "lookup_order"]
        return
    assert "Resolution" in agent.tools and "Resolution" in agent.safety.safe_tools
    assert "structured_response" in agent.safety.derived["Resolution"]
    named = LangGraphAgent(app, **{**DESK_TOOLS, "safe_tools": ["lookup_order", "Resolution"]})
    assert "Resolution" not in named.safety.derived  # the user's word, kept


@pytest.mark.parametrize("strategy", ["ToolStrategy", "ProviderStrategy", "raw schema"])
def test_forcing_the_structured_answer_without_car_middleware_is_refused_before_any_branch(
        strategy: str) -> None:
    """Without CarMiddleware a forced action is written as the model node's output, which
    skips create_agent's parsing of the answer: the forced answer would never become the
    structured response (the model would answer again, live). Refused by name before any
    branch; forcing a step that calls a real tool still works; with CarMiddleware the forced
    answer is the branch's structured response."""
    make, _ = STRATEGIES[strategy]
    app, _ = desk(make(Resolution))
    run = recorded(app)
    last = len(run.steps) - 1
    agent = LangGraphAgent(app, **DESK_TOOLS)
    calls, before = len(DESK_CALLS), threads(app)
    with pytest.raises(AdapterError, match=rf"step {last} is create_agent's structured answer"
                                           r".*CarMiddleware\(\)") as refused:
        car.intervene(run, agent, car.do_action(last, answer(run, PAID)),
                      outcome=wrong_refund, rollouts=2, seed=0, progress=False)
    assert "structured_response" in str(refused.value)
    assert len(DESK_CALLS) == calls and threads(app) == before  # before any branch
    dist = car.intervene(run, agent, car.do_action(0, LOOKUP), outcome=wrong_refund,
                         rollouts=2, seed=0, progress=False)  # a real tool call: written
    assert dist.n == 2 and dist.mean == 0.0

    app, mw = desk(make(Resolution), middleware=True)
    run = recorded(app)
    dist = car.intervene(run, LangGraphAgent(app, model=mw, **DESK_TOOLS),
                         car.do_action(last, answer(run, PAID)), outcome=wrong_refund,
                         rollouts=2, seed=0, progress=False)
    assert dist.n == 2 and dist.mean == 0.0  # the forced correct answer rescues the run
    for branch in dist.trajectories:
        assert branch.steps[last].meta["origin"] == "forced"
        assert final_state(branch)["structured_response"]["refund_cents"] == PAID


def test_a_held_answer_keeps_provider_output_on_a_raw_schema() -> None:
    """A raw schema on a model create_agent knows supports provider output (``gpt-4o``)
    answers in JSON text, parsed by ProviderStrategy. CarMiddleware answers a held or forced
    step through a stand-in model, which carries the wrapped model's name and profile, so
    create_agent picks the same strategy and parses the held answer as it did the record's."""
    app, mw = desk(Resolution, model_name="gpt-4o", middleware=True)
    run = recorded(app)
    last = len(run.steps) - 1
    assert run.steps[last].action["tool_calls"] == []  # answered in text, by the provider
    agent = LangGraphAgent(app, model=mw, **DESK_TOOLS)
    held = car.intervene(run, agent, car.do_action(last, run.steps[last].action),
                         outcome=wrong_refund, rollouts=2, seed=0, progress=False)
    assert held.n == 2 and held.mean == 1.0
    forced = car.intervene(run, agent, car.do_action(last, answer(run, PAID)),
                           outcome=wrong_refund, rollouts=2, seed=0, progress=False)
    assert forced.n == 2 and forced.mean == 0.0
    for branch, cents in [(b, GUESSED) for b in held.trajectories] + [
            (b, PAID) for b in forced.trajectories]:
        state = final_state(branch)
        assert state["structured_response"] == {"action": "refund", "refund_cents": cents}
        assert isinstance(state["messages"][-1], AIMessage)  # no schema tool's message


def test_the_wrapped_model_answers_a_raw_schema_as_the_unwrapped_one_does() -> None:
    """``create_agent(CarChatModel(inner=model), response_format=Schema)`` picks the strategy
    the unwrapped app picks: the provider's structured output on a model create_agent knows
    supports it. The wrapper had no model name or profile, so the wrapped app answered through
    the schema tool: recorded and branched alike, but not the app the user runs unwrapped."""
    def last_answer(model: Any) -> AIMessage:
        app = create_agent(model, [lookup_order, issue_refund], response_format=Resolution,
                           checkpointer=InMemorySaver())
        out = app.invoke({"messages": [{"role": "user", "content": "Order A-17 broke."}]},
                         {"configurable": {"thread_id": uuid.uuid4().hex}})
        assert out["structured_response"] is not None
        return [m for m in out["messages"] if isinstance(m, AIMessage)][-1]

    plain = last_answer(Desk(model_name="gpt-4o", schema_name="Resolution"))
    wrapped = last_answer(CarChatModel(inner=Desk(model_name="gpt-4o",
                                                  schema_name="Resolution")))
    assert not plain.tool_calls and json.loads(str(plain.content))  # the provider's JSON
    assert (wrapped.tool_calls, wrapped.content) == (plain.tool_calls, plain.content)
