"""The coupling measure on graded scores: independent arms are not called shared more often than
the measure's level allows, an arm that never varied says nothing, and shared noise is found.

A user trial's judge scored 0.9 or 0.1 with its own randomness; the arms shared no noise, yet
two attributions said ``paired: … measured agreement 0.73 [0.19, 1.00]`` and ``1.00 [0.18,
1.00]``. The measure took a score's mean for a pass rate: independence was then put too low for
scores such as 0.1/0.9, and an arm that always scored 0.9 left room above it.

``Coupling.shared`` is a one-sided test at ``(1 − level)/2`` (2.5% at 0.95). Each shape below
is drawn on ``SEEDS`` seeds; the count of "shared" must stay within the binomial upper bound
of that rate, at a chance ``TAIL`` per shape of a false alarm (Bonferroni over the shapes).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import car_core as car
from car_core.stats import coupling_of
from car_core.testing import synthetic as syn

SEEDS = 400
LEVEL = 0.95
FALSE_SHARED = (1 - LEVEL) / 2  # the rate ``Coupling.shared`` claims on independent arms
TAIL = 1e-3

Arms = list[tuple[np.ndarray, np.ndarray]]
Shape = Callable[[np.random.Generator, int], Arms]


def _two(rng: np.random.Generator, p: float, s: int) -> np.ndarray:
    """A judge that says 0.9 with probability ``p``, else 0.1 (the trial's judge)."""
    return np.where(rng.random(s) < p, 0.9, 0.1)


def _binomial_bound(n: int, p: float, tail: float) -> int:
    """The smallest ``k`` with ``P(Binomial(n, p) > k) ≤ tail``."""
    from scipy.stats import binom
    return int(binom.ppf(1 - tail, n, p))


# independent arms, (shape, rollouts per arm): the rate called shared on these 400 seeds is
# noted before the fix → after it
INDEPENDENT: dict[str, tuple[Shape, int]] = {
    # both arms vary between 0.1 and 0.9: 13.5% → 2.5%
    "0.1/0.9 both vary": (lambda r, s: [(_two(r, .5, s), _two(r, .5, s))], 32),
    # the held arm always scores 0.9 (the trial): 23% → 0, and 19% → 0 against a rate of 0.8
    "0.1/0.9 held at 0.9": (lambda r, s: [(np.full(s, .9), _two(r, .5, s))], 84),
    "0.1/0.9 held at 0.9, other mostly 0.9":
        (lambda r, s: [(np.full(s, .9), _two(r, .8, s))], 32),
    # a search's pool: constant arms beside varying ones: 31% → 1.8%
    "0.1/0.9 pooled as a search": (lambda r, s: [(np.full(s, .9), _two(r, .5, s)),
                                                 (_two(r, .7, s), np.full(s, .1)),
                                                 (_two(r, .6, s), _two(r, .4, s))], 32),
    # continuous scores: 41%, 93% (one arm constant at 0.3), 92%, 25% (three levels) → 0
    "continuous both vary": (lambda r, s: [(r.random(s), r.random(s))], 32),
    "continuous, one constant": (lambda r, s: [(np.full(s, .3), r.random(s))], 32),
    "continuous, unlike shapes": (lambda r, s: [(r.beta(.5, .5, s), r.beta(2, 5, s))], 84),
    "three levels against continuous":
        (lambda r, s: [(r.integers(0, 3, s) / 2, r.random(s))], 84),
    # pass/fail: unchanged by the fix (2.5% → 2.5% at rate 0.5, the measure's worst case)
    "0/1 both vary": (lambda r, s: [((r.random(s) < .5) * 1.0, (r.random(s) < .5) * 1.0)], 32),
}


def _threshold(u: np.ndarray, p: float) -> np.ndarray:
    return np.where(u < p, 0.9, 0.1)


# shared noise: both arms are functions of one draw ``u`` per rollout index
SHARED: dict[str, tuple[Shape, int]] = {
    "0.1/0.9 on common draws, rates 0.5/0.5": (
        lambda r, s: (lambda u: [(_threshold(u, .5), _threshold(u, .5))])(r.random(s)), 16),
    "0.1/0.9 on common draws, rates 0.6/0.3": (
        lambda r, s: (lambda u: [(_threshold(u, .6), _threshold(u, .3))])(r.random(s)), 64),
    "0.1/0.9 beside an arm held at 0.9": (
        lambda r, s: (lambda u: [(_threshold(u, .6), _threshold(u, .3)),
                                 (np.full(s, .9), _threshold(u, .5))])(r.random(s)), 64),
    "continuous, 70% of indices shared": (
        lambda r, s: (lambda u, v, m: [(u, np.where(m, u, v))])(
            r.random(s), r.random(s), r.random(s) < .7), 48),
    "continuous, monotone in one draw": (
        lambda r, s: (lambda u: [(u, u ** 2)])(r.random(s)), 48),
}


def _shared_count(shape: Shape, s: int, seeds: int = SEEDS) -> int:
    hits = 0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        hits += coupling_of([(a.tolist(), b.tolist()) for a, b in shape(rng, s)], LEVEL).shared
    return hits


@pytest.mark.parametrize("name", sorted(INDEPENDENT))
def test_independent_graded_arms_are_not_called_shared(name: str) -> None:
    """At most ``FALSE_SHARED`` of independent draws show shared noise: with 400 seeds the
    bound is 23 (5.8%) at a 1e-3/9 chance of a false alarm per shape. After the fix the
    planted counts are 0–10 of 400 (0–2.5%; the most is the 0/1 shape at rate 0.5, which the
    two-level graded one now matches); before it, 54–370 of 400 for the graded shapes."""
    shape, s = INDEPENDENT[name]
    limit = _binomial_bound(SEEDS, FALSE_SHARED, TAIL / len(INDEPENDENT))
    hits = _shared_count(shape, s)
    assert hits <= limit, f"{name}: {hits}/{SEEDS} called shared (bound {limit})"


@pytest.mark.parametrize("name", sorted(SHARED))
def test_shared_graded_noise_is_still_found(name: str) -> None:
    """Arms that are functions of one draw per index are called shared in at least 90% of
    200 seeds (observed 99–100%); a count below 170 of 200 would be more than 3 SD below 90%."""
    shape, s = SHARED[name]
    hits = _shared_count(shape, s, 200)
    assert hits >= 170, f"{name}: only {hits}/200 called shared"


def test_an_arm_that_never_varied_says_nothing_whatever_its_score() -> None:
    """A held arm at 0.9 agrees with the other arm by the other's distribution alone: not
    measured, as a 0/1 arm at 1 was already (before the fix: 0.9 against 0.1/0.9 at rate 0.5
    measured 0.29 [0.04, 0.50], shared)."""
    rng = np.random.default_rng(0)
    other = _two(rng, .5, 84).tolist()
    for held in (0.9, 0.1, 0.5, 1.0, 0.0):
        assert coupling_of([([held] * 84, other)]) == coupling_of([])
    assert coupling_of([([0.3] * 32, rng.random(32).tolist())]).estimate is None
    # left out of a pool, it no longer drags the pool's verdict
    a, b = _two(rng, .5, 32).tolist(), _two(rng, .5, 32).tolist()
    assert coupling_of([([0.9] * 32, other[:32]), (a, b)]) == coupling_of([(a, b)])


def test_scores_on_two_levels_measure_as_pass_fail() -> None:
    """A judge that says 0.1/0.9 measures exactly as one that says 0/1 on the same pairs (the
    measure maps both arms by one affine map onto [0, 1]); 0/1 keeps the closed forms
    ``p_a·p_b + (1 − p_a)(1 − p_b)`` and ``1 − |p_a − p_b|``."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        s = int(rng.integers(4, 40))
        u = rng.random(s)
        a = (u < rng.random()) * 1.0
        b = np.where(rng.random(s) < .5, (u < rng.random()) * 1.0, (rng.random(s) < .5) * 1.0)
        zero_one = coupling_of([(a.tolist(), b.tolist())])
        graded = coupling_of([((.1 + .8 * a).tolist(), (.1 + .8 * b).tolist())])
        assert graded == zero_one
        if zero_one.estimate is not None:
            pa, pb = a.mean(), b.mean()
            free, most = pa * pb + (1 - pa) * (1 - pb), 1 - abs(pa - pb)
            agree = float((a == b).mean())
            assert zero_one.estimate == pytest.approx(
                max(-1.0, min(1.0, (agree - free) / (most - free))), abs=1e-12)


def test_continuous_scores_that_pair_as_closely_as_they_can_measure_one() -> None:
    """The most two graded samples allow is their sorted pairing: arms monotone in one draw
    measure 1; the same samples paired at random measure about 0."""
    rng = np.random.default_rng(5)
    u = rng.random(200)
    same = coupling_of([(u.tolist(), (u ** 3).tolist())])
    assert same.estimate == pytest.approx(1.0) and same.shared
    shuffled = coupling_of([(u.tolist(), rng.permutation(u ** 3).tolist())])
    assert shuffled.estimate is not None and abs(shuffled.estimate) < 0.2
    assert not shuffled.shared


def _graded(desk: syn.PlantedDesk) -> Callable[[car.Trajectory, np.random.Generator], float]:
    """The desk's judge saying 0.9 for a failure and 0.1 otherwise (the trial's judge)."""
    def judge(run: car.Trajectory, rng: np.random.Generator) -> float:
        return 0.1 + 0.8 * desk.judge(run, rng)
    return judge


def test_a_graded_judge_is_measured_from_its_pairs_through_the_engine() -> None:
    """Twins of a 0.1/0.9 judge's branches: on CAR's noise a twin repeats its branch (measured
    1, shared); on the desk's own noise the pairs are independent and not called shared (a
    2.5% chance, fixed by the desk's seed)."""
    for level, shared in (("full", True), ("none", False)):
        desk = syn.PlantedDesk(4, at=2, rescue=0.5, flip=0.1, coupling=level)
        run = car.record(desk.agent(), context=None, outcome=_graded(desk), seed=0)
        dist = car.intervene(run, desk.agent(), car.do_resample(2), outcome=_graded(desk),
                             rollouts=16, twins=16, progress=False)
        assert dist.coupled is shared and dist.coupling_pairs == 16
        if shared:
            assert dist.coupling_measured == 1.0


def test_a_graded_judge_on_independent_arms_is_compared_unpaired() -> None:
    """The trial, planted: a 0.1/0.9 judge on an agent that ignores CAR's noise is compared
    unpaired. Its confirmation had the anytime test only (pairs of ±0.8 are no sign test's),
    and the method says so, where it said "exact sign test at the end"; a 0/1 judge keeps the
    exact sign test's words."""
    desk = syn.PlantedDesk(4, at=2, rescue=0.5, flip=0.1, coupling="none")
    run = desk.failing_run()
    free = car.contrastive(run, desk.agent(), outcome=_graded(desk), rollouts=32)
    assert free.coupling_pairs > 0 and not free.coupled
    text = free.explain()
    assert "coupling: unpaired: " in text and "exact sign test at the end" not in text
    assert "unpaired betting test, anytime only (graded scores get no exact sign test)" in text
    assert free.to_dict()["correction"].endswith(
        "anytime test only (graded scores: no exact sign test at the end)")
    passfail = car.contrastive(run, desk.agent(), outcome=desk.judge, rollouts=32)
    assert "betting test with an exact sign test at the end" in passfail.explain()
