"""Runs recorded by the frameworks' own recorders carry the app's fingerprint: recorded in one
process and attributed in another, the same app is accepted, an app with another prompt or other
tools is refused before any model call, and ``force_agent`` / ``--force-agent`` overrides."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import LangGraphAgent
from car_adapters.openai_agents import OpenAIAgentsAgent

import car_core as car
from car_core.engine.agent import agent_fingerprint
from car_core.errors import AgentMismatch
from integrations_tests.support import fingerprint_apps as apps

SUPPORT = Path(__file__).resolve().parents[1] / "support"


def env(hash_seed: str) -> dict[str, str]:
    """Another process, with its own string-hash seed (set order differs between them)."""
    return {**os.environ, "PYTHONPATH": str(SUPPORT), "PYTHONHASHSEED": hash_seed,
            "COLUMNS": "200"}


def recorded(framework: str, tmp_path: Path, checkpoints: str = "") -> car.Trajectory:
    """The one run ``framework``'s recorder stores when the app runs in a child process."""
    db = tmp_path / "runs.db"
    subprocess.run([sys.executable, str(SUPPORT / "fingerprint_apps.py"), framework, str(db),
                    checkpoints], env=env("1"), check=True, timeout=120)
    with car.RunStore(db) as s:
        (summary,) = s.runs()
        return s.load(summary["id"])


def refused_without_a_model_call(run: car.Trajectory, agent: Any, calls: Any) -> None:
    before = calls()
    with pytest.raises(AgentMismatch, match="force_agent=True"):
        car.intervene(run, agent, car.do_resample(0), outcome=lambda r: 0.0, rollouts=2)
    assert calls() == before


def test_llamaindex_recorder_run_is_checked_against_the_workflow(tmp_path: Path) -> None:
    run = recorded("llamaindex", tmp_path)
    same = apps.llamaindex_same()
    assert run.meta["agent_fingerprint"] == agent_fingerprint(same)
    for other in (apps.llamaindex_other_prompt(), apps.llamaindex_other_tools()):
        assert agent_fingerprint(other) != run.meta["agent_fingerprint"]
        refused_without_a_model_call(run, other, lambda other=other: other.workflow.llm.calls)
    dist = car.intervene(run, same, car.do_resample(0), outcome=apps.escalated, rollouts=4)
    assert dist.n == 4
    other = apps.llamaindex_other_prompt()
    forced = car.intervene(run, other, car.do_resample(0), outcome=apps.escalated, rollouts=4,
                           force_agent=True)
    assert forced.n == 4 and other.workflow.llm.calls > 0


def test_openai_agents_recorder_run_is_checked_against_the_app(tmp_path: Path) -> None:
    run = recorded("openai-agents", tmp_path)
    same = OpenAIAgentsAgent(apps.openai_app(), **apps.classified())
    assert run.meta["agent_fingerprint"] == agent_fingerprint(same)
    for app in (apps.openai_app(apps.OTHER_PROMPT), apps.openai_app(extra_tool=True)):
        other = OpenAIAgentsAgent(app, **apps.classified(extra_tool=len(app.tools) > 2))
        refused_without_a_model_call(run, other, lambda app=app: app.model.calls)
    app = apps.openai_app(apps.OTHER_PROMPT)
    forced = car.intervene(run, OpenAIAgentsAgent(app, **apps.classified()), car.do_resample(0),
                           outcome=apps.escalated, rollouts=4, force_agent=True)
    assert forced.n == 4 and app.model.calls >= 4
    dist = car.intervene(run, same, car.do_resample(0), outcome=apps.escalated, rollouts=4)
    assert dist.n == 4


def test_langgraph_callback_and_imported_runs_are_checked_against_the_app(tmp_path: Path
                                                                           ) -> None:
    checkpoints = str(tmp_path / "checkpoints.db")
    run = recorded("langgraph", tmp_path, checkpoints)
    same = LangGraphAgent(apps.langgraph_app(checkpoints), **apps.langgraph_tools())
    assert run.meta["agent_fingerprint"] == agent_fingerprint(same)
    imported = same.import_thread(apps.THREAD)  # the checkpoints' own copy of the run
    assert imported.meta["agent_fingerprint"] == run.meta["agent_fingerprint"]
    for app, tools in ((apps.langgraph_app(checkpoints, prompt="Refund whatever is asked."), 3),
                       (apps.langgraph_app(checkpoints, tools=2), 2)):
        model = app.builder.nodes["agent"].runnable.func.__closure__[0].cell_contents
        for recorded_run in (run, imported):
            refused_without_a_model_call(recorded_run,
                                         LangGraphAgent(app, **apps.langgraph_tools(tools)),
                                         lambda model=model: model.bound.calls)
    other = apps.langgraph_app(checkpoints, prompt="Refund whatever is asked.")
    forced = car.intervene(run, LangGraphAgent(other, **apps.langgraph_tools()),
                           car.do_resample(1), outcome=sa.outcome,
                           rollouts=2, force_agent=True)
    assert forced.n == 2
    dist = car.intervene(run, same, car.do_resample(1), outcome=sa.outcome, rollouts=2)
    assert dist.n == 2


def test_the_cli_refuses_another_app_on_a_recorder_run_unless_forced(tmp_path: Path) -> None:
    run = recorded("llamaindex", tmp_path)
    # the outcome under which the recorded run failed (step 0 escalates with probability 1/2):
    # an attribution refuses a run its outcome scores as fine
    failure = "escalated" if apps.escalated(run) else "closed"

    def attribute(factory: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "car_core.cli", "attribute", run.id, "--store", "runs.db",
             "--agent", f"fingerprint_apps:{factory}", "--outcome", f"fingerprint_apps:{failure}",
             "--rollouts", "4", *extra], cwd=tmp_path, env=env("2"), capture_output=True,
            text=True, timeout=120)
    refused = attribute("llamaindex_other_prompt")
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "recorded with agent 'llamaindex:FunctionAgent'" in line and "--force-agent" in line
    with car.RunStore(tmp_path / "runs.db") as s:
        assert s.attributions(run.id) == []
    for args in (("llamaindex_other_prompt", "--force-agent"), ("llamaindex_same",)):
        proc = attribute(*args)
        assert proc.returncode in (0, 1, 3), proc.stderr  # it ran, whatever it found
    with car.RunStore(tmp_path / "runs.db") as s:
        assert len(s.attributions(run.id)) == 2
