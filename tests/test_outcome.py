"""The one scoring rule (``car_core.model.outcome.scored``): a noisy judge draws from the outcome
stream
of the noise a run was decided with, so the record, a re-score of the stored run and a branch's
own score all agree with what the rule computes."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import car_core as car
from car_core.engine.tasks import Task, run_branch
from car_core.errors import ModelUnavailable, OutcomeError, OutcomeMismatch
from car_core.model.interventions import compile_plan
from car_core.model.outcome import OutcomeFn, check_on_record, scored
from car_core.model.seeding import Noise, Stream, branch_noise


def judge(run: car.Trajectory, rng: np.random.Generator) -> float:
    """A judge whose score is its own draw: any other stream or seed gives another value."""
    return float(rng.random())


def agent() -> car.FunctionAgent:
    return car.FunctionAgent(policy=lambda h, rng: int(rng.integers(0, 100)), max_steps=3)


@pytest.mark.parametrize("seed", [0, 1, 12])
def test_record_scores_with_the_outcome_stream_of_its_seed(seed: int) -> None:
    run = car.record(agent(), context="go", outcome=judge, seed=seed)
    assert run.outcome is not None
    assert run.outcome.value == float(Noise(seed).rng(0, Stream.OUTCOME).random())


@pytest.mark.parametrize("seed", [0, 3])
def test_rescoring_a_recorded_run_gives_its_recorded_value(seed: int) -> None:
    run = car.record(agent(), context="go", outcome=judge, seed=seed)
    again = scored(run, judge)  # what a recorder or the plugin does with a stored run
    assert again.outcome == run.outcome


def test_runs_recorded_without_a_seed_draw_apart_and_keep_their_draw() -> None:
    """A hosted model's run, or one the OpenAI Agents SDK recorder stored, has no seed: each
    such run's judge draws its own number (all of them once drew seed 0's, so a judge meant to
    flip 15% of verdicts flipped every stored run or none), and scoring the run again gives
    back its value, as for a seeded run."""
    base = car.record(agent(), context="go", outcome=judge, seed=0)
    runs = [replace(base, id=f"hosted-run-{i}", seed=None) for i in range(12)]
    values = [scored(r, judge).outcome.value for r in runs]  # type: ignore[union-attr]
    assert len(set(values)) == 12
    assert [scored(scored(r, judge), judge).outcome.value  # type: ignore[union-attr]
            for r in runs] == values
    check_on_record(scored(runs[3], judge), judge)  # the record's own check agrees with it


def test_a_branch_is_scored_from_its_own_noise() -> None:
    run = car.record(agent(), context="go", outcome=judge, seed=0)
    noise = branch_noise(0, 5, "arm", coupled=True)
    task = Task(arm="arm", rollout=5, plan=compile_plan(run, [car.do_resample(1)]), noise=noise)
    branch = run_branch(run, agent(), OutcomeFn(judge), task)
    assert branch.outcome is not None
    assert branch.outcome.value == float(noise.rng(0, Stream.OUTCOME).random())
    assert branch.outcome.value != run.outcome.value  # type: ignore[union-attr]


def test_scored_keeps_every_other_field() -> None:
    run = car.record(agent(), context="go", outcome=lambda r: False, seed=2)
    out = scored(run, lambda r: True)
    assert out.outcome is not None and out.outcome.value == 1.0
    assert out.to_dict() | {"outcome": None} == run.to_dict() | {"outcome": None}


def test_scored_checks_the_value() -> None:
    run = car.record(agent(), context="go", outcome=lambda r: 0.0, seed=0)
    with pytest.raises(OutcomeError, match="returned 2"):
        scored(run, lambda r: 2)


# -- async outcomes: an ``async def`` judge is awaited, and scores what the sync one does ---------
def sync_judge(run: car.Trajectory, rng: np.random.Generator) -> float:
    return judge(run, rng)


async def async_judge(run: car.Trajectory, rng: np.random.Generator) -> float:
    await asyncio.sleep(0)  # a model call
    return judge(run, rng)


class WaitingAgent:
    """``agent()`` whose branches are awaited (``abranch``): the async executor's loop path."""

    couples_noise = True

    def __init__(self) -> None:
        self.inner = agent()
        self.name = self.inner.name

    def branch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        return self.inner.branch(run, plan, noise)

    async def abranch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        await asyncio.sleep(0)
        return self.inner.branch(run, plan, noise)


