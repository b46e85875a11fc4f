"""The ``car what``, ``car fix`` and ``car export pairs`` commands: what in a step's state caused
the failure, which fix works, and the pairs learned from it (``export_app``, the ``car export``
group). ``look_inside`` is ``car attribute --what``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from car_core import defaults
from car_core.cli import kit
from car_core.cli.app import (
    AgentNameOpt,
    AgentOpt,
    ForceAgentOpt,
    JsonOpt,
    OutcomeOpt,
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
from car_core.cli.fix_population import fix_many
from car_core.errors import InvalidInput
from car_core.estimators.context import context_attribution
from car_core.estimators.pairs import export_pairs
from car_core.estimators.repairs import add_instruction, guard_observation, remove_sources, repairs
from car_core.model.trajectory import Trajectory
from car_core.report import render_attribution, render_run
from car_core.report.pages import latest_attribution

StepOpt = Annotated[int | None, typer.Option(
    "--step", help="The step to look inside (default: the locus of the run's latest "
                   "attribution).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Root seed of the branches' noise.")]
AlphaOpt = Annotated[float, typer.Option(
    "--alpha", help="Family-wise error rate over the sources named / the repairs ranked.")]
RolloutsOpt = Annotated[int, typer.Option(
    "--rollouts", help="what: the whole budget; fix: rollouts per candidate at most.")]
SplitterOpt = Annotated[str | None, typer.Option(
    "--splitter", help="MODULE:FUNCTION cutting a source's text into segments (finer sources).")]
CandidatesOpt = Annotated[str | None, typer.Option(
    "--candidates", help="MODULE:FUNCTION; FUNCTION(run, step, state) returns the candidates "
                         "(interventions, car.Candidate or (label, interventions)).")]
InstructionOpt = Annotated[list[str] | None, typer.Option(
    "--instruction", help="A system-prompt line to try as a repair (repeatable).")]
ReportOpt = Annotated[Path | None, typer.Option(
    "--report", help="Also write the HTML report of the run with this panel.")]
GuardOpt = Annotated[list[str] | None, typer.Option(
    "--guard", help="J:JSON: try the tool result of step J replaced by JSON (repeatable).")]


def _load(run_id: str, store: str, step: int | None) -> tuple[Trajectory, int]:
    db = kit.existing_store(store)
    try:
        run = db.load(run_id)
        if step is None:
            found = latest_attribution(db.attributions(run_id), "contrastive")
            locus = getattr(found.result, "locus", None) if found is not None else None
            if locus is None:
                raise InvalidInput(f"run {run_id} has no attributed locus to look inside",
                                   run_id=run_id,
                                   hint="pass --step K, or run `car attribute` on it first")
            step = int(locus)
    finally:
        db.close()
    return run, step


def _write_report(run: Trajectory, store: str, path: Path, what: Any = None,
                  fixes: Any = None) -> None:
    """The run's report (its latest attribution, if any) with the "what" / "fixes" panels."""
    db = kit.existing_store(store)
    try:
        found = latest_attribution(db.attributions(run.id))
    finally:
        db.close()
    html = (render_attribution(found.result, run, what=what, fixes=fixes) if found is not None
            else render_run(run, what=what, fixes=fixes))
    path.write_text(html, encoding="utf-8")
    err.print(Text(kit.safe(f"report written to {path}")))


def _what(run: Trajectory, step: int, agent: Any, outcome: Any, *, rollouts: int, alpha: float,
          seed: int, splitter: str | None, force_agent: bool) -> Any:
    split = kit.load_object(splitter, "splitter") if splitter else None
    return context_attribution(run, agent, step=step, outcome=outcome, rollouts=rollouts,
                               alpha=alpha, seed=seed, splitter=split, force_agent=force_agent)


def look_inside(run: Trajectory, step: int, agent: Any, outcome: Any, *, alpha: float,
                seed: int, force_agent: bool) -> Any:
    """``car attribute --what``: the context attribution at the locus just found, with the
    budget ``car what`` uses by default."""
    return _what(run, step, agent, outcome, rollouts=defaults.CONTEXT_ROLLOUTS, alpha=alpha,
                 seed=seed, splitter=None, force_agent=force_agent)


