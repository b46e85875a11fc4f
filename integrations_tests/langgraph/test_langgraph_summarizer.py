"""Branches at a ``SummarizationMiddleware`` step of a ``create_agent`` app: the summarizer's
model call is a step of its own, whose input the middleware builds (its prompt around the
conversation), not the graph's messages. A fork there re-runs the middleware's node on the
checkpoint the step was scheduled from, so the summarizer sees exactly what it saw in the record;
forcing its action or input can only be done at its model call, which needs ``CarChatModel``
around the summarizer, and is refused by name, before any branch, without it.

The desk (``desk``): the model looks the order up (step 0); the conversation now has three
messages, so the summarizer fires (step 1); the model refunds with p = 0.5, else denies and
stops (step 2); after a refund the summarizer fires again (step 3) and the model replies (step 4).
The planted truth for a failing run (a refund was issued):

    P(fail | do_resample(1)) = P(fail | do_resample(2)) = 0.5,
    P(fail | do_resample(3)) = P(fail | do_resample(4)) = 1     -> the locus is step 2.

Tolerance: a mean over n = 32 rollouts has standard error sqrt(0.25 / 32) = 0.088; we allow 4 of
them (0.35), so 0.5 must land in [0.15, 0.85].
"""

from __future__ import annotations

import json
import math
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from car_adapters.demo.planted import SeededChatModel
from car_adapters.langgraph import CarCallback, CarChatModel, CarMiddleware, LangGraphAgent
from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.config import get_config

import car_core as car
from car_core.errors import AdapterError

N = 32
TOL = 4 * math.sqrt(0.25 / N)
SUMMARIZER_NODE = "SummarizationMiddleware.before_model"
LOOKUPS: list[str] = []  # every real execution of lookup_order
REFUNDS: list[str] = []  # every real execution of issue_refund (the side effect)
DESK_CALLS: list[str] = []  # the thread of every real call of the desk's model
SUMMARIZED: list[tuple[str, list[str]]] = []  # (thread, the input) of every summarizer call
# the desk's tools, classified: the lookup runs on branches, the refund never does
DESK_TOOLS: dict[str, Any] = {"safe_tools": ["lookup_order"], "side_effect_tools": ["issue_refund"]}


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up (read-only)."""
    LOOKUPS.append(order_id)
    return json.dumps({"order_id": order_id, "amount": 80.0, "refund_eligible": False})


@tool
def issue_refund(order_id: str, amount: float) -> str:
    """Refund an order (moves money)."""
    REFUNDS.append(order_id)
    return json.dumps({"refunded": order_id, "amount": amount})


def _thread() -> str:
    return str(get_config()["configurable"].get("thread_id"))


class Desk(SeededChatModel):
    """Looks up, refunds with p = 0.5 (else denies), then replies."""

    model_name: str = "planted-desk"

    @property
    def _llm_type(self) -> str:
        return "planted-desk"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        DESK_CALLS.append(_thread())
        done = [m.name for m in messages if isinstance(m, ToolMessage)]
        u = self._draw()
        call = f"c{uuid.uuid4().hex[:6]}"
        if not done:
            msg = AIMessage("", tool_calls=[{"name": "lookup_order", "args": {"order_id": "A7"},
                                             "id": call}])
        elif done[-1] == "lookup_order":
            msg = (AIMessage("", tool_calls=[{"name": "issue_refund", "id": call,
                                              "args": {"order_id": "A7", "amount": 80.0}}])
                   if u < 0.5 else AIMessage("Sorry, A7 is outside the refund window."))
        else:
            msg = AIMessage("Your refund is on its way.")
        return ChatResult(generations=[ChatGeneration(message=msg)])


class Summarizer(SeededChatModel):
    """Writes the same summary every time, and keeps what it was given."""

    model_name: str = "planted-summarizer"

    @property
    def _llm_type(self) -> str:
        return "planted-summarizer"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        SUMMARIZED.append((_thread(), [str(m.content) for m in messages]))
        return ChatResult(generations=[ChatGeneration(message=AIMessage("order A7: looked up"))])


def refunded(run: car.Trajectory) -> bool:
    return any(c.get("function", {}).get("name") == "issue_refund"
               for s in run.steps if isinstance(s.action, dict)
               for c in s.action.get("tool_calls") or ())


def desk(saver: Any, *, car_decides: bool = False,
         middleware: bool | None = None) -> tuple[Any, CarMiddleware | None]:
    """The desk app; with ``car_decides``, CarMiddleware on the desk's model and the summarizer
    wrapped in CarChatModel, so CAR decides every model call; ``middleware`` (default
    ``car_decides``): CarMiddleware on the desk's model."""
    mw = CarMiddleware() if (car_decides if middleware is None else middleware) else None
    summarizer: Any = Summarizer()
    if car_decides:
        summarizer = CarChatModel(inner=summarizer)
    summarizing = SummarizationMiddleware(model=summarizer, trigger=("messages", 3),
                                          keep=("messages", 2))
    app = create_agent(Desk(rng_seed=0), [lookup_order, issue_refund],
                       system_prompt="Refund only eligible orders.", checkpointer=saver,
                       middleware=[summarizing, *([mw] if mw is not None else [])])
    return app, mw


