"""How rollouts run. The engine hands a stream of independent ``Task``s to an executor,
produced lazily so a cap far above the budget costs nothing; every task carries its own noise,
so results never depend on the order or place they ran in.

Executors share one small interface (``Executor.run``): ``Sequential`` (in-process, one at a
time: reproducible, the default for synthetic agents), ``AsyncioExecutor`` (bounded concurrency
for agents that wait on model servers) and ``RayExecutor`` (``car_core.engine.ray_executor``,
for more than one
machine); ``make_executor`` builds one by name and ``resolve_executor`` turns whatever an
estimator's ``executor=`` was given (an object, a name or None) into one. ``execute`` returns
finished results in task order, so the same root seed gives the same estimate on every
backend.

The budget is checked before each task starts (in-flight tasks count against it); a task that
was not started is simply not in the results, and the caller reports the estimate as truncated.
A branch that raises, comes back with status ``error`` or whose worker dies, is retried once and
then returned as a ``Failure`` in ``Results.failures``: never silently dropped, never scored
(``car_core.engine.tasks``); the estimators judge what failed with ``tasks.check_failures``. Errors
in the caller's own inputs (``InvalidInput``, store errors) and a model server that stays
unreachable after the policy's own bounded retries (``ModelUnavailable``) are not retried; they
stop the run, and the branches already written to a journal stay there for a resume.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence, Sized
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, Literal, Protocol, TypeVar, cast

from car_core import defaults
from car_core.engine.agent import Agent, AsyncAgent
from car_core.engine.branching import branch_scope
from car_core.engine.progress import Progress as Progress  # re-exported: estimators take it
from car_core.engine.progress import ProgressBar as ProgressBar
from car_core.engine.progress import progress_bar
from car_core.engine.tasks import (
    Failure as Failure,  # re-exported: Task and Failure live in the base module
)
from car_core.engine.tasks import Task as Task
from car_core.engine.tasks import ascore_branch, errored_branch, failure_of, run_branch
from car_core.engine.tasks import describe_error as describe_error
from car_core.errors import (
    AdapterError,
    BudgetExhausted,
    InvalidInput,
    ModelUnavailable,
    NothingToAttribute,
    RunError,
    SideEffectBlocked,
    StoreError,
)
from car_core.model.budget import BudgetMeter
from car_core.model.capabilities import Capability, capabilities, takes_param
from car_core.model.checks import is_whole
from car_core.model.outages import is_stale_loop
from car_core.model.outcome import OutcomeFn, OutcomeLike
from car_core.model.trajectory import Trajectory
from car_core.model.vocabulary import RunStatus

R = TypeVar("R")

# Errors that say the caller's inputs are wrong, or that every branch would hit again (a
# side-effect tool with no simulator, glue that cannot fork, a model server that is down, has no
# such model or refuses the key — model policies raise ModelUnavailable only after their own
# bounded retries): retrying cannot help, and leaving such branches out would bias the estimate
# towards the branches that avoided them (or leave nothing to estimate from), so they stop the
# run.
NOT_RETRIED: tuple[type[BaseException], ...] = (
    InvalidInput, RunError, StoreError, BudgetExhausted, NothingToAttribute, SideEffectBlocked,
    AdapterError, ModelUnavailable)
RETRIES = 1  # runs again of a branch that raised, where that re-runs its path
# (``seeding.replays_alike``); elsewhere none, so each error counts towards the failed share
_NO_SPEND = SimpleNamespace(steps=())  # what a failed branch is charged as: one rollout, no tokens


class Results(list[tuple[Task, Any]]):
    """The finished ``(task, result)`` pairs in task order, plus ``failures``: the branches
    that failed after their retry, also in task order."""

    def __init__(self, pairs: Sequence[tuple[Task, Any]] = (),
                 failures: Sequence[Failure] = ()) -> None:
        super().__init__(pairs)
        self.failures: list[Failure] = list(failures)


class Journal(Protocol):
    """Where finished branches are kept so an interrupted estimate can resume: ``lookup``
    returns the stored result of a task that already ran (or None), ``write`` stores one."""

    def stored(self) -> Collection[tuple[str, int]]:
        """The ``(arm, rollout)`` keys already kept, read once when a batch starts."""
        ...

    def lookup(self, task: Task) -> Any: ...

    def write(self, task: Task, result: Any) -> None: ...


class Executor(Protocol):
    """Runs tasks; yields ``(task, result)`` as they finish, with the very ``Task`` objects it
    was given. ``may_start`` is asked right before each task starts and stops the run when it
    returns False. ``fn`` never raises for a failed branch (it returns a ``Failure``); anything
    it does raise stops the run and is re-raised to the caller."""

    def run(self, fn: Callable[[Task], Any], tasks: Iterable[Task],
            may_start: Callable[[], bool]) -> Iterator[tuple[Task, Any]]: ...


def _name_task(exc: BaseException, task: Task) -> None:
    """Write on ``exc`` the task whose branch raised it (``exc.task``), unless it names one:
    a population's run that tests several fixes tells by it which fix's arm cannot run."""
    if getattr(exc, "task", None) is None:
        exc.task = task  # type: ignore[attr-defined]


def _cancelling() -> bool:
    """Whether the task running this coroutine is being cancelled (the executor stops)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Guarded:
    """``fn`` with the retry rule: its result, or a ``Failure`` after ``retries + 1`` failed
    attempts, and one more where the last error was an async client's object made on another
    event loop (``outages.is_stale_loop``): that fails once whatever the branch's path, so a
    second try favours no path, even where ``retries`` is 0 (an agent whose draws are its own).
    Offers ``acall`` when ``fn`` does, so an async agent is awaited, not threaded."""

    def __init__(self, fn: Callable[[Task], Any], retries: int = 1) -> None:
        self.fn = fn
        self.retries = retries
        self.is_async = callable(getattr(fn, "acall", None))

    def __call__(self, task: Task) -> Any:
        last: BaseException | None = None
        for attempt in range(self.retries + 2):
            if not self._runs(attempt, last):
                break
            try:
                return self.fn(task)
            except NOT_RETRIED as exc:
                _name_task(exc, task)
                raise
            except (Exception, asyncio.CancelledError) as exc:  # the agent broke: retry,
                last = exc  # then record (a CancelledError here is its client's loop's)
        return self._failure(task, last)

    async def acall(self, task: Task) -> Any:
        last: BaseException | None = None
        for attempt in range(self.retries + 2):
            if not self._runs(attempt, last):
                break
            try:
                return await self.fn.acall(task)  # type: ignore[attr-defined]
            except NOT_RETRIED as exc:
                _name_task(exc, task)
                raise
            except (Exception, asyncio.CancelledError) as exc:
                if _cancelling():  # the run stops: the branch broke as it was cancelled
                    raise asyncio.CancelledError from exc  # (an anyio task group), no new try
                # else cancelled by someone else (the loop of the agent's own client shut
                # down): a branch that broke, not a stop. Taken for a stop, it handed back
                # nothing and the estimate waited for it for ever
                last = exc
        return self._failure(task, last)

    def _runs(self, attempt: int, last: BaseException | None) -> bool:
        """Whether try ``attempt`` (from 0) runs: within ``retries``, or the one more a
        stale-loop error earns."""
        return attempt <= self.retries or (last is not None and is_stale_loop(last))

    def _failure(self, task: Task, exc: BaseException | None) -> Failure:
        return failure_of(task, exc, self.retries + 1)


