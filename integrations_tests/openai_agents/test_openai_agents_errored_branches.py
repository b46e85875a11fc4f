"""An OpenAI Agents SDK safe tool that errors on branches where the record's identical call was
answered (its service down where the estimate runs): such a branch is a failure, never an
outcome.

The planted agent looks order 7 up (step 0, safe, run live on branches), refunds the maximum
with probability 0.3 (step 1, a side effect) and replies (step 2); failure = it refunded. The
SDK turns the lookup's exception into a message for the model (the default one, or the tool's
own ``failure_error_function``); told of it, the agent apologises instead of deciding, which a
scored branch would count as a rescue of the lookup (whose rescue is 0).
"""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, Runner, function_tool, set_tracing_disabled
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel

import car_core as car
from car_core.contract import RunStatus, ToolSource
from car_core.engine.execution import Sequential
from car_core.errors import AgentError, BranchesFailed

set_tracing_disabled(True)  # no trace export from tests (it would need an API key)

ORDER_7 = assistant(None, [tool_call("call_0", "lookup_order", {"order_id": "7"})])
ORDER_8 = assistant(None, [tool_call("call_0", "lookup_order", {"order_id": "8"})])
REFUND = assistant(None, [tool_call("call_1", "issue_refund", {"amount": 5000})])
DENY = assistant(None, [tool_call("call_1", "deny_refund", {})])


class Orders:
    """The orders database: a lookup of an order in ``down`` raises; the SDK answers the model
    with a failure message, so the run does not raise."""

    down: frozenset[str] = frozenset()
    said = "orders database unreachable"


def _lookup(order_id: str) -> str:
    if order_id in Orders.down:
        raise RuntimeError(Orders.said)
    return f"order {order_id}: a kettle, 40 EUR"


def lookup_order(order_id: str) -> str:
    """Look an order up (reads only: safe on branches)."""
    return _lookup(order_id)


def said_so(ctx: Any, error: Exception) -> str:
    return f"lookup failed: {error}"


# the SDK's default message, which hides the error, and the tool's own, which words it
LOOKUPS = {"default": function_tool(lookup_order),
           "own": function_tool(lookup_order, failure_error_function=said_so)}


@function_tool
def issue_refund(amount: int) -> str:
    """Refund the customer (moves money: a side effect)."""
    return f"refunded {amount} EUR"


@function_tool
def deny_refund() -> str:
    """Tell the customer no refund is due."""
    return "denied"


def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    k = sum(1 for m in messages if m["role"] == "assistant")
    if k == 0:
        return ORDER_7
    if messages[-1]["role"] == "tool" and "kettle" not in str(messages[-1]["content"]) \
            and messages[-1].get("name") == "lookup_order":
        return "Sorry, I cannot reach our orders system right now."
    if k == 1:
        return REFUND if rng.random() < 0.3 else DENY
    return "done"


def refunded(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "issue_refund"
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())


@pytest.fixture(params=sorted(LOOKUPS))
def planted(request: Any) -> Any:
    Orders.down = frozenset()
    app = Agent(name="Refunds", instructions="You issue refunds.",
                model=ScriptedModel(decide, seed=0),
                tools=[LOOKUPS[request.param], issue_refund, deny_refund])
    rec = CarRecorder()
    for _ in range(50):  # p = 0.3 per run; the model's rng is seeded: deterministic
        Runner.run_sync(app, "Refund order 7.", hooks=rec)
        if refunded(rec.run):
            break
    run = rec.run
    assert refunded(run) and len(run.steps) == 3
    agent = OpenAIAgentsAgent(app, safe_tools=["lookup_order", "deny_refund"],
                              side_effect_tools=["issue_refund"])
    yield agent, run
    Orders.down = frozenset()


def test_a_safe_tool_that_errors_only_on_branches_is_never_scored(planted: Any) -> None:
    """Each branch that re-decides the lookup calls it live, is told of the error for the call
    the record got an answer for, and is a failure; with all of them failing the estimate
    refuses, naming the tool and the error (which the default message hides from the model)."""
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
    # tagged with the lookup's step, and the stop says to bring the service up: a trial's
    # MCP server down read "failed after step 3, its last ... fix the agent" (the joined
    # branch dropped the step the adapter had marked)
    assert all(f.step == 0 for f in failures)
    assert "bring that service up where this estimate runs" in str(info.value)
    assert "fix the agent" not in str(info.value)


def test_an_error_for_arguments_the_record_never_used_is_scored(planted: Any) -> None:
    """A lookup the record never made (order 8) that errors for the call (no such order) is
    what the branch measures: the agent's reply to it is scored. One that says the service is
    down is no answer of the agent's world: not scored."""
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
        assert branch.steps[0].meta["tool_sources"] == {"call_0": ToolSource.LIVE}
    with pytest.raises(AgentError, match="returned an error that says its service is down"):
        car.intervene(run, agent, car.do_action(0, ORDER_8), outcome=refunded, rollouts=2)


def test_a_recorded_error_answered_alike_on_branches_is_scored(planted: Any) -> None:
    """A lookup that errored in the record too (the same message) has not drifted: the
    branches that repeat it are scored."""
    agent, _ = planted
    Orders.down = frozenset({"7"})
    rec = CarRecorder()  # a record made while the database was down
    Runner.run_sync(agent.root, "Refund order 7.", hooks=rec)
    down = rec.run
    assert not refunded(down)
    dist = car.intervene(down, agent, car.do_resample(0), outcome=refunded, rollouts=2)
    assert not dist.failures and all(not refunded(t) for t in dist.trajectories)
