"""Which part of what step ``k`` saw made it fail: context attribution by ablation.

The state step ``k`` decided from is cut into sources (``car_core.model.context_sources``). Two
stages, on separate rollouts, so what the first chooses cannot bias what the second tests:

1. **Screen.** Antithetic pairs of random ablations: a mask keeps each source with probability
   1/2, its complement keeps the others, and both halves of a pair run at one rollout index (the
   same noise where the agent takes CAR's). A source's *effect* is ``E[y | kept] − E[y |
   removed]`` over random contexts of the others: its Banzhaf value on the game ``v(S) = P(fail
   | only S kept)``. Each pair holds the source in exactly one half, so its estimate is a mean
   over pairs of the kept half minus the removed half, with a paired Newcombe interval at
   ``level`` (the pairs are independent units, whatever noise their halves share; the stopping
   rule below looks at the same pairs, so these intervals' coverage is measured in
   ``benchmarks/context.py``, not proved). A sparse linear surrogate (the lasso, as ContextCite
   fits) on the same pairs ranks the sources. The screen looks after a quarter of the rollouts
   and then every sixteenth, and stops once its top source is *clear*: ahead of every other
   source's effect at one-sided level ``RIVAL_LEVEL`` (a normal test on the pairs' contributions
   to the gap). It never spends more than ``SCREEN_SHARE``; what it does not spend goes to the
   confirmation, where one clear cause needs it. How much the halves of a pair agree beyond what
   their failure rates allow is the coupling measured (``stats.coupling_of``), within the strata
   of the strongest source so that its effect does not read as disagreement; it chooses the
   confirmation's test.
2. **Confirm.** The top source by weight, and beside it at most ``CANDIDATES − 1`` rivals the
   screen could not show to trail it, each with a positive weight at least ``FOCUS`` times the
   top one (a second cause of an interaction; a source with a fraction of the top weight would
   only split the budget) are each left out alone, against the full context, on fresh
   rollouts: a one-sided exact test of ``P(fail | full) > P(fail | without j)`` — the sign test
   on discordant pairs when stage 1 measured shared noise (every arm the same size, since only
   index-matched rollouts pair), Boschloo's test otherwise (the full arm, shared by the ``k``
   comparisons, gets ``√k`` times a removal arm's rollouts: Neyman's allocation) — with Holm's
   procedure over the candidates at ``alpha``. The sources it rejects are *named*; each carries
   its leave-one-out *rescue* with a Newcombe interval at ``1 − alpha / candidates``.

FWER: when the screen stops, which candidates, how many rollouts each arm gets and which test
runs are all functions of stage-1 outcomes only, and stage 2's rollouts (indices the screen
never used, so noise streams it never drew) are independent of them. Conditionally on stage 1,
each candidate's p-value is therefore valid (exact tests at sizes fixed before stage 2 runs) and
Holm keeps ``P(any source named whose removal does not rescue) ≤ alpha``; averaging over stage
1, so does the procedure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from car_core import defaults
from car_core import formatting as fmt
from car_core.engine.agent import Agent
from car_core.engine.execution import ExecutorLike
from car_core.errors import BudgetExhausted, InvalidInput
from car_core.estimators._arms import StepArms, capped, check_rollouts
from car_core.model.budget import Budget
from car_core.model.checks import is_whole
from car_core.model.context_sources import (
    Source,
    Splitter,
    before_run,
    keep_all,
    remover,
    split,
    state_of,
)
from car_core.model.interventions import do_context
from car_core.model.outcome import OutcomeLike
from car_core.model.trajectory import Trajectory, is_failure
from car_core.stats import Coupling, Interval, check_level, coupling_of, difference, z_value

CANDIDATES = 3  # most sources confirmed one by one
RIVAL_LEVEL = 0.9  # a source stays a rival of the top one unless shown to trail it at this level
FOCUS = 0.5  # and is confirmed beside it only with at least this share of the top one's weight
SCREEN_SHARE = 0.5  # the most of the rollouts the screen spends; the rest confirm
SCREEN_FIRST = 0.25  # of the rollouts spent before the screen's first look
SCREEN_STEP = 1 / 16  # of the rollouts added between its looks
LASSO_PENALTY = 0.5  # the lasso's λ as a multiple of the universal threshold σ·sqrt(2 log m / n)


@dataclass(frozen=True)
class SourceEffect:
    """One source: its screened effect (Banzhaf, with interval), its surrogate weight, and,
    when it was confirmed alone, its leave-one-out rescue, the test's p-value and verdict."""

    source: Source
    effect: float
    ci: Interval
    weight: float
    pairs: int
    rescue: float | None = None
    rescue_ci: Interval | None = None
    p_value: float | None = None
    named: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {**self.source.to_dict(), "effect": self.effect, "ci": list(self.ci),
                "level": self.ci.level, "weight": self.weight, "pairs": self.pairs,
                "rescue": self.rescue,
                "rescue_ci": None if self.rescue_ci is None else list(self.rescue_ci),
                "rescue_level": None if self.rescue_ci is None else self.rescue_ci.level,
                "p_value": self.p_value, "named": self.named}


