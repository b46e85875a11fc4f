"""The information limit the benchmark holds the contrastive search to (benchmarks/oracle.py):
``T*`` for a told pivot by its closed form, and for the claim the search makes (pivot unknown,
later steps below Δ) by a concave maximisation whose dual certificate bounds its error."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from oracle import (  # noqa: E402
    Piece,
    closest,
    confidence_cost,
    kl,
    limit,
    pivot_unknown,
    told_pivot,
)

from car_core.testing import synthetic as syn  # noqa: E402

RESCUES = (0.05, 0.15, 0.3, 0.5, 0.8)
FLIPS = (0.0, 0.1, 0.25)


def one_rise(n: int, at: int, rescue: float, flip: float) -> np.ndarray:
    """The arms of a planted pivot (``synthetic.pivot``): ``H_j`` for ``j = 0 … n``."""
    model = syn.pivot(n, at, 1 - rescue, flip)
    return np.array([model.arm(j) for j in range(n + 1)])


def two_rise(n: int, p_a: float, p_b: float, flip: float) -> tuple[np.ndarray, int]:
    model = syn.and_pair(n, n // 3, (2 * n) // 3, p_a, p_b, flip)
    return np.array([model.arm(j) for j in range(n + 1)]), (2 * n) // 3


def test_kl_and_the_confidence_factor() -> None:
    assert kl(0.3, 0.3) == 0.0
    assert kl(1.0, 0.5) == pytest.approx(math.log(2))
    assert kl(0.0, 1.0) == math.inf
    # kl(δ, 1 − δ) = (1 − 2δ)·log((1 − δ)/δ); 2.65 at δ = 0.05
    assert confidence_cost(0.05) == pytest.approx(0.9 * math.log(19))


@pytest.mark.parametrize("d", [0.05, 0.2, 0.45])
def test_told_pivot_symmetric_arms_split_evenly(d: float) -> None:
    # H_c = ½ − d, H_{c+1} = ½ + d: by symmetry the arms meet at ½ with equal weights
    lim = told_pivot(np.array([0.5 - d, 0.5 + d]), 0)
    assert lim.weights == pytest.approx((0.5, 0.5))
    assert lim.rate == pytest.approx(kl(0.5 + d, 0.5), rel=1e-12)


def test_told_pivot_certain_arms() -> None:
    # H_c = 0, H_{c+1} = 1: KL(1, m) = KL(0, m) at m = ½, so 1/T* = log 2
    assert told_pivot(np.array([0.0, 1.0]), 0).rate == pytest.approx(math.log(2), rel=1e-12)


def test_told_pivot_small_rise_matches_the_gaussian_limit() -> None:
    # two Gaussian arms of variance σ² a gap ε apart: T* = 2(σ₁ + σ₂)²/ε² = 8σ²/ε² at equal σ;
    # Bernoulli KL is (x − μ)²/(2σ²) to second order, so T*·ε² → 8·0.3·0.7 as ε → 0
    eps = 1e-3
    lim = told_pivot(np.array([0.3 - eps / 2, 0.3 + eps / 2]), 0)
    assert lim.t_star * eps**2 == pytest.approx(8 * 0.21, rel=1e-2)


@pytest.mark.parametrize("rescue, flip", list(itertools.product(RESCUES, FLIPS)))
def test_the_optimiser_finds_the_closed_form(rescue: float, flip: float) -> None:
    mu = one_rise(6, 4, rescue, flip)
    closed, searched = told_pivot(mu, 4), limit(mu, [Piece(4)])
    assert searched.rate == pytest.approx(closed.rate, rel=1e-8)
    assert searched.weights == pytest.approx(closed.weights, abs=1e-4)


@pytest.mark.parametrize("rescue, flip", list(itertools.product(RESCUES, FLIPS)))
def test_no_later_step_means_no_extra_cost(rescue: float, flip: float) -> None:
    # the pivot is the last step: nothing later to rule out, the claims coincide
    mu = one_rise(5, 4, rescue, flip)
    assert pivot_unknown(mu, 4, 0.1).rate == pytest.approx(told_pivot(mu, 4).rate, rel=1e-8)


def test_ruling_out_a_rise_between_two_certain_arms() -> None:
    # H_j = H_{j+1} = 1: the cheapest rise of Δ lowers H_j to 1 − Δ (H_{j+1} cannot go up), at
    # KL(1, 1 − Δ) = −log(1 − Δ) a unit of weight on arm j and nothing from arm j + 1
    value, lo, hi = closest(np.array([1.0, 1.0]), np.array([0.3, 0.7]), Piece(0, 0.1))
    assert (lo, hi) == pytest.approx((0.9, 1.0))
    assert value == pytest.approx(-0.3 * math.log(0.9), rel=1e-9)


@pytest.mark.parametrize("mu", [(0.4, 0.9, 0.9), (0.7, 1.0, 1.0), (0.2, 0.5, 0.55)])
def test_pivot_unknown_on_three_arms_against_a_grid(mu: tuple[float, ...]) -> None:
    # every w on a 1/300 grid of the simplex: none beats the optimiser, the best comes close
    arr = np.array(mu)
    lim = pivot_unknown(arr, 0, 0.1)
    pieces = [Piece(0), Piece(1, 0.1)]
    best = 0.0
    steps = 300
    for i in range(steps + 1):
        for k in range(steps + 1 - i):
            w = np.array([i, k, steps - i - k]) / steps
            best = max(best, min(closest(arr, w, p)[0] for p in pieces))
    assert best <= lim.rate * (1 + 1e-9)
    assert best >= lim.rate * (1 - 1e-2)


@pytest.mark.parametrize("flip", [0.0, 0.1])
@pytest.mark.parametrize("n", [4, 8, 24])
def test_smaller_indifference_costs_more(n: int, flip: float) -> None:
    mu = one_rise(n, (2 * n) // 3, 0.3, flip)
    t = [pivot_unknown(mu, (2 * n) // 3, d).t_star for d in (0.3, 0.2, 0.1, 0.05)]
    assert all(a <= b * (1 + 1e-7) for a, b in itertools.pairwise(t))
    assert t[-1] > t[0]


@pytest.mark.parametrize("flip", [0.0, 0.1])
@pytest.mark.parametrize("n", [4, 8, 24])
def test_a_larger_rescue_costs_less(n: int, flip: float) -> None:
    at = (2 * n) // 3
    told = [told_pivot(one_rise(n, at, r, flip), at).t_star for r in RESCUES]
    unknown = [pivot_unknown(one_rise(n, at, r, flip), at, 0.1).t_star for r in RESCUES]
    assert all(a > b for a, b in itertools.pairwise(told))
    assert all(a >= b * (1 - 1e-7) for a, b in itertools.pairwise(unknown))


GRID = [(n, r, f, d) for n in (4, 8, 24) for r in (0.15, 0.3, 0.5) for f in (0.0, 0.1)
        for d in (0.05, 0.1)]


@pytest.mark.parametrize("n, rescue, flip, delta", GRID)
def test_the_claim_costs_no_less_than_the_told_pivot(n: int, rescue: float, flip: float,
                                                     delta: float) -> None:
    # the claim's alternative contains the told pivot's, so its infimum is no larger
    at = (2 * n) // 3
    mu = one_rise(n, at, rescue, flip)
    assert pivot_unknown(mu, at, delta).t_star >= told_pivot(mu, at).t_star * (1 - 1e-9)


@pytest.mark.parametrize("n, rescue, flip, delta", GRID)
def test_dual_gap_on_the_one_rise_grid(n: int, rescue: float, flip: float,
                                       delta: float) -> None:
    at = (2 * n) // 3
    lim = pivot_unknown(one_rise(n, at, rescue, flip), at, delta)
    assert 0 <= lim.gap <= 1e-6


@pytest.mark.parametrize("flip", [0.0, 0.1])
@pytest.mark.parametrize("n", [4, 8, 24])
@pytest.mark.parametrize("p_a, p_b", [(0.5, 0.75), (4 / 7, 0.7), (2 / 3, 0.6)])
def test_dual_gap_on_two_rise_worlds(n: int, flip: float, p_a: float, p_b: float) -> None:
    mu, b = two_rise(n, p_a, p_b, flip)
    lim = pivot_unknown(mu, b, 0.1)
    assert 0 <= lim.gap <= 1e-6
    assert lim.t_star >= told_pivot(mu, b).t_star * (1 - 1e-9)


def test_the_certificate_bounds_every_allocation() -> None:
    # the upper end of the certificate holds at any w, not only at the optimum
    mu = one_rise(8, 5, 0.3, 0.1)
    lim = pivot_unknown(mu, 5, 0.1)
    pieces = [Piece(5)] + [Piece(j, 0.1) for j in range(6, 8)]
    rng = np.random.default_rng(0)
    for _ in range(200):
        w = np.zeros(9)
        w[5:] = rng.dirichlet(np.full(4, 0.5))
        assert min(closest(mu, w, p)[0] for p in pieces) <= lim.upper * (1 + 1e-12)
