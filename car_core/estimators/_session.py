"""What both estimators do around their rollouts: check the run and that the outcome sees what
it recorded (``outcome.check_on_record``, before anything is spent or stored), open the store
journal, run
batches of tasks under one budget meter, keep outcome values rather than trajectories, and stop
(``BranchesFailed``, the attribution left resumable) when failed branches make the estimate
untrustworthy (``car_core.engine.tasks.check_failures``)."""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from car_core.engine.agent import Agent, OutcomeFn, check_agent, check_plans
from car_core.engine.execution import (
    RETRIES,
    ExecutorLike,
    Failure,
    Progress,
    Task,
    WaitedOneAtATime,
    brancher,
    execute,
    resolve_executor,
    waited_share,
    waited_words,
)
from car_core.engine.progress import progress_bar
from car_core.engine.replay import check_run
from car_core.engine.tasks import check_failures
from car_core.errors import (
    AttributionNotFound,
    CarError,
    InvalidInput,
    NothingToAttribute,
    StoreError,
    resumable,
)
from car_core.estimators.bounds import Planned, check_not_shrunk
from car_core.model.budget import Budget, BudgetMeter, check_countable
from car_core.model.checks import is_whole
from car_core.model.interventions import Plan
from car_core.model.outcome import OutcomeLike, check_on_record
from car_core.model.seeding import branch_noise, coupling, replays_alike
from car_core.model.trajectory import Trajectory
from car_core.model.vocabulary import AttributionStatus
from car_core.results import Result
from car_core.store import as_store

if TYPE_CHECKING:  # the store brings sqlite-utils: loaded only where one is used
    from car_core.store import RunStore, StoreLike

OnValue = Callable[[Task, float, Trajectory], None]
STAND_IN = 3 << 20  # first rollout index of the branches that stand in for failed ones
# What a resume may not change. The first four decide what a journaled (arm, rollout) branch
# is: its noise stream (seed, coupling, which Shapley mode chose it) and the agent that ran
# it. The last two are the error rate the result claims (contrastive alpha, Shapley level):
# re-testing the stored branches at a looser rate is a new attribution, not this one resumed.
# Caps (contrastive ``rollouts``, ``budget``) may change: see ``check_resumable``.
RESUME_FIXED = ("seed", "coupled", "mode", "agent", "alpha", "level", "indifference",
                "outcome")

P = ParamSpec("P")
R = TypeVar("R")
_OPENED: ContextVar[list[Session] | None] = ContextVar("car_sessions_opened", default=None)


def releasing(estimate: Callable[P, R]) -> Callable[P, R]:
    """Wrap an estimator so every session it opens gives its lease up when it ends, however
    it ends (a finished one has already): an estimate that raised or was interrupted never
    keeps a resume in the same process waiting on a lease nobody runs. One that raised before
    any branch was stored, for a reason a resume cannot change (``errors.resumable``: an
    outcome function that raises, bad input), leaves no ``running`` row behind: the row would
    promise a resume that ends the same. A resumable stop (a model server down, Ctrl-C) keeps
    it, so the "Resume with" it prints works. A ``CarError`` it raises carries what the
    estimate spent before it (``spent_before``): a population charges a run that stopped
    part-way for its branches against the total it caps."""
    @functools.wraps(estimate)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        opened: list[Session] = []
        token = _OPENED.set(opened)
        failed = True  # raised, and not a stop a resume can change: drop an empty row
        try:
            result = estimate(*args, **kwargs)
            failed = False
            return result
        except BaseException as exc:
            failed = not resumable(exc)
            kept = [s.attribution_id for s in opened if s.attribution_id is not None]
            if not failed and kept and isinstance(exc, CarError):
                exc.name_attribution(kept[-1])  # what a resume names, in its hint too
            if opened and isinstance(exc, CarError):  # what a caller charges for it
                exc.context.setdefault("spent", spent_by(opened))
            raise
        finally:
            _OPENED.reset(token)
            for session in opened:
                session.release(failed=failed)
    return wrapper


def spent_by(sessions: Iterable[Session]) -> dict[str, Any]:
    """What the sessions' meters counted: rollouts (failed and read-back ones included, as a
    finished estimate's ``rollouts_used``), tokens and cost."""
    spent: dict[str, Any] = {"rollouts": 0, "tokens": 0, "cost": 0.0}
    for s in sessions:
        spent["rollouts"] += s.meter.rollouts
        spent["tokens"] += s.meter.tokens
        spent["cost"] += s.meter.cost
    return spent


