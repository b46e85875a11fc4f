"""``Runner.run(..., run_config=RunConfig(model=M))``: the SDK decides every agent's turns with
``M``, whatever model each agent names. An audit's app ran so and was attributed with the same
run config: its branches called each agent's own model (a deterministic one that always
over-refunds), so CAR said no step caused the failure where the planted step rescued half.

Planted: the run-config model looks the order up (step 0), refunds the maximum w.p. 0.5
(step 1) and replies; the agent's own model always refunds the maximum. P(fail | step 1
re-decided by M) = 0.5, held = 1: step 1 rescues 0.5, and M alone decides on branches."""

from __future__ import annotations

import json
from typing import Any

from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel

import car_core as car
from car_core.model.vocabulary import Answer

set_tracing_disabled(True)


@function_tool
def lookup_order(order_id: str) -> str:
    """Look an order up."""
    return "order 7: a kettle, 40 EUR"


@function_tool
def issue_refund(order_id: str, amount: int) -> str:
    """Refund an order (a side effect)."""
    return f"refunded {amount}"


class Desk:
    """A model deciding the refund, big w.p. ``p_big``, counting its calls."""

    def __init__(self, p_big: float) -> None:
        self.p_big, self.calls = p_big, 0

    def __call__(self, messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
        self.calls += 1
        if messages[-1].get("name") == "issue_refund":
            return assistant("Done.")
        if not any(m["role"] == "tool" for m in messages):
            return assistant(None, [tool_call("c0", "lookup_order", {"order_id": "7"})])
        amount = 5000 if rng.random() < self.p_big else 40
        return assistant(None, [tool_call("c1", "issue_refund",
                                          {"order_id": "7", "amount": amount})])


def over_refunded(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "issue_refund"
               and json.loads(c["function"]["arguments"])["amount"] > 40
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())


def test_branches_decide_with_the_run_configs_model() -> None:
    own, chosen = Desk(1.0), Desk(0.5)
    app = Agent(name="desk", tools=[lookup_order, issue_refund], model=ScriptedModel(own))
    for seed in range(30):
        config = RunConfig(model=ScriptedModel(chosen, seed=seed))
        rec = CarRecorder()
        Runner.run_sync(app, "my kettle broke, order 7", hooks=rec, run_config=config)
        if over_refunded(rec.run):
            break
    run = rec.run
    assert over_refunded(run) and own.calls == 0
    agent = OpenAIAgentsAgent(app, safe_tools=["lookup_order"], side_effect_tools=["issue_refund"],
                              simulators={"issue_refund": lambda a: f"refunded {a['amount']}"},
                              run_config=config)
    res = car.contrastive(run, agent, outcome=over_refunded, rollouts=32, seed=0)
    assert own.calls == 0 and chosen.calls > 0  # the run config's model decided every branch
    assert res.answer == Answer.LOCUS and res.locus == 1
    step = res.steps[1]
    assert step.ci is not None and step.ci.low <= 0.5 <= step.ci.high


def test_the_default_executor_follows_the_run_configs_model() -> None:
    """Branches default to many at once where the model that decides them waits on a server:
    the run config's model, when it names one, not each agent's own. An app whose agents name
    an in-process model but whose runs use a hosted one through ``RunConfig(model=...)`` ran
    its branches one at a time; the reverse ran an in-process model's branches on the
    asyncio executor."""
    local, hosted = ScriptedModel(Desk(0.5)), ScriptedModel(Desk(0.5), latency_s=0.3)
    for agents_model, config_model, waits in ((local, hosted, True), (hosted, local, False),
                                               (local, None, False), (hosted, None, True)):
        app = Agent(name="desk", tools=[lookup_order, issue_refund], model=agents_model)
        agent = OpenAIAgentsAgent(app, safe_tools=["lookup_order"],
                                  side_effect_tools=["issue_refund"],
                                  run_config=RunConfig(model=config_model))
        assert agent.prefers_concurrency is waits, (agents_model, config_model)


def test_steps_recorded_in_a_block_told_the_run_config_carry_its_models_name() -> None:
    """The SDK decides every turn with ``RunConfig(model=...)``; the hooks see only each agent's
    own model, so steps were labelled with a model that never ran (and priced by it). Recorded
    in ``recording(agent, run_config=config)`` they carry the run config's model."""
    own, chosen = Desk(1.0), Desk(0.5)
    app = Agent(name="desk", tools=[lookup_order, issue_refund],
                model=ScriptedModel(own, model="agents-own"))
    config = RunConfig(model=ScriptedModel(chosen, model="run-config-model"))
    rec = CarRecorder()
    with rec.recording(app, run_config=config):
        Runner.run_sync(app, "my kettle broke, order 7", hooks=rec, run_config=config)
    assert own.calls == 0
    assert {s.meta["model"] for s in rec.run.steps} == {"run-config-model"}
