"""Executors: the same seed gives the same estimate on every backend, the budget is checked
before each task starts (also when tasks run concurrently), failed branches are retried once
and then reported, never dropped, and memory can be kept to summaries."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import Any, cast

import pytest

import car_core as car
from car_core.engine.execution import (
    AsyncioExecutor,
    Failure,
    Results,
    Sequential,
    Task,
    brancher,
    default_executor,
    execute,
    make_executor,
)
from car_core.errors import (
    BranchesFailed,
    InvalidInput,
    OutcomeError,
    PolicyError,
    StoreReadOnly,
)
from car_core.model.budget import Budget, BudgetMeter
from car_core.model.interventions import compile_plan
from car_core.model.seeding import branch_noise
from car_core.store import RunStore, StoreJournal
from car_core.testing import synthetic as syn

BACKENDS = {
    "sequential": lambda: Sequential(),
    "async-1": lambda: AsyncioExecutor(1),
    "async-7": lambda: AsyncioExecutor(7),
}


def two_arm_tasks(run: car.Trajectory, steps: tuple[int, ...], rollouts: int,
                  seed: int = 0) -> list[Task]:
    """Tasks the way an estimator builds them: one arm per resampled step, coupled noise."""
    tasks = []
    for k in steps:
        plan = compile_plan(run, car.do_resample(k))
        tasks += [Task(arm=f"resample@{k}", rollout=r, plan=plan,
                       noise=branch_noise(seed, r, plan.describe(), True))
                  for r in range(rollouts)]
    return tasks


class Locked:
    """A thread-safe call counter around a policy, with the peak number of calls at once."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.lock = threading.Lock()
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        with self.lock:
            self.calls += 1
        return self.fn(*args)


@pytest.mark.parametrize("name", sorted(syn.catalogue()))
def test_every_backend_gives_the_same_estimate_for_one_seed(name: str) -> None:
    model = syn.catalogue()[name]
    run = model.failing_run(seed=1)
    k = min(2, model.n_steps - 1)
    dists = {b: car.intervene(run, model.agent(), car.do_resample(k), outcome=model.outcome,
                              rollouts=24, seed=7, executor=make())
             for b, make in BACKENDS.items()}
    ref = dists["sequential"]
    for backend, dist in dists.items():
        assert dist.values == ref.values, backend
        assert (dist.mean, dist.ci) == (ref.mean, ref.ci), backend
        assert [t.digest for t in dist.trajectories] == [t.digest for t in ref.trajectories]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_execute_returns_results_in_task_order(backend: str, pivot_model: syn.SyntheticSCM,
                                               pivot_run: car.Trajectory) -> None:
    tasks = two_arm_tasks(pivot_run, (1, 3), rollouts=6)
    out = car.engine.agent.OutcomeFn(pivot_model.outcome)
    results = execute(tasks, brancher(pivot_run, pivot_model.agent(), out), BudgetMeter(None),
                      executor=BACKENDS[backend](), progress=False)
    assert [t for t, _ in results] == tasks
    assert results.failures == []


class ReverseFinishAgent:
    """An async agent whose branch ``r`` only finishes after branch ``r + 1`` did, so the
    completion order is the reverse of the task order — with no sleeping."""

    name, couples_noise = "reverse", True

    def __init__(self, model: syn.SyntheticSCM, n: int) -> None:
        self.inner = model.agent()
        self.n = n
        self.events: dict[int, asyncio.Event] = {}
        self.finished: list[int] = []  # rollouts in the order their branches finished

    def _event(self, r: int) -> asyncio.Event:
        return self.events.setdefault(r, asyncio.Event())

    def branch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        raise AssertionError("an agent with abranch must be awaited, not threaded")

    async def abranch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        r = noise.key[-1]
        if r + 1 < self.n:
            await self._event(r + 1).wait()
        traj = self.inner.branch(run, plan, noise)
        self.finished.append(r)
        self._event(r).set()
        return traj


