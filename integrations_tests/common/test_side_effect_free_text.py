"""A side-effect tool whose arguments are all free text (``post_reply(text)``, a message to the
customer): the default answers a branch's call from the record only when it is identical, and
says so before the first branch; ``match_on`` or a simulator is the user's choice. A ledger counts
real calls of the tool on every path: 0 on branches.

Planted agent (the same on ``ChatAgent`` and a LangGraph ``create_agent``): step 0 looks order 42
up; step 1 posts a reply that promises a refund with probability 0.5 (worded one of two ways,
1/2 each) or declines it (one wording); step 2 ends. Failure: a refund was promised. For a
failing run, analytically P(fail | do_resample(1)) = 0.5, so rescue(1) = 0.5, and a resampled
step 1 repeats the recorded call word for word with probability 1/4 (the recorded promise
wording), so among 32 branches at least one differs except with probability 0.25^32.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from car_adapters.common.messages import FreeTextMatchWarning, ToolSafety, assistant, tool_call
from car_adapters.demo.planted import SeededChatModel
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from car_adapters.models.chat_agent import ChatAgent
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.errors import InvalidIntervention, SideEffectBlocked
from car_core.testing import SideEffectLedger

P_PROMISE = 0.5
PROMISES = ("We will refund you today.", "We will refund you within a week.")
DECLINE = "We cannot refund this order: it was delivered too long ago."
ROLLOUTS = 32
SENT = {"sent": True}


def reply_text(draw: float, wording: float) -> str:
    return PROMISES[int(wording < 0.5)] if draw < P_PROMISE else DECLINE


def promised(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "post_reply"
               and "will refund" in json.loads(c["function"]["arguments"])["text"]
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())


def check_choices(run: car.Trajectory, make: Any, ledger: SideEffectLedger) -> None:
    """The default stops the estimate, warned before it; the two choices complete it with the
    planted rescue; no path posts a reply for real."""
    assert promised(run)
    ledger.reset()
    default = make()
    with pytest.warns(FreeTextMatchWarning, match="match_on=.*'post_reply': 'any'"), \
            pytest.raises(SideEffectBlocked, match="all free text") as err:
        car.intervene(run, default, car.do_resample(1), outcome=promised, rollouts=ROLLOUTS,
                      seed=0, progress=False)
    assert "simulators=" in str(err.value)
    for chosen in (make(match_on={"post_reply": "any"}),
                   make(simulators={"post_reply": lambda args: SENT})):
        with warnings.catch_warnings():
            warnings.simplefilter("error", FreeTextMatchWarning)  # a choice was made: no warning
            dist = car.intervene(run, chosen, car.do_resample(1), outcome=promised,
                                 rollouts=ROLLOUTS, seed=0, progress=False)
        # analytic P(fail | resample 1) = 0.5; 4 standard errors of a 32-rollout mean
        assert abs(dist.mean - P_PROMISE) <= 4 * math.sqrt(0.25 / ROLLOUTS)
        texts = {json.loads(t.steps[1].action["tool_calls"][0]["function"]["arguments"])["text"]
                 for t in dist.trajectories}
        assert len(texts) > 1  # re-worded replies were answered, not only the recorded one
        assert all(json.loads(t.steps[1].observation[0]["content"]) == SENT
                   for t in dist.trajectories)
    assert ledger.count("post_reply") == 0


def test_chat_agent_free_text_only_tool() -> None:
    ledger = SideEffectLedger(["post_reply"])
    tools = {"lookup_order": lambda order_id: {"order_id": order_id, "age_days": 40},
             "post_reply": ledger.wrap("post_reply", lambda text: SENT)}

    def policy(history: car.History, rng: np.random.Generator) -> dict[str, Any]:
        if history.index == 0:
            return assistant(None, [tool_call("c0", "lookup_order", {"order_id": "42"})])
        if history.index == 1:
            text = reply_text(rng.random(), rng.random())
            return assistant(None, [tool_call("c1", "post_reply", {"text": text})])
        return assistant("Done.")

    def make(**choice: Any) -> Any:
        return ChatAgent(policy, tools, safe_tools=["lookup_order"],
                         side_effect_tools=["post_reply"], **choice)

    run = next(r for seed in range(20)
               if promised(r := car.record(make(), context="Refund order 42?",
                                           outcome=promised, seed=seed)))
    assert ledger.count("post_reply") >= 1  # the recorded runs posted for real
    check_choices(run, make, ledger)


class PlantedReplyModel(SeededChatModel):
    """The planted agent as a LangChain chat model (``seed`` set: per-step draws from it)."""

    @property
    def _llm_type(self) -> str:
        return "planted-reply"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(**kwargs)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        rng = self.generator()
        n = sum(isinstance(m, AIMessage) for m in messages)
        if n == 0:
            msg = AIMessage("", tool_calls=[{"id": "c0", "name": "lookup_order",
                                             "args": {"order_id": "42"}}])
        elif n == 1:
            text = reply_text(float(rng.random()), float(rng.random()))
            msg = AIMessage("", tool_calls=[{"id": "c1", "name": "post_reply",
                                             "args": {"text": text}}])
        else:
            msg = AIMessage("Done.")
        return ChatResult(generations=[ChatGeneration(message=msg)])


def test_langgraph_free_text_only_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    from langchain.agents import create_agent

    ledger = SideEffectLedger(["post_reply"])

    @tool
    def lookup_order(order_id: str) -> str:
        """Look an order up."""
        return json.dumps({"order_id": order_id, "age_days": 40})

    @tool
    def post_reply(text: str) -> str:
        """Send a reply to the customer (a side effect)."""
        return json.dumps(SENT)

    monkeypatch.setattr(post_reply, "func", ledger.wrap("post_reply", post_reply.func))
    model = CarChatModel(inner=PlantedReplyModel(rng_seed=3))
    app = create_agent(model, [lookup_order, post_reply], checkpointer=InMemorySaver())
    cb = CarCallback()
    for i in range(20):  # seeded model: deterministic
        app.invoke({"messages": [{"role": "user", "content": "Refund order 42?"}]},
                   {"configurable": {"thread_id": f"t{i}"}, "callbacks": [cb]})
        if cb.run is not None and promised(cb.run):
            break
    assert cb.run is not None and ledger.count("post_reply") >= 1

    def make(**choice: Any) -> Any:
        return LangGraphAgent(app, model=model, safe_tools=["lookup_order"],
                              side_effect_tools=["post_reply"], **choice)

    check_choices(cb.run, make, ledger)


def test_match_on_is_explicit() -> None:
    rec = {("close_account", '{"account_id":"A","note":"as asked"}'): "closed A"}
    default = ToolSafety.of(["close_account", "post_reply"])
    # free text next to an identifying argument: the note may be re-worded
    assert default.serve("close_account", {"account_id": "A", "note": "per ticket"}, rec) == \
        "closed A"
    with pytest.raises(SideEffectBlocked):  # another account is another action
        default.serve("close_account", {"account_id": "B", "note": "as asked"}, rec)
    exact = ToolSafety.of(["close_account"], match_on={"close_account": "exact"})
    with pytest.raises(SideEffectBlocked, match="record cannot answer"):
        exact.serve("close_account", {"account_id": "A", "note": "per ticket"}, rec)
    anything = ToolSafety.of(["close_account"], match_on={"close_account": "any"})
    assert anything.serve("close_account", {"account_id": "B"}, rec) == "closed A"
    for bad in ([], (), "account_id", [1]):
        with pytest.raises(InvalidIntervention, match="'exact'.*'any'"):
            ToolSafety.of(["close_account"], match_on={"close_account": bad})
    with pytest.raises(InvalidIntervention, match="not side-effect tools"):
        ToolSafety.of(["close_account"], match_on={"close_acount": ["account_id"]})


def test_a_result_that_names_a_free_text_argument_answers_only_that_argument() -> None:
    """A name with a space is free text to the default rule, but a result that repeats it is
    about it: a user trial's branch booked "Cervejaria Ramiro" and was answered "booked at
    Taberna Baixa" from the record, and CAR said no step caused the failure, when one did."""
    rec = {("book_table", '{"people":2,"restaurant":"Taberna Baixa"}'):
           "table for 2 booked at Taberna Baixa"}
    default = ToolSafety.of(["book_table"])
    with pytest.raises(SideEffectBlocked, match=r"answered naming restaurant='Taberna Baixa'"):
        default.serve("book_table", {"people": 2, "restaurant": "Cervejaria Ramiro"}, rec)
    same = {"people": 2, "restaurant": "Taberna Baixa"}
    assert default.serve("book_table", same, rec) == "table for 2 booked at Taberna Baixa"
    # a result that does not repeat the free text still answers a re-worded call
    noted = {("book_table", '{"note":"by the window","people":2}'): "booked"}
    assert default.serve("book_table", {"people": 2, "note": "near the door"}, noted) == "booked"
    # the user's rule wins: these arguments decide, the name does not
    chosen = ToolSafety.of(["book_table"], match_on={"book_table": ["people"]})
    assert chosen.serve("book_table", {"people": 2, "restaurant": "Cervejaria Ramiro"},
                        rec) == "table for 2 booked at Taberna Baixa"
    simulated = ToolSafety.of(["book_table"], simulators={
        "book_table": lambda a: f"booked at {a['restaurant']}"})
    assert simulated.serve("book_table", {"people": 2, "restaurant": "Cervejaria Ramiro"},
                           rec) == "booked at Cervejaria Ramiro"


def test_a_free_text_tool_the_record_never_called_is_not_told_to_match_on() -> None:
    """A retrieval tool classified as a side effect, which the recorded run never called: a
    branch's call of it stops the estimate, and the hint offered match_on first, which cannot
    answer a call with no recorded one (a trial followed it into a second refusal)."""
    rec = {("send_email", '{"body":"Hi Dana","to":"dana@example.com"}'): "sent"}
    safety = ToolSafety.of(["send_email", "policy_search"])
    with pytest.raises(SideEffectBlocked) as stopped:
        safety.serve("policy_search", {"input": "what may a refund email contain?"}, rec)
    said = f"{stopped.value} {stopped.value.hint}"
    assert "the recorded run never called it" in said and "match_on" not in said
    assert "simulators={'policy_search'" in said and "to safe_tools" in said
    # a free-text call of a tool the record did call still gets the choice between the rules
    with pytest.raises(SideEffectBlocked, match="all free text") as reworded:
        safety.serve("send_email", {"body": "Hello Dana", "to": "Dana at home"}, rec)
    assert "match_on={'send_email': 'any'}" in str(reworded.value.hint)
