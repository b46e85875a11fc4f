"""The planted desks the estimator benchmark runs have the rescue and the coupling they claim,
so the benchmark's ground truth cannot drift from its agents
(car_core.testing.synthetic.PlantedDesk),
and the benchmark's oracle computes the power of the test it names (benchmarks/oracle.py)."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom, fisher_exact

import car_core as car
from car_core.errors import InvalidInput
from car_core.testing import synthetic as syn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from oracle import fisher_power, locating_power, paired_power, scan_power  # noqa: E402

ROLLOUTS = 800


def _tolerance(p: float, rollouts: int = ROLLOUTS) -> float:
    # a mean of ``rollouts`` Bernoulli(p) outcomes has SD sqrt(p(1 − p)/rollouts); 4.5 SD is
    # missed by chance with probability < 1e-5 per check (a floor of 1/rollouts where p ≈ 0)
    return max(4.5 * math.sqrt(p * (1 - p) / rollouts), 1 / rollouts)


def _arm(desk: syn.PlantedDesk, run: car.Trajectory, j: int, seed: int = 0):
    do = car.do_resample(j) if j < desk.n_steps else []
    return car.intervene(run, desk.agent(), do, outcome=desk.judge, rollouts=ROLLOUTS,
                         seed=seed)


@pytest.mark.parametrize("coupling", syn.COUPLINGS)
def test_desk_arms_have_their_analytic_failure_rates(coupling):
    desk = syn.PlantedDesk(n_steps=4, at=2, rescue=0.3, flip=0.1, coupling=coupling, seed=3)
    run = desk.failing_run()
    assert run.failed and run.steps[2].action["decision"] == "deny"
    # H_j = (1 − 2·0.1)(1 − 0.3) + 0.1 = 0.66 up to the pivot, 1 − 0.1 = 0.9 after it
    assert desk.arm(0) == pytest.approx(0.66) and desk.arm(3) == pytest.approx(0.9)
    for j in (0, 2, 3, 4):
        dist = _arm(desk, run, j)
        assert abs(dist.mean - desk.arm(j)) <= _tolerance(desk.arm(j)), (j, dist.mean)


@pytest.mark.parametrize("coupling", syn.COUPLINGS)
def test_desk_pivot_and_judge_draw_their_planted_rates(coupling):
    # the arms above are checked through the engine at 800 rollouts (a 0.07 tolerance); the two
    # draws the rescue is made of are checked here, called directly, to a 0.015 one
    desk = syn.PlantedDesk(n_steps=4, at=2, rescue=0.3, flip=0.1, coupling=coupling, seed=5)
    run = desk.failing_run()
    calls = 20_000
    rng = np.random.default_rng(0)
    history = run.history(2)
    approve = np.mean([desk.policy(history, rng)["decision"] == "approve" for _ in range(calls)])
    errs = np.mean([desk.judge(run, rng) == 0.0 for _ in range(calls)])  # the run denied
    assert abs(approve - 0.3) <= _tolerance(0.3, calls)
    assert abs(errs - 0.1) <= _tolerance(0.1, calls)


def test_desk_rescue_sits_at_the_pivot_only():
    desk = syn.PlantedDesk(n_steps=8, at=5, rescue=0.5, flip=0.1)
    assert desk.locus == 5
    assert desk.effect(5) == pytest.approx(0.8 * 0.5)
    assert all(desk.effect(k) == 0 for k in range(8) if k != 5)
    assert syn.PlantedDesk(n_steps=8, at=5, rescue=0.0, flip=0.5).locus is None


def _twice(coupling: str, flip: float) -> tuple[list[str], list[str], list[float], list[float]]:
    """The pivot's decision and the outcome at each rollout of one arm run twice, same seed."""
    desk = syn.PlantedDesk(n_steps=4, at=2, rescue=0.5, flip=flip, coupling=coupling, seed=1)
    run = desk.failing_run()
    a, b = (_arm(desk, run, 2) for _ in range(2))
    decisions = [[t.steps[2].action["decision"] for t in d.trajectories] for d in (a, b)]
    outcomes = [[t.outcome.value for t in d.trajectories] for d in (a, b)]
    return decisions[0], decisions[1], outcomes[0], outcomes[1]


def test_full_coupling_shares_every_draw():
    d1, d2, y1, y2 = _twice("full", flip=0.2)
    assert d1 == d2 and y1 == y2


def test_steps_coupling_shares_the_steps_but_not_the_judge():
    d1, d2, y1, y2 = _twice("steps", flip=0.2)
    assert d1 == d2
    # same decision, independent judges: they disagree w.p. 2·0.2·0.8 = 0.32 a rollout
    split = float(np.mean(np.array(y1) != np.array(y2)))
    assert abs(split - 0.32) <= _tolerance(0.32)


