"""Every view of a branch says where its steps and tool results came from: ``car show`` (text
and JSON) and the report (the rescued branch beside the record, and a branch's own timeline)
mark a held step as copied from the record, a decided one as re-decided, and a tool result as
ran live, from the record or simulated, so a simulated order never reads as one placed.

The branch is planted by hand: step 0 (a lookup) held; step 1 re-decided, ordering a laptop
the simulator answered while a safe price check ran live; step 2 re-decided, reordering what
the record already holds (served from the record).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from _report_data import hostile_contrastive

from car_core import formatting as fmt
from car_core.model.trajectory import Lineage, Outcome, Step, Trajectory
from car_core.model.vocabulary import Origin, ToolSource
from car_core.report import render_attribution, render_run
from car_core.store import RunStore

ROOT = Path(__file__).resolve().parents[1]


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


def _step(k: int, calls: list[dict[str, Any]], results: list[str], meta: dict[str, Any]
          ) -> Step:
    action = {"role": "assistant", "content": None, "tool_calls": calls}
    obs = [{"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
            "content": r} for c, r in zip(calls, results, strict=True)]
    return Step(k, action, obs, True, None, meta)


def planted() -> tuple[Trajectory, Trajectory]:
    """(factual run, branch of it) as described in the module docstring."""
    lookup = _step(0, [_call("c0", "lookup_user", {"user": "ana"})], ['{"team": "design"}'],
                   {"origin": Origin.LIVE})  # as car.record writes a run's own steps
    order = _step(1, [_call("c1", "order_laptop", {"model": "pro-16"})],
                  ['{"ordered": "pro-16", "cost": 2400}'], {"origin": Origin.LIVE})
    run = Trajectory.new(context="Get Ana a laptop", steps=[lookup, order], seed=0,
                         agent="desk", outcome=Outcome(1.0))
    held = Step(0, lookup.action, lookup.observation, True, None, {"origin": Origin.HELD})
    cheaper = _step(1, [_call("c1", "order_laptop", {"model": "standard-14"}),
                        _call("c2", "check_price", {"model": "standard-14"})],
                    ['{"ordered": "standard-14", "cost": 1100}', '{"price": 1100}'],
                    {"origin": Origin.LIVE,
                     "tool_sources": {"c1": ToolSource.SIMULATOR, "c2": ToolSource.LIVE}})
    again = _step(2, [_call("c3", "order_laptop", {"model": "pro-16"})],
                  ['{"ordered": "pro-16", "cost": 2400}'],
                  {"origin": Origin.LIVE, "tool_sources": {"c3": ToolSource.RECORD}})
    branch = Trajectory.new(context=run.context, steps=[held, cheaper, again], seed=1,
                            agent="desk", outcome=Outcome(0.0),
                            lineage=Lineage(parent_id=run.id, branch_step=1))
    return run, branch


def car(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_marks_leave_held_steps_to_their_origin_and_name_every_answered_call() -> None:
    run, branch = planted()
    held, cheaper, again = branch.steps
    assert fmt.tool_marks(held.action, {**held.meta, "tool_sources": {"c0": "simulator"}}) == []
    assert fmt.tool_marks_text(cheaper.action, cheaper.meta) == (
        "order_laptop: simulated, the tool did not run; check_price: ran live")
    assert fmt.tool_marks_text(again.action, again.meta) == (
        "order_laptop: from the record, the tool did not run")
    assert fmt.tool_marks_text(run.steps[1].action, run.steps[1].meta) is None
    assert fmt.origins_legend(s.meta["origin"] for s in branch.steps) == (
        "held = copied from the record; live = re-decided")
    assert fmt.origins_legend([Origin.RECORD]) is None
    # a source a later version writes is shown by its name, not dropped
    assert fmt.tool_marks(again.action, {"tool_sources": {"c3": "cache"}}) == [
        ("order_laptop", "cache", "cache")]


def test_car_show_marks_the_branch_in_text_and_keeps_the_sources_in_json(tmp_path: Path
                                                                       ) -> None:
    run, branch = planted()
    with RunStore(tmp_path / "car.db") as db:
        db.save(run)
        db.save(branch)
    text = car("show", branch.id, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert "origin: held = copied from the record; live = re-decided" in lines
    marks = [line.strip() for line in lines if "tool results:" in line]
    assert marks == ["tool results: order_laptop: simulated, the tool did not run; "
                     "check_price: ran live",
                     "tool results: order_laptop: from the record, the tool did not run"]
    factual = car("show", run.id, cwd=tmp_path).stdout  # its steps were not re-decided
    assert "tool results:" not in factual and "origin:" not in factual

    data = json.loads(car("show", branch.id, "--json", cwd=tmp_path).stdout)
    assert [s["meta"].get("tool_sources") for s in data["steps"]] == [
        None, {"c1": "simulator", "c2": "live"}, {"c3": "record"}]
    assert Trajectory.from_dict(data).digest == branch.digest  # sealed with the marks


def test_report_marks_the_rescued_branch_and_a_branch_timeline() -> None:
    run, branch = planted()
    html = render_attribution(hostile_contrastive(run, branch), run=run)
    diff = html[html.index('id="diff"'):html.index('id="timeline"')]
    assert "step 0 action (held: copied from the record):" in diff
    assert "step 1 action (live: re-decided):" in diff
    assert ("step 1 observation (order_laptop: simulated, the tool did not run; check_price: "
            "ran live):") in diff
    assert "step 2 observation (order_laptop: from the record, the tool did not run):" in diff
    left = re.findall(r'<td class="l">([^<]*)</td>', diff)  # the record's side: no marks
    assert left and not [cell for cell in left if "did not run" in cell or "(held" in cell]

    page = render_run(branch)
    assert '<span class="tag origin">held: copied from the record</span>' in page
    assert page.count('<span class="tag origin">live: re-decided</span>') == 2
    assert ('<span class="tag source not-run">order_laptop: simulated, the tool did not '
            'run</span>') in page
    assert '<span class="tag source ran">check_price: ran live</span>' in page
    assert ('<span class="tag source not-run">order_laptop: from the record, the tool did '
            'not run</span>') in page


def test_car_show_says_what_a_branch_did_not_its_arm_key_and_index(tmp_path: Path) -> None:
    """A trial's `car show BRANCH` read "arm hold<2  rollout 2097152": the arm's key and the
    search's rollout index are internal. The header says what the branch did, from its
    interventions against the stored parent; --json keeps both."""
    run, branch = planted()
    branch = dataclasses.replace(branch, lineage=Lineage(
        parent_id=run.id, interventions=({"kind": "resample", "step": 1},), branch_step=1,
        arm="hold<1", rollout=2097152))
    with RunStore(tmp_path / "car.db") as db:
        db.save(run)
        db.save(branch)
    text = car("show", branch.id, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert f"branch of {run.id}: re-deciding from step 1 on" in text.stdout.splitlines()
    assert "hold<" not in text.stdout and "2097152" not in text.stdout
    data = json.loads(car("show", branch.id, "--json", cwd=tmp_path).stdout)
    assert (data["lineage"]["arm"], data["lineage"]["rollout"]) == ("hold<1", 2097152)
