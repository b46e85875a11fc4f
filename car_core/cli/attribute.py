"""``car attribute``: find the step that caused a run's failure (contrastive) or split the blame
(Shapley), keeping the result and every branch in the store. Settings come from the flags, else
from the attribution resumed, else the defaults; sizes past the bounds are refused before
anything runs, and every abnormal stop says how to resume."""

from __future__ import annotations

import shlex
import time
import uuid
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from car_core import defaults
from car_core.assertions import agent_of
from car_core.cli import kit
from car_core.cli.app import (
    AgentOpt,
    ForceAgentOpt,
    JsonOpt,
    MaxRolloutsOpt,
    OutcomeOpt,
    ProgressOpt,
    StoreOpt,
    check_seed,
    ending,
    err,
    errors,
    out,
    print_json,
    say,
)
from car_core.cli.context import look_inside
from car_core.engine.execution import default_executor
from car_core.errors import AttributionNotFound, InvalidInput
from car_core.estimators._session import check_resumable, check_run_has_steps
from car_core.estimators.settings import ContrastiveSettings, ShapleySettings
from car_core.model.budget import Budget, check_bound
from car_core.model.vocabulary import Answer
from car_core.results import ContrastiveResult, Result
from car_core.store import Attribution, RunStore


class Method(StrEnum):
    contrastive = "contrastive"
    shapley = "shapley"


class Search(StrEnum):
    """The contrastive search strategies (``car.contrastive(search=...)``)."""

    auto = "auto"
    full = "full"
    bisection = "bisection"


