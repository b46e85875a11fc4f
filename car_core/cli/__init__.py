"""The ``car`` command: list and show stored runs, intervene on a step, attribute a failure,
write the HTML report, and run the demo. Errors from CAR print one line with what to do next
and map to exit codes a script can branch on (see ``car --help``)."""

from __future__ import annotations

import functools
import importlib
import io
import os
import shlex
import signal
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table
from rich.text import Text

import car_core as car
from car_core import defaults
from car_core.assertions import agent_of
from car_core.cli import kit
from car_core.engine.execution import make_executor
from car_core.engine.replay import intervene as run_intervene
from car_core.errors import AttributionNotFound, CarError, CorruptRun, CorruptStore, InvalidInput
from car_core.estimators._session import check_resumable
from car_core.estimators.settings import ContrastiveSettings, ShapleySettings
from car_core.model.budget import Budget, check_bound
from car_core.model.json_values import dumps
from car_core.model.vocabulary import Answer
from car_core.report import render_attribution
from car_core.report.pages import run_page, write_index
from car_core.results import ContrastiveResult, Result
from car_core.secrets.redact import redact
from car_core.store import Attribution, RunStore, damaged_rows

EXIT_CODES = """Exit codes: 0 ok · 1 nothing attributable (no locus) · 2 usage or bad input
(also a run recorded with another agent) · 3 budget exhausted (the result is truncated, what
was measured is kept) or memory ran out · 4 store or run error (no store, unknown id, not a
CAR store, damaged or edited store, read-only folder, attribution busy) · 5 the agent under
test failed (also when every branch failed, or its code or the outcome's called sys.exit) ·
70 internal error · 130 interrupted (Ctrl-C; finished branches are kept, resume with --resume)
· 141 the output was closed by its reader (`car show RUN | head`), as git ends."""

app = typer.Typer(
    name="car", add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Causal Agent Replay: find the step that caused an agent's failure by intervening on "
         "recorded steps and re-running the agent.",
    epilog=EXIT_CODES)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version
        try:
            shown = version("causal-agent-replay")
        except PackageNotFoundError:  # run from a source tree that was never installed
            shown = "unknown (not installed)"
        STDOUT.write(f"car (causal-agent-replay) {shown}\n")
        raise typer.Exit(0)


@app.callback()
def _car(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True,
        help="Print the installed causal-agent-replay version and exit.")] = False) -> None:
    """Causal Agent Replay: find the step that caused an agent's failure by intervening on
    recorded steps and re-running the agent."""


class _Redacting(io.TextIOBase):
    """The current ``sys.stdout``/``sys.stderr`` (looked up at each write, so captures work)
    with every secret redacted from what is written."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def _target(self) -> Any:
        return getattr(sys, self._name)

    def write(self, text: str) -> int:
        try:
            self._target.write(redact(text))
        except BrokenPipeError:  # the reader went away (`car show RUN | head -1`)
            raise kit.closed_pipe(self._name) from None
        return len(text)

    def flush(self) -> None:
        try:
            self._target.flush()
        except BrokenPipeError:
            raise kit.closed_pipe(self._name) from None

    def isatty(self) -> bool:
        return bool(self._target.isatty())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self._target, "encoding", None) or "utf-8")


STDOUT: Any = _Redacting("stdout")
STDERR: Any = _Redacting("stderr")
# Piped output is not cut at 80 columns: scripts and captures get whole tables.
out = kit.Console(file=STDOUT, highlight=False, soft_wrap=True, stream="stdout",
                  width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", 120)))
err = kit.Console(file=STDERR, highlight=False, stream="stderr")

StoreOpt = Annotated[str, typer.Option("--store", help="SQLite store of runs.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
ReverseOpt = Annotated[bool, typer.Option(
    "--reverse", help="Oldest first (the default is newest first).")]
ProgressOpt = Annotated[bool | None, typer.Option(
    "--progress/--no-progress", help="Progress bar on stderr (default: when it is a terminal).")]
AgentOpt = Annotated[str, typer.Option(
    "--agent", help="MODULE:FACTORY; FACTORY() returns the agent (imported from the current "
                    "folder).")]
OutcomeOpt = Annotated[str | None, typer.Option(
    "--outcome", help="MODULE:FUNCTION scoring a run in [0, 1] (1 = the failure happened).")]

F = TypeVar("F", bound=Callable[..., Any])
MAX_SEED = 2**63 - 1  # stored with every branch, in an SQLite INTEGER


def _check_seed(seed: int) -> None:
    if not 0 <= seed <= MAX_SEED:
        raise InvalidInput(f"--seed {seed} is outside 0 … 2**63 - 1",
                           hint="pass a smaller non-negative seed, e.g. --seed 0")


OUT_OF_MEMORY = ("out of memory: this machine cannot hold what was asked for; lower --rollouts "
                 "or --concurrency, or cap the run with --budget")


def _fail(message: str, code: int) -> typer.Exit:
    err.print(Text(f"car: error: {kit.safe(message)}"), soft_wrap=True)
    return typer.Exit(code)


def _errors(fn: F) -> F:
    """CAR errors become one clean line and their exit code, never a traceback; so do a
    sys.exit from the user's code (never a silent success; named as the agent's or the
    outcome's), a damaged file SQLite reports itself, Ctrl-C, and anything unexpected (70;
    ``CAR_DEBUG=1`` re-raises it). A closed output pipe ends quietly (141, as git does)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except kit.OutputClosed:
            raise typer.Exit(kit.CLOSED_PIPE) from None
        except CarError as exc:
            raise _fail(str(exc), kit.exit_code(exc)) from None
        except SystemExit as exc:
            raise _fail(kit.exited(exc), kit.AGENT) from None
        except KeyboardInterrupt:
            raise _fail("interrupted", kit.INTERRUPTED) from None
        except MemoryError:
            raise _fail(OUT_OF_MEMORY, kit.BUDGET) from None
        except sqlite3.Error as exc:
            raise _fail(f"the store cannot be read: {exc}", kit.STORE) from None
        except Exception as exc:
            if os.environ.get("CAR_DEBUG"):
                raise
            raise _fail(f"internal error: {type(exc).__name__}: {str(exc)[:200]} (set "
                        "CAR_DEBUG=1 for the traceback and report it)", kit.INTERNAL) from None
    return wrapper  # type: ignore[return-value]


