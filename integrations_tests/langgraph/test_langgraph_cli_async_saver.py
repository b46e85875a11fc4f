"""``car attribute`` on an app checkpointed by an ``AsyncSqliteSaver``: the agent factory the CLI
calls has no event loop to open the saver on (a user trial's factory raised "no running event
loop", its sync twin was refused as sync-only, and no page said what to do). With
``open_in_background`` the saver opens on CAR's own loop and the branches run there.

Planted truth (``car_adapters.demo.support_agent``): step 1 decides the refund (with p = 0.3
while the injection is in view) and step 2 only carries it out, so step 1 is the locus, with a
rescue of 0.7; no other step may be named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

APP = textwrap.dedent('''
    import asyncio
    import sys

    from car_adapters.demo import support_agent as sa
    from car_adapters.langgraph import CarCallback, LangGraphAgent, open_in_background
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    outcome = sa.outcome


    def build(saver):
        return sa.build_app(sa.PlantedSupportModel(rng_seed=0), saver)


    def make():  # what `car attribute --agent desk:make` calls: no event loop here
        saver = open_in_background(AsyncSqliteSaver.from_conn_string("checkpoints.db"))
        return LangGraphAgent(build(saver), safe_tools=sa.SAFE_TOOLS,
                              side_effect_tools=sa.SIDE_EFFECT_TOOLS)


    async def record():
        cb = CarCallback(store="car.db", outcome=outcome)
        async with AsyncSqliteSaver.from_conn_string("checkpoints.db") as saver:
            app = build(saver)
            for i in range(50):
                await app.ainvoke(sa.inputs(), {"configurable": {"thread_id": f"t{i}"},
                                                "callbacks": [cb]})
                if outcome(cb.run):
                    return cb.run.id
        sys.exit("no failing run in 50 tickets")


    if __name__ == "__main__":
        print(asyncio.run(record()))
''')


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT)]),
           "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_the_cli_attributes_an_app_on_an_async_saver_opened_in_background(tmp_path: Path
                                                                          ) -> None:
    (tmp_path / "desk.py").write_text(APP)
    recorded = _run("desk.py", cwd=tmp_path)
    assert recorded.returncode == 0, recorded.stderr
    run_id = recorded.stdout.strip()
    proc = _run("-m", "car_core.cli", "attribute", run_id, "--agent", "desk:make",
                "--outcome", "desk:outcome", "--rollouts", "16", "--json", cwd=tmp_path)
    assert proc.returncode in (0, 3), proc.stderr  # decided, or undecided in this budget
    result = json.loads(proc.stdout)
    assert result["rollouts_used"] > 0 and not result.get("failures")
    assert result.get("locus") in (None, 1)  # never a wrong step
