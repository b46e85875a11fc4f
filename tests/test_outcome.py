"""The one scoring rule (``car_core.model.outcome.scored``): a noisy judge draws from the outcome
stream
of the noise a run was decided with, so the record, a re-score of the stored run and a branch's
own score all agree with what the rule computes."""

from __future__ import annotations

import numpy as np
import pytest

import car_core as car
from car_core.engine.tasks import Task, run_branch
from car_core.errors import OutcomeError
from car_core.model.interventions import compile_plan
from car_core.model.outcome import OutcomeFn, scored
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
