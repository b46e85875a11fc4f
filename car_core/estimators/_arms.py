"""Batches of branches at one step, each arm a plan, scored and kept as outcome values.

The context estimator and the repair ranking both run many small arms (an ablation mask, a
candidate repair) at the same step. Rollout ``r`` of every arm draws the noise stream
``(seed, r)`` when the agent takes CAR's noise, so arms compared at one rollout index share the
noise of everything they do not change; whether they do is measured from the outcomes
(``car_core.stats.coupling_of``), never assumed. A failed branch is left out and counted
(``car_core.engine.tasks.check_failures`` stops the estimate when too many fail). An outcome that
does not see what the run recorded is refused before any arm (``outcome.check_on_record``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from car_core.engine.agent import Agent, check_agent
from car_core.engine.execution import ExecutorLike, Task, brancher, execute, resolve_executor
from car_core.engine.replay import check_run
from car_core.engine.tasks import Failure, check_failures
from car_core.errors import AgentError, InvalidInput
from car_core.estimators.bounds import check_max
from car_core.model.budget import Budget, BudgetMeter, as_budget, check_bound, check_countable
from car_core.model.checks import is_whole
from car_core.model.interventions import Intervention, compile_plan
from car_core.model.outcome import OutcomeFn, OutcomeLike, check_on_record
from car_core.model.seeding import branch_noise, coupling
from car_core.model.trajectory import Trajectory


@dataclass(frozen=True)
class Branch:
    """What is kept of one finished branch: its outcome and the action it took at the step."""

    value: float
    action: Any


def capped(budget: Budget | int | None, rollouts: int) -> Budget:
    """``budget`` (a ``car.Budget`` or a rollout count) with its rollout cap at most
    ``rollouts``: the estimate's own cap always holds, whatever else the budget limits."""
    given = as_budget(budget) or Budget()
    cap = rollouts if given.rollouts is None else min(given.rollouts, rollouts)
    return replace(given, rollouts=cap)


def check_rollouts(rollouts: Any, least: int, bound: int, raise_with: str) -> int:
    """At least ``least`` rollouts, and none past ``bound`` unless raised knowingly (a slip,
    ``rollouts=2**63``, would run for days): ``raise_with`` is the keyword that raises it."""
    if not is_whole(rollouts, least):
        raise InvalidInput(f"rollouts={rollouts!r}: this estimate needs at least {least}",
                           hint=f"pass rollouts={max(least, 64)} or more")
    check_max(bound, raise_with.rstrip("="))
    check_bound(rollouts, bound, "rollouts", raise_with)
    return rollouts


class StepArms:
    """Runs arms at step ``step`` of ``run`` under one budget; see the module docstring."""

    def __init__(self, run: Trajectory, agent: Agent, outcome: OutcomeLike, *, step: int,
                 seed: int, budget: Budget | int | None, executor: ExecutorLike,
                 force_agent: bool) -> None:
        check_run(run)
        if not is_whole(step) or not 0 <= step < len(run.steps):
            raise InvalidInput(f"step={step!r} is not a step of run {run.id} "
                               f"({len(run.steps)} steps)",
                               hint="pass the locus (car.contrastive(...).locus) or a step "
                                    "between 0 and the last")
        check_agent(run, agent, force=force_agent)
        check_countable(as_budget(budget), run)
        self.run, self.agent, self.step, self.seed = run, agent, step, seed
        self.outcome = OutcomeFn(outcome)
        # before the seed check's model calls and any arm
        check_on_record(run, self.outcome, attributing=True)
        self.handed_noise, self.noise_note = coupling(agent, run, True)
        self.meter = BudgetMeter(as_budget(budget))
        self.executor = resolve_executor(executor, agent)
        self.failures: list[Failure] = []
        self.ran = 0
        self.finished: dict[tuple[str, int], Branch] = {}

    def _keep(self, traj: Trajectory) -> Branch:
        steps = traj.steps
        action = steps[self.step].action if len(steps) > self.step else None
        value = traj.outcome.value if traj.outcome is not None else float("nan")
        return Branch(float(value), action)

    def run_arms(self, jobs: Sequence[tuple[str, int, Intervention | list[Intervention]]]
                 ) -> dict[tuple[str, int], Branch]:
        """Run one branch per ``(arm, rollout, interventions)``; the finished ones by key."""
        tasks = [Task(arm=arm, rollout=r, plan=compile_plan(self.run, ivs),
                      noise=branch_noise(self.seed, r, arm, self.handed_noise))
                 for arm, r, ivs in jobs]
        results = execute(iter(tasks), brancher(self.run, self.agent, self.outcome), self.meter,
                          executor=self.executor, progress=False, label="context",
                          keep=self._keep)
        self.failures.extend(results.failures)
        self.ran += len(results) + len(results.failures)
        # kept before the checks below raise: a caller that can tell which arm's failures
        # stopped them may still use the others' branches
        self.finished = {(t.arm, t.rollout): b for t, b in results}
        if not results and results.failures and len(self.failures) == self.ran:
            first = results.failures[0]
            if first.exception is not None:
                raise first.exception
            raise AgentError(f"every branch failed; the first: {first.error}",
                             run_id=self.run.id)
        check_failures(self.failures, self.ran, run_id=self.run.id, resumable=False)
        return {(t.arm, t.rollout): b for t, b in results}

    def finish(self) -> None:
        check_failures(self.failures, self.ran, run_id=self.run.id, final=True, resumable=False)

    @property
    def remaining(self) -> int:
        cap = self.meter.budget.rollouts
        return max(0, cap - self.meter.rollouts) if cap is not None else 0

    def failure_rows(self) -> tuple[dict[str, Any], ...]:
        return tuple(f.to_dict() for f in self.failures)