class Brancher:
    """The ``fn`` estimators hand to ``execute``: one scored branch of ``run`` per task
    (``car_core.engine.tasks.run_branch``). Plain data, so Ray can ship it to other machines."""

    def __init__(self, run: Trajectory, agent: Agent, outcome: OutcomeLike) -> None:
        self.run, self.agent, self.outcome = run, agent, OutcomeFn(outcome)
        self.caps = capabilities(agent)  # read once, not once a branch

    def __call__(self, task: Task) -> Trajectory:
        return run_branch(self.run, self.agent, self.outcome, task, self.caps)


class _AsyncBrancher(Brancher):
    """A ``Brancher`` for an agent that offers ``abranch``: ``AsyncioExecutor`` awaits it, and
    the branch's score, off the loop for a sync outcome (``tasks.ascore_branch``)."""

    async def acall(self, task: Task) -> Trajectory:
        agent = cast(AsyncAgent, self.agent)
        with branch_scope():
            if self.outcome.settles and Capability.STOP in self.caps \
                    and takes_param(agent.abranch, "stop"):
                traj = await agent.abranch(self.run, task.plan, task.noise,  # type: ignore[call-arg]
                                           stop=self.outcome.settled)  # STOP, and it takes it
            else:
                traj = await agent.abranch(self.run, task.plan, task.noise)
        return await ascore_branch(self.run, traj, self.agent, self.outcome, task)


def brancher(run: Trajectory, agent: Agent, outcome: OutcomeLike) -> Brancher:
    """The task function for branches of ``run``; async when the agent offers ``abranch``."""
    cls = _AsyncBrancher if Capability.ASYNC_BRANCH in capabilities(agent) else Brancher
    return cls(run, agent, outcome)


