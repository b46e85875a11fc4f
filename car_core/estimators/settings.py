"""Estimator settings as one object each: what the estimate is (in the constructor), and one
``run`` on a run, an agent and an outcome (shapiq's approximators keep their settings the same
way). ``car.contrastive`` and ``car.shapley`` take the same settings as keywords; the ``car``
command builds these objects, so the budget an attribution may spend is computed by the
estimator's own rule (``budget_for``), and a resume takes what it leaves out from the stored
attribution (``resumed``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from car_core import defaults
from car_core.engine.agent import Agent
from car_core.engine.execution import ExecutorLike, Progress
from car_core.errors import InvalidInput
from car_core.estimators.alternatives import ActionKey
from car_core.estimators.contrastive import _check as _check_contrastive
from car_core.estimators.contrastive import (
    _check_indifference,
    _check_wave,
    contrastive,
    rollout_budget,
)
from car_core.estimators.later import INDIFFERENCE
from car_core.estimators.shapley import _check as _check_shapley
from car_core.estimators.shapley import shapley
from car_core.model.budget import Budget
from car_core.model.outcome import OutcomeLike
from car_core.model.trajectory import Trajectory
from car_core.results import ContrastiveResult, ShapleyResult

if TYPE_CHECKING:  # the store brings sqlite-utils: loaded only where one is used
    from car_core.store import StoreLike

__all__ = ["ContrastiveSettings", "ShapleySettings"]

JSONParams = Mapping[str, object]


@dataclass(frozen=True)
class ContrastiveSettings:
    """The settings of ``car.contrastive`` (see it for what each means), checked when made."""

    rollouts: int = defaults.ROLLOUTS
    alpha: float = defaults.ALPHA
    seed: int = 0
    coupled: bool = True
    budget: Budget | int | None = None
    search: str = "auto"
    early_stop: bool = False
    wave: int | None = None  # rollouts per look of the search; None: chosen from the agent
    indifference: float = INDIFFERENCE  # Δ the steps after the locus are ruled out at
    # how re-drawn actions are grouped (``StepEffect.alternatives``); None: tool calls and
    # their arguments, or a reply's text
    action_key: ActionKey | None = None

    def __post_init__(self) -> None:
        _check_contrastive(self.rollouts, self.alpha, self.search)
        _check_wave(self.wave)
        _check_indifference(self.indifference)
        if self.action_key is not None and not callable(self.action_key):
            raise InvalidInput(f"action_key={self.action_key!r} is not callable",
                               hint="pass a function action -> str, or None")

    def budget_for(self, n_steps: int) -> int:
        """The most rollouts the estimate of an ``n_steps`` run may spend."""
        return rollout_budget(n_steps, self.rollouts, self.budget)[1]

    def run(self, run: Trajectory, agent: Agent, outcome: OutcomeLike, *,
            executor: ExecutorLike = None, progress: Progress = None,
            store: StoreLike | None = None, attribution_id: str | None = None,
            force_agent: bool = False, max_rollouts: int = defaults.MAX_ROLLOUTS,
            max_budget: int = defaults.MAX_BUDGET, replace: bool = False
            ) -> ContrastiveResult:
        """``car.contrastive`` of ``run`` with these settings (the bounds and ``replace``
        are the call's, not the estimate's: see ``car.contrastive``)."""
        return contrastive(run, agent, outcome=outcome, rollouts=self.rollouts,
                           alpha=self.alpha, seed=self.seed, coupled=self.coupled,
                           budget=self.budget, search=self.search, early_stop=self.early_stop,
                           wave=self.wave, executor=executor, progress=progress, store=store,
                           attribution_id=attribution_id, force_agent=force_agent,
                           indifference=self.indifference, action_key=self.action_key,
                           max_rollouts=max_rollouts, max_budget=max_budget, replace=replace)

    @classmethod
    def resumed(cls, params: JSONParams, n_steps: int, *, rollouts: int | None = None,
                alpha: float | None = None, seed: int | None = None,
                budget: int | None = None) -> ContrastiveSettings:
        """The settings a resume continues with: each one given, else the stored
        attribution's (``params``), else the default. A stored rollout cap that is only what
        the stored ``rollouts`` implied (``budget_for``) was no cap the user gave, so it is
        not carried over: a resume with a larger ``rollouts`` may then spend more. A cap
        above it was given (a trial's resume of a budget of 256 over two steps at K = 16 went
        on under 32)."""
        stored_k = params.get("rollouts")
        k = rollouts if rollouts is not None else stored_k
        cap = _stored_cap(params)
        if isinstance(stored_k, int) and cap is not None and \
                cap == rollout_budget(n_steps, stored_k, None)[1]:
            cap = None
        return cls(rollouts=k if isinstance(k, int) else defaults.ROLLOUTS,
                   alpha=_given(alpha, params.get("alpha"), defaults.ALPHA),
                   seed=int(_given(seed, params.get("seed"), 0)),
                   budget=Budget(rollouts=budget if budget is not None else cap)
                   if budget is not None or cap is not None else None,
                   indifference=float(_given(None, params.get("indifference"), INDIFFERENCE)))


@dataclass(frozen=True)
class ShapleySettings:
    """The settings of ``car.shapley`` (see it for what each means), checked when made."""

    budget: Budget | int = defaults.SHAPLEY_BUDGET
    level: float = defaults.LEVEL
    seed: int = 0
    players: Sequence[int] | None = None
    mode: str = "auto"
    coupled: bool = True

    def __post_init__(self) -> None:
        _check_shapley(self.budget, self.level, self.mode)

    def budget_for(self, n_steps: int) -> int:
        """The most rollouts the estimate may spend (the same for any number of steps)."""
        return _check_shapley(self.budget, self.level, self.mode)[1]

    def run(self, run: Trajectory, agent: Agent, outcome: OutcomeLike, *,
            executor: ExecutorLike = None, progress: Progress = None,
            store: StoreLike | None = None, attribution_id: str | None = None,
            force_agent: bool = False, max_budget: int = defaults.MAX_BUDGET,
            replace: bool = False) -> ShapleyResult:
        """``car.shapley`` of ``run`` with these settings (the bound and ``replace`` are the
        call's, not the estimate's: see ``car.shapley``)."""
        return shapley(run, agent, outcome=outcome, budget=self.budget, seed=self.seed,
                       level=self.level, players=self.players, mode=self.mode,
                       coupled=self.coupled, executor=executor, progress=progress, store=store,
                       attribution_id=attribution_id, force_agent=force_agent,
                       max_budget=max_budget, replace=replace)

    @classmethod
    def resumed(cls, params: JSONParams, n_steps: int, *, level: float | None = None,
                seed: int | None = None, budget: int | None = None) -> ShapleySettings:
        """The settings a resume continues with: each one given, else the stored
        attribution's (``params``), else the default."""
        cap = _stored_cap(params)
        return cls(budget=budget if budget is not None else
                   cap if cap is not None else defaults.SHAPLEY_BUDGET,
                   level=_given(level, params.get("level"), defaults.LEVEL),
                   seed=int(_given(seed, params.get("seed"), 0)))


def _stored_cap(params: JSONParams) -> int | None:
    budget = params.get("budget")
    cap = budget.get("rollouts") if isinstance(budget, Mapping) else None
    return int(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) else None


def _given(value: float | None, stored: object, default: float) -> float:
    if value is not None:
        return value
    if isinstance(stored, (int, float)) and not isinstance(stored, bool):
        return stored
    return default
