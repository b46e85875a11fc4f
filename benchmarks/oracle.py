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

The information limit (``told_pivot``, ``pivot_unknown``): no procedure that is wrong w.p.
``≤ δ`` can stop sooner on average than ``T*(μ)·kl(δ, 1 − δ)`` rollouts (Garivier and Kaufmann,
2016), ``1/T*(μ) = sup_w inf_{λ ∈ Alt(μ)} Σ_a w_a KL(μ_a, λ_a)`` over the arms ``H_j`` as
independent Bernoulli arms (nothing shared). ``Alt`` is every law under which the claim is
false; here it is a union of pieces that each move two neighbouring arms, so the inner
infimum is a two-arm problem (``closest``) and the outer one a concave maximisation on the
simplex (``limit``), checked by a dual certificate (``Limit.gap``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq, linprog, minimize
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


# -- the information limit at fixed confidence --------------------------------------------------
def kl(p: float, q: float) -> float:
    """``KL(Bernoulli(p) ‖ Bernoulli(q))``, with ``0·log 0 = 0`` and ``inf`` where ``q`` never
    gives what ``p`` does."""
    def term(a: float, b: float) -> float:
        if a <= 0:
            return 0.0
        return math.inf if b <= 0 else a * math.log(a / b)
    return term(p, q) + term(1 - p, 1 - q)


def kl_slope(p: float, q: float) -> float:
    """``∂KL(p ‖ q)/∂q = (q − p) / (q(1 − q))``, exact at the ends (``±inf`` or 0)."""
    left = 0.0 if p <= 0 else (-math.inf if q <= 0 else -p / q)
    right = 0.0 if p >= 1 else (math.inf if q >= 1 else (1 - p) / (1 - q))
    return left + right


def confidence_cost(delta: float) -> float:
    """``kl(δ, 1 − δ)``: the factor ``T*`` is multiplied by in the bound."""
    return kl(delta, 1 - delta)


@dataclass(frozen=True)
class Piece:
    """A piece of the alternative: the laws in which step ``step`` rescues nothing
    (``at_least`` None: ``λ_{step+1} ≤ λ_step``) or at least ``at_least`` (``λ_{step+1} −
    λ_step ≥ at_least``). It moves only the arms ``step`` and ``step + 1``."""

    step: int
    at_least: float | None = None


_TINY = 1e-12  # added to a weight where it only places λ: keeps λ inside (0, 1), values finite


def closest(mu: np.ndarray, w: np.ndarray, piece: Piece) -> tuple[float, float, float]:
    """``inf_{λ ∈ piece} Σ w_a KL(μ_a, λ_a)`` and the minimising ``(λ_step, λ_{step+1})``.

    No rescue: where ``μ_{j+1} > μ_j`` the two arms meet at their weighted mean (``∂/∂m`` of
    the sum is ``Σ w_a (m − μ_a)/(m(1 − m))``). A rescue of ``Δ``: ``λ_{j+1} = λ_j + Δ`` and
    ``λ_j = x`` solves ``w_j ∂KL(μ_j, x) + w_{j+1} ∂KL(μ_{j+1}, x + Δ) = 0`` on
    ``[μ_{j+1} − Δ, μ_j]`` (clipped to ``[0, 1 − Δ]``), a convex one-dimensional problem."""
    j = piece.step
    a, b = float(mu[j]), float(mu[j + 1])
    wa, wb = float(w[j]) + _TINY, float(w[j + 1]) + _TINY
    if piece.at_least is None:
        if b <= a:
            return 0.0, a, b
        m = (wa * a + wb * b) / (wa + wb)
        lo_lam, hi_lam = m, m
    else:
        step = piece.at_least
        if b - a >= step:
            return 0.0, a, b
        lo, hi = max(0.0, b - step), min(a, 1.0 - step)

        def slope(x: float) -> float:
            return wa * kl_slope(a, x) + wb * kl_slope(b, x + step)

        left, right = max(lo, 1e-300), hi
        if slope(right) <= 0:
            x = right
        elif slope(left) >= 0:
            x = left
        else:
            x = brentq(slope, left, right, xtol=1e-15, rtol=1e-15, maxiter=500)
        lo_lam, hi_lam = x, x + step
    value = w[j] * kl(a, lo_lam) if w[j] > 0 else 0.0
    value += w[j + 1] * kl(b, hi_lam) if w[j + 1] > 0 else 0.0
    return float(value), lo_lam, hi_lam


def _cut(mu: np.ndarray, w: np.ndarray, piece: Piece) -> tuple[float, np.ndarray]:
    """The piece's value at ``w`` and a supergradient: ``KL(μ_a, λ*_a)`` on its two arms.
    ``⟨cut, w'⟩`` bounds the piece's value above at every ``w'`` (``λ*`` is in the piece)."""
    value, lo_lam, hi_lam = closest(mu, w, piece)
    s = np.zeros(mu.size)
    s[piece.step] = kl(float(mu[piece.step]), lo_lam)
    s[piece.step + 1] = kl(float(mu[piece.step + 1]), hi_lam)
    return value, s


@dataclass(frozen=True)
class Limit:
    """``1/T*`` (``rate``) at the weights found, and the certificate's upper bound on it:
    ``upper = max_a Σ_p θ_p KL(μ_a, λ^p_a)`` for alternatives ``λ^p`` in the pieces and a mix
    ``θ``; every ``w`` on the simplex has ``inf_λ Σ w_a KL ≤ Σ_p θ_p Σ_a w_a KL(μ_a, λ^p_a) ≤
    upper``, so ``rate ≤ 1/T* ≤ upper`` and ``gap`` bounds the error."""

    rate: float
    upper: float
    weights: tuple[float, ...]

    @property
    def t_star(self) -> float:
        return 1.0 / self.rate

    @property
    def gap(self) -> float:
        """Relative: ``(upper − rate) / upper``."""
        return (self.upper - self.rate) / self.upper

    def bound(self, delta: float) -> float:
        """``T*·kl(δ, 1 − δ)``: fewer rollouts than this on average cannot be δ-correct."""
        return self.t_star * confidence_cost(delta)


def _lp_over_cuts(cuts: list[np.ndarray], arms: list[int]) -> tuple[float, np.ndarray]:
    """``max_w min_k ⟨cut_k, w⟩`` on the simplex of ``arms``: the value (an upper bound on
    ``1/T*``, each cut bounding its piece above) and the maximising ``w``."""
    m = len(arms)
    a_ub = np.array([np.r_[-c[arms], 1.0] for c in cuts])       # t − ⟨c, w⟩ ≤ 0
    res = linprog(np.r_[np.zeros(m), -1.0], A_ub=a_ub, b_ub=np.zeros(len(cuts)),
                  A_eq=np.r_[np.ones(m), 0.0][None, :], b_eq=[1.0],
                  bounds=[(0, 1)] * m + [(0, None)], method="highs")
    return float(-res.fun), np.asarray(res.x[:m])


def limit(mu: np.ndarray, pieces: list[Piece], tol: float = 1e-9, rounds: int = 300) -> Limit:
    """``sup_w min_p inf_{λ ∈ p} Σ w_a KL(μ_a, λ_a)`` on the simplex of the arms the pieces
    move (a weight on any other arm adds nothing). Each piece's value is concave in ``w`` (an
    infimum of linear functions), so is their minimum: SLSQP on ``max t, t ≤ piece_p(w)``
    with the supergradients as Jacobians, then Kelley's cutting planes until the LP over the
    cuts — whose value is the certificate's ``upper`` — is within ``tol`` of the best value."""
    mu = np.asarray(mu, dtype=float)
    arms = sorted({a for p in pieces for a in (p.step, p.step + 1)})
    m = len(arms)

    def full(z: np.ndarray) -> np.ndarray:
        w = np.zeros(mu.size)
        w[arms] = np.clip(z[:m], 0.0, None)
        return w

    def value(w: np.ndarray) -> float:
        return min(closest(mu, w, p)[0] for p in pieces)

    constraints = [{"type": "eq", "fun": lambda z: np.sum(z[:m]) - 1.0,
                    "jac": lambda z: np.r_[np.ones(m), 0.0]}]
    for p in pieces:
        constraints.append({
            "type": "ineq",
            "fun": lambda z, p=p: closest(mu, full(z), p)[0] - z[m],
            "jac": lambda z, p=p: np.r_[_cut(mu, full(z), p)[1][arms], -1.0]})
    start = np.r_[np.full(m, 1.0 / m), 0.0]
    res = minimize(lambda z: -z[m], start, jac=lambda z: np.r_[np.zeros(m), -1.0],
                   method="SLSQP", bounds=[(0, 1)] * m + [(0, None)],
                   constraints=constraints, options={"maxiter": 500, "ftol": 1e-15})
    best_w = full(res.x)
    best_w /= best_w.sum()
    best = value(best_w)
    cuts = [_cut(mu, best_w, p)[1] for p in pieces]
    upper, w = _lp_over_cuts(cuts, arms)
    for _ in range(rounds):
        if upper - best <= tol * upper:
            break
        w_full = np.zeros(mu.size)
        w_full[arms] = w
        here = value(w_full)
        if here > best:
            best, best_w = here, w_full
        cuts += [_cut(mu, w_full, p)[1] for p in pieces]
        upper, w = _lp_over_cuts(cuts, arms)
    return Limit(best, max(upper, best), tuple(float(x) for x in best_w))


def told_pivot(mu: np.ndarray, c: int) -> Limit:
    """The limit for "step ``c`` rescues more than nothing" (``μ_{c+1} > μ_c``), told ``c``.

    Only the arms ``H_c`` and ``H_{c+1}`` inform the claim; at the best split the two arms
    are equally far from where they meet: ``KL(μ_{c+1}, m) = KL(μ_c, m)``, ``w_{c+1} = (m −
    μ_c)/(μ_{c+1} − μ_c)`` and ``1/T* = KL(μ_c, m)`` (the value's derivative in ``w_{c+1}``
    is ``KL(μ_{c+1}, m) − KL(μ_c, m)``, the envelope theorem). Closed form up to the root."""
    lo, hi = float(mu[c]), float(mu[c + 1])
    if hi <= lo:
        raise ValueError(f"step {c} rescues nothing: H_{c + 1} = {hi} <= H_{c} = {lo}")
    eps = 1e-13 * (hi - lo)
    m = brentq(lambda x: kl(hi, x) - kl(lo, x), lo + eps, hi - eps, xtol=1e-16, rtol=1e-15)
    w = np.zeros(len(mu))
    w[c + 1] = (m - lo) / (hi - lo)
    w[c] = 1 - w[c + 1]
    rate = kl(lo, m)
    # certificate: both arms at m gives the same value at every split of the two arms
    upper = max(kl(lo, m), kl(hi, m))
    return Limit(rate, upper, tuple(float(x) for x in w))


def pivot_unknown(mu: np.ndarray, c: int, delta: float) -> Limit:
    """The limit for the claim the search makes: step ``c`` rescues more than nothing and
    every later step ``j`` less than ``delta``. It is false where ``c`` rescues nothing or a
    later step rescues at least ``delta``: ``1 + (n − 1 − c)`` pieces, ``n = len(mu) − 1``."""
    n = len(mu) - 1
    pieces = [Piece(c)] + [Piece(j, delta) for j in range(c + 1, n)]
    return limit(np.asarray(mu, dtype=float), pieces)
