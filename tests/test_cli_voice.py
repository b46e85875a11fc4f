"""One voice: the plain-text result, the ``car`` table and verdict, and the pytest plugin's
headline say an attribution with the same words and numbers (``car_core.formatting``); the
command's version, sort order, help, progress total and ``show`` columns."""

from __future__ import annotations

import importlib.metadata
import io
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import pytest
import typer.main
from rich.console import Console

import car_core as car
from car_core import formatting as fmt
from car_core.cli import app, kit, main
from car_core.model.trajectory import Step, Trajectory
from car_core.model.vocabulary import Answer
from car_core.results import ContrastiveResult
from car_core.store import RunStore

PROB = r"\d\.\d{3}"
EFFECT = r"[+-]\d\.\d{3}"


@pytest.fixture(scope="module")
def refit() -> ContrastiveResult:
    """A locus whose rescue was re-estimated with fresh pairs after the test decided (the
    search's default), so the test's pairs and the shown sample differ."""
    from car_core.testing import synthetic as syn
    model = syn.pivot()
    res = car.contrastive(model.failing_run(0), model.agent(), outcome=model.outcome,
                          rollouts=32, seed=0)
    assert res.answer == Answer.LOCUS and res.steps[res.locus].estimate == "refit"
    return res


def render(table: Any) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


# -- the numbers -----------------------------------------------------------------------------
def test_levels_are_percentages_and_numbers_have_one_format() -> None:
    assert fmt.level(0.95) == "95%" and fmt.level(1 - 0.05 / 8) == "99.4%"
    assert fmt.prob(0.3125) == "0.312" and fmt.effect(0.6875) == "+0.688"
    assert fmt.effect(-0.016) == "-0.016" and fmt.effect(None) == fmt.MISSING
    assert fmt.effect_interval((0.2, 0.6)) == "[+0.200, +0.600]"
    assert fmt.failure_rate(0.25, (0.1, 0.5), 0.95, 16) == (
        "P(fail) 0.250 [0.100, 0.500] at 95%, n=16")


def test_the_rescue_shown_is_held_minus_redrawn_of_its_own_sample(refit) -> None:
    s = refit.steps[refit.locus]
    held, redrawn, n = fmt.shown_sample(s)
    # the interval's sample: the re-estimate's pairs, not the test's alone
    assert n == s.refit_n and n != s.n
    assert held is not None and redrawn is not None
    assert s.effect == pytest.approx(held - redrawn, abs=1e-12)
    assert s.ci[0] <= s.effect <= s.ci[1]
    row = fmt.step_row(refit, s)
    assert float(row.rescue) == pytest.approx(float(row.held) - float(row.redrawn), abs=1e-3)
    assert row.n == str(s.refit_n) and row.mark == fmt.LOCUS_MARK
    # the pairs the test decided on are named in one line, with their own n
    note = fmt.sample_note(refit)
    assert note is not None and f"decided on {s.n} pair(s)" in note
    fresh = s.refit_n - s.refit_pooled
    assert s.refit_pooled == s.n - 1 and fresh >= 1  # the test's pairs less the one it stopped on
    assert f"{fresh} fresh pair(s) drawn after it and {s.refit_pooled} of the test's" in note


def test_a_stored_result_keeps_the_shown_sample(refit) -> None:
    again = ContrastiveResult.from_dict(refit.to_dict())
    assert fmt.shown_sample(again.steps[again.locus]) == fmt.shown_sample(
        refit.steps[refit.locus])


# -- every surface says the same -----------------------------------------------------------------
def test_text_table_and_plugin_say_the_same_row_and_headline(refit) -> None:
    from car_adapters.pytest_plugin.recording import Attribution

    from car_core.testing import synthetic as syn
    run = syn.pivot().failing_run(0)
    shown = fmt.step_row(refit, refit.steps[refit.locus])
    row = shown.cells()
    plain = fmt.plain_cells(refit, shown)
    text, table = str(refit), render(kit.attribution_table(refit))
    # the default views: what the step did and its rescue, no sample size
    for surface in (text, table):
        # the step, its action (the table cuts it short), then the numbers and the mark
        found = re.search(re.escape(plain[0]) + r"[\s│]+" + re.escape(plain[1][:20]) + r".*?"
                          + r"[\s│]+".join(re.escape(c) for c in plain[2:]), surface)
        assert found, surface
        for column in fmt.PLAIN_COLUMNS[:-1]:
            assert column in surface
    # explain(): the full row, with the sample its interval is about
    assert re.search(r"[\s│]+".join(re.escape(c) for c in row), refit.explain())
    headline = fmt.headline(refit)
    assert headline in refit.explain()
    assert kit.verdict(refit) == fmt.answer(refit) == text.splitlines()[0]
    plugin = Attribution(refit, run, None, "test_x.py::test_y").headline()
    assert plugin == fmt.answer(refit, run.agent)
    assert plugin.startswith(f"Step {refit.locus} ({run.agent} chose ")
    for surface in (refit.explain(), refit.explain(run.agent)):
        assert "0.9500" not in surface and "level 0." not in surface
        assert "at 95%" in surface or "family-wise 95%" in surface