def _print_json(value: Any) -> None:
    STDOUT.write(kit.json_line(dumps(value)) + "\n")


# -- runs / show ---------------------------------------------------------------------------------
@app.command()
@_errors
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
        _print_json(rows)
        return
    if not rows:
        if not damaged:
            out.print(Text(f"no runs in {kit.safe(store)}"))
        return
    t = Table(title=kit.cell(f"runs in {store}"), title_justify="left")
    t.add_column("id", no_wrap=True, min_width=16)
    for col in ("created (UTC)", "agent", "status", "outcome", "steps", "seed"):
        t.add_column(col, justify="right" if col in ("outcome", "steps", "seed") else "left")
    tests = any(r.get("test") for r in rows)  # recorded by the pytest plugin: say by which test
    if tests:
        t.add_column("test", overflow="fold")
    for r in rows:
        created = datetime.fromtimestamp(r["created_at"] or 0, UTC)
        cells: list[Any] = [
            kit.cell(r["id"]), created.strftime("%Y-%m-%d %H:%M:%S"), kit.cell(r["agent"]),
            kit.cell(r["status"]), "—" if r["outcome"] is None else f"{r['outcome']:.2f}",
            str(r["n_steps"]), "—" if r["seed"] is None else str(r["seed"])]
        t.add_row(*cells, *([kit.cell(r.get("test") or "—")] if tests else []))
    out.print(t)


@app.command()
@_errors
def show(run_id: Annotated[str, typer.Argument(help="Run id (see `car runs`).")],
         store: StoreOpt = "car.db", json_out: JsonOpt = False,
         full: Annotated[bool, typer.Option("--full", help="Do not shorten long values.")]
         = False) -> None:
    """Show a stored run step by step: action, observation, origin."""
    width = None if full else 120
    run = kit.existing_store(store).load(run_id)
    if json_out:
        _print_json(run.to_dict())
        return
    outcome = "—" if run.outcome is None else f"{run.outcome.value:.2f}"
    out.print(Text(kit.safe(f"run {run.id}  agent {run.agent or '—'}  status {run.status}  "
                            f"outcome {outcome}  seed {run.seed}")))
    if (run.meta or {}).get("test"):
        out.print(Text(kit.safe(f"recorded by test {run.meta['test']}")))
    if run.lineage:
        out.print(Text(kit.safe(f"branch of {run.lineage.parent_id}  arm {run.lineage.arm}  "
                                f"rollout {run.lineage.rollout}")))
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


# -- intervene ---------------------------------------------------------------------------------
ForceAgentOpt = Annotated[bool, typer.Option(
    "--force-agent", help="Use --agent even when it is not the agent the run was recorded with "
                          "(same agent under a new name or tools).")]
MaxRolloutsOpt = Annotated[int, typer.Option(
    "--max-rollouts", min=1, help="Refuse more rollouts than this in one arm (raise it "
                                  "knowingly).")]


