"""Shared fixtures: a planted model, its failing run and a fresh store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import car_core as car
from car_core.store import RunStore
from car_core.testing import synthetic as syn


@pytest.fixture
def pivot_model() -> syn.SyntheticSCM:
    return syn.pivot()


@pytest.fixture
def pivot_run(pivot_model: syn.SyntheticSCM) -> car.Trajectory:
    return pivot_model.failing_run(seed=0)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    s = RunStore(tmp_path / "car.db")
    yield s
    s.close()