def test_async_agent_is_awaited_and_results_are_reordered(pivot_model: syn.SyntheticSCM,
                                                          pivot_run: car.Trajectory) -> None:
    n = 8
    agent = ReverseFinishAgent(pivot_model, n)
    tasks = two_arm_tasks(pivot_run, (2,), rollouts=n)
    seen: list[int] = []
    out = car.engine.agent.OutcomeFn(pivot_model.outcome)
    results = execute(tasks, brancher(pivot_run, agent, out), BudgetMeter(None),
                      executor=AsyncioExecutor(n), progress=False,
                      on_result=lambda t, _: seen.append(t.rollout))
    assert agent.finished == list(reversed(range(n)))  # they really finished in reverse
    assert [t.rollout for t, _ in results] == list(range(n))
    assert seen == list(range(n))  # on_result sees them in task order all the same
    seq = execute(tasks, brancher(pivot_run, pivot_model.agent(), out), BudgetMeter(None),
                  progress=False)
    assert [r.digest for _, r in results] == [r.digest for _, r in seq]


def test_concurrent_tasks_really_overlap_and_respect_the_cap() -> None:
    """Four tasks must be in flight together to pass the barrier; never more than four."""
    cap = 4
    barrier = threading.Barrier(cap, timeout=30)  # the timeout only turns a hang into a failure
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def fn(task: Task) -> car.Trajectory:
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        if task.rollout < cap:
            barrier.wait()
        with lock:
            state["now"] -= 1
        return car.Trajectory.new(context=task.rollout, steps=[])

    tasks = [Task("a", r, compile_plan_stub(), branch_noise(0, r, "a", True)) for r in range(12)]
    results = execute(tasks, fn, BudgetMeter(None), executor=AsyncioExecutor(cap),
                      progress=False)
    assert len(results) == 12
    assert state["peak"] == cap


def compile_plan_stub() -> Any:
    from car_core.model.interventions import Plan
    return Plan(start=0)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_budget_is_checked_before_each_task_starts(backend: str) -> None:
    """A rollout budget of 5 over 20 tasks with up to 7 at once: exactly 5 ever start."""
    started = Locked(lambda task: car.Trajectory.new(context=task.rollout, steps=[]))
    tasks = [Task("a", r, compile_plan_stub(), branch_noise(0, r, "a", True)) for r in range(20)]
    meter = BudgetMeter(Budget(rollouts=5))
    results = execute(tasks, started, meter, executor=BACKENDS[backend](), progress=False)
    assert started.calls == 5
    assert len(results) == 5 and meter.rollouts == 5
    assert meter.tripped == "rollout budget of 5 reached"


def test_token_budget_counts_rollouts_in_flight() -> None:
    """Each branch spends 10 tokens; with 4 in flight the forecast must include them, so a
    40-token budget starts 4 rollouts, not 4 + 3 more while the first ones are running."""
    def fn(task: Task) -> car.Trajectory:
        step = car.Step(index=0, action="a", meta={"origin": "live",
                                                   "usage": {"prompt_tokens": 10}})
        return car.Trajectory.new(context=None, steps=[step])

    counted = Locked(fn)
    meter = BudgetMeter(Budget(tokens=40))
    meter.rollouts, meter.tokens = 1, 10  # one finished rollout sets the forecast: 10 each
    tasks = [Task("a", r, compile_plan_stub(), branch_noise(0, r, "a", True)) for r in range(10)]
    execute(tasks, counted, meter, executor=AsyncioExecutor(8), progress=False)
    assert counted.calls == 3 and meter.tokens == 40


class Flaky:
    """A policy that raises on chosen (rollout, attempt) pairs; counts attempts per rollout."""

    def __init__(self, model: syn.SyntheticSCM, fail: dict[int, int]) -> None:
        self.model, self.fail = model, fail  # rollout -> how many attempts fail
        self.attempts: dict[int, int] = {}
        self.lock = threading.Lock()

    def fn(self, run: car.Trajectory, out: Any) -> Any:
        inner = brancher(run, self.model.agent(), out)

        def call(task: Task) -> car.Trajectory:
            with self.lock:
                n = self.attempts[task.rollout] = self.attempts.get(task.rollout, 0) + 1
            if n <= self.fail.get(task.rollout, 0):
                raise PolicyError("the model server dropped the connection", step=2)
            return inner(task)
        return call


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_branch_that_fails_once_is_retried_and_counts(backend: str,
                                                        pivot_model: syn.SyntheticSCM,
                                                        pivot_run: car.Trajectory) -> None:
    tasks = two_arm_tasks(pivot_run, (2,), rollouts=6)
    out = car.engine.agent.OutcomeFn(pivot_model.outcome)
    flaky = Flaky(pivot_model, {3: 1})
    results = execute(tasks, flaky.fn(pivot_run, out), BudgetMeter(None),
                      executor=BACKENDS[backend](), progress=False)
    clean = execute(tasks, brancher(pivot_run, pivot_model.agent(), out), BudgetMeter(None),
                    progress=False)
    assert flaky.attempts[3] == 2
    assert [r.digest for _, r in results] == [r.digest for _, r in clean]
    assert results.failures == []


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_branch_that_fails_twice_is_reported_not_dropped(backend: str,
                                                           pivot_model: syn.SyntheticSCM,
                                                           pivot_run: car.Trajectory) -> None:
    tasks = two_arm_tasks(pivot_run, (2,), rollouts=6)
    out = car.engine.agent.OutcomeFn(pivot_model.outcome)
    flaky = Flaky(pivot_model, {1: 5, 4: 5})
    meter = BudgetMeter(None)
    results = execute(tasks, flaky.fn(pivot_run, out), meter, executor=BACKENDS[backend](),
                      progress=False)
    assert [t.rollout for t, _ in results] == [0, 2, 3, 5]
    assert [(f.task.rollout, f.attempts) for f in results.failures] == [(1, 2), (4, 2)]
    assert "PolicyError: the model server dropped the connection" in results.failures[0].error
    assert flaky.attempts[1] == 2  # retried once, not more
    assert meter.rollouts == 6  # a failed branch still spent its rollout