@app.command()
@_errors
def intervene(run_id: Annotated[str, typer.Argument(help="Run id.")],
              agent: AgentOpt,
              do: Annotated[list[str], typer.Option(
                  "--do", help="resample:K | action:K:JSON | observation:K:JSON | "
                               "context:K:MODULE:FUNCTION (repeatable).")],
              outcome: OutcomeOpt = None,
              rollouts: Annotated[int, typer.Option(
                  "--rollouts", help="Branches to run.")] = defaults.CLI_INTERVENE_ROLLOUTS,
              budget: Annotated[int | None, typer.Option(
                  "--budget", help="Cap on the rollouts actually run.")] = None,
              seed: Annotated[int, typer.Option(
                  "--seed", help="Seed of the branches' noise (default 0).")] = 0,
              force_agent: ForceAgentOpt = False,
              max_rollouts: MaxRolloutsOpt = defaults.MAX_ROLLOUTS,
              store: StoreOpt = "car.db", json_out: JsonOpt = False,
              progress: ProgressOpt = None) -> None:
    """Apply do(·) to a stored run and estimate P(failure) from re-run branches."""
    _check_seed(seed)
    interventions = [kit.parse_do(spec) for spec in do]
    if rollouts < 1:
        raise InvalidInput(f"--rollouts {rollouts}: need at least one", hint="e.g. --rollouts 32")
    if budget is not None and budget < 1:
        raise InvalidInput(f"--budget {budget} cannot pay for any rollout",
                           hint="give a positive number of rollouts, e.g. --budget 64")
    check_bound(rollouts if budget is None else min(rollouts, budget), max_rollouts,
                "--rollouts" if budget is None or rollouts <= budget else "--budget",
                "--max-rollouts")
    db = kit.existing_store(store)
    run = db.load(run_id)
    db.close()
    the_agent, the_outcome = kit.load_agent_and_outcome(agent, outcome)
    planned = rollouts if budget is None else min(rollouts, budget)
    bar = kit.make_progress(progress, "intervene", planned, budget)
    try:
        dist = run_intervene(run, the_agent, interventions, outcome=the_outcome,
                             rollouts=rollouts, seed=seed, progress=bar or False,
                             budget=budget, force_agent=force_agent,
                             keep_trajectories=False)  # nothing is stored: keep the outcomes
    except KeyboardInterrupt:
        raise _fail("interrupted; no result was kept (car intervene stores nothing)",
                    kit.INTERRUPTED) from None
    finally:
        if bar:
            bar.close()
    if json_out:
        _print_json(dist.to_dict())
    else:
        out.print(Text(kit.safe(f"do({', '.join(do)}) on run {run.id}: {dist}")))
    if dist.truncated:
        raise typer.Exit(kit.BUDGET)


# -- attribute ---------------------------------------------------------------------------------
class Method(StrEnum):
    contrastive = "contrastive"
    shapley = "shapley"


class Search(StrEnum):
    """The contrastive search strategies (``car.contrastive(search=...)``)."""

    auto = "auto"
    full = "full"
    bisection = "bisection"


class ExecutorName(StrEnum):
    sequential = "sequential"
    async_ = "async"
    ray = "ray"


def _executor(name: ExecutorName | None, concurrency: int, address: str | None) -> Any:
    """None lets the estimator choose (sequential for in-process agents, async for model-backed
    ones); otherwise the named backend."""
    if name is None:
        return None
    return make_executor(name.value, concurrency=concurrency, address=address)


