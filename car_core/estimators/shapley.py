"""Shapley values of the steps: credit for failures that need several steps to go wrong.

Players are the steps (or the candidate steps in ``players=``, every other step grouped as one);
``v(S)`` is P(fail) with the steps of ``S`` held at their factual action and every other step
resampled. Up to ``MAX_EXACT_PLAYERS`` players every coalition is estimated on its own rollouts
with a control variate (exact mode); beyond, antithetic random orders (permutation mode). Both
keep ``Σφ = v(N) − v(∅)`` replicate by replicate. The game, the allocation, the control
variate and the measured coupling are set out in docs/shapley.md.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from car_core import defaults
from car_core import formatting as fmt
from car_core.engine.agent import Agent, caveats_of
from car_core.engine.execution import ExecutorLike, Progress, Task
from car_core.errors import InvalidBudget, InvalidInput
from car_core.estimators._session import Session, check_run_has_steps, releasing
from car_core.estimators.bounds import check_max
from car_core.model.budget import Budget, as_budget, check_bound
from car_core.model.checks import is_real
from car_core.model.interventions import Plan, compile_plan, do_action, do_resample
from car_core.model.outcome import OutcomeLike
from car_core.model.seeding import Noise, Stream
from car_core.model.trajectory import Trajectory, step_label
from car_core.results import GameValue, ShapleyResult, ShapleyValue
from car_core.stats import Coupling, Interval, coupling_of, t_interval, t_quantile, wilson

if TYPE_CHECKING:  # the store brings sqlite-utils: loaded only where one is used
    from car_core.store import StoreLike

MODES = ("auto", "exact", "permutation")
MIN_PER_COALITION = 8  # "auto" picks exact mode only when every coalition can get this many
MAX_EXACT_PLAYERS = 5   # beyond, 2^p coalitions cost more than antithetic units (2p rollouts) buy
PILOT_SHARE = 0.1
ALLOCATION_STAGES = 2
BATCH_ROLLOUTS = 256  # rollouts handed to the executor at once (bounds memory)
STAND_IN_BATCHES = 8  # permutation units run in at least this many batches (if as many)
DEFAULT_CAP = 2000    # rollout cap when ``budget`` is a car.Budget without one


class Game:
    """Coalitions of players as bit masks, and the plan each one compiles to."""

    def __init__(self, run: Trajectory, players: Sequence[int] | None) -> None:
        n = len(run.steps)
        self.run = run
        if players is None:
            self.groups: list[tuple[int, ...]] = [(k,) for k in range(n)]
            self.labels = [step_label(run, k) for k in range(n)]
            self.steps: list[int | None] = list(range(n))
        else:
            chosen = _check_players(players, n, run.id)
            rest = tuple(k for k in range(n) if k not in chosen)
            self.groups = [(k,) for k in chosen] + ([rest] if rest else [])
            self.labels = [step_label(run, k) for k in chosen] + (
                [f"other steps ({', '.join(map(str, rest))})"] if rest else [])
            self.steps = list(chosen) + ([None] if rest else [])
        self.p = len(self.groups)
        self.full = (1 << self.p) - 1
        self._plans: dict[int, Plan] = {}

    def held(self, mask: int) -> list[int]:
        return sorted(k for i, g in enumerate(self.groups) if mask >> i & 1 for k in g)

    def first_free(self, mask: int) -> int | None:
        """The first resampled step of coalition ``mask`` (None when every step is held)."""
        held = set(self.held(mask))
        return next((k for k in range(len(self.run.steps)) if k not in held), None)

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

    def shapes(self, exact: bool) -> list[Plan]:
        """The plans to vet before the first branch (``Session(plans=)``): every coalition's in
        exact mode; in permutation mode, whose coalitions are drawn, each player alone and each
        player left out, with the empty and the full coalition: every step the branches start
        at, each with later steps held and without."""
        masks = (range(1 << self.p) if exact else
                 {0, self.full} | {1 << i for i in range(self.p)}
                 | {self.full ^ (1 << i) for i in range(self.p)})
        return [self.plan(m) for m in sorted(masks)]


def _check_players(players: Sequence[int], n: int, run_id: str) -> list[int]:
    try:
        chosen = sorted(set(players))
    except TypeError as exc:
        raise InvalidInput(f"players={players!r} must be a list of step indices",
                           run_id=run_id) from exc
    if not chosen or len(chosen) != len(list(players)):
        raise InvalidInput(f"players={list(players)!r} must be distinct step indices, at least "
                           "one", run_id=run_id, hint="e.g. players=[2, 5, 7]")
    for k in chosen:  # numbers.Integral: numpy's integers are step indices too
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= k < n:
            raise InvalidInput(f"player {k!r} is not a step of this {n}-step run",
                               run_id=run_id, hint=f"use steps between 0 and {n - 1}")
    return [int(k) for k in chosen]


def _weights(p: int) -> list[float]:
    """``|S|! (p − |S| − 1)! / p!`` for a coalition S not containing the player."""
    return [math.factorial(s) * math.factorial(p - s - 1) / math.factorial(p) for s in range(p)]


def _coefficients(p: int) -> list[list[float]]:
    """``c[i][S]``: the weight of ``v(S)`` in ``φ_i`` (``+w(|S|−1)`` if i ∈ S, else ``−w(|S|)``)."""
    w = _weights(p)
    return [[w[bin(m).count("1") - 1] if m >> i & 1 else -w[bin(m).count("1")]
             for m in range(1 << p)] for i in range(p)]


def _spread(values: dict[int, float]) -> float:
    """Variance of one coalition's outcomes, floored by the smoothed Bernoulli variance; a
    coalition with no finished branch yet (all of its failed) gets the most a pass/fail
    outcome can vary, so the allocation asks it for more rather than dividing by nothing."""
    n = len(values)
    if n == 0:
        return 0.25
    mean = sum(values.values()) / n
    smoothed = (mean * n + 0.5) / (n + 1)
    sample = sum((v - mean) ** 2 for v in values.values()) / (n - 1) if n > 1 else 0.25
    return max(sample, smoothed * (1 - smoothed))


def _neyman(coef: list[list[float]], ys: dict[int, dict[int, float]], cap: int
            ) -> dict[int, int]:
    """Rollouts per coalition, in total exactly ``max(cap, rollouts already run)``, so that
    Σ_i var(φ_i) = Σ_S a_S / n_S with ``a_S = Σ_i c_{i,S}² σ_S²`` is least given that no
    coalition can lose the rollouts it already has: ``n_S = max(have_S, λ sqrt(a_S))`` (the
    optimum of the continuous problem, by its KKT conditions), λ set so the total is ``cap``;
    rounded down, then the rollouts left go one each to the largest fractions."""
    weight = {m: math.sqrt(sum(c[m] ** 2 for c in coef) * _spread(v)) for m, v in ys.items()}
    have = {m: len(v) for m, v in ys.items()}
    if cap <= sum(have.values()) or sum(weight.values()) <= 0:
        return have
    free = set(ys)
    while True:  # water-filling: a coalition whose share is below what it has keeps that
        rest = cap - sum(have[m] for m in ys if m not in free)
        scale = rest / sum(weight[m] for m in free)
        ideal = {m: weight[m] * scale if m in free else float(have[m]) for m in ys}
        capped = {m for m in free if ideal[m] < have[m]}
        if not capped:
            break
        free -= capped
    # free is never empty: capping every coalition would need Σ have > cap
    target = {m: max(have[m], math.floor(ideal[m])) for m in ys}
    left = cap - sum(target.values())
    order = sorted(free, key=lambda m: (target[m] - ideal[m], m))  # largest fraction first
    for m in order[:max(0, left)]:
        target[m] += 1
    for m in [m for m in reversed(order) if target[m] > have[m]][:max(0, -left)]:
        target[m] -= 1  # only if rounding error made the floors overshoot
    return target


def _orders(seed: int, unit: int, p: int) -> tuple[list[int], list[int]]:
    order = [int(i) for i in Noise(seed, (3, unit)).rng(0, Stream.POLICY).permutation(p)]
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
    if not is_real(level) or not 0 < level < 1:
        raise InvalidInput(f"level={level!r} is outside (0, 1)", hint="use e.g. level=0.95")
    if mode not in MODES:
        raise InvalidInput(f"mode={mode!r} is not one of {MODES}",
                           hint='use "auto", "exact" or "permutation"')
    return b, cap


@releasing
def shapley(run: Trajectory, agent: Agent, *, outcome: OutcomeLike,
            budget: int | Budget = defaults.SHAPLEY_BUDGET, seed: int = 0,
            level: float = defaults.LEVEL, players: Sequence[int] | None = None,
            mode: str = "auto", coupled: bool = True, executor: ExecutorLike = None,
            progress: Progress = None, store: StoreLike | None = None,
            attribution_id: str | None = None, force_agent: bool = False,
            max_budget: int = defaults.MAX_BUDGET, replace: bool = False) -> ShapleyResult:
    """Shapley values of the steps of ``run`` for ``v(S)`` = P(fail | S held, the rest
    resampled), each with a ``level`` interval (see docs/shapley.md for the game and the
    two modes). ``budget`` is a rollout count or a ``car.Budget``; it is checked before every
    rollout, and a result cut short by it keeps what was measured with ``truncated=True``.
    An agent other than the one that recorded ``run`` is refused unless ``force_agent``.
    Refused before anything runs: a budget past ``max_budget`` (``defaults.MAX_BUDGET``; raise
    it knowingly), and a resume (``attribution_id=``) of a finished attribution with a smaller
    budget than it was run with, which would replace its result, unless ``replace``."""
    check_run_has_steps(run)
    b, cap = _check(budget, level, mode)
    check_max(max_budget, "max_budget")
    check_bound(cap, max_budget, "budget", "max_budget=")
    game = Game(run, players)
    p = game.p
    exact_cost, unit_cost = 1 << p, max(2 * p, 2)
    if mode == "auto":
        mode = ("exact" if p <= MAX_EXACT_PLAYERS and cap >= MIN_PER_COALITION * exact_cost
                else "permutation")
    cost = exact_cost if mode == "exact" else unit_cost
    if cap < 2 * cost:
        what = ("two rollouts of each of its" if mode == "exact" else
                "two antithetic units of")
        raise InvalidBudget(
            f"budget of {cap} rollouts cannot pay for {what} {cost} "
            f"{'coalitions' if mode == 'exact' else 'rollouts each'}, the least that gives an "
            f"interval", run_id=run.id,
            hint=f"give budget >= {2 * cost}, or fewer players (players=[...])")
    params = {"budget": b.to_dict(), "seed": seed, "level": level,
              "players": [k for k in game.steps if k is not None] if players is not None
              else None, "mode": mode,
              "coupled": coupled, "agent": agent.name}
    session = Session(run, agent, outcome, method="shapley", seed=seed,
                      coupled=coupled and mode == "permutation",
                      budget=b, executor=executor, progress=progress, store=store,
                      attribution_id=attribution_id, params=params, force_agent=force_agent,
                      planned=_planned, replace=replace, plans=game.shapes(mode == "exact"))
    if mode == "exact":
        samples = _run_exact(game, session, cap)
        return _exact_result(run, game, session, samples, cap, seed, level, params)
    units = cap // cost
    y: dict[int, dict[int, float]] = {}  # unit -> coalition mask -> outcome

    def keep(task: Task, value: float, traj: Trajectory) -> None:
        y.setdefault(task.rollout, {})[masks_by_arm[task.arm]] = value

    masks_by_arm: dict[str, int] = {}
    # a few batches at least: a failed visit's stand-in runs right after its batch, so the
    # units the budget then cuts short are the last ones, not those whose draws led to failure
    per_batch = max(1, min(BATCH_ROLLOUTS // cost, math.ceil(units / STAND_IN_BATCHES)))
    for first in range(0, units, per_batch):
        if session.tripped:
            break
        tasks = []
        for u in range(first, min(units, first + per_batch)):
            for m in sorted({m for order in _orders(seed, u, p) for m in _chain(order)}):
                masks_by_arm[game.arm(m)] = m
                tasks.append(session.task(game.arm(m), u, game.plan(m)))
        session.execute(tasks, keep, stand_in=True)  # a unit short of a visit is dropped
    return _result(run, game, session, y, cap, seed, level, params)


def _planned(params: Mapping[str, Any]) -> tuple[int, int]:
    """The most rollouts an attribution with these params runs (its budget's cap)."""
    cap = params["budget"].get("rollouts")
    total = DEFAULT_CAP if cap is None else int(cap)
    return total, total


def _run_exact(game: Game, session: Session, cap: int) -> Samples:
    """Pilot every coalition evenly, then spend the rest by Neyman allocation. Each rollout
    also records whether its first resampled step drew the factual action again."""
    ys: dict[int, dict[int, float]] = {m: {} for m in range(1 << game.p)}
    ms: dict[int, dict[int, float]] = {m: {} for m in ys}
    arms = {game.arm(m): m for m in ys}
    run = game.run

    def keep(task: Task, value: float, traj: Trajectory) -> None:
        m = arms[task.arm]
        ys[m][task.rollout] = value
        f = game.first_free(m)
        if f is not None:
            ms[m][task.rollout] = float(len(traj.steps) > f
                                        and traj.steps[f].action == run.steps[f].action)

    def fill(targets: dict[int, int]) -> None:
        todo = sorted((r, m) for m, t in targets.items() for r in range(t) if r not in ys[m])
        for first in range(0, len(todo), BATCH_ROLLOUTS):
            if session.tripped:
                return
            session.execute([session.task(game.arm(m), r, game.plan(m))
                             for r, m in todo[first:first + BATCH_ROLLOUTS]], keep)

    pilot = max(2, int(cap * PILOT_SHARE) // len(ys))
    fill({m: pilot for m in ys})
    coef = _coefficients(game.p)
    spent = sum(len(v) for v in ys.values())
    for stage in range(ALLOCATION_STAGES, 0, -1):  # re-estimate σ_S between stages
        if session.tripped:
            break
        fill(_neyman(coef, ys, spent + (cap - spent) // stage))
        spent = sum(len(v) for v in ys.values())
    first = {m: game.first_free(m) for m in ys}
    return Samples(ys, {m: ms[m] for m in ys if first[m] is not None},
                   {m: f for m, f in first.items() if f is not None})


@dataclass(frozen=True)
class Samples:
    """Exact mode's rollouts: outcome per coalition and rollout, the repeat indicator of the
    coalition's first resampled step (coalitions with one), and that step."""

    y: dict[int, dict[int, float]]
    repeat: dict[int, dict[int, float]]
    first: dict[int, int]


def _slope(y: np.ndarray, x: np.ndarray) -> float:
    """Least-squares slope of ``y`` on the control ``x`` (0 when ``x`` never varied)."""
    if len(y) < 3 or float(np.var(x)) == 0.0:
        return 0.0
    return float(np.cov(y, x)[0, 1] / np.var(x, ddof=1))


def _floor(values: np.ndarray) -> float:
    """Smoothed Bernoulli variance ``p̃(1 − p̃)``, ``p̃ = (Σy + ½)/(n + 1)``."""
    q = (float(values.sum()) + 0.5) / (len(values) + 1)
    return q * (1 - q)


def exact_values(coef: list[list[float]], samples: Samples, level: float
                 ) -> list[tuple[float, float]]:
    """``(φ_i, half-width)`` for each player from the coalition samples, with the repeat
    control variate (docs/shapley.md): every coalition contributes the mean of its
    own per-rollout combination ``c y + d x``, so the coalitions stay independent and the
    variance is the sum of their sample variances over ``n_S``."""
    ys = {m: np.array(list(v.values())) for m, v in samples.y.items()}
    xs = {m: np.array([samples.repeat[m][r] for r in samples.y[m]]) for m in samples.repeat}
    beta = {m: _slope(ys[m], x) for m, x in xs.items()}
    groups: dict[int, list[int]] = {}
    for m, f in samples.first.items():
        groups.setdefault(f, []).append(m)
    n_group = {f: sum(len(ys[m]) for m in g) for f, g in groups.items()}
    out = []
    for c in coef:
        pooled = {f: sum(c[m] * beta[m] for m in g) for f, g in groups.items()}
        est, terms = 0.0, {}
        for m, y in ys.items():
            n = len(y)
            z, floor = c[m] * y, c[m] ** 2 * _floor(y)
            if m in xs:
                x, f = xs[m], samples.first[m]
                d = -c[m] * beta[m] + n / n_group[f] * pooled[f]
                z = z + d * x
                fitted = float(np.var(x)) > 0 and float(np.var(y)) > 0
                r2 = float(np.corrcoef(y, x)[0, 1]) ** 2 if fitted else 0.0
                floor = floor * (1 - r2) + (d ** 2 * _floor(x) if float(np.var(x)) == 0 else 0.0)
            est += float(z.mean())
            terms[m] = max(float(np.var(z, ddof=1)), floor) / n
        total = sum(terms.values())
        if total <= 0:
            out.append((est, 0.0))
            continue
        df = total ** 2 / sum(t ** 2 / (len(ys[m]) - 1) for m, t in terms.items())
        out.append((est, t_quantile(0.5 + level / 2, df) * math.sqrt(total)))
    return out


def _exact_result(run: Trajectory, game: Game, session: Session, samples: Samples, cap: int,
                  seed: int, level: float, params: dict[str, Any]) -> ShapleyResult:
    ys = samples.y
    values: list[ShapleyValue] = []
    if all(len(v) >= 2 for v in ys.values()):
        n_all = sum(len(v) for v in ys.values())
        for i, (est, half) in enumerate(exact_values(_coefficients(game.p), samples, level)):
            values.append(ShapleyValue(game.steps[i], game.labels[i], est,
                                       Interval(est - half, est + half, level), n_all))
    else:
        values = [ShapleyValue(game.steps[i], game.labels[i], None, None, 0)
                  for i in range(game.p)]
    measured = Measured("exact", values, list(ys[game.full].values()), list(ys[0].values()),
                        [v for arm in ys.values() for v in arm.values()],
                        measured_coupling(ys, game.full))
    return _finish(Setting(run, game, session, cap, seed, level, params), measured)


def _result(run: Trajectory, game: Game, session: Session, y: dict[int, dict[int, float]],
            cap: int, seed: int, level: float, params: dict[str, Any]) -> ShapleyResult:
    p = game.p
    complete: list[tuple[int, dict[int, float]]] = []
    for u, ys in sorted(y.items()):
        if all(m in ys for order in _orders(seed, u, p) for m in _chain(order)):
            complete.append((u, ys))
    replicates = [_perm_phi(game, u, seed, ys) for u, ys in complete]
    values = []
    for i in range(p):
        if replicates:
            est = t_interval([r[i] for r in replicates], level)
            values.append(ShapleyValue(game.steps[i], game.labels[i], est.estimate,
                                       Interval.of(est.ci, level), est.n))
        else:
            values.append(ShapleyValue(game.steps[i], game.labels[i], None, None, 0))
    by_mask: dict[int, dict[int, float]] = {}
    for u, ys in y.items():
        for m, v in ys.items():
            by_mask.setdefault(m, {})[u] = v
    measured = Measured("permutation", values, [ys[game.full] for _, ys in complete],
                        [ys[0] for _, ys in complete],
                        [v for ys in y.values() for v in ys.values()],
                        measured_coupling(by_mask, game.full))
    return _finish(Setting(run, game, session, cap, seed, level, params), measured)


@dataclass(frozen=True)
class Setting:
    """What an estimate was asked for: the run, its game, the session spending the budget."""

    run: Trajectory
    game: Game
    session: Session
    cap: int
    seed: int
    level: float
    params: dict[str, Any]


@dataclass(frozen=True)
class Measured:
    """What the rollouts gave: the values, the samples of v(N) and v(empty), every outcome."""

    mode: str
    values: list[ShapleyValue]
    full: list[float]
    empty: list[float]
    seen: list[float]
    coupling: Coupling


def measured_coupling(by_mask: dict[int, dict[int, float]], full: int) -> Coupling:
    """Coupling of the coalitions' outcomes with ``v(N)``'s and ``v(∅)``'s at the same rollout
    index (docs/shapley.md): what the rollouts showed, not what noise was handed out."""
    comparisons = []
    for m, ys in sorted(by_mask.items()):
        for end in {0, full} - {m}:
            other = by_mask.get(end, {})
            common = sorted(r for r in ys if r in other)
            comparisons.append(([ys[r] for r in common], [other[r] for r in common]))
    return coupling_of(comparisons)


def _finish(setting: Setting, measured: Measured) -> ShapleyResult:
    run, session, level = setting.run, setting.session, setting.level
    mode, values, seen = measured.mode, measured.values, measured.seen
    cap, seed, params = setting.cap, setting.seed, setting.params
    v_full, v_empty = _game_value(measured.full, level), _game_value(measured.empty, level)
    complete = all(v.estimate is not None for v in values)
    total = sum(v.estimate for v in values if v.estimate is not None) if complete else None
    gap = (total - (v_full.mean - v_empty.mean)
           if total is not None and v_full.mean is not None and v_empty.mean is not None
           else None)
    reason = session.failure_note()  # the values are incomplete: no other reason holds
    if reason is None and not complete:
        reason = (f"the budget tripped before every coalition had two rollouts "
                  f"({session.tripped})" if mode == "exact" else
                  f"the budget tripped before one complete unit ({session.tripped})")
    elif reason is None and seen and max(seen) == min(seen):
        reason = (f"the outcome never varied: all {len(seen)} rollouts scored {seen[0]:g} "
                  "whatever was held, so every step's value is zero")
    result = ShapleyResult(
        run_id=run.id, mode=mode, values=tuple(values), total=total, v_full=v_full,
        v_empty=v_empty, efficiency_gap=gap, level=level, rollouts_used=session.meter.rollouts,
        budget=cap, truncated=session.tripped is not None, budget_note=session.tripped,
        seed=seed, coupled=measured.coupling.shared, coupling=session.coupling,
        caveats=caveats_of(session.agent),
        measured_coupling=measured.coupling,
        tokens=session.meter.tokens,
        cost=round(session.meter.cost, 6), reason=reason, params=params,
        attribution_id=session.attribution_id, failures=session.failure_rows(),
        actions=fmt.step_actions(run))
    session.finish(result)
    return result


def _game_value(samples: list[float], level: float) -> GameValue:
    if not samples:
        return GameValue(None, None, 0)
    mean = float(np.mean(samples))
    return GameValue(mean, Interval(*wilson(mean, len(samples), level), level), len(samples))
