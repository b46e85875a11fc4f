"""Planted worlds where two steps matter (car_core.testing.synthetic.and_pair): the analytic arms
and
rescues, and per-step estimates whose intervals cover them when every step is tested."""

from __future__ import annotations

import math

import pytest

import car_core as car
from car_core.errors import InvalidInput
from car_core.testing import synthetic as syn

# (p_a, p_b): the later rescue 1 − p_b smaller than, equal to and larger than the earlier
# p_b·(1 − p_a), with a = 3 and b = 6 of 8 steps
WORLDS = {"later smaller": (0.5, 0.75), "equal": (0.5, 2 / 3), "later larger": (0.5, 0.5)}


@pytest.mark.parametrize("p_a,p_b", WORLDS.values(), ids=WORLDS.keys())
@pytest.mark.parametrize("flip", [0.0, 0.1])
def test_and_pair_arms_and_rescues_have_their_closed_forms(p_a, p_b, flip):
    m = syn.and_pair(8, 3, 6, p_a, p_b, flip)
    g = 1 - 2 * flip
    for j in range(9):
        p = p_a * p_b if j <= 3 else p_b if j <= 6 else 1.0
        assert m.arm(j) == pytest.approx(g * p + flip)
    rescue = {3: g * p_b * (1 - p_a), 6: g * (1 - p_b)}
    for k in range(8):
        assert m.rescue(k) == pytest.approx(rescue.get(k, 0.0), abs=1e-12)
    assert m.locus == 6
    assert sum(m.rescue(k) for k in range(8)) == pytest.approx(m.arm(8) - m.arm(0))


def test_the_issues_example_puts_the_larger_rescue_earlier():
    m = syn.and_pair()  # a = 3, b = 6, p_a = 0.5, p_b = 0.75
    assert (m.rescue(3), m.rescue(6)) == pytest.approx((0.375, 0.25))


def test_and_pair_refuses_what_it_cannot_plant():
    for kwargs in ({"a": 6, "b": 3}, {"b": 8}, {"p_a": 1.0}, {"p_b": 0.0}, {"flip": 0.5}):
        with pytest.raises(InvalidInput):
            syn.and_pair(**kwargs)


@pytest.mark.parametrize("p_a,p_b", WORLDS.values(), ids=WORLDS.keys())
def test_every_step_tested_covers_both_analytic_rescues(p_a, p_b):
    """search="full" tests every step with Bonferroni over the steps and the looks: all
    intervals cover their rescues at once with probability ≥ 1 − α, so over 6 seeds the two
    causal steps' intervals miss in at most 1 (P(≥ 2 seeds miss) ≤ C(6,2)·0.05² ≈ 0.04 at
    the guarantee; they are conservative). The estimate lies inside its interval and is a
    difference of two means of ``n`` rollouts each (a test stops at a look of 21, 42 or 85
    rollouts an arm: K' = 8·96/9), whose SD is at most sqrt(0.5/n) whether paired or not:
    it is asked to be within 4.5 SD of the truth."""
    m = syn.and_pair(8, 3, 6, p_a, p_b)
    missed = 0
    for seed in range(6):
        run = m.failing_run(seed)
        res = car.contrastive(run, m.agent(), outcome=m.outcome, rollouts=96, seed=seed,
                              search="full", progress=False)
        assert res.rollouts_used <= res.rollout_budget == 8 * 96
        for k in (3, 6):
            step = res.steps[k]
            assert step.tested and step.effect is not None and step.ci is not None
            low, high = step.ci.low, step.ci.high
            assert low <= step.effect <= high
            assert step.n >= 21
            assert abs(step.effect - m.rescue(k)) <= 4.5 * math.sqrt(0.5 / step.n)
            missed += not low <= m.rescue(k) <= high
    assert missed <= 1


def test_arms_through_the_engine_give_both_rescues():
    """The rescues as differences of arms run with car.intervene (H_j = do_resample(j)),
    800 rollouts an arm: each arm's mean has SD ≤ sqrt(p(1 − p)/800) ≤ 0.0177, a difference
    of two at most 0.025 (shared noise only shrinks it), so 4.5 SD is 0.113."""
    m = syn.and_pair()
    run = m.failing_run(0)
    means = {j: car.intervene(run, m.agent(), car.do_resample(j), outcome=m.outcome,
                              rollouts=800, seed=1).mean for j in (3, 4, 6, 7)}
    assert abs((means[4] - means[3]) - m.rescue(3)) <= 0.113
    assert abs((means[7] - means[6]) - m.rescue(6)) <= 0.113


