"""What the pytest plugin's tests read back from a pytester run: the CAR section of a test's
report and the runs the session stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from car_core.store import RunStore


def section(reports: list[Any], name: str) -> str | None:
    """The ``CAR attribution`` section of the call report of the test whose id ends in name."""
    for rep in reports:
        if rep.nodeid.endswith(name) and rep.when == "call":
            found = [text for title, text in rep.sections if title == "CAR attribution"]
            return found[0] if found else None
    raise AssertionError(f"no call report for {name}")


def session_store(pytester: pytest.Pytester) -> Path:
    """The session's store under pytester's cache folder."""
    return pytester.path / ".pytest_cache" / "d" / "car" / "runs.db"


def stored_runs(path: Path) -> list[Any]:
    with RunStore(path) as store:
        return [store.load(r["id"]) for r in store.runs()]
