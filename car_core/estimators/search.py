"""Where the contrastive budget goes: search the ``H`` curve, confirm a step, re-estimate it.

The locus is the latest rise of ``H`` (``H_j`` holds steps ``< j``). ``search`` runs on an
``ArmSource`` (arms by rollout index), so the engine and the vectorised simulator of the
planted models run the same decisions: the gate and the bisection (``navigation``), the
confirmation with its futility bounds (``confirmation``), the re-estimate (``refit``). The
stages, the proof that a step with no rescue is named with probability at most α, and the
measured figures are in docs/contrastive-search.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from car_core.estimators.confirmation import (
    FUTILITY_RISE,
    Confirmation,
    confirm,
    futility_rise,
    more_pairs,
    share,
)
from car_core.estimators.later import (
    INDIFFERENCE,
    OUT_SHARE,
    RESERVE,
    LaterCheck,
    check_later,
)
from car_core.estimators.navigation import (
    GATE_MIN,
    NAV_SHARE,
    ArmSource,
    Navigator,
    draw_round,
    gate_signs,
    sign_counts,
)
from car_core.estimators.refit import REFIT_APART, pooled_pairs, refit_plan, reported_interval
from car_core.stats import Coupling
from car_core.stats.sequential import ConfidenceSequence, Prior, below_now, positive_at

CONFIRM = 1 << 20     # first rollout index of the confirmation pairs
REFIT = 2 << 20       # first rollout index of the re-estimate


@dataclass(frozen=True)
class Decision:
    """What the search found: the candidate, its confirmation and the re-estimate. Built by
    ``no_rise`` (nothing to follow), ``unconfirmed`` (no pair ran) or ``search``'s end."""

    candidate: int | None
    significant: bool = False
    interval: ConfidenceSequence | None = None
    raw: float | None = None
    refit: float | None = None
    refit_pairs: int = 0
    fail_held: float | None = None
    fail_resampled: float | None = None
    pairs: int = 0
    note: str | None = None
    exhausted: bool = False  # the budget ran out before the answer was decided
    decided_spent: int = 0   # rollouts spent when the answer was decided (before the refit)
    located_spent: int = 0   # ... when the first step was confirmed (before the later steps)
    coupling: Coupling = field(default_factory=lambda: Coupling(None, None, 0))
    given_up: tuple[int, ...] = ()  # candidates a futility bound gave up, in order
    level: float | None = None      # the α_i the deciding confirmation spent
    more_pairs: int | None = None   # undecided: pairs a confirmation would still need, roughly
    estimate: float | None = None   # the reported effect (inside ``interval`` by construction)
    refit_held: float | None = None      # P(fail) of the re-estimate's pairs, held and
    refit_resampled: float | None = None  # re-drawn: ``estimate`` is their difference
    refit_pooled: int = 0  # of the re-estimate's pairs, those the confirmation ran
    later: LaterCheck | None = None  # the steps after the first confirmed one (``later``)
    earlier: tuple[Decision, ...] = ()  # confirmed steps before the locus, with their intervals
    attempts: tuple[tuple[int, int], ...] = ()  # (candidate, pairs) of every confirmation run
    open_cause: bool = False  # no rise seen, but too few pairs to rule a cause out (undecided)

    @classmethod
    def no_rise(cls, d: np.ndarray, coupling: Coupling, spent: int, given_up: list[int],
                alpha: float, delta: float) -> Decision:
        """The gate's pairs ``d`` (``H_n − H_0``; for a one-step run, the confirmation's
        pairs, the same arms) show no rise (again, after ``given_up`` candidates). "No cause"
        is said only when they also show that re-deciding every step from step 0 on lowers
        P(fail) by less than ``delta`` (the anytime test ``below_now`` at ``OUT_SHARE·α``, the
        level the later steps are ruled out at when no confirmation ran): a gate of a few
        pairs that happened to agree once said "no cause" of a run whose step rescued 15%.
        Otherwise the answer is undecided (``open_cause``), and so it is when the budget left
        the gate no pair at all (nothing was measured)."""
        pos, neg = sign_counts(d)
        seen = (f"({pos} pair(s) up, {neg} down of {d.size})")
        if d.size == 0:
            return cls(None, note=("the budget ran out before the gate could run a pair: "
                                   "nothing was measured"),
                       exhausted=True, decided_spent=spent, coupling=coupling,
                       given_up=tuple(given_up))
        if not below_now(d, delta, OUT_SHARE * alpha):
            return cls(None, note=(
                f"re-deciding every step from step 0 on showed no rise {seen}, too few "
                f"re-runs to rule out that it lowers P(fail) by {delta:.0%} or more"),
                open_cause=True, decided_spent=spent, coupling=coupling,
                given_up=tuple(given_up))
        if given_up:
            note = (f"after {len(given_up)} candidate step(s) were given up "
                    f"({', '.join(map(str, given_up))}), holding the whole record no longer "
                    f"raises the failure rate over resampling it from step 0 {seen}: no rise "
                    f"to follow, and re-deciding every step from step 0 on is shown to lower "
                    f"P(fail) by less than {delta:.0%}")
        else:
            note = ("holding the whole record does not raise the failure rate over resampling "
                    f"it from step 0 {seen}, so there is no rise to follow: re-deciding every "
                    f"step from step 0 on is shown to lower P(fail) by less than {delta:.0%}")
        return cls(None, note=note, decided_spent=spent, coupling=coupling,
                   given_up=tuple(given_up))

    @classmethod
    def unconfirmed(cls, candidate: int, spent: int, coupling: Coupling,
                    given_up: list[int], level: float) -> Decision:
        """The budget ran out before the candidate's confirmation ran a pair."""
        return cls(candidate, note="the budget ran out before the candidate step could be "
                   "confirmed", exhausted=True, decided_spent=spent, coupling=coupling,
                   given_up=tuple(given_up), level=level)

    @property
    def more_rollouts(self) -> int | None:
        """Undecided: the rollouts a confirmation would still need, roughly (two a pair)."""
        return None if self.more_pairs is None else 2 * self.more_pairs


