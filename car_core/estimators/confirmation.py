"""Confirmation: the anytime test that names a candidate step, and the futility bounds that
give one up (stage 4 of the search, docs/contrastive-search.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from car_core.estimators.navigation import ArmSource, sign_counts
from car_core.stats.sequential import (
    LOW_SHARE,
    Prior,
    pairs_to_show,
    positive_at,
    positive_by_end,
)

FIRST_SHARE = 0.9     # of α, what the first confirmation spends; each later one half the rest
# (the later steps' stage has all of α after the first confirmation whatever this is, see
# later.levels. With the bets of ``Prior.certain_failure`` five pass/fail pairs up reach
# θα·0.9 where six were needed at 0.7: the claim's cost on the simulator's one-rise rows
# without judge error fell 0–7% (3.10× → 2.91× of its bound on 4 steps at a rescue of 0.3,
# 3.06× → 2.87× on 8 at 0.15), while the attempts after a give-up get 0.05 of α, not 0.15)
FUTILITY = 1000.0     # likelihood ratio "no rise" : "the gate's rise" that gives a candidate up
FUTILITY_LATE = 4.0   # likelihood ratio "no rise" : "a rise the budget left could show"
FUTILITY_MIN = 12     # pairs a confirmation runs before it may be given up
FUTILITY_RISE = 0.75  # of the rise the navigation saw, the one futility weighs against
LEAST_RISE = 0.1      # the least rise futility weighs against, whatever the budget


def share(attempt: int) -> float:
    """The share of α confirmation ``attempt`` (0-based) may spend; they sum to at most 1."""
    if attempt == 0:
        return FIRST_SHARE
    return (1.0 - FIRST_SHARE) * 0.5 ** attempt


def _trinomial_ll(pos: int, neg: int, zero: int, up: float, down: float) -> float:
    def term(count: int, p: float) -> float:
        return 0.0 if count == 0 else count * math.log(max(p, 1e-12))
    return term(pos, up) + term(neg, down) + term(zero, 1 - up - down)


def _fitted_rise_ll(pos: int, neg: int, zero: int, least: float) -> float:
    """The best log likelihood of the signs under a rise of at least ``least``
    (``P(up) − P(down) ≥ least``): the pairs' own rates when they show one, else the best fit
    on the boundary ``P(up) = P(down) + least``."""
    s = max(pos + neg + zero, 1)
    if (pos - neg) / s >= least:
        return _trinomial_ll(pos, neg, zero, pos / s, neg / s)
    downs = np.linspace(0.0, (1 - least) / 2, 201)[:-1] if least < 1 else np.zeros(1)
    return max(_trinomial_ll(pos, neg, zero, float(w) + least, float(w)) for w in downs)


def futility_llr(d: np.ndarray, rise: tuple[float, float], least: float = 0.0,
                  guessed: bool = False) -> float:
    """Log likelihood ratio of the signs of ``d`` between a rise and "no rise" (up and down
    equally likely, at the rate the pairs show: the best such fit); the rise is the one the gate
    measured (up w.p. ``rise[0]``, down w.p. ``rise[1]``) or, when ``least > 0`` and either
    the pairs show a net rise or the gate's rise is a guess from fewer than ``GATE_MIN`` pairs
    (``guessed``), the best fitting rise of at least ``least``, whichever fits the pairs
    better. Negative: the pairs look level. The gate's rise alone misleads: a gate stopped at
    its first net rise sizes it high, and a candidate whose pairs show the true, smaller rise
    would look level against it. The least rise alone gives nothing up where pairs disagree
    by noise: against a rise that small, level pairs never look level within the budget (the
    judge's own noise at 24 steps kept a wrong candidate for the whole budget)."""
    pos, neg = sign_counts(d)
    zero = int(d.size) - pos - neg
    tie = (pos + neg) / (2 * max(d.size, 1))
    null = _trinomial_ll(pos, neg, zero, tie, tie)
    alt = _trinomial_ll(pos, neg, zero, *rise)
    if least > 0 and (pos > neg or guessed):
        alt = max(alt, _fitted_rise_ll(pos, neg, zero, least))
    return alt - null


def beyond_budget(d: np.ndarray, pairs_left: int, alpha: float) -> bool:
    """Whether the least rise this confirmation could show by the end of the budget is
    ``FUTILITY_LATE`` times less likely, on the signs of ``d``, than no rise. That rise is
    the one whose betting wealth would reach ``1/(θα)`` on average over the pairs run and
    the ``pairs_left`` the budget still buys (log wealth grows by about ``δ²/(2q)`` a pair,
    ``q`` the rate of disagreeing pairs): a candidate less likely than that could not be
    named in the budget anyway, and giving it up lets the search look again. Without it a
    step that rescues nothing kept the rest of a small budget: ``FUTILITY`` against the
    gate's rise needs hundreds of noisy pairs (on the 4-step one-rise row at a rescue of
    0.3, 8 of 200 seeds ended confirming a level step; 1 with it, accuracy and cost
    unchanged). Giving up names nothing, so the error control is untouched."""
    pos, neg = sign_counts(d)
    s = int(d.size)
    zero = s - pos - neg
    q = (pos + neg + 1) / (s + 2)
    need = math.sqrt(2 * q * math.log(1 / (LOW_SHARE * alpha)) / max(s + pairs_left, 1))
    need = min(need, q * (1 - 1e-6))
    tie = (pos + neg) / (2 * max(s, 1))
    llr = (_trinomial_ll(pos, neg, zero, (q + need) / 2, (q - need) / 2)
           - _trinomial_ll(pos, neg, zero, tie, tie))
    return llr <= -math.log(FUTILITY_LATE)


@dataclass
class Confirmation:
    d: np.ndarray
    start: int
    found: bool
    futile: bool
    crossed: int | None = None  # pairs after which the anytime test crossed its boundary


def confirm(src: ArmSource, c: int, start: int, alpha: float, prior: Prior,
             rise: tuple[float, float], unlikely: Callable[[int, int], bool] | None = None,
             least: float = 0.0, guessed: bool = False, wave: int = 0,
             settled: Callable[[np.ndarray], bool] | None = None) -> Confirmation:
    """Confirmation of ``c`` on pairs from ``start`` (docs/contrastive-search.md, stage 4),
    looked at after every batch: an eighth of the pairs so far, at least two (at least half a
    ``wave`` in rounds). ``unlikely(start, pairs)``: a second futility bound, the navigation's
    belief in ``c`` once these pairs' arms are added to what it saw. ``settled(d)``: the pairs
    already decide the other way (a one-step run's "no cause", ``search._one_step_on``), so
    the confirmation gives up (it names nothing) without waiting for futility: against the
    least rise, level pairs need about twice the pairs that show the rescue below ``Δ``."""
    least_batch = 2 if wave <= 1 else max(2, wave // 2)
    pairs = 0
    d = np.zeros(0)
    found = futile = False
    crossed = None
    while src.remaining >= 2:
        want = pairs + max(least_batch, pairs // 8)
        want = min(want, pairs + src.remaining // 2)
        d = src.diffs(c + 1, c, range(start, start + want))
        if d.size <= pairs:
            break
        pairs = d.size
        crossed = positive_at(d, alpha, prior)
        if crossed is not None:
            found = True
            break
        if settled is not None and settled(d):
            futile = True
            break
        if (pairs >= FUTILITY_MIN and src.remaining >= 2
                and (futility_llr(d, rise, least, guessed) <= -math.log(FUTILITY)
                     or beyond_budget(d, src.remaining // 2, alpha)
                     or (unlikely is not None and unlikely(start, pairs)))):
            futile = True
            break
    if not found and not futile and d.size:
        found = positive_by_end(d, alpha, prior)
    return Confirmation(d, start, found, futile, crossed)


def least_rise(budget: int, alpha: float) -> float:
    """The smallest rise the whole budget could still show: a sign test with no pair down
    needs ``log2(1/(θα))`` pairs up, out of the ``budget / 2`` pairs it buys. A candidate
    is not given up while its pairs fit a rise this small better than none."""
    return math.log2(1 / (LOW_SHARE * alpha)) / max(budget // 2, 1)


def futility_rise(budget: int, alpha: float) -> float:
    """The least rise a confirmation is weighed against before it is given up: the budget's
    least (``_least_rise``), but never below ``LEAST_RISE``. The budget's least alone shrinks
    as the budget grows, and pairs that disagree by noise fit a rise that small nearly as well
    as none: a level candidate was then never given up, at any budget. A true rise below
    ``LEAST_RISE`` may be given up (power, not validity: giving up names nothing)."""
    return max(least_rise(budget, alpha), LEAST_RISE)


def more_pairs(d: np.ndarray, alpha: float) -> int | None:
    """Pairs a confirmation at the rescue measured so far would roughly need in all: the
    betting wealth grows by about ``μ²/(2σ²)`` a pair and must reach ``log(1/(θα))``."""
    if d.size < 2 or d.mean() <= 0:
        return None
    need = pairs_to_show(float(d.mean()), float(d.var()) + 1e-9, LOW_SHARE * alpha)
    return max(0, math.ceil(need) - d.size)