def record_failing(app: Any) -> car.Trajectory:
    """The first run of the app (in threads rec-0, rec-1, ...) that refunds."""
    for i in range(20):
        cb = CarCallback()
        app.invoke({"messages": [{"role": "user", "content": "Refund my order A7 please."}]},
                   {"configurable": {"thread_id": f"rec-{i}"}, "callbacks": [cb]})
        run = cb.run
        assert run is not None
        if refunded(run):
            return run
    raise AssertionError("no failing run in 20 recordings")


@pytest.fixture(autouse=True)
def ledgers() -> Iterator[None]:
    for kept in (LOOKUPS, REFUNDS, DESK_CALLS, SUMMARIZED):
        kept.clear()
    yield


def threads(saver: Any) -> set[str]:
    return {str(c.config["configurable"]["thread_id"]) for c in saver.list(None)}


def test_a_summarizer_step_records_the_input_the_middleware_built() -> None:
    app, _ = desk(InMemorySaver())
    run = record_failing(app)
    assert [s.meta["node"] for s in run.steps] == [
        "model", SUMMARIZER_NODE, "model", SUMMARIZER_NODE, "model"]
    recorded_input = next(given for t, given in SUMMARIZED if t == run.meta["thread_id"])
    summarizer_step = run.steps[1]
    assert summarizer_step.meta["input"] == "node"
    assert [m["content"] for m in summarizer_step.state] == recorded_input
    assert "Refund my order A7 please." in summarizer_step.state[0]["content"]  # summarized
    assert "input" not in run.steps[0].meta and run.steps[0].state[0]["role"] == "user"


def test_do_resample_at_a_summarizer_step_sees_what_the_recorded_call_saw() -> None:
    """No model= needed: the fork re-runs the middleware's node on the recorded checkpoint; the
    summarizer gets the recorded input, step 0 is held (no desk call, no lookup), and the
    decision after it is re-drawn: P(fail) = 0.5."""
    saver = InMemorySaver()
    app, _ = desk(saver)
    run = record_failing(app)
    recorded_input = next(given for t, given in SUMMARIZED if t == run.meta["thread_id"])
    desk_calls, lookups, refunds = len(DESK_CALLS), len(LOOKUPS), len(REFUNDS)
    summarized = len(SUMMARIZED)
    agent = LangGraphAgent(app, **DESK_TOOLS)
    dist = car.intervene(run, agent, car.do_resample(1), outcome=refunded, rollouts=N, seed=0,
                         progress=False)
    assert abs(dist.mean - 0.5) <= TOL
    assert len(LOOKUPS) == lookups and len(REFUNDS) == refunds  # prefix held, refund guarded
    branch_calls = SUMMARIZED[summarized:]
    firsts = {}
    for t, given in branch_calls:
        firsts.setdefault(t, given)
    assert len(firsts) == N and all(given == recorded_input for given in firsts.values())
    for branch in dist.trajectories:
        assert branch.steps[0].meta["origin"] == "held"
        assert branch.steps[0].action == run.steps[0].action
        assert branch.steps[1].meta["origin"] == "live"
        assert branch.steps[1].meta["node"] == SUMMARIZER_NODE
        assert branch.steps[1].state == run.steps[1].state
    # the desk decided steps 2 and on only: one call for a denial, two after a refund
    assert len(DESK_CALLS) - desk_calls == sum(1 + refunded(b) for b in dist.trajectories)
    assert all(t.startswith("rec-") for t in threads(saver))  # every branch thread deleted


