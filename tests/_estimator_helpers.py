"""Agents for estimator tests: one that reports token usage on its live steps, so token
budgets can trip deterministically, and one whose ``preflight`` refuses chosen runs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import car_core as car

TOKENS_PER_STEP = 10


class TokenAgent:
    """Wraps a FunctionAgent; every live step of a branch reports ``TOKENS_PER_STEP`` tokens."""

    def __init__(self, base: car.FunctionAgent) -> None:
        self.base = base
        self.name = base.name
        self.couples_noise = True

    def start(self, context: Any, noise: Any) -> car.Trajectory:
        return self.base.start(context, noise)

    def branch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        traj = self.base.branch(run, plan, noise)
        steps = [replace(s, meta={**s.meta, "usage": {"prompt_tokens": TOKENS_PER_STEP,
                                                      "completion_tokens": 0}})
                 if s.meta.get("origin") == "live" else s for s in traj.steps]
        return car.Trajectory.new(context=traj.context, steps=steps, seed=traj.seed,
                                  agent=traj.agent, status=traj.status)

    def redecide(self, run: car.Trajectory, k: int, noise: Any) -> Any:
        return self.base.redecide(run, k, noise)


def counted(model: Any) -> tuple[car.FunctionAgent, Any]:
    """The model's agent with its policy and environment calls counted (``counter.calls``)."""
    from car_core.testing import CallCounter, Counters
    base = model.agent()
    policy, env = CallCounter(base.policy), CallCounter(base.environment)
    agent = car.FunctionAgent(policy=policy, environment=env, is_final=base.is_final,
                              max_steps=base.max_steps, name=base.name)
    return agent, Counters(policy, env)


class Preflighted:
    """Wraps an agent with a ``preflight`` that refuses some runs: ``why[run_id]`` is the
    error it raises; every branch is counted (``branches``)."""

    def __init__(self, base: Any, why: dict[str, Exception]) -> None:
        self.base, self.why, self.branches = base, why, 0
        self.name = base.name

    def preflight(self, run: car.Trajectory) -> None:
        if run.id in self.why:
            raise self.why[run.id]

    def start(self, context: Any, noise: Any) -> car.Trajectory:
        return self.base.start(context, noise)

    def branch(self, run: car.Trajectory, plan: Any, noise: Any) -> car.Trajectory:
        self.branches += 1
        return self.base.branch(run, plan, noise)
