"""A run the app stopped by design says so wherever a person reads it.

An adapter stores a run a guardrail stopped as ``complete`` (a designed stop is an outcome to
score, not a crash) with ``error`` saying why and ``meta["tripwire"]`` naming the guardrail.
A user trial read such runs in ``car runs`` as ``complete`` and in ``car show`` and the report
with their last reply ("Refunded 300 EUR …") as if delivered, though the user never got it;
an input guardrail's stop showed only ``context: —``. Each view now says how the run ended:
``car show`` (text, also ``--full``), ``car runs`` (the status cell; ``--json`` keeps the stored
status and adds the stop), and the report (a run's page and the store's index).

The runs are planted by hand in the shape the OpenAI Agents SDK adapter stores them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from car_core.cli import main
from car_core.model.trajectory import Outcome, Step, Trajectory
from car_core.model.vocabulary import RunStatus
from car_core.report import render_run
from car_core.report.pages import write_index
from car_core.store import RunStore

REPLY = '{"message": "Refunded 300 EUR on INV-1.", "refunded_total": 300}'
OUTPUT_STOP = ("stopped by output guardrail no_big_refund_promise after step 2: "
               "the reply was not delivered")
INPUT_STOP = "stopped by input guardrail no_chargeback_threats before any step"
BLOCKED = "Refund INV-1 now or I file a chargeback."


def _call(k: int, name: str) -> Step:
    action = {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{k}", "type": "function", "function": {"name": name, "arguments": "{}"}}]}
    obs = [{"role": "tool", "tool_call_id": f"c{k}", "name": name, "content": "ok"}]
    return Step(k, action, obs, True, None, {"agent": "billing"})


def planted() -> dict[str, Trajectory]:
    """A run an output guardrail stopped after its reply, one an input guardrail stopped
    before any step (its blocked input kept as the context), one stopped with only an error
    to say how, one that raised, and one that finished."""
    reply = Step(2, {"role": "assistant", "content": REPLY}, None, False, None,
                 {"agent": "billing"})
    steps = [_call(0, "refund"), _call(1, "send_email"), reply]
    return {
        "output": Trajectory.new(
            context="Please refund invoice INV-1.", steps=steps, agent="openai-agents:triage",
            outcome=Outcome(1.0),
            error="OutputGuardrailTripwireTriggered('Guardrail no_big_refund_promise "
                  "triggered tripwire')",
            meta={"tripwire": {"kind": "output", "guardrail": "no_big_refund_promise"}}),
        "input": Trajectory.new(
            context=BLOCKED, steps=[], agent="openai-agents:triage", outcome=Outcome(0.0),
            error="the input guardrail 'no_chargeback_threats' stopped the run (its tripwire "
                  "was caught in the block)",
            meta={"tripwire": {"kind": "input", "guardrail": "no_chargeback_threats"}}),
        "bare": Trajectory.new(context="hi", steps=steps[:2], agent="other",
                               error="the app stopped the run"),
        "raised": Trajectory.new(context="hi", steps=steps[:1], agent="other",
                                 status=RunStatus.ERROR, error="RuntimeError('boom')"),
        "finished": Trajectory.new(context="hi", steps=steps, agent="other",
                                   outcome=Outcome(0.0)),
    }


@pytest.fixture
def stored(tmp_path: Path) -> tuple[str, dict[str, Trajectory]]:
    runs = planted()
    db = str(tmp_path / "runs.db")
    with RunStore(db) as s:
        for run in runs.values():
            s.save(run)
    return db, runs


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("full", [(), ("--full",)])
def test_car_show_says_which_guardrail_stopped_the_run_and_that_the_reply_never_went_out(
        stored, capsys, full) -> None:
    db, runs = stored
    out = flat(cli(capsys, "show", runs["output"].id, "--store", db, *full))
    assert OUTPUT_STOP in out
    assert "Refunded 300 EUR" in out  # the reply it stopped is still shown, as a step


def test_car_show_of_an_input_guardrail_stop_shows_the_blocked_input(stored, capsys) -> None:
    db, runs = stored
    out = flat(cli(capsys, "show", runs["input"].id, "--store", db))
    assert INPUT_STOP in out and f"context: {BLOCKED}" in out


def test_car_show_says_how_a_run_with_only_an_error_ended(stored, capsys) -> None:
    db, runs = stored
    bare = flat(cli(capsys, "show", runs["bare"].id, "--store", db))
    assert "stopped after step 1: the app stopped the run" in bare
    raised = flat(cli(capsys, "show", runs["raised"].id, "--store", db))
    assert "ended with an error after step 0: RuntimeError('boom')" in raised
    finished = cli(capsys, "show", runs["finished"].id, "--store", db)
    assert not re.search(r"stopped|ended with", finished), finished


def test_car_runs_does_not_list_a_stopped_run_as_complete(stored, capsys) -> None:
    db, runs = stored
    out = cli(capsys, "runs", "--store", db)
    status = {rid: line for line in out.splitlines() for rid in [
        r.id for r in runs.values()] if rid in line}
    for name in ("output", "input", "bare"):
        assert "stopped" in status[runs[name].id] and "complete" not in status[runs[name].id]
    assert "complete" in status[runs["finished"].id]
    assert "stopped" not in status[runs["finished"].id]
    rows = {r["id"]: r for r in json.loads(cli(capsys, "runs", "--store", db, "--json"))}
    output = rows[runs["output"].id]  # the stored status, and what stopped it beside it
    assert output["status"] == "complete"
    assert output["stopped_by"] == "output guardrail no_big_refund_promise"
    assert rows[runs["bare"].id]["stopped_by"] is None
    assert rows[runs["bare"].id]["error"] == "the app stopped the run"
    assert rows[runs["finished"].id]["stopped_by"] is None
    assert rows[runs["finished"].id]["error"] is None


def test_the_report_says_how_the_run_ended(stored, tmp_path) -> None:
    db, runs = stored
    assert OUTPUT_STOP in flat(render_run(runs["output"]))
    page = flat(render_run(runs["input"]))
    assert INPUT_STOP in page and BLOCKED in page  # no step: the blocked input still shown
    assert not re.search(r"stopped|ended with", render_run(runs["finished"]))
    with RunStore(db) as s:
        written = write_index(s, tmp_path / "site", db)
    index = flat(written.index.read_text(encoding="utf-8"))
    row = re.search(rf"{runs['output'].id}.*?</tr>", index)
    assert row is not None and "stopped" in row.group(0), index
    for name in ("output", "input"):
        html = flat((written.index.parent / "runs").joinpath(
            next(p.name for p in (written.index.parent / "runs").iterdir()
                 if runs[name].id in p.name)).read_text(encoding="utf-8"))
        assert (OUTPUT_STOP if name == "output" else INPUT_STOP) in html