@app.command()
@_errors
def attribute(
        run_id: Annotated[str, typer.Argument(help="Run id of the failing run.")],
        agent: AgentOpt,
        outcome: OutcomeOpt = None,
        method: Annotated[Method, typer.Option(
            "--method", help="contrastive: the step that caused the failure; shapley: each "
                             "step's share of it.")] = Method.contrastive,
        rollouts: Annotated[int | None, typer.Option(
            "--rollouts",
            help=f"contrastive: K, a budget of n·K rollouts for an n-step run (default "
                 f"{defaults.ROLLOUTS}).")] = None,
        budget: Annotated[int | None, typer.Option(
            "--budget", help="Total rollouts (contrastive: a cap; shapley: default "
                             f"{defaults.SHAPLEY_BUDGET}).")] = None,
        alpha: Annotated[float | None, typer.Option(
            "--alpha", help=f"Family-wise error rate (default {defaults.ALPHA}; on --resume "
                            "the attribution's).")] = None,
        search: Annotated[Search | None, typer.Option(
            "--search", help="contrastive: how the steps are searched (auto: bisection; full: "
                             "every step tested; on --resume the attribution's).")] = None,
        max_tokens: Annotated[int | None, typer.Option(
            "--max-tokens", min=1, help="Stop before the branches spend more model tokens than "
                                        "this (on --resume the attribution's).")] = None,
        max_cost: Annotated[float | None, typer.Option(
            "--max-cost", help="Stop before the branches spend more money than this: steps' "
                               "own reported cost, else tokens at --price (on --resume the "
                               "attribution's).")] = None,
        price: Annotated[list[str] | None, typer.Option(
            "--price", metavar="MODEL=IN:OUT",
            help="Price of a model per million input and output tokens, for --max-cost "
                 "(repeatable), e.g. --price gpt-4o-mini=0.15:0.60.")] = None,
        price_file: Annotated[Path | None, typer.Option(
            "--price-file", help='JSON prices for --max-cost: {"MODEL": [IN, OUT], ...} per '
                                 "million tokens.")] = None,
        max_seconds: Annotated[float | None, typer.Option(
            "--max-seconds", help="Stop starting branches after this many seconds of wall time "
                                  "(on --resume the attribution's).")] = None,
        seed: Annotated[int | None, typer.Option(
            "--seed", help="Default 0; on --resume the attribution's.")] = None,
        executor: Annotated[ExecutorName | None, typer.Option(
            "--executor", help="How branches run (default: chosen for the agent).")] = None,
        concurrency: Annotated[int, typer.Option(
            "--concurrency", min=1,
            help="Branches in flight (async, ray).")] = defaults.CONCURRENCY,
        ray_address: Annotated[str | None, typer.Option(
            "--ray-address", help="Ray cluster to use with --executor ray.")] = None,
        resume: Annotated[str | None, typer.Option(
            "--resume", metavar="ATTRIBUTION_ID",
            help="Continue an interrupted attribution; finished branches are not re-run.")] = None,
        force_agent: ForceAgentOpt = False,
        max_rollouts: MaxRolloutsOpt = defaults.MAX_ROLLOUTS,
        max_budget: Annotated[int, typer.Option(
            "--max-budget", min=1, help="Refuse an attribution that may run more rollouts "
                                        "than this in all (raise it knowingly).")
        ] = defaults.MAX_BUDGET,
        replace: Annotated[bool, typer.Option(
            "--replace", help="With --resume: let a smaller --rollouts or --budget replace "
                              "the finished attribution's result.")] = False,
        inside_locus: Annotated[bool, typer.Option(
            "--what", help="Then look inside the locus: which message, tool result or document "
                           "it decided from caused the failure (`car what` at the locus, "
                           f"{defaults.CONTEXT_ROLLOUTS} rollouts more).")] = False,
        explain: Annotated[bool, typer.Option(
            "--explain", help="Also print how the answer was measured: the test, its level, "
                              "the sample sizes, the pairing, every arm.")] = False,
        store: StoreOpt = "car.db", json_out: JsonOpt = False,
        progress: ProgressOpt = None) -> None:
    """Find the step that caused the failure (contrastive) or split the blame (shapley).
    The result and every branch are kept in the store. On --resume, the settings left out
    (--rollouts, --budget, --alpha, --seed) are the attribution's own; a smaller --rollouts or
    --budget than a finished attribution's replaces its result only with --replace."""
    reader = kit.existing_store(store)  # read-only first: a damaged store is refused untouched
    try:
        run = reader.load(run_id)
        earlier = _stored(reader, resume) if resume is not None else None
    finally:
        reader.close()
    stored = dict(earlier.params) if earlier is not None else {}
    settings = _settings(method, stored, len(run.steps), rollouts=rollouts, budget=budget,
                         alpha=alpha, seed=seed)
    settings = _with_caps(settings, stored, search=search, tokens=max_tokens, cost=max_cost,
                          seconds=max_seconds, prices=kit.parse_prices(price or [], price_file))
    _check_size(settings, len(run.steps), max_rollouts, max_budget)
    if earlier is not None and earlier.result is not None and not replace \
            and earlier.method == method.value:
        _check_not_shrunk(settings, _settings(method, stored, len(run.steps), rollouts=None,
                                              budget=None, alpha=None, seed=None),
                          len(run.steps), earlier)
    db = RunStore(store)
    the_agent, the_outcome = kit.load_agent_and_outcome(agent, outcome)
    exe = _executor(executor, concurrency, ray_address)
    if resume is not None:
        # the API's rule (caps may change, seed and alpha may not), checked here with the
        # flags' names in its messages; a missing attribution is an error, not a new one
        fixed: dict[str, Any] = {"seed": settings.seed, **(
            {"level": settings.level} if isinstance(settings, ShapleySettings)
            else {"alpha": settings.alpha})}
        check_resumable(db, resume, run.id, method.value, fixed, must_exist=True, flags=True)
    aid = resume or uuid.uuid4().hex[:16]
    # the estimator's own rule for what it may spend: the bar's total, and its cap when the
    # user (or the attribution resumed) gave one
    planned = settings.budget_for(len(run.steps))
    cap = planned if isinstance(settings, ShapleySettings) else (
        settings.budget.rollouts if isinstance(settings.budget, Budget) else settings.budget)
    bar = kit.make_progress(progress, f"{method.value} {run.id}", planned, cap)
    started = time.monotonic()
    try:
        result = settings.run(run, the_agent, the_outcome, progress=bar or False, executor=exe,
                              store=db, attribution_id=aid, force_agent=force_agent)
        if bar:
            bar.done()
    except BaseException as exc:  # every abnormal stop says how to resume
        if bar:
            bar.close()
        code, what = _stopped(exc)
        if code is None:
            raise
        if code == kit.CLOSED_PIPE:  # nobody is reading: end as quietly as `git log | head`
            raise typer.Exit(code) from None
        err.print(Text(kit.safe(f"car: error: {what}")), soft_wrap=True)
        if not kit.resumable(exc):  # a resume would stop the same way: no hint, no empty row
            db.drop_empty_attribution(aid)
        elif db.attribution_exists(aid):  # refused before it started: nothing to resume
            err.print(Text(kit.safe(f"the branches that finished are kept in {store} "
                                    f"(attribution {aid}). Resume with:\n  "
                                    f"{_resume_command(aid)}")), soft_wrap=True)
        raise typer.Exit(code) from None
    finally:
        if bar:
            bar.close()
    if not json_out:
        _print_result(result, time.monotonic() - started, store, run, explain)
    inside = None
    if (inside_locus and isinstance(result, ContrastiveResult) and result.locus is not None
            and isinstance(settings, ContrastiveSettings)):
        inside = _context.look_inside(run, result.locus, the_agent, the_outcome,
                                      alpha=settings.alpha, seed=settings.seed,
                                      force_agent=force_agent)
    if json_out:
        _print_json({**result.to_dict(), "summary": kit.verdict(result, _decider(result, run)),
                     **({"explain": result.explain(_decider(result, run))} if explain else {}),
                     **({"what": inside.to_dict()} if inside else {})})
    elif inside is not None:
        out.print(Text(kit.safe(str(inside))))
    undecided = isinstance(result, ContrastiveResult) and result.answer == Answer.UNDECIDED
    if result.truncated:
        what = "undecided" if undecided else "the budget ran out"
        more = result.larger_budget().get("rollouts")
        err.print(Text(kit.safe(f"{what} (attribution {aid}); to continue, resume with a larger "
                                f"budget:\n  {_resume_command(aid, more)}")), soft_wrap=True)
        raise typer.Exit(kit.BUDGET)
    nothing = (result.locus is None if isinstance(result, ContrastiveResult)
               else bool(result.reason))
    if nothing and result.failures:  # the agent broke on branches: as `car intervene` says
        first = result.failures[0]
        why = (f"{len(result.failures)} branch(es) failed after a retry; the first (arm "
               f"{first.get('arm')}, rollout {first.get('rollout')}): {first.get('error')}")
        if undecided:
            err.print(Text(kit.safe(f"undecided (attribution {aid}): {why}; fix the agent and "
                                    f"resume with:\n  {_resume_command(aid)}")), soft_wrap=True)
        else:
            err.print(Text(kit.safe(f"car: error: nothing could be attributed: {why}. Fix the "
                                    "agent and run again")), soft_wrap=True)
        raise typer.Exit(kit.AGENT)
    if nothing:
        raise typer.Exit(kit.NOTHING)


