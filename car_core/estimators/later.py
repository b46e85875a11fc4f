"""After a step is confirmed, the steps after it: each is shown to rescue less than the
indifference level ``Δ``, or shown to rescue more than nothing — then it is the later cause and
the locus — or, when the budget runs out first, left open and said so.

The point of commitment is the latest step whose rescue is shown positive; the search finds a
rise of ``H`` and confirms it, but where two steps each could have saved the run it may confirm
the earlier one. This stage tests the steps after the confirmed one, latest first, on pairs
``(H_{j+1}, H_j)`` at common rollout indices from ``LATER`` (an arm drawn for one step serves the
next). Each test stops at whichever boundary it crosses first:

- ruled out: the anytime test that the mean of the pairs is below ``Δ`` (``below_at``) at level
  ``ℓ_out``; the steps are tested in a fixed sequence and the stage moves on only past a step
  ruled out, so every ruled-out claim together errs with probability ``≤ ℓ_out`` (the first step
  whose rescue is ``≥ Δ`` is the only way in, whatever the data that led there);
- a later cause: the anytime test that the mean is above zero at level ``ℓ_pos`` per step
  (``positive_at``), Bonferroni over the ``n − 1`` steps a stage could test.

``ℓ_out + (n − 1)·ℓ_pos = (1 − θ)·α``, the part of α the search's confirmations never spend
(they spend ``θα`` in all, ``θ = LOW_SHARE``), so naming the locus, listing earlier causes and
ruling later steps out hold together with family-wise error ``≤ α``. Each test's pairs are
i.i.d. with the step's rescue as their mean whatever came before (fresh indices, independent
branches per index), which is all Ville's inequality needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from car_core import defaults
from car_core.estimators.confirmation import Confirmation
from car_core.estimators.navigation import ArmSource
from car_core.stats.sequential import LOW_SHARE, below_at, positive_at

LATER = 3 << 20       # first rollout index of the later steps' pairs
INDIFFERENCE = defaults.INDIFFERENCE  # Δ
RESERVE = 1 / 3       # of the budget left, what the stage leaves for the re-estimate
HOPELESS_AFTER = 16   # pairs after which a test no budget left could finish is stopped


@dataclass(frozen=True)
class LaterStep:
    """One later step's test: ``"ruled out"`` (rescue shown below ``Δ``), ``"cause"`` (shown
    above zero) or ``"open"`` (the budget ran out first, or it was never reached)."""

    step: int
    verdict: str
    pairs: int = 0
    mean: float | None = None


@dataclass(frozen=True)
class LaterCheck:
    """What the stage showed: every later step's verdict (latest first) and, when a later
    cause was found, its test as a confirmation the re-estimate can pool."""

    steps: tuple[LaterStep, ...] = ()
    cause: int | None = None
    confirmation: Confirmation | None = None
    level: float = 0.0  # the level a later cause was shown at (ℓ_pos)
    delta: float = INDIFFERENCE

    @property
    def open_steps(self) -> tuple[int, ...]:
        return tuple(sorted(s.step for s in self.steps if s.verdict == "open"))

    @property
    def ruled_out(self) -> tuple[int, ...]:
        return tuple(sorted(s.step for s in self.steps if s.verdict == "ruled out"))


def levels(alpha: float, n: int) -> tuple[float, float]:
    """``(ℓ_out, ℓ_pos)``: half the search's unspent ``(1 − θ)α`` for ruling out (fixed
    sequence), half for a later cause, split over the ``n − 1`` steps it could be."""
    spare = (1.0 - LOW_SHARE) * alpha
    return spare / 2, spare / 2 / max(n - 1, 1)


def _pairs_to_show(d: np.ndarray, gap: float, level: float) -> float:
    """Roughly how many pairs in all a betting test needs to show a mean ``gap`` away from
    the pairs' own, at their spread: its log wealth grows by about ``gap²/(2σ²)`` a pair."""
    if gap <= 0:
        return float("inf")
    return 2.0 * max(float(d.var()), 1e-3) * float(np.log(1.0 / level)) / gap ** 2


def _hopeless(d: np.ndarray, delta: float, out_level: float, pos_level: float,
              room: int) -> bool:
    """Neither verdict is within reach of the pairs ``room`` more could buy: noisy pairs of a
    step that changes little cannot rule it out at ``Δ``, nor show it matters, in this budget.
    Judged at the mean's optimistic end each way (two standard errors), so a true cause whose
    first pairs ran low is not given up. Stopping only gives up (the step stays open), so it
    costs no validity."""
    mean = float(d.mean())
    slack = 2.0 * float(d.std()) / float(np.sqrt(d.size))
    reach = d.size + room
    return (_pairs_to_show(d, delta - (mean - slack), out_level) > reach
            and _pairs_to_show(d, mean + slack, pos_level) > reach)


def check_later(src: ArmSource, c: int, n: int, alpha: float, delta: float = INDIFFERENCE,
                wave: int = 0) -> LaterCheck:
    """Test the steps after ``c`` latest first, until one is a cause or one is left open."""
    out_level, pos_level = levels(alpha, n)
    cap = src.remaining - int(src.remaining * RESERVE)
    verdicts: list[LaterStep] = []
    least_batch = 2 if wave <= 1 else max(2, wave // 2)
    for j in range(n - 1, c, -1):
        start_spent = src.remaining
        pairs, crossed, verdict = 0, None, "open"
        d = np.zeros(0)
        while src.remaining >= 2 and cap - (start_spent - src.remaining) >= 2:
            want = pairs + max(least_batch, pairs // 8)
            d = src.diffs(j + 1, j, range(LATER, LATER + want))
            if d.size <= pairs:
                break
            pairs = int(d.size)
            crossed = positive_at(d, pos_level / LOW_SHARE)
            if crossed is not None:
                verdict = "cause"
                break
            if below_at(d, delta, out_level) is not None:
                verdict = "ruled out"
                break
            room = (cap - (start_spent - src.remaining)) // 2
            if pairs >= HOPELESS_AFTER and _hopeless(d, delta, out_level, pos_level, room):
                break
        cap -= start_spent - src.remaining
        verdicts.append(LaterStep(j, verdict, pairs, float(d.mean()) if d.size else None))
        if verdict == "cause":
            conf = Confirmation(d, LATER, True, False, crossed)
            return LaterCheck(tuple(verdicts), j, conf, pos_level, delta)
        if verdict == "open":
            verdicts += [LaterStep(k, "open") for k in range(j - 1, c, -1)]
            break
    return LaterCheck(tuple(verdicts), delta=delta)
