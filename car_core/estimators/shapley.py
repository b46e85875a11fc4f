"""Shapley values of the steps: credit for failures that need several steps to go wrong.

The game. Players are the steps (or the candidate steps in ``players=``, every other step
grouped as one player). ``v(S)`` = P(fail | the steps of the players in S held at their factual
action, every other step resampled): the plan resamples each step outside S and forces the
factual action (``do_action``) on each held step after the first resampled one; steps before
the first resampled step are served from the record, and ``v(N)`` holds everything (only the
outcome is re-drawn). Steps are matched by position: a branch that ends before a held step
never reaches it, and steps a branch adds beyond the run's length run live.

Exact mode (``2^p`` coalitions affordable ``MIN_REPLICATES`` times over): replicate ``r``
evaluates every coalition once with rollout index ``r`` (common random numbers when the agent
couples noise) and gives ``φ_i^(r) = Σ_S c_{i,S} y(S, r)``; the estimate is the mean over
replicates and the interval a Student-t interval over them. Replicates are independent, so the
interval accounts for the covariance between coalitions without modelling it.

Permutation mode (otherwise): a unit is a random order of the players and its reverse
(antithetic), each coalition visited once with one rollout, all visits of a unit on rollout
index ``u`` (``v(∅)`` and ``v(N)`` are shared by the two orders, so a unit costs ``2p`` rollouts).
Units are independent, so the t-interval over units covers permutation and rollout noise.

In both modes ``Σφ = v(N) − v(∅)`` holds replicate by replicate; the result reports both sides
and their gap as a check. The budget is checked before every rollout; a replicate or unit that
the budget cut short is dropped from the estimate (its rollouts are still counted).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..budget import Budget
from ..errors import InvalidBudget, InvalidInput
from ..execution import Executor, Task
from ..interventions import Plan, compile_plan, do_action, do_resample
from ..seeding import Noise
from ..trajectory import Trajectory
from ._session import Session, as_budget, check_run_has_steps
from .results import GameValue, ShapleyResult, ShapleyValue
from .stats import t_interval, wilson, z_value

MODES = ("auto", "exact", "permutation")
MIN_REPLICATES = 10   # exact mode only when every coalition can be measured this many times
MAX_EXACT_PLAYERS = 12
BATCH_ROLLOUTS = 256  # rollouts handed to the executor at once (bounds memory)
DEFAULT_CAP = 2000    # rollout cap when ``budget`` is a car.Budget without one


class Game:
    """Coalitions of players as bit masks, and the plan each one compiles to."""

    def __init__(self, run: Trajectory, players: Sequence[int] | None) -> None:
        n = len(run.steps)
        self.run = run
        if players is None:
            self.groups: list[tuple[int, ...]] = [(k,) for k in range(n)]
            self.labels = [f"step {k}" for k in range(n)]
            self.steps: list[int | None] = list(range(n))
        else:
            chosen = _check_players(players, n, run.id)
            rest = tuple(k for k in range(n) if k not in chosen)
            self.groups = [(k,) for k in chosen] + ([rest] if rest else [])
            self.labels = [f"step {k}" for k in chosen] + (
                [f"other steps ({', '.join(map(str, rest))})"] if rest else [])
            self.steps = list(chosen) + ([None] if rest else [])
        self.p = len(self.groups)
        self.full = (1 << self.p) - 1
        self._plans: dict[int, Plan] = {}

    def held(self, mask: int) -> list[int]:
        return sorted(k for i, g in enumerate(self.groups) if mask >> i & 1 for k in g)

    def arm(self, mask: int) -> str:
        return "S=" + ",".join(map(str, self.held(mask)))

    def plan(self, mask: int) -> Plan:
        if mask not in self._plans:
            held = set(self.held(mask))
            free = [k for k in range(len(self.run.steps)) if k not in held]
            first = min(free, default=len(self.run.steps))
            items = [do_resample(k) for k in free] + [
                do_action(k, self.run.steps[k].action) for k in sorted(held) if k > first]
            self._plans[mask] = compile_plan(self.run, items)
        return self._plans[mask]


def _check_players(players: Sequence[int], n: int, run_id: str) -> list[int]:
    try:
        chosen = sorted(set(players))
    except TypeError as exc:
        raise InvalidInput(f"players={players!r} must be a list of step indices",
                           run_id=run_id) from exc
    if not chosen or len(chosen) != len(list(players)):
        raise InvalidInput(f"players={list(players)!r} must be distinct step indices, at least "
                           "one", run_id=run_id, hint="e.g. players=[2, 5, 7]")
    for k in chosen:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < n:
            raise InvalidInput(f"player {k!r} is not a step of this {n}-step run",
                               run_id=run_id, hint=f"use steps between 0 and {n - 1}")
    return chosen


def _weights(p: int) -> list[float]:
    """``|S|! (p − |S| − 1)! / p!`` for a coalition S not containing the player."""
    return [math.factorial(s) * math.factorial(p - s - 1) / math.factorial(p) for s in range(p)]


def _exact_phi(game: Game, y: dict[int, float]) -> list[float]:
    w = _weights(game.p)
    phi = [0.0] * game.p
    for mask in range(1 << game.p):
        size = bin(mask).count("1")
        for i in range(game.p):
            if not mask >> i & 1:
                phi[i] += w[size] * (y[mask | 1 << i] - y[mask])
    return phi


def _orders(seed: int, unit: int, p: int) -> tuple[list[int], list[int]]:
    order = [int(i) for i in Noise(seed, (3, unit)).rng(0, "policy").permutation(p)]
    return order, order[::-1]


def _chain(order: list[int]) -> list[int]:
    masks, mask = [0], 0
    for i in order:
        mask |= 1 << i
        masks.append(mask)
    return masks


def _perm_phi(game: Game, unit: int, seed: int, y: dict[int, float]) -> list[float]:
    phi = [0.0] * game.p
    for order in _orders(seed, unit, game.p):
        masks = _chain(order)
        for pos, i in enumerate(order):
            phi[i] += 0.5 * (y[masks[pos + 1]] - y[masks[pos]])
    return phi


def _check(budget: Any, level: Any, mode: Any) -> tuple[Budget, int]:
    if isinstance(budget, (int, Budget)) and not isinstance(budget, bool):
        b = as_budget(budget, "budget")
    else:
        raise InvalidBudget(f"budget={budget!r} is neither a rollout count nor a car.Budget",
                            hint="pass budget=2000 or car.Budget(rollouts=..., tokens=...)")
    assert b is not None
    cap = b.rollouts if b.rollouts is not None else DEFAULT_CAP
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise InvalidInput(f"level={level!r} is outside (0, 1)", hint="use e.g. level=0.95")
    if mode not in MODES:
        raise InvalidInput(f"mode={mode!r} is not one of {MODES}",
                           hint='use "auto", "exact" or "permutation"')
    return b, cap


def shapley(run: Trajectory, agent: Any, *, outcome: Any, budget: int | Budget = 2000,
            seed: int = 0, level: float = 0.95, players: Sequence[int] | None = None,
            mode: str = "auto", coupled: bool = True, executor: Executor | None = None,
            progress: Any = None, store: Any = None, attribution_id: str | None = None
            ) -> ShapleyResult:
    """Shapley values of the steps of ``run`` for ``v(S)`` = P(fail | S held, the rest
    resampled), each with a ``level`` interval (see the module docstring for the game and the
    two modes). ``budget`` is a rollout count or a ``car.Budget``; it is checked before every
    rollout, and a result cut short by it keeps what was measured with ``truncated=True``."""
    check_run_has_steps(run)
    b, cap = _check(budget, level, mode)
    game = Game(run, players)
    p = game.p
    exact_cost, unit_cost = 1 << p, max(2 * p, 2)
    if mode == "auto":
        mode = ("exact" if p <= MAX_EXACT_PLAYERS and cap >= MIN_REPLICATES * exact_cost
                else "permutation")
    cost = exact_cost if mode == "exact" else unit_cost
    if cap < 2 * cost:
        raise InvalidBudget(
            f"budget of {cap} rollouts cannot pay for two {mode} "
            f"{'replicates' if mode == 'exact' else 'units'} of {cost} rollouts each, the least "
            f"that gives an interval", run_id=run.id,
            hint=f"give budget >= {2 * cost}, or fewer players (players=[...])")
    params = {"budget": b.to_dict(), "seed": seed, "level": level,
              "players": list(players) if players is not None else None, "mode": mode,
              "coupled": coupled, "agent": getattr(agent, "name", "")}
    session = Session(run, agent, outcome, method="shapley", seed=seed, coupled=coupled,
                      budget=b, executor=executor, progress=progress, store=store,
                      attribution_id=attribution_id, params=params)
    units = cap // cost
    y: dict[int, dict[int, float]] = {}  # replicate/unit -> coalition mask -> outcome

    def keep(task: Task, value: float, traj: Trajectory) -> None:
        y.setdefault(task.rollout, {})[masks_by_arm[task.arm]] = value

    masks_by_arm: dict[str, int] = {}
    per_batch = max(1, BATCH_ROLLOUTS // cost)
    for first in range(0, units, per_batch):
        if session.tripped:
            break
        tasks = []
        for u in range(first, min(units, first + per_batch)):
            if mode == "exact":
                masks = list(range(1 << p))
            else:
                masks = sorted({m for order in _orders(seed, u, p) for m in _chain(order)})
            for m in masks:
                masks_by_arm[game.arm(m)] = m
                tasks.append(session.task(game.arm(m), u, game.plan(m)))
        session.execute(tasks, keep)
    return _result(run, game, session, y, mode, cap, seed, level, params)


def _result(run: Trajectory, game: Game, session: Session, y: dict[int, dict[int, float]],
            mode: str, cap: int, seed: int, level: float, params: dict[str, Any]
            ) -> ShapleyResult:
    p = game.p
    complete: list[tuple[int, dict[int, float]]] = []
    for u, ys in sorted(y.items()):
        need = (range(1 << p) if mode == "exact"
                else {m for order in _orders(seed, u, p) for m in _chain(order)})
        if all(m in ys for m in need):
            complete.append((u, ys))
    replicates = [(_exact_phi(game, ys) if mode == "exact" else _perm_phi(game, u, seed, ys))
                  for u, ys in complete]
    values = []
    for i in range(p):
        if replicates:
            est = t_interval([r[i] for r in replicates], level)
            values.append(ShapleyValue(game.steps[i], game.labels[i], est.estimate, est.ci,
                                       est.n))
        else:
            values.append(ShapleyValue(game.steps[i], game.labels[i], None, None, 0))
    v_full = _game_value([ys[game.full] for _, ys in complete], level)
    v_empty = _game_value([ys[0] for _, ys in complete], level)
    total = sum(v.estimate for v in values if v.estimate is not None) if replicates else None
    gap = (total - (v_full.mean - v_empty.mean)
           if total is not None and v_full.mean is not None and v_empty.mean is not None
           else None)
    seen = [v for ys in y.values() for v in ys.values()]
    reason = None
    if not replicates:
        reason = (f"the budget tripped before one complete "
                  f"{'replicate' if mode == 'exact' else 'unit'} ({session.tripped})")
    elif seen and max(seen) == min(seen):
        reason = (f"the outcome never varied: all {len(seen)} rollouts scored {seen[0]:g} "
                  "whatever was held, so every step's value is zero")
    result = ShapleyResult(
        run_id=run.id, mode=mode, values=tuple(values), total=total, v_full=v_full,
        v_empty=v_empty, efficiency_gap=gap, level=level, rollouts_used=session.meter.rollouts,
        budget=cap, truncated=session.tripped is not None, budget_note=session.tripped,
        seed=seed, coupled=session.coupled, tokens=session.meter.tokens,
        cost=round(session.meter.cost, 6), reason=reason, params=params,
        attribution_id=session.attribution_id)
    session.finish(result.to_dict())
    return result


def _game_value(samples: list[float], level: float) -> GameValue:
    if not samples:
        return GameValue(None, None, 0)
    mean = float(np.mean(samples))
    z_value(level)
    return GameValue(mean, wilson(mean, len(samples), level), len(samples))
