"""Which fix would have prevented the failure: candidate repairs at a step, each re-run and
ranked by P(failure) with simultaneous intervals.

Every candidate (an intervention, or several, at the step: a source removed with
``do_context``, a system-prompt line added, a guard on a tool's output with ``do_observation``,
a different policy with ``do_policy``, anything the user passes or a ``propose`` hook returns)
is an arm; so is the step left as it was (``unrepaired``: re-decided from the state it saw).
Arms grow together, a batch of rollouts each at every look (``LOOKS`` looks), rollout ``r`` of
every arm on the same noise where the agent takes CAR's.

Simultaneous coverage: each arm's P(failure) has a Wilson interval at ``1 − alpha / (A·L)`` for
``A`` arms and ``L`` looks, so with probability ``≥ 1 − alpha`` every interval of every arm at
every look covers at once (Bonferroni). On that event successive elimination never drops the
best candidate: a candidate is dropped only once its lower end is above another arm's upper
end. The ranking stops early when one candidate is left and its interval lies below the
unrepaired arm's; it is then the best at level ``alpha`` and a repair that works. A
candidate's *rescue* is ``P(fail | unrepaired) − P(fail | repaired)``; its interval
is read off the two simultaneous intervals (low: theirs minus ours at the far ends), so it
covers with them, and ``validated`` says its lower end is above zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from car_core import defaults
from car_core.engine.agent import Agent
from car_core.engine.execution import ExecutorLike
from car_core.errors import InvalidInput
from car_core.estimators._arms import StepArms, check_rollouts
from car_core.model.budget import Budget
from car_core.model.context_sources import Source, keep_all, remover, state_of
from car_core.model.interventions import (
    EditContext,
    Intervention,
    SwapPolicy,
    as_list,
    do_context,
    do_observation,
)
from car_core.model.json_values import JSON
from car_core.model.outcome import OutcomeLike
from car_core.model.trajectory import History, Trajectory, is_failure
from car_core.stats import Coupling, Interval, check_level, coupling_of, wilson

LOOKS = (0.25, 0.5, 0.75, 1.0)  # shares of the per-arm cap at which the ranking looks
UNREPAIRED = "unrepaired"


@dataclass(frozen=True)
class Candidate:
    """A repair to try: a label a reader understands, its kind and its interventions."""

    label: str
    interventions: tuple[Intervention, ...]
    kind: str = "user"

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "kind": self.kind,
                "interventions": [i.to_dict() for i in self.interventions]}


def remove_sources(step: int, sources: Sequence[Source], label: str = "") -> Candidate:
    """Take ``sources`` (from ``car.context_sources`` or a context attribution) out of what
    ``step`` decides from."""
    chosen = list(sources)
    edit = remover(chosen, [s.index for s in chosen])
    text = label or "remove " + ", ".join(s.label for s in chosen)
    return Candidate(text, (do_context(step, edit, label=text),), "remove source")


def add_instruction(step: int, text: str, label: str = "") -> Candidate:
    """Add a system-prompt line before ``step`` decides: a system message after the existing
    ones in chat messages; for a ``FunctionAgent`` whose context is a message list, the same
    there; else an ``instruction`` key in a dict context."""
    def edit(state: Any) -> Any:
        if isinstance(state, History):
            return History(_with_instruction(state.context, text), state.steps, state.index)
        return _with_instruction(state, text)
    name = label or f"add instruction: {text}"
    return Candidate(name, (do_context(step, edit, label=name),), "system prompt")


def _with_instruction(state: Any, text: str) -> Any:
    if isinstance(state, list):
        at = 0
        while at < len(state) and isinstance(state[at], dict) and state[at].get("role") == "system":
            at += 1
        return [*state[:at], {"role": "system", "content": text}, *state[at:]]
    if isinstance(state, dict):
        return {**state, "instruction": text}
    raise InvalidInput(f"cannot add an instruction to a state of type {type(state).__name__}",
                       hint="pass your own do_context candidate for this agent")


def guard_observation(step: int, observation: JSON, label: str = "") -> Candidate:
    """Replace what the tool returned at ``step`` (the guard's cleaned or refused output);
    ``step`` may be before the step being repaired, whose state holds that result."""
    name = label or f"guard the tool result at step {step}"
    return Candidate(name, (do_observation(step, observation),), "guard")


def as_candidate(value: Any) -> Candidate:
    """A ``Candidate`` from one, an intervention, a list of them, or ``(label, interventions)``."""
    if isinstance(value, Candidate):
        return value
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        return Candidate(value[0], tuple(as_list(value[1])))
    items = tuple(as_list(value))
    if not items:
        raise InvalidInput("an empty candidate", hint="give each candidate an intervention")
    label = "; ".join(f"{i.kind} at {i.step}" + (f" ({i.label})" if isinstance(
        i, (EditContext, SwapPolicy)) and i.label else "") for i in items)
    return Candidate(label, items)


@dataclass(frozen=True)
class RepairEstimate:
    """One arm: P(failure) with its simultaneous interval and, for a candidate, its rescue."""

    candidate: Candidate
    p_fail: float
    ci: Interval
    n: int
    rescue: float | None = None
    rescue_ci: Interval | None = None
    dropped_at: int | None = None  # rollouts per arm when it was dropped as clearly worse
    example_action: JSON = None  # an action the step took on a branch this repair rescued

    @property
    def validated(self) -> bool:
        return self.rescue_ci is not None and self.rescue_ci[0] > 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**self.candidate.to_dict(), "p_fail": self.p_fail, "ci": list(self.ci),
                "n": self.n, "rescue": self.rescue,
                "rescue_ci": None if self.rescue_ci is None else list(self.rescue_ci),
                "validated": self.validated, "dropped_at": self.dropped_at,
                "example_action": self.example_action}


@dataclass(frozen=True)
class RepairRanking:
    """Candidates ranked by P(failure) (best first), the unrepaired arm, and the best when the
    data single it out at level ``alpha``."""

    run_id: str
    step: int
    unrepaired: RepairEstimate
    ranked: tuple[RepairEstimate, ...]
    best: RepairEstimate | None
    alpha: float
    level: float  # each interval's own level: 1 − alpha / (arms · looks)
    seed: int
    rollouts_used: int
    stopped_early: bool
    truncated: bool = False
    budget_note: str | None = None
    coupling: Coupling = Coupling(None, None, 0)
    failures: tuple[dict[str, Any], ...] = ()

    @property
    def coupled(self) -> bool:
        """Whether the arms were measured to share noise (rollout by rollout agreement)."""
        return self.coupling.shared

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "repairs", "run_id": self.run_id, "step": self.step,
                "unrepaired": self.unrepaired.to_dict(),
                "ranked": [r.to_dict() for r in self.ranked],
                "best": None if self.best is None else self.best.candidate.label,
                "alpha": self.alpha, "level": self.level, "seed": self.seed,
                "rollouts_used": self.rollouts_used, "stopped_early": self.stopped_early,
                "truncated": self.truncated, "budget_note": self.budget_note,
                "coupled": self.coupled, "coupling": self.coupling.to_dict(),
                "failures": list(self.failures)}

    def __str__(self) -> str:
        u = self.unrepaired
        lines = [f"Repairs at step {self.step} of run {self.run_id} ({self.rollouts_used} "
                 f"rollouts; intervals hold together at {1 - self.alpha:.0%})",
                 f"  unrepaired: P(fail) {u.p_fail:.3f} [{u.ci[0]:.3f}, {u.ci[1]:.3f}] n={u.n}"]
        for i, r in enumerate(self.ranked, 1):
            assert r.rescue is not None and r.rescue_ci is not None
            mark = "  ◀ best" if self.best is r else ("  (dropped)" if r.dropped_at else "")
            lines.append(f"  {i}. {r.candidate.label}: P(fail) {r.p_fail:.3f} "
                         f"[{r.ci[0]:.3f}, {r.ci[1]:.3f}] n={r.n}, rescue {r.rescue:+.3f} "
                         f"[{r.rescue_ci[0]:+.3f}, {r.rescue_ci[1]:+.3f}]{mark}")
        if self.best is None:
            lines.append("no single best repair at this budget (raise rollouts to separate "
                         "the leaders)")
        return "\n".join(lines)


def _estimate(values: list[float], level: float) -> tuple[float, Interval]:
    mean = sum(values) / len(values)
    return mean, Interval(*wilson(mean, len(values), level), level)


def repairs(run: Trajectory, agent: Agent, *, step: int, candidates: Iterable[Any],
            outcome: OutcomeLike, rollouts: int = defaults.REPAIR_ROLLOUTS,
            alpha: float = defaults.ALPHA, seed: int = 0,
            propose: Callable[[Trajectory, int, Any], Iterable[Any]] | None = None,
            budget: Budget | int | None = None, executor: ExecutorLike = None,
            force_agent: bool = False,
            max_rollouts: int = defaults.MAX_ROLLOUTS) -> RepairRanking:
    """Rank ``candidates`` at ``step`` (see the module docstring). ``rollouts`` caps each arm
    (at most ``max_rollouts`` unless raised); ``propose(run, step, state)`` may add candidates
    (the user's own model, say)."""
    check_rollouts(rollouts, 4, max_rollouts, "max_rollouts=")
    if not 0.0 < alpha < 1.0:
        raise InvalidInput(f"alpha={alpha} is outside (0, 1)", hint="use e.g. alpha=0.05")
    arms = StepArms(run, agent, outcome, step=step, seed=seed, budget=budget,
                    executor=executor, force_agent=force_agent)
    cands = [as_candidate(c) for c in candidates]
    if propose is not None:
        cands += [as_candidate(c) for c in propose(run, step, state_of(run, step))]
    if not cands:
        raise InvalidInput("no candidate repair to rank",
                           hint="pass candidates=[car.do_context(k, edit), …] or a propose hook")
    for c in cands:
        for i in c.interventions:
            if i.step < step and i.kind != "observation":
                raise InvalidInput(f"candidate {c.label!r} intervenes at step {i.step}, before "
                                   f"the step being repaired ({step})", run_id=run.id, step=step,
                                   hint="a repair acts at the step or after it (a guard may "
                                        "replace a tool result the step saw)")
    base = Candidate(UNREPAIRED, (do_context(step, keep_all, label=UNREPAIRED),), "none")
    arm_of = {"arm-0": base, **{f"arm-{i + 1}": c for i, c in enumerate(cands)}}
    level = 1.0 - alpha / (len(arm_of) * len(LOOKS))
    check_level(level)
    sizes = sorted({max(1, math.ceil(rollouts * f)) for f in LOOKS})
    values: dict[str, list[float]] = {a: [] for a in arm_of}
    rescued: dict[str, JSON] = {}
    active = set(arm_of)
    dropped: dict[str, int] = {}
    done = 0
    stopped_early = False
    for size in sizes:
        jobs = [(a, r, list(arm_of[a].interventions)) for r in range(done, size)
                for a in sorted(active)]
        got = arms.run_arms(jobs)
        for (a, _), b in sorted(got.items(), key=lambda kv: kv[0][1]):
            values[a].append(b.value)
            if a != "arm-0" and not is_failure(b.value) and a not in rescued:
                rescued[a] = b.action
        done = size
        if arms.meter.tripped or any(not values[a] for a in active):
            break
        bounds = {a: _estimate(values[a], level)[1] for a in active}
        lowest_high = min(bounds[a][1] for a in active if a != "arm-0") if len(active) > 1 else 1
        for a in sorted(active - {"arm-0"}):
            if bounds[a][0] > lowest_high:
                active.discard(a)
                dropped[a] = size
        left = active - {"arm-0"}
        if len(left) == 1 and size < sizes[-1]:
            (only,) = left
            if bounds["arm-0"][0] > bounds[only][1]:  # the one left is best and rescues
                stopped_early = True
                break
    arms.finish()
    if not values["arm-0"]:
        raise InvalidInput("no rollout of the unrepaired arm could run", run_id=run.id,
                           step=step, hint="raise the budget")
    p0, ci0 = _estimate(values["arm-0"], level)
    unrepaired = RepairEstimate(base, p0, ci0, len(values["arm-0"]))
    rows = []
    for a, c in arm_of.items():
        if a == "arm-0" or not values[a]:
            continue
        p, ci = _estimate(values[a], level)
        rescue_ci = Interval(max(-1.0, ci0[0] - ci[1]), min(1.0, ci0[1] - ci[0]), level)
        rows.append(RepairEstimate(c, p, ci, len(values[a]), p0 - p, rescue_ci,
                                   dropped.get(a), rescued.get(a)))
    rows.sort(key=lambda r: (r.p_fail, r.dropped_at is not None))
    standing = [r for r in rows if r.dropped_at is None]
    best = (standing[0] if standing and (len(standing) == 1 or _clear(standing[0], rows))
            else None)
    return RepairRanking(run_id=run.id, step=step, unrepaired=unrepaired, ranked=tuple(rows),
                         best=best, alpha=alpha, level=level, seed=seed,
                         rollouts_used=arms.meter.rollouts, stopped_early=stopped_early,
                         truncated=bool(arms.meter.tripped), budget_note=arms.meter.tripped,
                         coupling=coupling_of([(values["arm-0"], values[a]) for a in arm_of
                                               if a != "arm-0" and values[a]]),
                         failures=arms.failure_rows())


def _clear(top: RepairEstimate, rows: Sequence[RepairEstimate]) -> bool:
    """The top candidate's upper end is below every other candidate's lower end."""
    return all(top.ci[1] < r.ci[0] for r in rows if r is not top)