def test_the_method_is_named_as_computed(refit) -> None:
    assert not refit.coupled  # the pairs did not show shared noise: the rates were compared
    assert fmt.method(refit) == ("unpaired betting test with an exact sign test at the end, "
                                 "alpha spent over 1 confirmation(s), family-wise 95%")
    coupled = ContrastiveResult.from_dict({**refit.to_dict(), "coupled": True})
    assert fmt.method(coupled).startswith("paired betting test")
    full = ContrastiveResult.from_dict({**refit.to_dict(), "correction": "bonferroni",
                                        "tests": 6, "level": 1 - 0.05 / 6})
    assert fmt.method(full) == ("Bonferroni over 6 test(s), each interval at 99.2%, "
                                "family-wise 95%")


# -- the command -------------------------------------------------------------------------------
def test_version_is_the_installed_package_version(capsys) -> None:
    code, out = run_cli(capsys, "--version")
    assert code == 0
    assert out.strip() == (f"car (causal-agent-replay) "
                           f"{importlib.metadata.version('causal-agent-replay')}")


def test_every_option_and_argument_of_every_command_has_help() -> None:
    root = typer.main.get_command(app)
    seen = []

    def walk(cmd: click.Command, path: str) -> None:
        for p in cmd.params:
            seen.append(f"{path} {p.name}")
            assert (getattr(p, "help", None) or "").strip(), f"{path} {p.name} has no help"
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(root, "car")
    assert "car version" in seen and "car runs limit" in seen  # the walk reached both levels


def _runs_store(path: Path) -> list[str]:
    ids = []
    with RunStore(path) as s:
        for i in range(3):  # distinct creation times, oldest first
            run = replace(Trajectory.new(context={"i": i}, steps=[]), created_at=1000.0 + i)
            s.save(run)
            ids.append(run.id)
    return ids


def test_runs_are_newest_first_and_reverse_turns_them(tmp_path, capsys) -> None:
    oldest_first = _runs_store(tmp_path / "car.db")
    db = str(tmp_path / "car.db")

    def listed(*flags: str) -> list[str]:
        code, out = run_cli(capsys, "runs", "--store", db, *flags)
        assert code == 0, out
        shown = [i for i in oldest_first if i in out]
        return sorted(shown, key=out.index)

    assert listed() == oldest_first[::-1]
    assert listed("--reverse") == oldest_first
    assert listed("--limit", "2") == oldest_first[:0:-1]  # the two newest


def test_attributions_are_newest_first_and_reverse_turns_them(tmp_path, capsys,
                                                             pivot_model, pivot_run) -> None:
    db = tmp_path / "car.db"
    with RunStore(db) as s:
        made = [car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                                budget=10, store=s, attribution_id=f"zz{i}x").attribution_id
                for i in range(3)]
    # ids no hex run id or path in the listing can contain
    for flags, want in (((), made[::-1]), (("--reverse",), made)):
        code, out = run_cli(capsys, "attributions", "--store", str(db), *flags)
        assert sorted(made, key=out.index) == want


def test_show_has_agent_and_node_columns_when_steps_have_them(tmp_path, capsys) -> None:
    steps = [Step(index=i, action={"n": i}, observation=None, observed=False, state=None,
                  meta=meta) for i, meta in enumerate([
                      {"agent": "supervisor", "node": "supervisor"},
                      {"agent": "account_agent", "node": "agent"}])]
    multi = Trajectory.new(context={}, steps=steps)
    plain = Trajectory.new(context={}, steps=[Step(index=0, action={"n": 0}, observation=None,
                                                   observed=False, state=None, meta={})])
    db = str(tmp_path / "car.db")
    with RunStore(db) as s:
        s.save(multi)
        s.save(plain)
    code, out = run_cli(capsys, "show", multi.id, "--store", db)
    assert code == 0
    lines = out.splitlines()
    assert ["agent", "node"] in [line.split() for line in lines]  # the columns' header
    assert re.search(r"\[1\] account_agent\s+agent\s+action:", out), out
    assert re.search(r"\[0\] supervisor\s+supervisor\s+action:", out), out
    code, out = run_cli(capsys, "show", plain.id, "--store", db)
    assert code == 0 and "node" not in out and re.search(r"\[0\]\s+action:", out), out


