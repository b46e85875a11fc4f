"""The point of commitment: the latest step whose resampling rescues the run.

Arms. ``H_j`` holds steps ``< j`` as recorded and runs steps ``>= j`` live (``do_resample(j)``;
``H_n`` holds every step and only re-draws the outcome). The rescue of step ``k`` is
``mean(H_{k+1}) − mean(H_k)``: the factual arm of step ``k`` is ``H_{k+1}``, estimated from
rollouts rather than taken from the one observed outcome, and neighbouring steps share arms.
Rollout ``r`` of every arm draws noise ``(seed, r)`` when the agent couples noise, so arms are
compared pair by pair (paired Newcombe interval); otherwise the arms are independent.

Error control. Each of the ``m`` tested steps gets ``α/m`` (Bonferroni), split over its ``L``
looks at the data in shares proportional to the square of the information fraction
(``stats.look_levels``); every interval is built at its look's level, so with probability
``>= 1 − α`` all of them cover at once. Hence the chance that any step whose true rescue is
``<= 0`` is declared significant — and so of naming a locus that does not matter — is ``<= α``
(FWER ``<= α``). The locus is the latest step whose interval lies above zero. ``level`` in the
result is the final look's level, the lowest any interval was built at.

Adaptive allocation. ``rollouts=K`` is a cap per arm. A test looks at its pairs at ``K/4``,
``K/2`` and ``K``; it stops once its interval excludes zero, and stops for futility at an
interim look of at least four pairs when its estimate is ``<= 0`` (futility stops never add
false positives; they only give up power on rescues too small to show at that sample size).

Search. ``"full"`` tests every step as above. ``"bisection"`` (``"auto"`` for runs of more than
eight steps) finds the step where the ``H`` curve last rises to ``H_n`` in about ``log2 n``
arms. Navigation rollouts (indices ``< K/4``) estimate ``H_0`` and ``H_n``, then bisect on
"``H_mid`` is below ``H_n``": decided by a paired interval at level ``1 − α``, by futility when
the estimate is ``<= 0`` on at least four pairs, else at the navigation cap by whether the
estimate exceeds half of ``H_n − H_0``. The candidate step is then confirmed on fresh rollouts
(indices ``K/4 … K``, independent of the navigation) with the sequential test above, ``m = 1``.
Navigation mistakes cost power, never error control: the locus is only ever named by the
confirmation interval, so FWER ``<= α`` still holds. Bisection assumes ``H`` reaches ``H_n``
once and stays there (one commitment point, or the latest one dominating); use
``search="full"`` when later steps may rescue the run by less than half of the total rise.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .. import defaults
from ..budget import Budget, as_budget
from ..errors import InvalidInput
from ..execution import Executor, Task
from ..interventions import Plan, compile_plan, do_resample
from ..stats import Difference, Interval, difference, look_levels, looks, wilson
from ..trajectory import Trajectory
from ._session import Session, check_run_has_steps
from .results import ArmEstimate, ContrastiveResult, StepEffect

SEARCHES = ("auto", "full", "bisection")
BISECT_ABOVE = 8  # "auto" bisects runs with more steps than this
MIN_FUTILITY_PAIRS = 4  # fewer pairs than this say too little to give up on a step


@dataclass(frozen=True)
class HoldArm:
    """Arm ``H_j``: steps ``< j`` held as recorded, the rest live."""

    hold_before: int

    @property
    def key(self) -> str:
        """The arm's name in tasks, lineages and the journal (the form earlier versions wrote,
        so their stored branches are still found on resume); never parsed back."""
        return f"hold<{self.hold_before}"


@dataclass(frozen=True)
class Comparison:
    """``H_hi − H_lo`` on a set of rollout indices, with the arm means it came from."""

    diff: Difference
    mean_hi: float
    mean_lo: float


class Arms:
    """Outcome values of the arms ``H_j`` by rollout index, filled on demand and shared."""

    def __init__(self, run: Trajectory, session: Session) -> None:
        self.run, self.session, self.n = run, session, len(run.steps)
        self.values: dict[int, dict[int, float]] = {}
        self.plans: dict[int, Plan] = {}
        self.examples: dict[int, dict[str, Any]] = {}  # one rescued branch (outcome 0) per arm
        self.by_key: dict[str, HoldArm] = {}

    def plan(self, j: int) -> Plan:
        if j not in self.plans:
            self.plans[j] = compile_plan(self.run, [do_resample(j)] if j < self.n else [])
        return self.plans[j]

    def fill(self, wants: dict[int, range]) -> None:
        """Run the missing rollouts of each arm, interleaved by index so a budget that trips
        leaves the arms evenly filled. Tasks are made as the executor asks for them, so a cap
        far above the budget costs only what the budget lets run."""
        if not wants:
            return
        arms = sorted(wants)

        def missing() -> Iterator[Task]:
            for r in range(min(w.start for w in wants.values()),
                           max(w.stop for w in wants.values())):
                for j in arms:
                    if r in wants[j] and r not in self.values.get(j, {}):
                        yield self.session.task(self._arm(j).key, r, self.plan(j))

        self.session.execute(missing(), self._keep)

    def _arm(self, j: int) -> HoldArm:
        arm = HoldArm(j)
        self.by_key[arm.key] = arm
        return arm

    def _keep(self, task: Task, value: float, traj: Trajectory) -> None:
        j = self.by_key[task.arm].hold_before
        self.values.setdefault(j, {})[task.rollout] = value
        if value == 0.0 and j not in self.examples:
            self.examples[j] = traj.to_dict()

    def compare(self, hi: int, lo: int, indices: range, level: float) -> Comparison | None:
        a, b = self.values.get(hi, {}), self.values.get(lo, {})
        # walk what was measured, not ``indices``: a cap far above the budget stays cheap
        if self.session.coupled:
            common = sorted(r for r in a if r in indices and r in b)
            xs, ys = [a[r] for r in common], [b[r] for r in common]
        else:
            xs = [a[r] for r in sorted(a) if r in indices]
            ys = [b[r] for r in sorted(b) if r in indices]
        if not xs or not ys:
            return None
        d = difference(xs, ys, level, paired=self.session.coupled)
        return Comparison(d, sum(xs) / len(xs), sum(ys) / len(ys))

    def all_values(self) -> list[float]:
        return [v for arm in self.values.values() for v in arm.values()]


def _check(rollouts: Any, alpha: Any, search: Any) -> None:
    if isinstance(rollouts, bool) or not isinstance(rollouts, int) or rollouts < 1:
        raise InvalidInput(f"rollouts={rollouts!r}: need at least one rollout per arm",
                           hint="pass rollouts=K with K >= 1 (32–64 is typical)")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise InvalidInput(f"alpha={alpha!r} is outside (0, 1)", hint="use e.g. alpha=0.05")
    if search not in SEARCHES:
        raise InvalidInput(f"search={search!r} is not one of {SEARCHES}",
                           hint='use "auto", "full" or "bisection"')


def _futile(c: Comparison, size: int, cap: int) -> bool:
    """Stop an interim look whose estimate is not even on the positive side."""
    return size < cap and size >= MIN_FUTILITY_PAIRS and c.diff.estimate <= 0


def _full(arms: Arms, n: int, cap: int, alpha: float) -> tuple[dict[int, Comparison], int, float]:
    sizes = looks(cap)
    levels = look_levels(sizes, alpha, n)
    tests: dict[int, Comparison] = {}
    open_steps = list(range(n))
    for s, level in zip(sizes, levels, strict=False):
        if not open_steps or arms.session.tripped:
            break
        arms.fill({j: range(s) for k in open_steps for j in (k, k + 1)})
        still_open = []
        for k in open_steps:
            c = arms.compare(k + 1, k, range(s), level)
            if c is None:
                continue
            tests[k] = c
            if not (c.diff.excludes_zero or _futile(c, s, cap)):
                still_open.append(k)
        open_steps = still_open
    return tests, n, levels[-1]


def _bisect(arms: Arms, n: int, cap: int, alpha: float
            ) -> tuple[dict[int, Comparison], int, float, str | None]:
    nav_cap = max(2, cap // 4)
    nav_sizes = looks(nav_cap, (0.5, 1.0))
    conf_sizes = looks(cap - nav_cap)
    conf_levels = look_levels(conf_sizes, alpha, 1)
    level = conf_levels[-1]
    nav_level = 1.0 - alpha
    arms.fill({0: range(nav_cap), n: range(nav_cap)})
    gate = arms.compare(n, 0, range(nav_cap), nav_level)
    if gate is None:
        return {}, 1, level, None
    rise = gate.diff.estimate
    if rise <= 0:
        return {}, 1, level, (f"holding the whole record does not raise the failure rate over "
                              f"resampling it from step 0 (H_n - H_0 = {rise:+.3f} on "
                              f"{gate.diff.n_a} rollouts), so bisection has nothing to follow; "
                              f'try search="full"')
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        below: bool | None = None
        for s in nav_sizes:
            arms.fill({mid: range(s), n: range(s)})
            c = arms.compare(n, mid, range(s), nav_level)
            if c is None or arms.session.tripped:
                break
            if c.diff.ci[0] > 0:
                below = True
            elif c.diff.estimate <= 0 and s >= MIN_FUTILITY_PAIRS:
                below = False
            elif s == nav_sizes[-1]:
                below = c.diff.estimate > rise / 2
            if below is not None:
                break
        if below is None:
            return {}, 1, level, None
        lo, hi = (mid, hi) if below else (lo, mid)
    tests: dict[int, Comparison] = {}
    for s, look_level in zip(conf_sizes, conf_levels, strict=False):
        fresh = range(nav_cap, nav_cap + s)
        arms.fill({lo: fresh, lo + 1: fresh})
        c = arms.compare(lo + 1, lo, fresh, look_level)
        if c is None:
            break
        tests[lo] = c
        if c.diff.excludes_zero or _futile(c, s, conf_sizes[-1]):
            break
        if arms.session.tripped:
            break
    return tests, 1, level, None


def contrastive(run: Trajectory, agent: Any, *, outcome: Any, rollouts: int = defaults.ROLLOUTS,
                alpha: float = defaults.ALPHA, seed: int = 0, coupled: bool = True,
                budget: Budget | int | None = None, search: str = "auto",
                executor: Executor | None = None, progress: Any = None, store: Any = None,
                attribution_id: str | None = None, force_agent: bool = False
                ) -> ContrastiveResult:
    """Find the point of commitment of ``run``: the latest step whose rescue interval lies
    above zero, with family-wise error ``<= alpha`` (see the module docstring for the arms,
    the looks and the search). ``rollouts`` caps the rollouts per arm; ``budget`` (a
    ``car.Budget`` or a rollout count) caps the whole estimate and is checked before each
    rollout — when it trips, the result keeps what was measured and says ``truncated``. An
    agent other than the one that recorded ``run`` is refused unless ``force_agent``."""
    check_run_has_steps(run)
    _check(rollouts, alpha, search)
    budget = as_budget(budget, "budget")
    n = len(run.steps)
    chosen = search if search != "auto" else (
        "bisection" if n > BISECT_ABOVE and rollouts >= 8 else "full")
    if chosen == "bisection" and rollouts < 4:
        raise InvalidInput(f"bisection needs rollouts >= 4 (got {rollouts})",
                           hint='raise rollouts or use search="full"')
    params = {"rollouts": rollouts, "alpha": alpha, "seed": seed, "coupled": coupled,
              "search": search, "budget": budget.to_dict() if budget else None,
              "agent": getattr(agent, "name", "")}
    session = Session(run, agent, outcome, method="contrastive", seed=seed, coupled=coupled,
                      budget=budget, executor=executor, progress=progress, store=store,
                      attribution_id=attribution_id, params=params, force_agent=force_agent)
    arms = Arms(run, session)
    reason: str | None = None
    if chosen == "full":
        tests, m, level = _full(arms, n, rollouts, alpha)
    else:
        tests, m, level, reason = _bisect(arms, n, rollouts, alpha)
    significant = [k for k, c in tests.items() if c.diff.ci[0] > 0]
    locus = max(significant) if significant else None
    values = arms.all_values()
    if locus is None:
        if session.failures:  # the arms are incomplete: no other reason can be trusted
            reason = session.failure_note()
        elif values and max(values) == min(values):
            reason = (f"the outcome never varied: all {len(values)} rollouts scored "
                      f"{values[0]:g} whatever was resampled, so nothing can be attributed "
                      f"at this sample size (raise rollouts if a step may still matter)")
        elif reason is None and session.tripped and not tests:
            reason = f"the budget tripped before any step could be tested ({session.tripped})"
        elif reason is None:
            reason = (f"no step's rescue interval lies above zero ({m} test(s) at level "
                      f"{level:.4f})")
    steps = tuple(_step(k, tests.get(k)) for k in range(n))
    arm_rows = tuple(ArmEstimate(j, sum(v.values()) / len(v),
                                 Interval(*wilson(sum(v.values()) / len(v), len(v), level), level),
                                 len(v))
                     for j, v in sorted(arms.values.items()) if v)
    result = ContrastiveResult(
        run_id=run.id, locus=locus, reason=reason, alpha=float(alpha), tests=m, level=level,
        rollouts_used=session.meter.rollouts, rollouts_cap=rollouts, seed=seed,
        coupled=session.coupled, truncated=session.tripped is not None,
        budget_note=session.tripped, tokens=session.meter.tokens,
        cost=round(session.meter.cost, 6), search=chosen, steps=steps, arms=arm_rows,
        example_branch=arms.examples.get(locus) if locus is not None else None,
        params=params, attribution_id=session.attribution_id,
        failures=session.failure_rows())
    session.finish(result.to_dict())
    return result


def _step(k: int, c: Comparison | None) -> StepEffect:
    if c is None:
        return StepEffect(step=k)
    return StepEffect(step=k, effect=c.diff.estimate, ci=Interval.of(c.diff.ci, c.diff.level),
                      tested=True,
                      significant=c.diff.ci[0] > 0, fail_held=c.mean_hi,
                      fail_resampled=c.mean_lo, n=min(c.diff.n_a, c.diff.n_b))
