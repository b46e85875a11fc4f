"""Fixtures shared by the framework integration tests (framework-specific ones live in each
test module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from car_core.store import RunStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    """A fresh CAR store in a temporary SQLite file."""
    s = RunStore(tmp_path / "car.db")
    yield s
    s.close()