@errors
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
        indifference: Annotated[float | None, typer.Option(
            "--indifference",
            help="contrastive: the least rescue a step after the locus must show to move it; "
                 f"smaller ones are ruled out (default {defaults.INDIFFERENCE}; on --resume "
                 "the attribution's).")] = None,
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
        executor: kit.ExecutorOpt = None,
        concurrency: kit.ConcurrencyOpt = None,
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
        action_key: Annotated[str | None, typer.Option(
            "--action-key", metavar="MODULE:FUNCTION",
            help="contrastive: group what the agent did instead by FUNCTION(action) -> str "
                 "(default: tool calls by name and canonical arguments, a reply by its "
                 "text).")] = None,
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
    if replace and resume is None:  # it would be read as "start over", which it is not
        raise InvalidInput("--replace only lets a --resume replace a finished result",
                           hint="add --resume ATTRIBUTION_ID, or leave --replace out (a new "
                                "attribution replaces nothing)")
    reader = kit.existing_store(store)  # read-only first: a damaged store is refused untouched
    try:
        run = reader.load(run_id)
        earlier = _stored(reader, resume) if resume is not None else None
    finally:
        reader.close()
    # an empty run (stopped before its first step) is named as such before any budget: its
    # n·K is 0, which no flag gave, and nothing can be attributed whatever the flags say
    check_run_has_steps(run)
    stored = dict(earlier.params) if earlier is not None else {}
    settings = _settings(method, stored, len(run.steps), rollouts=rollouts, budget=budget,
                         alpha=alpha, seed=seed)
    settings = _with_caps(settings, stored, search=search, indifference=indifference,
                          tokens=max_tokens, cost=max_cost,
                          seconds=max_seconds, prices=kit.parse_prices(price or [], price_file))
    settings = _with_action_key(settings, action_key)
    _check_size(settings, len(run.steps), max_rollouts, max_budget)
    if earlier is not None and earlier.result is not None and not replace \
            and earlier.method == method.value:
        _check_not_shrunk(settings, _settings(method, stored, len(run.steps), rollouts=None,
                                              budget=None, alpha=None, seed=None),
                          len(run.steps), earlier)
    db = RunStore(store)
    the_agent, the_outcome = kit.load_agent_and_outcome(agent, outcome)
    exe = kit.chosen_executor(executor, concurrency, ray_address)
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
    started, cpu = time.monotonic(), time.process_time()
    try:
        # the flags' bounds and --replace were checked above; the API checks them again
        bounds: dict[str, Any] = {"max_budget": max_budget, "replace": replace}
        if isinstance(settings, ContrastiveSettings):
            bounds["max_rollouts"] = max_rollouts
        result = settings.run(run, the_agent, the_outcome, progress=bar or False, executor=exe,
                              store=db, attribution_id=aid, force_agent=force_agent, **bounds)
        if bar:
            bar.done(truncated=bool(getattr(result, "truncated", False)))
    except BaseException as exc:  # every abnormal stop says how to resume
        if bar:
            bar.close()
        end = ending(exc, "the store failed")
        if end is None:
            raise
        if not end.message:  # nobody is reading: end as quietly as `git log | head`
            raise typer.Exit(end.code) from None
        # refused before it started, there is nothing to resume; else the resume is said once,
        # by the full command below
        offered = kit.resumable(exc) and db.attribution_exists(aid)
        say(kit.resume_below(end.message, exc) if offered else end.message)
        if not kit.resumable(exc):  # a resume would stop the same way: no hint, no empty row
            db.drop_empty_attribution(aid)
        elif offered:
            err.print(Text(kit.safe(f"the branches that finished are kept in {store} "
                                    f"(attribution {aid}). Resume with:\n  "
                                    f"{kit.resume_command(aid)}")), soft_wrap=True)
        raise typer.Exit(end.code) from None
    finally:
        if bar:
            bar.close()
    if not json_out:
        seconds = time.monotonic() - started
        print_result(result, seconds, store, run, explain)
        hint = kit.waiting_hint(default_executor(the_agent), exe, seconds,
                                time.process_time() - cpu)
        if hint:
            err.print(Text(kit.safe(hint), style="yellow"), soft_wrap=True)
    if (uncounted := kit.uncounted_caps(result.params, result.tokens, result.cost,
                                        result.rollouts_used)):
        err.print(Text(kit.safe(uncounted), style="yellow"), soft_wrap=True)
    inside = None
    if (inside_locus and isinstance(result, ContrastiveResult) and result.locus is not None
            and isinstance(settings, ContrastiveSettings)):
        inside = look_inside(run, result.locus, the_agent, the_outcome,
                                      alpha=settings.alpha, seed=settings.seed,
                                      force_agent=force_agent)
    if json_out:
        print_json({**result.to_dict(), "summary": kit.verdict(result, _decider(result, run)),
                     **({"explain": result.explain(_decider(result, run))} if explain else {}),
                     **({"what": inside.to_dict()} if inside else {})})
    elif inside is not None:
        out.print(Text(kit.safe(str(inside))))
    undecided = isinstance(result, ContrastiveResult) and result.answer == Answer.UNDECIDED
    # undecided with budget left (a full search whose intervals still reach Δ): more re-runs
    # decide it as a truncated one's do; it exited 1, "nothing attributable", with no way on
    if result.truncated or (undecided and not result.failures):
        what = "undecided" if undecided else "the budget ran out"
        more = result.larger_budget()
        err.print(Text(kit.safe(f"{what} (attribution {aid}); to continue, resume with a larger "
                                f"budget:\n  {kit.resume_command(aid, more)}")), soft_wrap=True)
        raise typer.Exit(kit.BUDGET)
    nothing = (result.locus is None if isinstance(result, ContrastiveResult)
               else bool(result.reason))
    if nothing and result.failures:  # the agent broke on branches: as `car intervene` says
        first = result.failures[0]
        why = (f"{len(result.failures)} branch(es) failed after a retry; the first (arm "
               f"{first.get('arm')}, rollout {first.get('rollout')}): {first.get('error')}")
        if undecided:
            err.print(Text(kit.safe(f"undecided (attribution {aid}): {why}; fix the agent and "
                                    f"resume with:\n  {kit.resume_command(aid)}")), soft_wrap=True)
        else:
            err.print(Text(kit.safe(f"car: error: nothing could be attributed: {why}. Fix the "
                                    "agent and run again")), soft_wrap=True)
        raise typer.Exit(kit.AGENT)
    if nothing:
        raise typer.Exit(kit.NOTHING)


