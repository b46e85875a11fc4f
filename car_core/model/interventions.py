"""The five interventions as values, and the plan they compile to against a run.

``do_resample(k)`` re-draws the action at ``k`` from the agent's own policy.
``do_action(k, a)`` forces the action at ``k``; its observation runs live.
``do_observation(k, o)`` keeps the recorded action at ``k`` and replaces what the tool returned.
``do_context(k, edit)`` edits the state ``s_k`` and re-draws the action from the edited state.
``do_policy(k, policy)`` swaps the policy from step ``k`` on.

Several can be combined in one call (a list): a held step after a resampled one is a
``do_action`` with its factual action. Steps before the earliest intervened step are served from
the record; unmentioned steps after it run live.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from car_core.errors import InvalidIntervention, InvalidJSONValue, StepOutOfRange
from car_core.model.actions import same_action
from car_core.model.checks import is_whole
from car_core.model.json_values import JSON, check_json
from car_core.model.trajectory import Trajectory
from car_core.model.vocabulary import Origin


def _check_step(step: Any, kind: str) -> int:
    if not is_whole(step):
        raise InvalidIntervention(f"{kind}: the step must be an int, got {type(step).__name__}",
                                  hint="pass the index of the step to intervene on (0-based)")
    if step < 0:
        raise InvalidIntervention(f"{kind}: step {step} is negative",
                                  hint="steps are numbered from 0")
    return step


@dataclass(frozen=True)
class Resample:
    step: int
    kind: str = field(default="resample", init=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step}


@dataclass(frozen=True)
class ForceAction:
    step: int
    action: JSON
    kind: str = field(default="action", init=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "action": self.action}


@dataclass(frozen=True)
class ForceObservation:
    step: int
    observation: JSON
    kind: str = field(default="observation", init=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "observation": self.observation}


@dataclass(frozen=True)
class EditContext:
    step: int
    edit: Callable[[Any], Any] | None
    label: str = ""
    kind: str = field(default="context", init=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "label": self.label}


@dataclass(frozen=True)
class SwapPolicy:
    step: int
    policy: Any
    label: str = ""
    kind: str = field(default="policy", init=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "label": self.label}


Intervention = Resample | ForceAction | ForceObservation | EditContext | SwapPolicy
KINDS = ("resample", "action", "observation", "context", "policy")


def do_resample(step: int) -> Resample:
    """Re-draw the action at ``step`` from the agent's own policy."""
    return Resample(_check_step(step, "do_resample"))


def do_action(step: int, action: JSON) -> ForceAction:
    """Force the action at ``step`` (a JSON value, as the policy would return it)."""
    _check_step(step, "do_action")
    try:
        check_json(action, "do_action payload")
    except InvalidJSONValue as exc:
        raise InvalidIntervention(str(exc)) from exc
    return ForceAction(step, action)


def do_observation(step: int, observation: JSON) -> ForceObservation:
    """Keep the recorded action at ``step`` and replace the observation it got."""
    _check_step(step, "do_observation")
    try:
        check_json(observation, "do_observation payload")
    except InvalidJSONValue as exc:
        raise InvalidIntervention(str(exc)) from exc
    return ForceObservation(step, observation)


def do_context(step: int, edit: Callable[[Any], Any], label: str = "") -> EditContext:
    """Edit what ``step`` decides from, then re-draw its action from the edited state."""
    _check_step(step, "do_context")
    if not callable(edit):
        raise InvalidIntervention(f"do_context: edit must be callable, got {type(edit).__name__}",
                                  hint="pass a function that takes the state and returns it edited")
    return EditContext(step, edit, label or getattr(edit, "__name__", "edit"))


def do_policy(step: int, policy: Any, label: str = "") -> SwapPolicy:
    """Decide with ``policy`` from ``step`` on (an alternative model, a fixed prompt…)."""
    _check_step(step, "do_policy")
    if policy is None:
        raise InvalidIntervention("do_policy: policy is None", hint="pass the policy to swap in")
    return SwapPolicy(step, policy, label or getattr(policy, "__name__", type(policy).__name__))


def intervention_from_dict(data: dict[str, Any]) -> Intervention:
    """Rebuild an intervention from its stored form. Callables cannot be stored: a stored
    ``do_context`` or ``do_policy`` comes back as a description that cannot be applied."""
    kind, step = data.get("kind"), data.get("step")
    if kind == "resample":
        return do_resample(step)  # type: ignore[arg-type]
    if kind == "action":
        return do_action(step, data.get("action"))  # type: ignore[arg-type]
    if kind == "observation":
        return do_observation(step, data.get("observation"))  # type: ignore[arg-type]
    if kind == "context":
        return EditContext(_check_step(step, "do_context"), None, str(data.get("label", "")))
    if kind == "policy":
        return SwapPolicy(_check_step(step, "do_policy"), None, str(data.get("label", "")))
    raise InvalidIntervention(f"unknown intervention kind {kind!r}",
                              hint=f"use one of {', '.join(KINDS)}")