def _stopped(exc: BaseException) -> tuple[int | None, str]:
    """Exit code and message of an attribution that stopped early (None: not ours to
    handle, e.g. typer's own exit)."""
    if isinstance(exc, KeyboardInterrupt):
        return kit.INTERRUPTED, "interrupted"
    if isinstance(exc, kit.OutputClosed):
        return kit.CLOSED_PIPE, ""
    if isinstance(exc, MemoryError):
        return kit.BUDGET, OUT_OF_MEMORY
    if isinstance(exc, CarError):
        return kit.exit_code(exc), str(exc)
    if isinstance(exc, SystemExit):
        return kit.AGENT, kit.exited(exc)
    if isinstance(exc, sqlite3.Error):
        return kit.STORE, f"the store failed: {exc}"
    if isinstance(exc, Exception) and not isinstance(exc, (typer.Exit, typer.Abort)):
        if os.environ.get("CAR_DEBUG"):
            return None, ""
        return kit.INTERNAL, (f"internal error: {type(exc).__name__}: {str(exc)[:200]} (set "
                              "CAR_DEBUG=1 for the traceback and report it)")
    return None, ""


def _settings(method: Method, stored: dict[str, Any], n_steps: int, *, rollouts: int | None,
              budget: int | None, alpha: float | None, seed: int | None
              ) -> ContrastiveSettings | ShapleySettings:
    """The estimator's settings from the flags given (checked here, so errors name the
    flags), the rest from the attribution resumed (``stored``), else the defaults."""
    if seed is not None:
        _check_seed(seed)
    if alpha is not None and not 0.0 < alpha < 1.0:
        raise InvalidInput(f"--alpha {alpha} is outside (0, 1)", hint="e.g. --alpha 0.05")
    if rollouts is not None and rollouts < 1:
        raise InvalidInput(f"--rollouts {rollouts}: need at least one", hint="e.g. --rollouts 32")
    if budget is not None and budget < 1:
        raise InvalidInput(f"--budget {budget} cannot pay for any rollout",
                           hint="give a positive number of rollouts, e.g. --budget 500")
    if method is Method.shapley and rollouts is not None:
        raise InvalidInput("--rollouts applies to contrastive only",
                           hint="for shapley give the total with --budget B")
    if method is Method.contrastive:
        return ContrastiveSettings.resumed(stored, n_steps, rollouts=rollouts, alpha=alpha,
                                           seed=seed, budget=budget)
    return ShapleySettings.resumed(stored, n_steps, seed=seed, budget=budget,
                                   level=None if alpha is None else 1 - alpha)


