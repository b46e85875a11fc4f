"""User code the SDK runs besides tools: a handoff's ``on_handoff`` and an agent's
``AgentHooks``. A user trial's attribution paged the on-call person 16 times through
``on_handoff`` and wrote 134 audit lines through the agents' hooks, a tool answered from the
record among them. An app with a handoff callback is refused before any branch until
``handoff_callbacks=`` says whether branches call it; agent hooks never run on branches.

Planted: the triage agent hands off to ``oncall`` (``handoff(oncall, on_handoff=page)``) or
answers itself, each with probability 1/2 when re-decided; the recorded run hands off."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, AgentHooks, Runner, handoff
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel

import car_core as car
from car_core.contract import in_branch
from car_core.errors import AdapterError


class Desk:
    """The app; ``paged`` and ``audit`` are the real side effects of its callback and hooks."""

    def __init__(self) -> None:
        self.paged: list[str] = []
        self.audit: list[str] = []

    def app(self) -> Agent[Any]:
        desk = self

        class Audit(AgentHooks[Any]):
            async def on_start(self, context: Any, agent: Any) -> None:
                desk.audit.append(agent.name)

        def page(ctx: Any) -> None:
            self.paged.append("on-call")

        def triage(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
            if not in_branch() or rng.random() < 0.5:  # the recording escalates
                return assistant(None, [tool_call("h1", "transfer_to_oncall", {})])
            return "I can help with that myself."

        oncall = Agent(name="oncall", model=ScriptedModel(lambda m, t, r: "Paged.", seed=0),
                       hooks=Audit())
        return Agent(name="triage", model=ScriptedModel(triage, seed=0), hooks=Audit(),
                     handoffs=[handoff(oncall, on_handoff=page)])


def escalated(run: car.Trajectory) -> bool:
    return any(s.meta.get("agent") == "oncall" for s in run.steps)


def _recorded(desk: Desk) -> car.Trajectory:
    rec = CarRecorder()
    Runner.run_sync(desk.app(), "My card was stolen.", hooks=rec)
    run = rec.run
    assert escalated(run) and desk.paged == ["on-call"]
    return run


def test_an_app_with_a_handoff_callback_is_refused_until_told() -> None:
    desk = Desk()
    _recorded(desk)
    with pytest.raises(AdapterError, match=r"triage -> transfer_to_oncall \(.*page\)"):
        OpenAIAgentsAgent(desk.app())
    assert desk.paged == ["on-call"]


def test_skipped_callbacks_and_agent_hooks_never_run_on_branches() -> None:
    desk = Desk()
    run = _recorded(desk)
    paged, audit = list(desk.paged), list(desk.audit)
    res = car.intervene(run, OpenAIAgentsAgent(desk.app(), handoff_callbacks="skip"),
                        car.do_resample(0), outcome=escalated, rollouts=16, seed=0)
    assert 0 < res.mean < 1  # branches handed off, and answered themselves
    assert desk.paged == paged and desk.audit == audit


def test_live_callbacks_run_on_the_branches_that_hand_off() -> None:
    desk = Desk()
    run = _recorded(desk)
    paged = len(desk.paged)
    res = car.intervene(run, OpenAIAgentsAgent(desk.app(), handoff_callbacks="live"),
                        car.do_resample(0), outcome=escalated, rollouts=16, seed=0)
    assert len(desk.paged) - paged == round(res.mean * 16) > 0


def test_a_handoff_input_filter_of_the_users_is_a_caveat_of_every_result() -> None:
    """A branch hands ``Runner.run`` the history up to its step as input, so a filter of the
    user's sees the run's own items as input history: a user trial's filter that dropped them
    kept them on branches. The SDK's own filters treat both alike: no caveat."""
    from agents.extensions import handoff_filters

    def mine(data: Any) -> Any:
        return data.clone(pre_handoff_items=(), new_items=())

    oncall = Agent(name="oncall", model=ScriptedModel(lambda m, t, r: "Paged.", seed=0))
    for given, said in ((mine, True), (handoff_filters.remove_all_tools, False)):
        app = Agent(name="triage", model=ScriptedModel(lambda m, t, r: "ok", seed=0),
                    handoffs=[handoff(oncall, input_filter=given)])
        caveats = OpenAIAgentsAgent(app).caveats
        assert any("triage -> transfer_to_oncall" in c for c in caveats) is said


def test_a_model_input_rewritten_between_turns_is_refused_before_any_branch() -> None:
    """A ``RunConfig(call_model_input_filter=...)`` the factory leaves out: a user trial's
    branches handed the model 3 and 5 items where the run's model saw 2. The run's inputs show
    the rewrite (a turn's input does not continue the previous one's)."""
    from agents import RunConfig, function_tool
    from agents.run import ModelInputData

    @function_tool
    def lookup(user: str) -> str:
        """Look the user up (reads only)."""
        return "locked out"

    def decide(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
        if not any(m["role"] == "tool" for m in messages):
            return assistant(None, [tool_call("l1", "lookup", {"user": "u"})])
        return "Unlocked."

    def last_two(data: Any) -> Any:
        return ModelInputData(input=data.model_data.input[-2:],
                              instructions=data.model_data.instructions)

    agent = Agent(name="desk", model=ScriptedModel(decide, seed=0), tools=[lookup])
    rec = CarRecorder()
    Runner.run_sync(agent, "I can't log in", hooks=rec,
                    run_config=RunConfig(call_model_input_filter=last_two))
    with pytest.raises(AdapterError, match="input at step 1 does not continue step 0's"):
        car.intervene(rec.run, OpenAIAgentsAgent(agent, safe_tools=["lookup"]),
                      car.do_resample(0), outcome=lambda r: 1.0, rollouts=2, seed=0)
    Runner.run_sync(agent, "I can't log in", hooks=rec)  # without the filter: branched
    res = car.intervene(rec.run, OpenAIAgentsAgent(agent, safe_tools=["lookup"]),
                        car.do_resample(0), outcome=lambda r: 1.0, rollouts=2, seed=0)
    assert res.n == 2
