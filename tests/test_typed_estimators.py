"""The public estimators are typed at their most important boundary: the agent, the outcome,
the store and the other objects they are handed resolve to real types, never ``Any``, so
``mypy --strict`` checks what callers pass (``JSON`` data, such as a run's context, is the one
thing left open: Python's types cannot say what JSON is)."""

from __future__ import annotations

import os
import typing
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import car_core as car
from car_core.engine.agent import Agent
from car_core.engine.execution import Executor
from car_core.engine.progress import ProgressBar
from car_core.estimators.settings import ContrastiveSettings, ShapleySettings
from car_core.store import RunStore, StoreLike

ESTIMATORS: list[Callable[..., Any]] = [
    car.contrastive, car.shapley, car.intervene, car.record, car.action_match_rate,
    ContrastiveSettings.run, ShapleySettings.run]
BOUNDARY = ("run", "agent", "outcome", "store", "executor", "progress", "budget")


def contains_any(hint: object) -> bool:
    """Whether ``Any`` appears anywhere in a resolved type hint."""
    if hint is Any:
        return True
    return any(contains_any(arg) for arg in typing.get_args(hint)
               if arg is not Ellipsis and not isinstance(arg, list))


def hints(fn: Callable[..., Any]) -> dict[str, Any]:
    # the store types are imported for type checkers only (the store loads sqlite-utils)
    return typing.get_type_hints(fn, localns={"RunStore": RunStore, "StoreLike": StoreLike,
                                              "os": os})


@pytest.mark.parametrize("fn", ESTIMATORS, ids=lambda fn: fn.__qualname__)
def test_no_boundary_parameter_is_any(fn: Callable[..., Any]) -> None:
    found = hints(fn)
    boundary = {name: hint for name, hint in found.items() if name in BOUNDARY}
    assert "agent" in boundary
    assert {name for name, hint in boundary.items() if contains_any(hint)} == set()


@pytest.mark.parametrize("fn", ESTIMATORS, ids=lambda fn: fn.__qualname__)
def test_the_agent_is_the_agent_protocol(fn: Callable[..., Any]) -> None:
    found = hints(fn)
    assert found["agent"] is Agent
    if "store" in found:
        # a store, or the path of its file (``car_core.store.as_store`` opens it)
        assert set(typing.get_args(found["store"])) == {RunStore, str, os.PathLike[str],
                                                        type(None)}
    if "executor" in found:
        assert Executor in typing.get_args(found["executor"])
    if "progress" in found:
        assert ProgressBar in typing.get_args(found["progress"])
    if "outcome" in found:  # outcome(run) or outcome(run, rng) -> float in [0, 1] / bool,
        # or an awaitable of one (async def outcome)
        assert set(typing.get_args(found["outcome"])) == {
            Callable[..., float], Callable[..., Awaitable[float]]}


def test_the_checker_sees_any() -> None:
    assert contains_any(dict[str, Any]) and contains_any(Any)
    assert not contains_any(Callable[..., float]) and not contains_any(RunStore | None)
