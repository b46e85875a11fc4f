"""The paper's two estimators, re-implemented from their description as a baseline.

Contrastive: for each step ``k``, ``K`` rollouts with steps ``< k`` held and step ``k``
resampled (independent noise per rollout); the effect of step ``k`` is the single observed
outcome minus each rollout's outcome (a size-1 factual baseline); a percentile bootstrap
interval of its mean, no multiplicity control; the locus is the latest step whose interval
excludes zero. It always costs ``n·K`` rollouts. ``steps=`` tests only some steps (a benchmark
that asks only "is the latest significant step the pivot?" needs the pivot and the steps after
it; every other step's rollouts could not change that answer).

Shapley: Monte-Carlo permutation sampling with antithetic (reversed) permutations; at every
visit ``v(S)`` is re-estimated from a few fresh rollouts (no common random numbers), including
``v(∅)`` and ``v(N)``; a normal interval over permutations; a circuit breaker that stops before
a permutation would overrun the budget.

Both use the same replay engine and the same game as ``car.contrastive`` / ``car.shapley`` so
that a comparison measures the estimators and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import norm

from car_core.engine.agent import OutcomeFn
from car_core.engine.execution import Task
from car_core.engine.replay import run_branch
from car_core.estimators.shapley import Game
from car_core.model.interventions import compile_plan, do_resample
from car_core.model.seeding import Noise
from car_core.model.trajectory import Trajectory


@dataclass(frozen=True)
class PaperContrastive:
    locus: int | None
    tested: tuple[int, ...]          # the steps the rule ran; effects and cis follow them
    effects: tuple[float, ...]
    cis: tuple[tuple[float, float], ...]
    rollouts_used: int


@dataclass(frozen=True)
class PaperShapley:
    values: tuple[float, ...]
    cis: tuple[tuple[float, float], ...]
    permutations: int
    rollouts_used: int


def _score(run: Trajectory, agent: Any, outcome: OutcomeFn, plan: Any, noise: Noise,
           arm: str, r: int) -> float:
    traj = run_branch(run, agent, outcome, Task(arm=arm, rollout=r, plan=plan, noise=noise))
    assert traj.outcome is not None
    return traj.outcome.value


def paper_contrastive(run: Trajectory, agent: Any, *, outcome: Any, rollouts: int = 32,
                      seed: int = 0, level: float = 0.95, boot: int = 1000,
                      steps: Sequence[int] | None = None) -> PaperContrastive:
    out = OutcomeFn(outcome)
    assert run.outcome is not None
    observed = run.outcome.value
    rng = np.random.default_rng([seed, 99])
    effects, cis, used = [], [], 0
    tail = (1 - level) / 2
    tested = tuple(range(len(run.steps)) if steps is None else sorted(steps))
    for k in tested:
        plan = compile_plan(run, [do_resample(k)])
        ys = np.array([_score(run, agent, out, plan, Noise(seed, (5, k, r)), f"paper<{k}", r)
                       for r in range(rollouts)])
        used += rollouts
        diffs = observed - ys
        means = rng.choice(diffs, size=(boot, rollouts), replace=True).mean(axis=1)
        lo, hi = np.quantile(means, [tail, 1 - tail])
        effects.append(float(diffs.mean()))
        cis.append((float(lo), float(hi)))
    significant = [k for k, (lo, hi) in zip(tested, cis, strict=True) if lo > 0 or hi < 0]
    return PaperContrastive(max(significant) if significant else None, tested, tuple(effects),
                            tuple(cis), used)


def paper_shapley(run: Trajectory, agent: Any, *, outcome: Any, budget: int = 2000,
                  seed: int = 0, per_visit: int = 4, level: float = 0.95) -> PaperShapley:
    out = OutcomeFn(outcome)
    game = Game(run, None)
    p = game.p
    rng = np.random.default_rng([seed, 77])
    cost = (p + 1) * per_visit
    marginals: list[list[float]] = []
    used, visit = 0, 0
    while True:
        order = [int(i) for i in rng.permutation(p)]
        if used + 2 * cost > budget:  # circuit breaker: never start what cannot finish
            break
        for perm in (order, order[::-1]):
            mask, chain = 0, [0]
            for i in perm:
                mask |= 1 << i
                chain.append(mask)
            values = []
            for m in chain:
                plan = game.plan(m)
                ys = [_score(run, agent, out, plan, Noise(seed, (6, visit, j)), "paper", j)
                      for j in range(per_visit)]
                visit += 1
                values.append(sum(ys) / per_visit)
            used += cost
            phi = [0.0] * p
            for pos, i in enumerate(perm):
                phi[i] = values[pos + 1] - values[pos]
            marginals.append(phi)
    arr = np.array(marginals)
    z = float(norm.ppf(0.5 + level / 2))
    mean = arr.mean(axis=0)
    if len(arr) > 1:
        half = z * arr.std(axis=0, ddof=1) / math.sqrt(len(arr))
    else:
        half = np.full(p, np.nan)
    cis = tuple((float(m - h), float(m + h)) for m, h in zip(mean, half, strict=True))
    return PaperShapley(tuple(float(x) for x in mean), cis, len(arr), used)
