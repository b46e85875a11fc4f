"""LlamaIndex runs in the ``car`` command: the recorder's outcome reaches ``car runs`` (which
then shows which runs failed), and ``car show`` lays their steps out in aligned columns."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from car_adapters.common.messages import assistant, tool_call
from car_adapters.llamaindex import CarRecorder, ScriptedLLM
from llama_index.core.agent.workflow import FunctionAgent

import car_core as car


def car_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(Path(__file__).parents[2])}
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def escalated(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "escalate" for s in run.steps
               for c in (s.action or {}).get("tool_calls") or ())


def make_agent(escalate_it: bool) -> FunctionAgent:
    def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
        k = sum(1 for m in messages if m["role"] == "assistant")
        if k == 0:
            name = "escalate" if escalate_it else "close_ticket"
            return assistant(None, [tool_call("c0", name, {})])
        return "done"

    def escalate() -> str:
        """Escalate the ticket."""
        return "escalated"

    def close_ticket() -> str:
        """Close the ticket."""
        return "closed"

    return FunctionAgent(tools=[escalate, close_ticket], llm=ScriptedLLM(decide))


def test_recorder_outcome_is_stored_and_car_show_aligns_columns(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    rec = CarRecorder(store=db, outcome=escalated).attach()
    try:
        for escalate_it in (True, False):
            agent = make_agent(escalate_it)

            async def main(agent: FunctionAgent = agent) -> None:
                await agent.run(user_msg="Handle ticket 7.")
            asyncio.run(main())
    finally:
        rec.detach()
    failed, passed = rec.runs
    assert failed.outcome is not None and failed.outcome.value == 1.0
    assert passed.outcome is not None and passed.outcome.value == 0.0
    assert not rec.store_errors and not rec.outcome_errors

    listed = car_cli("runs", "--store", str(db), "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    outcomes = {r["id"]: r["outcome"] for r in json.loads(listed.stdout)}
    assert outcomes == {failed.id: 1.0, passed.id: 0.0}
    table = car_cli("runs", "--store", str(db), cwd=tmp_path)
    assert "1.00" in table.stdout and "0.00" in table.stdout  # the outcome column

    shown = car_cli("show", failed.id, "--store", str(db), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    action = [ln for ln in lines if "action: " in ln]
    observation = [ln for ln in lines if "observation: " in ln]
    assert len(action) == 2 and len(observation) == 1
    columns = {ln.index("action: ") + len("action: ") for ln in action}
    columns |= {ln.index("observation: ") + len("observation: ") for ln in observation}
    assert len(columns) == 1  # every value starts in the same column


def test_an_outcome_that_raises_leaves_the_run_unscored_not_broken(tmp_path: Path) -> None:
    def broken(run: car.Trajectory) -> float:
        raise RuntimeError("judge down")

    rec = CarRecorder(store=tmp_path / "runs.db", outcome=broken).attach()
    try:
        agent = make_agent(True)

        async def main() -> None:
            await agent.run(user_msg="Handle ticket 7.")
        asyncio.run(main())
    finally:
        rec.detach()
    assert rec.run.outcome is None and "judge down" in str(rec.outcome_errors[0])
    assert rec.store is not None and rec.store.load(rec.run.id).outcome is None
