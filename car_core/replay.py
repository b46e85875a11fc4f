"""Held prefix, intervened step, live suffix: the engine behind every estimate.

``drive`` runs a ``FunctionAgent`` under a ``Plan``: steps before ``plan.start`` are copied from
the record (no policy call, no tool call), intervened steps take the plan's values, the rest run
live. ``record`` runs an agent from scratch; ``intervene`` runs K branches and reports the outcome
distribution with its Wilson interval; ``action_match_rate`` measures how faithfully a policy
re-decides the recorded states.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ._json import JSON, check_json
from .actions import same_action
from .budget import Budget, BudgetMeter, as_budget
from .errors import (
    AgentError,
    BudgetExhausted,
    CarError,
    EnvironmentError_,
    InvalidInput,
    InvalidIntervention,
    PolicyError,
)
from .estimators.stats import wilson, z_value
from .execution import Executor, Task, brancher, execute
from .interventions import Intervention, Plan, compile_plan
from .seeding import Noise, branch_noise
from .trajectory import History, Lineage, Outcome, Step, Trajectory

TERMINAL_STATUSES = ("complete", "max_steps")


def call_policy(policy: Callable[..., JSON], history: History, rng: np.random.Generator,
                k: int, run_id: str | None) -> JSON:
    try:
        action = policy(history, rng)
    except CarError:
        raise
    except Exception as exc:  # the user's policy: report which step broke
        raise PolicyError(f"the policy raised {exc!r}", run_id=run_id, step=k,
                          hint="fix the policy; CAR calls it as policy(history, rng)") from exc
    try:
        check_json(action, f"the action returned at step {k}")
    except InvalidInput as exc:
        raise PolicyError(str(exc), run_id=run_id, step=k) from exc
    return action


def policy_meta(policy: Any) -> dict[str, Any]:
    """What a policy reports about its last decision in this thread (model, token usage,
    seed, latency) through an optional ``step_meta()`` method; kept in the step's meta so
    budgets can count tokens and money without the action carrying them."""
    take = getattr(policy, "step_meta", None)
    meta = take() if callable(take) else None
    return dict(meta) if isinstance(meta, dict) else {}


def call_environment(env: Callable[..., JSON], history: History, action: JSON,
                     rng: np.random.Generator, k: int, run_id: str | None) -> JSON:
    try:
        obs = env(history, action, rng)
    except CarError:
        raise
    except Exception as exc:
        raise EnvironmentError_(f"the environment raised {exc!r}", run_id=run_id, step=k,
                                hint="fix the environment; CAR calls it as "
                                     "environment(history, action, rng)") from exc
    try:
        check_json(obs, f"the observation returned at step {k}")
    except InvalidInput as exc:
        raise EnvironmentError_(str(exc), run_id=run_id, step=k) from exc
    return obs


def _apply_edit(edit: Callable[[Any], Any], history: History, run_id: str, k: int) -> History:
    try:
        edited = edit(history)
    except CarError:
        raise
    except Exception as exc:  # the user's edit: say which intervention broke
        raise InvalidIntervention(f"the do_context edit raised {exc!r}", run_id=run_id, step=k,
                                  hint="fix the edit; it receives the car.History step "
                                       f"{k} decides from and returns it edited") from exc
    if not isinstance(edited, History):
        raise InvalidIntervention(
            f"do_context edit returned {type(edited).__name__}, not a car.History",
            run_id=run_id, step=k,
            hint="for FunctionAgent the edit takes and returns a car.History "
                 "(e.g. dataclasses.replace(h, context=...))")
    if edited.index != len(edited.steps):
        edited = History(edited.context, tuple(edited.steps), len(edited.steps))
    return edited


def drive(agent: Any, run: Trajectory, plan: Plan, noise: Noise) -> Trajectory:
    """Run ``agent`` (a FunctionAgent) forward from ``run`` under ``plan``."""
    prefix = [Step(s.index, s.action, s.observation, s.observed, s.state,
                   {**s.meta, "origin": "held"}) for s in run.steps[:plan.start]]
    history = History(run.context, tuple(prefix), plan.start)
    status = "complete"
    done = bool(prefix) and agent.finished(prefix[-1].action)
    k = plan.start
    edits = dict(plan.context_edits)  # each edit applies once, even if it shortens the history
    while not done:
        if k >= agent.max_steps:
            status = "max_steps"
            break
        edited = k in edits
        if edited:
            history = _apply_edit(edits.pop(k), history, run.id, k)
            k = history.index
        policy = agent.policy
        swapped = plan.policy is not None and k >= plan.policy[0]
        if swapped:
            policy = plan.policy[1]  # type: ignore[index]
        meta: dict[str, Any] = {}
        if k in plan.forced_actions and not edited:
            action = plan.forced_actions[k]
        else:
            action = call_policy(policy, history, noise.rng(k, "policy"), k, run.id)
            meta = policy_meta(policy)
            if meta:
                check_json(meta, f"the step_meta() of the policy at step {k}")
        final = agent.finished(action)
        observed, obs = False, None
        if k in plan.forced_observations:
            observed, obs = True, plan.forced_observations[k]
        elif agent.environment is not None and not final:
            observed = True
            obs = call_environment(agent.environment, history, action,
                                   noise.rng(k, "environment"), k, run.id)
        if edited:
            origin = "edited"
        elif k in plan.context_edits:  # reached again after an edit that dropped steps
            origin = "policy-swapped" if swapped else "live"
        else:
            origin = plan.origin(k)
        step = Step(index=k, action=action, observation=obs, observed=observed,
                    meta={**meta, "origin": origin})
        history = history.with_step(step)
        done = final
        k += 1
    fields: dict[str, Any] = {"seed": noise.seed, "agent": getattr(agent, "name", ""),
                              "status": status}
    if plan.context_edits:  # an edit may have put anything in the history: check it all
        return Trajectory.new(context=history.context, steps=list(history.steps), **fields)
    return Trajectory._from_checked(context=history.context, steps=list(history.steps), **fields)


def record(agent: Any, *, context: JSON = None, outcome: Callable[..., Any], seed: int = 0,
           store: Any = None) -> Trajectory:
    """Run ``agent`` once from ``context`` and score it; the run is the factual record."""
    from .agent import OutcomeFn
    out = OutcomeFn(outcome)
    noise = Noise(seed)
    run = _returned_run(agent.start(context, noise), agent, "start")
    value = out(run, noise.rng(0, "outcome"))
    run = replace(run, outcome=Outcome(value), seed=noise.seed)
    if store is not None:
        store.save(run)
    return run


def _returned_run(value: Any, agent: Any, method: str) -> Trajectory:
    if not isinstance(value, Trajectory):
        raise AgentError(f"{type(agent).__name__}.{method} returned {type(value).__name__}, "
                         "not a car.Trajectory",
                         hint="an Agent's start and branch must return car.Trajectory "
                              "(see car_core.agent.Agent)")
    return value


def run_branch(run: Trajectory, agent: Any, outcome: Any, task: Task) -> Trajectory:
    """One rollout: the agent's branch under the task's plan, scored, with its lineage."""
    traj = _returned_run(agent.branch(run, task.plan, task.noise), agent, "branch")
    value = outcome(traj, task.noise.rng(0, "outcome"))
    lineage = Lineage(parent_id=run.id, interventions=tuple(task.plan.describe()),
                      branch_step=task.plan.start if task.plan.interventions else None,
                      arm=task.arm, rollout=task.rollout)
    return replace(traj, outcome=Outcome(value), lineage=lineage)


@dataclass(frozen=True)
class OutcomeDistribution:
    """P(failure | do(·)) estimated from ``n`` rollouts, with its Wilson interval."""

    mean: float
    ci: tuple[float, float]
    n: int
    level: float
    values: tuple[float, ...]
    trajectories: tuple[Trajectory, ...]
    interventions: tuple[dict[str, Any], ...]
    coupled: bool
    seed: int
    rollouts_used: int
    truncated: bool
    budget_note: str | None = None
    tokens: int = 0
    cost: float = 0.0
    failures: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci": list(self.ci), "n": self.n, "level": self.level,
                "values": list(self.values), "interventions": list(self.interventions),
                "coupled": self.coupled, "seed": self.seed, "rollouts_used": self.rollouts_used,
                "truncated": self.truncated, "budget_note": self.budget_note,
                "tokens": self.tokens, "cost": self.cost, "failures": list(self.failures),
                "branch_ids": [t.id for t in self.trajectories]}

    def __str__(self) -> str:
        lo, hi = self.ci
        return (f"P(failure) = {self.mean:.3f}  [{lo:.3f}, {hi:.3f}] at {self.level:.0%}, "
                f"n={self.n}{' (truncated)' if self.truncated else ''}")


def check_run(run: Trajectory) -> None:
    if not isinstance(run, Trajectory):
        raise InvalidInput(f"expected a car.Trajectory, got {type(run).__name__}",
                           hint="record one with car.record or load it with RunStore.load")
    run.verify()


def intervene(run: Trajectory, agent: Any, interventions: Intervention | Sequence[Intervention],
              *, outcome: Callable[..., Any], rollouts: int = 64, seed: int = 0,
              coupled: bool = True, level: float = 0.95, budget: Budget | int | None = None,
              executor: Executor | None = None, progress: Any = None) -> OutcomeDistribution:
    """Apply ``interventions`` to ``run`` and estimate the outcome distribution from
    ``rollouts`` branches. Branch ``r`` draws its noise from stream ``(seed, r)``, shared by
    every call with the same seed when ``coupled`` (common random numbers)."""
    from .agent import OutcomeFn
    check_run(run)
    if isinstance(rollouts, bool) or not isinstance(rollouts, int) or rollouts < 1:
        raise InvalidInput(f"rollouts={rollouts!r}: need at least one rollout",
                           hint="pass rollouts=K with K >= 1 (32–64 is typical)")
    out = OutcomeFn(outcome)
    z_value(level)  # a bad level fails here, not after every rollout has run
    Noise(seed)  # likewise a bad seed
    plan = compile_plan(run, interventions)
    coupled = bool(coupled and getattr(agent, "couples_noise", False))
    arm = plan.describe()
    tasks = [Task(arm="intervention", rollout=r, plan=plan,
                  noise=branch_noise(seed, r, arm, coupled)) for r in range(rollouts)]
    meter = BudgetMeter(as_budget(budget))  # a car.Budget or a rollout count, as elsewhere
    results = execute(tasks, brancher(run, agent, out), meter,
                      executor=executor, progress=progress, label="intervene")
    trajs = tuple(traj for _, traj in sorted(results, key=lambda tr: tr[0].rollout))
    if not trajs and results.failures:  # every branch failed twice: the agent is broken
        first = results.failures[0]
        if first.exception is not None:
            raise first.exception
        raise AgentError(f"every branch failed; the first: {first.error}", run_id=run.id)
    if not trajs:
        raise BudgetExhausted(f"no rollout could run: {meter.tripped or 'the budget tripped'}",
                              run_id=run.id, hint="raise the budget")
    values = tuple(t.outcome.value for t in trajs if t.outcome is not None)
    mean = sum(values) / len(values)
    return OutcomeDistribution(
        mean=mean, ci=wilson(mean, len(values), level), n=len(values), level=level,
        values=values, trajectories=trajs, interventions=tuple(arm), coupled=coupled,
        seed=seed, rollouts_used=meter.rollouts, truncated=len(values) < rollouts,
        budget_note=meter.tripped, tokens=meter.tokens, cost=meter.cost,
        failures=tuple(f.to_dict() for f in results.failures))


@dataclass(frozen=True)
class ActionMatch:
    """How often re-deciding a recorded state reproduces the recorded action."""

    per_step: tuple[float, ...]
    replays: int
    steps: tuple[int, ...] = ()  # the step each entry of per_step measured

    @property
    def rate(self) -> float:
        return sum(self.per_step) / len(self.per_step) if self.per_step else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"rate": self.rate, "per_step": list(self.per_step), "replays": self.replays,
                "steps": list(self.steps)}


def action_match_rate(run: Trajectory, agent: Any, replays: int = 4) -> ActionMatch:
    """Re-decide every recorded state ``replays`` times with the run's own seed and report,
    per step, the fraction that gave back the recorded action (``car_core.actions.same_action``:
    tool-call ids and other provider-assigned fields do not count). Steps the agent's own policy did
    not decide from the recorded state (held, forced, edited, policy-swapped) are skipped;
    ``steps`` says which were measured."""
    check_run(run)
    if isinstance(replays, bool) or not isinstance(replays, int) or replays < 1:
        raise InvalidInput(f"replays={replays!r}: need at least one", hint="pass replays >= 1")
    noise = Noise(int(run.seed or 0))
    per_step, measured = [], []
    for k, step in enumerate(run.steps):
        if step.meta.get("origin") in ("forced", "held", "edited", "policy-swapped"):
            continue
        hits = sum(same_action(agent.redecide(run, k, noise), step.action)
                   for _ in range(replays))
        per_step.append(hits / replays)
        measured.append(k)
    return ActionMatch(tuple(per_step), replays, tuple(measured))
