"""``executor=`` takes a name as the command line does (``"sequential"``, ``"async"``,
``"ray"``), an executor object or None, on every estimate; the executors are public
(``car.Sequential``, ``car.AsyncioExecutor``, ``car.RayExecutor``); and a seed gives the very
same result whichever one runs the branches, since every branch carries its own noise."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import car_core as car
from car_core.engine.execution import AsyncioExecutor, Sequential, resolve_executor
from car_core.engine.ray_executor import RayExecutor
from car_core.errors import InvalidInput
from car_core.testing import synthetic as syn

# The same estimate on each: the default (None), by name, and as objects.
EXECUTORS = [None, "sequential", "async", car.Sequential(), car.AsyncioExecutor(4)]


def _counted(model: syn.SyntheticSCM) -> tuple[car.FunctionAgent, list[int]]:
    """The model's agent with a count of its policy calls (one per live step of a branch)."""
    calls = [0]

    def policy(history: car.History, rng: Any) -> Any:
        calls[0] += 1
        return model.policy(history, rng)

    agent = model.agent()
    agent.policy = policy
    return agent, calls


def _without_ids(result: dict[str, Any]) -> dict[str, Any]:
    """A result as a dict, less what is new on every call (branch ids, creation times)."""
    out = {k: v for k, v in result.items() if k != "branch_ids"}
    if out.get("example_branch") is not None:  # contrastive: the first rescued branch kept
        out["example_branch"] = {k: v for k, v in out["example_branch"].items()
                                 if k not in ("id", "created_at", "digest")}
    return out


def _executor_id(executor: Any) -> str:
    """A test id that is the same in every process (pytest-xdist workers compare them): a
    name as it is, an object by its class and concurrency, never its address."""
    if executor is None or isinstance(executor, str):
        return repr(executor)
    return f"{type(executor).__name__}({getattr(executor, 'concurrency', '')})"


@pytest.fixture(scope="module")
def pivot() -> tuple[syn.SyntheticSCM, car.Trajectory]:
    model = syn.pivot(n_steps=4, at=2, p_bad=0.3)
    return model, model.failing_run(seed=0)


@pytest.mark.parametrize("executor", EXECUTORS[1:], ids=_executor_id)
def test_contrastive_gives_the_same_result_on_every_executor(pivot, executor) -> None:
    model, run = pivot
    kw: dict[str, Any] = {"outcome": model.outcome, "rollouts": 16, "seed": 3, "progress": False}
    base = car.contrastive(run, model.agent(), **kw)
    other = car.contrastive(run, model.agent(), executor=executor, **kw)
    assert base.locus == 2  # the planted pivot, so the comparison is of a real answer
    assert _without_ids(other.to_dict()) == _without_ids(base.to_dict())


@pytest.mark.parametrize("executor", EXECUTORS[1:], ids=_executor_id)
def test_intervene_shapley_and_context_give_the_same_result_on_every_executor(
        pivot, executor) -> None:
    model, run = pivot
    pairs = [
        (lambda **kw: car.intervene(run, model.agent(), car.do_resample(2),
                                    outcome=model.outcome, rollouts=24, seed=5, progress=False,
                                    **kw)),
        (lambda **kw: car.shapley(run, model.agent(), outcome=model.outcome, budget=128, seed=5,
                                  progress=False, **kw)),
        (lambda **kw: car.context_attribution(run, model.agent(), step=2,
                                              outcome=model.outcome, rollouts=16, seed=5, **kw)),
    ]
    for estimate in pairs:
        base, other = estimate(), estimate(executor=executor)
        assert _without_ids(other.to_dict()) == _without_ids(base.to_dict())


def test_repairs_give_the_same_ranking_by_name(pivot) -> None:
    model, run = pivot
    good = car.do_action(2, {"step": 2, "choice": "good", "final": False})
    kw: dict[str, Any] = {"step": 2, "candidates": [good], "outcome": model.outcome,
                          "rollouts": 16, "seed": 1}
    base = car.repairs(run, model.agent(), **kw)
    other = car.repairs(run, model.agent(), executor="async", **kw)
    assert other.to_dict() == base.to_dict()
    assert base.best is not None  # forcing the good choice rescues: a real ranking


ENTRIES = {
    "intervene": lambda run, agent, model, exe: car.intervene(
        run, agent, car.do_resample(2), outcome=model.outcome, rollouts=4, executor=exe),
    "contrastive": lambda run, agent, model, exe: car.contrastive(
        run, agent, outcome=model.outcome, rollouts=4, executor=exe, progress=False),
    "shapley": lambda run, agent, model, exe: car.shapley(
        run, agent, outcome=model.outcome, budget=64, executor=exe, progress=False),
    "context_attribution": lambda run, agent, model, exe: car.context_attribution(
        run, agent, step=2, outcome=model.outcome, rollouts=8, executor=exe),
    "repairs": lambda run, agent, model, exe: car.repairs(
        run, agent, step=2, candidates=[car.do_resample(2)], outcome=model.outcome,
        rollouts=4, executor=exe),
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("bad", ["threads", "Async", 42])
def test_an_unknown_executor_is_refused_naming_the_choices_before_any_branch(
        pivot, entry, bad) -> None:
    model, run = pivot
    agent, calls = _counted(model)
    with pytest.raises(InvalidInput) as info:
        ENTRIES[entry](run, agent, model, bad)
    text = str(info.value)
    assert repr(bad) in text and "sequential, async, ray" in text, text
    assert calls[0] == 0


def test_names_resolve_to_the_backends_and_objects_pass_through() -> None:
    agent = syn.pivot().agent()
    assert isinstance(resolve_executor("sequential", agent), Sequential)
    made = resolve_executor("async", agent)
    assert isinstance(made, AsyncioExecutor) and made.concurrency == 16
    assert isinstance(resolve_executor("ray", agent), RayExecutor)  # nothing started yet
    mine = AsyncioExecutor(3)
    assert resolve_executor(mine, agent) is mine
    assert isinstance(resolve_executor(None, agent), Sequential)  # in-process: the default


def test_the_executors_are_public_and_ray_loads_only_when_asked_for() -> None:
    assert car.Sequential is Sequential and car.AsyncioExecutor is AsyncioExecutor
    assert car.RayExecutor is RayExecutor
    probe = ("import sys, car_core; a = 'ray' in sys.modules or "
             "'car_core.engine.ray_executor' in sys.modules;"
             " car_core.RayExecutor; b = 'ray' in sys.modules; print(a, b)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]  # the class loads without Ray; Ray loads when it runs