# -- an honest progress total ------------------------------------------------------------------
class _Bar:
    """Records what an estimate does with the one bar it is given (a tqdm-like object)."""

    made: list[_Bar] = []

    def __init__(self, total: int | None, desc: str, **_: Any) -> None:
        self.total, self.n, self.desc, self.closed = total, 0, desc, False
        _Bar.made.append(self)

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_an_estimate_draws_one_bar_of_its_budget_and_says_when_it_stops_early(
        monkeypatch, pivot_model, pivot_run) -> None:
    import tqdm

    import car_core.estimators._session as session  # where the estimate's bar is made
    from car_core.engine.progress import TqdmBar
    _Bar.made = []
    monkeypatch.setattr(tqdm, "tqdm", _Bar)  # the terminal's bar, recorded
    monkeypatch.setattr(session, "progress_bar",
                        lambda progress, total, label: TqdmBar(label, total)
                        if progress is True else progress or None)
    # early_stop: decided (the locus confirmed, the later steps ruled out) with half of n·K
    res = car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                          rollouts=96, progress=True, early_stop=True)
    assert len(_Bar.made) == 1  # one bar for the whole estimate, not one per batch
    bar = _Bar.made[0]
    n_k = len(pivot_run.steps) * 96  # the n·K the estimate may spend
    assert res.rollout_budget == n_k and res.rollouts_used < n_k
    assert bar.closed and bar.n == res.rollouts_used == bar.total
    assert bar.desc == f"contrastive: stopped early, {res.rollouts_used} of {n_k} allowed"


def test_an_estimate_the_budget_ended_says_so_on_its_bar(monkeypatch, pivot_model,
                                                        pivot_run) -> None:
    """The API's bar said "stopped early" of an estimate its budget had cut short, beside a
    result that says the budget ran out; only the CLI's bar knew."""
    import tqdm

    import car_core.estimators._session as session
    from car_core.engine.progress import LineProgress, TqdmBar
    _Bar.made = []
    monkeypatch.setattr(tqdm, "tqdm", _Bar)
    monkeypatch.setattr(session, "progress_bar",
                        lambda progress, total, label: TqdmBar(label, total)
                        if progress is True else progress or None)
    res = car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                          rollouts=96, budget=13, progress=True)
    assert res.truncated and res.rollouts_used < 13  # an odd rollout no pair could use
    said = f"the budget ran out, {res.rollouts_used} of 13 allowed"
    assert _Bar.made[0].desc == f"contrastive: {said}"
    stream = io.StringIO()
    line = LineProgress("contrastive", 13, every=0.0, stream=stream)
    monkeypatch.setattr(session, "progress_bar", lambda progress, total, label: line)
    res = car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                          rollouts=96, budget=13, progress=True)
    assert stream.getvalue().splitlines()[-1].endswith(
        f"(the budget ran out, {res.rollouts_used} of 13 allowed)")


def test_progress_to_a_pipe_is_plain_lines_with_an_honest_end(pivot_model, pivot_run,
                                                              capsys) -> None:
    """Asked for where stderr is no terminal (a CI log), progress is plain lines: a tqdm bar's
    carriage returns read as one garbled line there, and rich drew nothing until the end, then
    a bar wrapped over three lines. The last line says the estimate stopped early."""
    from car_core.engine.progress import LineProgress, progress_bar
    for bar in (progress_bar(True, 96, "contrastive"), kit.make_progress(True, "contrastive r1",
                                                                          96, 96)):
        assert isinstance(bar, LineProgress)  # stderr captured
        bar.close()  # left open, its heartbeat wrote to the capture after pytest closed it
    res = car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                          rollouts=96, progress=True, early_stop=True)
    n_k = len(pivot_run.steps) * 96
    lines = capsys.readouterr().err.strip().splitlines()
    assert res.rollouts_used < n_k and "\r" not in "".join(lines)
    assert lines[-1].startswith(f"contrastive: {res.rollouts_used} of {n_k} rollouts")
    assert lines[-1].endswith(f"(stopped early, {res.rollouts_used} of {n_k} allowed)")
    stream = io.StringIO()
    often = LineProgress("intervene", 10, 10, every=0.0, stream=stream)
    for _ in range(3):
        often.update(2)
    often.done()
    often.close()  # once closed, nothing more
    said = stream.getvalue().splitlines()
    assert [line.split(",")[0] for line in said] == [
        "intervene: 2 of 10 rollouts", "intervene: 4 of 10 rollouts",
        "intervene: 6 of 10 rollouts", "intervene: 6 of 10 rollouts"]
    assert "budget left 4" in said[-1] and said[-1].endswith("(stopped early, 6 of 10 allowed)")


