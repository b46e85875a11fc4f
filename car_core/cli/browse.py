"""The commands that read the store and change nothing in it: ``car runs``, ``car show``,
``car attributions`` and ``car report`` (which writes only the HTML it is asked for). A damaged
row is named and the intact ones are still shown."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from car_core import formatting as fmt
from car_core.cli import kit
from car_core.cli.app import JsonOpt, ReverseOpt, StoreOpt, errors, out, print_json
from car_core.cli.attribute import Method
from car_core.errors import CarError, CorruptRun, CorruptStore, InvalidInput
from car_core.model.interventions import compile_plan, intervention_from_dict
from car_core.model.trajectory import Lineage, is_failure
from car_core.report.pages import run_page, write_index
from car_core.results import ContrastiveResult, Result
from car_core.store import damaged_rows


# -- runs / show ---------------------------------------------------------------------------------
@errors
def runs(store: StoreOpt = "car.db", json_out: JsonOpt = False,
         branches: Annotated[bool, typer.Option("--branches", help="Include branches.")] = False,
         limit: Annotated[int | None, typer.Option(
             "--limit", min=1, help="Show only the N newest runs.")] = None,
         reverse: ReverseOpt = False) -> None:
    """List the stored runs, newest first (--reverse: oldest first). A damaged row is named
    (exit 4) and the intact ones are still listed."""
    rows, damaged = kit.existing_store(store).scan(branches=branches, limit=limit)
    if reverse:
        rows = rows[::-1]
    _print_runs(rows, store, json_out, damaged)
    if damaged:
        raise damaged_rows(damaged, len(rows))


def _print_runs(rows: list[dict[str, Any]], store: str, json_out: bool,
                damaged: list[tuple[str, str]]) -> None:
    if json_out:
        print_json(rows)
        return
    if not rows:
        if not damaged:
            out.print(Text(f"no runs in {kit.safe(store)}"))
        return
    t = Table(title=kit.cell(f"runs in {store}"), title_justify="left")
    fixed = ("id", "created (UTC)", "agent", "status", "outcome", "steps", "seed")
    table = []
    for r in rows:
        created = datetime.fromtimestamp(r["created_at"] or 0, UTC)
        table.append([kit.safe(str(c)) for c in (
            r["id"], created.strftime("%Y-%m-%d %H:%M:%S"), r["agent"], _status_cell(r),
            _outcome_cell(r["outcome"]), r["n_steps"], "—" if r["seed"] is None else r["seed"])])
    # the input column is the one a narrow terminal shortens; the others keep their width
    # where they fit (else they wrap, as they always did, and the input is left out)
    widths = [max(len(col), *(len(cells[i]) for cells in table)) for i, col in enumerate(fixed)]
    fits = kit.table_width(widths) <= out.width
    for col, width in zip(fixed, widths, strict=True):
        t.add_column(col, justify="right" if col in ("outcome", "steps", "seed") else "left",
                     no_wrap=fits or col == "id", min_width=width if fits else
                     16 if col == "id" else None)
    tests = any(r.get("test") for r in rows)  # recorded by the pytest plugin: say by which test
    if tests:
        t.add_column("test", overflow="fold")
    room = out.width - kit.table_width([*widths, INPUT_LEAST]) + INPUT_LEAST
    inputs = fits and not tests and room >= INPUT_LEAST
    if inputs:
        t.add_column("input", no_wrap=True, overflow="ellipsis", max_width=min(room, 40))
    for r, cells in zip(rows, table, strict=True):
        t.add_row(*map(Text, cells), *([kit.cell(r.get("test") or "—")] if tests else []),
                  *([kit.cell(r.get("input") or "—")] if inputs else []))
    out.print(t)


INPUT_LEAST = 12  # below this width for what a run was asked, the column is left out


def _status_cell(row: dict[str, Any]) -> str:
    """The status a person reads: ``stopped`` for a run stopped by design (a guardrail's
    tripwire), which is stored ``complete`` with its last reply never delivered."""
    if row.get("stopped_by") is not None:
        return fmt.STOPPED
    return fmt.status_word(row["status"], row.get("error"), None)


def _outcome_cell(value: float | None) -> str:
    """The stored outcome, and "failed" where it counts as the failure (the README promises
    `car runs` shows which runs failed; a first-hour trial saw only 1.00 and 0.00)."""
    if value is None:
        return "—"
    return f"{value:.2f} failed" if is_failure(value) else f"{value:.2f}"


def _branch_words(db: Any, lineage: Lineage) -> str:
    """What a branch did (``Plan.words``, its interventions against the stored parent): its
    arm's key and rollout index are the estimator's (a trial read "rollout 2097152"), kept
    in ``--json``; without the parent, the arm's key is all there is."""
    if not lineage.interventions and lineage.branch_step is not None:  # stored before them
        return f"re-deciding from step {lineage.branch_step} on"
    try:
        parent = db.load(lineage.parent_id)
        plan = compile_plan(parent, [intervention_from_dict(dict(d))
                                     for d in lineage.interventions])
    except CarError:
        return f"arm {lineage.arm}" if lineage.arm else "its parent is not in this store"
    return plan.words()


