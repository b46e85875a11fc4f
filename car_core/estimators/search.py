"""Where the contrastive budget goes: search the ``H`` curve, confirm one step, re-estimate it.

The locus is the latest rise of ``H`` (``H_j`` holds steps ``< j``): every arm after it equals
``H_n``, so it is the largest ``j`` with ``H_j ≠ H_n``. The search works on an ``ArmSource``
(pairs of arms by rollout index) so that the engine and a vectorised simulator of the planted
models run the same decisions.

1. Gate. Pairs ``(H_n, H_0)`` on navigation indices until their net count of positive pairs
   reaches ``GATE_NET`` (or the gate's share of the budget is spent). They estimate the size of
   the rise ``δ`` and the rate ``q`` of pairs that disagree by noise. No rise: nothing to follow.
2. Bisection over ``[lo, hi)`` with ``H_lo`` below and ``H_hi`` level with ``H_n``: each
   ``mid`` is decided by a truncated sequential probability ratio test on the pairs
   ``(H_n, H_mid)`` between "level" (each sign w.p. ``q``) and "below" (``+`` w.p. ``q + δ``),
   with error ``NAV_ERROR`` each way; ``H_n``'s rollouts are shared by every comparison.
3. Confirmation of the candidate ``c = lo`` on fresh rollout indices (independent of the
   search): the pairs ``(H_{c+1}, H_c)`` feed the betting test of ``sequential.positive_at``,
   looked at after every batch, until it shows the rescue positive or the budget is spent.
4. Re-estimate. The mean of a sequence stopped when it first crossed a boundary is biased up;
   when rollouts are left, the rescue is re-estimated on as many fresh pairs (capped by what
   is left), which are independent of the stopping time, so that mean is unbiased. The raw
   mean is kept beside it.

Error control (FWER ≤ α). A step is named only by step 3. The candidate is a function of the
navigation rollouts; the confirmation rollouts are independent of them, so conditionally on
the candidate its pairs are i.i.d. with mean equal to its true rescue. If that rescue is ``≤ 0``
the betting wealth is a non-negative supermartingale, and by Ville's inequality the test ever
crosses ``1/α`` with probability ``≤ θα ≤ α`` however many times it looks and whenever it
stops. Only one hypothesis is ever tested, so the chance of naming a step whose rescue is
``≤ 0`` is ``≤ α``; navigation mistakes cost power, never validity. The interval reported is the
betting confidence sequence of the same pairs at level ``1 − α``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..sequential import ConfidenceSequence, Prior, confidence_sequence, positive_at

GATE_NET = 4          # net positive pairs that make a rise worth following
NAV_SHARE = 0.45      # of the budget, the most the gate and the bisection may spend
GATE_SHARE = 0.4      # of the navigation budget, the most the gate may spend
NAV_ERROR = 0.01      # error each way of one bisection decision
NAV_BATCH = 2         # pairs per look during navigation
CONFIRM = 1 << 20     # first rollout index of the confirmation pairs
REFIT = 2 << 20       # first rollout index of the re-estimate


class ArmSource(Protocol):
    """Pairs of arms by rollout index, run on demand under one rollout budget."""

    def diffs(self, hi: int, lo: int, indices: range) -> np.ndarray:
        """``y_hi[r] − y_lo[r]`` for the indices both arms reach (missing rollouts are run
        first, as far as the budget allows)."""

    def means(self, hi: int, lo: int, indices: range) -> tuple[float, float]:
        """The two arms' means on those indices."""

    @property
    def remaining(self) -> int:
        """Rollouts the budget still allows."""


@dataclass(frozen=True)
class Decision:
    """What the search found: the candidate, its confirmation and the re-estimate."""

    candidate: int | None
    significant: bool
    interval: ConfidenceSequence | None
    raw: float | None
    refit: float | None
    refit_pairs: int
    fail_held: float | None
    fail_resampled: float | None
    pairs: int
    note: str | None
    exhausted: bool = False  # the budget ran out before the answer was decided
    decided_spent: int = 0   # rollouts spent when the answer was decided (before the refit)


def _counts(d: np.ndarray) -> tuple[int, int]:
    return int((d > 0).sum()), int((d < 0).sum())