@dataclass(frozen=True)
class ContextAttribution:
    """What in step ``step``'s state caused the failure: every source's effect with its
    interval, and the sources ``named`` (removing each alone rescues, FWER ≤ ``alpha``)."""

    run_id: str
    step: int
    sources: tuple[SourceEffect, ...]
    alpha: float
    level: float
    seed: int
    rollouts_used: int
    budget: int
    p_full: float | None
    coupled: bool
    coupling: Coupling
    coupling_note: str
    truncated: bool = False
    budget_note: str | None = None
    failures: tuple[dict[str, Any], ...] = ()
    test: str = ""

    @property
    def named(self) -> tuple[SourceEffect, ...]:
        return tuple(s for s in self.sources if s.named)

    @property
    def answer(self) -> str:
        if self.named:
            return "named"
        return "undecided" if self.truncated else "none shown"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "context", "run_id": self.run_id, "step": self.step,
                "answer": self.answer, "named": [s.source.index for s in self.named],
                "sources": [s.to_dict() for s in self.sources], "alpha": self.alpha,
                "level": self.level, "seed": self.seed, "rollouts_used": self.rollouts_used,
                "budget": self.budget, "p_full": self.p_full, "coupled": self.coupled,
                "coupling": self.coupling.to_dict(), "coupling_note": self.coupling_note,
                "truncated": self.truncated, "budget_note": self.budget_note,
                "failures": list(self.failures), "test": self.test}

    def __str__(self) -> str:
        head = (f"What step {self.step} of run {self.run_id} decided from: "
                f"{len(self.sources)} sources, {self.rollouts_used} rollouts")
        if self.named:
            lines = [head, "caused by (removing it alone rescues, FWER ≤ "
                     f"{self.alpha:g}, {self.test}):"]
            for s in self.named:
                assert s.rescue is not None and s.rescue_ci is not None
                lines.append(f"  [{s.source.index}] {s.source.label}: rescue {s.rescue:+.3f} "
                             f"[{s.rescue_ci[0]:+.3f}, {s.rescue_ci[1]:+.3f}]  "
                             f"{_clip(s.source.text)}")
        else:
            lines = [head, "no source shown to cause it" + (
                " (undecided: the budget ran out; raise rollouts)" if self.truncated else "")]
        lines.append(f"effect of keeping each source (Banzhaf, {self.level:.0%} intervals):")
        for s in sorted(self.sources, key=lambda e: -e.effect):
            lines.append(f"  [{s.source.index}] {s.effect:+.3f} [{s.ci[0]:+.3f}, "
                         f"{s.ci[1]:+.3f}]  {s.source.label}")
        lines.append(f"coupled={self.coupled}" + (
            f"; coupling measured {fmt.num(self.coupling.estimate)} "
            f"{fmt.interval(self.coupling.ci)} from {self.coupling.pairs} pairs"
            if self.coupling.estimate is not None else
            "; coupling not measurable (an arm never varied): the unpaired test is used"))
        return "\n".join(lines)


