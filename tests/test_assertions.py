"""``car.assert_locus``, ``car.assert_no_locus`` and ``car.assert_rescues``: what they accept,
what their messages show, and that over many seeds they pass and fail at their stated rates on
synthetic SCMs whose answer is known analytically."""

from __future__ import annotations

import pytest
from scipy.stats import binom

import car_core as car
from car_core.errors import InvalidInput
from car_core.stats import wilson
from car_core.testing import synthetic

ALPHA = 0.05
SEEDS = 200


def _within(count: int, trials: int, rate: float) -> tuple[int, int]:
    """The central 99.9% range of Binomial(trials, rate): a count outside it contradicts the
    rate (a test using it wrongly fails about once in a thousand runs)."""
    return int(binom.ppf(0.0005, trials, rate)), int(binom.ppf(0.9995, trials, rate))


def _raises(fn: object, *args: object, **kwargs: object) -> bool:
    try:
        fn(*args, **kwargs)  # type: ignore[operator]
    except AssertionError:
        return True
    return False


@pytest.fixture(scope="module")
def noisy_pivot_results() -> tuple[synthetic.SyntheticSCM, list[car.ContrastiveResult]]:
    """Contrastive attributions of one failed run of a noisy pivot at step 1 (steps 2 and 3
    copy it, so their rescue is exactly 0), one per seed."""
    scm = synthetic.noisy_pivot(n_steps=4, at=1, p_bad=0.3, flip=0.1)
    run = scm.failing_run(seed=0)
    return scm, [car.contrastive(run, scm.agent(), outcome=scm.outcome, rollouts=16, seed=s,
                                 alpha=ALPHA) for s in range(SEEDS)]


def test_assert_locus_passes_on_a_step_without_effect_at_most_alpha(noisy_pivot_results):
    scm, results = noisy_pivot_results
    assert scm.locus == 1 and scm.rescue(2) == 0.0 and scm.rescue(3) == 0.0
    # step 2 has no effect and nothing after it does: passing there is a false positive, which
    # the Bonferroni correction keeps at <= alpha per attribution
    wrong = sum(not _raises(car.assert_locus, r, step=2) for r in results)
    assert wrong <= binom.ppf(0.9995, SEEDS, ALPHA)


def test_assert_locus_fails_on_the_true_locus_only_by_a_miss_or_a_later_false_positive(
        noisy_pivot_results):
    scm, results = noisy_pivot_results
    failed = [r for r in results if _raises(car.assert_locus, r, step=scm.locus)]
    later = sum(r.locus is not None and r.locus > scm.locus for r in failed)
    assert later <= binom.ppf(0.9995, SEEDS, ALPHA)  # false positives after the truth
    # the rest are misses (power): rescue 0.9 - 0.3*0.8 - 0.1 = 0.66 with 16 rollouts an arm
    # is detected far more often than not; a floor, not an analytic value
    assert len(failed) < SEEDS / 2


def test_assert_no_locus_fails_where_no_step_matters_at_most_alpha():
    scm = synthetic.no_cause(n_steps=4, base_rate=0.5)
    assert scm.locus is None
    run = scm.failing_run(seed=0)
    fails = sum(_raises(car.assert_no_locus, car.contrastive(
        run, scm.agent(), outcome=scm.outcome, rollouts=16, seed=s, alpha=ALPHA))
        for s in range(SEEDS))
    assert fails <= binom.ppf(0.9995, SEEDS, ALPHA)


def test_assert_no_locus_fails_on_a_planted_cause(noisy_pivot_results):
    _, results = noisy_pivot_results
    fails = [r for r in results if _raises(car.assert_no_locus, r)]
    assert all(r.locus is not None for r in fails)  # only when an interval says so
    assert len(fails) > SEEDS / 2


def _exact_rate(n: int, p: float, below: float, strict: bool) -> float:
    """P(assert_rescues fails) for Binomial(n, p) outcomes, from the Wilson interval at 95%."""
    def fails(k: int) -> bool:
        lo, hi = wilson(k / n, n, 0.95)
        return hi >= below if strict else lo >= below
    return float(sum(binom.pmf(k, n, p) for k in range(n + 1) if fails(k)))


