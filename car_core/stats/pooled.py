"""The mean of per-run effects over a population, with an interval stratified by run.

Each run ``i`` of ``N`` gives ``K_i`` paired differences ``d_ir`` in ``[-1, 1]`` (rollout ``r``
of two arms), independent across rollouts and runs, with mean ``μ_i``. The estimand is the
population's mean effect ``θ = (1/N) Σ_i μ_i`` over these runs, every run weighted alike
whatever its ``K_i``; the estimate is ``θ̂ = (1/N) Σ_i d̄_i``.

Interval: Hoeffding's inequality for the weighted sum ``θ̂ = Σ_i Σ_r d_ir / (N K_i)`` of
independent terms, each in a range of width ``2 / (N K_i)``, gives
``P(|θ̂ − θ| ≥ t) ≤ 2 exp(−t² N² / (2 Σ_i 1/K_i))``, so the half-width
``t = sqrt(2 ln(2/(1 − level)) Σ_i 1/K_i) / N`` covers ``θ`` with probability at least
``level`` at every sample size, for any distribution of the differences (no normal
approximation, nothing assumed of the runs' variances). The price is that it does not narrow
when the differences vary little (as under shared noise, where most pairs agree): it is
conservative there, never liberal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from car_core.errors import InvalidInput
from car_core.stats import Interval, check_level


def hoeffding_half_width(sizes: Sequence[int], level: float) -> float:
    """Half-width of the stratified Hoeffding interval (module docstring) for runs with
    ``sizes`` pairs each."""
    check_level(level)
    if not sizes or min(sizes) < 1:
        raise InvalidInput("a pooled mean needs at least one pair in every run",
                           hint="leave out the runs that have no pair")
    n = len(sizes)
    return math.sqrt(2.0 * math.log(2.0 / (1.0 - level)) * sum(1.0 / k for k in sizes)) / n


def pooled_mean(differences: Sequence[Sequence[float]], level: float
                ) -> tuple[float, Interval]:
    """``θ̂`` and its stratified Hoeffding interval at ``level`` (clipped to ``[-1, 1]``)
    from each run's paired differences."""
    if not differences:
        raise InvalidInput("a pooled mean over no run", hint="test the fix on at least one run")
    half = hoeffding_half_width([len(d) for d in differences], level)
    est = sum(sum(d) / len(d) for d in differences) / len(differences)
    return est, Interval(max(-1.0, est - half), min(1.0, est + half), level)


__all__ = ["hoeffding_half_width", "pooled_mean"]