WAIT_HINT_SECONDS = 10.0  # an estimate shorter than this is not worth a hint
WAIT_HINT_CPU = 0.25      # below this share of the wall time on the CPU, the process waited


class WaitedOneAtATime(UserWarning):
    """CAR chose to run an estimate's branches one at a time and the process mostly waited:
    the agent's model is likely a server CAR could not tell from an in-process model (a
    custom wrapper with no ``base_url`` or ``remote=True``), and the branches could have run
    at once. The CLI says it in its own words (``--executor async``)."""


def waited_share(chosen: object, given: object, seconds: float, cpu: float) -> float | None:
    """The share of ``seconds`` the process spent on the CPU (``cpu``) when CAR chose to run
    the branches one at a time (``chosen``; ``given``: what the caller named, None when CAR
    chose) for at least ``WAIT_HINT_SECONDS`` and mostly waited; else None."""
    if given is not None or not isinstance(chosen, Sequential) or seconds < WAIT_HINT_SECONDS:
        return None
    share = cpu / seconds
    return share if share < WAIT_HINT_CPU else None


def waited_words(share: float, seconds: float, remedy: str) -> str:
    """What the CLI's hint and ``WaitedOneAtATime`` say of such an estimate, ``remedy`` in
    the caller's own terms (a flag, or a keyword)."""
    return (f"the branches ran one at a time and the process mostly waited ({share:.0%} of "
            f"{seconds:.0f}s on the CPU): if the agent's model is a server, {remedy} (or say "
            "remote=True on the model, and CAR will choose it)")


class Sequential:
    """In-process, one task at a time: reproducible and the default for synthetic agents."""

    def run(self, fn: Callable[[Task], R], tasks: Iterable[Task],
            may_start: Callable[[], bool]) -> Iterator[tuple[Task, R]]:
        for task in tasks:
            if not may_start():
                return
            yield task, fn(task)