def test_progress_to_a_pipe_says_it_is_waiting_while_no_rollout_finishes() -> None:
    """A model server that stalls (an outage backing off) stops every update: the log must not
    go silent, which reads as a hang, but say how long it has waited."""
    import time

    from car_core.engine.progress import LineProgress
    stream = io.StringIO()
    bar = LineProgress("contrastive", 10, every=0.05, stream=stream)
    bar.update(3)
    time.sleep(0.5)
    bar.done()
    lines = stream.getvalue().splitlines()
    waiting = [line for line in lines if "(waiting: no rollout finished for" in line]
    assert len(waiting) >= 3 and all(line.startswith("contrastive: 3 of 10 rollouts")
                                     for line in waiting)
    assert lines[-1].endswith("(stopped early, 3 of 10 allowed)")
    time.sleep(0.2)
    assert stream.getvalue().splitlines() == lines  # closed: the heartbeat stopped


def test_the_cli_bar_ends_at_what_was_run_and_says_how_much_was_allowed() -> None:
    bar = kit.RichProgress("contrastive r1", 192, 192)
    bar.update(68)
    bar.done()
    task = bar.progress.tasks[0]
    assert task.total == task.completed == 68
    assert task.description.endswith("stopped early, 68 of 192 allowed")
    # the budget ended it, one rollout left that no pair could use: said as the result says it
    # (a trial read "stopped early, 23 of 24 allowed" beside "truncated: budget reached")
    cut = kit.RichProgress("contrastive r1", 24, 24)
    cut.update(23)
    cut.done(truncated=True)
    assert cut.progress.tasks[0].description.endswith("the budget ran out, 23 of 24 allowed")


def test_the_cli_bar_without_a_budget_counts_down_to_its_planned_cap() -> None:
    """Without --budget the bar counts to the search's n·K cap; its last column said "no
    budget cap" beside it (a trial read that as a contradiction)."""
    bar = kit.RichProgress("contrastive r1", 80, None)
    bar.update(30)
    task = bar.progress.tasks[0]
    assert kit._Left().render(task).plain == "at most 50 more"
    assert kit._Left().render(replace(task, total=None)).plain == "no budget cap"
    with_budget = kit.RichProgress("contrastive r1", 80, 60)
    with_budget.update(30)
    assert kit._Left().render(with_budget.progress.tasks[0]).plain == "budget left 30"
    bar.close()
    with_budget.close()


def test_a_car_warning_is_one_plain_line_and_others_keep_their_form(capsys) -> None:
    """A side-effect tool matched on free text warned in Python's form: CAR's file and line,
    then the source line, which read as a crash in a user trial."""
    import warnings

    from car_core.cli.app import plain_warnings
    from car_core.engine.agent import AgentCaveat
    seen: list[str] = []
    show = plain_warnings(lambda message, *rest: seen.append(str(message)))
    show(AgentCaveat("refunds: 2 tools left unclassified run live"), AgentCaveat,
         "/site/car_core/engine/agent.py", 121)
    show(DeprecationWarning("old"), DeprecationWarning, "/x.py", 3)
    err = capsys.readouterr().err
    assert err.strip() == "car: warning: refunds: 2 tools left unclassified run live"
    assert seen == ["old"]  # not ours: Python's own form, untouched
    assert warnings.showwarning is not show


def test_a_progress_line_whose_stream_was_closed_stops_its_heartbeat() -> None:
    """A bar left open outlived the stream it wrote to (a test's captured stderr), and its
    heartbeat thread raised "I/O operation on closed file" every few seconds."""
    from car_core.engine.progress import LineProgress
    stream = io.StringIO()
    bar = LineProgress("contrastive", 10, every=0.02, stream=stream)
    stream.close()
    bar.update(1)  # would print: the stream is gone
    assert bar._stop.wait(1.0)