def _timing_out(model: syn.SyntheticSCM, rate: float) -> car.FunctionAgent:
    """The run's agent with a tool that times out at step 3 on a ``rate`` share of branches
    (drawn from the step's own noise, so a retry of the same branch times out again)."""
    inner = model.policy

    def policy(history: car.History, rng: Any) -> Any:
        action = inner(history, rng)
        if history.index == 3 and rng.random() < rate:
            raise RuntimeError("tool timeout")
        return action

    return car.FunctionAgent(policy=policy, environment=model.environment,
                             is_final=lambda a: bool(a.get("final")), max_steps=6,
                             name=model.agent().name)


def test_intervene_reports_failed_branches_and_estimates_from_the_rest(
        pivot_model: syn.SyntheticSCM, pivot_run: car.Trajectory) -> None:
    dist = car.intervene(pivot_run, _timing_out(pivot_model, 0.05), car.do_resample(2),
                         outcome=pivot_model.outcome, rollouts=40, seed=3)
    # seed 3's draws time out on 2 of the 40 branches: within the 10% an estimate leaves out
    assert 1 <= len(dist.failures) <= 4
    assert all(f["attempts"] == 2 and f["step"] == 3 for f in dist.failures)
    assert all("tool timeout" in f["error"] for f in dist.failures)
    assert dist.n + len(dist.failures) == 40 and len(dist.values) == dist.n
    assert dist.to_dict()["failures"] == list(dist.failures)


def test_intervene_stops_when_more_than_a_tenth_of_its_branches_fail(
        pivot_model: syn.SyntheticSCM, pivot_run: car.Trajectory) -> None:
    with pytest.raises(BranchesFailed, match="tool timeout") as info:
        car.intervene(pivot_run, _timing_out(pivot_model, 0.5), car.do_resample(2),
                      outcome=pivot_model.outcome, rollouts=20, seed=0)
    err = info.value
    assert len(err.failures) > 2 and f"{len(err.failures)} of 20 branches" in str(err)
    assert err.step == 3 and err.first is err.failures[0] and "run it again" in str(err)


def test_intervene_raises_when_every_branch_fails(pivot_run: car.Trajectory) -> None:
    def policy(history: car.History, rng: Any) -> Any:
        raise KeyError("missing field")

    agent = car.FunctionAgent(policy=policy, max_steps=6)  # another agent on purpose: forced
    with pytest.raises(PolicyError, match="missing field"):
        car.intervene(pivot_run, agent, car.do_resample(2), outcome=lambda r: 1.0, rollouts=3,
                      force_agent=True)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_bad_input_from_a_branch_stops_the_run_without_retry(backend: str,
                                                             pivot_model: syn.SyntheticSCM,
                                                             pivot_run: car.Trajectory) -> None:
    scored = Locked(lambda run, rng: 2.0)  # outside [0, 1]: the caller's bug, not the agent's
    with pytest.raises(OutcomeError):
        car.intervene(pivot_run, pivot_model.agent(), car.do_resample(2), outcome=scored,
                      rollouts=12, executor=BACKENDS[backend]())
    concurrency = getattr(BACKENDS[backend](), "concurrency", 1)
    assert scored.calls <= concurrency  # stopped at once, nothing retried


