"""The arms ``H_j`` of the contrastive estimate: outcomes by rollout index, filled on demand
through the session's executor, and the same arms seen as the search's ``ArmSource``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from car_core.engine.execution import Task
from car_core.estimators._session import Session
from car_core.estimators.alternatives import ActionKey, Choices, default_action_key
from car_core.model.interventions import Plan, compile_plan, do_resample
from car_core.model.trajectory import Trajectory
from car_core.stats import Difference, difference


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
    """Outcome values of the arms ``H_j`` by rollout index, filled on demand and shared. The
    search reads them index by index and stops at the first one missing, which is how a spent
    budget shows, so a failed branch gets a stand-in (``Session.execute(stand_in=True)``)."""

    def __init__(self, run: Trajectory, session: Session,
                 action_key: ActionKey = default_action_key) -> None:
        self.run, self.session, self.n = run, session, len(run.steps)
        # what each re-drawn step did, tallied as branches arrive (no trajectory is kept)
        self.choices = Choices(action_key)
        self.values: dict[int, dict[int, float]] = {}
        self.plans: dict[int, Plan] = {}
        self.examples: dict[int, dict[str, Any]] = {}  # one rescued branch (outcome 0) per arm
        self.by_key: dict[str, HoldArm] = {}

    def plan(self, j: int) -> Plan:
        if j not in self.plans:
            self.plans[j] = compile_plan(self.run, [do_resample(j)] if j < self.n else [])
        return self.plans[j]

    def fill(self, wants: Mapping[int, Iterable[int]]) -> None:
        """Run the missing rollouts of each arm, interleaved by index so a budget that trips
        leaves the arms evenly filled. Tasks are made as the executor asks for them, so a cap
        far above the budget costs only what the budget lets run (a ``range`` is never
        materialised; other collections of indices are small)."""
        if not wants:
            return
        arms = sorted(wants)
        sets = {j: w if isinstance(w, range) else frozenset(w) for j, w in wants.items()}
        bounds = [(w.start, w.stop) if isinstance(w, range)
                  else (min(w, default=0), max(w, default=-1) + 1) for w in sets.values()]

        def missing() -> Iterator[Task]:
            for r in range(min(lo for lo, _ in bounds), max(hi for _, hi in bounds)):
                for j in arms:
                    if r in sets[j] and r not in self.values.get(j, {}):
                        yield self.session.task(self._arm(j).key, r, self.plan(j))

        self.session.execute(missing(), self._keep, stand_in=True)

    def _arm(self, j: int) -> HoldArm:
        arm = HoldArm(j)
        self.by_key[arm.key] = arm
        return arm

    def _keep(self, task: Task, value: float, traj: Trajectory) -> None:
        j = self.by_key[task.arm].hold_before
        kept = self.values.setdefault(j, {})
        if j < self.n and task.rollout not in kept:  # a branch counts once
            self.choices.add(j, traj, value)
        kept[task.rollout] = value
        if value == 0.0 and j not in self.examples:
            self.examples[j] = traj.to_dict()

    def compare(self, hi: int, lo: int, indices: range, level: float, paired: bool
                ) -> Comparison | None:
        """``H_hi − H_lo`` on ``indices``: index pairs when the noise was measured shared."""
        a, b = self.values.get(hi, {}), self.values.get(lo, {})
        # walk what was measured, not ``indices``: a cap far above the budget stays cheap
        if paired:
            common = sorted(r for r in a if r in indices and r in b)
            xs, ys = [a[r] for r in common], [b[r] for r in common]
        else:
            xs = [a[r] for r in sorted(a) if r in indices]
            ys = [b[r] for r in sorted(b) if r in indices]
        if not xs or not ys:
            return None
        d = difference(xs, ys, level, paired=paired)
        return Comparison(d, sum(xs) / len(xs), sum(ys) / len(ys))

    def all_values(self) -> list[float]:
        return [v for arm in self.values.values() for v in arm.values()]


class EngineArms:
    """``Arms`` seen as a ``search.ArmSource``: pairs by rollout index under the rollout cap."""

    def __init__(self, arms: Arms, cap: int) -> None:
        self.arms, self.cap = arms, cap

    @property
    def remaining(self) -> int:
        meter = self.arms.session.meter
        left = self.cap - meter.rollouts
        # a spent rollout cap is no trip: asking what is left must not mark one
        if left <= 0 or meter.tripped or meter.check(1) is not None:
            return 0
        return left

    def _pairs(self, hi: int, lo: int, indices: Sequence[int]) -> list[tuple[float, float]]:
        a, b = self.arms.values.get(hi, {}), self.arms.values.get(lo, {})
        out = []
        for r in indices:  # the common prefix: a gap (a tripped budget) ends it
            if r not in a or r not in b:
                break
            out.append((a[r], b[r]))
        return out

    def outcomes(self, arm: int, indices: Sequence[int]) -> np.ndarray:
        have = self.arms.values.get(arm, {})
        missing = [r for r in indices if r not in have][:self.remaining]
        if missing:
            self.arms.fill({arm: missing})
        have = self.arms.values.get(arm, {})
        out = []
        for r in indices:  # the prefix reached: a gap (a tripped budget) ends it
            if r not in have:
                break
            out.append(have[r])
        return np.array(out, dtype=float)

    def diffs(self, hi: int, lo: int, indices: Sequence[int]) -> np.ndarray:
        a, b = self.arms.values.get(hi, {}), self.arms.values.get(lo, {})
        missing = [(j, r) for r in indices for j in (hi, lo)
                   if r not in (a if j == hi else b)]
        room = self.remaining
        if missing:
            wants: dict[int, Iterable[int]] = {}
            for j, r in missing[:room]:
                wants.setdefault(j, [])
                cast(list[int], wants[j]).append(r)
            self.arms.fill(wants)
        return np.array([x - y for x, y in self._pairs(hi, lo, indices)], dtype=float)

    def draw(self, wants: Mapping[int, Sequence[int]]) -> None:
        """Run the missing rollouts of several arms in one hand-off to the executor: those the
        budget reaches in rollout-index order, arms interleaved at each index."""
        have = {j: self.arms.values.get(j, {}) for j in wants}
        missing = sorted((r, j) for j, idx in wants.items() for r in idx if r not in have[j])
        take: dict[int, Iterable[int]] = {}
        for r, j in missing[:self.remaining]:
            cast(list[int], take.setdefault(j, [])).append(r)
        self.arms.fill(take)

    def means(self, hi: int, lo: int, indices: Sequence[int]) -> tuple[float, float]:
        pairs = self._pairs(hi, lo, indices)
        if not pairs:
            return float("nan"), float("nan")
        return (sum(p[0] for p in pairs) / len(pairs), sum(p[1] for p in pairs) / len(pairs))
