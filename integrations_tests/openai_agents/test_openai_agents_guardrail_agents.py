"""Guardrails that run an agent (the SDK's judge example: ``Runner.run(judge, input)`` inside
the guardrail function): a branch runs the guardrail again (input guardrails from step 0,
output guardrails on every branch) with nothing to answer it from, so the judge's tools run
there too, unguarded. A user trial's judge filed 76 real audit alerts from one attribution.
The agents a guardrail names are found before any branch; their tools are classified like
the app's, and a guardrail whose agent can reach a side effect is refused by name."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    InputGuardrail,
    OutputGuardrail,
    Runner,
    function_tool,
)
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel
from car_adapters.openai_agents.guardrails import named_agents

import car_core as car
from car_core.errors import AdapterError, UnclassifiedTools


class Desk:
    """A support agent behind a guardrail whose judge agent may file an audit alert (a side
    effect: ``alerts``) or read a blocklist (``read``). ``judged`` counts the judge's calls."""

    def __init__(self, judge_tool: str | None = "audit_alert", kind: str = "input") -> None:
        self.alerts: list[str] = []
        self.read: list[str] = []
        self.judged = 0
        self.judge_tool, self.kind = judge_tool, kind

    def app(self) -> Agent[Any]:
        @function_tool
        def audit_alert(note: str) -> str:
            """File an audit alert with the fraud team (a side effect)."""
            self.alerts.append(note)
            return "filed"

        @function_tool
        def check_blocklist(user: str) -> str:
            """Read the blocklist (reads only)."""
            self.read.append(user)
            return "not listed"

        def judging(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
            self.judged += 1
            if self.judge_tool and not any(m["role"] == "tool" for m in messages):
                return assistant(None, [tool_call("j1", self.judge_tool, {"note": "seen"}
                                                  if self.judge_tool == "audit_alert"
                                                  else {"user": "u"})])
            return "fine"

        tools = {"audit_alert": [audit_alert], "check_blocklist": [check_blocklist],
                 None: []}[self.judge_tool]
        judge = Agent(name="judge", model=ScriptedModel(judging), tools=tools)

        async def screen(ctx: Any, agent: Any, data: Any) -> GuardrailFunctionOutput:
            verdict = await Runner.run(judge, "screen this", context=ctx.context)
            return GuardrailFunctionOutput(output_info=verdict.final_output,
                                           tripwire_triggered=False)

        def support(messages: list[dict[str, Any]], tools: Any, rng: Any) -> Any:
            return "refund sent" if rng.random() < 0.5 else "no refund"

        guard = ({"input_guardrails": [InputGuardrail(guardrail_function=screen)]}
                 if self.kind == "input"
                 else {"output_guardrails": [OutputGuardrail(guardrail_function=screen)]})
        return Agent(name="support", model=ScriptedModel(support), **guard)


def failed(run: car.Trajectory) -> bool:
    return True  # every run fails: these tests count what branches do


def _recorded(desk: Desk, tmp_path: Path) -> car.Trajectory:
    rec = CarRecorder(store=tmp_path / "runs.db", outcome=failed)
    app = desk.app()
    with rec.recording(app):
        Runner.run_sync(app, "refund me", hooks=rec)
    return rec.run


@pytest.mark.parametrize("kind", ["input", "output"])
def test_a_guardrail_whose_judge_files_alerts_is_refused_before_any_branch(
        tmp_path: Path, kind: str) -> None:
    desk = Desk(kind=kind)
    run = _recorded(desk, tmp_path)
    recorded = list(desk.alerts)
    with pytest.raises(AdapterError, match=rf"{kind} guardrail 'screen' runs agent\(s\) "
                                           r"\['judge'\] on branches.*\['audit_alert'\]"
                       ) as info:
        agent = OpenAIAgentsAgent(desk.app(), side_effect_tools=["audit_alert"])
        car.contrastive(run, agent, outcome=failed, rollouts=4, seed=0)
    assert desk.alerts == recorded  # the recording's only
    assert "so take the side effect out of its agent" in str(info.value)


def test_the_tools_of_a_guardrails_judge_must_be_classified(tmp_path: Path) -> None:
    desk = Desk()
    run = _recorded(desk, tmp_path)
    recorded = list(desk.alerts)
    with pytest.raises(UnclassifiedTools) as got:
        car.contrastive(run, OpenAIAgentsAgent(desk.app()), outcome=failed, rollouts=4, seed=0)
    assert got.value.tools == ("audit_alert",)
    assert desk.alerts == recorded


@pytest.mark.parametrize("judge_tool", [None, "check_blocklist"])
def test_a_judge_that_only_reads_runs_on_branches_from_step_0(tmp_path: Path,
                                                              judge_tool: str | None) -> None:
    desk = Desk(judge_tool=judge_tool)
    run = _recorded(desk, tmp_path)
    judged = desk.judged
    safe = [judge_tool] if judge_tool else []
    res = car.intervene(run, OpenAIAgentsAgent(desk.app(), safe_tools=safe),
                        car.do_resample(0), outcome=failed, rollouts=3, seed=0)
    assert res.rollouts_used == 3
    assert desk.judged > judged  # the guardrail ran its judge again, as the app would


judge = Agent(name="module_judge")


def _helper() -> Any:
    return judge


class _Screen:
    def __init__(self, agent: Agent[Any]) -> None:
        self.agent = agent

    def __call__(self, ctx: Any, agent: Any, data: Any) -> Any:
        return None

    def method(self, ctx: Any, agent: Any, data: Any) -> Any:
        return None


def test_named_agents_finds_the_agents_a_guardrail_function_names() -> None:
    local = Agent(name="local_judge")

    def by_global(ctx: Any, agent: Any, data: Any) -> Any:
        return Runner.run(judge, data)

    def by_closure(ctx: Any, agent: Any, data: Any) -> Any:
        return Runner.run(local, data)

    def by_default(ctx: Any, agent: Any, data: Any, j: Agent[Any] = local) -> Any:
        return j

    def by_helper(ctx: Any, agent: Any, data: Any) -> Any:
        return _helper()

    def by_lambda(ctx: Any, agent: Any, data: Any) -> Any:
        return (lambda: judge)()

    def nothing(ctx: Any, agent: Any, data: Any) -> Any:
        return len(data)

    assert named_agents(by_global) == [judge]
    assert named_agents(by_closure) == [local]
    assert named_agents(by_default) == [local]
    assert named_agents(by_helper) == [judge]
    assert named_agents(by_lambda) == [judge]
    assert named_agents(functools.wraps(by_closure)(lambda *a: None)) == [local]  # unwrapped
    assert named_agents(_Screen(local)) == [local]
    assert named_agents(_Screen(local).method) == [local]
    assert named_agents(nothing) == []