@errors
def what(run_id: Annotated[str, typer.Argument(help="Run id.")], agent: AgentOpt,
         outcome: OutcomeOpt = None, step: StepOpt = None,
         rollouts: RolloutsOpt = defaults.CONTEXT_ROLLOUTS, alpha: AlphaOpt = defaults.ALPHA,
         seed: SeedOpt = 0, splitter: SplitterOpt = None, force_agent: ForceAgentOpt = False,
         report: ReportOpt = None, store: StoreOpt = "car.db", json_out: JsonOpt = False) -> None:
    """Which message, tool result or document the step decided from caused the failure:
    random ablations re-run through the agent, each source's effect with its interval."""
    check_seed(seed)
    run, k = _load(run_id, store, step)
    the_agent, the_outcome = kit.load_agent_and_outcome(agent, outcome)
    result = _what(run, k, the_agent, the_outcome, rollouts=rollouts, alpha=alpha, seed=seed,
                   splitter=splitter, force_agent=force_agent)
    if report is not None:
        _write_report(run, store, report, what=result)
    if json_out:
        print_json(result.to_dict())
    else:
        out.print(Text(kit.safe(str(result))))
    if not result.named:
        raise typer.Exit(kit.BUDGET if result.truncated else kit.NOTHING)


def _guard(spec: str) -> Any:
    j, sep, payload = spec.partition(":")
    if not sep or not j.strip().isdigit():
        raise InvalidInput(f"--guard {spec!r} is not J:JSON", hint='e.g. --guard 2:"no refund"')
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--guard {spec!r}: {payload!r} is not JSON",
                           hint='quote strings: --guard 2:\'"no refund"\'') from exc
    return guard_observation(int(j), value)


def _rank(run: Trajectory, k: int, agent: Any, outcome: Any, *, candidates: str | None,
          instructions: list[str], guards: list[str], rollouts: int, alpha: float, seed: int,
          force_agent: bool) -> tuple[Any, Any]:
    """The context attribution (when it picks the sources to remove) and the ranking."""
    cands: list[Any] = [add_instruction(k, text) for text in instructions]
    cands += [_guard(g) for g in guards]
    propose = kit.load_object(candidates, "candidates") if candidates else None
    what = None
    if not cands and propose is None:  # remove what the context attribution blames
        what = _what(run, k, agent, outcome, rollouts=rollouts, alpha=alpha, seed=seed,
                     splitter=None, force_agent=force_agent)
        named = [s.source for s in what.named]
        if not named:
            raise InvalidInput(f"no source at step {k} is shown to cause the failure, so there "
                               "is nothing to remove", run_id=run.id, step=k,
                               hint="pass candidates: --instruction, --guard or --candidates")
        cands = [remove_sources(k, [s]) for s in named]
        if len(named) > 1:
            cands.append(remove_sources(k, named))
    ranking = repairs(run, agent, step=k, candidates=cands, outcome=outcome, rollouts=rollouts,
                      alpha=alpha, seed=seed, propose=propose, force_agent=force_agent)
    return what, ranking