def _with_caps(settings: ContrastiveSettings | ShapleySettings, stored: dict[str, Any], *,
               search: Search | None, tokens: int | None, cost: float | None,
               seconds: float | None, prices: dict[str, tuple[float, float]]
               ) -> ContrastiveSettings | ShapleySettings:
    """The settings with the search and the token, money and wall-time caps the flags give
    (``car.Budget``, as Python takes them), else the attribution resumed's, else none."""
    for flag, value in (("--max-cost", cost), ("--max-seconds", seconds)):
        if value is not None and not value > 0:
            raise InvalidInput(f"{flag} {value} cannot pay for anything",
                               hint=f"give {flag} a positive number, or leave it out for no cap")
    if search is not None and isinstance(settings, ShapleySettings):
        raise InvalidInput("--search applies to contrastive only",
                           hint="leave it out with --method shapley")
    if isinstance(settings, ContrastiveSettings):
        chosen = search.value if search is not None else stored.get("search")
        if isinstance(chosen, str) and chosen != settings.search:
            settings = replace(settings, search=chosen)
    stored_budget = stored.get("budget")
    before: dict[str, Any] = stored_budget if isinstance(stored_budget, dict) else {}
    tokens = tokens if tokens is not None else before.get("tokens")
    cost = cost if cost is not None else before.get("cost")
    seconds = seconds if seconds is not None else before.get("wall_time")
    if tokens is None and cost is None and seconds is None and not prices:
        return settings
    given = settings.budget
    rollouts = given.rollouts if isinstance(given, Budget) else given
    return replace(settings, budget=Budget(rollouts=rollouts, tokens=tokens, cost=cost,
                                           wall_time=seconds, prices=prices))


def _stored(reader: RunStore, aid: str) -> Attribution | None:
    """The attribution resumed: its settings, for a resume to take what its flags leave out
    (a resume continues what was started: leaving a flag out must not silently mean the
    default), and its result. A missing one is left for ``check_resumable`` to report."""
    try:
        return reader.attribution(aid)
    except AttributionNotFound:
        return None


def _planned(settings: ContrastiveSettings | ShapleySettings, n_steps: int) -> tuple[int, int]:
    """The most rollouts one arm and the whole attribution may run: contrastive runs at most
    K per arm and ``n·K`` in all, each under the rollout cap when one is given; Shapley its
    budget."""
    total = settings.budget_for(n_steps)
    if isinstance(settings, ShapleySettings):
        return total, total
    return min(settings.rollouts, total), min(n_steps * settings.rollouts, total)


def _check_size(settings: ContrastiveSettings | ShapleySettings, n_steps: int,
                max_rollouts: int, max_budget: int) -> None:
    """Refuse, before anything runs, sizes above the bounds (``defaults.MAX_ROLLOUTS``,
    ``defaults.MAX_BUDGET``) the user has not raised."""
    arm, total = _planned(settings, n_steps)
    if isinstance(settings, ContrastiveSettings):
        capped = isinstance(settings.budget, (Budget, int)) and total < n_steps * settings.rollouts
        check_bound(arm, max_rollouts, "--budget" if capped and arm < settings.rollouts
                    else "--rollouts", "--max-rollouts")
        check_bound(total, max_budget, "--budget" if capped else
                    f"--rollouts {settings.rollouts} over {n_steps} steps", "--max-budget")
    else:
        check_bound(total, max_budget, "--budget", "--max-budget")


def _check_not_shrunk(settings: ContrastiveSettings | ShapleySettings,
                      before: ContrastiveSettings | ShapleySettings, n_steps: int,
                      earlier: Attribution) -> None:
    """A resume of an attribution that has a result, with a smaller rollout count or budget
    than it had, would replace that result with one from fewer rollouts: refused (the earlier
    result kept) unless ``--replace``."""
    now, then = _planned(settings, n_steps), _planned(before, n_steps)
    if now[0] >= then[0] and now[1] >= then[1]:
        return
    assert earlier.result is not None
    flag = ("--rollouts" if isinstance(settings, ContrastiveSettings)
            and settings.rollouts < getattr(before, "rollouts", 0) else "--budget")
    raise InvalidInput(f"attribution {earlier.id} already has a {earlier.status} result from "
                       f"{earlier.result.rollouts_used} rollouts; this {flag} allows at most "
                       f"{now[1]} (it allowed {then[1]}) and would replace it",
                       hint="resume with its own settings or larger, or pass --replace to "
                            "replace its result knowingly")