@dataclass
class _Found:
    """Where navigation and confirmation left off: the candidate and its confirmation."""

    candidate: int
    conf: Confirmation
    level: float
    coupling: Coupling
    given_up: list[int]
    prior: Prior


def search(src: ArmSource, n: int, budget: int, alpha: float, intervals: bool = True,
           refit: bool = True, k: int | None = None, wave: int = 0,
           delta: float = INDIFFERENCE) -> Decision:
    """Gate, bisect, confirm (resuming past candidates given up) and re-estimate within
    ``budget`` rollouts (docs/contrastive-search.md). ``k``: the paper's rollouts per step,
    which sizes the re-estimate (``budget // n`` when not given); ``refit=False`` stops once
    decided. ``wave``: rollouts the search may ask for in one round; 0 or 1 keeps the smallest
    looks. ``delta``: the indifference level the steps after a confirmed one are ruled out at
    (``later``); a later step shown to matter becomes the locus, the confirmed one an earlier
    cause."""
    k = k if k is not None else max(1, budget // max(n, 1))
    nav = Navigator(src, n, budget, wave)
    attempts: list[tuple[int, int]] = []
    found = _navigate_and_confirm(src, nav, n, budget, alpha, wave, attempts, delta)
    if isinstance(found, Decision):
        return replace(found, attempts=tuple(attempts))
    located = budget - src.remaining
    if not found.conf.found or found.candidate >= n - 1:
        decision = _conclude(src, nav, n, budget, alpha, found, intervals, refit, k, wave)
        return replace(decision, located_spent=located, attempts=tuple(attempts))
    later = check_later(src, found.candidate, n, alpha, delta, wave,
                        attempts=len(found.given_up) + 1, seen=_drawn(nav, found),
                        reserve=RESERVE if refit else 0.0)
    if later.cause is None or later.confirmation is None:
        decision = _conclude(src, nav, n, budget, alpha, found, intervals, refit, k, wave)
        return replace(decision, later=later, located_spent=located, attempts=tuple(attempts))
    earlier = _conclude(src, nav, n, budget, alpha, found, intervals, False, k, wave)
    cause = _Found(later.cause, later.confirmation, later.level, found.coupling,
                   found.given_up, Prior())
    decision = _conclude(src, nav, n, budget, alpha, cause, intervals, refit, k, wave)
    return replace(decision, later=later, earlier=(earlier,), located_spent=located,
                   attempts=tuple(attempts))


def _drawn(nav: Navigator, found: _Found) -> dict[int, list[range]]:
    """The rollout indices each arm after the confirmed step already ran: the navigation's
    from 0, and ``H_{c+1}``'s in the confirmation (the later stage's one-arm test counts
    them)."""
    c, conf = found.candidate, found.conf
    seen: dict[int, list[range]] = {j: [range(r)] for j, r in nav.reach.items() if j > c}
    seen.setdefault(c + 1, []).append(range(conf.start, conf.start + conf.d.size))
    return seen


def _navigate_and_confirm(src: ArmSource, nav: Navigator, n: int, budget: int, alpha: float,
                          wave: int, attempts: list[tuple[int, int]], delta: float
                          ) -> _Found | Decision:
    """Stages 1–4: a candidate, and its confirmation; a candidate given up sends the search
    back to the gate with doubled caps, while the budget lasts. ``attempts`` collects each
    confirmation's candidate and pairs."""
    prior = Prior()
    rise = (0.5, 0.1)
    candidate = 0
    if n > 1:
        pos, neg = nav.gate()
        if pos - neg <= 0:
            pos, neg = nav.level_or_rise(delta, OUT_SHARE * alpha)
        if pos - neg <= 0:
            spent = budget - src.remaining
            return Decision.no_rise(nav.d_gate, nav.coupling(), spent, [], alpha, delta)
        candidate = nav.bisect(0, n, int(budget * NAV_SHARE) - (budget - src.remaining))
    given_up: list[int] = []
    start = CONFIRM
    coupling = nav.coupling() if n > 1 else Coupling(None, None, 0)
    while True:
        if n > 1:
            prior = (Prior.certain_failure() if nav.certain_after(candidate)
                     else Prior.of(nav.d_gate))
            coupling = nav.coupling()
            rise = gate_signs(nav.d_gate)
            if not coupling.shared:
                high, low = nav.split_rates(candidate)
                high = low + FUTILITY_RISE * (high - low)  # give up on a rise smaller than this
                rise = (max(high * (1 - low), 1e-3), max(low * (1 - high), 1e-3))
        level = alpha * share(len(given_up))
        conf = confirm(src, candidate, start, level, prior, rise,
                       None if n == 1 else nav.doubts(candidate, rise, level),
                       least=futility_rise(budget, level),
                       guessed=n == 1 or nav.d_gate.size < GATE_MIN, wave=wave,
                       settled=partial(below_now, bound=delta, alpha=OUT_SHARE * alpha)
                       if n == 1 else None)
        if n == 1 and conf.futile:
            conf = _one_step_on(src, conf, level, prior, delta, alpha, wave)
            if conf.futile:
                attempts.append((candidate, int(conf.d.size)))
                return Decision.no_rise(conf.d, coupling, budget - src.remaining, [], alpha,
                                        delta)
        start += conf.d.size
        attempts.append((candidate, int(conf.d.size)))
        if conf.found or not conf.futile or src.remaining < 2 or n == 1:
            return _Found(candidate, conf, level, coupling, given_up, prior)
        # given up: the rise is on the side of it its arms are not
        given_up.append(candidate)
        for arm in (candidate, candidate + 1):
            nav.learn(arm, src.outcomes(arm, range(conf.start, start)))
        nav.scale *= 2
        nav.shortcuts = False
        pos, neg = nav.regate()
        if pos - neg <= 0:
            pos, neg = nav.level_or_rise(delta, OUT_SHARE * alpha)
        if pos - neg <= 0:
            spent = budget - src.remaining
            return Decision.no_rise(nav.d_gate, nav.coupling(), spent, given_up, alpha, delta)
        candidate = nav.bisect(0, n, int(src.remaining * NAV_SHARE)) if n > 1 else 0


def _one_step_on(src: ArmSource, conf: Confirmation, level: float, prior: Prior,
                 delta: float, alpha: float, wave: int) -> Confirmation:
    """A one-step run's confirmation that gave up: its pairs ``(H_1, H_0)`` are the gate's
    arms, so they can also say "no cause" (``Decision.no_rise``: the rescue shown below
    ``delta`` at ``OUT_SHARE·α``). More pairs are run, a look at a time, until they show that,
    or the rescue positive after all (at the confirmation's level: the confirmation found), or
    the budget ends (then "futile" only where they do not rise). Before, a one-step run whose
    step rescued nothing could never be told "no step caused it": the confirmation gave up
    and the answer said the budget had run out, at any budget. Both tests read one sequence
    of pairs at any time (Ville), and at most one of the two claims can be wrong for a given
    rescue (at most 0, or at least ``delta``), so the answer errs with probability at most
    the larger level, below α."""
    least_batch = 2 if wave <= 1 else max(2, wave // 2)
    d = conf.d
    while d.size and not below_now(d, delta, OUT_SHARE * alpha) and src.remaining >= 2:
        want = d.size + max(least_batch, d.size // 8)
        more = src.diffs(1, 0, range(conf.start, conf.start + want))
        if more.size <= d.size:
            break
        d = more
        crossed = positive_at(d, level, prior)
        if crossed is not None:
            return Confirmation(d, conf.start, True, False, crossed)
    pos, neg = sign_counts(d)
    # pairs that ended rising without showing it: undecided on the candidate, as before
    return Confirmation(d, conf.start, False, below_now(d, delta, OUT_SHARE * alpha)
                        or pos <= neg)


def _conclude(src: ArmSource, nav: Navigator, n: int, budget: int, alpha: float, found: _Found,
              intervals: bool, refit: bool, k: int, wave: int) -> Decision:
    """Stage 5: the decision, with the re-estimate of a named step."""
    c, conf = found.candidate, found.conf
    d = conf.d
    decided = budget - src.remaining
    if d.size == 0:
        return Decision.unconfirmed(c, decided, found.coupling, found.given_up, found.level)
    indices = range(conf.start, conf.start + d.size)
    held, resampled = src.means(c + 1, c, indices)
    coupling = found.coupling
    if n > 1:  # the confirmation's pairs measure too: the re-estimate's are fresh again
        coupling = nav.coupling([(src.outcomes(c + 1, indices), src.outcomes(c, indices))])
    paired = coupling.shared
    re_hi = re_lo = None
    if conf.found and refit:
        plan = refit_plan(d, held, resampled, coupling.shared, k, src.remaining)
        paired = plan.paired
        re_hi, re_lo = _fresh_rollouts(src, c, plan.paired, plan.held, plan.resampled, wave)
    r = None
    pooled = 0
    if re_hi is not None and re_lo is not None:
        keep = pooled_pairs(conf)
        pooled = int(keep.size)
        re_hi = np.concatenate([src.outcomes(c + 1, indices)[keep], re_hi])
        re_lo = np.concatenate([src.outcomes(c, indices)[keep], re_lo])
        r = re_hi - re_lo if paired else np.array([float(re_hi.mean() - re_lo.mean())])
    # a candidate left unconfirmed gets its interval at its own test's level: at α it could
    # lie above zero beside "not shown to help" (a trial read +0.214 [+0.001, +0.504] so)
    level = alpha if conf.found else found.level
    est, interval = reported_interval(d, r, level, paired, conf.found, found.prior, intervals,
                                      re_hi, re_lo)
    return Decision(
        c, conf.found, interval, float(d.mean()),
        refit=est if r is not None and r.size else None,
        refit_pairs=min(re_hi.size, re_lo.size) if re_hi is not None and re_lo is not None
        else 0,
        fail_held=held, fail_resampled=resampled, pairs=int(d.size),
        exhausted=not conf.found, decided_spent=decided, coupling=coupling,
        given_up=tuple(found.given_up), level=found.level,
        more_pairs=None if conf.found else more_pairs(d, found.level), estimate=est,
        refit_held=float(re_hi.mean()) if re_hi is not None and re_hi.size else None,
        refit_resampled=float(re_lo.mean()) if re_lo is not None and re_lo.size else None,
        refit_pooled=pooled)


def _fresh_rollouts(src: ArmSource, c: int, paired: bool, held: int, resampled: int,
                    wave: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The re-estimate's fresh rollouts of ``H_{c+1}`` and ``H_c``: on the same indices from
    ``REFIT`` (paired), or each arm on its own (unpaired); ``None`` where none came back."""
    if paired and held >= 1:
        r = src.diffs(c + 1, c, range(REFIT, REFIT + held))
        if not r.size:
            return None, None
        return (src.outcomes(c + 1, range(REFIT, REFIT + r.size)),
                src.outcomes(c, range(REFIT, REFIT + r.size)))
    if not paired and resampled >= 1:
        first = REFIT + REFIT_APART
        if wave > 1:  # both arms in one round: the budget reaches them as it would apart
            draw_round(src, {c: range(REFIT, REFIT + resampled),
                             c + 1: range(first, first + held)})
        lo = src.outcomes(c, range(REFIT, REFIT + resampled))
        hi = src.outcomes(c + 1, range(first, first + held))
        return (hi, lo) if hi.size and lo.size else (None, None)
    return None, None
