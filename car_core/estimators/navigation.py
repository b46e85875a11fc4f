"""Navigation: the gate, the measured coupling and the bisection that choose a candidate step.

Stages 1–3 of the search (docs/contrastive-search.md): everything here runs on navigation
indices (below ``search.CONFIRM``), so what it chooses is independent of the confirmation's
pairs — that independence is what the search's error control rests on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from car_core.stats import Coupling, coupling_of
from car_core.stats.sequential import LOW_SHARE, below_now, pairs_to_show

GATE_NET = 4          # net positive pairs that size a rise for the sequential probes
GATE_MIN = 12         # pairs the gate runs at least before it sizes a rise
NAV_SHARE = 0.45      # of the budget, the most the gate and the first bisection may spend
NAV_ERROR = 0.01      # error each way of one bisection decision
LOCATE_ERROR = 0.1    # posterior mass off the best step at which the unshared search stops
NAV_BATCH = 2         # pairs (or one arm's rollouts) per look during navigation
PROBE = 4             # gate indices a probe looks at first (its witnesses among them)
PAIRED_COUPLING = 0.5  # measured coupling above which index pairs navigate (else locate)
PROBE_WITNESSES = 1   # disagreeing gate pairs a probe needs before it may decide on them
FUTILITY_BELIEF = 0.03  # locus posterior below which a candidate is given up (unshared noise)
DRAG = 2.0            # of the pairs the navigation's rise needs, past which a confirmation drags
PROBE_EVERY = 4       # confirmation pairs per probe rollout of the other arms once it drags
CERTAIN_SEEN = 8      # rollouts after a candidate, none passing, that make its bets the largest
Q_MOST = 0.49         # the most a probe takes pairs to go down by noise (each way), below 1/2


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


def draw_round(src: ArmSource, wants: dict[int, Sequence[int]]) -> None:
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



def sign_counts(d: np.ndarray) -> tuple[int, int]:
    return int((d > 0).sum()), int((d < 0).sum())


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
    """The size ``δ`` of the rise and the rate ``q`` of pairs that disagree by noise, kept
    below one half so that "level" (each sign w.p. ``q``) and "below" (``+`` w.p. ``q + δ``)
    are laws: a judge that is a coin makes half the gate's pairs go down, and the probe's
    likelihood ratio divided by ``1 − 2q = 0``."""
    pos, neg = sign_counts(d_gate)
    s = max(d_gate.size, 1)
    q = min((neg + 0.5) / (s + 1), Q_MOST)
    return max(min((pos - neg) / s, 1 - 2 * q - 1e-3), 1e-3), q


def gate_signs(d_gate: np.ndarray) -> tuple[float, float]:
    """The gate's rates of up and down pairs, smoothed away from 0 and 1."""
    pos, neg = sign_counts(d_gate)
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
        pos, _ = sign_counts(d)
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


def _pairs_for(rise: tuple[float, float] | None, level: float | None) -> float:
    """Roughly the pairs a betting test at ``level`` needs for a rise whose pairs go up and
    down at rates ``rise``: its log wealth grows by about ``δ²/(2q)`` a pair (``δ`` the net
    rise, ``q = up + down`` the rate of pairs that disagree, the pairs' second moment).
    Infinite without a rise or a level."""
    if rise is None or level is None:
        return math.inf
    up, down = rise
    return pairs_to_show(up - down, up + down, LOW_SHARE * level)


