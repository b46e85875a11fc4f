"""Where the contrastive budget goes: search the ``H`` curve, confirm a step, re-estimate it.

The locus is the latest rise of ``H`` (``H_j`` holds steps ``< j``): every arm after it equals
``H_n``, so it is the largest ``j`` with ``H_j ≠ H_n``. The search works on an ``ArmSource``
(arms by rollout index) so that the engine and a vectorised simulator of the planted models
run the same decisions.

1. Gate. Pairs ``(H_n, H_0)`` on navigation indices until one more pair is up than down (or
   the gate's share of the budget is spent): no rise, nothing to follow ("no cause"). The
   indices where the two disagreed are the witnesses.
2. Coupling, measured. How often index-paired arms agree beyond what independent arms with
   the same rates would (``stats.coupling_of``), on the gate's pairs and every probe's pairs
   with ``H_0`` and ``H_n`` on navigation indices. It decides which navigation statistics are
   used; no adapter flag does. The confirmation's pairs are added for the re-estimate's
   interval (paired or not) and for the reported number: both come after them.
3. Navigation. Where the noise is measured shared (or a probe copied ``H_0`` at every witness
   index), a bisection over ``[lo, hi)`` with ``H_lo`` below and ``H_hi`` level with ``H_n``:
   each ``mid`` is first looked at on a few gate indices, witnesses among them
   (``Witnesses``): an arm before the rise draws what ``H_0`` drew there and one after it
   what ``H_n`` drew, so a probe that matches one of them index by index is placed at once
   (no longer once a probe has matched neither: the noise is then only partly shared, and
   chance matches mislead); else a truncated sequential probability ratio test on the signs
   of the pairs ``(H_n, H_mid)`` with error ``NAV_ERROR`` each way. Where it is not shared,
   index pairs carry nothing, and a probabilistic bisection (``Navigator.locate``) works on
   the arms' own outcomes: under one rise, arms up to the locus fail at one rate and later arms at
   another, which gives a posterior over the locus; the arm whose next outcome tells most
   about it is run, a few rollouts at a time, until one step holds ``1 − LOCATE_ERROR`` of
   it or the navigation's share of the budget is spent.
4. Confirmation of the candidate ``c = lo`` on rollout indices no earlier stage used: the pairs
   ``(H_{c+1}, H_c)`` feed the anytime betting test of ``sequential.positive_at`` at level
   ``α_i``, looked at after every batch, until it shows the rescue positive, the budget is
   spent (then pass/fail pairs get the exact sign test of ``sequential.positive_by_end`` with
   what is left of ``α_i``), or a futility bound gives the candidate up: the likelihood ratio
   of "no rise" against a rise reaches ``FUTILITY``, where the rise is the one the navigation
   measured or — while the pairs show a net rise, or the gate's rise rests on fewer than
   ``GATE_MIN`` pairs — whichever fits better of it and the best-fitting rise no smaller than
   the least the whole budget could show (``_least_rise``) and never below ``LEAST_RISE``
   (``_futility_rise``). A gate stopped at its first net rise sizes the rise high, and a true
   weak rise would look level against that alone; against the budget's least rise alone,
   which shrinks as the budget grows, pairs that disagree by noise fit it nearly as well as
   no rise, so a level candidate kept the whole budget at any size; against ``LEAST_RISE``
   level pairs (each sign w.p. ``q ≤ 1/4``) are given up within about 690 pairs whatever the
   budget. Or the locus posterior with these pairs' arms added puts less than
   ``FUTILITY_BELIEF`` on the candidate, asked while the coupling, measured with the
   confirmation's pairs too, neither shows shared noise nor reaches ``PAIRED_COUPLING``
   (``Navigator.doubts``: a few navigation pairs that agree by chance do not switch it off for
   the whole confirmation). A candidate given up adds its arms' outcomes to
   what the navigation knows, and the search resumes with doubled caps and halved errors and
   the witness shortcuts off, while the budget lasts; before each resume the gate is
   extended, and a gate that no longer shows a rise ends the search ("no cause").
5. Re-estimate. After the locus is decided the rescue is re-estimated with fresh rollouts,
   as many as give a variance at most the paper's fixed-``K`` one (``K`` rollouts of the
   resampled arm against a fixed factual baseline) over ``REFIT_MARGIN``, or what the budget
   has left. They are paired (both arms on the same indices) or unpaired (each arm on its own
   indices, split in Neyman proportion to the arms' spread), whichever the confirmation's
   pairs say has the smaller variance per rollout: a factual arm that always fails needs few
   rollouts of its own. The confirmation's pairs are pooled with them (``_pooled_pairs``), all
   but the pair that crossed the anytime boundary: the mean of a sequence stopped at a
   crossing is biased up, mostly by the pair that made it cross (for a stop at the ``k``-th
   success, ``(k − 1)/(n − 1)``, the rate without the last draw, is the unbiased estimate),
   and the sum of the pairs before a stop is not biased (Wald's identity; pairs after the
   crossing in the same batch were drawn whatever it showed), so what is left is
   nearly unbiased and the fresh rollouts no longer carry the estimate alone. Measured on the
   simulator's 4- and 8-step grid rows (``benchmarks/estimators.py``'s ``pooling``, 300 seeds
   a row, the same decisions): the median error is lower than the fresh rollouts' alone on 28
   of 30 rows and the half-width 13–40% narrower, the mean error within ±0.016 of the truth
   where at least 60% of seeds re-estimate the pivot; where at most 40% do, those are the
   seeds whose test pairs ran lucky, and the pooled estimate sits 0.03–0.11 above the truth
   (fresh alone: −0.01 to +0.05), its interval still covering it in 94–100% of them but one
   row (83% of 12 seeds). The reported effect is the difference of the pooled sample's means and the
   interval its Newcombe interval at ``1 − α`` (paired or not), whose lower end is raised to
   zero when the step is confirmed; the effect lies inside it by construction. Without a
   re-estimate the interval is the betting confidence sequence of the confirmation's pairs,
   widened to hold their mean.

Rounds (``wave = W > 1``). Every look waits for the rollouts it asked for, so where branches
wait on a model server the wall time is the number of looks in a row times a branch's
latency, however many branches the executor could run at once. In rounds each look asks for
about ``W`` rollouts: the gate grows ``W/4`` pairs a look (and sizes the rise in one), a
paired decision and the confirmation look after ``W/2`` pairs at least, the unshared search
runs ``W/4`` rollouts of its most telling arm a look (and ``H_0``, ``H_n``'s top-up with them;
never past the navigation's share), the bisection's first levels are probed on the witness
indices at once (``Navigator._probe_ahead``: ``side`` reads them back, its verdicts those of
probes drawn one by one), and an unpaired re-estimate draws both arms together. Sources
that can, draw a round's arms in one hand-off (``draw``). What it costs is the part of a
round drawn past where a smaller look would have stopped. Measured on the simulator's grid
(``benchmarks/estimators.py``'s 45 rows of 4, 8 and 24 steps, 30 seeds a row, ``W = 16``):
1.5–3× fewer rounds (6–90 a row against 11–216), −15 to +28 rollouts a seed spent before the
answer is decided, the pivot named in 1095 seeds of 1350 against 1104 and another step in 3
against 3; on the rows where the budget runs out, over more seeds, 3 points lower to 1
higher (six 4- and 8-step rows, 200 seeds) and 1 and 8 points lower (24 steps, rescue 0.15,
a judge that errs 10% of the time, 100 seeds). ``W ≤ 1`` is the smallest looks above,
unchanged.

Error control (FWER ≤ α). A step is named only by a confirmation. Confirmation ``i`` spends
``α_i = α · share_i`` with ``Σ share_i ≤ 1`` (``FIRST_SHARE`` for the first, half the rest for
each later one). Everything that chooses the ``i``-th candidate, its level and the prior of its
bets — navigation rollouts, the measured coupling, earlier confirmations — is a function of
rollouts at other indices, and the rollouts of confirmation ``i`` are independent of them. So
conditionally on that history its pairs are i.i.d. with mean equal to the candidate's true
rescue. If that rescue is ``≤ 0``, the betting wealth is a non-negative supermartingale and by
Ville's inequality the anytime test ever crosses ``1/(θα_i)`` with probability ``≤ θα_i``
however often it looks; for pass/fail outcomes the signs of the disagreeing pairs are then
coins with ``P(up) ≤ 1/2`` (this holds for any coupling: ``P(+) ≤ P(−)`` is what a mean
``≤ 0`` says), so the probability that the anytime boundary is crossed or the end-of-sampling
count reaches its critical value is held at ``θα_i`` exactly (``sequential``). The futility
bound (whatever rise it weighs, whatever posterior it consults) only ever stops a test
without rejecting, and the end-of-sampling test runs only at the horizon the budget fixed
before the confirmation's pairs were drawn, so its rejections are a subset of the test run to
that horizon. A futility stop gives a candidate up and names nothing, so it cannot raise the
chance of naming a step: however often it fires, on whatever it looks at (the floor
``LEAST_RISE``, the coupling measured with the confirmation's own pairs), the event "the
confirmation rejected" is contained in "the test run without futility rejected". What comes
after a stop (the next candidate and its α share) is chosen from rollouts at other indices
than the next confirmation's, as above. The re-estimate comes after the step is named and
names nothing. The look schedule (``wave``) is fixed before the search starts, and a round
draws only at the indices of the stage that asks (navigation below ``CONFIRM``, the
confirmation from its ``start``, the re-estimate from ``REFIT``), so none of the above
depends on it: the betting test holds at any looks, a larger last batch only adds pairs drawn
whatever the crossing showed, and the end-of-sampling horizon is still what the budget left
when the confirmation began. By the union bound over confirmations the chance of naming any
step whose rescue is ``≤ 0`` is ``≤ Σ θα_i < α``; navigation mistakes and a mis-measured
coupling cost power, never validity. Without shared noise the index pairs are an arbitrary
pairing of two independent samples; the sign test on them conditions on the disagreeing pairs as the
two-sample test conditions on the pooled margin, and has the same efficiency as the one-sided
Fisher test.

A resume with a larger budget (the continue hint) is another look, not a continuation of this
one: the budget sizes the gate, the navigation's share, the least rise and the end-of-sampling
horizon, so the search runs again under it, reading back the stored rollouts it asks for.
Each look is a level-``α`` procedure on its own (its rollouts, stored or new, have the law of
fresh ones), so attributing and then resuming ``L`` times names a step whose rescue is ``≤ 0``
with probability ``≤ (L + 1)·α`` by the union bound; the README gives the measured rate of one
resume. Keeping ``α`` over looks would mean a first look at less than ``α``: at ``0.04``
instead of ``0.05`` the first look lost up to 12 points of power on the simulator's grid rows
(4 steps, rescue 0.15, shared noise: 90% → 79% of 200 seeds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from car_core.stats import Coupling, coupling_of, difference
from car_core.stats.sequential import (
    LOW_SHARE,
    ConfidenceSequence,
    Prior,
    confidence_sequence,
    positive_at,
    positive_by_end,
)

GATE_NET = 4          # net positive pairs that size a rise for the sequential probes
GATE_MIN = 12         # pairs the gate runs at least before it sizes a rise
NAV_SHARE = 0.45      # of the budget, the most the gate and the first bisection may spend
NAV_ERROR = 0.01      # error each way of one bisection decision
LOCATE_ERROR = 0.1    # posterior mass off the best step at which the unshared search stops
NAV_BATCH = 2         # pairs (or one arm's rollouts) per look during navigation
PROBE = 4             # gate indices a probe looks at first (its witnesses among them)
PAIRED_COUPLING = 0.5  # measured coupling above which index pairs navigate (else locate)
PROBE_WITNESSES = 1   # disagreeing gate pairs a probe needs before it may decide on them
FIRST_SHARE = 0.8     # of α, what the first confirmation spends; each later one half the rest
FUTILITY = 1000.0     # likelihood ratio "no rise" : "the gate's rise" that gives a candidate up
FUTILITY_BELIEF = 0.03  # locus posterior below which a candidate is given up (unshared noise)
FUTILITY_MIN = 12     # pairs a confirmation runs before it may be given up
FUTILITY_RISE = 0.75  # of the rise the navigation saw, the one futility weighs against
LEAST_RISE = 0.1      # the least rise futility weighs against, whatever the budget
CONFIRM = 1 << 20     # first rollout index of the confirmation pairs
REFIT = 2 << 20       # first rollout index of the re-estimate


class ArmSource(Protocol):
    """Arms by rollout index, run on demand under one rollout budget."""

    def outcomes(self, arm: int, indices: Sequence[int]) -> np.ndarray:
        """``y_arm[r]`` for the longest prefix of ``indices`` the arm reaches (missing
        rollouts are run first, as far as the budget allows)."""

    def diffs(self, hi: int, lo: int, indices: Sequence[int]) -> np.ndarray:
        """``y_hi[r] − y_lo[r]`` for the longest prefix of ``indices`` both arms reach
        (missing rollouts are run first, as far as the budget allows)."""

    def means(self, hi: int, lo: int, indices: Sequence[int]) -> tuple[float, float]:
        """The two arms' means on those indices."""

    @property
    def remaining(self) -> int:
        """Rollouts the budget still allows."""


