"""Anytime-valid inference for the mean of paired differences in [-1, 1], by betting.

Each pair gives ``d_t = y_hi − y_lo`` in ``[-1, 1]``, independent across pairs with mean ``μ``.
For a candidate mean ``m`` a gambler who bets a fixed fraction ``λ`` on ``d − m`` holds
``Π (1 + λ (d_s − m))``; a mixture over a grid of bets ``BETS`` with weights fixed before the
pairs (``W⁺_t(m)``), and the mirror mixture betting on ``m − d`` (``W⁻_t(m)``), are non-negative
martingales with mean one when ``μ = m``, so is ``E_t(m) = θ W⁺_t(m) + (1 − θ) W⁻_t(m)``, and
Ville's inequality gives ``P(sup_t E_t(m) ≥ 1/α) ≤ α``. The confidence sequence is every ``m``
never rejected so far; it covers ``μ`` at all times at once with probability ``≥ 1 − α``, so the
data may be looked at after every pair and the sampling stopped whenever the answer is clear
(Waudby-Smith & Ramdas 2023, "Estimating means of bounded random variables by betting").

``θ = LOW_SHARE`` gives most of ``α`` to the lower bound, the side that decides whether a rescue
is positive. Under any ``μ ≤ 0``, ``W⁺(0)`` is a non-negative supermartingale, so the test
``positive_at`` (``θ W⁺_t(0) ≥ 1/α``) has error ``≤ θα`` however long it runs. The weights lean
towards the growth-optimal bet ``Σd / Σd²`` of prior pseudo-data, which must be independent of
the pairs (for instance earlier, separate rollouts).

Pass/fail outcomes give pairs in ``{-1, 0, 1}``; then ``μ ≤ 0`` says a disagreeing pair is up
with probability ``≤ 1/2``, and ``W⁺(0)`` depends only on how many pairs disagreed (``s``) and how
many of those were up (``k``). ``positive_by_end`` adds to the anytime test one exact sign test
when the sampling ends: under the null the signs are fair coins independent of which pairs
disagree, so the chance that the walk ``k`` crosses the anytime boundary by ``s`` is computed
exactly, and the final critical value takes what is left of ``θα`` (``final_critical``). The
anytime part alone, over an unbounded horizon, is what Ville bounds; here the horizon is the
sampling's end, which is known, so the exact part recovers the slack of that bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

LOW_SHARE = 0.9      # θ: the share of α spent on the lower bound
BETS = np.array([0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9, 0.97])  # the mixture's bets
SPREAD = 0.15        # how far around the prior's bet its weight spreads
EVEN_SHARE = 0.3     # of the mixture weight, the part spread evenly over every bet
GRID = np.linspace(-1.0, 1.0, 801)  # candidate means of the confidence sequence
PRIOR_WEIGHT = 8.0   # prior pseudo-data count at most this many pairs
TOP_SHARE = 0.9     # of a below-bound test's weight, what its largest bet gets (``below_at``)
EXACT_MAX = 2000     # disagreeing pairs beyond which the exact walk (quadratic) is not run


@dataclass(frozen=True)
class Prior:
    """Pseudo-data that centre the bets: a sum of differences and of their squares."""

    total: float = 0.0
    squares: float = 0.0
    certain: bool = False  # the pairs' upper arm was never seen to pass: no pair goes down

    @classmethod
    def certain_failure(cls) -> Prior:
        """Bets for pairs whose upper arm fails every time (the failure certain once the step
        is held), so no pair can go down: the growth-optimal bet is then the largest, and
        ``TOP_SHARE`` of the weight goes to it, as ``below_at`` gives its all-fail arm. A
        rescue of 0.3 is then shown by five pairs up at ``θα = 0.04`` instead of six (three
        pairs in ten up, so about seven rollouts fewer); a pair that does go down costs the
        mixture that bet, ``ln(1/(1 − TOP_SHARE))`` nats at most."""
        return cls(certain=True)

    @classmethod
    def of(cls, d: Sequence[float] | np.ndarray, weight: float = PRIOR_WEIGHT) -> Prior:
        arr = np.asarray(d, dtype=float)
        if arr.size == 0:
            return cls()
        scale = min(1.0, weight / arr.size)
        return cls(float(arr.sum()) * scale, float((arr ** 2).sum()) * scale)

    def weights(self) -> np.ndarray:
        """Mixture weights over ``BETS``: ``EVEN_SHARE`` spread evenly, the rest around the
        prior's bet (all evenly when the prior says nothing)."""
        even = np.full(BETS.size, 1.0 / BETS.size)
        if self.certain:
            return _top_weights()
        if self.squares <= 0 or self.total <= 0:
            return even
        bet = min(float(BETS[-1]), self.total / (self.squares + 0.25))
        near = np.exp(-0.5 * ((BETS - bet) / SPREAD) ** 2)
        return np.asarray(EVEN_SHARE * even + (1.0 - EVEN_SHARE) * near / near.sum())