def _latest_claims(model, n, k, coupling, seeds):
    """The search on the simulator's arms of ``model`` (n·k rollouts a seed): per seed the
    named step, the steps left open after it, and the earlier causes listed."""
    from car_core.estimators.search import search
    out = []
    for s in range(seeds):
        d = search(syn.SampledArms(model, s, n * k, coupling), n, n * k, 0.05, k=k)
        named = d.candidate if d.significant else None
        open_after = d.later.open_steps if d.later is not None else ()
        out.append((named, open_after, d.earlier))
    return out


@pytest.mark.parametrize("p_a,p_b", WORLDS.values(), ids=WORLDS.keys())
@pytest.mark.parametrize("coupling", ["full", "none"])
def test_a_step_before_the_latest_cause_is_named_only_with_the_later_one_said_open(
        p_a, p_b, coupling):
    """Step 6 is the latest step whose rescue (0.25, 1/3, 0.5) is at least Δ = 0.1. Naming
    another step without saying step 6 was not ruled out is a false claim, made with
    probability ≤ α = 0.05: over 40 seeds at most 5 (P(Bin(40, 0.05) ≥ 6) ≈ 0.014). Before
    the later-steps check, step 3 was named, silently, in 36–64% of seeds."""
    m = syn.and_pair(8, 3, 6, p_a, p_b)
    claims = _latest_claims(m, 8, 96, coupling, 40)
    wrong = sum(named is not None and named != 6 and 6 not in open_after
                for named, open_after, _ in claims)
    assert wrong <= 5
    assert sum(named == 6 for named, _, _ in claims) >= 30  # and it is found, at this budget


def test_the_earlier_cause_is_listed_with_an_interval_covering_its_rescue():
    """When step 6 is named after step 3 was confirmed first, step 3 is listed with the
    confidence sequence of its confirmation (level 1 − α): it covers rescue(3) = 0.375 in all
    but ≤ α of such seeds (at most 3 of the ≥ 15 here: P(Bin(40, 0.05) ≥ 4) ≈ 0.14 bounds it
    loosely; the sequence is conservative)."""
    m = syn.and_pair()
    listed = [e for named, _, earlier in _latest_claims(m, 8, 96, "full", 40)
              for e in earlier if named == 6]
    assert len(listed) >= 15
    assert all(e.candidate == 3 and e.significant for e in listed)
    missed = sum(not e.interval.ci[0] <= m.rescue(3) <= e.interval.ci[1] for e in listed)
    assert missed <= 3


def test_a_cause_followed_by_steps_that_change_nothing_rules_them_out():
    """One rise at step 2 of 8, every later step a no-op: the later steps' pairs are all zero,
    so each is ruled out at Δ after about 64 of them; at 96 rollouts a step that fits the
    budget, the pivot is named and nothing after it is left open in most seeds, and a later
    step is never named."""
    m = syn.pivot(n_steps=8, at=2, p_bad=0.5)
    claims = _latest_claims(m, 8, 96, "full", 30)
    assert all(named == 2 for named, _, _ in claims)
    assert sum(not open_after for _, open_after, _ in claims) >= 27


def _ruled_out_at(m, c, n, seeds, coupling, budget=4000):
    """How often the later stage alone (from a confirmed step ``c``) rules out each step."""
    from car_core.estimators.later import check_later
    counts: dict[int, int] = {}
    for s in range(seeds):
        check = check_later(syn.SampledArms(m, s, budget, coupling), c, n, 0.05, reserve=0.0)
        for k in check.ruled_out:
            counts[k] = counts.get(k, 0) + 1
    return counts


@pytest.mark.parametrize("coupling", ["full", "none"])
def test_a_later_step_at_the_indifference_level_is_ruled_out_rarely(coupling):
    """Step 6 rescues exactly Δ = 0.1 (H_6 fails w.p. 0.9, H_7 always): the one-arm test
    (H_6 alone, its failure rate a bound on 1 − rescue) and the pairs together must rule it
    out with probability ≤ ℓ_out (0.0375: three quarters of α, all of which the stage has
    after a first confirmation): over 400 seeds the expected count is ≤ 15, and
    P(Bin(400, 0.0375) ≥ 30) ≈ 0.0003. The steps after it (rescue 0) are ruled out in every
    seed that reaches them."""
    m = syn.and_pair(8, 3, 6, 0.5, 0.9)
    assert m.rescue(6) == pytest.approx(0.1)
    counts = _ruled_out_at(m, 3, 8, 400, coupling)
    assert counts.get(6, 0) <= 29
    assert counts.get(7, 0) == 400


