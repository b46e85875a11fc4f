"""``car intervene``: apply do(·) to a stored run and estimate P(failure) from branches re-run
through the agent. Nothing is stored: the answer is the distribution printed."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.text import Text

from car_core import defaults
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
    err,
    errors,
    fail,
    out,
    print_json,
)
from car_core.engine.execution import default_executor
from car_core.engine.replay import intervene as run_intervene
from car_core.errors import InvalidInput
from car_core.model.budget import check_bound


@errors
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
              progress: ProgressOpt = None,
              executor: kit.ExecutorOpt = None,
              concurrency: kit.ConcurrencyOpt = None) -> None:
    """Apply do(·) to a stored run and estimate P(failure) from re-run branches."""
    check_seed(seed)
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
    exe = kit.chosen_executor(executor, concurrency)
    started, cpu = time.monotonic(), time.process_time()
    try:
        dist = run_intervene(run, the_agent, interventions, outcome=the_outcome,
                             rollouts=rollouts, seed=seed, progress=bar or False,
                             budget=budget, force_agent=force_agent,
                             max_rollouts=max_rollouts,  # --max-rollouts raised it knowingly
                             keep_trajectories=False,  # nothing is stored: keep the outcomes
                             executor=exe)
    except KeyboardInterrupt:
        raise fail("interrupted; no result was kept (car intervene stores nothing)",
                   kit.INTERRUPTED) from None
    finally:
        if bar:
            bar.close()
    if json_out:
        print_json(dist.to_dict())
    else:
        out.print(Text(kit.safe(f"do({', '.join(do)}) on run {run.id}: {dist}")))
        hint = kit.waiting_hint(default_executor(the_agent), exe, time.monotonic() - started,
                                time.process_time() - cpu)
        if hint:
            err.print(Text(kit.safe(hint), style="yellow"), soft_wrap=True)
    if dist.truncated:
        raise typer.Exit(kit.BUDGET)
