"""Intervals for proportions, their differences and replicate means: coverage and edges."""

from __future__ import annotations

import math

import numpy as np
import pytest

from car_core.errors import InvalidInput
from car_core.sequential import Prior, confidence_sequence, positive_at
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


# -- the betting test and confidence sequence for paired differences ---------------------------
def _three_point(rng, size, up, down):
    u = rng.random(size)
    return np.where(u < up, 1.0, np.where(u < up + down, -1.0, 0.0))


@pytest.mark.parametrize("up,down", [(0.27, 0.03), (0.25, 0.25), (0.0, 0.0), (0.6, 0.1)])
def test_confidence_sequence_covers_at_every_time(up, down):
    """The running interval after all 120 pairs is the intersection over every look, so it
    covering the mean is the anytime guarantee; nominal ≥ 95%. 200 draws: SE ≈ 1.5%, so 0.90
    is > 3 SE below nominal."""
    rng = np.random.default_rng(7)
    mean = up - down
    covered = 0
    for _ in range(200):
        cs = confidence_sequence(_three_point(rng, 120, up, down), 0.05)
        covered += cs.ci[0] <= mean <= cs.ci[1]
    assert covered / 200 >= 0.90


@pytest.mark.parametrize("up,down", [(0.25, 0.25), (0.1, 0.2), (0.0, 0.0)])
def test_betting_test_error_is_at_most_alpha_however_long_it_looks(up, down):
    """Mean <= 0: the test looks after every one of 300 pairs; it may reject in ≤ θα ≤ 5% of
    sequences. 2000 sequences: SE ≤ 0.5%, so 0.065 is 3 SE above the bound."""
    rng = np.random.default_rng(11)
    false = sum(positive_at(_three_point(rng, 300, up, down), 0.05) is not None
                for _ in range(2000))
    assert false / 2000 <= 0.065


def test_betting_test_finds_a_rescue_of_0_3_within_60_pairs():
    """Pairs up w.p. 0.3, never down (a coupled pivot, rescue 0.3). A fixed-sample exact test
    needs ~30 pairs for 90% power; the anytime test measured ~33 for 90%, so by 60 pairs it
    should reject in ≥ 95% of 500 sequences (measured ~99.5%; SE ~1%)."""
    rng = np.random.default_rng(3)
    hits = sum((positive_at((rng.random(60) < 0.3).astype(float), 0.05) or 999) <= 60
               for _ in range(500))
    assert hits / 500 >= 0.95


def test_prior_pseudo_data_is_scaled_to_its_weight():
    prior = Prior.of(np.ones(40), weight=8)
    assert prior.total == pytest.approx(8.0) and prior.squares == pytest.approx(8.0)
    assert Prior.of([]) == Prior()
