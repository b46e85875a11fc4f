"""What every chat-framework adapter's branch shares, whatever the framework: the session its
stand-in models and tools read (the plan, the noise, the step counter, the record of tool
calls and a refusal to re-raise) and how a collected step takes its place in the branch.
This module imports no framework."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import car_core as car
from car_core.contract import Noise, Plan
from car_core.errors import CarError

from .chat_messages import ToolSafety


class BranchSession:
    """The state one branch's stand-ins share: the plan, the noise, and the step counter."""

    def __init__(self, plan: Plan, noise: Noise, start: int, safety: ToolSafety,
                 record: Mapping[tuple[str, str], Any], run_id: str | None,
                 forced_obs: Mapping[int, list[dict[str, Any]]]) -> None:
        self.plan = plan
        self.noise = noise
        self.next = start
        self.current = start - 1
        self.safety = safety
        self.record = record
        self.run_id = run_id
        self.forced_obs = forced_obs
        self.model_calls = 0
        self.blocked: CarError | None = None
        self._lock = threading.Lock()

    def serves(self, tool: str) -> bool:
        """Whether calls to ``tool`` on this branch must be answered without running it."""
        return self.safety.guards(tool) or any(
            m.get("name") == tool for msgs in self.forced_obs.values() for m in msgs)

    def serves_any(self) -> bool:
        return bool(self.safety.side_effect_tools or self.forced_obs)

    def raise_blocked(self) -> None:
        """Re-raise a refusal a tool stand-in had to hand to the framework (which may turn tool
        exceptions into messages for the model), so the branch stops with it."""
        if self.blocked is not None:
            raise self.blocked

    def claim(self) -> int:
        with self._lock:
            k = self.next
            self.next += 1
            self.current = k
            return k


def renumber(step: car.Step, k: int, plan: Plan) -> car.Step:
    """A collected step at its place ``k`` in the branch, with its origin; a forced
    observation is stored as the user gave it."""
    meta = {**step.meta, "origin": plan.origin(k)}
    if k in plan.forced_observations:
        return replace(step, index=k, meta=meta, observed=True,
                       observation=plan.forced_observations[k])
    return replace(step, index=k, meta=meta)
