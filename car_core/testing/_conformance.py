"""What the conformance checks share (``car_core.testing.contract_checks``,
``car_core.testing.capability_checks``, ``car_core.testing.conformance``): what an agent
factory returns, the noise a check's branches draw, how a failure is raised, how two runs'
steps are compared and the paired sign-flip test the statistical checks use."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NoReturn, TypeAlias

import numpy as np

from car_core.engine.agent import Agent
from car_core.errors import ConformanceFailure
from car_core.model.seeding import Noise, branch_noise
from car_core.model.trajectory import Trajectory
from car_core.testing.fakes import StepCounter

AgentFactory: TypeAlias = Callable[[], Agent | tuple[Agent, StepCounter]]
"""Builds a fresh agent, or ``(agent, counter)`` where the counter wraps the agent's model and
tool calls (then ``run_conformance`` checks the prefix rule too)."""


def agent_of(made: Agent | tuple[Agent, StepCounter]) -> Agent:
    """The agent of what an ``AgentFactory`` returned."""
    return made[0] if isinstance(made, tuple) else made


def noise_for(seed: int, rollout: int = 0) -> Noise:
    return branch_noise(seed, rollout, "conformance", coupled=True)


HINT = ("the agent must serve steps before the branch step from the record and apply the plan "
         "as given (see car_core.engine.protocols)")


def fail(check: str, message: str, run: Trajectory | None, step: int | None = None, *,
          hint: str = HINT) -> NoReturn:
    raise ConformanceFailure(f"{check}: {message}", run_id=run.id if run is not None else None,
                             step=step, hint=hint)


def same_steps(check: str, run: Trajectory, branch: Trajectory, upto: int) -> None:
    for k in range(upto):
        if k >= len(branch.steps):
            fail(check, f"the branch has {len(branch.steps)} steps, the record {upto}", run, k)
        a, b = run.steps[k], branch.steps[k]
        if a.action != b.action:
            fail(check, f"action {b.action!r} differs from the recorded {a.action!r}", run, k)
        if (a.observed, a.observation) != (b.observed, b.observation):
            fail(check, f"observation {b.observation!r} differs from the recorded "
                         f"{a.observation!r}", run, k)


def sign_flip_p(diffs: Sequence[float], rng: np.random.Generator, flips: int = 9999) -> float:
    """Two-sided p-value of a paired sign-flip test of "mean difference 0". Under the null the
    pairs are exchangeable (both arms have one law, with shared or independent noise), so every
    sign pattern is equally likely; ``(1 + hits) / (1 + flips)`` keeps the level exact with
    Monte Carlo flips (Phipson and Smyth 2010)."""
    d = np.asarray([x for x in diffs if x != 0.0], dtype=float)
    if d.size == 0:
        return 1.0
    observed = abs(float(d.sum()))
    signs = rng.choice(np.array([-1.0, 1.0]), size=(flips, d.size))
    hits = int(np.count_nonzero(np.abs(signs @ d) >= observed - 1e-12))
    return (1 + hits) / (1 + flips)