def locus_posterior(fails: np.ndarray, runs: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """P(locus = c | the arms' failures and rollouts) for ``c`` in ``[lo, hi)``, under one
    rise: arms ``≤ c`` fail at one unknown rate, arms ``> c`` at another (Jeffreys priors), the
    locus uniform. Arms are taken as independent samples, which is what unshared noise gives.
    ``fails`` and ``runs`` index the arms on their last axis; leading axes are separate
    what-ifs, each with a posterior of its own."""
    from scipy.special import betaln  # scipy loads with the first estimate, not on import
    cf, cr = np.cumsum(fails, axis=-1), np.cumsum(runs, axis=-1)
    f_lo, r_lo = cf[..., lo:hi], cr[..., lo:hi]
    f_hi, r_hi = cf[..., -1:] - f_lo, cr[..., -1:] - r_lo
    ll = (betaln(0.5 + f_lo, 0.5 + r_lo - f_lo) + betaln(0.5 + f_hi, 0.5 + r_hi - f_hi))
    # one rise, upwards: a split whose early arms fail more than its late ones is penalised
    wrong = (f_lo + 0.5) / (r_lo + 1) > (f_hi + 0.5) / (r_hi + 1)
    ll = ll - np.where(wrong, 5.0, 0.0)
    w = np.exp(ll - ll.max(axis=-1, keepdims=True))
    return np.asarray(w / w.sum(axis=-1, keepdims=True))


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
        """Gate pairs added per look: four, or a quarter of a wave (docs/contrastive-search.md,
        rounds)."""
        return 4 if self.wave <= 1 else max(4, self.wave // 4)

    @property
    def batch(self) -> int:
        """Pairs (or one arm's rollouts) per navigation look."""
        return NAV_BATCH if self.wave <= 1 else max(NAV_BATCH, self.wave // 2)

    def gate(self) -> tuple[int, int]:
        self.d_gate = _gate(self.src, self.n, 1, self.gate_cap, self.d_gate, step=self.step)
        self.witnesses = Witnesses.of(self.d_gate)
        return sign_counts(self.d_gate)

    def gate_counts(self) -> tuple[int, int]:
        """The gate's pairs up and down so far."""
        return sign_counts(self.d_gate)

    def level_or_rise(self, delta: float, level: float) -> tuple[int, int]:
        """The gate saw no rise within its cap: more gate pairs, a look at a time, until they
        show one, or show the rise below ``delta`` (``below_now`` at ``level``: what "no
        cause" needs), or the budget ends. The cap kept budget for the stages a rise needs;
        with none seen there is nothing else to spend it on (at n·32 a 4-step gate's cap of
        28 level pairs could never show a rescue below 10%, so every such desk was
        undecided)."""
        while self.src.remaining >= 2 and not below_now(self.d_gate, delta, level):
            pos, neg = sign_counts(self.d_gate)
            if pos - neg > 0:
                break
            want = self.d_gate.size + self.step
            d = self.src.diffs(self.n, 0, range(want))
            if d.size <= self.d_gate.size:
                break
            self.d_gate = d
        self.witnesses = Witnesses.of(self.d_gate)
        return sign_counts(self.d_gate)

    def regate(self) -> tuple[int, int]:
        """More gate pairs after a candidate was given up; the gate's cap grows with them."""
        self.gate_cap += max(8, self.gate_cap // 2)
        self.d_gate = _gate(self.src, self.n, GATE_NET * self.scale, self.gate_cap,
                            self.d_gate, least=self.d_gate.size + 8, step=self.step)
        return sign_counts(self.d_gate)

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
            draw_round(self.src, {j: w.indices for j in [self.n, *arms]})

    def _armsign_counts(self, more: dict[int, tuple[float, int]] | None = None
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
        """P(locus = c | every arm's outcomes) for ``c`` in ``[lo, hi)`` (``locus_posterior``
        of the arms' failures and rollouts as seen, with ``more`` added)."""
        fails, runs = self._armsign_counts(more)
        return locus_posterior(fails, runs, lo, hi)

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
                if not self._locate_round(lo, hi, post, nav_budget - spent):
                    return lo + best
                continue
            j = self._most_telling(lo, hi, post)
            m = self.reach.get(j, 0)
            y = self.src.outcomes(j, range(m + NAV_BATCH))
            if y.size <= m:
                return lo + best
            self.reach[j] = int(y.size)
            for end in (0, self.n):  # the two rates every split leans on stay as well known
                have = max(self.reach.get(end, 0), self.d_gate.size)
                if 2 * have < y.size and self.src.remaining >= 1:
                    self.reach[end] = int(self.src.outcomes(end, range(y.size // 2)).size)

    def _locate_round(self, lo: int, hi: int, post: np.ndarray, room: int) -> bool:
        """One look of ``locate`` in rounds (``wave``): the most telling arm gets a quarter of
        a wave (no more than the navigation has left; larger looks lost power where the budget
        runs out), and ``H_0`` and ``H_n`` their top-up, drawn
        at once. False when the arm did not grow (the budget is spent)."""
        j = self._most_telling(lo, hi, post)
        m = self.reach.get(j, 0)
        wants: dict[int, Sequence[int]] = {
            j: range(m + max(NAV_BATCH, min(self.wave, room) // 4))}
        top = len(wants[j])
        for end in (0, self.n):  # the two rates every split leans on stay as well known
            if 2 * max(self.reach.get(end, 0), self.d_gate.size) < top:
                wants[end] = range(top // 2)
        draw_round(self.src, wants)
        for arm, idx in wants.items():  # read back what was drawn (nothing more runs)
            self.reach[arm] = max(self.reach.get(arm, 0), int(self.src.outcomes(arm, idx).size))
        return self.reach[j] > m

    def split_rates(self, c: int) -> tuple[float, float]:
        """The failure rates of the arms after ``c`` and of those up to it, as seen."""
        fails, runs = self._armsign_counts()
        high = (fails[c + 1:].sum() + 0.5) / (runs[c + 1:].sum() + 1)
        low = (fails[:c + 1].sum() + 0.5) / (runs[:c + 1].sum() + 1)
        return float(high), float(min(low, high))

    def certain_after(self, c: int) -> bool:
        """Whether every arm after ``c`` failed on every rollout the navigation saw, and at
        least ``CERTAIN_SEEN`` of them ran: then the confirmation's pairs ``(H_{c+1}, H_c)``
        are not expected to go down (``Prior.certain_failure``). Fewer could all fail by
        chance on a judge that errs, and a pair that goes down costs the largest bet."""
        fails, runs = self._armsign_counts()
        seen = float(runs[c + 1:].sum())
        return seen >= CERTAIN_SEEN and float(fails[c + 1:].sum()) == seen

    def _most_telling(self, lo: int, hi: int, post: np.ndarray,
                      among: Sequence[int] | None = None) -> int:
        """The arm in ``(lo, hi)`` whose next outcome is expected to leave the least entropy
        in the locus posterior: each arm's outcome is predicted from the posterior itself
        (under locus ``c`` the arm fails at the rate of its side of ``c``), and the posterior
        is recomputed after a failure and after a success. Looking ahead on the posterior
        counts what an arm has already shown: an arm run many times tells little more, even
        when the locus is evenly split on either side of it (valuing each arm by the split
        alone ran one arm twenty times while the arm that decided the answer waited)."""
        fails, runs = self._armsign_counts()
        cf, cr = np.cumsum(fails), np.cumsum(runs)
        c = np.arange(lo, hi)
        rate_lo = (cf[c] + 0.5) / (cr[c] + 1)                            # arms <= c
        rate_hi = (cf[-1] - cf[c] + 0.5) / (cr[-1] - cr[c] + 1)          # arms > c
        arms = np.arange(lo + 1, hi) if among is None else np.asarray(among)
        p_fail = np.where(arms[:, None] <= c[None, :], rate_lo, rate_hi) @ post
        one = np.eye(fails.size)[arms]                 # what-if: one more rollout of each arm
        after = [locus_posterior(fails + o * one, runs + one, lo, hi) for o in (1.0, 0.0)]
        def entropy(p: np.ndarray) -> np.ndarray:
            return np.asarray(-(p * np.log(np.clip(p, 1e-300, None))).sum(axis=-1))
        left = p_fail * entropy(after[0]) + (1 - p_fail) * entropy(after[1])
        return int(arms[int(np.argmin(left))])

    def doubts(self, c: int, rise: tuple[float, float] | None = None,
               level: float | None = None) -> Callable[[int, int], bool]:
        """Whether the locus posterior, given a confirmation's pairs of ``c`` so far, puts
        less than ``FUTILITY_BELIEF`` on ``c``: the arms say the rise is elsewhere. Not asked
        while the coupling, measured with these pairs too, shows shared noise or estimates it
        at ``PAIRED_COUPLING`` or more: the posterior takes the arms as independent samples
        (on shared noise it gave true weak rises up), and index pairs already weigh a shared
        rise. The confirmation's pairs are in that measurement so that a few navigation pairs
        that agreed by chance (one probe copying ``H_0`` at four witness indices) do not
        switch the check off for the whole confirmation.

        A confirmation that drags on (past ``DRAG`` times the pairs a test at ``level`` needs
        for ``rise``, the up and down rates the navigation measured) probes the other arms
        first, one rollout per ``PROBE_EVERY`` of its pairs, on the arm whose outcome tells the
        posterior most: the posterior then rests on more than the arms the navigation saw
        before it chose ``c``. Without it a level candidate whose pairs rose by chance kept
        98% of a budget of n·128 (8 steps, rescue 0.15), the other arms too thinly sampled to
        say the rise was elsewhere (docs/contrastive-search.md)."""
        need = _pairs_for(rise, level)
        probed = [0]

        def unlikely(start: int, pairs: int) -> bool:
            idx = range(start, start + pairs)
            seen = (self.src.outcomes(c + 1, idx), self.src.outcomes(c, idx))
            measured = self.coupling([seen])
            if measured.shared or (measured.estimate or 0.0) >= PAIRED_COUPLING:
                return False
            more = {arm: (float(y.sum()), int(y.size)) for arm, y in zip((c + 1, c), seen,
                                                                          strict=True)}
            owed = (pairs - probed[0]) // PROBE_EVERY
            if pairs > DRAG * need and owed >= 2 and self.src.remaining >= 2 * owed + 2:
                probed[0] = pairs
                self._probe(c, owed, more)
            return bool(self.posterior(0, self.n, more)[c] < FUTILITY_BELIEF)
        return unlikely

    def _probe(self, c: int, count: int, more: dict[int, tuple[float, int]]) -> None:
        """``count`` more navigation rollouts of the arm, other than ``c``'s two, whose
        outcome tells the locus posterior most (``more``: the confirmation's arms so far)."""
        others = [j for j in range(1, self.n + 1) if j not in (c, c + 1)]
        if not others:
            return
        j = self._most_telling(0, self.n, self.posterior(0, self.n, more), among=others)
        m = self.reach.get(j, 0)
        y = self.src.outcomes(j, range(m + count))
        self.reach[j] = max(m, int(y.size))

    def learn(self, arm: int, ys: np.ndarray) -> None:
        """Outcomes of ``arm`` seen outside the navigation indices (a given-up confirmation)."""
        f, r = self.extra.get(arm, (0.0, 0))
        self.extra[arm] = (f + float(ys.sum()), r + int(ys.size))
