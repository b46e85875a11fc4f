"""A run the SDK ends at a tool call (``tool_use_behavior="stop_on_first_tool"``, a custom
``ToolsToFinalOutputResult``) has the final output the SDK ended it with in
``final_state(run)["final_output"]``, recorded and on branches alike. It was None: an outcome
over the final output, as the docs suggest, scored every such failure as a pass."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, FunctionToolResult, Runner, ToolsToFinalOutputResult, function_tool
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel, final_state

import car_core as car

P_WRONG = 0.5  # the desk refunds 500 instead of 50


@function_tool
def issue_refund(order_id: str, amount: int) -> str:
    """Refund an order (moves money)."""
    return f"refunded {amount} on {order_id}"


def desk(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
    amount = 500 if rng.random() < P_WRONG else 50
    return assistant(None, [tool_call("c1", "issue_refund",
                                      {"order_id": "A17", "amount": amount})])


def overpaid(run: car.Trajectory) -> bool:
    return "refunded 500" in str(final_state(run)["final_output"])


def stamped(ctx: Any, results: list[FunctionToolResult]) -> ToolsToFinalOutputResult:
    return ToolsToFinalOutputResult(is_final_output=True,
                                    final_output={"receipt": str(results[0].output)})


@pytest.mark.parametrize("behavior", ["stop_on_first_tool", "function"])
def test_the_final_output_of_a_run_ended_at_a_tool_call_is_kept(behavior: str) -> None:
    app = Agent(name="desk", model=ScriptedModel(desk), tools=[issue_refund],
                tool_use_behavior=stamped if behavior == "function" else behavior)
    rec = CarRecorder(outcome=overpaid)
    for _ in range(40):
        result = Runner.run_sync(app, "refund A17", hooks=rec)
        if "500" in str(result.final_output):
            break
    run = rec.run
    # as the SDK hands it to run hooks: a function's dict arrives as its str
    want = (str({"receipt": "refunded 500 on A17"}) if behavior == "function"
            else "refunded 500 on A17")
    assert final_state(run)["final_output"] == want
    assert run.outcome is not None and run.outcome.value == 1.0
    agent = OpenAIAgentsAgent(app, simulators={
        "issue_refund": lambda args: f"refunded {args['amount']} on {args['order_id']}"})
    est = car.intervene(run, agent, car.do_resample(0), outcome=overpaid, rollouts=48, seed=0)
    lo, hi = est.ci
    assert lo <= P_WRONG <= hi  # branches end with their own final output too
