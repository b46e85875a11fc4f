"""An attribution through the Python API that fails before any branch is stored leaves no
``running`` row with nothing in it (the row would promise a resume that has nothing to reuse);
one that stored branches keeps its row for the resume."""

from __future__ import annotations

from typing import Any

import pytest

import car_core as car
from car_core.errors import OutcomeError
from car_core.store import RunStore


def raising_on(which: str, model: Any, run: car.Trajectory) -> Any:
    """An outcome that raises on the recorded run itself, or on every branch of it."""
    def outcome(traj: car.Trajectory, rng: Any = None) -> float:
        if which == "record" or traj.id != run.id:
            raise ValueError("no score")
        return float(model.outcome(traj, rng))
    return outcome


@pytest.mark.parametrize("method", ["contrastive", "shapley"])
@pytest.mark.parametrize("which", ["record", "every branch"])
def test_an_outcome_that_always_raises_leaves_no_running_row(pivot_model, pivot_run, store,
                                                             method, which):
    estimate = getattr(car, method)
    with pytest.raises(OutcomeError, match="no score"):
        estimate(pivot_run, pivot_model.agent(), outcome=raising_on(which, pivot_model,
                                                                   pivot_run), store=store)
    assert store.attributions() == []
    with RunStore(store.path) as other:  # seen from another connection too
        assert other.attributions() == []


def test_a_failure_after_stored_branches_keeps_the_row_for_a_resume(pivot_model, pivot_run,
                                                                   store):
    scored = {"n": 0}

    def outcome(traj: car.Trajectory, rng: Any = None) -> float:
        if traj.id != pivot_run.id:
            scored["n"] += 1
            if scored["n"] > 4:
                raise ValueError("no score")
        return float(pivot_model.outcome(traj, rng))

    with pytest.raises(OutcomeError):
        car.contrastive(pivot_run, pivot_model.agent(), outcome=outcome, store=store)
    [row] = store.attributions()
    assert str(row.status) == "running" and not store.holds(row.id)
    assert store.runs(branches=True) != store.runs()  # its branches are what a resume reuses