@errors
def show(run_id: Annotated[str, typer.Argument(help="Run id (see `car runs`).")],
         store: StoreOpt = "car.db", json_out: JsonOpt = False,
         full: Annotated[bool, typer.Option("--full", help="Do not shorten long values.")]
         = False) -> None:
    """Show a stored run step by step: action, observation, origin."""
    width = None if full else 120
    db = kit.existing_store(store)
    run = db.load(run_id)
    if json_out:
        print_json(run.to_dict())
        return
    outcome = "—" if run.outcome is None else f"{run.outcome.value:.2f}"
    out.print(Text(kit.safe(f"run {run.id}  agent {run.agent or '—'}  status {run.status}  "
                            f"outcome {outcome}  seed {run.seed}")))
    if (run.meta or {}).get("test"):
        out.print(Text(kit.safe(f"recorded by test {run.meta['test']}")))
    if run.lineage:
        out.print(Text(kit.safe(f"branch of {run.lineage.parent_id}: "
                                f"{_branch_words(db, run.lineage)}")))
    # a branch says which steps it copied from the record and which it decided again (a
    # recorded run's steps were all decided live: it needs no legend)
    legend = fmt.origins_legend(s.meta.get("origin") for s in run.steps) if run.lineage else None
    if legend:
        out.print(Text(kit.safe(f"origin: {legend}")))
    ending = fmt.ending_line(run.status, run.error, run.meta, [s.action for s in run.steps])
    if ending:  # a stopped run's last reply must not read as delivered
        out.print(Text(kit.safe(ending), style="bold yellow"))
    out.print(Text("context: ") + kit.plain(run.context, width and 200))
    # one layout whatever the run: the index, then the origin, agent and node columns when
    # any step has them (plain agents record none of them, multi-agent apps both who and
    # where), each as wide as its widest entry, values starting in one column
    columns = [(name, [kit.safe(str(s.meta.get(name) or "")) for s in run.steps])
               for name in ("origin", "agent", "node")]
    columns = [(name, cells) for name, cells in columns if any(cells)]
    index_w = max((len(f"[{s.index}]") for s in run.steps), default=3)
    widths = [max(len(name), *(len(c) for c in cells)) for name, cells in columns]
    if columns and run.steps:
        out.print(Text(" " * index_w + "".join(f" {name:<{w}}" for (name, _), w
                                                in zip(columns, widths, strict=True)),
                       style="dim"))
    for i, s in enumerate(run.steps):
        lead = f"[{s.index}]".ljust(index_w) + "".join(
            f" {cells[i] or '-':<{w}}" for (_, cells), w in zip(columns, widths, strict=True))
        out.print(Text(f"{lead}       action: ", style="bold") + kit.plain(s.action, width))
        if s.observed:
            out.print(Text(" " * len(lead) + "  observation: ") + kit.plain(s.observation, width))
        marks = fmt.tool_marks_text(s.action, s.meta)
        if marks:  # a simulated or record-served result must not read as a call that happened
            out.print(Text(" " * len(lead) + " tool results: ") + Text(kit.safe(marks)))


# -- report / attributions ----------------------------------------------------------------------
@errors
def report(run_id: Annotated[str | None, typer.Argument(
               help="Run id (leave it out with --all).")] = None,
           store: StoreOpt = "car.db",
           out_path: Annotated[Path | None, typer.Option(
               "--out", "-o", help="HTML file to write (default report.html); with --all a "
                                   "folder (default car-report/) or the index's .html file.")
           ] = None,
           attribution: Annotated[str | None, typer.Option(
               "--attribution", help="Attribution id to show (see `car attributions RUN_ID`; "
                                     "default: the latest complete one).")] = None,
           method: Annotated[Method | None, typer.Option(
               "--method", help="Show the latest complete attribution of this method.")] = None,
           every: Annotated[bool, typer.Option(
               "--all", help="Write an index of every run and attribution in the store, with "
                             "a report for each beside it.")] = False,
           ) -> None:
    """Write the self-contained HTML report of a run's attribution (works offline). The page
    says which attribution it shows; pick another with --attribution or --method. With --all,
    an index page across the store's runs, attributions, triages and population fixes,
    linking to a page of each."""
    if every:
        if run_id is not None or attribution is not None or method is not None:
            raise InvalidInput("--all writes every run's report; it takes no RUN_ID, "
                               "--attribution or --method",
                               hint="drop them, or drop --all to write one run's report")
        written = write_index(kit.existing_store(store), out_path or Path("car-report"), store)
        triages = f", {written.triages} triage(s)" if written.triages else ""
        fixes = f", {written.fixes} population fix(es)" if written.fixes else ""
        out.print(Text(kit.safe(f"wrote {written.index} ({written.runs} run(s), "
                                f"{written.attributions} attribution(s){triages}{fixes}, "
                                f"{written.pages} report(s) beside it)")))
        for problem in written.damaged:
            out.print(Text(kit.safe(f"left out: {problem}"), style="yellow"))
        return
    if run_id is None:
        raise InvalidInput("car report needs a RUN_ID, or --all for the whole store",
                           hint="list runs with `car runs`")
    out_path = out_path or Path("report.html")
    db = kit.existing_store(store)
    run = db.load(run_id)
    html, note = run_page(db, run, attribution, method.value if method else None)
    kit.write_out(out_path, html, "pass --out a writable path")
    out.print(Text(kit.safe(f"wrote {out_path} ({note})")))