def _resume_command(aid: str, budget: int | None = None) -> str:
    """The command line that was run, with ``--resume AID`` (replacing any earlier one) and,
    given ``budget``, ``--budget BUDGET`` in place of the one it had."""
    argv = list(sys.argv[1:])
    for flag in ("--resume", *(("--budget",) if budget is not None else ())):
        argv = [a for a in argv if not a.startswith(f"{flag}=")]
        while flag in argv:
            i = argv.index(flag)
            del argv[i:i + 2]
    tail = ["--budget", str(budget)] if budget is not None else []
    return shlex.join(["car", *argv, *tail, "--resume", aid])


def _decider(r: Result, run: Any) -> str | None:
    """Who decided the step the answer names (the locus, or an undecided search's candidate)."""
    step = getattr(r, "locus", None)
    if step is None:
        step = getattr(r, "candidate", None)
    return agent_of(run, step) if step is not None else None


def _print_result(r: Result, seconds: float, store: str, run: Any = None,
                  explain: bool = False) -> None:
    """The answer first (one plain sentence), then each step's row, then what it cost; the
    method, its level, the sample sizes and the coupling with ``explain``."""
    who = _decider(r, run) if run is not None else None
    out.print(Text(kit.verdict(r, who), style="bold"))
    out.print(kit.attribution_table(r))
    out.print(Text(f"{r.rollouts_used} rollouts in {seconds:.1f}s · seed {r.seed} · "
                   f"attribution {r.attribution_id}"))
    if r.truncated:
        out.print(Text(f"truncated: {r.budget_note or 'budget reached'}", style="yellow"))
    if r.failures:
        first = r.failures[0]
        out.print(Text(kit.safe(f"{len(r.failures)} failed branch(es) left out of the estimate "
                                f"(first: arm {first.get('arm')}, rollout {first.get('rollout')}"
                                f": {first.get('error')})"), style="yellow"))
    for caveat in r.caveats:  # what the agent said every result must show
        out.print(Text(kit.safe(f"caveat: {caveat}"), style="yellow"))
    if explain:
        out.print(Text(kit.safe(r.explain(who))))
    else:
        out.print(Text("how this was measured (test, level, sample sizes, pairing): add "
                       "--explain, or see the report", style="dim"))
    out.print(Text(kit.safe(f"report: car report {shlex.quote(str(r.run_id))} --store "
                            f"{shlex.quote(store)} --out report.html"), style="dim"))


# -- report / attributions ----------------------------------------------------------------------
@app.command()
@_errors
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
    an index page across the store's runs and attributions, linking to a report of each."""
    if every:
        if run_id is not None or attribution is not None or method is not None:
            raise InvalidInput("--all writes every run's report; it takes no RUN_ID, "
                               "--attribution or --method",
                               hint="drop them, or drop --all to write one run's report")
        written = write_index(kit.existing_store(store), out_path or Path("car-report"), store)
        out.print(Text(kit.safe(f"wrote {written.index} ({written.runs} run(s), "
                                f"{written.attributions} attribution(s), {written.pages} "
                                f"report(s) beside it)")))
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
    try:
        out_path.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot write {out_path}: {exc.strerror}",
                           hint="pass --out a writable path") from None
    out.print(Text(kit.safe(f"wrote {out_path} ({note})")))


@app.command()
@_errors
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
                     "status": str(a.status),
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
        _print_json(rows)
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
            more = res.larger_budget().get("rollouts")
            out.print(Text(kit.safe(
                f"{r['id']} is {kit.answer_cell(res)}; to continue, resume it with a larger "
                f"budget: car attribute {r['run_id']} --agent MODULE:FACTORY --method "
                f"{r['method']}" + (f" --budget {more}" if more else "")
                + f" --store {store} --resume {r['id']}")), soft_wrap=True)


# -- demo ---------------------------------------------------------------------------------------
class DemoPolicy(StrEnum):
    local = "local"
    synthetic = "synthetic"