class _Control:
    """Shared between the consumer thread and the event loop: frees slots, stops the run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sem: asyncio.Semaphore | None = None
        self.running: set[asyncio.Task[None]] = set()
        self.stopped = False

    def attach(self, loop: asyncio.AbstractEventLoop, sem: asyncio.Semaphore) -> None:
        with self.lock:
            self.loop, self.sem = loop, sem

    def _soon(self, callback: Callable[[], None]) -> None:
        with self.lock:
            if self.loop is None:
                return
            try:
                self.loop.call_soon_threadsafe(callback)
            except RuntimeError:  # the loop already finished
                pass

    def release(self) -> None:
        """A result was consumed: one more task may start."""
        self._soon(lambda: self.sem.release() if self.sem else None)

    def stop(self) -> None:
        """Start nothing more; cancel awaitable branches (threads finish what they started)."""
        self.stopped = True

        def wake() -> None:
            for t in list(self.running):
                t.cancel()
            if self.sem is not None:
                self.sem.release()
        self._soon(wake)


class AsyncioExecutor:
    """At most ``concurrency`` branches at once, on an event loop in a helper thread: a sync
    ``agent.branch`` runs in a worker thread (``asyncio.to_thread``), an agent's ``abranch`` is
    awaited directly. The default for model-backed agents, whose time goes into waiting.

    A slot is freed only when the caller has taken the result, so results waiting to be
    stored never pile up beyond ``concurrency``. A run that stops early (a branch's error, the
    caller leaving the stream, ^C) cancels the awaited branches in flight and returns or raises
    only once every branch it started has ended, its cleanup run; one that breaks as it is
    cancelled is not tried again.
    """

    def __init__(self, concurrency: int = defaults.CONCURRENCY) -> None:
        if not is_whole(concurrency, 1):
            raise InvalidInput(f"concurrency={concurrency!r}: need at least 1",
                               hint="pass concurrency=N with N >= 1 (16 suits most servers)")
        self.concurrency = concurrency

    def run(self, fn: Callable[[Task], Any], tasks: Iterable[Task],
            may_start: Callable[[], bool]) -> Iterator[tuple[Task, Any]]:
        handoff: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        ctl = _Control()
        thread = threading.Thread(
            target=lambda: asyncio.run(self._drive(fn, tasks, may_start, handoff, ctl)),
            name="car-executor", daemon=True)
        thread.start()
        try:
            while True:
                kind, payload = handoff.get()
                if kind == "done":
                    return
                if kind == "raise":
                    raise payload
                yield payload
                ctl.release()
        finally:
            ctl.stop()
            thread.join()

    async def _drive(self, fn: Callable[[Task], Any], tasks: Iterable[Task],
                     may_start: Callable[[], bool],
                     handoff: queue.SimpleQueue[tuple[str, Any]], ctl: _Control) -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(self.concurrency,
                                                     thread_name_prefix="car-branch"))
        sem = asyncio.Semaphore(self.concurrency)
        ctl.attach(loop, sem)
        call_async = getattr(fn, "is_async", False)

        async def one(task: Task) -> None:
            try:
                if call_async:
                    result = await fn.acall(task)  # type: ignore[attr-defined]
                else:
                    result = await asyncio.to_thread(fn, task)
            except asyncio.CancelledError:
                return
            except BaseException as exc:  # an error that must stop the run
                ctl.stopped = True
                handoff.put(("raise", exc))
                return
            handoff.put(("item", (task, result)))

        try:
            for task in tasks:
                await sem.acquire()
                if ctl.stopped or not may_start():
                    break
                job = asyncio.create_task(one(task))
                ctl.running.add(job)
                job.add_done_callback(ctl.running.discard)
            if ctl.running:
                await asyncio.wait(set(ctl.running))
        except BaseException as exc:
            handoff.put(("raise", exc))
        finally:
            handoff.put(("done", None))


EXECUTORS = ("sequential", "async", "ray")
# What every ``executor=`` takes: an executor object, one of the ``EXECUTORS`` names, or None
# (chosen for the agent by ``default_executor``). Resolved in one place, ``resolve_executor``.
ExecutorName = Literal["sequential", "async", "ray"]
ExecutorLike = Executor | ExecutorName | None


def make_executor(name: str = "sequential", concurrency: int = defaults.CONCURRENCY,
                  address: str | None = None) -> Executor:
    """An executor by name: ``sequential``, ``async`` (``concurrency`` branches at once) or
    ``ray`` (``address`` of a running cluster, or None for a local one)."""
    if name == "sequential":
        return Sequential()
    if name == "async":
        return AsyncioExecutor(concurrency)
    if name == "ray":
        from car_core.engine.ray_executor import RayExecutor
        return RayExecutor(address=address, concurrency=concurrency)
    raise InvalidInput(f"unknown executor {name!r}", hint=f"use one of {', '.join(EXECUTORS)}")


def resolve_executor(executor: object, agent: Agent) -> Executor:
    """The executor an estimate runs on, from what the caller passed as ``executor=``: None
    → ``default_executor(agent)``; a name (``"sequential"``, ``"async"``, ``"ray"``) →
    ``make_executor(name)``; an object with a ``run`` method → itself. Anything else is
    ``InvalidInput`` naming the choices, raised before any branch runs. Results for a seed do
    not depend on which one runs them (every task carries its own noise)."""
    if executor is None:
        return default_executor(agent)
    if isinstance(executor, str):
        if executor not in EXECUTORS:
            raise InvalidInput(f"executor={executor!r} is not one of {', '.join(EXECUTORS)}",
                               hint=f"pass executor= one of {', '.join(map(repr, EXECUTORS))}, "
                                    "an executor object (car.AsyncioExecutor(16)) or None "
                                    "to let CAR choose for the agent")
        return make_executor(executor)
    if callable(getattr(executor, "run", None)):
        return cast(Executor, executor)
    raise InvalidInput(f"executor={executor!r} is neither an executor nor one of "
                       f"{', '.join(EXECUTORS)}",
                       hint=f"pass executor= one of {', '.join(map(repr, EXECUTORS))}, an "
                            "executor object (car.Sequential(), car.AsyncioExecutor(16), "
                            "car.RayExecutor()) or None to let CAR choose for the agent")


def default_executor(agent: Agent) -> Executor:
    """Sequential for in-process agents; ``AsyncioExecutor`` for agents that wait on a model
    (they offer ``abranch`` or set ``prefers_concurrency = True``). An agent that offers
    ``abranch`` but says ``prefers_concurrency = False`` (its model runs in this process, where
    branches at once gain nothing) keeps ``Sequential``."""
    caps = capabilities(agent)
    if Capability.CONCURRENCY in caps:
        return AsyncioExecutor()
    if Capability.ASYNC_BRANCH in caps and getattr(agent, "prefers_concurrency", None) is not False:
        return AsyncioExecutor()
    return Sequential()


def execute(tasks: Iterable[Task], fn: Callable[[Task], R], meter: BudgetMeter, *,
            executor: Executor | None = None, progress: Progress = None,
            label: str = "rollouts",
            on_result: Callable[[Task, R], None] | None = None,
            journal: Journal | None = None, keep: Callable[[R], Any] | None = None,
            retries: int = RETRIES) -> Results:
    """Run ``tasks`` under the budget; return the finished ``(task, result)`` pairs in task
    order, with the branches that failed after ``retries`` retries in ``.failures``.

    ``tasks`` may be a lazy iterable: it is consumed only as far as the budget lets tasks
    start, so memory and time follow what the budget allows, not how many tasks were asked for.

    With a ``journal``, tasks that already finished in an earlier, interrupted call are taken
    from it (and still counted against the budget, so a resumed estimate spends and reports
    exactly what an uninterrupted one would); new results are written to it as they finish,
    before anything else sees them. ``keep`` chooses what stays in memory of each result
    (default: all of it): with a journal holding the branches, ``keep=lambda t:
    t.outcome.value`` keeps memory flat however many branches finish; ``on_result`` still sees
    the full result. A journal that cannot be written stops the run with its error; every
    branch written before it stays written.

    ``on_result`` is called in task order, whatever order the executor finishes tasks in: a
    result that finishes ahead of an earlier task waits (in memory) until that one is in, so
    whatever an estimator builds from the stream (a sum of floats, the first rescued branch it
    keeps as an example) is the same on every executor.
    """
    total = len(tasks) if isinstance(tasks, Sized) else None
    started: dict[int, int] = {}  # id(task) -> position, for tasks handed to the executor
    slots: dict[int, tuple[Task, Any]] = {}
    failures: list[tuple[int, Failure]] = []
    lock = threading.Lock()  # the meter is shared with the executor's scheduling thread
    bar = progress_bar(progress, total, label)
    guarded = Guarded(fn, retries)
    # Journaled tasks found while the executor pulls tasks (possibly on its own thread) wait
    # here and are loaded and accepted on this thread, which owns the journal's connection.
    cached: deque[tuple[int, Task]] = deque()
    done = journal.stored() if journal is not None else frozenset()
    # For on_result in task order: positions started (or taken from the journal) and not yet
    # accepted, the results accepted ahead of one of them, and the position just handed to the
    # executor (it asks ``may_start`` about that task before it pulls the next).
    outstanding: set[int] = set()
    waiting: dict[int, tuple[Task, Any]] = {}
    pulled: list[int | None] = [None]

    def release(flush: bool = False) -> None:
        while waiting:
            first = min(waiting)
            with lock:
                ahead = bool(outstanding) and min(outstanding) < first
            if ahead and not flush:
                return
            task, result = waiting.pop(first)
            on_result(task, result)  # type: ignore[misc]

    def accept(pos: int, task: Task, result: Any, fresh: bool) -> None:
        if isinstance(result, Failure):
            with lock:
                meter.charge(_NO_SPEND)  # type: ignore[arg-type]
            failures.append((pos, result))
        else:
            with lock:
                meter.charge(result)
            if fresh and journal is not None:
                journal.write(task, result)
            if on_result is not None:
                waiting[pos] = (task, result)
            slots[pos] = (task, keep(result) if keep is not None else result)
        with lock:
            outstanding.discard(pos)
        if on_result is not None:
            release()
        if bar is not None:
            bar.update(1)

    def may_start() -> bool:
        with lock:
            allowed = meter.reserve()
            if allowed and pulled[0] is not None:
                outstanding.add(pulled[0])
            pulled[0] = None
            return allowed

    def feed() -> Iterator[Task]:
        for pos, task in enumerate(tasks):
            if (task.arm, task.rollout) in done:
                if not may_start():
                    return
                with lock:
                    outstanding.add(pos)
                cached.append((pos, task))
                continue
            started[id(task)] = pos
            with lock:
                pulled[0] = pos
            yield task

    def drain() -> None:
        while cached:
            pos, task = cached.popleft()
            stored = journal.lookup(task) if journal is not None else None
            if stored is None:  # gone since ``stored()`` was read: run it (already reserved)
                result = guarded(task)
                accept(pos, task, result, fresh=True)
            elif getattr(stored, "status", None) == RunStatus.ERROR:
                # kept by a version that scored errored branches: a failure, never an outcome
                parent = stored.lineage.parent_id if stored.lineage is not None else None
                exc = errored_branch(stored, parent)
                accept(pos, task, failure_of(task, exc, 0), fresh=False)
            else:
                accept(pos, task, stored, fresh=False)

    try:
        stream = (executor or Sequential()).run(guarded, feed(), may_start)
        try:
            for task, result in stream:
                drain()
                accept(started.pop(id(task)), task, result, fresh=True)
            drain()
            if on_result is not None:
                release(flush=True)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
    finally:
        if bar is not None and progress is not bar:
            bar.close()
    return Results([slots[p] for p in sorted(slots)],
                   [f for _, f in sorted(failures, key=lambda pf: pf[0])])
