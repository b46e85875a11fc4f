"""Intervals for proportions and their differences that hold at small samples.

Outcomes live in [0, 1]. For 0/1 outcomes the Wilson score interval is the standard small-sample
interval. For fractional scores we use the same formula with the sample mean: a variable in
[0, 1] with mean p has variance at most p(1 − p), so the interval is conservative for them.

Differences: Newcombe's hybrid score interval (1998, method 10) for independent arms; for
coupled arms (common random numbers, the same rollout index in both) the paired version with
the continuity-corrected correlation of the pairs (Newcombe 1998b, method 10). Multiplicity:
Bonferroni — each of ``m`` intervals is built at level ``1 − α/m``, so the chance that any of
them misses is ≤ α.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from car_core.errors import InvalidInput


def check_level(level: float) -> None:
    """Refuse a confidence level outside (0, 1), before anything is spent on it."""
    if not 0.0 < level < 1.0:
        raise InvalidInput(f"confidence level {level} is outside (0, 1)",
                           hint="use e.g. 0.95 (alpha=0.05)")


def z_value(level: float) -> float:
    check_level(level)
    from scipy.stats import norm  # scipy.stats loads at the first estimate, not on import
    return float(norm.ppf(0.5 + level / 2.0))


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (scipy.stats loads at the first estimate, not on import)."""
    from scipy.stats import t as student_t
    return float(student_t.ppf(p, df))


@dataclass(frozen=True, eq=False)
class Interval:
    """A confidence interval and the level it was built at (``level`` 0.95: a 95% interval).

    It reads as the ``(low, high)`` pair it replaces: ``low, high = ci``, ``ci[0]``, and
    ``ci == (low, high)`` all work; two intervals are equal when their levels are too.
    """

    low: float
    high: float
    level: float

    @classmethod
    def of(cls, bounds: Sequence[float] | None, level: float) -> Interval | None:
        """An interval from a ``(low, high)`` pair built at ``level`` (None stays None)."""
        return None if bounds is None else cls(float(bounds[0]), float(bounds[1]), float(level))

    def __iter__(self) -> Iterator[float]:
        return iter((self.low, self.high))

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> float:
        return (self.low, self.high)[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Interval):
            return (self.low, self.high, self.level) == (other.low, other.high, other.level)
        if isinstance(other, (tuple, list)):
            return (self.low, self.high) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.low, self.high))