def test_contrastive_over_summarizer_steps_finds_the_decision_and_the_hint_leads_there() -> None:
    """With model= and an unwrapped summarizer, CAR refuses before any branch, and its hint's
    second way (no model=) attributes the run: the locus is the refund decision (step 2)."""
    app, mw = desk(InMemorySaver(), middleware=True)
    assert mw is not None
    run = record_failing(app)
    calls = len(DESK_CALLS) + len(SUMMARIZED)
    with pytest.raises(AdapterError, match=SUMMARIZER_NODE) as refused:
        car.contrastive(run, LangGraphAgent(app, model=mw, **DESK_TOOLS),
                        outcome=refunded, rollouts=16, seed=0, progress=False)
    assert len(DESK_CALLS) + len(SUMMARIZED) == calls  # refused before any branch
    assert "do_resample works at every step without it, a summarizer's too" in str(
        refused.value)
    refunds = len(REFUNDS)
    res = car.contrastive(run, LangGraphAgent(app, **DESK_TOOLS),
                          outcome=refunded, rollouts=16, seed=0, progress=False)
    assert res.locus == 2
    assert len(REFUNDS) == refunds


def test_forcing_a_summarizer_step_is_refused_without_car_and_lands_at_the_call_with_it() -> None:
    """do_action / do_context at the summarizer's step without CAR deciding its call would be
    written as the node's output or into the graph's messages, neither of which is what the
    summarizer saw or said: refused by name before any branch. With CarChatModel around the
    summarizer (and CarMiddleware on the desk), the forced summary is what the middleware
    writes, and the edited input is what the summarizer gets."""
    saver = InMemorySaver()
    app, _ = desk(saver)
    run = record_failing(app)
    agent = LangGraphAgent(app, **DESK_TOOLS)
    calls = len(DESK_CALLS) + len(SUMMARIZED)
    forced = {"role": "assistant", "content": "nothing was looked up"}
    for iv in (car.do_action(1, forced),
               car.do_context(1, lambda ms: [{"role": "user", "content": "summarize: nothing"}])):
        with pytest.raises(AdapterError, match=r"step 1 is a model call whose whole input node "
                                               r"'SummarizationMiddleware.before_model' built "
                                               r"itself.*CarChatModel\(inner=summarizer\)"):
            car.intervene(run, agent, iv, outcome=refunded, rollouts=2, progress=False)
    assert len(DESK_CALLS) + len(SUMMARIZED) == calls
    assert all(t.startswith("rec-") for t in threads(saver))  # no branch thread was made

    app, mw = desk(InMemorySaver(), car_decides=True)
    run = record_failing(app)
    assert [s.meta["car_decided"] for s in run.steps] == [True] * 5
    agent = LangGraphAgent(app, model=mw, **DESK_TOOLS)
    lookups = len(LOOKUPS)
    dist = car.intervene(run, agent, car.do_action(1, forced), outcome=refunded, rollouts=4,
                         seed=0, progress=False)
    for branch in dist.trajectories:
        assert branch.steps[1].meta["origin"] == "forced"
        assert branch.steps[1].action["content"] == "nothing was looked up"
        assert branch.steps[2].state[0]["content"].endswith("\n\nnothing was looked up")
    summarized = len(SUMMARIZED)
    dist = car.intervene(run, agent, car.do_context(
        1, lambda ms: [{"role": "user", "content": "summarize: nothing"}]), outcome=refunded,
        rollouts=4, seed=0, progress=False)
    firsts: dict[str, list[str]] = {}
    for t, given in SUMMARIZED[summarized:]:
        firsts.setdefault(t, given)
    assert list(firsts.values()) == [["summarize: nothing"]] * 4
    for branch in dist.trajectories:
        assert branch.steps[1].state == [{"role": "user", "content": "summarize: nothing"}]
    assert len(LOOKUPS) == lookups


def test_a_step_that_cannot_be_forked_is_refused_before_any_branch(tmp_path: Path) -> None:
    """A checkpoint of the last step deleted: contrastive, whose first branches start earlier,
    is refused naming it before any model is called."""
    conn = sqlite3.connect(tmp_path / "cp.db", check_same_thread=False)
    app, _ = desk(SqliteSaver(conn))
    run = record_failing(app)
    with conn:
        conn.execute("DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_id = ?",
                     (run.meta["thread_id"], run.steps[4].meta["checkpoint_id"]))
    calls = len(DESK_CALLS) + len(SUMMARIZED)
    with pytest.raises(AdapterError, match=r"was deleted.*\[step 4\]"):
        car.contrastive(run, LangGraphAgent(app, **DESK_TOOLS),
                        outcome=refunded, rollouts=8, seed=0, progress=False)
    assert len(DESK_CALLS) + len(SUMMARIZED) == calls
    conn.close()
