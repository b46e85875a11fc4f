"""What both estimators do around their rollouts: check the run, open the store journal, run
batches of tasks under one budget meter, and keep outcome values rather than trajectories."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..agent import OutcomeFn, check_agent
from ..budget import Budget, BudgetMeter
from ..errors import AttributionNotFound, InvalidInput, NothingToAttribute
from ..execution import Executor, Failure, Task, brancher, default_executor, execute
from ..interventions import Plan
from ..replay import check_run
from ..results import Result
from ..seeding import branch_noise, coupling
from ..trajectory import Trajectory
from ..vocabulary import AttributionStatus

OnValue = Callable[[Task, float, Trajectory], None]
# The parameters that decide what a journaled (arm, rollout) branch is: its noise stream
# (seed, coupling, which Shapley mode chose it) and the agent that ran it. Caps and levels may
# change between a run and its resume; these may not.
BRANCH_PARAMS = ("seed", "coupled", "mode", "agent")


def check_run_has_steps(run: Trajectory) -> None:
    check_run(run)
    if not run.steps:
        raise NothingToAttribute("the run has no steps, so no step can be blamed", run_id=run.id,
                                 hint="record a run in which the agent took at least one step")


def check_resumable(store: Any, attribution_id: str, run_id: str, method: str,
                    params: dict[str, Any], *, settings: dict[str, float] | None = None,
                    must_exist: bool = False, flags: bool = False) -> None:
    """The one resume check, for the API and the ``car`` command alike.

    Always refused: another run or method, or another value of a ``BRANCH_PARAMS`` entry (the
    journal would hand back branches of a different estimate under the same (arm, rollout)
    keys). ``settings`` (the command passes seed, alpha or level, and rollouts) must also equal
    what was stored, where something was; the command asks for this because its flags restate
    the whole estimate, while the API lets a resume raise a cap. ``must_exist``: a missing
    attribution is an error (``car attribute --resume``), not a new one. ``flags``: the hints
    name command-line flags instead of keyword arguments."""
    try:
        row = store.attribution(attribution_id)
    except AttributionNotFound:
        if must_exist:
            raise
        return
    if flags and row.run_id != run_id:
        raise InvalidInput(f"attribution {attribution_id} belongs to run {row['run_id']}, "
                           f"not {run_id}", hint="resume it with that run id")
    if flags and row.method != method:
        raise InvalidInput(f"attribution {attribution_id} is a {row['method']} attribution",
                           hint=f"resume it with --method {row['method']}")
    if row.run_id != run_id or row.method != method:
        raise InvalidInput(f"attribution {attribution_id} is a {row['method']} attribution of "
                           f"run {row['run_id']}, not a {method} attribution of run {run_id}",
                           run_id=run_id, hint="pass a new attribution_id, or resume it with "
                                               "that run and method")
    for key in BRANCH_PARAMS:
        if key not in params:  # the command checks what its flags set (settings) only
            continue
        stored, given = row.params.get(key), params.get(key)
        if stored != given:
            raise InvalidInput(f"attribution {attribution_id} was started with {key}={stored!r},"
                               f" not {given!r}", run_id=run_id,
                               hint=f"resume it with {key}={stored!r} (its stored branches were "
                                    "drawn that way), or pass a new attribution_id")
    for key, value in (settings or {}).items():
        stored = row.params.get(key)
        if stored is None or abs(float(stored) - float(value)) <= 1e-12:
            continue
        if key == "level":  # shapley stores the level; the flag is --alpha
            key, stored, value = "alpha", round(1 - float(stored), 12), round(1 - value, 12)
        raise InvalidInput(f"attribution {attribution_id} was started with {key} {stored}, "
                           f"not {value}",
                           hint=f"resume with --{key} {stored} (the same settings find the "
                                "branches already run)")


class Session:
    """One estimate in progress: the agent, the outcome, the shared budget meter and (with a
    store) the attribution row and the journal that makes it resumable."""

    def __init__(self, run: Trajectory, agent: Any, outcome: Any, *, method: str, seed: int,
                 coupled: bool, budget: Budget | None, executor: Executor | None,
                 progress: Any, store: Any, attribution_id: str | None,
                 params: dict[str, Any], force_agent: bool = False) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InvalidInput(f"seed={seed!r} must be an int", hint="pass seed=0, 1, …")
        check_agent(run, agent, force=force_agent)
        self.run, self.agent, self.seed = run, agent, seed
        self.outcome = OutcomeFn(outcome)
        self.coupled, self.coupling = coupling(agent, run, bool(coupled))
        self.meter = BudgetMeter(budget)
        # None: sequential for in-process agents, asyncio for ones that wait on a model
        self.executor = executor or default_executor(agent)
        self.progress, self.method, self.params = progress, method, params
        self.store, self.journal, self.attribution_id = store, None, attribution_id
        self.failures: list[Failure] = []  # branches that failed after their retry
        if store is not None:
            from ..store import StoreJournal
            if attribution_id is not None:
                check_resumable(store, attribution_id, run.id, method, params)
            store.save(run)  # idempotent; refuses another run stored under the same id
            self.attribution_id = store.begin_attribution(run.id, method, params, attribution_id)
            self.journal = StoreJournal(store, self.attribution_id)

    def task(self, arm: str, rollout: int, plan: Plan) -> Task:
        return Task(arm=arm, rollout=rollout, plan=plan,
                    noise=branch_noise(self.seed, rollout, arm, self.coupled))

    def execute(self, tasks: Iterable[Task], on_value: OnValue) -> None:
        """Run ``tasks`` (budget checked before each); hand each outcome value to ``on_value``.
        The batch's trajectories are dropped when this returns."""
        if self.tripped:
            return

        def on_result(task: Task, traj: Trajectory) -> None:
            value = traj.outcome.value if traj.outcome is not None else None
            if value is None:  # a journal row written without a score cannot be trusted
                value = self.outcome(traj, task.noise.rng(0, "outcome"))
            on_value(task, float(value), traj)

        # brancher: plain data, so Ray can ship it (a closure over the session would drag the
        # store's SQLite handle along); keep nothing: on_result already has each value
        results = execute(tasks, brancher(self.run, self.agent, self.outcome), self.meter,
                          executor=self.executor, progress=self.progress, label=self.method,
                          on_result=on_result, journal=self.journal, keep=lambda traj: None)
        self.failures.extend(results.failures)

    def failure_note(self) -> str | None:
        """Why the estimate is missing branches, when some failed after their retry: left out,
        they bias it towards the branches that did not fail, so the result must say so."""
        if not self.failures:
            return None
        return (f"{len(self.failures)} branch(es) failed after a retry and were left out of "
                f"the estimate (first: {self.failures[0].error}); fix the agent and run again")

    def failure_rows(self) -> tuple[dict[str, Any], ...]:
        return tuple(f.to_dict() for f in self.failures)

    @property
    def tripped(self) -> str | None:
        return self.meter.tripped

    def finish(self, result: Result) -> None:
        if self.store is not None and self.attribution_id is not None:
            status = (AttributionStatus.TRUNCATED if result.truncated
                      else AttributionStatus.COMPLETE)
            self.store.finish_attribution(self.attribution_id, result, status,
                                          params=self.params)