def _rescue_interval(ci: tuple[float, float], level: float, named: bool) -> Interval:
    """A leave-one-out rescue's interval. A named source's rescue was shown positive by the
    exact test, so its lower end is raised to zero where the two-sided Newcombe interval
    reached below it (as the contrastive estimator does for a confirmed step): a named source
    never shows an interval that says its removal may not rescue."""
    low, high = ci
    return Interval(max(low, 0.0) if named else low, high, level)


def _clip(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


# -- the surrogate ---------------------------------------------------------------------------
def lasso(x: np.ndarray, y: np.ndarray, penalty: float, sweeps: int = 200) -> np.ndarray:
    """Coordinate-descent lasso without intercept: ``argmin ½‖y − xβ‖²/n + penalty·‖β‖₁``."""
    n, m = x.shape
    beta = np.zeros(m)
    scale = (x * x).sum(axis=0) / n
    resid = y.astype(float).copy()
    for _ in range(sweeps):
        largest = 0.0
        for j in range(m):
            if scale[j] == 0:
                continue
            rho = x[:, j] @ resid / n + scale[j] * beta[j]
            new = np.sign(rho) * max(abs(rho) - penalty, 0.0) / scale[j]
            if new != beta[j]:
                resid -= x[:, j] * (new - beta[j])
                largest = max(largest, abs(new - beta[j]))
                beta[j] = new
        if largest < 1e-9:
            break
    return beta


def surrogate(signs: np.ndarray, diffs: np.ndarray) -> np.ndarray:
    """Each source's weight in ``y ≈ b + Σ w_j·kept_j``, fitted on antithetic pairs: a pair's
    difference is ``Σ w_j·s_j`` with ``s_j = ±1`` (kept in the first half or the second)."""
    n, m = signs.shape
    sd = float(np.std(diffs)) if n > 1 else 1.0
    penalty = LASSO_PENALTY * max(sd, 1e-6) * math.sqrt(2 * math.log(max(m, 2)) / max(n, 1))
    return lasso(signs, diffs, penalty)


# -- exact one-sided tests --------------------------------------------------------------------
def sign_test(wins: int, losses: int) -> float:
    """P(Bin(wins + losses, 1/2) ≥ wins): the one-sided exact test on discordant pairs."""
    if wins + losses == 0:
        return 1.0
    from scipy.stats import binomtest  # scipy.stats loads at the first test, not on import
    return float(binomtest(wins, wins + losses, 0.5, alternative="greater").pvalue)


def fisher_greater(a_fail: int, a_n: int, b_fail: int, b_n: int) -> float:
    """One-sided Fisher exact p-value for ``P(fail | a) > P(fail | b)`` (the benchmark's and
    the tests' yardstick for Boschloo's)."""
    from scipy.stats import fisher_exact
    table = np.array([[a_fail, b_fail], [a_n - a_fail, b_n - b_fail]])
    return float(fisher_exact(table, alternative="greater").pvalue)


def boschloo_greater(a_fail: int, a_n: int, b_fail: int, b_n: int) -> float:
    """One-sided Boschloo exact p-value for ``P(fail | a) > P(fail | b)``: Fisher's p-value
    as the statistic, its null distribution maximised over the common failure rate. Exact
    like Fisher's test, and never less powerful, which counts at the few tens of rollouts
    an arm gets here."""
    from scipy.stats import boschloo_exact  # scipy.stats loads at the first test, not on import
    table = [[a_fail, b_fail], [a_n - a_fail, b_n - b_fail]]
    return float(boschloo_exact(table, alternative="greater").pvalue)


def one_sided(full: Sequence[float], without: Sequence[float], paired: bool) -> float:
    """p-value of ``P(fail | full) > P(fail | without)``; scores count as failures at ≥ 1/2.
    Paired: the sign test on discordant pairs; unpaired: Boschloo's test."""
    if paired:
        wins = sum(1 for a, b in zip(full, without, strict=True) if a > b)
        losses = sum(1 for a, b in zip(full, without, strict=True) if a < b)
        return sign_test(wins, losses)
    return boschloo_greater(sum(map(is_failure, full)), len(full),
                            sum(map(is_failure, without)), len(without))


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected at FWER ``alpha``."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (len(p_values) - rank):
            break
        rejected[i] = True
    return rejected


def _coupling(ya: np.ndarray, yb: np.ndarray, strongest: np.ndarray) -> Coupling:
    """How much the halves of the pairs share noise, measured within the two strata of the
    strongest source (kept in the first half, or in the second): a causal source gives the
    halves different failure rates, which read as disagreement if the pairs were pooled."""
    return coupling_of([(list(ya[strongest == s]), list(yb[strongest == s]))
                        for s in (1.0, -1.0)])


# -- the estimator ----------------------------------------------------------------------------
def _check_sources(given: Sequence[Source] | None, found: tuple[Source, ...], run: Trajectory,
                   step: int) -> tuple[Source, ...]:
    if given is None:
        chosen = found
    else:
        chosen = tuple(given)
        if not all(isinstance(s, Source) for s in chosen):
            raise InvalidInput("sources= takes the Source objects car.context_sources returns",
                               hint="pick from car.context_sources(run, step) and pass those")
    if len(chosen) < 1:
        raise InvalidInput(f"step {step} of run {run.id} decided from nothing that can be "
                           "taken out", run_id=run.id, step=step,
                           hint="pick a step whose state holds messages or context")
    # number them 0.. in the order given: masks and results index this tuple
    return tuple(Source(i, s.label, s.text, s.path, s.span, s.blank) for i, s in enumerate(chosen))


def screen_looks(rollouts: int) -> list[int]:
    """The numbers of pairs after which the screen looks: a quarter of the rollouts first,
    then a sixteenth more at a time, up to ``SCREEN_SHARE`` of them."""
    most = max(2, int(rollouts * SCREEN_SHARE) // 2)
    looks = [min(most, max(2, int(rollouts * SCREEN_FIRST) // 2))]
    step = max(1, int(rollouts * SCREEN_STEP) // 2)
    while looks[-1] < most:
        looks.append(min(most, looks[-1] + step))
    return looks


def _leads(signs: np.ndarray, diffs: np.ndarray, top: int, j: int, z: float) -> bool:
    """Whether the screen shows source ``top``'s effect above source ``j``'s at the one-sided
    level whose normal quantile is ``z``: each pair's contribution to the gap of the two
    Banzhaf estimates is ``(s_top − s_j)·(y_a − y_b)``, and the pairs are independent units."""
    gap = (signs[:, top] - signs[:, j]) * diffs
    n = len(gap)
    se = float(np.std(gap, ddof=1)) / math.sqrt(n) if n > 1 else math.inf
    return float(gap.mean()) > z * se


@dataclass(frozen=True)
class _Screen:
    """What the screen's pairs say: per pair the halves' outcomes and each source's sign
    (+1 kept in the first half), the surrogate's weights, and the sources to confirm."""

    ya: np.ndarray
    yb: np.ndarray
    signs: np.ndarray
    weights: np.ndarray
    candidates: list[int]
    clear: bool


def _read_screen(masks: np.ndarray, done: list[int], ya: np.ndarray, yb: np.ndarray,
                 z: float) -> _Screen:
    """Fit the surrogate and choose the candidates: the top source by weight, and those the
    screen does not show to trail it that carry at least ``FOCUS`` of its weight (they could
    be as strong: a second cause of an interaction). ``clear`` when the screen shows the top
    ahead of every other source, zero weights included: it is then confirmed alone, with all
    the rollouts the screen has not spent."""
    signs = np.where(masks[done], 1.0, -1.0)
    diffs = ya - yb
    weights = surrogate(signs, diffs)
    effects = (signs * diffs[:, None]).mean(axis=0)
    order = sorted(range(masks.shape[1]), key=lambda j: (-weights[j], -effects[j]))
    top = order[0]
    if weights[top] <= 0:
        return _Screen(ya, yb, signs, weights, [], False)
    rivals = [j for j in order[1:] if not _leads(signs, diffs, top, j, z)]
    cands = [top] + [j for j in rivals if weights[j] > 0 and weights[j] >= FOCUS * weights[top]]
    return _Screen(ya, yb, signs, weights, cands[:CANDIDATES], not rivals)


def _screen(arms: StepArms, srcs: tuple[Source, ...], step: int, rollouts: int,
            rng: np.random.Generator, run: Trajectory) -> _Screen:
    """Antithetic pairs of random ablations, looked at after each batch: the screen stops
    once its top source is clear of all others (the rest of the budget confirms it), or at
    ``SCREEN_SHARE`` of the rollouts."""
    m = len(srcs)
    looks = screen_looks(rollouts)
    masks = rng.random((looks[-1], m)) < 0.5
    z = z_value(2 * RIVAL_LEVEL - 1)  # the one-sided quantile at RIVAL_LEVEL

    def jobs_for(r: int) -> list[tuple[str, int, Any]]:
        out = []
        for half, kept in (("a", masks[r]), ("b", ~masks[r])):
            removed = [j for j in range(m) if not kept[j]]
            out.append((f"mask-{r}{half}", r, do_context(step, remover(srcs, removed),
                                                         label=f"ablate {sorted(removed)}")))
        return out

    got: dict[tuple[str, int], Any] = {}
    start = 0
    screen: _Screen | None = None
    for upto in looks:
        got.update(arms.run_arms([job for r in range(start, upto) for job in jobs_for(r)]))
        start = upto
        done = [r for r in range(upto) if (f"mask-{r}a", r) in got and (f"mask-{r}b", r) in got]
        if len(done) >= 2:
            ya = np.array([got[(f"mask-{r}a", r)].value for r in done])
            yb = np.array([got[(f"mask-{r}b", r)].value for r in done])
            screen = _read_screen(masks, done, ya, yb, z)
            if screen.clear:
                break
        if arms.meter.tripped:
            break
    if screen is None:
        raise BudgetExhausted(f"fewer than two ablation pairs could run "
                              f"({arms.meter.tripped or 'their branches failed'})",
                              run_id=run.id, hint="raise rollouts (or the budget)")
    return screen


def confirm_sizes(remaining: int, candidates: int, paired: bool) -> tuple[int, int]:
    """Rollouts of the full-context arm and of each removal arm. Paired: equal, since only
    index-matched rollouts enter the sign test. Unpaired: Neyman's allocation for ``k``
    differences that share the full arm (``n_full = √k · n_removal`` minimises the summed
    variance when the arms' variances are equal); for one candidate, an even split."""
    if paired:
        n = remaining // (candidates + 1)
        return n, n
    n = int(remaining // (candidates + math.sqrt(candidates)))
    return remaining - candidates * n, n


def context_attribution(run: Trajectory, agent: Agent, *, step: int, outcome: OutcomeLike,
                        rollouts: int = defaults.CONTEXT_ROLLOUTS,
                        sources: Sequence[Source] | None = None,
                        splitter: Splitter | None = None, alpha: float = defaults.ALPHA,
                        level: float = defaults.LEVEL, seed: int = 0,
                        budget: Budget | int | None = None, executor: ExecutorLike = None,
                        force_agent: bool = False,
                        max_budget: int = defaults.MAX_BUDGET) -> ContextAttribution:
    """Which sources of the state step ``step`` decided from made ``run`` fail (see the module
    docstring). ``rollouts`` is the whole budget (at least 8, at most ``max_budget`` unless
    raised); ``sources`` restricts the attribution to some of
    ``car.context_sources(run, step, splitter)``."""
    check_rollouts(rollouts, 8, max_budget, "max_budget=")
    check_level(level)
    if not 0.0 < alpha < 1.0:
        raise InvalidInput(f"alpha={alpha} is outside (0, 1)", hint="use e.g. alpha=0.05")
    arms = StepArms(run, agent, outcome, step=step, seed=seed,
                    budget=capped(budget, rollouts), executor=executor, force_agent=force_agent)
    srcs = _check_sources(sources, split(state_of(run, step), splitter, before_run(run, step)),
                          run, step)
    m = len(srcs)
    rng = np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=(7, step)))
    sc = _screen(arms, srcs, step, rollouts, rng, run)
    ya, yb, signs, weights = sc.ya, sc.yb, sc.signs, sc.weights
    measured = _coupling(ya, yb, signs[:, int(np.argmax(np.abs(weights)))])
    paired = measured.shared
    screened = []
    for j in range(m):
        kept = [float(a if s > 0 else b) for a, b, s in zip(ya, yb, signs[:, j], strict=True)]
        removed = [float(b if s > 0 else a) for a, b, s in zip(ya, yb, signs[:, j], strict=True)]
        d = difference(kept, removed, level, paired=True)  # the pair is the sampling unit
        screened.append(SourceEffect(srcs[j], d.estimate, Interval(*d.ci, level),
                                     float(weights[j]), len(ya)))
    cands = sc.candidates
    p_full: float | None = None
    test = "sign test on paired rollouts" if paired else "Boschloo's exact test"
    n_full, n_each = confirm_sizes(arms.remaining, len(cands), paired) if cands else (0, 0)
    if cands and n_each >= 2:
        base = screen_looks(rollouts)[-1]  # rollout indices the screen never used
        jobs = [("full", base + r, do_context(step, keep_all, label="full context"))
                for r in range(n_full)]
        for j in cands:
            jobs += [(f"without-{j}", base + r, do_context(step, remover(srcs, [j])))
                     for r in range(n_each)]
        conf = arms.run_arms(jobs)
        full = {r: conf[("full", base + r)].value for r in range(n_full)
                if ("full", base + r) in conf}
        p_full = sum(full.values()) / len(full) if full else None
        pvals, rows = [], []
        for j in cands:
            without = {r: conf[(f"without-{j}", base + r)].value for r in range(n_each)
                       if (f"without-{j}", base + r) in conf}
            if paired:  # only index-matched rollouts pair up
                rs = [r for r in without if r in full]
                a, b = [full[r] for r in rs], [without[r] for r in rs]
            else:
                a, b = list(full.values()), list(without.values())
            rows.append((a, b))
            pvals.append(one_sided(a, b, paired) if a and b else 1.0)
        verdicts = holm(pvals, alpha)
        rescue_level = 1.0 - alpha / len(cands)
        for j, (a, b), p, named in zip(cands, rows, pvals, verdicts, strict=True):
            loo = difference(a, b, rescue_level, paired=paired) if a and b else None
            s = screened[j]
            screened[j] = SourceEffect(
                s.source, s.effect, s.ci, s.weight, s.pairs,
                rescue=None if loo is None else loo.estimate,
                rescue_ci=None if loo is None else _rescue_interval(loo.ci, rescue_level, named),
                p_value=p, named=named)
    arms.finish()
    # undecided: candidates left unconfirmed for want of rollouts, or the budget cut it short
    truncated = (bool(cands) and n_each < 2) or bool(arms.meter.tripped)
    return ContextAttribution(
        run_id=run.id, step=step, sources=tuple(screened), alpha=alpha, level=level, seed=seed,
        rollouts_used=arms.meter.rollouts, budget=rollouts, p_full=p_full, coupled=paired,
        coupling=measured, coupling_note=arms.noise_note, truncated=truncated,
        budget_note=arms.meter.tripped, failures=arms.failure_rows(), test=test)


def context_sources(run: Trajectory, step: int, splitter: Splitter | None = None
                    ) -> tuple[Source, ...]:
    """The sources ``car.context_attribution`` would attribute at ``step`` (to pick from)."""
    if not is_whole(step) or not 0 <= step < len(run.steps):
        raise InvalidInput(f"step={step!r} is not a step of run {run.id}",
                           hint=f"pass a step between 0 and {len(run.steps) - 1}")
    return split(state_of(run, step), splitter, before_run(run, step))

