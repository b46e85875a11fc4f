"""The oracle the locus grid is held to: it knows the pivot and spends the whole budget on the
two arms around it with one one-sided test at level α, matched to how much noise the arms
share. Its power is computed exactly (no simulation), so its column carries no noise.

- Shared noise (``paired_power``): ``N`` coupled pairs ``(H_{c+1}, H_c)``; a pair disagrees
  upward with probability ``up`` and downward with ``down``; the exact sign test on the
  disagreeing pairs (one-sided McNemar) rejects when the upward ones are improbably many.
- Nothing shared (``fisher_power``): ``N`` independent rollouts of each arm, failure rates
  ``p_hi`` and ``p_lo``; the one-sided Fisher exact test of ``p_hi > p_lo``.

The oracle is what the budget could buy if the pivot were known. ``locating_power`` is the
yardstick for what it buys when it is not: the best of a family of fixed designs that knows
the rates but not the pivot (``locating_power``'s docstring), also exact.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom, hypergeom

LOCATING_HELD = (0.5, 1.0, 2.0)  # held arm's rollouts over an arm's: 1, and these times √n


def paired_power(pairs: int, up: float, down: float, alpha: float) -> float:
    """P(the one-sided exact sign test on ``pairs`` pairs rejects ``rescue <= 0``)."""
    disc = up + down
    if pairs <= 0 or disc <= 0:
        return 0.0
    total = 0.0
    for m in range(1, pairs + 1):
        pm = float(binom.pmf(m, pairs, disc))
        if pm < 1e-15:
            continue
        ks = np.arange(m + 1)
        pval = binom.sf(ks - 1, m, 0.5)           # P(X >= k) under the null of fair signs
        crit = int(ks[pval <= alpha][0]) if np.any(pval <= alpha) else m + 1
        total += pm * float(binom.sf(crit - 1, m, up / disc))
    return total


def fisher_power(n: int, p_hi: float, p_lo: float, alpha: float) -> float:
    """P(the one-sided Fisher test on ``n`` rollouts per arm rejects ``p_hi <= p_lo``).

    Given ``t`` failures in all, the arm ``hi``'s count is hypergeometric under the null; the
    test rejects at ``x_hi >= c_t``, the smallest count whose upper tail is at most α."""
    if n <= 0:
        return 0.0
    xs = np.arange(n + 1)
    crit = np.empty(2 * n + 1, dtype=int)
    for t in range(2 * n + 1):
        tail = hypergeom.sf(xs - 1, 2 * n, t, n)   # P(X_hi >= x | t)
        ok = np.nonzero((tail <= alpha) & (xs <= t))[0]
        crit[t] = int(ok[0]) if ok.size else n + 1
    f_hi = binom.pmf(xs, n, p_hi)
    f_lo = binom.pmf(xs, n, p_lo)
    t = xs[:, None] + xs[None, :]                   # rows: x_hi, columns: x_lo
    reject = xs[:, None] >= crit[t]
    return float((f_hi[:, None] * f_lo[None, :] * reject).sum())


def matched_power(coupling: str, budget: int, rescue: float, flip: float, alpha: float) -> float:
    """The oracle's power at ``budget`` rollouts on a planted desk (``synthetic.PlantedDesk``)
    whose pivot rescues w.p. ``rescue`` behind a judge that errs w.p. ``flip``: paired where the
    branches share the judge's noise too (``"full"``), Fisher where they do not."""
    n = budget // 2
    if coupling == "full":
        # the held arm denies, the resampled one approves w.p. rescue; a shared judge error
        # flips both, so such a pair disagrees the other way
        return paired_power(n, rescue * (1 - flip), rescue * flip, alpha)
    p_hi = 1 - flip
    p_lo = (1 - 2 * flip) * (1 - rescue) + flip
    return fisher_power(n, p_hi, p_lo, alpha)


def fisher_rejects(m: int, m0: int, alpha: float) -> np.ndarray:
    """``R[x, x0]``: whether the one-sided Fisher test rejects "arm fails no less than the
    held arm" when an arm of ``m`` rollouts failed ``x`` times and the held arm of ``m0``
    failed ``x0`` times (given ``t = x + x0`` failures, the held arm's count is
    hypergeometric under the null; reject where its upper tail is at most α)."""
    x = np.arange(m + 1)[:, None]
    x0 = np.arange(m0 + 1)[None, :]
    return np.asarray(hypergeom.sf(x0 - 1, m + m0, x + x0, m0) <= alpha)


def scan_power(n: int, at: int, m: int, m0: int, q_before: float, q_after: float,
                alpha: float, rule: str) -> float:
    """P(a fixed design names ``at``): arms ``H_0 … H_{n−1}`` get ``m`` rollouts each and the
    held arm ``H_n`` ``m0``, all on their own indices; arm ``j`` is tested against the held arm.
    ``"bonferroni"``: every arm at ``α/n``, the latest rejected is named. ``"sequence"``: arms
    in order from ``H_0`` at ``α`` each, the last rejected before the first kept is named
    (a fixed-sequence procedure). Both name a step with no rescue w.p. ``≤ α`` whatever the
    rates. Exact: given the held arm's count the arms are independent."""
    rej = fisher_rejects(m, m0, alpha / n if rule == "bonferroni" else alpha)
    held = binom.pmf(np.arange(m0 + 1), m0, q_after)
    before = binom.pmf(np.arange(m + 1), m, q_before) @ rej   # P(reject | x0), arm <= at
    after = binom.pmf(np.arange(m + 1), m, q_after) @ rej     # P(reject | x0), arm > at
    later = n - 1 - at
    if rule == "bonferroni":
        named = before * (1 - after) ** later
    else:
        named = before ** (at + 1) * ((1 - after) if later else 1.0)
    return float(held @ named)


def locating_power(coupling: str, n: int, budget: int, rescue: float, flip: float,
                   alpha: float) -> tuple[float, str]:
    """The power to name the pivot ``⌊2n/3⌋`` of a planted desk of the best fixed design in a
    family that knows the rates (``rescue``, ``flip``) and the coupling but not the pivot,
    and the design: every arm tested against the held arm at once, by Bonferroni or in fixed
    sequence (``scan_power``), the held arm given 1, ½√n, √n or 2√n times an arm's rollouts
    — and, where every draw is shared (``"full"``), every arm on the same ``budget/(n+1)``
    indices with the exact sign test in fixed sequence. There the arms up to the pivot draw
    alike at an index and those after it copy the held arm, so that design names the pivot
    exactly when its first test rejects at α. Each design names a step with no rescue
    w.p. ``≤ α``, as the search must; an adaptive search can beat them by spending
    where the data point, so this is a yardstick, not a bound."""
    at = (2 * n) // 3
    q_before = (1 - 2 * flip) * (1 - rescue) + flip
    q_after = 1 - flip
    best = (0.0, "none")
    for size in (1.0, *(h * math.sqrt(n) for h in LOCATING_HELD)):
        m = int(budget / (n + size))
        m0 = budget - n * m
        for rule in ("bonferroni", "sequence"):
            power = scan_power(n, at, m, m0, q_before, q_after, alpha, rule)
            if power > best[0]:
                best = (power, f"{rule}, held {m0} : {m}")
    if coupling == "full":
        pairs = budget // (n + 1)
        power = paired_power(pairs, rescue * (1 - flip), rescue * flip, alpha)
        if power > best[0]:
            best = (power, f"paired sequence, {pairs} indices")
    return best
