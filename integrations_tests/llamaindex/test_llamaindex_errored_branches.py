"""A LlamaIndex safe tool that errors on branches where the record's identical call was answered
(its service down where the estimate runs): such a branch is a failure, never an outcome.

The planted agent looks order 7 up (step 0, safe, run live on branches), refunds the maximum
with probability 0.3 (step 1, a side effect) and replies (step 2); failure = it refunded. Told
of a lookup error, it apologises instead of deciding, which a scored branch would count as a
rescue of the lookup (whose rescue is 0).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import Any

import pytest
from car_adapters.common.messages import assistant, tool_call
from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, ScriptedLLM
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.tools import FunctionTool

import car_core as car
from car_core.contract import RunStatus, ToolSource
from car_core.engine.execution import Sequential
from car_core.errors import AgentError, BranchesFailed

ORDER_7 = assistant(None, [tool_call("call_0", "lookup_order", {"order_id": "7"})])
ORDER_8 = assistant(None, [tool_call("call_0", "lookup_order", {"order_id": "8"})])
REFUND = assistant(None, [tool_call("call_1", "issue_refund", {"amount": 5000})])
DENY = assistant(None, [tool_call("call_1", "deny_refund", {})])


class Orders:
    """The orders database: a lookup of an order in ``down`` raises, and the framework tells
    the agent the error (``ToolOutput(is_error=True)``); the workflow does not raise."""

    down: frozenset[str] = frozenset()
    said = "orders database unreachable"


def lookup_order(order_id: str) -> str:
    """Look an order up (reads only: safe on branches)."""
    if order_id in Orders.down:
        raise RuntimeError(Orders.said)
    return f"order {order_id}: a kettle, 40 EUR"


def issue_refund(amount: int) -> str:
    """Refund the customer (moves money: a side effect)."""
    return f"refunded {amount} EUR"


def deny_refund() -> str:
    """Tell the customer no refund is due."""
    return "denied"


def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    k = sum(1 for m in messages if m["role"] == "assistant")
    if k == 0:
        return ORDER_7
    if Orders.said in str(messages[-1].get("content")):
        return "Sorry, I cannot reach our orders system right now."
    if k == 1:
        return REFUND if rng.random() < 0.3 else DENY
    return "done"


def refunded(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "issue_refund"
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())


async def _run(app: FunctionAgent) -> None:
    await app.run(user_msg="Refund order 7.")


@pytest.fixture
def planted() -> Any:
    Orders.down = frozenset()
    app = FunctionAgent(tools=[lookup_order, issue_refund, deny_refund],
                        llm=ScriptedLLM(decide, seed=0), system_prompt="You issue refunds.")
    rec = CarRecorder().attach()
    try:
        for _ in range(50):  # p = 0.3 per run; the LLM's rng is seeded: deterministic
            asyncio.run(_run(app))
            if refunded(rec.run):
                break
    finally:
        rec.detach()
    run = rec.run
    assert refunded(run) and len(run.steps) == 3
    agent = LlamaIndexAgent(app, safe_tools=["lookup_order", "deny_refund"],
                            side_effect_tools=["issue_refund"])
    yield agent, run
    Orders.down = frozenset()


def test_a_safe_tool_that_errors_only_on_branches_is_never_scored(planted: Any) -> None:
    """Each branch that re-decides the lookup calls it live, gets the error for the call the
    record got an answer for, and is a failure; with all of them failing the estimate refuses,
    naming the tool and keeping its own words."""
    agent, run = planted
    Orders.down = frozenset({"7"})
    with pytest.raises(BranchesFailed, match="safe tool 'lookup_order' ran live at step 0 "
                                             "and returned an error") as info:
        car.contrastive(run, agent, outcome=refunded, rollouts=16, seed=0, search="full",
                        executor=Sequential(), progress=False)
    failures = info.value.failures
    # only the branches that re-decide the lookup call it live
    assert failures and all(f.task.plan.start == 0 for f in failures)
    assert all("orders database unreachable" in f.error for f in failures)


def test_an_error_for_arguments_the_record_never_used_is_scored(planted: Any) -> None:
    """A lookup the record never made (order 8) that errors for the call (no such order) is
    what the branch measures: the agent's reply to it is scored, and the result says it came
    back as an error. One that says the service is down is no answer of the agent's world."""
    agent, run = planted
    Orders.down, Orders.said = frozenset({"8"}), "no order 8 on this account"
    try:
        dist = car.intervene(run, agent, car.do_action(0, ORDER_8), outcome=refunded,
                             rollouts=2)
    finally:
        Orders.said = "orders database unreachable"
    assert not dist.failures and dist.trajectories
    for branch in dist.trajectories:
        assert branch.status == RunStatus.COMPLETE and not refunded(branch)
        (result,) = branch.steps[0].observation
        assert result["status"] == "error" and "no order 8" in result["content"]
        assert branch.steps[0].meta["tool_sources"] == {"call_0": ToolSource.LIVE}
    with pytest.raises(AgentError, match="returned an error that says its service is down"):
        car.intervene(run, agent, car.do_action(0, ORDER_8), outcome=refunded, rollouts=2)


