"""``car triage``: where a population of failed runs commits to failure (``car.triage``), and
``car export triage``: a stored triage as JSON or CSV. The runs are the ids given, or the
store's recorded runs filtered by agent, time, test, pytest session and outcome (failed by
default); every run's attribution and the triage are kept in the store, resumable with
``--resume``."""

from __future__ import annotations

import sys
import time
import uuid
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from car_core import defaults
from car_core.cli import kit
from car_core.cli.app import (
    AgentNameOpt,
    AgentOpt,
    ForceAgentOpt,
    JsonOpt,
    OutcomeOpt,
    ProgressOpt,
    RunsAtOnceOpt,
    SessionOpt,
    SinceOpt,
    StoreOpt,
    TestOpt,
    UntilOpt,
    check_seed,
    err,
    errors,
    out,
    print_json,
)
from car_core.cli.selection import (
    Format,
    export,
    per_run_lines,
    resumable_stop,
    selected,
    stop_if_ran_out,
    stored_params,
)
from car_core.engine.execution import default_executor
from car_core.errors import InvalidInput
from car_core.estimators._population import runs_at_once_for
from car_core.estimators.triage import FIELDS, progress_line, triage, untimed
from car_core.model.budget import Budget
from car_core.store import RunStore
from car_core.triage_results import UNDECIDED, TriageResult


class Only(StrEnum):
    failed = "failed"
    passed = "passed"
    any = "any"


def _budget(rollouts: int | None, tokens: int | None, cost: float | None,
            seconds: float | None, prices: dict[str, tuple[float, float]]) -> Budget | None:
    if rollouts is None and tokens is None and cost is None and seconds is None:
        return None
    return Budget(rollouts=rollouts, tokens=tokens, cost=cost, wall_time=seconds, prices=prices)


def _given(value: Any, stored: Any, default: Any) -> Any:
    """A flag as given, else the resumed triage's setting, else the default: a resume
    continues what was started (a trial's `--resume` without `--rollouts` ran on the default
    32 where the triage had 64, and stored 32)."""
    if value is not None:
        return value
    return stored if stored is not None else default


def _whole(stored: Any) -> int:
    return stored if isinstance(stored, int) and not isinstance(stored, bool) else 0


def _caps(stored: Any) -> dict[str, Any]:
    """A stored budget (``Budget.to_dict``) as a dict; none stored: no caps."""
    return stored if isinstance(stored, dict) else {}


def _by(text: str) -> tuple[str, ...]:
    chosen = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in chosen if p not in FIELDS]
    if unknown or not chosen:
        raise InvalidInput(f"--by {text!r}: group by some of {', '.join(FIELDS)}",
                           hint="e.g. --by agent or --by step,tool")
    return chosen