def test_no_coupling_shares_nothing():
    d1, d2, _, _ = _twice("none", flip=0.0)
    # independent decisions that approve w.p. 0.5 differ w.p. 2·0.5·0.5 = 0.5 a rollout
    split = float(np.mean(np.array(d1) != np.array(d2)))
    assert abs(split - 0.5) <= _tolerance(0.5)


def test_desk_refuses_what_it_cannot_plant():
    with pytest.raises(InvalidInput):
        syn.PlantedDesk(n_steps=4, at=4, rescue=0.3)
    with pytest.raises(InvalidInput):
        syn.PlantedDesk(n_steps=4, at=2, rescue=0.3, coupling="half")


def test_fisher_power_is_the_rejection_mass_of_the_fisher_test():
    # exact enumeration of every 2x2 table at 7 rollouts an arm, scipy's test as the referee
    n, p_hi, p_lo, alpha = 7, 0.9, 0.4, 0.05
    mass = sum(binom.pmf(a, n, p_hi) * binom.pmf(b, n, p_lo)
               for a, b in itertools.product(range(n + 1), repeat=2)
               if fisher_exact([[a, n - a], [b, n - b]], alternative="greater")[1] <= alpha)
    assert fisher_power(n, p_hi, p_lo, alpha) == pytest.approx(mass, abs=1e-12)


def test_paired_power_is_the_rejection_mass_of_the_sign_test():
    # enumerate (up, down, tie) counts of 9 pairs; the one-sided sign test on the split pairs
    n, up, down, alpha = 9, 0.5, 0.1, 0.05
    mass = 0.0
    for u in range(n + 1):
        for d in range(n + 1 - u):
            weight = (math.comb(n, u) * math.comb(n - u, d) * up ** u * down ** d
                      * (1 - up - down) ** (n - u - d))
            if u + d and binom.sf(u - 1, u + d, 0.5) <= alpha:
                mass += weight
    assert paired_power(n, up, down, alpha) == pytest.approx(mass, abs=1e-12)


@pytest.mark.parametrize("rule", ["bonferroni", "sequence"])
def test_scan_power_is_the_mass_of_the_rule_naming_the_pivot(rule):
    # enumerate every count of a 4-arm scan (3 rollouts an arm, 5 held), pivot at step 2;
    # scipy's Fisher test is the referee and the rule is applied as its docstring states it
    n, at, m, m0, alpha = 4, 2, 3, 5, 0.3
    q_before, q_after = 0.3, 0.9
    mass = 0.0
    for x0 in range(m0 + 1):
        for xs in itertools.product(range(m + 1), repeat=n):
            weight = binom.pmf(x0, m0, q_after) * math.prod(
                binom.pmf(x, m, q_before if j <= at else q_after) for j, x in enumerate(xs))
            p = [fisher_exact([[x0, m0 - x0], [x, m - x]], alternative="greater")[1]
                 for x in xs]
            if rule == "bonferroni":
                rejected = [j for j in range(n) if p[j] <= alpha / n]
                named = rejected[-1] if rejected else None
            else:
                kept = [j for j in range(n) if p[j] > alpha]
                first_kept = kept[0] if kept else n
                named = first_kept - 1 if first_kept else None
            mass += weight * (named == at)
    assert scan_power(n, at, m, m0, q_before, q_after, alpha, rule) == pytest.approx(
        mass, abs=1e-12)


def test_locating_designs_name_a_step_without_rescue_at_most_alpha():
    # no rescue anywhere: every step named is a false one; the pivot's is one of them
    for rule in ("bonferroni", "sequence"):
        false_at_pivot = scan_power(8, 5, 20, 60, 0.9, 0.9, 0.05, rule)
        assert false_at_pivot <= 0.05
    power, design = locating_power("none", 8, 256, 0.0, 0.1, 0.05)
    assert power <= 0.05 and design


def test_locating_power_lies_below_the_oracle_that_knows_the_pivot():
    from oracle import matched_power
    for coupling in syn.COUPLINGS:
        for rescue, flip in ((0.15, 0.0), (0.3, 0.1), (0.5, 0.1)):
            located, _ = locating_power(coupling, 8, 256, rescue, flip, 0.05)
            assert located <= matched_power(coupling, 256, rescue, flip, 0.05) + 1e-12


def test_full_coupling_makes_arms_up_to_the_pivot_alike_and_later_ones_the_held_arm():
    # what the paired fixed-sequence design of locating_power rests on
    desk = syn.PlantedDesk(n_steps=4, at=2, rescue=0.5, flip=0.2, coupling="full", seed=2)
    run = desk.failing_run()
    def outcomes(j):
        do = car.do_resample(j) if j < desk.n_steps else []
        dist = car.intervene(run, desk.agent(), do, outcome=desk.judge, rollouts=200, seed=7)
        return [t.outcome.value for t in dist.trajectories]
    before, at, after, held = outcomes(0), outcomes(2), outcomes(3), outcomes(4)
    assert before == at and after == held and at != held