def _draw(src: ArmSource, wants: dict[int, Sequence[int]]) -> None:
    """Run the missing rollouts of several arms as one round: a source that waits on its
    branches (the engine) offers ``draw(wants)`` and hands them to its executor at once; any
    other is asked arm by arm. Either way the rollouts run are those the budget reaches in
    rollout-index order, arms interleaved at each index (as the engine's ``draw`` fills them)."""
    draw = getattr(src, "draw", None)
    if callable(draw):
        draw(wants)
        return
    if sum(len(w) for w in wants.values()) <= src.remaining:
        for arm, idx in sorted(wants.items()):
            src.outcomes(arm, idx)
        return
    for r in sorted({r for w in wants.values() for r in w}):
        for arm in sorted(wants):
            if src.remaining < 1:
                return
            if r in wants[arm]:
                src.outcomes(arm, [r])


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
    coupling: Coupling = field(default_factory=lambda: Coupling(None, None, 0))
    given_up: tuple[int, ...] = ()  # candidates a futility bound gave up, in order
    level: float | None = None      # the α_i the deciding confirmation spent
    more_pairs: int | None = None   # undecided: pairs a confirmation would still need, roughly
    estimate: float | None = None   # the reported effect (inside ``interval`` by construction)
    refit_held: float | None = None      # P(fail) of the re-estimate's pairs, held and
    refit_resampled: float | None = None  # re-drawn: ``estimate`` is their difference
    refit_pooled: int = 0  # of the re-estimate's pairs, those the confirmation ran

    @property
    def more_rollouts(self) -> int | None:
        """Undecided: the rollouts a confirmation would still need, roughly (two a pair)."""
        return None if self.more_pairs is None else 2 * self.more_pairs