def test_keep_holds_summaries_while_the_journal_holds_the_branches(
        pivot_model: syn.SyntheticSCM, pivot_run: car.Trajectory, store: RunStore) -> None:
    store.save(pivot_run)
    aid = store.begin_attribution(pivot_run.id, "test", {})
    tasks = two_arm_tasks(pivot_run, (2, 4), rollouts=5)
    seen: list[Any] = []
    out = car.engine.agent.OutcomeFn(pivot_model.outcome)
    results = execute(tasks, brancher(pivot_run, pivot_model.agent(), out), BudgetMeter(None),
                      journal=StoreJournal(store, aid), keep=lambda t: t.outcome.value,
                      on_result=lambda t, r: seen.append(r), progress=False)
    assert all(isinstance(v, float) for _, v in results)
    assert all(isinstance(t, car.Trajectory) for t in seen)
    stored = {(b["arm"], b["rollout"]): b["outcome"] for b in store.branches(aid)}
    assert stored == {(t.arm, t.rollout): v for t, v in results}


class BreakingJournal(StoreJournal):
    """The disk turns read-only after ``ok`` writes."""

    def __init__(self, store: RunStore, aid: str, ok: int) -> None:
        super().__init__(store, aid)
        self.ok = ok

    def write(self, task: Any, result: Any) -> None:
        if self.ok == 0:
            raise StoreReadOnly("disk went read-only", hint="free the disk and resume")
        self.ok -= 1
        super().write(task, result)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_journal_that_cannot_write_stops_and_keeps_what_was_written(
        backend: str, pivot_model: syn.SyntheticSCM, pivot_run: car.Trajectory,
        store: RunStore) -> None:
    store.save(pivot_run)
    aid = store.begin_attribution(pivot_run.id, "test", {})
    tasks = two_arm_tasks(pivot_run, (2,), rollouts=30)
    started = Locked(lambda task: brancher(pivot_run, pivot_model.agent(),
                                           car.engine.agent.OutcomeFn(pivot_model.outcome))(task))
    executor = BACKENDS[backend]()
    with pytest.raises(StoreReadOnly):
        execute(tasks, started, BudgetMeter(None), executor=executor,
                journal=BreakingJournal(store, aid, ok=4), progress=False)
    assert len(list(store.branches(aid))) == 4
    # nothing new starts once the journal failed: at most the branches already in flight
    assert started.calls <= 5 + getattr(executor, "concurrency", 1)


def test_results_is_a_list_with_failures() -> None:
    task = Task("a", 0, compile_plan_stub(), branch_noise(0, 0, "a", True))
    failure = Failure(task, "RuntimeError: x", 2)
    res = Results([], [failure])
    assert res == [] and res.failures == [failure]
    assert failure.to_dict() == {"arm": "a", "rollout": 0, "error": "RuntimeError: x",
                                 "attempts": 2, "step": None}


def test_make_executor_by_name() -> None:
    assert isinstance(make_executor("sequential"), Sequential)
    ex = make_executor("async", concurrency=3)
    assert isinstance(ex, AsyncioExecutor) and ex.concurrency == 3
    with pytest.raises(InvalidInput, match="unknown executor 'threads'"):
        make_executor("threads")
    with pytest.raises(InvalidInput, match="concurrency=0"):
        make_executor("async", concurrency=0)


def test_default_executor_follows_the_agent(pivot_model: syn.SyntheticSCM) -> None:
    assert isinstance(default_executor(pivot_model.agent()), Sequential)
    assert isinstance(default_executor(ReverseFinishAgent(pivot_model, 1)), AsyncioExecutor)
    model_backed = replace(pivot_model.agent())
    model_backed.prefers_concurrency = True  # type: ignore[attr-defined]
    assert isinstance(default_executor(model_backed), AsyncioExecutor)
    in_process = ReverseFinishAgent(pivot_model, 1)
    in_process.prefers_concurrency = False  # type: ignore[attr-defined]  # says it, with abranch
    assert isinstance(default_executor(in_process), Sequential)


