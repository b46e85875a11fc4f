"""The oracle the locus grid is held to: it knows the pivot and spends the whole budget on the
two arms around it with one one-sided test at level α, matched to how much noise the arms
share. Its power is computed exactly (no simulation), so its column carries no noise.

- Shared noise (``paired_power``): ``N`` coupled pairs ``(H_{c+1}, H_c)``; a pair disagrees
  upward with probability ``up`` and downward with ``down``; the exact sign test on the
  disagreeing pairs (one-sided McNemar) rejects when the upward ones are improbably many.
- Nothing shared (``fisher_power``): ``N`` independent rollouts of each arm, failure rates
  ``p_hi`` and ``p_lo``; the one-sided Fisher exact test of ``p_hi > p_lo``.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import binom, hypergeom


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
