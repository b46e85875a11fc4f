"""A planted world for "what the agent did instead": a chat agent whose deciding step picks
among known actions with known probabilities, each with its own known failure rate.

Steps ``< at`` look the booking up (one fixed tool call); step ``at`` draws one of
``choices`` — a tool call or a reply, each ``(action, probability, P(fail))`` — and later steps
only say what it chose, so re-drawing them changes nothing. The judge fails the run with the
chosen action's P(fail), drawing from CAR's noise. Tool calls carry a fresh call id and, when
they have several arguments, a key order drawn at random, so grouping must compare them as
decisions (``model.actions.canonical_action``), not as recorded bytes.

So every number has a closed form: when step ``at`` is re-drawn, action ``i`` is taken with
probability ``share_i`` and fails with ``p_i``; ``H_j = Σ share_i·p_i`` for ``j ≤ at`` and the
recorded action's ``p`` after, hence the locus is ``at`` and its rescue is
``p_recorded − Σ share_i·p_i``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from car_core.engine.agent import FunctionAgent
from car_core.engine.replay import record
from car_core.errors import InvalidInput
from car_core.model.trajectory import History, Trajectory

# (name, arguments) for a tool call, (None, text) for a reply; the share; P(fail)
Choice = tuple[str | None, Any, float, float]
TRAVEL_DESK: tuple[Choice, ...] = (
    ("read_policy", {"topic": "fares", "lang": "en"}, 0.45, 0.1),
    ("book_fare", {"fare": "business"}, 0.35, 0.9),
    ("book_fare", {"fare": "economy"}, 0.15, 0.2),
    (None, "Which fare would you like?", 0.05, 0.5),
)


def _call(name: str, args: dict[str, Any], u: float, order: float) -> dict[str, Any]:
    keys = sorted(args, reverse=order < 0.5)
    text = json.dumps({k: args[k] for k in keys}, separators=(", ", ": ") if order < 0.25
                      else (",", ":"))
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"call_{int(u * 1e9)}", "type": "function",
                            "function": {"name": name, "arguments": text}}]}


class PlantedChoices:
    """The travel desk (``TRAVEL_DESK`` by default); see the module docstring."""

    def __init__(self, n_steps: int = 4, at: int = 1,
                 choices: Sequence[Choice] = TRAVEL_DESK, recorded: int = 1) -> None:
        if not 0 <= at < n_steps:
            raise InvalidInput(f"at={at} is not a step of a {n_steps}-step run")
        if abs(sum(c[2] for c in choices) - 1.0) > 1e-9 or not 0 <= recorded < len(choices):
            raise InvalidInput("the choices' shares must sum to 1 and recorded index one",
                               hint="e.g. the default TRAVEL_DESK, recorded=1")
        self.n_steps, self.at, self.choices, self.recorded = n_steps, at, tuple(choices), recorded

    def _pick(self, u: float) -> int:
        edge = 0.0
        for i, c in enumerate(self.choices):
            edge += c[2]
            if u < edge:
                return i
        return len(self.choices) - 1

    def action_of(self, i: int, u: float = 0.0, order: float = 0.0) -> dict[str, Any]:
        """The chat action of choice ``i`` (a call id from ``u``, key order from ``order``)."""
        name, args, _, _ = self.choices[i]
        if name is None:
            return {"role": "assistant", "content": str(args), "tool_calls": []}
        return _call(name, dict(args), u, order)

    def chose(self, action: Any) -> int:
        """Which choice a step-``at`` action is (the planted truth the tests compare with)."""
        calls = action.get("tool_calls") or []
        for i, (name, args, _, _) in enumerate(self.choices):
            if name is None and not calls and action.get("content") == args:
                return i
            if name is not None and calls and calls[0]["function"]["name"] == name and \
                    json.loads(calls[0]["function"]["arguments"]) == args:
                return i
        raise InvalidInput(f"not a planted choice: {action!r}")

    def policy(self, history: History, rng: np.random.Generator) -> dict[str, Any]:
        k = history.index
        u, order = float(rng.random()), float(rng.random())
        if k < self.at:
            return _call("lookup_booking", {"ref": "TRV-7"}, u, order)
        if k == self.at:
            return self.action_of(self._pick(u), u, order)
        picked = self.chose(history.steps[self.at].action)
        return {"role": "assistant", "content": f"step {k}: went with choice {picked}",
                "tool_calls": []}

    def environment(self, history: History, action: Any, rng: np.random.Generator) -> Any:
        return {"ok": True}

    def agent(self) -> FunctionAgent:
        return FunctionAgent(policy=self.policy, environment=self.environment,
                             max_steps=self.n_steps, name=f"planted-choices:{self.n_steps}")

    def judge(self, run: Trajectory, rng: np.random.Generator) -> float:
        """1 with the P(fail) of the action taken at step ``at``."""
        p = self.choices[self.chose(run.steps[self.at].action)][3]
        return 1.0 if float(rng.random()) < p else 0.0

    def failing_run(self, seed: int = 0, tries: int = 100_000) -> Trajectory:
        """The first recorded run from ``seed`` on that took the ``recorded`` choice and
        failed: a genuine draw of the agent, not a forged record."""
        agent = self.agent()
        for s in range(seed, seed + tries):
            run = record(agent, context={"desk": "travel"}, outcome=self.judge, seed=s)
            if self.chose(run.steps[self.at].action) == self.recorded and run.failed:
                return run
        raise InvalidInput(f"no failing run of the planted choices within {tries} seeds")

    @property
    def rescue(self) -> float:
        """The planted rescue of step ``at``."""
        mean = sum(c[2] * c[3] for c in self.choices)
        return self.choices[self.recorded][3] - mean


__all__ = ["TRAVEL_DESK", "PlantedChoices"]
