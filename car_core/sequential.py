"""Anytime-valid inference for the mean of paired differences in [-1, 1], by betting.

Each pair gives ``d_t = y_hi − y_lo`` in ``[-1, 1]``, independent across pairs with mean ``μ``.
For a candidate mean ``m`` two gamblers bet: ``K⁺_t(m) = Π (1 + λ⁺_s (d_s − m))`` and
``K⁻_t(m) = Π (1 − λ⁻_s (d_s − m))``, with bets ``λ`` chosen from the pairs before ``s`` only
(predictable) and kept where the factors stay non-negative. If ``μ = m`` both are non-negative
martingales with mean one, so is ``E_t(m) = θ K⁺_t(m) + (1 − θ) K⁻_t(m)``, and Ville's inequality
gives ``P(sup_t E_t(m) ≥ 1/α) ≤ α``. The confidence sequence is every ``m`` never rejected so
far; it covers ``μ`` at all times at once with probability ``≥ 1 − α``, so the data may be
looked at after every pair and the sampling stopped whenever the answer is clear (Waudby-Smith
& Ramdas 2023, "Estimating means of bounded random variables by betting").

``θ = LOW_SHARE`` gives most of ``α`` to the lower bound, the side that decides whether a rescue
is positive. The positive bet is one sequence for every ``m ≤ 0``, so ``K⁺_t(m)`` is decreasing
in ``m`` there: once ``θ K⁺_t(0) ≥ 1/α`` every ``m ≤ 0`` is rejected, which is the test
``positive_at``. Under any ``μ ≤ 0``, ``K⁺(0)`` is a non-negative supermartingale, so that test
has error ``≤ θα`` however long it runs. Bets are the clipped plug-in ``Σd / Σd²`` (the
growth-optimal bet for three-point data), started from prior pseudo-data that must be
independent of the pairs (for instance earlier, separate rollouts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LOW_SHARE = 0.9      # θ: the share of α spent on the lower bound
MAX_BET = 0.9        # bets stay below one, so one adverse pair never ruins a gambler
GRID = np.linspace(-1.0, 1.0, 801)  # candidate means of the confidence sequence
PRIOR_WEIGHT = 8.0   # prior pseudo-data count at most this many pairs


@dataclass(frozen=True)
class Prior:
    """Pseudo-data that start the bets: a sum of differences and of their squares."""

    total: float = 0.0
    squares: float = 0.0

    @classmethod
    def of(cls, d: Sequence[float] | np.ndarray, weight: float = PRIOR_WEIGHT) -> Prior:
        arr = np.asarray(d, dtype=float)
        if arr.size == 0:
            return cls()
        scale = min(1.0, weight / arr.size)
        return cls(float(arr.sum()) * scale, float((arr ** 2).sum()) * scale)


def _bets(x: np.ndarray, prior_total: float | np.ndarray, prior_sq: float | np.ndarray,
          cap: float | np.ndarray) -> np.ndarray:
    """Predictable plug-in bets for the centred data ``x`` (rows: pairs; columns: means)."""
    past = np.cumsum(x, axis=0) - x
    past_sq = np.cumsum(x * x, axis=0) - x * x
    lam = (past + prior_total) / (past_sq + prior_sq + 1.0)
    return np.asarray(np.clip(lam, 0.0, cap), dtype=float)


def positive_at(d: Sequence[float] | np.ndarray, alpha: float, prior: Prior = Prior()
                ) -> int | None:
    """The first number of pairs after which ``θ K⁺(0) ≥ 1/α`` (mean > 0 shown), else None."""
    x = np.asarray(d, dtype=float)
    if x.size == 0:
        return None
    lam = _bets(x, prior.total, prior.squares, MAX_BET)
    wealth = np.cumprod(1.0 + lam * x)
    hit = np.nonzero(LOW_SHARE * wealth >= 1.0 / alpha)[0]
    return int(hit[0]) + 1 if hit.size else None


@dataclass(frozen=True)
class ConfidenceSequence:
    """The confidence sequence after ``n`` pairs: mean, running interval and its level."""

    estimate: float
    ci: tuple[float, float]
    level: float
    n: int


def confidence_sequence(d: Sequence[float] | np.ndarray, alpha: float, prior: Prior = Prior()
                        ) -> ConfidenceSequence:
    """The running-intersection confidence sequence of ``μ`` after all of ``d``."""
    x = np.asarray(d, dtype=float)
    if x.size == 0:
        return ConfidenceSequence(float("nan"), (-1.0, 1.0), 1.0 - alpha, 0)
    m = GRID[None, :]
    centred = x[:, None] - m
    # positive bets: one sequence (from d itself) for m <= 0, capped so factors stay >= 0
    lam_pos = _bets(x[:, None], prior.total, prior.squares, MAX_BET)
    lam_pos = np.minimum(lam_pos, MAX_BET / (1.0 + np.maximum(m, 0.0)))
    lam_neg = _bets(-centred, 0.0, 0.0, MAX_BET / (1.0 - m + 1e-12))
    k_pos = np.cumprod(1.0 + lam_pos * centred, axis=0)
    k_neg = np.cumprod(1.0 - lam_neg * centred, axis=0)
    e = LOW_SHARE * k_pos + (1.0 - LOW_SHARE) * k_neg
    kept = np.nonzero(e.max(axis=0) < 1.0 / alpha)[0]
    step = GRID[1] - GRID[0]
    if kept.size == 0:  # every mean rejected: only possible with probability <= alpha
        centre = float(x.mean())
        return ConfidenceSequence(centre, (centre, centre), 1.0 - alpha, int(x.size))
    lo_i, hi_i = int(kept[0]), int(kept[-1])
    low = GRID[lo_i] - step / 2 if lo_i > 0 else -1.0
    high = GRID[hi_i] + step / 2 if hi_i < GRID.size - 1 else 1.0
    return ConfidenceSequence(float(x.mean()), (float(low), float(high)), 1.0 - alpha, int(x.size))