# a coroutine never awaited, or an error swallowed in a worker thread, fails the test
NO_LEAK = pytest.mark.filterwarnings("error::RuntimeWarning",
                                     "error::pytest.PytestUnraisableExceptionWarning")

# sequential; a sync agent on the async executor (scored in its worker thread); an awaited
# agent on the async executor (scored on the loop)
WAYS = {"sequential": (agent, "sequential"), "async-threaded": (agent, "async"),
        "async-awaited": (WaitingAgent, "async")}


def returns_awaitable(run: car.Trajectory, rng: np.random.Generator) -> Any:
    """A sync function handing back the coroutine (a wrapper around an async judge)."""
    return async_judge(run, rng)


@NO_LEAK
@pytest.mark.parametrize("way", sorted(WAYS))
def test_an_async_judge_gives_what_the_sync_one_does(way: str) -> None:
    make, executor = WAYS[way]
    run = car.record(agent(), context="go", outcome=sync_judge, seed=4)
    dists = {j.__name__: car.intervene(run, make(), car.do_resample(1), outcome=j, rollouts=16,
                                       seed=9, executor=executor)
             for j in (sync_judge, async_judge, returns_awaitable)}
    ref = dists["sync_judge"]
    assert len(set(ref.values)) > 1  # the values are the judge's own draws, not a constant
    for name in ("async_judge", "returns_awaitable"):
        assert dists[name].values == ref.values, name
        assert dists[name].mean == ref.mean, name