class AsyncStopAgent:
    """An agent whose ``branch`` and ``abranch`` both take ``stop``; notes what ``abranch``
    was given."""

    name, couples_noise = "async-stop", True

    def __init__(self, model: syn.SyntheticSCM) -> None:
        self.inner = model.agent()
        self.given: list[bool] = []

    def branch(self, run: car.Trajectory, plan: Any, noise: Any,
               stop: Any = None) -> car.Trajectory:
        return self.inner.branch(run, plan, noise, stop=stop)

    async def abranch(self, run: car.Trajectory, plan: Any, noise: Any,
                      stop: Any = None) -> car.Trajectory:
        self.given.append(stop is not None)
        return self.inner.branch(run, plan, noise, stop=stop)


def test_the_asyncio_executor_hands_stop_to_an_abranch_that_takes_it(
        pivot_model: syn.SyntheticSCM, pivot_run: car.Trajectory) -> None:
    def outcome(run: car.Trajectory, rng: Any) -> float:
        return pivot_model.outcome(run, rng)

    tasks = two_arm_tasks(pivot_run, (2,), rollouts=3)
    agent = AsyncStopAgent(pivot_model)
    execute(tasks, brancher(pivot_run, agent, outcome), BudgetMeter(None),
            executor=AsyncioExecutor(2), progress=False)
    assert agent.given == [False] * 3  # an outcome that never settles: nothing to hand
    outcome.settled = lambda run: False  # type: ignore[attr-defined]
    execute(tasks, brancher(pivot_run, agent, outcome), BudgetMeter(None),
            executor=AsyncioExecutor(2), progress=False)
    assert agent.given == [False] * 3 + [True] * 3


class BreaksWhenCancelled:
    """An async task function: rollout 0 stops the run with bad input while the others wait;
    those, cancelled, take a while to clean up and break with another error on their way out
    (as an anyio task group does). A try after the first returns at once."""

    def __init__(self) -> None:
        self.tries: dict[int, int] = {}
        self.cleaned = 0

    def __call__(self, task: Task) -> Any:
        raise AssertionError("an async task function is awaited, never called")

    async def acall(self, task: Task) -> Any:
        self.tries[task.rollout] = self.tries.get(task.rollout, 0) + 1
        if self.tries[task.rollout] > 1:
            return None
        if task.rollout == 0:
            await asyncio.sleep(0.1)
            raise InvalidInput("a branch found the caller's input wrong")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0.1)
            raise RuntimeError("connection closed") from None
        finally:
            self.cleaned += 1


def test_a_stopped_run_awaits_its_cancelled_branches_and_tries_none_again(
        pivot_run: car.Trajectory) -> None:
    fn = BreaksWhenCancelled()
    with pytest.raises(InvalidInput):
        execute(two_arm_tasks(pivot_run, (2,), rollouts=4), fn, BudgetMeter(None),
                executor=AsyncioExecutor(4), progress=False)
    assert fn.cleaned == 3  # every branch in flight ended before the error reached the caller
    assert fn.tries == {0: 1, 1: 1, 2: 1, 3: 1}  # none started again once the run stopped


@pytest.mark.parametrize(("keep", "grows"), [(lambda t: t.outcome.value, False), (None, True)])
def test_memory_stays_flat_with_a_journal_and_keep(keep: Any, grows: bool,
                                                   store: RunStore) -> None:
    """Python memory held after 20 finished branches vs after 100: flat when ``keep`` holds
    only outcome values (the store holds the branches), growing by the trajectories when it
    keeps everything — which shows the measurement can see the difference."""
    import tracemalloc

    model = syn.late_pivot()  # 24 steps a branch: a trajectory is tens of kB in memory
    run = model.failing_run(seed=0)
    store.save(run)
    aid = store.begin_attribution(run.id, "test", {})
    plan = compile_plan(run, car.do_resample(0))
    tasks = [Task("resample@0", r, plan, branch_noise(0, r, "r", True)) for r in range(100)]
    held: dict[int, int] = {}

    def sample(task: Task, result: Any) -> None:
        if task.rollout in (19, 99):
            held[task.rollout] = tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        execute(tasks, brancher(run, model.agent(), car.engine.agent.OutcomeFn(model.outcome)),
                BudgetMeter(None), journal=StoreJournal(store, aid), keep=keep,
                on_result=sample, progress=False)
    finally:
        tracemalloc.stop()
    per_branch = (held[99] - held[19]) / 80
    # measured here: about 20 kB per kept 24-step trajectory, under 400 bytes per summary;
    # the bounds sit a factor of about 5 from each, so allocator noise cannot flip them
    if grows:
        assert per_branch > 4_000
    else:
        assert per_branch < 2_000