def _settings(method: Method, stored: dict[str, Any], n_steps: int, *, rollouts: int | None,
              budget: int | None, alpha: float | None, seed: int | None
              ) -> ContrastiveSettings | ShapleySettings:
    """The estimator's settings from the flags given (checked here, so errors name the
    flags), the rest from the attribution resumed (``stored``), else the defaults."""
    if seed is not None:
        check_seed(seed)
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
               seconds: float | None, prices: dict[str, tuple[float, float]],
               indifference: float | None = None) -> ContrastiveSettings | ShapleySettings:
    """The settings with the search and the token, money and wall-time caps the flags give
    (``car.Budget``, as Python takes them), else the attribution resumed's, else none."""
    for flag, value in (("--max-cost", cost), ("--max-seconds", seconds)):
        if value is not None and not value > 0:
            raise InvalidInput(f"{flag} {value} cannot pay for anything",
                               hint=f"give {flag} a positive number, or leave it out for no cap")
    for flag, set_by in (("--search", search), ("--indifference", indifference)):
        if set_by is not None and isinstance(settings, ShapleySettings):
            raise InvalidInput(f"{flag} applies to contrastive only",
                               hint="leave it out with --method shapley")
    if isinstance(settings, ContrastiveSettings):
        chosen = search.value if search is not None else stored.get("search")
        if isinstance(chosen, str) and chosen != settings.search:
            settings = replace(settings, search=chosen)
        if indifference is not None:
            settings = replace(settings, indifference=indifference)
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


def _with_action_key(settings: ContrastiveSettings | ShapleySettings, spec: str | None
                     ) -> ContrastiveSettings | ShapleySettings:
    """The settings grouping re-drawn actions by the user's ``MODULE:FUNCTION`` (loaded as
    --agent is; the estimator then checks it on every recorded action before any rollout).
    A function is not stored, so a resume groups by the default unless it is given again."""
    if spec is None:
        return settings
    if isinstance(settings, ShapleySettings):
        raise InvalidInput("--action-key applies to contrastive only",
                           hint="leave it out with --method shapley")
    key = kit.load_object(spec, "action-key")
    if not callable(key):
        raise InvalidInput(f"--action-key {spec!r} is not callable",
                           hint="point it at a function action -> str")
    return replace(settings, action_key=key)


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
    return min(settings.rollouts, total), total  # a rollout budget replaces n·K as the cap


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


def _decider(r: Result, run: Any) -> str | None:
    """Who decided the step the answer names (the locus, or an undecided search's candidate)."""
    step = getattr(r, "locus", None)
    if step is None:
        step = getattr(r, "candidate", None)
    return agent_of(run, step) if step is not None else None


def print_result(r: Result, seconds: float, store: str, run: Any = None,
                  explain: bool = False) -> None:
    """The answer first (one plain sentence), then each step's row, then what it cost; the
    method, its level, the sample sizes and the coupling with ``explain``."""
    who = _decider(r, run) if run is not None else None
    out.print(Text(kit.verdict(r, who), style="bold"))
    out.print(kit.attribution_table(r, out.width))
    if isinstance(r, ContrastiveResult) and r.locus is not None and not explain:
        instead = r.alternatives_text(r.locus)  # with --explain: every tested step's, below
        if instead:
            out.print(Text(kit.safe(instead)))
    out.print(Text(f"{r.rollouts_used} rollouts in {seconds:.1f}s · seed {r.seed} · "
                   f"attribution {r.attribution_id}"))
    if r.truncated:
        out.print(Text(f"truncated: {r.budget_note or 'budget reached'}", style="yellow"))
    elif isinstance(r, ContrastiveResult) and (cut := r.cut_short()):
        out.print(Text(kit.safe(cut), style="dim"))  # decided first: nothing to resume
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
