"""Fixes for a population of runs: a repair described once, built for each run at the step
that run is branched from.

A ``car.Candidate`` names the steps it acts on, so it fits one run. A ``Fix`` is the recipe
behind it: ``build(run, step)`` returns the interventions for ``run`` branched at ``step``
(its locus, or step 0). ``every_step`` marks a change that touches every step (a system-prompt
line, another model): such a fix is tried from step 0, where it would have been in effect, so
no locus is needed for it. The constructors cover the kinds ``car.repairs`` knows — an
instruction line, a guard on a tool result, a context edit — plus ``do_policy`` (another
model or policy).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from car_core.errors import InvalidInput
from car_core.estimators.repairs import Candidate, add_instruction, as_candidate
from car_core.estimators.triage import tool_of
from car_core.model.interventions import (
    Intervention,
    do_action,
    do_context,
    do_observation,
    do_policy,
)
from car_core.model.json_values import JSON
from car_core.model.trajectory import Trajectory

Build = Callable[[Trajectory, int], Any]


@dataclass(frozen=True)
class Fix:
    """A repair for a population: ``build(run, step)`` gives its interventions (or a
    ``car.Candidate``) for ``run`` branched at ``step``; ``every_step``: tried from step 0."""

    label: str
    build: Build
    kind: str = "user"
    every_step: bool = False

    @classmethod
    def instruction(cls, text: str, *, every_step: bool = False, label: str = "") -> Fix:
        """A system-prompt line (``car.add_instruction``) before the step branched from;
        ``every_step``: from step 0, as a line added to the system prompt would be."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput(f"instruction {text!r} is empty",
                               hint='pass the line to add, e.g. "check the policy first"')
        name = label or (f"system prompt: {text}" if every_step else f"add instruction: {text}")
        return cls(name, lambda run, k: add_instruction(k, text, label=name),
                   "system prompt", every_step)

    @classmethod
    def context(cls, edit: Callable[[Any], Any], *, every_step: bool = False,
                label: str = "") -> Fix:
        """A context edit (``car.do_context``) of the state the step branched from decides
        from (the messages for chat agents, the ``car.History`` for a ``FunctionAgent``)."""
        if not callable(edit):
            raise InvalidInput(f"edit={edit!r} is not callable",
                               hint="pass a function state -> edited state")
        name = label or f"edit the context: {getattr(edit, '__name__', 'edit')}"
        return cls(name, lambda run, k: do_context(k, edit, label=name), "context edit",
                   every_step)

    @classmethod
    def policy(cls, policy: Any, *, every_step: bool = True, label: str = "") -> Fix:
        """Another model or policy (``car.do_policy``) deciding from step 0 on (from the step
        branched from when ``every_step=False``)."""
        if policy is None:
            raise InvalidInput("policy is None", hint="pass the policy (or model) to swap in")
        name = label or f"use policy {getattr(policy, '__name__', type(policy).__name__)}"
        return cls(name, lambda run, k: do_policy(k, policy, label=name), "policy", every_step)

    @classmethod
    def guard(cls, result: JSON | Callable[[JSON], JSON], *, tool: str | None = None,
              label: str = "") -> Fix:
        """A guard on a tool result: the latest one the branched step saw (of ``tool`` when
        given) is replaced by ``result``, or by ``result(recorded result)`` when it is a
        function. The steps between that tool call and the branched step keep their recorded
        actions and results, so the guard is the only change the step sees."""
        name = label or ("guard the tool result" + (f" of {tool}" if tool else ""))

        def build(run: Trajectory, k: int) -> list[Intervention]:
            j = _last_result(run, k, tool)
            recorded = run.steps[j].observation
            value = result(recorded) if callable(result) else result
            held: list[Intervention] = [do_observation(j, value)]
            for m in range(j + 1, k):  # held as recorded: only the guard differs
                held.append(do_action(m, run.steps[m].action))
                if run.steps[m].observed:
                    held.append(do_observation(m, run.steps[m].observation))
            return held
        return cls(name, build, "guard", False)

    def at(self, run: Trajectory, step: int) -> Candidate:
        """The candidate for ``run`` branched at ``step`` (``InvalidInput`` when the fix does
        not apply to that run, with why)."""
        built = self.build(run, step)
        cand = as_candidate(built)
        return Candidate(self.label, cand.interventions, self.kind)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "kind": self.kind, "every_step": self.every_step}


def _last_result(run: Trajectory, k: int, tool: str | None) -> int:
    for j in range(k - 1, -1, -1):
        s = run.steps[j]
        if s.observed and (tool is None or tool_of(s.action) == tool):
            return j
    what = f"no result of {tool}" if tool else "no tool result"
    raise InvalidInput(f"run {run.id} has {what} before step {k} to guard", run_id=run.id,
                       step=k, hint="guard a tool this run called before its locus")


def as_fix(value: Any) -> Fix:
    """A ``Fix`` from one, or from a function ``(run, step) -> interventions``."""
    if isinstance(value, Fix):
        return value
    if isinstance(value, (Candidate, Mapping, str)) or not callable(value):
        raise InvalidInput(f"{value!r} is not a fix for a population: its steps would be the "
                           "same in every run",
                           hint="pass car.Fix.instruction(...), car.Fix.guard(...), "
                                "car.Fix.context(...), car.Fix.policy(...) or a function "
                                "(run, step) -> interventions")
    return Fix(getattr(value, "__qualname__", repr(value)), value)


__all__ = ["Fix", "as_fix"]