def _builtin_demo(store: str, report_path: Path, progress: Any) -> Any:
    """A failing run of the planted pivot model, attributed and reported: works anywhere."""

    from car_core.testing import synthetic
    model = synthetic.pivot()
    with RunStore(store) as db:
        run = model.failing_run()
        db.save(run)
        out.print(Text(f"recorded failing run {run.id} of the synthetic pivot model "
                       f"({len(run.steps)} steps) in {store}"))
        bar = kit.make_progress(progress, "contrastive", len(run.steps) * defaults.ROLLOUTS,
                                 None)
        started = time.monotonic()
        try:
            result = car.contrastive(run, model.agent(), outcome=model.outcome,
                                     rollouts=defaults.ROLLOUTS,
                                     seed=0, store=db, progress=bar or False)
            if bar:
                bar.done()
        finally:
            if bar:
                bar.close()
        _print_result(result, time.monotonic() - started, store, run)
        aid = result.attribution_id
        branches = list(db.branches(aid)) if aid else None
    report_path.write_text(render_attribution(result, run=run, branches=branches),
                           encoding="utf-8")
    out.print(Text(f"wrote {report_path}; re-run it with: car attribute {run.id} "
                   f"--agent car_core.synthetic:pivot --store {store}"))
    return result


@app.command()
@_errors
def demo(policy: Annotated[DemoPolicy, typer.Option(
             "--policy", help="local: the embedded model; synthetic: a planted model.")]
         = DemoPolicy.local,
         store: StoreOpt = "car.db",
         out_path: Annotated[Path, typer.Option("--out", help="HTML report to write.")] = Path(
             "report.html"),
         progress: ProgressOpt = None) -> None:
    """Record a failing agent run, find the step that caused it, write the report."""
    try:
        module = importlib.import_module("car_adapters.demo")
    except ModuleNotFoundError as exc:
        if exc.name not in ("car_adapters", "car_adapters.demo"):
            raise InvalidInput(f"the demo needs {exc.name!r}, which is not installed",
                               hint="pip install 'causal-agent-replay[all]', or run "
                                    "`car demo --policy synthetic`") from None
        module = None
    if module is None:
        if policy is DemoPolicy.local:
            err.print("the local-model demo is not installed; running the synthetic demo")
        _builtin_demo(store, out_path, progress)
        return
    show_bar = progress if progress is not None else sys.stderr.isatty()
    module.run_demo(policy=policy.value, store=store, report=str(out_path), progress=show_bar)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``car`` console script; returns the exit status. A usage error is
    one line (with where to read the help), like every other error."""
    try:  # typer >= 0.20 vendors click; older ones use it directly
        from typer._click import exceptions as cx
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click import exceptions as cx  # type: ignore[no-redef]
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _unraisable_hook(previous_hook)
    previous_term = _on_sigterm()
    try:
        return _main(argv, cx)
    finally:
        sys.unraisablehook = previous_hook
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a CI runner's timeout), raised where the command is so that it
    unwinds as a Ctrl-C does: every ``finally`` runs (a read's private copy of the store is
    removed, an attribution's lease freed, its branches kept for a resume) instead of the
    process vanishing mid-way."""


def _on_sigterm() -> Any:
    """Turn SIGTERM into ``Terminated`` while the command runs (main thread only, where
    Python delivers signals); the handler it replaced, to restore, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminated(signum: int, frame: Any) -> None:
        raise Terminated()

    try:
        return signal.signal(signal.SIGTERM, terminated)
    except (ValueError, OSError):  # an embedding that owns its signals
        return None


def _unraisable_hook(previous: Callable[[Any], Any]) -> Callable[[Any], None]:
    """An error in a finalizer while the command runs: a MemoryError there is the one the
    command already reports (printing it would need memory too, and its failure would print
    "Exception ignored in sys.unraisablehook"); anything else goes to the usual hook, whose
    own failure is dropped rather than printed."""
    def hook(info: Any) -> None:
        if isinstance(info.exc_value, MemoryError) or info.exc_type is MemoryError:
            return
        try:
            previous(info)
        except BaseException:  # a hook must never raise
            pass
    return hook


def _main(argv: list[str] | None, cx: Any) -> int:
    try:
        code = app(args=argv, prog_name="car", standalone_mode=False)
    except cx.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `car`: the help, as a usage error
            exc.show()
            return kit.USAGE
        name = exc.ctx.command_path if exc.ctx is not None else "car"
        err.print(Text(kit.safe(f"car: error: {exc.format_message()} (see `{name} --help`)")),
                  soft_wrap=True)
        return kit.USAGE
    except cx.ClickException as exc:
        err.print(Text(kit.safe(f"car: error: {exc.format_message()}")), soft_wrap=True)
        return int(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err.print(Text("car: error: interrupted"))
        return kit.INTERRUPTED
    except MemoryError:
        err.print(Text(f"car: error: {OUT_OF_MEMORY}"))
        return kit.BUDGET
    except kit.OutputClosed:
        return kit.CLOSED_PIPE
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return code if isinstance(code, int) else 0


from car_core.cli import context as _context  # noqa: E402  (what / fix / export)

_context.register(sys.modules[__name__])
