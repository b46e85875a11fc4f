"""A run with no run context whose last step was a side-effect call (the model server's 503 on
the call after the refund) is attributed: no tool had a context to write, so there is no write
a branch could drop. A user trial's run was refused for "what it wrote to the run context
cannot be told from the record"."""

from __future__ import annotations

from typing import Any

from agents import Agent, Runner, function_tool
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel

import car_core as car
from car_core.contract import RunStatus

REFUNDS: list[int] = []
SERVER = {"down": True}


@function_tool
def lookup_order(order_id: str) -> str:
    """An order's amount (reads only)."""
    return "amount 50"


@function_tool
def issue_refund(order_id: str, amount: int) -> str:
    """Refund an order (moves money)."""
    REFUNDS.append(amount)
    return f"refunded {amount}"


def desk(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
    """Looks the order up, then refunds 500 (the failure) with probability 0.5, else 50; the
    server answers 503 to the call after a refund while ``SERVER["down"]``."""
    answered = [m for m in messages if m["role"] == "tool"]
    if not answered:
        return assistant(None, [tool_call("c0", "lookup_order", {"order_id": "A17"})])
    if len(answered) == 1:
        amount = 500 if rng.random() < 0.5 else 50
        return assistant(None, [tool_call("c1", "issue_refund",
                                          {"order_id": "A17", "amount": amount})])
    if SERVER["down"]:
        raise RuntimeError("503 Service Unavailable")
    return "refunded"


def overpaid(run: car.Trajectory) -> bool:
    return any('"amount": 500' in c["function"]["arguments"].replace('":500', '": 500')
               for s in run.steps for c in s.action.get("tool_calls") or ())


def test_a_run_without_context_that_stopped_after_a_refund_is_attributed() -> None:
    app = Agent(name="desk", model=ScriptedModel(desk), tools=[lookup_order, issue_refund])
    rec = CarRecorder(outcome=overpaid)
    run = None
    for _ in range(40):
        try:
            Runner.run_sync(app, "refund A17", hooks=rec)
        except RuntimeError:
            pass
        run = rec.run
        if overpaid(run):
            break
    assert run is not None and run.status == RunStatus.ERROR and overpaid(run)
    SERVER["down"] = False  # back up when the run is attributed
    refunds = len(REFUNDS)
    agent = OpenAIAgentsAgent(app, safe_tools=["lookup_order"],
                              simulators={"issue_refund": lambda arguments: "refunded"})
    res = car.contrastive(run, agent, outcome=overpaid, rollouts=32, seed=0)
    assert res.locus == 1  # the refund's amount was decided there
    assert len(REFUNDS) == refunds  # simulated (one-argument: no context) on every branch