def _top_weights() -> np.ndarray:
    """``TOP_SHARE`` of the weight on the largest bet, the rest spread evenly."""
    weights = np.full(BETS.size, (1 - TOP_SHARE) / BETS.size)
    weights[-1] += TOP_SHARE
    return weights


def _log_mix(log_paths: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``log Σ_i w_i exp(log_paths[..., i])``, stably."""
    top = log_paths.max(axis=-1, keepdims=True)
    return np.asarray(top[..., 0] + np.log(np.exp(log_paths - top) @ weights), dtype=float)


def _wealth_up(x: np.ndarray, weights: np.ndarray, scale: np.ndarray | float = 1.0
               ) -> np.ndarray:
    """Log mixture wealth of betting on the centred data ``x`` (rows: pairs, then any shape);
    ``scale`` shrinks the bets where ``x`` may reach below ``-1``."""
    bets = BETS * np.asarray(scale)[..., None]
    factors = np.log1p(x[..., None] * bets)
    return _log_mix(np.cumsum(factors, axis=0), weights)


def positive_at(d: Sequence[float] | np.ndarray, alpha: float, prior: Prior = Prior()
                ) -> int | None:
    """The first number of pairs after which ``θ W⁺(0) ≥ 1/α`` (mean > 0 shown), else None."""
    x = np.asarray(d, dtype=float)
    if x.size == 0:
        return None
    log_w = _wealth_up(x, prior.weights())
    hit = np.nonzero(log_w >= np.log(1.0 / (LOW_SHARE * alpha)))[0]
    return int(hit[0]) + 1 if hit.size else None


def below_at(d: Sequence[float] | np.ndarray, bound: float, alpha: float) -> int | None:
    """The first number of pairs after which the mean is shown below ``bound`` (in ``[0, 1)``),
    else None: the mixture bets on ``bound − d``, a non-negative supermartingale whenever the
    mean is ``≥ bound``, so by Ville the test errs with probability ``≤ alpha`` however long it
    runs. Bets reach ``1/(1 − bound)`` (``bound − d ≥ bound − 1`` keeps every factor positive),
    and ``TOP_SHARE`` of the weight is on the largest: a step that changes nothing under shared
    noise gives pairs of zeros, and an arm after which failure is certain rollouts that never
    pass, which only the largest bet rules out fast — at the rate of the exact test "no pair
    went up" — while noisy pairs could not rule out a small rise within a budget at any bet.
    Nine tenths there, against half, cut the all-fail test from 50 rollouts to 46 at the same
    level; what it costs noisy pairs (ln 5 against ln 2 nats) is spent where no budget rules
    out ``Δ = 0.1`` anyway."""
    log_w = _below_wealth(d, bound)
    hit = np.nonzero(log_w >= np.log(1.0 / alpha))[0]
    return int(hit[0]) + 1 if hit.size else None


def below_now(d: Sequence[float] | np.ndarray, bound: float, alpha: float) -> bool:
    """Whether the mean is shown below ``bound`` after all of ``d``: ``below_at``'s wealth
    read at the end only. Each bet's wealth is a product, so its value after the last pair
    does not depend on the order of the pairs: the test for data gathered in an order the
    caller cannot replay (rollouts an arm ran in several stages) looked at once, now."""
    log_w = _below_wealth(d, bound)
    return bool(log_w.size) and bool(log_w[-1] >= np.log(1.0 / alpha))


def _below_wealth(d: Sequence[float] | np.ndarray, bound: float) -> np.ndarray:
    """``below_at``'s log mixture wealth after each pair."""
    x = bound - np.asarray(d, dtype=float)
    if x.size == 0:
        return np.zeros(0)
    return _wealth_up(x, _top_weights(), 1.0 / (1.0 - bound))


def _signs(d: np.ndarray) -> np.ndarray | None:
    """The signs of the disagreeing pairs when every pair is in ``{-1, 0, 1}``, else None."""
    if not np.all(np.isin(d, (-1.0, 0.0, 1.0))):
        return None
    return np.asarray(d[d != 0])


@lru_cache(maxsize=256)
def final_critical(disagreeing: int, alpha: float, weights: tuple[float, ...]) -> int:
    """Fewest up pairs among ``disagreeing`` that the end-of-sampling sign test needs, so that
    under fair signs P(anytime boundary crossed by then, or that many up at the end) ≤ θα.
    Exact: a walk over (pairs disagreeing so far, up so far), absorbed at the boundary."""
    w = np.asarray(weights)
    level = LOW_SHARE * alpha
    threshold = np.log(1.0 / level)
    up, down = np.log1p(BETS), np.log1p(-BETS)
    alive = np.array([1.0])      # P(k up so far, boundary not yet crossed), k = 0..s
    crossed = 0.0
    for s in range(1, disagreeing + 1):
        nxt = np.zeros(s + 1)
        nxt[:-1] += 0.5 * alive
        nxt[1:] += 0.5 * alive
        k = np.arange(s + 1)
        log_w = _log_mix(k[:, None] * up + (s - k)[:, None] * down, w)
        over = log_w >= threshold
        crossed += float(nxt[over].sum())
        nxt[over] = 0.0
        alive = nxt
    tail = np.cumsum(alive[::-1])[::-1]           # P(alive with >= c up), c = 0..m
    ok = np.nonzero(crossed + tail <= level + 1e-12)[0]
    return int(ok[0]) if ok.size else disagreeing + 1


def positive_by_end(d: Sequence[float] | np.ndarray, alpha: float, prior: Prior = Prior()
                    ) -> bool:
    """The anytime test, or — for pairs in ``{-1, 0, 1}`` whose sampling ends here — the exact
    sign test that spends the rest of ``θα`` (module docstring): error ``≤ θα`` under ``μ ≤ 0``
    when the number of pairs does not depend on their signs. Beyond ``EXACT_MAX`` disagreeing
    pairs the anytime test decides alone (it has the power by then)."""
    x = np.asarray(d, dtype=float)
    if positive_at(x, alpha, prior) is not None:
        return True
    signs = _signs(x)
    if signs is None or signs.size == 0 or signs.size > EXACT_MAX:
        return False
    weights = tuple(float(v) for v in prior.weights())
    return int((signs > 0).sum()) >= final_critical(int(signs.size), float(alpha), weights)


def pairs_to_show(gap: float, spread: float, level: float) -> float:
    """Roughly how many pairs in all a betting test at ``level`` needs to show a mean ``gap``
    away from the null, for pairs of variance ``spread``: its log wealth grows by about
    ``gap²/(2·spread)`` a pair and must reach ``log(1/level)``. Infinite for no gap. A planning
    figure (how long to keep a test going, what more would decide it), never a decision."""
    if gap <= 0:
        return math.inf
    return 2.0 * spread * math.log(1.0 / level) / gap ** 2


@dataclass(frozen=True)
class ConfidenceSequence:
    """The confidence sequence after ``n`` pairs: mean, running interval and its level."""

    estimate: float
    ci: tuple[float, float]
    level: float
    n: int


def confidence_sequence(d: Sequence[float] | np.ndarray, alpha: float, prior: Prior = Prior(),
                        shown_positive: bool = False) -> ConfidenceSequence:
    """The running-intersection confidence sequence of ``μ`` after all of ``d``.

    ``shown_positive``: the end-of-sampling test rejected ``μ ≤ 0`` at ``θα``; the lower end is
    then at least zero (open: the interval is ``(0, high]`` where the sequence reached below
    zero). For ``μ ≥ 0`` the lower end misses with probability ``≤ θα`` either way."""
    x = np.asarray(d, dtype=float)
    if x.size == 0:
        return ConfidenceSequence(float("nan"), (-1.0, 1.0), 1.0 - alpha, 0)
    m = GRID[None, :]
    centred = x[:, None] - m
    # bets shrink where a factor could turn negative: up on d − m ≥ −1 − m, down on m − d
    log_up = _wealth_up(centred, prior.weights(), 1.0 / (1.0 + np.maximum(GRID, 0.0)))
    log_down = _wealth_up(-centred, np.full(BETS.size, 1.0 / BETS.size),
                          1.0 / (1.0 + np.maximum(-GRID, 0.0)))
    top = np.maximum(log_up, log_down)
    e = top + np.log(LOW_SHARE * np.exp(log_up - top) + (1 - LOW_SHARE) * np.exp(log_down - top))
    kept = np.nonzero(e.max(axis=0) < np.log(1.0 / alpha))[0]
    step = GRID[1] - GRID[0]
    if kept.size == 0:  # every mean rejected: only possible with probability <= alpha
        centre = float(x.mean())
        return ConfidenceSequence(centre, (centre, centre), 1.0 - alpha, int(x.size))
    lo_i, hi_i = int(kept[0]), int(kept[-1])
    low = GRID[lo_i] - step / 2 if lo_i > 0 else -1.0
    high = GRID[hi_i] + step / 2 if hi_i < GRID.size - 1 else 1.0
    if shown_positive and low <= 0.0:
        low = float(np.nextafter(0.0, 1.0)) if high > 0 else low
    return ConfidenceSequence(float(x.mean()), (float(low), float(high)), 1.0 - alpha, int(x.size))