class CountingTasks:
    """Wraps ``Session.task`` to count the tasks an estimator builds."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from car_core.estimators import _session
        self.made = 0
        original = _session.Session.task

        def task(session: Any, *args: Any) -> Task:
            self.made += 1
            return original(session, *args)
        monkeypatch.setattr(_session.Session, "task", task)


@pytest.mark.parametrize("make", [lambda: Sequential(), lambda: AsyncioExecutor(4)])
def test_a_huge_rollout_cap_builds_only_the_tasks_the_budget_allows(
        monkeypatch, pivot_model, pivot_run, tmp_path, make) -> None:
    # 10**9 rollouts per arm would be ~10**10 tasks if built up front; the budget of 40 lets
    # 40 start, and each batch pulls at most one more (refused) task per executor slot.
    counter = CountingTasks(monkeypatch)
    with RunStore(tmp_path / "car.db") as store:
        res = car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                              rollouts=10**9, budget=40, seed=0, progress=False,
                              executor=make(), store=store)
        assert res.rollouts_used == 40  # every one the budget allows, and no more
        assert len(list(store.branches(res.attribution_id))) == 40
    assert counter.made <= 40 + 4


def test_intervene_with_a_huge_rollout_count_pulls_only_what_the_budget_allows(
        pivot_model, pivot_run) -> None:
    pulled = 0
    original = execute

    def counting(tasks: Any, *args: Any, **kw: Any) -> Results:
        def count() -> Any:
            nonlocal pulled
            for t in tasks:
                pulled += 1
                yield t
        return original(count(), *args, **kw)

    import car_core.engine.replay as replay
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(replay, "execute", counting)
        dist = car.intervene(pivot_run, pivot_model.agent(), car.do_resample(2),
                             outcome=pivot_model.outcome, rollouts=10**12, budget=40,
                             progress=False)
    assert dist.n == 40 and dist.truncated
    assert pulled == 41  # the 41st is pulled, refused by the budget and never run


def test_a_resumed_lazy_batch_takes_journaled_branches_in_task_order(
        pivot_model, pivot_run, tmp_path) -> None:
    # half the branches are journaled by a first, budget-capped call; a second call over the
    # same lazy tasks takes them from the journal and runs only the rest, in task order
    agent = pivot_model.agent()
    with RunStore(tmp_path / "car.db") as store:
        store.save(pivot_run)
        aid = store.begin_attribution(pivot_run.id, "test", {})
        journal = StoreJournal(store, aid)
        fn = brancher(pivot_run, agent, pivot_model.outcome)
        first = execute(iter(two_arm_tasks(pivot_run, (1, 3), 6)), fn,
                        BudgetMeter(Budget(rollouts=5)), journal=journal, progress=False)
        assert len(first) == 5
        fresh: list[tuple[str, int]] = []
        second = execute(iter(two_arm_tasks(pivot_run, (1, 3), 6)), fn, BudgetMeter(None),
                         journal=journal, progress=False,
                         on_result=lambda t, r: fresh.append((t.arm, t.rollout)))
        assert [(t.arm, t.rollout) for t, _ in second] == [
            (t.arm, t.rollout) for t in two_arm_tasks(pivot_run, (1, 3), 6)]
        assert [r.id for _, r in second][:5] == [r.id for _, r in first]
        assert len(fresh) == 12 and len(list(store.branches(aid))) == 12


class WaitingAgent:
    """An async agent whose branches wait on a 'server' (``asyncio.sleep``) before answering,
    as a model-backed agent's do: the executor runs many of them at once on its loop."""

    couples_noise = True

    def __init__(self, model: syn.SyntheticSCM, wait: float = 0.01) -> None:
        self.inner, self.wait = model.agent(), wait
        self.name = self.inner.name  # the planted model's agent, only waiting: the same agent

    def branch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        return self.inner.branch(run, plan, noise)

    async def abranch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        await asyncio.sleep(self.wait)
        return self.inner.branch(run, plan, noise)