@errors
def attributions(run_id: Annotated[str | None, typer.Argument(
                     help="Run id (default: every run's attributions).")] = None,
                 store: StoreOpt = "car.db", json_out: JsonOpt = False,
                 reverse: ReverseOpt = False) -> None:
    """List stored attributions, newest first (--reverse: oldest first): method, status,
    answer (locus N, no cause, undecided with its candidate), rollouts. An interrupted or
    undecided one is resumed with `car attribute RUN_ID ... --resume ID` (undecided: with a
    larger --budget)."""
    db = kit.existing_store(store)
    if run_id is not None:
        db.load(run_id)  # an unknown or damaged run is an error, not an empty list
    rows, damaged = [], []
    results: dict[str, Result | None] = {}
    ids = db.attribution_ids(run_id)  # oldest first
    for aid in (ids if reverse else ids[::-1]):
        try:  # one damaged attribution (or branch of one) is named; the others are listed
            a = db.attribution(aid)
            count = len(db.branches(a.id))
        except (CorruptStore, CorruptRun) as exc:
            damaged.append(str(exc))
            continue
        res = results[a.id] = a.result
        rows.append({"id": a.id, "run_id": a.run_id, "method": a.method,
                     "status": db.status_said(a),
                     "answer": (str(res.answer) if isinstance(res, ContrastiveResult)
                                else None),
                     "locus": res.locus if isinstance(res, ContrastiveResult) else None,
                     "candidate": (res.candidate if isinstance(res, ContrastiveResult)
                                   else None),
                     "rollouts": res.rollouts_used if res is not None else None,
                     "branches": count, "created_at": a.created_at})
    _print_attributions(rows, results, store, run_id, json_out, bool(damaged))
    if damaged:
        more = f" ({len(damaged) - 1} more damaged)" if len(damaged) > 1 else ""
        raise CorruptStore(f"{damaged[0]}{more}; {len(rows)} other attribution(s) listed")


def _print_attributions(rows: list[dict[str, Any]], results: dict[str, Result | None],
                        store: str, run_id: str | None, json_out: bool, damaged: bool) -> None:
    if json_out:
        print_json(rows)
        return
    if not rows and damaged:
        return
    if not rows:
        out.print(Text(kit.safe(f"no attributions in {store}"
                                + (f" for run {run_id}" if run_id else ""))))
        return
    t = Table(title=kit.cell(f"attributions in {store}"), title_justify="left")
    for col in ("id", "run", "method", "status", "answer", "rollouts", "branches stored"):
        t.add_column(col, justify="right" if col in ("rollouts", "branches stored")
                     else "left", no_wrap=col in ("id", "run"))
    for r in rows:
        t.add_row(kit.cell(r["id"]), kit.cell(r["run_id"]), kit.cell(r["method"]),
                  kit.cell(r["status"]), kit.cell(kit.answer_cell(results.get(r["id"]))),
                  kit.cell("—" if r["rollouts"] is None else r["rollouts"]),
                  str(r["branches"]))
    out.print(t)
    for r in rows:
        res = results.get(r["id"])
        if res is not None and res.continue_hint() is not None:
            more = " ".join(kit.budget_flags(res.larger_budget()))
            out.print(Text(kit.safe(
                f"{r['id']} is {kit.answer_cell(res)}; to continue, resume it with a larger "
                f"budget: car attribute {r['run_id']} --agent MODULE:FACTORY --outcome "
                f"MODULE:FUNCTION --method {r['method']}" + (f" {more}" if more else "")
                + f" --store {store} --resume {r['id']}")), soft_wrap=True)