def test_a_run_recorded_without_error_marks_keeps_its_branches_scored(planted: Any) -> None:
    """A run recorded before results were marked cannot show its lookup was answered, so a
    branch's lookup error is not taken for a change of the tool's world."""
    agent, run = planted
    unmarked = dataclasses.replace(
        run, meta={k: v for k, v in run.meta.items() if k != "tool_errors_marked"})
    Orders.down = frozenset({"7"})
    dist = car.intervene(unmarked, agent, car.do_resample(0), outcome=refunded, rollouts=2)
    assert not dist.failures and all(not refunded(t) for t in dist.trajectories)


class Backend:
    """The orders backend behind ``lookup_noted``: ``mode`` "" answers, "flaky" fails every
    other call, "gone" fails every call (a credential gone), in words that blame no service."""

    mode = ""
    calls = 0


def lookup_noted(order_id: str, note: str = "") -> str:
    """Look an order up (reads only: safe on branches); ``note`` says why."""
    Backend.calls += 1
    if Backend.mode == "gone" or (Backend.mode == "flaky" and Backend.calls % 2):
        raise RuntimeError("the orders backend dropped the request")
    return f"order {order_id}: a kettle, 40 EUR"


NOTES = itertools.count()


def rewords_and_gives_up(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    """Refunds every time (no step's rescue is above 0), words a new note on every lookup (no
    branch's lookup is the record's call) and, told the lookup failed, apologises instead of
    deciding: a scored branch would count that as a rescue of the lookup."""
    k = sum(1 for m in messages if m["role"] == "assistant")
    if k == 0:
        return assistant(None, [tool_call("call_0", "lookup_order",
                                          {"order_id": "7", "note": f"lookup #{next(NOTES)}"})])
    if "dropped the request" in str(messages[-1].get("content")):
        return "Sorry, I cannot reach our orders system right now."
    return REFUND if k == 1 else "done"


@pytest.mark.parametrize(("mode", "why"), [
    # every other call fails: the branch's call fails, and answers when run again
    ("flaky", "and answered the same call when CAR ran it again"),
    # every call fails: the record's answered call fails too when run again
    ("gone", "and the record's answered call of it (arguments "),
])
def test_an_error_that_is_not_the_calls_own_is_never_scored(mode: str, why: str) -> None:
    """An error for re-worded arguments the record never used was taken for the agent's doing,
    and its apology read as a rescue of the lookup (a user trial: "step 0 caused the failure"
    where no step did). CAR now runs the call again, and the record's call: an error that goes
    away, or that the record's call now gets too, is the tool's world, never scored."""
    Backend.mode, Backend.calls = "", 0
    lookup = FunctionTool.from_defaults(lookup_noted, name="lookup_order")
    app = FunctionAgent(tools=[lookup, issue_refund], system_prompt="You issue refunds.",
                        llm=ScriptedLLM(rewords_and_gives_up, seed=0))
    rec = CarRecorder().attach()
    try:
        asyncio.run(_run(app))
    finally:
        rec.detach()
    run = rec.run
    assert refunded(run)
    agent = LlamaIndexAgent(app, safe_tools=["lookup_order"], side_effect_tools=["issue_refund"])
    Backend.mode = mode
    try:
        with pytest.raises(BranchesFailed) as info:
            car.contrastive(run, agent, outcome=refunded, rollouts=16, seed=0, search="full",
                            executor=Sequential(), progress=False)
    finally:
        Backend.mode = ""
    failures = info.value.failures
    # only the branches that re-decide the lookup call it live
    assert failures and all(f.task.plan.start == 0 for f in failures)
    assert all("safe tool 'lookup_order' ran live at step 0" in f.error and why in f.error
               for f in failures), failures[0].error