def _counts(d: np.ndarray) -> tuple[int, int]:
    return int((d > 0).sum()), int((d < 0).sum())


def share(attempt: int) -> float:
    """The share of α confirmation ``attempt`` (0-based) may spend; they sum to at most 1."""
    if attempt == 0:
        return FIRST_SHARE
    return (1.0 - FIRST_SHARE) * 0.5 ** attempt


def _gate(src: ArmSource, n: int, net: int, cap: int, d: np.ndarray, least: int = 0,
          step: int = 4) -> np.ndarray:
    """Pairs ``(H_n, H_0)`` on navigation indices from 0, extended ``step`` at a time until
    their net count of positive pairs reaches ``net`` (and ``least`` pairs are run) or ``cap``
    pairs (or the budget) are spent."""
    s = d.size
    while (s < cap and (int(np.sign(d).sum()) < net or s < least)
           and src.remaining >= 2):
        s = min(cap, s + step)
        d = src.diffs(n, 0, range(s))
        if d.size < s:  # the budget ran out, or no branch came back
            break
    return d


def _rise(d_gate: np.ndarray) -> tuple[float, float]:
    """The size ``δ`` of the rise and the rate ``q`` of pairs that disagree by noise."""
    pos, neg = _counts(d_gate)
    s = max(d_gate.size, 1)
    q = (neg + 0.5) / (s + 1)
    return max(min((pos - neg) / s, 1 - 2 * q - 1e-3), 1e-3), q


def _gate_signs(d_gate: np.ndarray) -> tuple[float, float]:
    """The gate's rates of up and down pairs, smoothed away from 0 and 1."""
    pos, neg = _counts(d_gate)
    s = d_gate.size
    return (pos + 0.5) / (s + 1.5), (neg + 0.5) / (s + 1.5)


def _decide_paired(src: ArmSource, n: int, mid: int, delta: float, q: float, cap: int,
                   error: float, batch: int = NAV_BATCH) -> tuple[bool, int]:
    """True when ``H_mid`` is below ``H_n``, from the signs of the pairs ``(H_n, H_mid)``:
    "level" (each sign w.p. ``q``) against "below" (``+`` w.p. ``q + δ``), looked at every
    ``batch`` pairs."""
    bound = math.log((1 - error) / error)
    up = math.log((q + delta) / q)
    flat = math.log((1 - 2 * q - delta) / (1 - 2 * q))
    t, llr = 0, 0.0
    while True:
        want = min(cap, t + batch)
        if want <= t or src.remaining < 2:
            return llr > 0, t
        d = src.diffs(n, mid, range(want))
        pos, _ = _counts(d)
        llr = pos * up + int((d == 0).sum()) * flat
        if d.size < want or llr >= bound or llr <= -bound or want >= cap:
            return llr > 0, d.size
        t = want