class LoopBoundClient:
    """A client kept across calls whose connections belong to the loop that first used it, as
    ``httpx.AsyncClient`` / ``AsyncOpenAI()`` at module level: another loop's call fails."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None

    async def ask(self, value: float) -> float:
        loop = asyncio.get_running_loop()
        self.loop = self.loop or loop
        if loop is not self.loop:
            raise RuntimeError("Event loop is closed")
        await asyncio.sleep(0)
        return value


@NO_LEAK
@pytest.mark.parametrize("way", sorted(WAYS))
def test_an_async_judge_keeps_its_client_on_one_loop(way: str) -> None:
    """The check of the record, then every branch (over several batches), awaits the judge on
    one loop, so a client it holds at module level keeps working."""
    make, executor = WAYS[way]
    client = LoopBoundClient()

    async def client_judge(run: car.Trajectory, rng: np.random.Generator) -> float:
        return await client.ask(judge(run, rng))

    run = car.record(agent(), context="go", outcome=client_judge, seed=4)
    for seed in (9, 10):
        got = car.intervene(run, make(), car.do_resample(1), outcome=client_judge,
                            rollouts=16, seed=seed, executor=executor)
        ref = car.intervene(run, make(), car.do_resample(1), outcome=sync_judge,
                            rollouts=16, seed=seed, executor=executor)
        assert got.values == ref.values


@NO_LEAK
def test_an_async_judge_records_and_checks_the_record_as_the_sync_one() -> None:
    run = car.record(agent(), context="go", outcome=async_judge, seed=4)
    ref = car.record(agent(), context="go", outcome=sync_judge, seed=4)
    assert run.outcome == ref.outcome
    assert scored(run, async_judge).outcome == run.outcome  # a re-score gives it back
    check_on_record(run, async_judge)  # it sees what the record saw: nothing raised
    fine = replace(run, outcome=car.Outcome(0.0))

    async def always_failed(r: car.Trajectory) -> bool:
        return True

    with pytest.raises(OutcomeMismatch) as sync_err:
        check_on_record(fine, lambda r: True)
    with pytest.raises(OutcomeMismatch) as async_err:
        check_on_record(fine, always_failed)
    assert async_err.value.message == sync_err.value.message
    assert async_err.value.scores == sync_err.value.scores == (1.0, 1.0, 1.0)


@NO_LEAK
def test_an_async_judge_scores_from_sync_code_inside_a_running_loop() -> None:
    """A sync caller on a thread whose loop runs (a notebook, an async test) cannot
    ``asyncio.run``: the judge still runs to the same value."""
    run = car.record(agent(), context="go", outcome=sync_judge, seed=5)

    async def inside() -> car.Trajectory:
        return scored(run, async_judge)

    assert asyncio.run(inside()).outcome == run.outcome


@NO_LEAK
def test_an_async_settled_hook_is_awaited() -> None:
    run = car.record(agent(), context="go", outcome=sync_judge, seed=5)

    def outcome(r: car.Trajectory) -> bool:
        return True

    async def never(r: car.Trajectory) -> bool:
        return False

    outcome.settled = never  # type: ignore[attr-defined]  # async: its coroutine is not a yes
    assert OutcomeFn(outcome).settled(run) is False


def _refuse(run: car.Trajectory) -> float:
    raise ConnectionRefusedError("judge refused")


def _no_verdict(run: car.Trajectory) -> float:
    raise ValueError("no verdict")


def _as_dict(run: car.Trajectory) -> float:
    return run.get("messages")  # type: ignore[attr-defined, no-any-return]  # the old form


def _both(body: Callable[[car.Trajectory], float]) -> tuple[Callable[..., Any], ...]:
    """A judge that gives back 1.0, the record's value (so the check of the record passes), and
    calls ``body`` on rollout 0's branch only (so the error is always that branch's, whatever
    order concurrent branches finish in), as a sync and as an async function."""
    def sync(run: car.Trajectory) -> float:
        if run.lineage is None or run.lineage.rollout != 0:
            return 1.0
        return body(run)

    async def asynced(run: car.Trajectory) -> float:
        await asyncio.sleep(0)
        return sync(run)

    return sync, asynced


RAISES = {"value-error": (_no_verdict, OutcomeError, "raised ValueError"),
          "server-down": (_refuse, ModelUnavailable, "the outcome's server failed"),
          "read-as-dict": (_as_dict, OutcomeError, "read the run as a dict")}


@NO_LEAK
@pytest.mark.parametrize("kind", sorted(RAISES))
@pytest.mark.parametrize("way", sorted(WAYS))
def test_an_async_judge_that_raises_is_reported_as_the_sync_one(kind: str, way: str) -> None:
    """Same error class, message, hint and cause, on every executor: an outcome error stops
    the estimate, a judge's server down is ModelUnavailable (resume later)."""
    body, cls, says = RAISES[kind]
    make, executor = WAYS[way]
    run = car.record(agent(), context="go", outcome=lambda r: True, seed=4)
    errors = []
    for fn in _both(body):
        with pytest.raises(cls) as err:
            car.intervene(run, make(), car.do_resample(1), outcome=fn, rollouts=4, seed=1,
                          executor=executor)
        errors.append(err.value)
    sync, asynced = errors
    assert says in sync.message and "on a branch of the run" in sync.message
    assert type(asynced) is type(sync)
    assert "rollout 0" in sync.message
    assert (_no_id(asynced.message), asynced.hint, asynced.run_id) == (
        _no_id(sync.message), sync.hint, sync.run_id)
    assert type(asynced.__cause__) is type(sync.__cause__)


def _no_id(message: str) -> str:
    """``message`` without the branch's id, which is new on every run."""
    return re.sub(r"branch [0-9a-f]{16}", "branch ID", message)
