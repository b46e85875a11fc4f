"""After a step is confirmed, the steps after it: each is shown to rescue less than the
indifference level ``Δ``, or shown to rescue more than nothing — then it is the later cause and
the locus — or, when the budget runs out first, left open and said so.

The point of commitment is the latest step whose rescue is shown positive; the search finds a
rise of ``H`` and confirms it, but where two steps each could have saved the run it may confirm
the earlier one. This stage tests the steps after the confirmed one, latest first, on arm
``H_j``'s rollouts from ``LATER`` and, where they are needed, the pairs ``(H_{j+1}, H_j)`` at
the same indices (an arm drawn for one step serves the next). Each test stops at whichever
boundary it crosses first:

- ruled out: the anytime test that the step's rescue is below ``Δ`` (``below_now``) at level
  ``ℓ_out``, on one sequence of observations each of mean at least the rescue: first ``1 − y``
  of ``H_j``'s own rollouts — every one drawn so far, the navigation's and the confirmation's
  included — since a step's rescue ``P(fail | H_{j+1}) − P(fail | H_j)`` is at most
  ``1 − P(fail | H_j)``; then, once ``H_j`` is not all but certain to fail (its failure rate
  further than ``ARM_ALONE·Δ`` from 1), pairs ``y_{j+1} − y_j``. Where failure is certain
  after the confirmed step the stage thus draws no rollout of ``H_{j+1}`` (the pairs would
  draw ``H_n`` for the last step) and starts from the rollouts the search already ran. The
  wealth is read after each look only (products do not depend on the order, so rollouts run
  in several stages count as they are). The steps are tested in a fixed sequence and the
  stage moves on only past a step ruled out, so every ruled-out claim together errs with
  probability ``≤ ℓ_out`` (the first step whose rescue is ``≥ Δ`` is the only way in,
  whatever the data that led there);
- a later cause: the anytime test that the mean of the pairs is above zero at level ``ℓ_pos``
  per step (``positive_at``), Bonferroni over the ``n − 1 − c`` steps after the confirmed
  step ``c``.

``ℓ_out + (n − 1 − c)·ℓ_pos`` (``OUT_SHARE`` of it to ``ℓ_out``) is what the confirmations
before the one that found ``c`` left of α: they spend ``θα_i`` each (``θ = LOW_SHARE``,
``α_i = α·share_i``), so after the first confirmation the stage has all of α, after the
``m``-th ``α − θα·Σ_{i<m−1} share_i``. The confirmation that found ``c`` need not be paid for
twice: the answer is a conjunction ("``c`` rescues more than nothing" and "every later step
rescues less than ``Δ``"), and in any one world at most one of the two can be the false one
that matters. Where ``c`` rescues nothing, naming it needs that confirmation's false
rejection (``≤ θα_i``) whatever the stage does; where it rescues something, only the stage
can err (``≤`` its level). An attempt that does not confirm leaves the rest to the next one,
so the error is at most ``α`` in every world (the intersection-union argument,
docs/contrastive-search.md). Naming the locus, listing earlier causes and ruling later steps
out then hold together with family-wise error ``≤ α``: each confirmation's rollouts are
i.i.d. given everything that chose to draw them (fresh indices, independent branches per
index), which is all Ville's inequality needs. A later step's pairs reuse ``H_{j+1}``'s
rollouts from the test that let the stage reach it, which lean towards failure given that it
did; each test is bounded without that conditioning, as a fixed function of the sequence of
outcomes at its indices, which are i.i.d. whatever ran elsewhere (docs/contrastive-search.md,
"Reusing an arm across steps").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from car_core import defaults
from car_core.estimators.confirmation import Confirmation, share
from car_core.estimators.navigation import ArmSource
from car_core.stats.sequential import LOW_SHARE, below_now, pairs_to_show, positive_at

LATER = 3 << 20       # first rollout index of the later steps' rollouts
INDIFFERENCE = defaults.INDIFFERENCE  # Δ
RESERVE = 1 / 3       # of the budget left, what the stage leaves for the re-estimate
HOPELESS_AFTER = 16   # pairs after which a test no budget left could finish is stopped
ARM_ALONE = 0.25      # of Δ, how far from certain failure H_j may be for it to be drawn alone
FIRST_LOOK = 8        # rollouts of H_j seen before the stage plans the look that would end it
OUT_SHARE = 0.75      # of the α the stage has, what ruling out spends (the rest: causes)


@dataclass(frozen=True)
class LaterStep:
    """One later step's test: ``"ruled out"`` (rescue shown below ``Δ``), ``"cause"`` (shown
    above zero) or ``"open"`` (the budget ran out first, or it was never reached). ``pairs``
    and ``mean``: the pairs ``(H_{j+1}, H_j)`` run and their mean; ``rollouts`` and ``fail``:
    ``H_j``'s rollouts and its failure rate, the one-arm test's sample."""

    step: int
    verdict: str
    pairs: int = 0
    mean: float | None = None
    rollouts: int = 0
    fail: float | None = None


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


def spent_by(attempts: int) -> float:
    """The share of α the search's first ``attempts`` confirmations spent: ``θ·Σ share_i``."""
    return LOW_SHARE * sum(share(i) for i in range(attempts))


