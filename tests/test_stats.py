"""Intervals for proportions, their differences and replicate means: coverage and edges."""

from __future__ import annotations

import math

import numpy as np
import pytest

from car_core.errors import InvalidInput
from car_core.stats import (
    bonferroni_level,
    difference,
    look_levels,
    looks,
    t_interval,
    wilson,
)

DRAWS = 2000  # Monte-Carlo SE of a 95% coverage estimate: sqrt(.95*.05/2000) ≈ 0.5%


@pytest.mark.parametrize("p,n", [(0.1, 20), (0.5, 10), (0.9, 30)])
def test_wilson_covers(p, n):
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(DRAWS):
        lo, hi = wilson(float(rng.binomial(n, p)) / n, n, 0.95)
        hits += lo <= p <= hi
    # Wilson's coverage oscillates around nominal, dipping to ~93% at some (p, n); 0.92 sits
    # 2 SE below that floor.
    assert hits / DRAWS >= 0.92


def test_wilson_known_value():
    # 0 successes of 10 at 95%: upper = z²/(n + z²) with z = 1.95996.
    z2 = 1.959964 ** 2
    lo, hi = wilson(0.0, 10, 0.95)
    assert lo == 0.0 and hi == pytest.approx(z2 / (10 + z2), rel=1e-5)


@pytest.mark.parametrize("paired", [False, True])
def test_newcombe_difference_covers(paired):
    """Arms with P = 0.6 and 0.3 from n = 30; paired draws share one uniform per pair (as
    common random numbers do), unpaired draws are independent."""
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(DRAWS):
        u = rng.random(30)
        v = u if paired else rng.random(30)
        a, b = (u < 0.6).astype(float).tolist(), (v < 0.3).astype(float).tolist()
        d = difference(a, b, 0.95, paired=paired)
        hits += d.ci[0] <= 0.3 <= d.ci[1]
    assert hits / DRAWS >= 0.92


@pytest.mark.parametrize("n,pa,pb", [(8, 0.5, 0.45), (10, 0.5, 0.4), (32, 0.5, 0.45),
                                     (6, 0.7, 0.3)])
def test_paired_difference_covers_when_pairs_rarely_disagree(n, pa, pb):
    """Nested pairs (one uniform per pair, as common random numbers give) with a small
    difference: many samples show no disagreeing pair at all. Without Newcombe's correction of
    the correlation these intervals covered 78-84%; DRAWS as above, same 0.92 floor."""
    rng = np.random.default_rng(3)
    hits = 0
    for _ in range(DRAWS):
        u = rng.random(n)
        a, b = (u < pa).astype(float).tolist(), (u < pb).astype(float).tolist()
        d = difference(a, b, 0.95, paired=True)
        hits += d.ci[0] <= pa - pb <= d.ci[1]
    assert hits / DRAWS >= 0.92


def test_paired_interval_is_narrower_when_pairs_are_correlated():
    u = np.random.default_rng(2).random(40)
    a, b = (u < 0.6).astype(float).tolist(), (u < 0.3).astype(float).tolist()
    paired, unpaired = difference(a, b, paired=True), difference(a, b, paired=False)
    assert paired.estimate == unpaired.estimate
    assert paired.ci[1] - paired.ci[0] < unpaired.ci[1] - unpaired.ci[0]


def test_difference_needs_samples():
    with pytest.raises(InvalidInput):
        difference([], [1.0])
    with pytest.raises(InvalidInput):
        difference([1.0], [1.0, 0.0], paired=True)


def test_t_interval_known_value():
    est = t_interval([1.0, 2.0, 3.0], 0.95)
    half = 4.302653 / math.sqrt(3)  # t_{0.975, 2} * sd / sqrt(n), sd = 1
    assert est.estimate == 2.0 and est.ci == pytest.approx((2 - half, 2 + half), rel=1e-6)
    assert t_interval([0.5], 0.95).ci is None
    with pytest.raises(InvalidInput):
        t_interval([], 0.95)


def test_bonferroni_and_look_levels_spend_exactly_alpha():
    assert bonferroni_level(0.05, 5) == pytest.approx(0.99)
    sizes = looks(32)
    assert sizes == [8, 16, 32]
    levels = look_levels(sizes, 0.05, 4)
    assert sum(1 - lv for lv in levels) == pytest.approx(0.05 / 4)
    assert levels[0] > levels[1] > levels[2]  # early looks spend the least
    assert looks(1) == [1] and looks(3) == [1, 2, 3]
    with pytest.raises(InvalidInput):
        look_levels(sizes, 1.2, 4)