def test_assert_rescues_fails_and_passes_at_the_rate_of_its_interval():
    # do_resample(1) on a pivot at step 1 re-draws the pivot: P(fail) = p_bad = 0.3 exactly,
    # the boundary below=0.3 where each mode errs most
    scm = synthetic.pivot(n_steps=3, at=1, p_bad=0.3)
    run = scm.failing_run(seed=0)
    n, trials, below = 32, 300, 0.3
    assert scm.arm(1) == pytest.approx(below)
    dists = [car.intervene(run, scm.agent(), car.do_resample(1), outcome=scm.outcome,
                           rollouts=n, seed=s) for s in range(trials)]
    lenient = sum(_raises(car.assert_rescues, d, below=below) for d in dists)
    strict_passes = sum(not _raises(car.assert_rescues, d, below=below, strict=True)
                        for d in dists)
    # the stated rates: (1 - level) / 2 = 0.025 nominally; Wilson is approximate, and the exact
    # binomial rate at this n and p is what the counts must agree with
    lenient_rate = _exact_rate(n, 0.3, below, strict=False)
    strict_rate = 1 - _exact_rate(n, 0.3, below, strict=True)
    assert 0.01 < lenient_rate < 0.04 and 0.01 < strict_rate < 0.04
    lo, hi = _within(lenient, trials, lenient_rate)
    assert lo <= lenient <= hi
    lo, hi = _within(strict_passes, trials, strict_rate)
    assert lo <= strict_passes <= hi


def test_messages_show_the_intervals():
    scm = synthetic.pivot(n_steps=3, at=1, p_bad=0.3)
    run = scm.failing_run(seed=0)
    res = car.contrastive(run, scm.agent(), outcome=scm.outcome, rollouts=16, seed=0)
    assert res.locus == 1
    with pytest.raises(AssertionError, match=r"expected the locus at step 2, got step 1") as e:
        car.assert_locus(res, step=2)
    s = res.steps[1]
    assert f"step 1: rescue {s.effect:+.3f} [{s.ci[0]:+.3f}, {s.ci[1]:+.3f}] significant" in str(
        e.value)
    with pytest.raises(AssertionError, match=r"expected no locus, but step 1"):
        car.assert_no_locus(res)
    dist = car.intervene(run, scm.agent(), car.do_action(1, {"step": 1, "choice": "bad",
                                                             "final": False}),
                         outcome=scm.outcome, rollouts=16, seed=0)
    lo, hi = dist.ci
    with pytest.raises(AssertionError, match=r"whole interval lies at or above it") as e:
        car.assert_rescues(dist, below=0.5)
    assert f"[{lo:.3f}, {hi:.3f}] at 95%, n=16" in str(e.value)
    car.assert_locus(res, step=1)
    car.assert_locus(res, agent="synthetic:pivot", run=run)
    with pytest.raises(AssertionError, match=r"decided by 'other', but step 1 was decided"):
        car.assert_locus(res, agent="other", run=run)


def test_bad_input_is_refused_with_a_typed_error():
    scm = synthetic.pivot(n_steps=3, at=1, p_bad=0.3)
    run = scm.failing_run(seed=0)
    res = car.contrastive(run, scm.agent(), outcome=scm.outcome, rollouts=8, seed=0)
    with pytest.raises(InvalidInput, match="needs step= or agent="):
        car.assert_locus(res)
    with pytest.raises(InvalidInput, match="needs run="):
        car.assert_locus(res, agent="x")
    with pytest.raises(InvalidInput, match="takes a car.contrastive result"):
        car.assert_no_locus({"locus": 1})
    dist = car.intervene(run, scm.agent(), car.do_resample(1), outcome=scm.outcome, rollouts=4)
    with pytest.raises(InvalidInput, match="below="):
        car.assert_rescues(dist, below=1.5)
    with pytest.raises(InvalidInput, match="takes a car.intervene result"):
        car.assert_rescues(res, below=0.5)