@dataclass
class Witnesses:
    """Gate indices where ``H_n`` and ``H_0`` disagreed, and some where they agreed.

    Under shared noise an arm before the rise draws, rollout by rollout, what ``H_0`` drew and
    an arm after it what ``H_n`` drew; then one look at these indices places a probe. Arms that
    share less noise agree by chance too, which would make every probe look level, so a level
    verdict is taken from them only once some probe agreed with ``H_0`` at every one of them
    (``coupled``): by chance that needs the probe's failures to fall exactly where ``H_0``'s did.
    Partly shared noise (steps that share it, a judge that draws its own) copies a side at a
    few indices often enough to mislead, and then some probe also copies neither side: once one
    has (``mixed``), no verdict is taken from the witnesses again."""

    indices: list[int]
    gate: np.ndarray      # H_n − H_0 at ``indices``
    coupled: bool = False
    mixed: bool = False   # a probe copied neither side: the noise is not wholly shared

    @property
    def trusted(self) -> bool:
        """Every probe so far copied one side and one copied ``H_0``: the noise looks shared."""
        return self.coupled and not self.mixed

    @classmethod
    def of(cls, d_gate: np.ndarray) -> Witnesses:
        split = np.nonzero(d_gate != 0)[0]
        same = np.nonzero(d_gate == 0)[0]
        take = list(split[:PROBE // 2]) + list(same[:PROBE - min(split.size, PROBE // 2)])
        idx = sorted(int(r) for r in take)
        return cls(idx, d_gate[idx])

    def side(self, src: ArmSource, n: int, mid: int) -> bool | None:
        """True (below ``H_n``), False (level) or None (no clear verdict: test it)."""
        if self.mixed or int((self.gate != 0).sum()) < PROBE_WITNESSES:
            return None
        d = src.diffs(n, mid, self.indices)
        if d.size < len(self.indices):
            return None
        if np.array_equal(d, self.gate):
            self.coupled = True
            return True
        if not d.any():
            return False if self.coupled else None
        self.mixed = True
        return None


class Navigator:
    """The navigation stages: the gate, the measured coupling and the bisection decisions,
    all on navigation indices (below ``CONFIRM``)."""

    def __init__(self, src: ArmSource, n: int, budget: int, wave: int = 0) -> None:
        self.src, self.n, self.budget, self.wave = src, n, budget, wave
        self.gate_cap = max(8, int(budget * NAV_SHARE) // 2)
        self.d_gate = np.zeros(0)
        self.witnesses: Witnesses | None = None
        self.reach: dict[int, int] = {}  # probed arm -> navigation indices it ran from 0
        self.extra: dict[int, tuple[float, int]] = {}  # arm -> outcomes seen elsewhere
        self.looked: set[int] = set()  # arms looked at on the witness indices
        self.scale = 1           # caps grow and errors shrink with every resumed search
        self.shortcuts = True    # witness verdicts repeat themselves: off once one misled
        self.sized = False

    @property
    def step(self) -> int:
        """Gate pairs added per look: four, or a quarter of a wave (module docstring)."""
        return 4 if self.wave <= 1 else max(4, self.wave // 4)

    @property
    def batch(self) -> int:
        """Pairs (or one arm's rollouts) per navigation look."""
        return NAV_BATCH if self.wave <= 1 else max(NAV_BATCH, self.wave // 2)

    def gate(self) -> tuple[int, int]:
        self.d_gate = _gate(self.src, self.n, 1, self.gate_cap, self.d_gate, step=self.step)
        self.witnesses = Witnesses.of(self.d_gate)
        return _counts(self.d_gate)

    def regate(self) -> tuple[int, int]:
        """More gate pairs after a candidate was given up; the gate's cap grows with them."""
        self.gate_cap += max(8, self.gate_cap // 2)
        self.d_gate = _gate(self.src, self.n, GATE_NET * self.scale, self.gate_cap,
                            self.d_gate, least=self.d_gate.size + 8, step=self.step)
        return _counts(self.d_gate)

    def coupling(self, more: Sequence[tuple[np.ndarray, np.ndarray]] = ()) -> Coupling:
        """Coupling measured on navigation pairs only: the gate's, and each probe's with
        ``H_0`` and with ``H_n`` where both ran."""
        s = max(self.d_gate.size, min(self.reach.get(0, 0), self.reach.get(self.n, 0)))
        h0 = self.src.outcomes(0, range(max(s, self.reach.get(0, 0))))
        comparisons = [(self.src.outcomes(self.n, range(s)), h0[:s])] if s else []
        for j, reached in sorted(self.reach.items()):
            if j in (0, self.n):
                continue
            m = min(h0.size, reached)
            if m:
                comparisons.append((self.src.outcomes(j, range(m)), h0[:m]))
            m = min(self.reach.get(self.n, 0), reached)
            if m:  # a probe level with H_n copies it where noise is shared
                comparisons.append((self.src.outcomes(j, range(m)),
                                    self.src.outcomes(self.n, range(m))))
        if self.witnesses is not None and self.looked:
            idx = self.witnesses.indices
            h0w = self.src.outcomes(0, idx)
            for j in sorted(self.looked - set(self.reach)):
                y = self.src.outcomes(j, idx)
                comparisons.append((y, h0w[:y.size]))
        comparisons.extend(more)
        return coupling_of([(a.tolist(), b.tolist()) for a, b in comparisons])

    def below(self, mid: int, spent_cap: int) -> bool:
        """Whether ``H_mid`` is below ``H_n`` (the locus is at or after ``mid``)."""
        w = self.witnesses
        if w is not None and self.shortcuts:
            verdict = w.side(self.src, self.n, mid)
            self.looked.add(mid)
            if verdict is not None:  # a level verdict needs the witnesses' own coupling
                return verdict
        if not self.sized:  # the witnesses did not settle it: size the rise first
            least = min(GATE_MIN, self.gate_cap)
            step = self.step if self.wave <= 1 else max(self.step, least - self.d_gate.size)
            self.d_gate = _gate(self.src, self.n, GATE_NET, self.gate_cap, self.d_gate,
                                least=least, step=step)
            self.sized = True
        cap = max(8, spent_cap) * self.scale
        error = NAV_ERROR / self.scale
        # bisection runs only on shared noise (``bisect``): the pairs' signs decide
        verdict, reached = _decide_paired(self.src, self.n, mid, *_rise(self.d_gate), cap,
                                          error, self.batch)
        self.reach[mid] = max(reached, self.reach.get(mid, 0))
        return verdict

    def bisect(self, lo: int, hi: int, nav_budget: int) -> int:
        """The candidate in ``[lo, hi)``: a bisection on shared noise, where index pairs make
        each decision cheap; otherwise the probabilistic bisection of ``locate``."""
        start = self.budget - self.src.remaining
        shared = self.coupling()
        w = self.witnesses
        if self.shortcuts and w is not None and not w.coupled and not w.mixed and hi - lo > 1:
            w.side(self.src, self.n, (lo + hi) // 2)  # one cheap look: do probes copy H_0?
            self.looked.add((lo + hi) // 2)
        if not (shared.shared and (shared.estimate or 0.0) >= PAIRED_COUPLING) \
                and not (w is not None and w.trusted):
            return self.locate(lo, hi, nav_budget)
        if self.wave > 1 and self.shortcuts and w is not None and not w.mixed:
            self._probe_ahead(w, lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            left = max(1, math.ceil(math.log2(hi - lo)))
            per = (nav_budget - (self.budget - self.src.remaining - start)) // left
            lo, hi = (mid, hi) if self.below(mid, per) else (lo, mid)
        return lo

    def _probe_ahead(self, w: Witnesses, lo: int, hi: int) -> None:
        """Rounds (``wave``): the arms the bisection over ``[lo, hi)`` would look at on the
        witness indices in its first levels, as many whole levels as a wave holds, drawn at
        once. ``Witnesses.side`` then reads them back, so its verdicts are the ones it gives
        when each probe is drawn on its own; the probes a verdict sends the bisection away
        from are spent for nothing (at most a wave)."""
        if int((w.gate != 0).sum()) < PROBE_WITNESSES:
            return
        level, arms = [(lo, hi)], list[int]()
        while level:
            mids = [(a + b) // 2 for a, b in level if b - a > 1]
            if not mids or (len(arms) + len(mids)) * len(w.indices) > self.wave:
                break
            arms += mids
            level = [half for a, b in level if b - a > 1
                     for half in ((a, (a + b) // 2), ((a + b) // 2, b))]
        if arms:
            _draw(self.src, {j: w.indices for j in [self.n, *arms]})

    def _arm_counts(self, more: dict[int, tuple[float, int]] | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Failures and rollouts of every arm ``H_0 … H_n`` the navigation has seen."""
        fails, runs = np.zeros(self.n + 1), np.zeros(self.n + 1)
        s = self.d_gate.size
        reach = dict(self.reach)
        reach[0] = max(reach.get(0, 0), s)
        reach[self.n] = max(reach.get(self.n, 0), s)
        for j, m in reach.items():
            y = self.src.outcomes(j, range(m)) if m else np.zeros(0)
            fails[j] += float(y.sum())
            runs[j] += y.size
        for extra in (self.extra, more or {}):
            for j, (f, r) in extra.items():
                fails[j] += f
                runs[j] += r
        return fails, runs

    def posterior(self, lo: int, hi: int, more: dict[int, tuple[float, int]] | None = None
                  ) -> np.ndarray:
        """P(locus = c | every arm's outcomes) for ``c`` in ``[lo, hi)``, under one rise: arms
        ``≤ c`` fail at one unknown rate, arms ``> c`` at another (Jeffreys priors), the locus
        uniform. Arms are taken as independent samples, which is what unshared noise gives."""
        from scipy.special import betaln  # scipy loads with the first estimate, not on import
        fails, runs = self._arm_counts(more)
        cf, cr = np.cumsum(fails), np.cumsum(runs)
        c = np.arange(lo, hi)
        f_lo, r_lo = cf[c], cr[c]
        f_hi, r_hi = cf[-1] - f_lo, cr[-1] - r_lo
        ll = (betaln(0.5 + f_lo, 0.5 + r_lo - f_lo) + betaln(0.5 + f_hi, 0.5 + r_hi - f_hi))
        # one rise, upwards: a split whose early arms fail more than its late ones is penalised
        wrong = (f_lo + 0.5) / (r_lo + 1) > (f_hi + 0.5) / (r_hi + 1)
        ll = ll - np.where(wrong, 5.0, 0.0)
        w = np.exp(ll - ll.max())
        return np.asarray(w / w.sum())

    def locate(self, lo: int, hi: int, nav_budget: int) -> int:
        """Probabilistic bisection: run the arm that splits the posterior of the locus in half,
        a few rollouts at a time, until one step holds ``1 − LOCATE_ERROR`` of it or the
        navigation budget is spent; the most probable step is the candidate."""
        if hi - lo <= 1:
            return lo
        start = self.budget - self.src.remaining
        # a wrong candidate costs a confirmation that the futility bound cuts short, while
        # certainty costs rollouts every confirmation needs: stop at a looser posterior
        error = LOCATE_ERROR / self.scale
        while True:
            post = self.posterior(lo, hi)
            best = int(np.argmax(post))
            spent = self.budget - self.src.remaining - start
            if post[best] >= 1 - error or spent >= nav_budget or self.src.remaining < 1:
                return lo + best
            if self.wave > 1:
                if not self._locate_round(lo, hi, post, lo + best, nav_budget - spent):
                    return lo + best
                continue
            j = self._most_telling(lo, hi, post, lo + best)
            m = self.reach.get(j, 0)
            y = self.src.outcomes(j, range(m + NAV_BATCH))
            if y.size <= m:
                return lo + best
            self.reach[j] = int(y.size)
            for end in (0, self.n):  # the two rates every split leans on stay as well known
                have = max(self.reach.get(end, 0), self.d_gate.size)
                if 2 * have < y.size and self.src.remaining >= 1:
                    self.reach[end] = int(self.src.outcomes(end, range(y.size // 2)).size)

    def _locate_round(self, lo: int, hi: int, post: np.ndarray, best: int, room: int) -> bool:
        """One look of ``locate`` in rounds (``wave``): the most telling arm gets a quarter of
        a wave (no more than the navigation has left; larger looks lost power where the budget
        runs out), and ``H_0`` and ``H_n`` their top-up, drawn
        at once. False when the arm did not grow (the budget is spent)."""
        j = self._most_telling(lo, hi, post, best)
        m = self.reach.get(j, 0)
        wants: dict[int, Sequence[int]] = {
            j: range(m + max(NAV_BATCH, min(self.wave, room) // 4))}
        top = len(wants[j])
        for end in (0, self.n):  # the two rates every split leans on stay as well known
            if 2 * max(self.reach.get(end, 0), self.d_gate.size) < top:
                wants[end] = range(top // 2)
        _draw(self.src, wants)
        for arm, idx in wants.items():  # read back what was drawn (nothing more runs)
            self.reach[arm] = max(self.reach.get(arm, 0), int(self.src.outcomes(arm, idx).size))
        return self.reach[j] > m

    def split_rates(self, c: int) -> tuple[float, float]:
        """The failure rates of the arms after ``c`` and of those up to it, as seen."""
        fails, runs = self._arm_counts()
        high = (fails[c + 1:].sum() + 0.5) / (runs[c + 1:].sum() + 1)
        low = (fails[:c + 1].sum() + 0.5) / (runs[:c + 1].sum() + 1)
        return float(high), float(min(low, high))

    def _most_telling(self, lo: int, hi: int, post: np.ndarray, best: int) -> int:
        """The arm in ``(lo, hi)`` whose next outcome tells most about the locus: arm ``j``
        fails at the low rate when the locus is at or after ``j`` and at the high one before
        it, so one outcome carries ``h(mix) − E h(rate)`` about which (``h``: binary entropy)."""
        high, low = self.split_rates(best)
        def h(p: np.ndarray | float) -> np.ndarray:
            q = np.clip(p, 1e-9, 1 - 1e-9)
            return np.asarray(-(q * np.log(q) + (1 - q) * np.log(1 - q)))
        arms = np.arange(lo + 1, hi)
        p_low = np.array([post[j - lo:].sum() for j in arms])  # P(locus >= j)
        mix = p_low * low + (1 - p_low) * high
        gain = h(mix) - (p_low * h(low) + (1 - p_low) * h(high))
        return int(arms[int(np.argmax(gain))])

    def doubts(self, c: int) -> Callable[[int, int], bool]:
        """Whether the locus posterior, given a confirmation's pairs of ``c`` so far, puts
        less than ``FUTILITY_BELIEF`` on ``c``: the arms say the rise is elsewhere. Not asked
        while the coupling, measured with these pairs too, shows shared noise or estimates it
        at ``PAIRED_COUPLING`` or more: the posterior takes the arms as independent samples
        (on shared noise it gave true weak rises up), and index pairs already weigh a shared
        rise. The confirmation's pairs are in that measurement so that a few navigation pairs
        that agreed by chance (one probe copying ``H_0`` at four witness indices) do not
        switch the check off for the whole confirmation."""
        def unlikely(start: int, pairs: int) -> bool:
            idx = range(start, start + pairs)
            seen = (self.src.outcomes(c + 1, idx), self.src.outcomes(c, idx))
            measured = self.coupling([seen])
            if measured.shared or (measured.estimate or 0.0) >= PAIRED_COUPLING:
                return False
            more = {arm: (float(y.sum()), int(y.size)) for arm, y in zip((c + 1, c), seen,
                                                                          strict=True)}
            return bool(self.posterior(0, self.n, more)[c] < FUTILITY_BELIEF)
        return unlikely

    def learn(self, arm: int, ys: np.ndarray) -> None:
        """Outcomes of ``arm`` seen outside the navigation indices (a given-up confirmation)."""
        f, r = self.extra.get(arm, (0.0, 0))
        self.extra[arm] = (f + float(ys.sum()), r + int(ys.size))


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


def _futility_llr(d: np.ndarray, rise: tuple[float, float], least: float = 0.0,
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
    pos, neg = _counts(d)
    zero = int(d.size) - pos - neg
    tie = (pos + neg) / (2 * max(d.size, 1))
    null = _trinomial_ll(pos, neg, zero, tie, tie)
    alt = _trinomial_ll(pos, neg, zero, *rise)
    if least > 0 and (pos > neg or guessed):
        alt = max(alt, _fitted_rise_ll(pos, neg, zero, least))
    return alt - null


@dataclass
class Confirmation:
    d: np.ndarray
    start: int
    found: bool
    futile: bool
    crossed: int | None = None  # pairs after which the anytime test crossed its boundary


def _confirm(src: ArmSource, c: int, start: int, alpha: float, prior: Prior,
             rise: tuple[float, float], unlikely: Callable[[int, int], bool] | None = None,
             least: float = 0.0, guessed: bool = False, wave: int = 0) -> Confirmation:
    """Confirmation of ``c`` on pairs from ``start`` (module docstring, step 4), looked at
    after every batch: an eighth of the pairs so far, at least two (at least half a ``wave``
    in rounds). ``unlikely(start, pairs)``: a second futility bound, the navigation's belief
    in ``c`` once these pairs' arms are added to what it saw."""
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
        if (pairs >= FUTILITY_MIN and src.remaining >= 2
                and (_futility_llr(d, rise, least, guessed) <= -math.log(FUTILITY)
                     or (unlikely is not None and unlikely(start, pairs)))):
            futile = True
            break
    if not found and not futile and d.size:
        found = positive_by_end(d, alpha, prior)
    return Confirmation(d, start, found, futile, crossed)


def _least_rise(budget: int, alpha: float) -> float:
    """The smallest rise the whole budget could still show: a sign test with no pair down
    needs ``log2(1/(θα))`` pairs up, out of the ``budget / 2`` pairs it buys. A candidate
    is not given up while its pairs fit a rise this small better than none."""
    return math.log2(1 / (LOW_SHARE * alpha)) / max(budget // 2, 1)


def _futility_rise(budget: int, alpha: float) -> float:
    """The least rise a confirmation is weighed against before it is given up: the budget's
    least (``_least_rise``), but never below ``LEAST_RISE``. The budget's least alone shrinks
    as the budget grows, and pairs that disagree by noise fit a rise that small nearly as well
    as none: a level candidate was then never given up, at any budget. A true rise below
    ``LEAST_RISE`` may be given up (power, not validity: giving up names nothing)."""
    return max(_least_rise(budget, alpha), LEAST_RISE)


def _more_pairs(d: np.ndarray, alpha: float) -> int | None:
    """Pairs a confirmation at the rescue measured so far would roughly need in all: the
    betting wealth grows by about ``μ²/(2σ²)`` a pair and must reach ``log(1/(θα))``."""
    if d.size < 2 or d.mean() <= 0:
        return None
    var = float(d.var()) + 1e-9
    need = 2 * math.log(1 / (LOW_SHARE * alpha)) * var / float(d.mean()) ** 2
    return max(0, math.ceil(need) - d.size)


REFIT_APART = 1 << 19  # the held arm's offset in an unpaired re-estimate (its own indices)
REFIT_MARGIN = 1.5     # the re-estimate's variance is at most the paper's over this


@dataclass(frozen=True)
class RefitPlan:
    """Fresh rollouts for the re-estimate: paired (both arms on the same indices) or unpaired
    (each arm on its own indices, in Neyman proportion)."""

    paired: bool
    held: int
    resampled: int


def _pooled_pairs(conf: Confirmation) -> np.ndarray:
    """Which of the confirmation's pairs the re-estimate pools: all but the one on which the
    anytime test crossed its boundary (module docstring, step 5); the pairs after it in the
    same batch were drawn whatever it showed."""
    keep = np.ones(conf.d.size, dtype=bool)
    if conf.crossed is not None:
        keep[conf.crossed - 1] = False
    return np.nonzero(keep)[0]


def _smoothed_sd(mean: float, n: int) -> float:
    q = (mean * n + 0.5) / (n + 1)
    return math.sqrt(q * (1 - q))


def _refit_plan(d: np.ndarray, held: float, resampled: float, shared: bool, k: int,
                room: int) -> RefitPlan:
    """As many fresh rollouts as give an interval narrower than the paper's fixed-``K`` one
    (``K`` rollouts of the resampled arm against a fixed factual baseline: variance
    ``p(1 − p)/K``; ours at most that over ``REFIT_MARGIN``), or ``room``. Whichever design
    has the smaller variance per rollout, as the confirmation's pairs show it: pairs cost two
    rollouts and carry ``var(d)``; unpaired arms in Neyman proportion carry
    ``(σ_held + σ_resampled)²`` per rollout, which wins when the noise is not shared or the
    held arm barely varies (a factual arm that always fails needs few rollouts of its own, and
    its pair partner's would be spent for nothing)."""
    m = max(int(d.size), 1)
    s_hi, s_lo = _smoothed_sd(held, m), _smoothed_sd(resampled, m)
    paper = max(resampled * (1 - resampled), 0.25 / max(k, 1)) / REFIT_MARGIN
    per_pair = 2 * max(float(d.var()), 1e-3)
    apart = (s_hi + s_lo) ** 2
    if shared and per_pair <= apart:
        pairs = min(max(4, math.ceil(k * per_pair / 2 / paper)), room // 2)
        return RefitPlan(True, pairs, pairs)
    total = min(max(8, math.ceil(k * apart / paper)), room)
    hi = max(2, round(total * s_hi / (s_hi + s_lo)))
    return RefitPlan(False, hi, max(0, total - hi))


def _interval(d: np.ndarray, refit: np.ndarray | None, alpha: float, paired: bool,
              shown: bool, prior: Prior, intervals: bool, held_hi: np.ndarray | None,
              held_lo: np.ndarray | None) -> tuple[float, ConfidenceSequence | None]:
    """The reported effect and the interval it lies in (module docstring, step 5)."""
    if refit is not None and held_hi is not None and held_lo is not None and refit.size:
        diff = difference(held_hi.tolist(), held_lo.tolist(), 1.0 - alpha, paired=paired)
        low, high = diff.ci
        est = diff.estimate
        if shown and est > 0 and low <= 0:
            low = float(np.nextafter(0.0, 1.0))
        return est, ConfidenceSequence(est, (min(low, est), max(high, est)), 1.0 - alpha,
                                       int(refit.size if paired else held_lo.size))
    est = float(d.mean())
    if not intervals:
        return est, None
    cs = confidence_sequence(d, alpha, prior, shown)
    return est, ConfidenceSequence(est, (min(cs.ci[0], est), max(cs.ci[1], est)), cs.level,
                                   cs.n)


def search(src: ArmSource, n: int, budget: int, alpha: float, intervals: bool = True,
           refit: bool = True, k: int | None = None, wave: int = 0) -> Decision:
    """Gate, bisect, confirm (resuming past candidates given up) and re-estimate within
    ``budget`` rollouts (module docstring). ``k``: the paper's rollouts per step, which sizes
    the re-estimate (``budget // n`` when not given); ``refit=False`` stops once decided.
    ``wave``: rollouts the search may ask for in one round (module docstring, rounds); 0 or 1
    keeps the smallest looks."""
    k = k if k is not None else max(1, budget // max(n, 1))
    nav = Navigator(src, n, budget, wave)
    prior = Prior()
    rise = (0.5, 0.1)
    candidate = 0
    lo, hi = 0, n
    if n > 1:
        pos, neg = nav.gate()
        if pos - neg <= 0:
            return Decision(None, False, None, None, None, 0, None, None, 0,
                            f"holding the whole record does not raise the failure rate over "
                            f"resampling it from step 0 ({pos} pair(s) up, {neg} down of "
                            f"{nav.d_gate.size}), so there is no rise to follow",
                            decided_spent=budget - src.remaining, coupling=nav.coupling())
        candidate = nav.bisect(lo, hi, int(budget * NAV_SHARE) - (budget - src.remaining))
    given_up: list[int] = []
    start = CONFIRM
    attempt = 0
    conf: Confirmation | None = None
    coupling = nav.coupling() if n > 1 else Coupling(None, None, 0)
    while True:
        if n > 1:
            prior = Prior.of(nav.d_gate)
            coupling = nav.coupling()
            rise = _gate_signs(nav.d_gate)
            if not coupling.shared:
                high, low = nav.split_rates(candidate)
                high = low + FUTILITY_RISE * (high - low)  # give up on a rise smaller than this
                rise = (max(high * (1 - low), 1e-3), max(low * (1 - high), 1e-3))
        level = alpha * share(attempt)
        conf = _confirm(src, candidate, start, level, prior, rise,
                        None if n == 1 else nav.doubts(candidate),
                        least=_futility_rise(budget, level),
                        guessed=n == 1 or nav.d_gate.size < GATE_MIN, wave=wave)
        start += conf.d.size
        if conf.found or not conf.futile or src.remaining < 2 or n == 1:
            break
        # given up: the rise is on the side of it its arms are not
        given_up.append(candidate)
        attempt += 1
        for arm in (candidate, candidate + 1):
            nav.learn(arm, src.outcomes(arm, range(conf.start, start)))
        lo, hi = 0, n
        nav.scale *= 2
        nav.shortcuts = False
        pos, neg = nav.regate()
        if pos - neg <= 0:
            return Decision(None, False, None, None, None, 0, None, None, 0,
                            f"after {len(given_up)} candidate step(s) were given up "
                            f"({', '.join(map(str, given_up))}), holding the whole record no "
                            f"longer raises the failure rate over resampling it from step 0 "
                            f"({pos} pair(s) up, {neg} down of {nav.d_gate.size}): no rise "
                            f"to follow", decided_spent=budget - src.remaining,
                            coupling=nav.coupling(), given_up=tuple(given_up))
        nav_budget = int(src.remaining * NAV_SHARE)
        candidate = nav.bisect(lo, hi, nav_budget) if hi - lo > 1 else lo
    c = candidate
    d = conf.d
    decided = budget - src.remaining
    if d.size == 0:
        return Decision(c, False, None, None, None, 0, None, None, 0,
                        "the budget ran out before the candidate step could be confirmed",
                        exhausted=True, decided_spent=decided, coupling=coupling,
                        given_up=tuple(given_up), level=level)
    indices = range(conf.start, conf.start + d.size)
    held, resampled = src.means(c + 1, c, indices)
    if n > 1:  # the confirmation's pairs measure too: the re-estimate's are fresh again
        coupling = nav.coupling([(src.outcomes(c + 1, indices), src.outcomes(c, indices))])
    re_hi = re_lo = r = None
    paired = coupling.shared
    if conf.found and refit:
        plan = _refit_plan(d, held, resampled, coupling.shared, k, src.remaining)
        paired = plan.paired
        if plan.paired and plan.held >= 1:
            r = src.diffs(c + 1, c, range(REFIT, REFIT + plan.held))
            re_hi = src.outcomes(c + 1, range(REFIT, REFIT + r.size))
            re_lo = src.outcomes(c, range(REFIT, REFIT + r.size))
            if not r.size:
                re_hi = re_lo = r = None
        elif not plan.paired and plan.resampled >= 1:
            first = REFIT + REFIT_APART
            if wave > 1:  # both arms in one round: the budget reaches them as it would apart
                _draw(src, {c: range(REFIT, REFIT + plan.resampled),
                            c + 1: range(first, first + plan.held)})
            re_lo = src.outcomes(c, range(REFIT, REFIT + plan.resampled))
            re_hi = src.outcomes(c + 1, range(first, first + plan.held))
            if not (re_hi.size and re_lo.size):
                re_hi = re_lo = None
    pooled = 0
    if re_hi is not None and re_lo is not None:
        keep = _pooled_pairs(conf)
        pooled = int(keep.size)
        re_hi = np.concatenate([src.outcomes(c + 1, indices)[keep], re_hi])
        re_lo = np.concatenate([src.outcomes(c, indices)[keep], re_lo])
        r = re_hi - re_lo if paired else np.array([float(re_hi.mean() - re_lo.mean())])
    est, interval = _interval(d, r, alpha, paired, conf.found, prior, intervals,
                              re_hi, re_lo)
    refit_mean = est if r is not None and r.size else None
    refit_n = min(re_hi.size, re_lo.size) if re_hi is not None and re_lo is not None else 0
    return Decision(c, conf.found, interval, float(d.mean()), refit_mean,
                    refit_n, held, resampled, int(d.size),
                    None, exhausted=not conf.found, decided_spent=decided, coupling=coupling,
                    given_up=tuple(given_up), level=level,
                    more_pairs=None if conf.found else _more_pairs(d, level), estimate=est,
                    refit_held=float(re_hi.mean()) if re_hi is not None and re_hi.size
                    else None,
                    refit_resampled=float(re_lo.mean()) if re_lo is not None and re_lo.size
                    else None, refit_pooled=pooled)