def spent_before(exc: BaseException) -> tuple[int, int, float]:
    """The rollouts, tokens and cost an estimate spent before it raised ``exc`` (what
    ``releasing`` records on a ``CarError``); nothing for an error raised before any
    session began."""
    got = getattr(exc, "context", {}).get("spent") or {}
    return int(got.get("rollouts", 0)), int(got.get("tokens", 0)), float(got.get("cost", 0.0))


def check_run_has_steps(run: Trajectory) -> None:
    check_run(run)
    if not run.steps:
        raise NothingToAttribute("the run has no steps, so no step can be blamed", run_id=run.id,
                                 hint="record a run in which the agent took at least one step")


def check_resumable(store: RunStore, attribution_id: str, run_id: str, method: str,
                    params: dict[str, Any], *, must_exist: bool = False,
                    flags: bool = False) -> None:
    """The one resume rule, for the API and the ``car`` command alike.

    A resume continues the same attribution. It may change how far the estimate may go (the
    contrastive ``rollouts`` K and any ``budget``, larger or smaller). Where the branches draw
    CAR's noise the journaled ones are the very branches a fresh attribution with the new caps
    would draw, so the resumed result is the one that fresh attribution gives, without
    re-running them; where the agent draws its own, no branch can be drawn again as it was, and
    the resume reads the stored outcomes back and draws only the branches not stored. Refused:
    another run or method, or another value of a ``RESUME_FIXED`` entry given in ``params``
    (what a branch is, and the error rate the result claims); that is a new attribution (a new
    id).
    ``must_exist``: a missing attribution is an error (``car attribute --resume``), not a new
    one. ``flags``: the hints name command-line flags instead of keyword arguments."""
    try:
        row = store.attribution(attribution_id)
    except AttributionNotFound:
        if must_exist:
            raise
        return
    if flags and row.run_id != run_id:
        raise InvalidInput(f"attribution {attribution_id} belongs to run {row.run_id}, "
                           f"not {run_id}", hint="resume it with that run id")
    if flags and row.method != method:
        raise InvalidInput(f"attribution {attribution_id} is a {row.method} attribution",
                           hint=f"resume it with --method {row.method}")
    if row.run_id != run_id or row.method != method:
        raise InvalidInput(f"attribution {attribution_id} is a {row.method} attribution of "
                           f"run {row.run_id}, not a {method} attribution of run {run_id}",
                           run_id=run_id, hint="pass a new attribution_id, or resume it with "
                                               "that run and method")
    for key in RESUME_FIXED:
        if key not in params or row.params.get(key) is None:
            continue  # the command checks what its flags set; older rows may lack a key
        stored, given = row.params[key], params[key]
        if _same(stored, given):
            continue
        if flags:
            if key == "level":  # shapley stores the level; the flag is --alpha
                key, stored, given = "alpha", round(1 - float(stored), 12), round(1 - given, 12)
            raise InvalidInput(f"attribution {attribution_id} was started with {key} {stored}, "
                               f"not {given}",
                               hint=f"resume with --{key} {stored} (the same settings find the "
                                    "branches already run), or drop --resume for a new "
                                    "attribution")
        raise InvalidInput(f"attribution {attribution_id} was started with {key}={stored!r},"
                           f" not {given!r}", run_id=run_id,
                           hint=f"resume it with {key}={stored!r} (its stored branches were "
                                "drawn and tested that way), or pass a new attribution_id")


def _same(stored: Any, given: Any) -> bool:
    """Equal, with levels computed as ``1 - alpha`` compared to 1e-12."""
    numbers = (int, float)
    if (isinstance(stored, numbers) and isinstance(given, numbers)
            and not isinstance(stored, bool) and not isinstance(given, bool)):
        return abs(float(stored) - float(given)) <= 1e-12
    return bool(stored == given)


def _estimate_bar(progress: Any, meter: BudgetMeter, label: str) -> tuple[Any, bool]:
    """One bar for the whole estimate (not one per batch), its total the rollouts the budget
    lets it spend; and whether the session made it (and so must finish it). A caller's own
    bar object, or False, is passed on as it is."""
    if progress is not None and progress is not True:
        return progress, False
    bar = progress_bar(progress, meter.budget.rollouts, label)
    return bar if bar is not None else False, bar is not None


