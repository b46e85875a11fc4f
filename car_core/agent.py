"""The contract between the replay engine and an agent, and ``FunctionAgent``.

An agent the engine can work with does three things (``Agent``):

- ``start(context, noise)``: run from scratch (used by ``car.record``);
- ``branch(run, plan, noise)``: run a counterfactual from ``run`` under ``plan`` — steps before
  ``plan.start`` are served from the record with no model or tool call;
- ``redecide(run, k, noise)``: decide step ``k`` again from the recorded state ``s_k`` (used by
  ``car.action_match_rate``).

``couples_noise`` says whether the agent's randomness is driven by ``noise`` (then branches can
share common random numbers). Framework adapters implement these three with their own machinery;
``FunctionAgent`` implements them from three plain callables with ``car_core.replay.drive``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ._json import JSON
from .errors import InvalidInput, OutcomeError
from .interventions import Plan
from .seeding import Noise
from .trajectory import History, Trajectory

Policy = Callable[[History, np.random.Generator], JSON]
Environment = Callable[[History, JSON, np.random.Generator], JSON]


@runtime_checkable
class Agent(Protocol):
    """What ``car.intervene``, ``car.contrastive`` and ``car.shapley`` need of an agent."""

    name: str
    couples_noise: bool

    def start(self, context: JSON, noise: Noise) -> Trajectory: ...

    def branch(self, run: Trajectory, plan: Plan, noise: Noise) -> Trajectory: ...

    def redecide(self, run: Trajectory, k: int, noise: Noise) -> JSON: ...


@dataclass
class FunctionAgent:
    """An agent from plain callables: ``policy(history, rng) -> action``,
    ``environment(history, action, rng) -> observation`` (optional), ``is_final(action)``."""

    policy: Policy
    environment: Environment | None = None
    is_final: Callable[[JSON], bool] | None = None
    max_steps: int = 20
    name: str = "function-agent"
    couples_noise: bool = True

    def __post_init__(self) -> None:
        if not callable(self.policy):
            raise InvalidInput("FunctionAgent: policy must be callable",
                               hint="pass policy=lambda history, rng: ...")
        if self.environment is not None and not callable(self.environment):
            raise InvalidInput("FunctionAgent: environment must be callable or None")
        if self.is_final is not None and not callable(self.is_final):
            raise InvalidInput("FunctionAgent: is_final must be callable or None",
                               hint="pass is_final=lambda action: ... (True ends the run)")
        steps = self.max_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InvalidInput(f"FunctionAgent: max_steps={steps!r} must be an int of at least 1",
                               hint="pass max_steps=20, say")

    def finished(self, action: JSON) -> bool:
        return bool(self.is_final(action)) if self.is_final is not None else False

    def start(self, context: JSON, noise: Noise) -> Trajectory:
        from .replay import drive
        return drive(self, Trajectory.new(context=context, steps=[]), Plan(start=0), noise)

    def branch(self, run: Trajectory, plan: Plan, noise: Noise) -> Trajectory:
        from .replay import drive
        return drive(self, run, plan, noise)

    def redecide(self, run: Trajectory, k: int, noise: Noise) -> JSON:
        from .replay import call_policy
        return call_policy(self.policy, run.history(k), noise.rng(k, "policy"), k, run.id)


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
