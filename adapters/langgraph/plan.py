"""A car_core ``Plan`` read once into what one LangGraph branch needs of it, step by step.

The refusals, the branch set-up and the trajectory a branch records all ask the same questions
of the plan (is step ``j`` forced, does a later step need CAR to decide it, what does a forced
tool result record); they ask this view, so the plan is walked in one place.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from car_core.contract import Origin, Plan


@dataclass(frozen=True)
class BranchPlan:
    """What a branch from ``start`` does at each step."""

    start: int
    actions: Mapping[int, Any]  # step -> forced action, as given
    observations: Mapping[int, Any]  # step -> forced tool results, as given
    later_observations: Mapping[int, Any]  # those of steps after ``start``
    edit: Callable[[Any], Any] | None  # the do_context edit of the branch step
    edits_later: bool  # a do_context edit of a step after ``start``
    policy: tuple[int, Any] | None
    origin: Callable[[int], Origin]

    @classmethod
    def of(cls, plan: Plan) -> BranchPlan:
        k = plan.start
        return cls(start=k, actions=dict(plan.forced_actions),
                   observations=dict(plan.forced_observations),
                   later_observations={j: o for j, o in plan.forced_observations.items()
                                       if j > k},
                   edit=plan.context_edits.get(k),
                   edits_later=any(j > k for j in plan.context_edits),
                   policy=plan.policy, origin=plan.origin)

    @property
    def needs_control(self) -> bool:
        """Whether CAR must decide the model calls: a later step is held or the policy swapped."""
        return self.policy is not None or any(j > self.start for j in self.actions)

    @property
    def changes_start(self) -> bool:
        """Whether the branch step's action or input is given rather than decided."""
        return self.start in self.actions or self.edit is not None

    def recorded_observation(self, j: int, results: Any) -> Any:
        """What step ``j`` records as observed, given the tool ``results`` the graph got: those
        results where the user forced results (strings or tool messages), else the value
        exactly as given; an unforced step records ``results``."""
        if j not in self.observations:
            return results
        given = self.observations[j]
        items = given if isinstance(given, (list, tuple)) else [given]
        if all(isinstance(i, str) or (isinstance(i, Mapping) and "content" in i) for i in items):
            return results
        return given


def tool_content(content: Any, given: Any) -> Any:
    """A forced tool result's content: a given value with no ``content`` field is sent whole,
    as JSON."""
    if content is not None:
        return content
    return given if isinstance(given, str) else json.dumps(given, default=str)