@errors
def triage_command(
        agent: AgentOpt,
        run_ids: Annotated[list[str] | None, typer.Argument(
            metavar="RUN_ID", show_default=False,
            help="Run ids to triage (default: the store's runs the filters select).")] = None,
        outcome: OutcomeOpt = None,
        agent_name: AgentNameOpt = None, since: SinceOpt = None, until: UntilOpt = None,
        test: TestOpt = None, session: SessionOpt = None,
        only: Annotated[Only, typer.Option(
            "--only", help="Which runs by outcome.")] = Only.failed,
        by: Annotated[str | None, typer.Option(
            "--by", show_default=False,
            help="Group the loci by these, comma-separated: "
                 f"{', '.join(FIELDS)} (default all; on --resume the triage's).")] = None,
        label: Annotated[str | None, typer.Option(
            "--label", help="MODULE:FUNCTION(run, result) -> str naming each run's group "
                            "(replaces --by).")] = None,
        rollouts: Annotated[int | None, typer.Option(
            "--rollouts", min=1, show_default=False,
            help="K per step of each run's attribution (a cap of n·K rollouts for an n-step "
                 f"run; default {defaults.ROLLOUTS}; on --resume the triage's).")] = None,
        alpha: Annotated[float | None, typer.Option(
            "--alpha", show_default=False,
            help="Each attribution's family-wise error rate and the intervals' joint one "
                 f"(default {defaults.ALPHA}; on --resume the triage's).")] = None,
        seed: Annotated[int | None, typer.Option(
            "--seed", show_default=False,
            help="Root seed of the branches (default 0; on --resume the triage's).")] = None,
        budget: Annotated[int | None, typer.Option(
            "--budget", min=1, help="Total rollouts over all runs.")] = None,
        max_tokens: Annotated[int | None, typer.Option(
            "--max-tokens", min=1, help="Total model tokens over all runs.")] = None,
        max_cost: Annotated[float | None, typer.Option(
            "--max-cost", help="Total money over all runs (see --price).")] = None,
        max_seconds: Annotated[float | None, typer.Option(
            "--max-seconds", help="Total wall time; runs not reached are left "
                                  "undecided.")] = None,
        per_run_budget: Annotated[int | None, typer.Option(
            "--per-run-budget", min=1, help="Rollouts of one run's attribution (default "
                                            "n·K).")] = None,
        per_run_tokens: Annotated[int | None, typer.Option(
            "--per-run-max-tokens", min=1, help="Model tokens of one run's attribution.")
        ] = None,
        per_run_cost: Annotated[float | None, typer.Option(
            "--per-run-max-cost", help="Money of one run's attribution.")] = None,
        per_run_seconds: Annotated[float | None, typer.Option(
            "--per-run-max-seconds", help="Wall time of one run's attribution.")] = None,
        price: Annotated[list[str] | None, typer.Option(
            "--price", metavar="MODEL=IN:OUT",
            help="Price of a model per million input and output tokens (repeatable).")] = None,
        executor: kit.ExecutorOpt = None,
        concurrency: kit.ConcurrencyOpt = None,
        runs_at_once: RunsAtOnceOpt = None,
        resume: Annotated[str | None, typer.Option(
            "--resume", metavar="TRIAGE_ID",
            help="Continue a triage: finished runs are read back, not re-run; without run ids "
                 "or filters, its own runs; the settings left out, its own.")] = None,
        force_agent: ForceAgentOpt = False,
        store: StoreOpt = "car.db", json_out: JsonOpt = False,
        progress: ProgressOpt = None) -> None:
    """Attribute every selected failed run and show where they commit: groups by step,
    agent, node and tool (or --label), each with its share of the runs and a simultaneous
    interval, and the runs left undecided or with no cause, with why. Every attribution and
    the triage are kept in the store (`car attributions`; `car export triage ID`). On
    --resume, a setting left out (--rollouts, --alpha, --seed, --by, the budgets) is the
    triage's, as `car attribute --resume` takes the attribution's."""
    if label is not None and by is not None:  # --by was dropped without a word
        raise InvalidInput("--label replaces --by: give one of them",
                           hint="leave --by out to group by the label's names, or --label out "
                                "to group by the fields")
    before = stored_params(store, resume)
    rollouts = int(_given(rollouts, before.get("rollouts"), defaults.ROLLOUTS))
    alpha = float(_given(alpha, before.get("alpha"), defaults.ALPHA))
    seed = int(_given(seed, before.get("seed"), 0))
    stored_by = before.get("by")
    by = _given(by, ",".join(stored_by) if isinstance(stored_by, list) else None,
                ",".join(FIELDS))
    total, each = _caps(before.get("budget")), _caps(before.get("per_run"))
    budget = _given(budget, total.get("rollouts"), None)
    max_tokens = _given(max_tokens, total.get("tokens"), None)
    max_cost = _given(max_cost, total.get("cost"), None)
    max_seconds = _given(max_seconds, total.get("wall_time"), None)
    per_run_budget = _given(per_run_budget, each.get("rollouts"), None)
    per_run_tokens = _given(per_run_tokens, each.get("tokens"), None)
    per_run_cost = _given(per_run_cost, each.get("cost"), None)
    per_run_seconds = _given(per_run_seconds, each.get("wall_time"), None)
    check_seed(seed)
    if not 0 < alpha < 1:
        raise InvalidInput(f"--alpha {alpha} is outside (0, 1)", hint="e.g. --alpha 0.05")
    for flag, value in (("--max-cost", max_cost), ("--max-seconds", max_seconds),
                        ("--per-run-max-cost", per_run_cost),
                        ("--per-run-max-seconds", per_run_seconds)):
        if value is not None and not value > 0:
            raise InvalidInput(f"{flag} {value} cannot pay for anything",
                               hint=f"give {flag} a positive number, or leave it out")
    grouping = _by(by)
    prices = kit.parse_prices(price or [])
    ids = selected(store, run_ids, resume, only.value, agent_name=agent_name, since=since,
                   until=until, test=test, session=session)
    if not ids:
        raise InvalidInput("no run matches: nothing to triage",
                           hint="list the stored runs with `car runs`, or loosen the filters")
    the_agent, the_outcome = kit.load_agent_and_outcome(agent, outcome)
    at_once = runs_at_once_for(runs_at_once, the_agent)
    label_fn = kit.load_object(label, "label") if label else None
    shown = progress if progress is not None else sys.stderr.isatty()
    tid = resume or uuid.uuid4().hex[:16]  # known here, so a stopped triage can say it
    exe = kit.chosen_executor(executor, concurrency)
    db = RunStore(store)
    started, cpu = time.monotonic(), time.process_time()
    try:
        with resumable_stop(store, "triage", tid,
                            lambda: db.attribution_exists(tid)):
            result = triage(ids, the_agent, outcome=the_outcome, rollouts=rollouts,
                            alpha=alpha, seed=seed,
                            budget=_budget(budget, max_tokens, max_cost, max_seconds, prices),
                            per_run=_budget(per_run_budget, per_run_tokens, per_run_cost,
                                            per_run_seconds, prices),
                            label=label_fn, by=grouping, store=db, triage_id=tid,
                            executor=exe,
                            progress=per_run_lines(progress_line, at_once, untimed)
                            if shown else None,
                            force_agent=force_agent, runs_at_once=at_once)
    finally:
        db.close()
    if json_out:
        print_json(result.to_dict())
    else:
        print_triage(result, store)
        # as car attribute: a triage that mostly waited on one branch at a time says so
        hint = kit.waiting_hint(default_executor(the_agent), exe, time.monotonic() - started,
                                time.process_time() - cpu)
        if hint:
            err.print(Text(kit.safe(hint), style="yellow"), soft_wrap=True)
    now = result.rollouts_now if result.rollouts_now is not None else result.rollouts_used
    if uncounted := kit.uncounted_caps(result.params, result.tokens, result.cost, now):
        err.print(Text(kit.safe(uncounted), style="yellow"), soft_wrap=True)
    stopped = [r for r in result.per_run if r.resumable]
    if stopped:  # each row says "resume the attribution": the triage's resume does that
        err.print(Text(kit.safe(
            f"{len(stopped)} run(s) stopped because their branches failed; the branches that "
            f"finished are kept in {store} (triage {result.triage_id}). Once what failed them "
            f"is fixed, resume with:\n  {kit.resume_command(str(result.triage_id))}")),
            soft_wrap=True)
    short = [r for r in result.per_run if r.answer == UNDECIDED and not r.resumable
             and "budget" in (r.reason or "")]
    if short and not result.truncated:  # each run's own re-runs ran out: say how to go on
        # twice the K those runs ran with: this call's, or the triage's own where it was
        # larger (a smaller K reads them back as they were)
        twice = 2 * max(rollouts, _whole(before.get("rollouts")))
        err.print(Text(kit.safe(
            f"{len(short)} run(s) used up their re-runs before a step was decided; their "
            f"branches are kept in {store} (triage {result.triage_id}). To go on with twice the "
            f"re-runs per step:\n  "
            f"{kit.resume_command(str(result.triage_id), flags=['--rollouts', str(twice)])}"
        )), soft_wrap=True)
    stop_if_ran_out(result.truncated, result.budget_note, result.triage_id)
    if not result.groups:  # the agent under test failed, as `car attribute` says it (5)
        raise typer.Exit(kit.AGENT if stopped else kit.NOTHING)