@errors
def fix(agent: AgentOpt, run_ids: Annotated[list[str] | None, typer.Argument(
            metavar="RUN_ID", show_default=False,
            help="Run id; with --runs, the runs of the population.")] = None,
        outcome: OutcomeOpt = None, step: StepOpt = None,
        candidates: CandidatesOpt = None, instruction: InstructionOpt = None,
        guard: GuardOpt = None,
        rollouts: Annotated[int | None, typer.Option(
            "--rollouts", show_default=False,
            help="Rollouts per candidate at most (one run); pairs per run and fix (a "
                 f"population). Default {defaults.REPAIR_ROLLOUTS}; on --resume the fix's.")
        ] = None,
        alpha: Annotated[float | None, typer.Option(
            "--alpha", show_default=False,
            help="Family-wise error rate over the repairs ranked (one run) or the fixes "
                 f"(a population). Default {defaults.ALPHA:g}; on --resume the fix's.")
        ] = None,
        seed: Annotated[int | None, typer.Option(
            "--seed", show_default=False,
            help="Root seed of the branches' noise. Default 0; on --resume the fix's.")
        ] = None,
        force_agent: ForceAgentOpt = False,
        pairs: Annotated[Path | None, typer.Option(
            "--pairs", help="Also write the validated repairs as car.pair/1 JSON lines.")] = None,
        report: ReportOpt = None,
        failed: Annotated[bool, typer.Option(
            "--failed", help="Test the fixes on every failed run in the store.")] = False,
        runs: Annotated[bool, typer.Option(
            "--runs", help="Test the fixes on the runs named (RUN_ID...).")] = False,
        system: Annotated[list[str] | None, typer.Option(
            "--system", help="Population: a system-prompt line in effect from step 0 "
                             "(repeatable).")] = None,
        policy: Annotated[list[str] | None, typer.Option(
            "--policy", metavar="MODULE:FACTORY",
            help="Population: another model or policy, FACTORY() deciding from step 0 "
                 "(repeatable).")] = None,
        from_step: Annotated[str | None, typer.Option(
            "--from-step", show_default=False,
            help="Population: branch each run from its locus, or from this step. Default "
                 "locus; on --resume the fix's.")] = None,
        triage: Annotated[str | None, typer.Option(
            "--triage", metavar="TRIAGE_ID",
            help="Population: take the loci from this stored triage (default: each run's "
                 "latest attribution, else attribute it).")] = None,
        budget: Annotated[int | None, typer.Option(
            "--budget", min=1, help="Population: total rollouts (finding loci included); on "
                                    "--resume the fix's when left out.")
        ] = None,
        resume: Annotated[str | None, typer.Option(
            "--resume", metavar="FIX_ID",
            help="Population: continue a fix; runs measured are read back, not re-run.")
        ] = None,
        runs_at_once: Annotated[int | None, typer.Option(
            "--runs-at-once", min=1, show_default=False,
            help="Population: runs tested at once (default: 4 for an agent that waits on a "
                 "model server, else 1); the result is the same whatever it is.")] = None,
        executor: kit.ExecutorOpt = None,
        concurrency: kit.ConcurrencyOpt = None,
        agent_name: AgentNameOpt = None, since: SinceOpt = None, until: UntilOpt = None,
        test: TestOpt = None, session: SessionOpt = None,
        progress: Annotated[bool | None, typer.Option(
            "--progress/--no-progress", help="Population: a line on stderr as each run is "
                                             "tested (default: when it is a terminal).")
        ] = None,
        store: StoreOpt = "car.db", json_out: JsonOpt = False) -> None:
    """Rank candidate repairs at the step by P(failure) with simultaneous intervals. Without
    candidates, the sources `car what` names are removed, one by one. With --failed or --runs:
    test each fix on a population, every run branched from its locus (from step 0 for
    --system and --policy) with and without it: the pooled rescue with an interval stratified
    by run, the runs it rescues and those it does not, and the cost against re-running them
    (`car export fix FIX_ID`). On a population, --instruction is added at each run's locus,
    --guard JSON replaces the tool result the locus saw, and --candidates names car.Fix
    values (or a function returning them)."""
    if seed is not None:
        check_seed(seed)
    ids = run_ids or []
    filters = {"agent_name": agent_name, "since": since, "until": until, "test": test,
               "session": session}
    if any(v is not None for v in filters.values()) and not failed:
        raise InvalidInput("--agent-name, --since, --until, --test and --session select "
                           "failed runs", hint="add --failed (the failed runs they select)")
    if failed or runs or resume is not None:
        if failed and ids:
            raise InvalidInput("--failed takes every failed run; it takes no RUN_ID",
                               hint="drop the run ids, or use --runs RUN_ID...")
        if step is not None or pairs is not None or report is not None:
            raise InvalidInput("--step, --pairs and --report are for one run",
                               hint="drop them on a population (each run uses its locus)")
        fix_many(ids, failed=failed, agent=agent, outcome=outcome,
                 instructions=instruction or [], systems=system or [], guards=guard or [],
                 policies=policy or [], candidates=candidates, rollouts=rollouts, alpha=alpha,
                 seed=seed, from_step=from_step, triage_id=triage, budget=budget,
                 resume=resume, force_agent=force_agent, store=store, json_out=json_out,
                 filters=filters, runs_at_once=runs_at_once, progress=progress,
                 executor=executor, concurrency=concurrency)
        return
    if len(ids) != 1:
        raise InvalidInput(f"car fix takes one RUN_ID, got {len(ids)}",
                           hint="name one run, or test a fix on many: --runs RUN_ID... or "
                                "--failed")
    given = [flag for flag, set_ in (
        ("--system", bool(system)), ("--policy", bool(policy)), ("--triage", bool(triage)),
        ("--budget", budget is not None), ("--from-step", from_step is not None),
        ("--runs-at-once", runs_at_once is not None),
        ("--progress" if progress else "--no-progress", progress is not None),
        ("--executor", executor is not None)) if set_]
    if given:
        # the flags typed, by the names typed: a trial's --no-progress was refused as
        # "--progress ... are for a population"
        raise InvalidInput(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for a "
                           "population (--system, --policy, --triage, --budget, --from-step, "
                           "--runs-at-once, --progress and --executor are)",
                           hint="add --runs (these runs) or --failed, or leave "
                                + ("it" if len(given) == 1 else "them") + " out")
    run, k = _load(ids[0], store, step)
    the_agent, the_outcome = kit.load_agent_and_outcome(agent, outcome)
    what, ranking = _rank(run, k, the_agent, the_outcome, candidates=candidates,
                          instructions=instruction or [], guards=guard or [],
                          rollouts=defaults.REPAIR_ROLLOUTS if rollouts is None else rollouts,
                          alpha=defaults.ALPHA if alpha is None else alpha,
                          seed=0 if seed is None else seed,
                          force_agent=force_agent)
    if pairs is not None:
        export_pairs([(run, ranking)], pairs)
    if report is not None:
        _write_report(run, store, report, what=what, fixes=ranking)
    if json_out:
        print_json({**ranking.to_dict(), "what": None if what is None else what.to_dict()})
    else:
        if what is not None:
            out.print(Text(kit.safe(str(what))))
        out.print(Text(kit.safe(str(ranking))))
    if not any(r.validated for r in ranking.ranked):
        raise typer.Exit(kit.NOTHING)


