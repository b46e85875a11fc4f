"""``car fix --failed | --runs ID...``: whether fixes rescue a population of failed runs
(``car.fix_population``), and ``car export fix``: a stored population fix as JSON or CSV.
``car fix RUN_ID`` (one run's repairs ranked) stays in ``car_core.cli.context``, which hands
the population forms to ``fix_many``."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from car_core import defaults
from car_core.cli import kit
from car_core.cli.app import StoreOpt, err, errors, out, print_json
from car_core.cli.selection import (
    Format,
    export,
    per_run_lines,
    resumable_stop,
    selected,
    stop_if_ran_out,
)
from car_core.engine.execution import default_executor
from car_core.errors import AttributionNotFound, InvalidInput
from car_core.estimators._population import runs_at_once_for
from car_core.estimators.fixes import Fix, as_fix
from car_core.estimators.population_fix import fix_population, progress_line, untimed
from car_core.fix_results import PopulationFix
from car_core.store import RunStore


def _guard(spec: str) -> Fix:
    try:
        value = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--guard {spec!r} is not JSON (on a population, --guard takes the "
                           "tool result that replaces the one the locus saw, without J:)",
                           hint='quote strings: --guard \'"no refund"\'') from exc
    return Fix.guard(value)


def _policy(spec: str) -> Fix:
    return Fix.policy(kit.built(spec, "policy"), label=f"use policy {spec}")


def _fixes(instructions: list[str], systems: list[str], guards: list[str],
           policies: list[str], candidates: str | None) -> list[Fix]:
    fixes = [Fix.instruction(t) for t in instructions]
    fixes += [Fix.instruction(t, every_step=True) for t in systems]
    fixes += [_guard(g) for g in guards]
    fixes += [_policy(p) for p in policies]
    if candidates:
        made = kit.load_object(candidates, "candidates")
        if callable(made) and not isinstance(made, Fix):
            made = made()
        fixes += [as_fix(f) for f in (made if isinstance(made, (list, tuple)) else [made])]
    if not fixes:
        raise InvalidInput("no fix to test on the population",
                           hint="pass --instruction, --system, --guard, --policy or --candidates")
    return fixes


def _stored_params(store: str, fix_id: str, must_exist: bool) -> dict[str, Any]:
    """The settings stored fix ``fix_id`` was run with; none for one not stored yet (a
    ``--resume`` id may name a new fix) unless ``must_exist``."""
    reader = kit.existing_store(store)
    try:
        return dict(reader.attribution(fix_id).params)
    except AttributionNotFound:
        if must_exist:
            raise
        return {}
    finally:
        reader.close()


def _settings(resume: str | None, stored: dict[str, Any], *, rollouts: int | None,
              seed: int | None, from_step: str | None, alpha: float | None = None
              ) -> tuple[int, int, int | str, float]:
    """``--rollouts``, ``--seed``, ``--from-step`` and ``--alpha``: as given, else the fix
    resumed's, else the defaults, as ``car attribute`` takes a flag left out on ``--resume``
    (a user trial's ``--resume FIX_ID`` without ``--rollouts`` was refused for the default's
    differing from the fix's; ``--alpha`` left out fell back to 0.05 whatever the fix had).
    One given that differs from the fix's is refused, naming both: the runs it measured
    were drawn, and tested, with the fix's."""
    given: dict[str, Any] = {"rollouts": rollouts, "seed": seed,
                             "from_step": None if from_step is None else _from(from_step),
                             "alpha": alpha}
    fallback: dict[str, Any] = {"rollouts": defaults.REPAIR_ROLLOUTS, "seed": 0,
                                "from_step": "locus", "alpha": defaults.ALPHA}
    chosen: dict[str, Any] = {}
    for key, value in given.items():
        before = stored.get(key)
        if value is not None and before is not None and value != before:
            flag = "--" + key.replace("_", "-")
            raise InvalidInput(f"population fix {resume} was run with {flag} {before}, not "
                               f"{value}", hint=f"leave {flag} out (a resume takes the fix's) "
                                                "or give it as stored, or drop --resume for "
                                                "a new fix")
        chosen[key] = value if value is not None else (
            before if before is not None else fallback[key])
    return (int(chosen["rollouts"]), int(chosen["seed"]), chosen["from_step"],
            float(chosen["alpha"]))


def _stored_lines(stored: dict[str, Any], fix_id: str) -> tuple[list[str], list[str]]:
    """The ``--instruction`` and ``--system`` lines of stored fix ``fix_id`` (its settings
    ``stored``), read back from their labels, so ``--resume FIX_ID`` alone continues it (a
    user trial had to repeat every flag). Fixes a label cannot rebuild (a guard, a policy,
    ``--candidates``) must be given again: refused, naming them."""
    instructions, systems, other = [], [], []
    for c in stored.get("candidates") or []:
        label = str(c.get("label", ""))
        if label.startswith("add instruction: ") and not c.get("every_step"):
            instructions.append(label.removeprefix("add instruction: "))
        elif label.startswith("system prompt: ") and c.get("every_step"):
            systems.append(label.removeprefix("system prompt: "))
        else:
            other.append(label)
    if other:
        raise InvalidInput(f"--resume {fix_id}: the store keeps the labels of its fixes, and "
                           f"{other} cannot be rebuilt from one",
                           hint="give the fixes again as the first command did (--guard, "
                                "--policy, --candidates ...), with --resume")
    return instructions, systems


def _from(text: str) -> int | str:
    if text == "locus":
        return text
    if text.isdigit():
        return int(text)
    raise InvalidInput(f"--from-step {text!r}: branch from each run's locus or a step",
                       hint="--from-step locus (the default) or --from-step 0")


def fix_many(run_ids: list[str], *, failed: bool, agent: Any, outcome: Any,
             instructions: list[str], systems: list[str], guards: list[str],
             policies: list[str], candidates: str | None, rollouts: int | None,
             alpha: float | None, seed: int | None, from_step: str | None,
             triage_id: str | None,
             budget: int | None,
             resume: str | None, force_agent: bool, store: str, json_out: bool,
             filters: dict[str, str | None] | None = None,
             runs_at_once: int | None = None, progress: bool | None = None,
             executor: Any = None, concurrency: int | None = None) -> None:
    """The population forms of ``car fix`` (see the module docstring); ``filters``: the
    selection ``car triage`` takes (``--agent-name``, ``--since``, ``--until``, ``--test``,
    ``--session``), on the failed runs; ``runs_at_once``: runs tested at once (None: chosen
    for the agent); ``progress``: a line per run tested (None: when stderr is a terminal);
    ``rollouts``, ``seed``, ``from_step``: None where the flag was left out (``_settings``);
    ``executor``: the ``--executor`` named (None: chosen for the agent), ``concurrency`` its
    branches in flight. Where CAR chose to run branches one at a time and the process mostly
    waited, it says so (``kit.waiting_hint``), as ``car attribute`` does: a user trial's
    custom model spent 60 of 86 s asleep, with no hint."""
    filters = filters or {}
    given_fixes = bool(instructions or systems or guards or policies or candidates)
    stored = (_stored_params(store, resume, must_exist=not given_fixes)
              if resume is not None else {})
    if resume is not None and not given_fixes:
        instructions, systems = _stored_lines(stored, resume)
    fixes = _fixes(instructions, systems, guards, policies, candidates)
    rollouts, seed, start, alpha = _settings(resume, stored, rollouts=rollouts, seed=seed,
                                             from_step=from_step, alpha=alpha)
    if budget is None and isinstance(stored.get("budget"), dict):  # the fix's cap goes on
        budget = stored["budget"].get("rollouts")
    ids = selected(store, run_ids, None if failed else resume,
                   "failed" if failed else "any", **filters)
    if not ids:
        raise InvalidInput("no failed run matches: nothing to fix",
                           hint="list the stored runs with `car runs`, or loosen the filters")
    the_agent, the_outcome = kit.load_agent_and_outcome(agent, outcome)
    at_once = runs_at_once_for(runs_at_once, the_agent)
    shown = progress if progress is not None else sys.stderr.isatty()
    fid = resume or uuid.uuid4().hex[:16]  # known here, so a stopped fix can say it
    exe = kit.chosen_executor(executor, concurrency)
    started, cpu = time.monotonic(), time.process_time()
    db = RunStore(store)
    try:
        with resumable_stop(store, "population fix", fid,
                            lambda: db.attribution_exists(fid)):
            result = fix_population(ids, the_agent, outcome=the_outcome, candidates=fixes,
                                    store=db, triage=triage_id, from_step=start,
                                    rollouts=rollouts, alpha=alpha, seed=seed, budget=budget,
                                    fix_id=fid, force_agent=force_agent,
                                    progress=per_run_lines(progress_line, at_once, untimed)
                                    if shown else None,
                                    runs_at_once=at_once, executor=exe)
    finally:
        db.close()
    if json_out:
        print_json(result.to_dict())
    else:
        print_fix(result, store)
        hint = kit.waiting_hint(default_executor(the_agent), exe, time.monotonic() - started,
                                time.process_time() - cpu)
        if hint:
            err.print(Text(kit.safe(hint), style="yellow"), soft_wrap=True)
    stop_if_ran_out(result.truncated, result.budget_note, result.fix_id)
    if not any(c.shown for c in result.candidates):
        raise typer.Exit(kit.NOTHING)



def print_fix(r: PopulationFix, store: str) -> None:
    """The answer first, then one row per fix, the cost, and where the runs are listed."""
    out.print(Text(kit.safe(r.summary()), style="bold"))
    t = Table(title_justify="left")
    for col in ("fix", "from", "rescue", f"interval ({100 * (1 - r.alpha):.0f}% jointly)",
                "runs rescued", "not rescued", "untested"):
        t.add_column(col, justify="left" if col in ("fix", "from") else "right")
    for c in r.candidates:
        ci = c.rescue_ci
        t.add_row(kit.cell(c.label), c.from_step,
                  "—" if c.rescue is None else f"{100 * c.rescue:.0f}%",
                  "—" if ci is None else f"{100 * ci[0]:.0f}% to {100 * ci[1]:.0f}%",
                  str(len(c.rescued)), str(len(c.not_rescued)), str(len(c.untested)))
    out.print(t)
    cost = r.cost
    if cost.ratio is not None:
        out.print(Text(f"{cost.rollouts} rollouts deciding {cost.steps_live} steps; re-running "
                       f"them from the start would decide {cost.steps_rerun} "
                       f"({cost.ratio:.2f}×)"
                       + (f"; {cost.locate_rollouts} rollouts found the loci"
                          if cost.locate_rollouts else "")))
    out.print(Text(f"{r.runs_total} run(s) · {r.rollouts_used} rollouts spent now · "
                   f"fix {r.fix_id}"))
    out.print(Text(kit.safe(f"the runs each fix rescues: car export fix {r.fix_id} "
                            f"--store {store}, or --json"), style="dim"))


@errors
def export_fix(
        fix_id: Annotated[str, typer.Argument(help="The population fix's id "
                                                   "(`car attributions`).")],
        out_path: Annotated[Path | None, typer.Option(
            "--out", help="File to write (default: standard output).")] = None,
        fmt: Annotated[Format | None, typer.Option(
            "--format", help="json or csv (default: from --out's suffix, else json).")
        ] = None,
        store: StoreOpt = "car.db") -> None:
    """Write a stored population fix: JSON (`car fix --json`'s) or CSV (one row per fix and
    run)."""
    from car_core.store.fixes import load_fix  # brings sqlite-utils: not for --help
    db = kit.existing_store(store)
    try:
        result = load_fix(db, fix_id)
    finally:
        db.close()
    export(result, fmt, out_path, f"population fix {fix_id}")