def print_triage(r: TriageResult, store: str) -> None:
    """The answer first, then one row per group, then the runs without a locus and why."""
    out.print(Text(kit.safe(r.summary()), style="bold"))
    if r.groups:
        t = Table(title_justify="left")
        for col in ("where the runs commit", "runs", "share", f"interval ({_pct(1 - r.alpha)} "
                    "jointly)"):
            t.add_column(col, justify="left" if col.startswith("where") else "right")
        for g in r.groups:
            t.add_row(kit.cell(g.label), str(g.n), _pct(g.share),
                      f"{_pct(g.share_ci[0])}–{_pct(g.share_ci[1])}")
        out.print(t)
    if (split := r.split_hint("cli")) is not None:
        out.print(Text(kit.safe(split), style="dim"))
    for row in r.per_run:
        if row.locus is None:
            out.print(Text(kit.safe(f"run {row.run_id}: {row.answer}"
                                    + (f" — {row.reason}" if row.reason else ""))))
    out.print(Text(f"{r.runs_total} run(s) · {spent_words(r)} · triage {r.triage_id}"))
    out.print(Text(kit.safe(f"the runs behind each group: car export triage {r.triage_id} "
                            f"--store {store}, or --json"), style="dim"))


def spent_words(r: TriageResult) -> str:
    """The rollouts this call ran, and every pass's where a resume makes them differ: a
    trial's resume said "1791 rollouts spent now" where about 900 of them were read back."""
    now = r.rollouts_now if r.rollouts_now is not None else r.rollouts_used
    said = f"{now} rollouts spent now"
    if r.rollouts_in_all is not None and r.rollouts_in_all != now:
        said += f", {r.rollouts_in_all} by every pass of this triage"
    return said


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


@errors
def export_triage(
        triage_id: Annotated[str, typer.Argument(help="The triage's id (`car attributions`).")],
        out_path: Annotated[Path | None, typer.Option(
            "--out", help="File to write (default: standard output).")] = None,
        fmt: Annotated[Format | None, typer.Option(
            "--format", help="json or csv (default: from --out's suffix, else json).")
        ] = None,
        store: StoreOpt = "car.db") -> None:
    """Write a stored triage: JSON (`car triage --json`'s) or CSV (one row per group, then
    the undecided and no-cause runs)."""
    from car_core.store.triages import load_triage  # brings sqlite-utils: not for --help
    db = kit.existing_store(store)
    try:
        result = load_triage(db, triage_id)
    finally:
        db.close()
    export(result, fmt, out_path, f"triage {triage_id}")
