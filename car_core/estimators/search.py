"""Where the contrastive budget goes: search the ``H`` curve, confirm one step, re-estimate it.

The locus is the latest rise of ``H`` (``H_j`` holds steps ``< j``): every arm after it equals
``H_n``, so it is the largest ``j`` with ``H_j ≠ H_n``. The search works on an ``ArmSource``
(pairs of arms by rollout index) so that the engine and a vectorised simulator of the planted
models run the same decisions.

1. Gate. Pairs ``(H_n, H_0)`` on navigation indices until one more pair is up than down (or
   the gate's share of the budget is spent): no rise, nothing to follow. The indices where the
   two disagreed are the witnesses.
2. Bisection over ``[lo, hi)`` with ``H_lo`` below and ``H_hi`` level with ``H_n``. Each ``mid``
   is first looked at on a few gate indices, witnesses among them (``Witnesses``): under
   coupled noise an arm before the rise draws what ``H_0`` drew there and one after it what
   ``H_n`` drew, so a probe that matches one of them index by index is placed for ``PROBE``
   rollouts. Otherwise the gate goes on until ``GATE_NET`` net pairs size the rise ``δ`` and the
   rate ``q`` of pairs that disagree by noise, and ``mid`` is decided by a truncated sequential
   probability ratio test on the pairs ``(H_n, H_mid)`` between "level" (each sign w.p. ``q``)
   and "below" (``+`` w.p. ``q + δ``), with error ``NAV_ERROR`` each way; ``H_n``'s rollouts
   are shared by every comparison.
3. Confirmation of the candidate ``c = lo`` on fresh rollout indices (independent of the
   search): the pairs ``(H_{c+1}, H_c)`` feed the anytime betting test of
   ``sequential.positive_at``, looked at after every batch, until it shows the rescue positive
   or the budget is spent; then pass/fail pairs get the exact sign test of
   ``sequential.positive_by_end`` with what is left of the level.
4. Re-estimate. The mean of a sequence stopped when it first crossed a boundary is biased up;
   when rollouts are left, the rescue is re-estimated on as many fresh pairs (capped by what
   is left), which are independent of the stopping time, so that mean is unbiased. The raw
   mean is kept beside it.

Error control (FWER ≤ α). A step is named only by step 3. The candidate and the prior of the
bets are functions of the navigation rollouts; the confirmation rollouts are independent of
them, so conditionally on the candidate its pairs are i.i.d. with mean equal to its true rescue.
If that rescue is ``≤ 0``, the betting wealth is a non-negative supermartingale and by Ville's
inequality the anytime test ever crosses ``1/(θα)`` with probability ``≤ θα`` however often it
looks. For pass/fail outcomes the signs of the disagreeing pairs are then coins with
``P(up) ≤ 1/2``, independent of which pairs disagree and of the number of pairs (set by the
budget), so the probability that the anytime boundary is crossed or the end-of-sampling count
reaches its critical value is computed exactly and held at ``θα`` (``sequential``). Only one
hypothesis is ever tested, so the chance of naming a step whose rescue is ``≤ 0`` is
``≤ θα < α``; navigation mistakes, and arms that share less noise than the witnesses assume,
cost power, never validity. The interval reported is the betting confidence sequence of the
same pairs at level ``1 − α``, whose lower end is raised to zero when the exact test showed the
rescue positive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..sequential import (
    ConfidenceSequence,
    Prior,
    confidence_sequence,
    positive_at,
    positive_by_end,
)

GATE_NET = 4          # net positive pairs that size a rise for the sequential probes
NAV_SHARE = 0.45      # of the budget, the most the gate and the bisection may spend
GATE_SHARE = 1.0      # of the navigation budget, the most the gate may spend
NAV_ERROR = 0.01      # error each way of one bisection decision
NAV_BATCH = 2         # pairs per look during navigation
PROBE = 4             # gate indices a probe looks at first (its witnesses among them)
PROBE_WITNESSES = 1   # disagreeing gate pairs a probe needs before it may decide on them
CONFIRM = 1 << 20     # first rollout index of the confirmation pairs
REFIT = 2 << 20       # first rollout index of the re-estimate


class ArmSource(Protocol):
    """Pairs of arms by rollout index, run on demand under one rollout budget."""

    def diffs(self, hi: int, lo: int, indices: Sequence[int]) -> np.ndarray:
        """``y_hi[r] − y_lo[r]`` for the longest prefix of ``indices`` both arms reach
        (missing rollouts are run first, as far as the budget allows)."""

    def means(self, hi: int, lo: int, indices: Sequence[int]) -> tuple[float, float]:
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


def _gate(src: ArmSource, n: int, net: int, cap: int, d: np.ndarray) -> np.ndarray:
    """Pairs ``(H_n, H_0)`` on navigation indices from 0, extended four at a time until their
    net count of positive pairs reaches ``net`` or ``cap`` pairs (or the budget) are spent."""
    s = d.size
    while s < cap and int(np.sign(d).sum()) < net and src.remaining >= 2:
        s = min(cap, s + 4)
        d = src.diffs(n, 0, range(s))
        if d.size < s:  # the budget ran out, or no branch came back
            break
    return d


def _rise(d_gate: np.ndarray) -> tuple[float, float]:
    """The size ``δ`` of the rise and the rate ``q`` of pairs that disagree by noise."""
    pos, neg = _counts(d_gate)
    s = max(d_gate.size, 1)
    q = (neg + 0.5) / (s + 1)
    return min((pos - neg) / s, 1 - 2 * q - 1e-3), q


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


@dataclass
class Witnesses:
    """Gate indices where ``H_n`` and ``H_0`` disagreed, and some where they agreed.

    Under coupled noise an arm before the rise draws, rollout by rollout, what ``H_0`` drew and
    an arm after it what ``H_n`` drew; then one look at these indices places a probe. Arms that
    share less noise agree by chance too, which would make every probe look level, so a level
    verdict is taken from them only once some probe agreed with ``H_0`` at every one of them
    (``coupled``): by chance that needs the probe's failures to fall exactly where ``H_0``'s did."""

    indices: list[int]
    gate: np.ndarray      # H_n − H_0 at ``indices``
    coupled: bool = False

    @classmethod
    def of(cls, d_gate: np.ndarray) -> Witnesses:
        split = np.nonzero(d_gate != 0)[0]
        same = np.nonzero(d_gate == 0)[0]
        take = list(split[:PROBE // 2]) + list(same[:PROBE - min(split.size, PROBE // 2)])
        idx = sorted(int(r) for r in take)
        return cls(idx, d_gate[idx])

    def side(self, src: ArmSource, n: int, mid: int) -> bool | None:
        """True (below ``H_n``), False (level) or None (no clear verdict: test it)."""
        if int((self.gate != 0).sum()) < PROBE_WITNESSES:
            return None
        d = src.diffs(n, mid, self.indices)
        if d.size < len(self.indices):
            return None
        if np.array_equal(d, self.gate):
            self.coupled = True
            return True
        if self.coupled and not d.any():
            return False
        return None


def search(src: ArmSource, n: int, budget: int, alpha: float, intervals: bool = True
           ) -> Decision:
    """Gate, bisect, confirm and re-estimate within ``budget`` rollouts (module docstring)."""
    nav_budget = int(budget * NAV_SHARE)
    levels = max(1, math.ceil(math.log2(n))) if n > 1 else 0
    prior = Prior()
    candidate = 0
    if n > 1:
        gate_cap = max(8, int(nav_budget * GATE_SHARE) // 2)
        d_gate = _gate(src, n, 1, gate_cap, np.zeros(0))
        pos, neg = _counts(d_gate)
        if pos - neg <= 0:
            return Decision(None, False, None, None, None, 0, None, None, 0,
                            f"holding the whole record does not raise the failure rate over "
                            f"resampling it from step 0 ({pos} pair(s) up, {neg} down of "
                            f"{d_gate.size}), so there is no rise to follow",
                            decided_spent=budget - src.remaining)
        witnesses = Witnesses.of(d_gate)
        sprt: tuple[float, float] | None = None
        per_decision = 8
        lo, hi = 0, n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            below = witnesses.side(src, n, mid)
            if below is None:
                if sprt is None:  # the witnesses did not settle it: size the rise first
                    d_gate = _gate(src, n, GATE_NET, gate_cap, d_gate)
                    sprt = _rise(d_gate)
                    per_decision = max(8, (nav_budget - (budget - src.remaining))
                                       // max(levels, 1))
                below = _decide_level(src, n, mid, *sprt, per_decision, 0)
            lo, hi = (mid, hi) if below else (lo, mid)
        prior = Prior.of(d_gate)
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
    significant = found is not None or positive_by_end(d, alpha, prior)
    held, resampled = src.means(c + 1, c, range(CONFIRM, CONFIRM + pairs))
    decided = budget - src.remaining
    refit, refit_pairs = None, 0
    if significant:
        extra = min(pairs, src.remaining // 2)
        if extra >= 1:
            r = src.diffs(c + 1, c, range(REFIT, REFIT + extra))
            if r.size:
                refit, refit_pairs = float(r.mean()), int(r.size)
    interval = confidence_sequence(d, alpha, prior, significant) if intervals else None
    return Decision(c, significant, interval, float(d.mean()), refit, refit_pairs, held,
                    resampled, int(d.size), None, exhausted=not significant,
                    decided_spent=decided)
