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
from car_core.stats.sequential import (
    LOW_SHARE,
    Prior,
    confidence_sequence,
    final_critical,
    positive_at,
    positive_by_end,
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


# -- the exact end-of-sampling sign test -------------------------------------------------------
def test_final_critical_value_is_the_smallest_with_exact_level():
    """Enumerate all 2^12 fair sign sequences: the anytime boundary crossed at some prefix, or
    at least ``c`` up at the end, has probability <= θα exactly; with ``c - 1`` it would not."""
    import itertools
    prior = Prior(1.0, 1.2)
    weights = tuple(float(w) for w in prior.weights())
    m = 12
    c = final_critical(m, 0.05, weights)
    crossed, ups = [], []
    for signs in itertools.product((-1.0, 1.0), repeat=m):
        crossed.append(positive_at(signs, 0.05, prior) is not None)
        ups.append(sum(x > 0 for x in signs))
    crossed_a, ups_a = np.array(crossed), np.array(ups)
    level = LOW_SHARE * 0.05
    assert np.mean(crossed_a | (ups_a >= c)) <= level
    assert np.mean(crossed_a | (ups_a >= c - 1)) > level


@pytest.mark.parametrize("disagree", [0.15, 0.6])
def test_end_of_sampling_test_error_is_at_most_theta_alpha(disagree):
    """Fair signs on the pairs that disagree (mean 0), 120 pairs: the anytime test plus the
    exact one at the end rejects in <= θα = 4.5% of sequences. 3000 sequences: SE <= 0.4%, so
    0.057 is 3 SE above the bound."""
    rng = np.random.default_rng(5)
    false = sum(positive_by_end(_three_point(rng, 120, disagree / 2, disagree / 2), 0.05)
                for _ in range(3000))
    assert false / 3000 <= 0.057


def test_end_of_sampling_test_has_the_power_of_the_fixed_exact_sign_test():
    """Pairs up w.p. 0.135, down w.p. 0.015 (rescue 0.15 behind a 10% judge), 100 pairs. The
    one-sided exact sign test at θα on all of them has power P computed from the binomials;
    the anytime part takes a little of θα, so the combined test must reach P − 0.03 (1000
    sequences: SE ≈ 0.8%, so 0.03 is also ~3.5 SE)."""
    from scipy.stats import binom
    up, down, n = 0.135, 0.015, 100
    disc = up + down
    level = LOW_SHARE * 0.05
    power = 0.0
    for m in range(1, n + 1):
        c = next(c for c in range(m + 2) if binom.sf(c - 1, m, 0.5) <= level)
        power += binom.pmf(m, n, disc) * binom.sf(c - 1, m, up / disc)
    rng = np.random.default_rng(9)
    prior = Prior.of(_three_point(rng, 8, up, down))
    hits = sum(positive_by_end(_three_point(rng, n, up, down), 0.05, prior) for _ in range(1000))
    assert hits / 1000 >= power - 0.03


def test_end_of_sampling_test_is_the_anytime_test_for_graded_outcomes():
    """Graded scores are not signs: 25 small gains and 5 large losses have a negative mean,
    though a sign test would call 25 of 30 up significant; only the anytime test decides."""
    d = np.array([0.1] * 25 + [-0.9] * 5)
    np.random.default_rng(1).shuffle(d)
    assert d.mean() < 0 and positive_at(d, 0.05) is None
    assert positive_by_end(d, 0.05) is False


def test_interval_of_a_step_shown_positive_lies_above_zero():
    """8 up and 1 down among 60 pairs: too little for the anytime test, whose interval still
    reaches below zero, enough for the exact sign test at the end (P(≥8 of 9) = 0.02 < θα);
    the interval reported with that verdict starts above zero and keeps its upper end."""
    d = np.array([1.0] * 8 + [-1.0] + [0.0] * 51)
    np.random.default_rng(0).shuffle(d)
    plain = confidence_sequence(d, 0.05)
    assert positive_at(d, 0.05) is None and plain.ci[0] <= 0 and positive_by_end(d, 0.05)
    shown = confidence_sequence(d, 0.05, shown_positive=True)
    assert shown.ci[0] > 0 and shown.ci[1] == plain.ci[1]


def test_bets_for_a_certain_failure_show_a_rescue_from_five_pairs_up():
    """Pairs whose upper arm always fails never go down, and a rescue of 0.3 sends three in
    ten up. With nine tenths of the weight on the largest bet the first confirmation's level
    (``θα·FIRST_SHARE``, 0.0405) is reached by five pairs up; the even mixture needs seven."""
    from car_core.estimators.confirmation import FIRST_SHARE
    level = 0.05 * FIRST_SHARE
    ups = np.ones(8)
    assert positive_at(ups, level, Prior.certain_failure()) == 5
    assert positive_at(ups, level, Prior()) == 7


@pytest.mark.parametrize("up,down", [(0.25, 0.25), (0.1, 0.2), (0.05, 0.05)])
def test_bets_for_a_certain_failure_keep_the_error_at_most_alpha(up, down):
    """Where the prior was wrong and pairs do go down (mean <= 0), the test still rejects in
    at most θα of sequences however long it looks: the weights are fixed before the pairs.
    2000 sequences of 300 pairs: SE <= 0.5%, so 0.065 is 3 SE above the bound."""
    rng = np.random.default_rng(13)
    prior = Prior.certain_failure()
    false = sum(positive_at(_three_point(rng, 300, up, down), 0.05, prior) is not None
                for _ in range(2000))
    assert false / 2000 <= 0.065