class Session:
    """One estimate in progress: the agent, the outcome, the shared budget meter and (with a
    store) the attribution row and the journal that makes it resumable."""

    def __init__(self, run: Trajectory, agent: Agent, outcome: OutcomeLike, *, method: str,
                 seed: int,
                 coupled: bool, budget: Budget | None, executor: ExecutorLike,
                 progress: Progress, store: StoreLike | None, attribution_id: str | None,
                 params: dict[str, Any], force_agent: bool = False,
                 planned: Planned | None = None, replace: bool = False,
                 plans: Iterable[Plan] = ()) -> None:
        if not is_whole(seed):
            raise InvalidInput(f"seed={seed!r} must be an int", hint="pass seed=0, 1, …")
        store = as_store(store)
        check_agent(run, agent, force=force_agent)
        # the plans the estimate knows ahead, each refused now if the agent cannot branch it,
        # not at its first branch after the others ran (``check_plans``)
        check_plans(run, agent, plans)
        check_countable(budget, run)  # a money cap that could never trip
        self.run, self.agent, self.seed = run, agent, seed
        self.outcome = OutcomeFn(outcome)
        # before anything is spent or stored: the seed check's model calls, the run's row,
        # the attribution's (so a refused estimate leaves nothing to resume)
        check_on_record(run, self.outcome, attributing=True)
        self.coupled, self.coupling = coupling(agent, run, bool(coupled))
        # a branch that raised is run again only where that re-runs its path (its draws come
        # from its noise): a fresh draw would favour the paths that do not raise
        self.retries = RETRIES if replays_alike(agent, bool(coupled), self.coupled) else 0
        self.meter = BudgetMeter(budget)
        # None: sequential for in-process agents, asyncio for ones that wait on a model; a
        # name ("async") builds that backend
        self.executor = resolve_executor(executor, agent)
        # what the caller named, and when the estimate began: a slow one CAR chose to run one
        # branch at a time while the process waited says so when it ends (``_say_if_waited``)
        self._given, self._clock = executor, (time.monotonic(), time.process_time())
        self.method, self.params = method, params
        self.progress, self._own_bar = _estimate_bar(progress, self.meter, method)
        self.store, self.journal, self.attribution_id = store, None, attribution_id
        self.failures: list[Failure] = []  # branches that failed (after a retry, if any)
        self._stands_for: dict[tuple[str, int], int] = {}  # (arm, stand-in index) -> index
        self.ran = 0  # branches run (failed ones included), for the failed share
        # ... and each arm's, for an arm's own share: the contrastive search's arms are means
        # that one arm's lost paths bias (Shapley keeps every unit, a failed visit stood in for)
        self.ran_by_arm: dict[str, int] = {}
        self._per_arm = method == "contrastive"
        self._began = False  # whether this session began (or resumed) the attribution row
        self._truncated = False  # the result said the budget ended it (its bar says so too)
        self.replace = replace  # its result replaces a stored one, even one from more rollouts
        opened = _OPENED.get()
        if opened is not None:
            opened.append(self)
        if store is not None:
            from car_core.store.journal import StoreJournal
            # the outcome scores the stored branches: a resume scored by another read them back
            # as they were and mixed the two (a trial's answer matched neither)
            stored = {**params, "outcome": self.outcome.name}
            if attribution_id is not None:
                check_resumable(store, attribution_id, run.id, method, stored)
                if planned is not None and not replace:
                    check_not_shrunk(store, attribution_id, method, params, planned)
            store.save(run)  # idempotent; refuses another run stored under the same id
            self.attribution_id = store.begin_attribution(run.id, method, stored, attribution_id)
            self._began = True
            self.journal = StoreJournal(store, self.attribution_id)

    def task(self, arm: str, rollout: int, plan: Plan) -> Task:
        return Task(arm=arm, rollout=rollout, plan=plan,
                    noise=branch_noise(self.seed, rollout, arm, self.coupled))

    def execute(self, tasks: Iterable[Task], on_value: OnValue, *,
                stand_in: bool = False) -> None:
        """Run ``tasks`` (budget checked before each); hand each outcome value to ``on_value``.
        The batch's trajectories are dropped when this returns.

        ``stand_in``: for an estimator that reads branches by rollout index, where a failed
        branch would leave a hole it reads as a spent budget (contrastive's search) or drop a
        whole unit, and with it the draws that led there (Shapley's permutations): each branch
        that failed gets a stand-in, its arm and plan run again on a fresh noise index of its
        own (from ``STAND_IN``), and ``on_value`` gets its value under the failed branch's
        index. The failure stays counted, shown and checked by the share rule, and a stand-in
        that fails gets one of its own until the budget or that rule stops it. A stand-in is a
        fresh draw of its arm given that its branch finishes, as leaving the failure out is;
        it does not share the other arms' noise at that index, which costs precision only."""
        before = len(self.failures)
        self._execute(tasks, on_value)
        while stand_in and len(self.failures) > before and not self.tripped:
            failed, before = self.failures[before:], len(self.failures)
            spares = []
            for f in failed:
                spare = STAND_IN + len(self._stands_for)
                self._stands_for[(f.task.arm, spare)] = self._stands_for.get(
                    (f.task.arm, f.task.rollout), f.task.rollout)
                spares.append(self.task(f.task.arm, spare, f.task.plan))

            def standing_in(task: Task, value: float, traj: Trajectory) -> None:
                index = self._stands_for[(task.arm, task.rollout)]
                on_value(dataclasses.replace(task, rollout=index), value, traj)
            self._execute(spares, standing_in)

    def _execute(self, tasks: Iterable[Task], on_value: OnValue) -> None:
        if self.tripped:
            return

        def on_result(task: Task, traj: Trajectory) -> None:
            self.ran_by_arm[task.arm] = self.ran_by_arm.get(task.arm, 0) + 1
            value = traj.outcome.value if traj.outcome is not None else None
            if value is None:  # a journal row written without a score cannot be trusted
                value = self.outcome.score(traj, task.noise)
            on_value(task, float(value), traj)

        # brancher: plain data, so Ray can ship it (a closure over the session would drag the
        # store's SQLite handle along); keep nothing: on_result already has each value
        results = execute(tasks, brancher(self.run, self.agent, self.outcome), self.meter,
                          executor=self.executor, progress=self.progress, label=self.method,
                          on_result=on_result, journal=self.journal, keep=lambda traj: None,
                          retries=self.retries)
        self.ran += len(results) + len(results.failures)
        self.failures.extend(results.failures)
        for f in results.failures:
            self.ran_by_arm[f.task.arm] = self.ran_by_arm.get(f.task.arm, 0) + 1
        check_failures(self.failures, self.ran, run_id=self.run.id,
                       resumable=self.journal is not None,
                       ran_by_arm=self.ran_by_arm if self._per_arm else None)

    def failure_note(self) -> str | None:
        """Why the estimate is missing branches, when some failed after their retry: left out,
        they bias it towards the branches that did not fail, so the result must say so."""
        if not self.failures:
            return None
        retried = " after a retry" if self.failures[0].attempts > 1 else ""
        return (f"{len(self.failures)} of {self.ran} branch(es) failed{retried} and were "
                f"left out of the estimate (first: {self.failures[0].describe()}); fix the "
                "agent and run again")

    def failure_rows(self) -> tuple[dict[str, Any], ...]:
        return tuple(f.to_dict() for f in self.failures)

    @property
    def tripped(self) -> str | None:
        return self.meter.tripped

    def release(self, *, failed: bool = False) -> None:
        """Give the attribution's lease up if the estimate ends without finishing it (it
        raised, was interrupted, or returned early), so a resume in this process may take it;
        the branches stored so far stay. ``failed``: the estimate raised, so a row this
        session began that still holds no branch and no result is removed
        (``RunStore.drop_empty_attribution``) rather than left ``running`` with nothing in it."""
        if self._own_bar:
            self._own_bar = False
            # one that stopped before its budget was spent says so, and why
            self.progress.done(truncated=self._truncated)
        if self.store is None or self.attribution_id is None:
            return
        try:
            if self.store.holds(self.attribution_id):
                self.store.release_attribution(self.attribution_id)
            if failed and self._began:
                self.store.drop_empty_attribution(self.attribution_id)
        except StoreError:  # the store is gone: nothing to free, and the cause matters more
            pass

    def _say_if_waited(self) -> None:
        """Warn (``WaitedOneAtATime``) when CAR chose to run the branches one at a time and the
        process mostly waited: from Python nothing said so, and a trial's seed-ignoring hosted
        model ran out of budget in four of five estimates at 26 s each, where
        ``executor="async"`` answered in 9 s. A failing test shows it too, so it names the
        plugin's flag (a trial read the keyword there)."""
        seconds = time.monotonic() - self._clock[0]
        share = waited_share(self.executor, self._given, seconds,
                             time.process_time() - self._clock[1])
        if share is not None:
            warnings.warn(WaitedOneAtATime(waited_words(
                share, seconds, 'pass executor="async" to run 16 at once (in the pytest '
                'plugin, --car-executor async)')), stacklevel=2)

    def finish(self, result: Result) -> None:
        """Store the result, unless the branches that failed are too many to leave out (then
        ``BranchesFailed``, and the attribution stays open for a resume)."""
        self._truncated = bool(getattr(result, "truncated", False))
        self._say_if_waited()
        check_failures(self.failures, self.ran, run_id=self.run.id, final=True,
                       ran_by_arm=self.ran_by_arm if self._per_arm else None,
                       resumable=self.journal is not None)
        if self.store is not None and self.attribution_id is not None:
            status = (AttributionStatus.TRUNCATED if result.truncated
                      else AttributionStatus.COMPLETE)
            self.store.finish_attribution(self.attribution_id, result, status,
                                          params={**self.params, "outcome": self.outcome.name},
                                          replace=self.replace)