@errors
def export_pairs_command(
        run_id: Annotated[str, typer.Argument(help="Run id.")], agent: AgentOpt,
        out_path: Annotated[Path, typer.Option(
            "--out", help="JSONL file to write (car.pair/1 records, see the README).")],
        outcome: OutcomeOpt = None, step: StepOpt = None, candidates: CandidatesOpt = None,
        instruction: InstructionOpt = None, guard: GuardOpt = None,
        rollouts: RolloutsOpt = defaults.REPAIR_ROLLOUTS, alpha: AlphaOpt = defaults.ALPHA,
        seed: SeedOpt = 0, force_agent: ForceAgentOpt = False,
        all_repairs: Annotated[bool, typer.Option(
            "--all", help="Write every repair tried, not only the validated ones.")] = False,
        store: StoreOpt = "car.db") -> None:
    """Rank repairs at the step (as `car fix` does) and write (state, failing action, rescuing
    action or edit, estimated rescue with interval) as JSON lines."""
    check_seed(seed)
    run, k = _load(run_id, store, step)
    the_agent, the_outcome = kit.load_agent_and_outcome(agent, outcome)
    _, ranking = _rank(run, k, the_agent, the_outcome, candidates=candidates,
                       instructions=instruction or [], guards=guard or [], rollouts=rollouts,
                       alpha=alpha, seed=seed, force_agent=force_agent)
    written = export_pairs([(run, ranking)], out_path, validated_only=not all_repairs)
    out.print(Text(kit.safe(f"wrote {written} pair(s) to {out_path}")))
    if not written:
        raise typer.Exit(kit.NOTHING)


export_app = typer.Typer(name="export", no_args_is_help=True, rich_markup_mode=None,
                         help="Write what attributions learned, for tuning or regression tests.")
export_app.command("pairs")(export_pairs_command)
