"""The re-estimate: fresh rollouts of a named step, pooled with its confirmation's pairs, and
the interval the result reports (stage 5 of the search, docs/contrastive-search.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from car_core.estimators.confirmation import Confirmation
from car_core.stats import difference
from car_core.stats.sequential import ConfidenceSequence, Prior, confidence_sequence

REFIT_APART = 1 << 19  # the held arm's offset in an unpaired re-estimate (its own indices)
REFIT_MARGIN = 1.5     # the re-estimate's variance is at most the paper's over this


@dataclass(frozen=True)
class RefitPlan:
    """Fresh rollouts for the re-estimate: paired (both arms on the same indices) or unpaired
    (each arm on its own indices, in Neyman proportion)."""

    paired: bool
    held: int
    resampled: int


def pooled_pairs(conf: Confirmation) -> np.ndarray:
    """Which of the confirmation's pairs the re-estimate pools: all but the one on which the
    anytime test crossed its boundary (docs/contrastive-search.md, stage 5); the pairs after
    it in the same batch were drawn whatever it showed."""
    keep = np.ones(conf.d.size, dtype=bool)
    if conf.crossed is not None:
        keep[conf.crossed - 1] = False
    return np.nonzero(keep)[0]


def _smoothed_sd(mean: float, n: int) -> float:
    q = (mean * n + 0.5) / (n + 1)
    return math.sqrt(q * (1 - q))


def refit_plan(d: np.ndarray, held: float, resampled: float, shared: bool, k: int,
                room: int) -> RefitPlan:
    """As many fresh rollouts as give an interval narrower than the paper's fixed-``K`` one
    (``K`` rollouts of the resampled arm against a fixed factual baseline: variance
    ``p(1 − p)/K``; ours at most that over ``REFIT_MARGIN``), or ``room``. Whichever design
    has the smaller variance per rollout, as the confirmation's pairs show it: pairs cost two
    rollouts and carry ``var(d)``; unpaired arms in Neyman proportion carry
    ``(σ_held + σ_resampled)²`` per rollout, which wins when the noise is not shared or the
    held arm barely varies (a factual arm that always fails needs few rollouts of its own, and
    its pair partner's would be spent for nothing)."""
    m = max(int(d.size), 1)
    s_hi, s_lo = _smoothed_sd(held, m), _smoothed_sd(resampled, m)
    paper = max(resampled * (1 - resampled), 0.25 / max(k, 1)) / REFIT_MARGIN
    per_pair = 2 * max(float(d.var()), 1e-3)
    apart = (s_hi + s_lo) ** 2
    if shared and per_pair <= apart:
        pairs = min(max(4, math.ceil(k * per_pair / 2 / paper)), room // 2)
        return RefitPlan(True, pairs, pairs)
    total = min(max(8, math.ceil(k * apart / paper)), room)
    hi = max(2, round(total * s_hi / (s_hi + s_lo)))
    return RefitPlan(False, hi, max(0, total - hi))


def reported_interval(d: np.ndarray, refit: np.ndarray | None, alpha: float, paired: bool,
              shown: bool, prior: Prior, intervals: bool, held_hi: np.ndarray | None,
              held_lo: np.ndarray | None) -> tuple[float, ConfidenceSequence | None]:
    """The reported effect and the interval it lies in (docs/contrastive-search.md, stage 5)."""
    if refit is not None and held_hi is not None and held_lo is not None and refit.size:
        diff = difference(held_hi.tolist(), held_lo.tolist(), 1.0 - alpha, paired=paired)
        low, high = diff.ci
        est = diff.estimate
        if shown and est > 0 and low <= 0:
            low = float(np.nextafter(0.0, 1.0))
        return est, ConfidenceSequence(est, (min(low, est), max(high, est)), 1.0 - alpha,
                                       int(refit.size if paired else held_lo.size))
    est = float(d.mean())
    if not intervals:
        return est, None
    cs = confidence_sequence(d, alpha, prior, shown)
    return est, ConfidenceSequence(est, (min(cs.ci[0], est), max(cs.ci[1], est)), cs.level,
                                   cs.n)
