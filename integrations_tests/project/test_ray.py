"""The Ray executor on a local 2-CPU cluster: the same seed gives the same estimate as the
in-process executor, a worker that dies is retried once and then reported, bad input still
stops the run, and an address where no cluster answers is a clear error before any rollout."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from ray import cloudpickle

import car_core as car
from car_core.engine.agent import OutcomeFn
from car_core.engine.execution import Task, brancher, execute, make_executor
from car_core.engine.ray_executor import RayExecutor
from car_core.errors import ExecutorUnavailable, OutcomeError
from car_core.model.budget import Budget, BudgetMeter
from car_core.model.interventions import compile_plan
from car_core.model.seeding import Stream, branch_noise
from car_core.testing import synthetic as syn

# Ray workers import functions by module name; this test module is not importable there.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def tasks_for(run: car.Trajectory, k: int, rollouts: int) -> list[Task]:
    plan = compile_plan(run, car.do_resample(k))
    return [Task(f"resample@{k}", r, plan, branch_noise(3, r, plan.describe(), True))
            for r in range(rollouts)]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pivot", "and", "three-way"])
def test_ray_gives_the_same_estimate_as_sequential(cluster: None, name: str) -> None:
    model = syn.catalogue()[name]
    run = model.failing_run(seed=2)
    seq = car.intervene(run, model.agent(), car.do_resample(1), outcome=model.outcome,
                        rollouts=16, seed=5)
    on_ray = car.intervene(run, model.agent(), car.do_resample(1), outcome=model.outcome,
                           rollouts=16, seed=5, executor=RayExecutor(concurrency=4))
    assert on_ray.values == seq.values and (on_ray.mean, on_ray.ci) == (seq.mean, seq.ci)
    assert [t.digest for t in on_ray.trajectories] == [t.digest for t in seq.trajectories]


def test_ray_respects_the_budget_before_submitting(cluster: None) -> None:
    model = syn.pivot()
    run = model.failing_run(seed=0)
    meter = BudgetMeter(Budget(rollouts=5))
    fn = brancher(run, model.agent(), OutcomeFn(model.outcome))
    results = execute(tasks_for(run, 2, 12), fn, meter, executor=RayExecutor(concurrency=4),
                      progress=False)
    assert [t.rollout for t, _ in results] == [0, 1, 2, 3, 4] and meter.rollouts == 5


def crash_fn(run: car.Trajectory, model: syn.SyntheticSCM, folder: Path, once: set[int],
             always: set[int]) -> Any:
    inner = brancher(run, model.agent(), OutcomeFn(model.outcome))

    def fn(task: Task) -> Any:
        marker = folder / f"attempts-{task.rollout}"
        first = not marker.exists()
        with marker.open("a") as f:  # one line per attempt, across worker processes
            f.write("x\n")
        if task.rollout in always or (task.rollout in once and first):
            os._exit(1)  # the worker process dies mid-branch
        return inner(task)
    return fn


@pytest.mark.slow
def test_a_dead_worker_is_retried_once_then_reported(cluster: None, tmp_path: Path) -> None:
    model = syn.pivot()
    run = model.failing_run(seed=0)
    tasks = tasks_for(run, 2, 6)
    fn = crash_fn(run, model, tmp_path, once={1}, always={4})
    meter = BudgetMeter(None)
    results = execute(tasks, fn, meter, executor=RayExecutor(concurrency=2), progress=False)
    clean = execute(tasks, brancher(run, model.agent(), OutcomeFn(model.outcome)),
                    BudgetMeter(None), progress=False)
    assert [t.rollout for t, _ in results] == [0, 1, 2, 3, 5]
    expected = [r.digest for t, r in clean if t.rollout != 4]
    assert [r.digest for _, r in results] == expected  # rollout 1 survived its crash
    (failure,) = results.failures
    assert failure.task.rollout == 4 and failure.attempts == 2
    assert "Actor" in failure.error  # Ray's word for the worker process that went away
    attempts = {r: len((tmp_path / f"attempts-{r}").read_text().split()) for r in range(6)}
    assert attempts == {0: 1, 1: 2, 2: 1, 3: 1, 4: 2, 5: 1}  # retried once, never more
    assert meter.rollouts == 6


def test_bad_input_on_a_worker_stops_the_run(cluster: None) -> None:
    model = syn.pivot()
    run = model.failing_run(seed=0)
    with pytest.raises(OutcomeError, match="returned 7"):
        car.intervene(run, model.agent(), car.do_resample(2), outcome=lambda r: 7,
                      rollouts=6, executor=RayExecutor(concurrency=2))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens


def test_an_address_where_no_cluster_answers_is_a_clear_error() -> None:
    model = syn.pivot()
    run = model.failing_run(seed=0)
    calls = {"n": 0}

    def policy(history: car.History, rng: Any) -> Any:
        calls["n"] += 1
        return model.policy(history, rng)

    agent = car.FunctionAgent(policy=policy, environment=model.environment, max_steps=6,
                              is_final=lambda a: bool(a.get("final")),
                              name=model.agent().name)  # the run's agent, its policy counted
    executor = make_executor("ray", address=f"127.0.0.1:{_closed_port()}")
    with pytest.raises(ExecutorUnavailable, match="no Ray cluster answers") as err:
        car.intervene(run, agent, car.do_resample(2), outcome=model.outcome, rollouts=4,
                      executor=executor)
    assert "ray start --head" in str(err.value)
    assert calls["n"] == 0
    with pytest.raises(ExecutorUnavailable, match="has no port"):
        RayExecutor(address="headnode").connect()


def test_a_model_server_policy_runs_on_ray_workers(cluster: None) -> None:
    """An OpenAIPolicy travels without its client: each worker builds its own and calls the
    server itself, and the estimate equals the in-process one."""
    from car_adapters.models.chat_agent import ChatAgent
    from car_adapters.openai import OpenAIPolicy

    from integrations_tests.support.servers import StubOpenAIServer

    with StubOpenAIServer() as stub:
        agent = ChatAgent(OpenAIPolicy("stub-model", base_url=stub.base_url))
        run = car.record(agent, context="ping", outcome=lambda r: 1.0)
        here = car.intervene(run, agent, car.do_resample(0), outcome=lambda r: 1.0,
                             rollouts=4, seed=2)
        before = stub.hits
        there = car.intervene(run, agent, car.do_resample(0), outcome=lambda r: 1.0,
                              rollouts=4, seed=2, executor=RayExecutor(concurrency=2))
        assert stub.hits - before == 4  # every branch reached the server from a worker
    # the same decisions (the digests differ: each step's meta carries its own latency)
    assert there.values == here.values
    assert ([[s.action for s in t.steps] for t in there.trajectories]
            == [[s.action for s in t.steps] for t in here.trajectories])


class ErrorsOnSome:
    """The model's agent, whose framework reports a crash (status ``error``) on the branches
    whose noise draws below ``rate``: the same branches wherever they run."""

    couples_noise = True

    def __init__(self, model: syn.SyntheticSCM, rate: float) -> None:
        self.inner, self.rate = model.agent(), rate
        self.name = self.inner.name

    def start(self, context: Any, noise: Any) -> car.Trajectory:
        return self.inner.start(context, noise)

    def branch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        traj = self.inner.branch(run, plan, noise)
        if noise.rng(99, Stream.ENVIRONMENT).random() >= self.rate:
            return traj
        return car.Trajectory.new(context=traj.context, steps=list(traj.steps), seed=traj.seed,
                                  agent=traj.agent, status="error", error="hook raised")


@pytest.mark.slow
def test_ray_leaves_errored_branches_out_as_in_process(cluster: None) -> None:
    model = syn.pivot()
    run = model.failing_run(seed=0)
    agent = ErrorsOnSome(model, 0.05)  # with seed 1: 3 of the 40 branches
    kw: dict[str, Any] = {"outcome": model.outcome, "rollouts": 40, "seed": 1}
    seq = car.intervene(run, agent, car.do_resample(2), **kw)
    on_ray = car.intervene(run, agent, car.do_resample(2), executor=RayExecutor(concurrency=4),
                           **kw)
    assert seq.failures and on_ray.failures == seq.failures  # the same branches, same steps
    assert all("hook raised" in f["error"] and f["attempts"] == 2 for f in seq.failures)
    assert on_ray.values == seq.values and seq.n == 40 - len(seq.failures)