def test_a_sync_judge_scores_concurrent_branches_off_the_loop(
        pivot_model: syn.SyntheticSCM, pivot_run: car.Trajectory) -> None:
    """32 branches, 16 at once, each judged by a sync judge that waits 0.05 s (a hosted LLM
    judge): off the loop the judges wait together (about 2 x 0.05 s), on it one at a time
    (32 x 0.05 = 1.6 s). Asserting under half the serial time leaves ~0.7 s of slack for a
    loaded machine, and the judges must never run on the executor's loop thread."""
    n, wait = 32, 0.05
    threads: set[str] = set()
    lock = threading.Lock()

    def slow_judge(run: car.Trajectory, rng: Any) -> float:
        with lock:
            threads.add(threading.current_thread().name)
        time.sleep(wait)
        return pivot_model.outcome(run, rng)

    tasks = two_arm_tasks(pivot_run, (2,), rollouts=n)
    start = time.perf_counter()
    results = execute(tasks, brancher(pivot_run, WaitingAgent(pivot_model), slow_judge),
                      BudgetMeter(None), executor=AsyncioExecutor(16), progress=False)
    elapsed = time.perf_counter() - start
    assert len(results) == n and results.failures == []
    assert elapsed < n * wait / 2, f"{elapsed:.2f}s: the judges ran one at a time"
    assert "car-executor" not in threads  # the loop's own thread never ran a judge
    seq = execute(tasks, brancher(pivot_run, pivot_model.agent(), pivot_model.outcome),
                  BudgetMeter(None), progress=False)
    assert [r.outcome for _, r in results] == [r.outcome for _, r in seq]  # same values


def test_a_sync_judge_that_calls_asyncio_run_scores_on_the_async_executor(
        pivot_model: syn.SyntheticSCM, pivot_run: car.Trajectory) -> None:
    """The usual sync wrapper of an async LLM judge, ``asyncio.run(...)``, works on every
    branch of the default executor of an agent that waits, as it does on the record."""
    async def ajudge(run: car.Trajectory, rng: Any) -> float:
        await asyncio.sleep(0)
        return pivot_model.outcome(run, rng)

    def wrapped(run: car.Trajectory, rng: Any) -> float:
        return asyncio.run(ajudge(run, rng))

    agent = WaitingAgent(pivot_model, wait=0.0)
    assert isinstance(default_executor(agent), AsyncioExecutor)
    got = car.intervene(pivot_run, agent, car.do_resample(2), outcome=wrapped, rollouts=24,
                        seed=3)
    ref = car.intervene(pivot_run, pivot_model.agent(), car.do_resample(2),
                        outcome=pivot_model.outcome, rollouts=24, seed=3)
    assert got.values == ref.values and got.mean == ref.mean


class CancelledElsewhere:
    """A branch whose client's own loop is shut down under it: the call raises
    ``CancelledError`` though nobody stopped the estimate (rollouts in ``cancel``, every
    attempt), as an async client's request does when the loop it was made on closes."""

    def __init__(self, inner: Any, cancel: set[int], is_async: bool) -> None:
        self.inner, self.cancel, self.attempts = inner, cancel, dict[int, int]()
        if is_async:
            self.acall = self._acall

    def __call__(self, task: Task) -> car.Trajectory:
        self.attempts[task.rollout] = self.attempts.get(task.rollout, 0) + 1
        if task.rollout in self.cancel:
            raise asyncio.CancelledError("the client's loop was shut down")
        return cast(car.Trajectory, self.inner(task))

    async def _acall(self, task: Task) -> car.Trajectory:
        await asyncio.sleep(0)
        return self(task)


@pytest.mark.parametrize("is_async", [False, True])
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_branch_cancelled_by_someone_else_is_a_failure_not_dropped(
        backend: str, is_async: bool, pivot_model: syn.SyntheticSCM,
        pivot_run: car.Trajectory) -> None:
    """A branch cancelled by something other than the estimate's own stop (the loop of the
    user's async client shutting down) was dropped with neither a result nor a ``Failure``:
    the estimate read the hole as a spent budget. It is retried, then reported, like a branch
    that raised."""
    tasks = two_arm_tasks(pivot_run, (2,), rollouts=6)
    out = car.engine.agent.OutcomeFn(pivot_model.outcome)
    fn = CancelledElsewhere(brancher(pivot_run, pivot_model.agent(), out), {2}, is_async)
    meter = BudgetMeter(None)
    results = execute(tasks, fn, meter, executor=BACKENDS[backend](), progress=False)
    assert [t.rollout for t, _ in results] == [0, 1, 3, 4, 5]
    assert [(f.task.rollout, f.attempts) for f in results.failures] == [(2, 2)]
    assert "CancelledError" in results.failures[0].error
    assert fn.attempts[2] == 2
