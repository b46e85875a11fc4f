"""The outcome protocol: how CAR calls the user's score of a run.

``outcome(run)`` or ``outcome(run, rng)`` (a noisy judge draws from ``rng``) returns a float in
[0, 1] or a bool, 1 / True meaning the failure happened. ``OutcomeFn`` wraps it once and checks
every value it returns.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import InvalidInput, OutcomeError
from .trajectory import Trajectory


class OutcomeFn:
    """Wraps a user's outcome function: ``outcome(run)`` or ``outcome(run, rng)`` (a noisy
    judge draws from ``rng``), returning a float in [0, 1] or a bool."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        if isinstance(fn, OutcomeFn):
            fn = fn.fn
        self.fn: Callable[..., Any]
        if not callable(fn):
            raise InvalidInput("outcome must be callable: outcome(run) -> float in [0, 1]",
                               hint="pass outcome=lambda run: ...")
        self.fn = fn
        self.takes_rng = _positional_arity(fn) >= 2

    def __call__(self, run: Trajectory, rng: np.random.Generator) -> float:
        try:
            value = self.fn(run, rng) if self.takes_rng else self.fn(run)
        except Exception as exc:  # the user's code: wrap whatever it raises
            raise OutcomeError(f"the outcome function raised {exc!r}", run_id=run.id,
                               hint="fix the outcome function; it must score any branch, "
                                    "including ones that end early") from exc
        if isinstance(value, (bool, np.bool_)):
            return 1.0 if value else 0.0
        if isinstance(value, (int, float, np.integer, np.floating)):
            v = float(value)
            if 0.0 <= v <= 1.0:
                return v
        raise OutcomeError(f"the outcome function returned {value!r}", run_id=run.id,
                           hint="return a float in [0, 1] or a bool (1 / True = the failure "
                                "happened)")


def _positional_arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    count = 0
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            return 2
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            count += 1
    return count