def _false_answer(m: syn.SyntheticSCM, d) -> bool:
    """The answer says something untrue: the step named rescues nothing, or a step after it
    that rescues ``Δ`` or more is said ruled out."""
    if not d.significant:
        return False
    return m.rescue(d.candidate) <= 1e-12 or (
        d.later is not None and any(m.rescue(j) >= 0.1 - 1e-12 for j in d.later.ruled_out))


@pytest.mark.parametrize("coupling", ["full", "none"])
def test_through_the_search_a_later_step_at_the_indifference_level_is_ruled_out_rarely(
        coupling):
    """As above, through the whole search: the one-arm test of H_6 then starts from the
    navigation's rollouts of it, drawn at indices where other arms ran first (with shared
    noise, correlated with them) and chosen by what the navigation saw. Naming step 3 with
    step 6 ruled out must still happen in at most ℓ_out of seeds (≤ 29 of 400, as above;
    measured at 400 seeds a coupling, 2,000 seeds gave 2.65% shared and 3.4% not). The
    answer as a whole — any step named that rescues nothing, or step 6 ruled out — is false
    in at most α of seeds (2,000 seeds: 2.65% and 3.5%): the stage runs at all of α after a
    first confirmation, the confirmation at 0.63α, and in this world only the stage can make
    a step-3 answer false (P(Bin(400, 0.05) ≥ 35) ≈ 0.0011)."""
    from car_core.estimators.search import search
    m = syn.and_pair(8, 3, 6, 0.5, 0.9)
    wrong = false = 0
    for s in range(400):
        d = search(syn.SampledArms(m, s, 8 * 32, coupling), 8, 8 * 32, 0.05, k=32,
                   refit=False, intervals=False)
        wrong += d.later is not None and 6 in d.later.ruled_out
        false += _false_answer(m, d)
    assert wrong <= 29
    assert false <= 34


def test_the_stage_after_a_first_confirmation_has_all_of_alpha():
    """The answer is a conjunction, and in any world at most one of its parts can be the
    false one that matters (docs/contrastive-search.md, intersection-union): the stage after
    the first confirmation tests at all of α, three quarters ruling out, the rest over the
    steps that could be a later cause; after a second, what the first left."""
    from car_core.estimators.confirmation import FIRST_SHARE
    from car_core.estimators.later import levels
    assert levels(0.05, 8, 1, 3) == pytest.approx((0.0375, 0.0125 / 4))
    assert levels(0.05, 8, 2, 3)[0] == pytest.approx(0.75 * (1 - 0.9 * FIRST_SHARE) * 0.05)


def test_certain_failure_after_the_cause_is_ruled_out_without_pairs():
    """No shared noise, failure certain after the cause at step 2: each later step is ruled
    out on H_j's own rollouts, with no rollout of H_{j+1} (H_8 is never run), in exactly the
    rollouts the all-fail betting test needs (read off ``below_now``), a look planned to end
    there; the pair test would need as many pairs and draw H_8 besides."""
    from car_core.estimators.later import check_later, levels
    from car_core.stats.sequential import below_now
    need = next(m for m in range(1, 500)
                if below_now([0.0] * m, 0.1, levels(0.05, 8, 1, 2)[0]))
    m = syn.pivot(n_steps=8, at=2, p_bad=0.5)
    for seed in range(5):
        src = syn.SampledArms(m, seed, 4000, "none")
        check = check_later(src, 2, 8, 0.05, reserve=0.0)
        assert check.ruled_out == (3, 4, 5, 6, 7) and not check.open_steps
        assert all(s.pairs == 0 and s.rollouts == need for s in check.steps)
        assert 4000 - src.remaining == 5 * need


def test_rollouts_the_search_ran_count_towards_ruling_out():
    """The confirmation's rollouts of H_{c+1} (and the navigation's of any later arm) start
    its one-arm test: through the search, ruling out the five steps after the cause costs
    fewer new rollouts than five tests from nothing."""
    from car_core.estimators.later import levels
    from car_core.estimators.search import search
    from car_core.stats.sequential import below_now
    need = next(m for m in range(1, 500)
                if below_now([0.0] * m, 0.1, levels(0.05, 8, 1, 2)[0]))
    m = syn.pivot(n_steps=8, at=2, p_bad=0.5)
    for seed in range(10):
        d = search(syn.SampledArms(m, seed, 8 * 96, "none"), 8, 8 * 96, 0.05, k=96,
                   refit=False)
        assert d.candidate == 2 and d.significant and d.later is not None
        assert d.later.ruled_out == (3, 4, 5, 6, 7)
        assert d.decided_spent - d.located_spent < 5 * need
