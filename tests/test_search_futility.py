"""A level candidate is given up whatever the budget: the futility bound of the contrastive
search (car_core.estimators.search), on the simulator the estimator grid runs
(synthetic.SampledArms, the grid's desks: pivot at step ⌊2n/3⌋, K = 32)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from car_core.estimators import confirmation
from car_core.estimators import search as search_mod
from car_core.testing import synthetic as syn

K = 32

# (n, rescue, judge error, coupling, seed): each ended undecided on a candidate whose rescue is
# 0, its whole budget spent, at n·K, 8·n·K and 32·n·K alike (measured before the fix). Seed 21
# of the first row: the gate stopped after 4 pairs, one probe copied H_0 at the four witness
# indices by chance, the noise was taken for shared on those 4 pairs (which switched the locus
# posterior's futility check off), and step 12 was weighed only against the budget's least
# rise, which shrinks as the budget grows.
NEVER_DECIDED = [
    (24, 0.3, 0.0, "none", 21),
    (24, 0.3, 0.1, "steps", 40),
    (24, 0.15, 0.1, "steps", 40),
    (24, 0.15, 0.1, "steps", 42),
    (24, 0.15, 0.1, "steps", 87),
    (8, 0.5, 0.1, "steps", 69),
    (8, 0.3, 0.1, "steps", 69),
    (8, 0.15, 0.1, "steps", 69),
]


def _search(n: int, rescue: float, flip: float, coupling: str, seed: int, budget: int
            ) -> search_mod.Decision:
    model = syn.pivot(n, (2 * n) // 3, 1 - rescue, flip)
    return search_mod.search(syn.SampledArms(model, seed, budget, coupling), n, budget, 0.05,
                             intervals=False, k=K)


def test_level_pairs_are_given_up_at_any_budget():
    """Two arms with no shared noise and one failure rate p give pairs up and down w.p.
    p(1 − p) ≤ 1/4 each. Weighed against the budget's least rise alone (log2(1/(0.9·α))
    over the pairs the budget buys: 0.0004 at 24·32·32 rollouts), 700 such pairs fit a rise
    nearly as well as none and are kept; against a least rise that never falls below
    LEAST_RISE = 0.1 they fit no rise more than 1000 times better (≈ 690 pairs suffice at
    q = 1/4, fewer at smaller q), at every budget."""
    alpha = 0.04
    gate = (0.45, 0.09)  # a gate of 4 pairs stopped at its first net rise (seed 21's)
    level = np.array([1.0] * 175 + [-1.0] * 175 + [0.0] * 350)
    for budget in (768, 24 * 32 * 32, 10**7):
        least = confirmation.futility_rise(budget, alpha)
        assert least >= confirmation.LEAST_RISE
        assert confirmation.futility_llr(level, gate, least, guessed=True) <= -math.log(
            confirmation.FUTILITY)
    shrinking = confirmation.least_rise(24 * 32 * 32, alpha)
    assert shrinking < 0.001
    assert confirmation.futility_llr(level, gate, shrinking, guessed=True) > -1.0


def test_the_never_deciding_seed_gives_its_level_candidate_up_within_the_grid_budget():
    """The issue's seed at the grid's own budget n·K = 768: step 12 (rescue 0) is given up and
    the pivot at 16 confirmed with at most half of the budget spent (before: all 768, step 12
    undecided), before the steps after it are checked. Navigation's chance coupling on 4 pairs
    no longer switches the posterior check off: the confirmation's own pairs are in the
    coupling it is weighed by."""
    d = _search(24, 0.3, 0.0, "none", 21, 24 * K)
    assert d.given_up == (12,)
    assert d.significant and d.candidate == 16
    assert d.located_spent <= 24 * K // 2


@pytest.mark.parametrize("n,rescue,flip,coupling,seed", NEVER_DECIDED)
def test_a_level_candidate_no_longer_keeps_the_whole_budget(n, rescue, flip, coupling, seed):
    """Before, each of these seeds spent its whole budget on a level candidate at any size.
    Now a level confirmation ends within a number of pairs that does not grow with the budget
    (≈ 690 pairs, 1,380 rollouts, at most: the test above), and these seeds give up at most
    two candidates, so at 32·n·K the answer is decided with a small fraction of it spent: at
    most an eighth (4·n·K: 3,072 rollouts at 24 steps, 1,024 at 8), the same answer and spend
    at 8·n·K (nothing in it depends on the budget any more), and the pivot is named. (Spent
    when the pivot was confirmed: ruling the later steps out comes after, on rollouts of its
    own, and ends by its own test.)"""
    big = _search(n, rescue, flip, coupling, seed, 32 * n * K)
    assert big.significant and big.candidate == (2 * n) // 3
    assert len(big.given_up) <= 2
    assert big.located_spent <= 32 * n * K // 8
    mid = _search(n, rescue, flip, coupling, seed, 8 * n * K)
    assert (mid.candidate, mid.significant, mid.located_spent) == (
        big.candidate, big.significant, big.located_spent)


@pytest.mark.parametrize("seed", [16, 887])
def test_a_confirmation_that_drags_on_probes_the_other_arms_and_gives_a_level_step_up(seed):
    """8 steps, rescue 0.15, no shared noise, at n·128: without the probes (``DRAG`` infinite)
    these seeds confirm a level step (0, then 4) whose pairs rise by chance to the end of the
    budget, 98% and 96% of it, undecided (the two such seeds of 1,200): the
    locus posterior saw the other arms too thinly to say the rise was elsewhere. Past twice
    the pairs the navigation's rise needs, the confirmation now probes the other arms; the
    posterior gives the level step up and the pivot at step 5 is confirmed."""
    n, k = 8, 128
    model = syn.pivot(n, 5, 0.85, 0.0)
    d = search_mod.search(syn.SampledArms(model, seed, n * k, "none"), n, n * k, 0.05,
                          intervals=False, refit=False)
    assert d.significant and d.candidate == 5
    level = [c for c in d.given_up if model.rescue(c) == 0]
    assert level == list(d.given_up) and len(level) == 1
    spent_on_level = sum(2 * pairs for c, pairs in d.attempts if c in level)
    assert spent_on_level < 0.6 * n * k


def test_a_candidate_the_budget_left_could_not_confirm_is_given_up():
    """``beyond_budget``: pairs that go up and down alike (a step that rescues nothing, on a
    judge's noise) are given up when the budget left could only show a rise they fit four
    times worse than none; pairs that only go up never are; and with a budget large enough
    to show a very small rise the same level pairs are kept (the fixed ``FUTILITY`` bound
    decides there)."""
    level = np.array([1.0] * 25 + [-1.0] * 25 + [0.0] * 50)
    rising = np.array([1.0] * 20 + [0.0] * 80)
    alpha = 0.05 * confirmation.share(0)
    assert confirmation.beyond_budget(level, 10, alpha)
    assert not confirmation.beyond_budget(rising, 10, alpha)
    assert not confirmation.beyond_budget(rising, 0, alpha)
    assert not confirmation.beyond_budget(level, 10**6, alpha)


def test_few_seeds_end_their_budget_confirming_a_step_that_rescues_nothing():
    """The 4-step one-rise world at a rescue of 0.3 and the default budget (4·32): before the
    budget-aware bound, 8 of 200 seeds ran out while confirming a step with no rescue (the
    fixed bound needs hundreds of noisy pairs to give one up); now at most 2 do, and the
    latest rise is named as often (182 of 200 before)."""
    n = 4
    model = syn.pivot(n, (2 * n) // 3, 0.7, 0.0)
    level_end = named = 0
    for seed in range(200):
        d = search_mod.search(syn.SampledArms(model, seed, n * K, "none"), n, n * K, 0.05,
                              intervals=False, refit=False)
        level_end += d.exhausted and d.candidate is not None and model.rescue(d.candidate) == 0
        named += d.significant and d.candidate == (2 * n) // 3
    assert level_end <= 2
    assert named >= 180


def test_an_unconfirmed_candidates_interval_is_at_its_own_tests_level():
    """An undecided candidate's interval was built at α while its test ran at its share
    ``α_i``: it could lie above zero beside "not shown to help" (a trial read +0.214 [+0.001,
    +0.504] so; the simulator's 8-step pivot at a budget of 96 gave [+0.011, +0.644] at 95%
    for a test at 3.5%). Now the interval is at ``1 − α_i`` (this seed's candidate is left
    unconfirmed at 4.5%), and over 100 seeds of four small worlds no unconfirmed candidate's
    interval lies above zero."""
    world = syn.pivot(8, 5, 0.85, 0.0)
    d = search_mod.search(syn.SampledArms(world, 137, 96, "none"), 8, 96, 0.05, refit=False)
    assert not d.significant and d.interval is not None and d.level is not None
    assert d.interval.level == pytest.approx(1 - d.level) and d.interval.ci[0] <= 0
    unconfirmed = 0
    for n, p, budget in ((4, 0.7, 40), (4, 0.8, 64), (8, 0.85, 96), (6, 0.6, 30)):
        m = syn.pivot(n, (2 * n) // 3, p, 0.0)
        for seed in range(100):
            d = search_mod.search(syn.SampledArms(m, seed, budget, "none"), n, budget, 0.05,
                                  refit=False)
            if d.candidate is not None and d.interval is not None and not d.significant:
                unconfirmed += 1
                assert d.interval.ci[0] <= 0, (n, p, budget, seed)
    assert unconfirmed > 150  # the check saw many
