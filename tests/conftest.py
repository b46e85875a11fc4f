"""Shared fixtures: planted models, their failing runs, counted agents and a fresh store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

import car_core as car
from car_core import synthetic as syn
from car_core.store import RunStore
from car_core.testing import CallCounter, Counters


@dataclass
class Counted:
    """A synthetic model's agent whose policy and environment calls are counted."""

    agent: car.FunctionAgent
    policy: CallCounter
    environment: CallCounter
    both: Counters


def counted_agent(model: syn.SyntheticSCM) -> Counted:
    base = model.agent()
    policy, env = CallCounter(base.policy), CallCounter(base.environment)
    agent = car.FunctionAgent(policy=policy, environment=env, is_final=base.is_final,
                              max_steps=base.max_steps, name=base.name)
    return Counted(agent, policy, env, Counters(policy, env))


@pytest.fixture
def pivot_model() -> syn.SyntheticSCM:
    return syn.pivot()


@pytest.fixture
def pivot_run(pivot_model: syn.SyntheticSCM) -> car.Trajectory:
    return pivot_model.failing_run(seed=0)


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    s = RunStore(tmp_path / "car.db")
    yield s
    s.close()