def _decide_level(src: ArmSource, n: int, mid: int, delta: float, q: float, cap: int,
                  start: int) -> bool:
    """True when ``H_mid`` is below ``H_n`` (the locus is at or after ``mid``)."""
    bound = math.log((1 - NAV_ERROR) / NAV_ERROR)
    up = math.log((q + delta) / q)
    flat = math.log((1 - 2 * q - delta) / (1 - 2 * q))
    t = start
    llr = 0.0
    while True:
        want = min(cap, t + NAV_BATCH)
        if want <= t or src.remaining < 2:
            return llr > 0
        d = src.diffs(n, mid, range(want))
        if d.size < want:  # the budget ran out
            t = want
            pos, _ = _counts(d)
            zero = int((d == 0).sum())
            return pos * up + zero * flat > 0
        t = want
        pos, _ = _counts(d)
        zero = int((d == 0).sum())
        llr = pos * up + zero * flat
        if llr >= bound:
            return True
        if llr <= -bound or t >= cap:
            return llr > 0


def search(src: ArmSource, n: int, budget: int, alpha: float, intervals: bool = True
           ) -> Decision:
    """Gate, bisect, confirm and re-estimate within ``budget`` rollouts (module docstring)."""
    nav_budget = int(budget * NAV_SHARE)
    levels = max(1, math.ceil(math.log2(n))) if n > 1 else 0
    prior = Prior()
    candidate = 0
    if n > 1:
        gate_cap = max(8, int(nav_budget * GATE_SHARE) // 2)
        s, pos, neg = 0, 0, 0
        while s < gate_cap and pos - neg < GATE_NET and src.remaining >= 2:
            s = min(gate_cap, s + 4)
            d = src.diffs(n, 0, range(s))
            pos, neg = _counts(d)
            if d.size == 0:  # not one pair came back (every branch failed): stop spending
                s = 0
                break
            s = d.size if d.size < s else s
        if pos - neg <= 0:
            return Decision(None, False, None, None, None, 0, None, None, 0,
                            f"holding the whole record does not raise the failure rate over "
                            f"resampling it from step 0 ({pos} pair(s) up, {neg} down of {s}), "
                            "so there is no rise to follow",
                            decided_spent=budget - src.remaining)
        d_gate = src.diffs(n, 0, range(s))
        prior = Prior.of(d_gate)
        delta = (pos - neg) / s
        q = (neg + 0.5) / (s + 1)
        delta = min(delta, 1 - 2 * q - 1e-3)
        lo, hi = 0, n
        per_decision = max(8, (nav_budget - (budget - src.remaining)) // max(levels, 1))
        while hi - lo > 1:
            mid = (lo + hi) // 2
            below = _decide_level(src, n, mid, delta, q, per_decision, 0)
            lo, hi = (mid, hi) if below else (lo, mid)
        candidate = lo
    c = candidate
    pairs = 0
    found = None
    while src.remaining >= 2:
        want = pairs + max(2, pairs // 8)
        want = min(want, pairs + src.remaining // 2)
        d = src.diffs(c + 1, c, range(CONFIRM, CONFIRM + want))
        if d.size <= pairs:
            break
        pairs = d.size
        found = positive_at(d, alpha, prior)
        if found is not None:
            break
    d = src.diffs(c + 1, c, range(CONFIRM, CONFIRM + pairs)) if pairs else np.zeros(0)
    if d.size == 0:
        return Decision(c, False, None, None, None, 0, None, None, 0,
                        "the budget ran out before the candidate step could be confirmed",
                        exhausted=True, decided_spent=budget - src.remaining)
    significant = found is not None
    held, resampled = src.means(c + 1, c, range(CONFIRM, CONFIRM + pairs))
    decided = budget - src.remaining
    refit, refit_pairs = None, 0
    if significant:
        extra = min(pairs, src.remaining // 2)
        if extra >= 1:
            r = src.diffs(c + 1, c, range(REFIT, REFIT + extra))
            if r.size:
                refit, refit_pairs = float(r.mean()), int(r.size)
    interval = confidence_sequence(d, alpha, prior) if intervals else None
    return Decision(c, significant, interval, float(d.mean()), refit, refit_pairs, held,
                    resampled, int(d.size), None, exhausted=not significant,
                    decided_spent=decided)