def wilson(mean: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion (or a [0, 1] mean) from ``n`` samples."""
    if n <= 0:
        raise InvalidInput("an interval needs at least one sample",
                           hint="run at least one rollout")
    z = z_value(level)
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (mean + z2 / (2 * n)) / denom
    half = z * math.sqrt(max(mean * (1 - mean), 0.0) / n + z2 / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _corr(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Newcombe's corrected correlation of the pairs. For 0/1 pairs ``b = n·Σxy − Σx·Σy`` is
    ``ad − bc`` of the 2×2 table; a positive ``b`` is shrunk by ``n/2`` (to 0 if smaller).
    Uncorrected, pairs that never disagree in a sample give φ = 1 and an interval of almost
    no width: 95% intervals then covered 78–84% of the time at n = 6–32. Fractional scores
    use the same formula, which only makes their interval wider."""
    n = len(xs)
    sx, sy = sum(xs), sum(ys)
    b = n * sum(x * y for x, y in zip(xs, ys, strict=False)) - sx * sy
    vx = n * sum(x * x for x in xs) - sx * sx
    vy = n * sum(y * y for y in ys) - sy * sy
    if vx <= 0 or vy <= 0:
        return 0.0
    b = b if b < 0 else max(b - n / 2, 0.0)
    return max(-1.0, min(1.0, b / math.sqrt(vx * vy)))


@dataclass(frozen=True)
class Difference:
    """``a − b`` of two means with its interval."""

    estimate: float
    ci: tuple[float, float]
    level: float
    paired: bool
    n_a: int
    n_b: int

    @property
    def excludes_zero(self) -> bool:
        return self.ci[0] > 0.0 or self.ci[1] < 0.0


def difference(a: Sequence[float], b: Sequence[float], level: float = 0.95,
               paired: bool = False) -> Difference:
    """Newcombe interval for ``mean(a) − mean(b)``; paired when the samples are coupled."""
    if not a or not b:
        raise InvalidInput("a difference needs samples in both arms",
                           hint="run at least one rollout per arm")
    if paired and len(a) != len(b):
        raise InvalidInput("paired samples must have the same length")
    pa, pb = sum(a) / len(a), sum(b) / len(b)
    la, ua = wilson(pa, len(a), level)
    lb, ub = wilson(pb, len(b), level)
    d = pa - pb
    phi = _corr(a, b) if paired else 0.0
    lo_sq = (pa - la) ** 2 - 2 * phi * (pa - la) * (ub - pb) + (ub - pb) ** 2
    hi_sq = (ua - pa) ** 2 - 2 * phi * (ua - pa) * (pb - lb) + (pb - lb) ** 2
    lo = d - math.sqrt(max(lo_sq, 0.0))
    hi = d + math.sqrt(max(hi_sq, 0.0))
    return Difference(d, (max(-1.0, lo), min(1.0, hi)), level, paired, len(a), len(b))


def bonferroni_level(alpha: float, m: int) -> float:
    """Per-interval confidence level so that ``m`` intervals jointly cover with 1 − alpha."""
    if not 0.0 < alpha < 1.0:
        raise InvalidInput(f"alpha={alpha} is outside (0, 1)", hint="use e.g. alpha=0.05")
    return 1.0 - alpha / max(m, 1)


@dataclass(frozen=True)
class MeanInterval:
    """A mean of ``n`` independent replicates with its Student-t interval."""

    estimate: float
    ci: tuple[float, float] | None
    n: int
    sd: float


def t_interval(samples: Sequence[float], level: float = 0.95) -> MeanInterval:
    """Student-t interval for the mean of independent replicates (``ci`` is None for n = 1).

    Used where each replicate is itself an unbiased estimate (a Shapley value from one rollout
    index or one antithetic unit): the spread between replicates then carries every source of
    noise inside them, so the interval needs no model of that noise."""
    n = len(samples)
    if n == 0:
        raise InvalidInput("a mean needs at least one replicate", hint="raise the budget")
    check_level(level)
    mean = sum(samples) / n
    if n == 1:
        return MeanInterval(mean, None, 1, float("nan"))
    sd = math.sqrt(sum((x - mean) ** 2 for x in samples) / (n - 1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return MeanInterval(mean, (mean - half, mean + half), n, sd)


def looks(cap: int, fractions: Sequence[float] = (0.25, 0.5, 1.0)) -> list[int]:
    """Sample sizes at which a group-sequential test looks at its data (distinct, >= 1)."""
    return sorted({max(1, math.ceil(cap * f)) for f in fractions})


def look_levels(sizes: Sequence[int], alpha: float, m: int) -> list[float]:
    """Per-look confidence levels for ``m`` tests that each look at ``sizes``.

    Bonferroni over tests and looks with unequal shares: look ``i`` gets ``alpha/m`` times a
    share proportional to the square of its information fraction, so early looks (which only
    stop clear cases) cost little of the final look's power. The shares sum to one, so all
    intervals of all tests at all looks cover at once with probability ``>= 1 − alpha``."""
    bonferroni_level(alpha, m)  # validates alpha
    weights = [(s / sizes[-1]) ** 2 for s in sizes]
    total = sum(weights)
    return [1.0 - alpha * w / total / max(m, 1) for w in weights]


@dataclass(frozen=True)
class Coupling:
    """How much two arms compared rollout by rollout share their noise, measured from pairs.

    ``estimate`` is the agreement ``1 − |a − b|`` of the pairs above what independent arms with
    the same outcome distributions would give, as a share of the most those distributions
    allow (for 0/1 outcomes the Fréchet bound ``1 − |p_a − p_b|``): 1 when the arms agree
    whenever they can, 0 when they agree as often as independent arms would. ``None`` when no
    comparison could say (an arm that never varied, 0/1 or graded, agrees by its distribution
    alone). ``ci`` carries the Wilson interval of the pooled agreement over, with the
    distributions held at their sample values; ``shared`` then errs on independent arms at
    most ``(1 − level)/2`` of the time (2.5% at 0.95; ``coupling_of``)."""

    estimate: float | None
    ci: tuple[float, float] | None
    pairs: int
    level: float = 0.95

    @property
    def shared(self) -> bool:
        """The pairs show shared noise: their agreement is above independence at ``level``."""
        return self.ci is not None and self.ci[0] > 0.0

    def to_dict(self) -> dict[str, object]:
        return {"estimate": self.estimate, "ci": None if self.ci is None else list(self.ci),
                "pairs": self.pairs, "level": self.level, "shared": self.shared}

    def result_keys(self) -> dict[str, object]:
        """The three keys a result's JSON has always carried it under (its level is not
        stored: ``from_result_keys`` reads it back at 0.95, the level it is measured at)."""
        return {"coupling_measured": self.estimate,
                "coupling_ci": None if self.ci is None else [float(x) for x in self.ci],
                "coupling_pairs": self.pairs}

    @classmethod
    def from_result_keys(cls, row: Mapping[str, Any]) -> Coupling:
        """What ``result_keys`` wrote; a result stored before coupling was measured reads as
        nothing measured."""
        ci = row.get("coupling_ci")
        return cls(row.get("coupling_measured"),
                   None if ci is None else (float(ci[0]), float(ci[1])),
                   int(row.get("coupling_pairs") or 0))


NOT_MEASURED = Coupling(None, None, 0)


class CouplingNumbers:
    """A result's ``measured_coupling`` read by the names results used before they held a
    ``Coupling`` (``coupling_measured``, ``coupling_ci``, ``coupling_pairs``); kept for one
    release: read ``measured_coupling`` instead."""

    measured_coupling: Coupling

    @property
    def coupling_measured(self) -> float | None:
        return self.measured_coupling.estimate

    @property
    def coupling_ci(self) -> Interval | None:
        return Interval.of(self.measured_coupling.ci, self.measured_coupling.level)

    @property
    def coupling_pairs(self) -> int:
        return self.measured_coupling.pairs


def _cross_gap(a: Sequence[float], b: Sequence[float]) -> float:
    """The mean of ``|a_i − b_j|`` over every pair ``(i, j)``: the gap of the two arms were they
    independent with their sample distributions (sorting makes it ``O(s log s)``)."""
    bs = sorted(b)
    prefix = [0.0]
    for y in bs:
        prefix.append(prefix[-1] + y)
    total, n = 0.0, len(bs)
    for x in a:
        k = bisect.bisect_right(bs, x)
        total += x * k - prefix[k] + (prefix[n] - prefix[k]) - x * (n - k)
    return total / (len(a) * n)


def _sorted_gap(a: Sequence[float], b: Sequence[float]) -> float:
    """The mean of ``|a_(i) − b_(i)|`` of the sorted arms: the least mean gap any pairing of
    the two samples allows (the comonotone one; Wasserstein-1 of their distributions)."""
    return sum(abs(x - y) for x, y in zip(sorted(a), sorted(b), strict=True)) / len(a)


def _unit_scale(a: list[float], b: list[float]) -> tuple[list[float], list[float]]:
    """Both arms mapped by one affine map onto ``[0, 1]``, their lowest score to 0 and their
    highest to 1 (0/1 outcomes that both occur stay as they are). The estimate does not change
    (agreement, independence and room all scale alike), but the Wilson interval, whose spread
    ``m(1 − m)`` is that of a 0/1 variable, then fits two-valued scores exactly: a judge that
    says 0.1/0.9 is measured as one that says 0/1, not as one whose pairs never disagree by
    more than 0.8. The map depends on the two samples' values, not on how they pair, so under
    independent arms every pairing of them stays equally likely."""
    lo, hi = min(min(a), min(b)), max(max(a), max(b))
    if hi - lo <= 0.0 or (lo == 0.0 and hi == 1.0):
        return a, b
    return [(x - lo) / (hi - lo) for x in a], [(y - lo) / (hi - lo) for y in b]


def _baselines(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """``(free, most)``: the mean agreement ``1 − |a − b|`` that independent arms with these
    samples' distributions give, and the most any pairing of them allows.

    For 0/1 outcomes these are ``p_a·p_b + (1 − p_a)(1 − p_b)`` and the Fréchet bound
    ``1 − |p_a − p_b|`` (computed so). Graded scores need the general form: the 0/1 formulas
    read a score's mean as a pass rate, which for scores such as 0.1/0.9 puts the independent
    agreement too low, and for an arm that always scored 0.9 leaves room above it, so
    independent arms were measured as sharing noise (a user trial: ``1.00 [0.18, 1.00]``). In
    the general form an arm that never varied leaves no room (every pairing agrees alike)."""
    s = len(a)
    if all(x in (0.0, 1.0) for x in a) and all(y in (0.0, 1.0) for y in b):
        pa, pb = sum(a) / s, sum(b) / s
        return pa * pb + (1 - pa) * (1 - pb), 1 - abs(pa - pb)
    return 1 - _cross_gap(a, b), 1 - _sorted_gap(a, b)


def coupling_of(comparisons: Sequence[tuple[Sequence[float], Sequence[float]]],
                level: float = 0.95) -> Coupling:
    """The ``Coupling`` pooled over comparisons of index-paired outcomes ``(a[r], b[r])``.

    Each comparison adds its pairs' agreement ``1 − |a − b|``, the agreement independent arms
    with its two samples' distributions would give (the mean over every cross pair ``(a[i],
    b[j])``; for 0/1 outcomes ``p_a·p_b + (1 − p_a)(1 − p_b)``), and the most those
    distributions allow (the sorted pairing; for 0/1 the Fréchet bound ``1 − |p_a − p_b|``);
    the estimate is the pooled excess over the pooled room. Comparisons whose samples leave no
    room (an arm that never varied, whatever its score) say nothing about coupling and are
    left out.

    ``shared`` (the interval's lower end above independence) is a one-sided test at
    ``(1 − level)/2``: under independent arms the pooled excess has mean zero (every cross
    pair is distributed as a rollout pair) and a variance the Wilson interval's ``m(1 − m)``
    bounds for agreements in ``[0, 1]``, 0/1 or graded (``tests/test_coupling_graded.py``
    checks the rate on planted independent arms)."""
    check_level(level)
    agree = indep = room = 0.0
    pairs = 0
    for a_raw, b_raw in comparisons:
        a, b = [float(x) for x in a_raw], [float(y) for y in b_raw]
        s = min(len(a), len(b))
        if s < 2:
            continue
        a, b = _unit_scale(a[:s], b[:s])
        free, most = _baselines(a, b)
        if most - free <= 1e-9:
            continue
        agree += sum(1 - abs(x - y) for x, y in zip(a, b, strict=True))
        indep += s * free
        room += s * (most - free)
        pairs += s
    if pairs == 0:
        return Coupling(None, None, 0, level)
    low, high = wilson(agree / pairs, pairs, level)
    def scale(x: float) -> float:
        return max(-1.0, min(1.0, (x * pairs - indep) / room))
    return Coupling(scale(agree / pairs), (scale(low), scale(high)), pairs, level)
