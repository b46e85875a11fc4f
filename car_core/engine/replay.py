"""Held prefix, intervened step, live suffix: the engine behind every estimate.

``car_core.engine.agent.drive`` runs a ``FunctionAgent`` under a ``Plan``: steps before
``plan.start``
are copied from the record (no policy call, no tool call), intervened steps take the plan's
values, the rest run live. ``record`` runs an agent from scratch; ``intervene`` runs K branches
and reports the outcome distribution with its Wilson interval (branches that raised or ended in
error are left out and listed, and stop it past ``car_core.engine.tasks.check_failures``);
``action_match_rate`` measures how faithfully a policy re-decides the recorded states.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from car_core import defaults
from car_core import formatting as fmt
from car_core.engine.agent import Agent, agent_fingerprint, caveats_of, check_agent, check_plans
from car_core.engine.agent import (
    call_environment as call_environment,  # re-exported: drive lives in agent
)
from car_core.engine.agent import call_policy as call_policy
from car_core.engine.agent import drive as drive
from car_core.engine.agent import policy_meta as policy_meta
from car_core.engine.execution import (
    RETRIES,
    Executor,
    ExecutorLike,
    Progress,
    brancher,
    execute,
    resolve_executor,
)
from car_core.engine.progress import progress_bar
from car_core.engine.tasks import Task, check_failures, returned_run
from car_core.engine.tasks import run_branch as run_branch
from car_core.errors import (
    AgentError,
    BudgetExhausted,
    CarError,
    InvalidInput,
    OutcomeError,
)
from car_core.model.actions import same_action
from car_core.model.budget import Budget, BudgetMeter, as_budget, check_bound, check_countable
from car_core.model.checks import is_whole
from car_core.model.interventions import Intervention, compile_plan
from car_core.model.json_values import JSON
from car_core.model.outcome import OutcomeFn, OutcomeLike, check_on_record, scored
from car_core.model.seeding import Noise, branch_noise, coupling, replays_alike
from car_core.model.trajectory import Trajectory
from car_core.model.vocabulary import NOT_REDECIDED, RunStatus
from car_core.stats import (
    NOT_MEASURED,
    Coupling,
    CouplingNumbers,
    Interval,
    check_level,
    coupling_of,
    wilson,
)
from car_core.store import as_store

if TYPE_CHECKING:  # the store brings sqlite-utils: loaded only where one is used
    from car_core.store import StoreLike

TERMINAL_STATUSES = (RunStatus.COMPLETE, RunStatus.MAX_STEPS, RunStatus.SETTLED)


def record(agent: Agent, *, context: JSON = None, outcome: OutcomeLike, seed: int = 0,
           store: StoreLike | None = None) -> Trajectory:
    """Run ``agent`` once from ``context`` and score it; the run is the factual record."""
    out = OutcomeFn(outcome)
    store = as_store(store)
    noise = Noise(seed)
    run = returned_run(agent.start(context, noise), agent, "start")
    run = replace(run, seed=noise.seed,
                  meta={**run.meta, "agent_fingerprint": agent_fingerprint(agent)})
    try:
        run = scored(run, out, noise)
    except OutcomeError as exc:
        # the run happened (its side effects too): a trial's raising outcome threw it away
        # and named a run id no store held
        if store is not None:
            store.save(run)
        kept = (f"the run is stored unscored in {store.path}: attribute it with an outcome "
                "that works (CAR scores it first)" if store is not None else
                "the run is not kept: record it again once the outcome works")
        raise OutcomeError(exc.message, run_id=run.id,
                           hint=f"{exc.hint}; {kept}" if exc.hint else kept) from exc.__cause__
    if store is not None:
        store.save(run)
    for observer in _RECORD_OBSERVERS.get():
        observer(run)
    return run


_RECORD_OBSERVERS: ContextVar[tuple[Callable[[Trajectory], None], ...]] = ContextVar(
    "car_record_observers", default=())


@contextmanager
def observing_records(observer: Callable[[Trajectory], None]) -> Iterator[None]:
    """Call ``observer(run)`` with every run ``record`` makes in this context (a test fixture
    collecting the runs a test records). An observer must not raise."""
    token = _RECORD_OBSERVERS.set((*_RECORD_OBSERVERS.get(), observer))
    try:
        yield
    finally:
        _RECORD_OBSERVERS.reset(token)


@dataclass(frozen=True)
class OutcomeDistribution(CouplingNumbers):
    """P(failure | do(·)) estimated from ``n`` rollouts, with its Wilson interval."""

    mean: float
    ci: Interval
    n: int
    level: float
    values: tuple[float, ...]
    trajectories: tuple[Trajectory, ...]
    interventions: tuple[dict[str, Any], ...]
    coupled: bool
    seed: int
    rollouts_used: int
    truncated: bool
    budget_note: str | None = None
    tokens: int = 0
    cost: float = 0.0
    failures: tuple[dict[str, Any], ...] = ()
    coupling: str | None = None  # what noise CAR handed the branches, and why
    # how much a branch and its twin (the same rollout re-run on the same noise) agreed
    # beyond independent draws; ``coupled`` says whether that showed sharing
    measured_coupling: Coupling = NOT_MEASURED
    caveats: tuple[str, ...] = ()  # what the agent said every result must show (agent.caveats)

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci": list(self.ci), "n": self.n, "level": self.level,
                "values": list(self.values), "interventions": list(self.interventions),
                "coupled": self.coupled, "coupling": self.coupling, "seed": self.seed,
                **self.measured_coupling.result_keys(), "rollouts_used": self.rollouts_used,
                "truncated": self.truncated, "budget_note": self.budget_note,
                "tokens": self.tokens, "cost": self.cost, "failures": list(self.failures),
                "branch_ids": [t.id for t in self.trajectories],
                **({"caveats": list(self.caveats)} if self.caveats else {})}

    def __str__(self) -> str:
        """The failure rate in plain words first, then with its level and sample size."""
        return (f"the agent fails in {fmt.percent(self.mean)} of re-runs "
                f"{fmt.percent_interval(self.ci)}"
                + (", from a budget that ran out" if self.truncated else "") + "; "
                + fmt.failure_rate(self.mean, self.ci, self.level, self.n)
                + (" (truncated)" if self.truncated else "")
                + (f"; {len(self.failures)} failed branch(es) left out" if self.failures
                   else "")
                + "".join(f"\ncaveat: {c}" for c in self.caveats))


def _outcome_only(branch: Trajectory) -> float | None:
    return branch.outcome.value if branch.outcome is not None else None


def check_run(run: Trajectory) -> None:
    if not isinstance(run, Trajectory):
        raise InvalidInput(f"expected a car.Trajectory, got {type(run).__name__}",
                           hint="record one with car.record or load it with RunStore.load")
    run.verify()


def intervene(run: Trajectory, agent: Agent, interventions: Intervention | Sequence[Intervention],
              *, outcome: OutcomeLike, rollouts: int = defaults.INTERVENE_ROLLOUTS,
              seed: int = 0, coupled: bool = True, level: float = defaults.LEVEL,
              budget: Budget | int | None = None,
              executor: ExecutorLike = None, progress: Progress = None,
              force_agent: bool = False, keep_trajectories: bool = True, twins: int = 0,
              max_rollouts: int = defaults.MAX_ROLLOUTS) -> OutcomeDistribution:
    """Apply ``interventions`` to ``run`` and estimate the outcome distribution from
    ``rollouts`` branches. Branch ``r`` draws its noise from stream ``(seed, r)``, shared by
    every call with the same seed when ``coupled`` (common random numbers). An agent other
    than the one that recorded ``run`` is refused unless ``force_agent``. A branch that raises or
    comes back with status ``error`` is left out and listed in ``failures``; more than a tenth
    of them, or any that holds every recorded step, raise ``BranchesFailed`` (when every branch
    failed, the first branch's own error is raised). With ``keep_trajectories=False`` only each
    branch's outcome stays in memory (``trajectories`` is empty): a branch's steps are dropped
    as it finishes, so many rollouts cost a number each, not a run each.

    One arm has no pairs, so whether branches really share the noise CAR hands them is
    measured only when asked: ``twins=T`` re-runs the first ``T`` rollouts on their own noise
    (``T`` more rollouts, under the same budget, left out of the mean) and ``coupled`` says
    whether each branch and its twin agreed beyond chance (``measured_coupling``); a model that
    ignores its seed or a judge with its own randomness agree less. Without twins nothing is
    measured and ``coupled`` is False; ``coupling`` says what noise was handed out.

    ``executor``: ``"sequential"``, ``"async"``, ``"ray"``, an executor object, or None for
    the agent's default (``execution.resolve_executor``); the result for a seed is the same on
    every one. Before any branch, an outcome that scores the recorded run on the other side of
    the failure threshold from its stored outcome is refused (``outcome.check_on_record``).
    So is, before anything runs, a count above ``max_rollouts`` (``defaults.MAX_ROLLOUTS``:
    a slip such as ``rollouts=2**63`` would run until killed), unless a ``budget`` caps it
    below; raise it knowingly."""
    try:
        return _intervene(run, agent, interventions, outcome=outcome, rollouts=rollouts,
                          seed=seed, coupled=coupled, level=level, budget=budget,
                          executor=executor, progress=progress, force_agent=force_agent,
                          keep_trajectories=keep_trajectories, twins=twins,
                          max_rollouts=max_rollouts)
    except CarError as exc:  # nothing is kept to resume: a stop's hint says to run it again
        exc.resume_as(RUN_AGAIN)
        raise


RUN_AGAIN = "run the intervention again (an intervention keeps nothing to resume)"


def _intervene(run: Trajectory, agent: Agent,
               interventions: Intervention | Sequence[Intervention], *, outcome: OutcomeLike,
               rollouts: int, seed: int, coupled: bool, level: float,
               budget: Budget | int | None, executor: ExecutorLike, progress: Progress,
               force_agent: bool, keep_trajectories: bool, twins: int,
               max_rollouts: int) -> OutcomeDistribution:
    check_run(run)
    check_agent(run, agent, force=force_agent)
    if not is_whole(rollouts, 1):
        raise InvalidInput(f"rollouts={rollouts!r}: need at least one rollout",
                           hint="pass rollouts=K with K >= 1 (32–64 is typical)")
    if not is_whole(twins, 0):
        raise InvalidInput(f"twins={twins!r}: need a count >= 0",
                           hint="pass twins=8 to measure coupling, or leave it at 0")
    _check_size(rollouts, as_budget(budget), max_rollouts)
    out = OutcomeFn(outcome)
    check_level(level)  # a bad level fails here, not after every rollout has run
    Noise(seed)  # likewise a bad seed
    plan = compile_plan(run, interventions)
    check_plans(run, agent, [plan])  # an agent that can tell refuses the plan here
    exe = resolve_executor(executor, agent)
    check_countable(as_budget(budget), run)
    check_on_record(run, out)  # before the seed check's model calls and any branch
    handed, why = coupling(agent, run, bool(coupled))
    retries = RETRIES if replays_alike(agent, bool(coupled), handed) else 0
    arm = plan.describe()

    def tasks(rows: range) -> Iterator[Task]:  # lazy: the budget decides how many start
        return (Task(arm="intervention", rollout=r, plan=plan,
                     noise=branch_noise(seed, r, arm, handed)) for r in rows)

    meter = BudgetMeter(as_budget(budget))  # a car.Budget or a rollout count, as elsewhere
    fn = brancher(run, agent, out)
    if keep_trajectories:
        results = execute(tasks(range(rollouts)), fn, meter, executor=exe,
                          progress=progress, label="intervene", retries=retries)
        ordered = sorted(results, key=lambda tr: tr[0].rollout)
        kept: list[Any] = [t for _, t in ordered]
        by_index = {task.rollout: _outcome_only(t) for task, t in ordered}
        failures = list(results.failures)
    else:
        kept, failures, by_index = _outcomes_in_batches(tasks, rollouts, fn, meter, exe,
                                                        progress, retries)
    trajs = tuple(kept) if keep_trajectories else ()
    if not kept and failures:  # every branch failed twice: the agent is broken
        first = failures[0]
        if first.exception is not None:
            raise first.exception
        raise AgentError(f"every branch failed; the first: {first.error}", run_id=run.id)
    check_failures(failures, len(kept) + len(failures), run_id=run.id, final=True,
                   resumable=False)
    if not kept:
        raise BudgetExhausted(f"no rollout could run: {meter.tripped or 'the budget tripped'}",
                              run_id=run.id, hint="raise the budget")
    values = (tuple(t.outcome.value for t in trajs if t.outcome is not None) if keep_trajectories
              else tuple(v for v in kept if v is not None))
    mean = sum(values) / len(values)
    shared = _twin_coupling(tasks, by_index, twins if handed else 0, fn, meter, exe)
    return OutcomeDistribution(
        mean=mean, ci=Interval(*wilson(mean, len(values), level), level), n=len(values),
        level=level,
        values=values, trajectories=trajs, interventions=tuple(arm), coupled=shared.shared,
        coupling=why, measured_coupling=shared, caveats=caveats_of(agent),
        # truncated: the budget stopped it; failed branches ran and are said apart
        seed=seed, rollouts_used=meter.rollouts,
        truncated=len(kept) + len(failures) < rollouts,
        budget_note=meter.tripped, tokens=meter.tokens, cost=meter.cost,
        failures=tuple(f.to_dict() for f in failures))


def _check_size(rollouts: int, budget: Budget | None, max_rollouts: int) -> None:
    """Refuse a count past ``max_rollouts``; one under a rollout cap that bounds it is no
    slip (the cap is what runs)."""
    if not is_whole(max_rollouts, 1):
        raise InvalidInput(f"max_rollouts={max_rollouts!r} must be a whole number >= 1",
                           hint="leave max_rollouts at its default, or raise it knowingly")
    cap = budget.rollouts if budget is not None else None
    if cap is not None and cap < rollouts:
        check_bound(cap, max_rollouts, "budget", "max_rollouts=")
    else:
        check_bound(rollouts, max_rollouts, "rollouts", "max_rollouts=")


OUTCOME_BATCH = 1024  # branches run per ``execute`` call when only outcomes are kept


def _twin_coupling(tasks: Callable[[range], Iterator[Task]], by_index: dict[int, Any],
                   twins: int, fn: Any, meter: BudgetMeter, executor: Executor | None
                   ) -> Coupling:
    """Re-run the first ``twins`` scored rollouts on the very noise they drew and measure how
    much each agreed with its twin (``stats.coupling_of``); a failed twin is left out."""
    firsts = sorted(r for r, v in by_index.items() if v is not None)[:twins]
    if not firsts:
        return NOT_MEASURED
    wanted = set(firsts)
    twin_tasks = (replace(t, arm="intervention twin")
                  for t in tasks(range(firsts[-1] + 1)) if t.rollout in wanted)
    results = execute(twin_tasks, fn, meter, executor=executor, progress=False,
                      label="intervene", keep=_outcome_only)
    again = {task.rollout: v for task, v in results if v is not None}
    common = [r for r in firsts if r in again]
    return coupling_of([([float(by_index[r]) for r in common],
                         [float(again[r]) for r in common])])


def _outcomes_in_batches(tasks: Callable[[range], Iterator[Task]], rollouts: int,
                         fn: Any, meter: BudgetMeter, executor: Executor | None,
                         progress: Any, retries: int = RETRIES
                         ) -> tuple[list[Any], list[Any], dict[int, Any]]:
    """The outcomes of ``rollouts`` branches, in rollout order, run a batch at a time under
    one meter and one progress bar: what ``execute`` holds per finished branch (its task and
    its kept value) is freed batch by batch, so memory is a float per branch, not a task and
    a run."""
    bar = progress_bar(progress, rollouts, "intervene")
    values: list[Any] = []
    failures: list[Any] = []
    by_index: dict[int, Any] = {}
    try:
        for start in range(0, rollouts, OUTCOME_BATCH):
            results = execute(tasks(range(start, min(start + OUTCOME_BATCH, rollouts))), fn,
                              meter, executor=executor, progress=bar or False,
                              label="intervene", keep=_outcome_only, retries=retries)
            ordered = sorted(results, key=lambda tr: tr[0].rollout)
            values.extend(v for _, v in ordered)
            by_index.update((task.rollout, v) for task, v in ordered)
            failures.extend(results.failures)
            if meter.tripped:
                break
    finally:
        if bar is not None and bar is not progress:
            bar.close()
    return values, failures, by_index


@dataclass(frozen=True)
class ActionMatch:
    """How often re-deciding a recorded state reproduces the recorded action."""

    per_step: tuple[float, ...]
    replays: int
    steps: tuple[int, ...] = ()  # the step each entry of per_step measured

    @property
    def rate(self) -> float:
        return sum(self.per_step) / len(self.per_step) if self.per_step else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"rate": self.rate, "per_step": list(self.per_step), "replays": self.replays,
                "steps": list(self.steps)}


def action_match_rate(run: Trajectory, agent: Agent, replays: int = 4) -> ActionMatch:
    """Re-decide every recorded state ``replays`` times with the run's own seed and report,
    per step, the fraction that gave back the recorded action
    (``car_core.model.actions.same_action``:
    tool-call ids and other provider-assigned fields do not count). Steps the agent's own policy did
    not decide from the recorded state (held, forced, edited, policy-swapped) are skipped;
    ``steps`` says which were measured."""
    check_run(run)
    if not is_whole(replays, 1):
        raise InvalidInput(f"replays={replays!r}: need at least one", hint="pass replays >= 1")
    noise = Noise(int(run.seed or 0))
    per_step, measured = [], []
    for k, step in enumerate(run.steps):
        if step.meta.get("origin") in NOT_REDECIDED:
            continue
        hits = sum(same_action(agent.redecide(run, k, noise), step.action)
                   for _ in range(replays))
        per_step.append(hits / replays)
        measured.append(k)
    return ActionMatch(tuple(per_step), replays, tuple(measured))