@dataclass(frozen=True)
class Plan:
    """What a branch does at each step, compiled from interventions against one run.

    ``start``: steps ``< start`` are served from the record (no policy or tool call).
    ``forced_actions`` / ``forced_observations``: values to use instead of deciding / observing.
    ``held``: forced steps whose value is the factual one (reported as held, not forced).
    ``context_edits``: edits applied to the state before deciding at that step.
    ``policy``: ``(step, policy)`` when the policy is swapped from ``step`` on.
    """

    start: int
    forced_actions: dict[int, JSON] = field(default_factory=dict)
    forced_observations: dict[int, JSON] = field(default_factory=dict)
    held: frozenset[int] = frozenset()
    context_edits: dict[int, Callable[[Any], Any]] = field(default_factory=dict)
    policy: tuple[int, Any] | None = None
    interventions: tuple[Intervention, ...] = ()

    def describe(self) -> list[dict[str, Any]]:
        return [i.to_dict() for i in self.interventions]

    def words(self) -> str:
        """What a branch of this plan does, in plain words: messages name a branch so, not by
        its arm's internal key (a trial's error read "arm hold<0" for "re-deciding from step
        0 on")."""
        if not self.interventions:
            return "re-running the record with every step held"
        redrawn = sorted({i.step for i in self.interventions if isinstance(i, Resample)})
        parts = []
        if redrawn == [self.start] and not self.held:
            parts.append(f"re-deciding from step {self.start} on")
        elif redrawn:
            steps = ", ".join(map(str, redrawn))
            parts.append(f"re-deciding step{'s' if len(redrawn) > 1 else ''} {steps}"
                         + (", the others held" if self.held else ""))
        for i in self.interventions:
            if isinstance(i, ForceAction) and i.step not in self.held:
                parts.append(f"step {i.step}'s action forced")
            elif isinstance(i, ForceObservation):
                parts.append(f"step {i.step}'s observation replaced")
            elif isinstance(i, EditContext):
                parts.append(f"step {i.step}'s context edited ({i.label})")
            elif isinstance(i, SwapPolicy):
                parts.append(f"the policy swapped from step {i.step} on ({i.label})")
        return "; ".join(parts) or "re-running the record with every step held"

    def origin(self, k: int) -> Origin:
        if k < self.start or k in self.held:
            return Origin.HELD
        if k in self.context_edits:
            return Origin.EDITED
        if k in self.forced_actions:
            return Origin.FORCED
        if self.policy is not None and k >= self.policy[0]:
            return Origin.POLICY_SWAPPED
        return Origin.LIVE


def as_list(interventions: Intervention | Iterable[Intervention] | None) -> list[Intervention]:
    if interventions is None:
        return []
    if isinstance(interventions, (Resample, ForceAction, ForceObservation, EditContext,
                                  SwapPolicy)):
        return [interventions]
    items = list(interventions)
    for item in items:
        if not isinstance(item, (Resample, ForceAction, ForceObservation, EditContext,
                                 SwapPolicy)):
            raise InvalidIntervention(f"not an intervention: {item!r}",
                                      hint="build them with car.do_resample, car.do_action, …")
    return items


def compile_plan(run: Trajectory, interventions: Intervention | Sequence[Intervention] | None
                 ) -> Plan:
    """Check interventions against ``run`` and turn them into a per-step plan."""
    items = as_list(interventions)
    n = len(run.steps)
    seen: dict[tuple[int, str], Intervention] = {}
    forced_actions: dict[int, JSON] = {}
    forced_obs: dict[int, JSON] = {}
    held: set[int] = set()
    edits: dict[int, Callable[[Any], Any]] = {}
    policy: tuple[int, Any] | None = None
    decided: dict[int, str] = {}  # how the action at a step is decided, to catch conflicts

    def claim_action(k: int, how: str) -> None:
        if k in decided:
            raise InvalidIntervention(
                f"step {k} is given two ways to decide its action ({decided[k]} and {how})",
                run_id=run.id, step=k,
                hint="use one of do_resample / do_action / do_context per step")
        decided[k] = how

    for item in items:
        k = item.step
        if k >= n:
            raise StepOutOfRange(f"{item.kind} intervention at step {k}, but the run has {n} steps",
                                 run_id=run.id, step=k,
                                 hint=f"intervene on a step between 0 and {n - 1}" if n
                                 else "the run has no steps to intervene on")
        if (k, item.kind) in seen:
            raise InvalidIntervention(f"two {item.kind} interventions on step {k}",
                                      run_id=run.id, step=k, hint="combine them into one")
        seen[(k, item.kind)] = item
        if isinstance(item, Resample):
            claim_action(k, "do_resample")
        elif isinstance(item, ForceAction):
            claim_action(k, "do_action")
            forced_actions[k] = item.action
            if same_action(item.action, run.steps[k].action):
                held.add(k)
        elif isinstance(item, ForceObservation):
            forced_obs[k] = item.observation
        elif isinstance(item, EditContext):
            if item.edit is None:
                raise InvalidIntervention("this do_context was loaded from storage and has no "
                                          "edit function", run_id=run.id, step=k,
                                          hint="build it again with car.do_context(k, edit)")
            claim_action(k, "do_context")
            edits[k] = item.edit
        elif isinstance(item, SwapPolicy):
            if item.policy is None:
                raise InvalidIntervention("this do_policy was loaded from storage and has no "
                                          "policy", run_id=run.id, step=k,
                                          hint="build it again with car.do_policy(k, policy)")
            if policy is not None:
                raise InvalidIntervention("two do_policy interventions in one call",
                                          run_id=run.id, step=k, hint="swap the policy once")
            policy = (k, item.policy)
    for k in forced_obs:
        if k not in decided:
            if not run.steps[k].observed:
                raise InvalidIntervention(
                    "do_observation on a step that had no observation (no tool call)",
                    run_id=run.id, step=k,
                    hint="intervene on a step that called a tool, or force an action with "
                         "do_action at the same step")
            forced_actions[k] = run.steps[k].action
            held.add(k)
            decided[k] = Origin.RECORD
    if policy is not None and policy[0] not in decided:
        decided[policy[0]] = "do_policy"
    start = min((i.step for i in items), default=n)
    return Plan(start=start, forced_actions=forced_actions, forced_observations=forced_obs,
                held=frozenset(held), context_edits=edits, policy=policy,
                interventions=tuple(items))
