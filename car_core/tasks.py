"""What an executor runs: a ``Task`` (one rollout of one arm, with its own plan and noise), a
``Failure`` (a branch that failed on every attempt) and ``run_branch`` (the task run and scored).

The base the execution backends (``car_core.execution``, ``car_core._ray``) and the replay
engine share, so none of them imports another to get at it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace
from typing import Any

from .branching import branch_scope
from .errors import AgentError
from .interventions import Plan
from .redact import describe
from .seeding import Noise
from .trajectory import Lineage, Outcome, Trajectory


@dataclass(frozen=True)
class Task:
    """One rollout to run: which arm it belongs to, its index, its plan and its noise."""

    arm: str
    rollout: int
    plan: Plan
    noise: Noise


@dataclass(frozen=True)
class Failure:
    """A branch that failed on every attempt, with the last error. Estimators leave it out of
    the estimate and report it (``to_dict``); it still counts as one rollout spent."""

    task: Task
    error: str
    attempts: int
    exception: BaseException | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"arm": self.task.arm, "rollout": self.task.rollout, "error": self.error,
                "attempts": self.attempts}


def describe_error(exc: BaseException) -> str:
    return describe(exc)  # kept with the results and stored: never with a key in it


def returned_run(value: Any, agent: Any, method: str) -> Trajectory:
    if not isinstance(value, Trajectory):
        raise AgentError(f"{type(agent).__name__}.{method} returned {type(value).__name__}, "
                         "not a car.Trajectory",
                         hint="an Agent's start and branch must return car.Trajectory "
                              "(see car_core.agent.Agent)")
    return value


def takes_stop(agent: Any) -> bool:
    """Whether ``agent.branch`` accepts ``stop=`` (ends a branch once its outcome is settled)."""
    try:
        return "stop" in inspect.signature(agent.branch).parameters
    except (TypeError, ValueError):
        return False


def run_branch(run: Trajectory, agent: Any, outcome: Any, task: Task) -> Trajectory:
    """One rollout: the agent's branch under the task's plan, scored, with its lineage. When
    the outcome says when a run is settled and the agent can stop, the branch ends there."""
    with branch_scope():
        if getattr(outcome, "settles", False) and takes_stop(agent):
            traj = agent.branch(run, task.plan, task.noise, stop=outcome.settled)
        else:
            traj = agent.branch(run, task.plan, task.noise)
    traj = returned_run(traj, agent, "branch")
    value = outcome(traj, task.noise.rng(0, "outcome"))
    lineage = Lineage(parent_id=run.id, interventions=tuple(task.plan.describe()),
                      branch_step=task.plan.start if task.plan.interventions else None,
                      arm=task.arm, rollout=task.rollout)
    return replace(traj, outcome=Outcome(value), lineage=lineage)