def levels(alpha: float, n: int, attempts: int = 1, c: int = 0) -> tuple[float, float]:
    """``(ℓ_out, ℓ_pos)`` after ``attempts`` confirmations, the last of which found ``c``:
    ``OUT_SHARE`` of what the ones before it left of α for ruling out (fixed sequence), the
    rest for a later cause, split over the ``n − 1 − c`` steps after ``c`` it could be. The
    last confirmation's own spend is not taken off: where ``c`` rescues nothing only it can
    make the answer wrong, and where ``c`` rescues something only this stage can (module
    docstring). Before, it was taken off, and the stage after a first confirmation had
    ``0.37α`` (``ℓ_out = 0.0139``, 43 all-failing rollouts to rule a step out, against 33 at
    ``0.0375``). Three quarters to ruling out: every answer with a step after its locus needs
    it, and on the simulator's grid it made the claim 3–7% cheaper than half, with later
    causes found as often. ``attempts`` and ``c`` come from rollouts at other indices than
    the stage's, so levels chosen from them are fixed as far as its tests go."""
    spare = (1.0 - spent_by(attempts - 1)) * alpha
    return spare * OUT_SHARE, spare * (1 - OUT_SHARE) / max(n - 1 - c, 1)


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
    spread = max(float(d.var()), 1e-3)
    return (pairs_to_show(delta - (mean - slack), spread, out_level) > reach
            and pairs_to_show(mean + slack, spread, pos_level) > reach)


def _to_cross(gaps: np.ndarray, delta: float, level: float, most: int) -> int:
    """How many more rollouts, every one failing, the one-arm test needs to rule the step out
    (``most + 1`` when more than ``most``): the look that ends it if the arm keeps failing, so
    a server-bound agent waits one round, not a dozen."""
    def crosses(m: int) -> bool:
        return below_now(np.concatenate([gaps, np.zeros(m)]), delta, level)
    if not crosses(most):
        return most + 1
    lo, hi = 0, most  # crosses(hi) holds; find the least such
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if crosses(mid) else (mid + 1, hi)
    return lo


def _in_unit(y: np.ndarray) -> bool:
    """Outcomes in ``[0, 1]``, the range the bound ``rescue ≤ 1 − P(fail | H_j)`` needs."""
    return bool(np.all((y >= 0.0) & (y <= 1.0)))


def _seen(src: ArmSource, j: int, ranges: Sequence[range]) -> np.ndarray:
    parts = [src.outcomes(j, r) for r in ranges if len(r)]
    return np.concatenate(parts) if parts else np.zeros(0)


def check_later(src: ArmSource, c: int, n: int, alpha: float, delta: float = INDIFFERENCE,
                wave: int = 0, attempts: int = 1,
                seen: Mapping[int, Sequence[range]] | None = None,
                reserve: float = RESERVE) -> LaterCheck:
    """Test the steps after ``c`` latest first, until one is a cause or one is left open.
    ``attempts``: the confirmations the search ran (their α is not the stage's); ``seen``:
    rollout indices each arm already ran (the one-arm observations start with them);
    ``reserve``: the share of what is left kept for the re-estimate (none without one)."""
    out_level, pos_level = levels(alpha, n, attempts, c)
    cap = src.remaining - int(src.remaining * reserve)
    verdicts: list[LaterStep] = []
    least_batch = 2 if wave <= 1 else max(2, wave // 2)
    for j in range(n - 1, c, -1):
        start_spent = src.remaining
        y = _seen(src, j, (seen or {}).get(j, ()))
        unit = _in_unit(y)
        gaps = 1.0 - y if unit else np.zeros(0)  # the one-arm observations, 1 − y
        alone = 0                 # H_j's rollouts from LATER taken alone
        d = np.zeros(0)           # then the pairs, from LATER + alone
        crossed, verdict = None, "open"
        while src.remaining >= 1 and cap - (start_spent - src.remaining) >= 1:
            left = cap - (start_spent - src.remaining)
            if unit and not d.size and (not gaps.size
                                        or float(gaps.mean()) <= ARM_ALONE * delta):
                need = _to_cross(gaps, delta, out_level, left)
                if need > left:
                    break  # not even a run of failures could rule it out in this budget
                want = (max(least_batch, FIRST_LOOK - gaps.size) if gaps.size < FIRST_LOOK
                        else max(least_batch, need))
                x = src.outcomes(j, range(LATER, LATER + alone + want))[alone:]
                if not x.size:
                    break  # the budget ran out, or no branch came back
                alone += int(x.size)
                y = np.concatenate([y, x])
                unit = _in_unit(x)
                gaps = np.concatenate([gaps, 1.0 - x]) if unit else np.zeros(0)
                d_now = d
            else:
                want = d.size + max(least_batch, d.size // 8)
                d_now = src.diffs(j + 1, j, range(LATER + alone, LATER + alone + want))
                if d_now.size <= d.size:
                    break
                y = np.concatenate([y, src.outcomes(j, range(LATER + alone + d.size,
                                                              LATER + alone + d_now.size))])
                d = d_now
                crossed = positive_at(d, pos_level / LOW_SHARE)
                if crossed is not None:
                    verdict = "cause"
                    break
            if below_now(np.concatenate([gaps, d_now]), delta, out_level):
                verdict = "ruled out"
                break
            room = (cap - (start_spent - src.remaining)) // 2
            if d.size >= HOPELESS_AFTER and _hopeless(d, delta, out_level, pos_level, room):
                break
        cap -= start_spent - src.remaining
        verdicts.append(LaterStep(j, verdict, int(d.size), float(d.mean()) if d.size else None,
                                  int(y.size), float(y.mean()) if y.size else None))
        if verdict == "cause":
            conf = Confirmation(d, LATER + alone, True, False, crossed)
            return LaterCheck(tuple(verdicts), j, conf, pos_level, delta)
        if verdict == "open":
            verdicts += [LaterStep(k, "open") for k in range(j - 1, c, -1)]
            break
    return LaterCheck(tuple(verdicts), delta=delta)
