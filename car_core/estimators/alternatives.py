"""What the agent did instead: the actions a re-drawn step took, grouped, with their shares.

Every branch of arm ``H_k`` (steps before ``k`` held, step ``k`` re-drawn) holds one fresh
draw of the agent's action at step ``k`` and its outcome. ``Choices`` tallies them as the
branches arrive, one count and one sum of outcomes per group, never a trajectory, so no
rollout is spent and memory stays bounded by the number of distinct groups. A group is the
``action_key`` of the action: by default (``default_action_key``) the tool calls' names and
canonical arguments (``model.actions.canonical_action``: call ids, key order and spacing do not
count) or a reply's text; a user's own key groups coarser or finer.

The intervals are Wilson intervals at the result's level, each on its own (not simultaneous
over the groups). The branches come from wherever the search put rollouts into ``H_k``; how
many it drew depended on the outcomes of the whole arm, not on which action a branch took, so
a share's interval reads as usual, a little optimistic at most.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from car_core.errors import InvalidInput
from car_core.model.actions import canonical_action, is_chat_action
from car_core.model.trajectory import Trajectory
from car_core.results import Alternative, StepEffect
from car_core.stats import Interval, wilson

ActionKey = Callable[[Any], str]
MIN_BRANCHES = 5  # fewer branches than this took an action: its failure rate is too few to tell
MAX_GROUPS = 12  # the most groups a step keeps apart; the rest are one row, OTHER
OTHER = "(any other action)"
NO_ACTION = "(the branch ended before this step)"


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


def default_action_key(action: Any) -> str:
    """The group of ``action``: ``name(canonical arguments)`` for each tool call, joined by
    ``"; "`` (the text beside the calls does not count), the text for a reply, a string
    action as it is, and any other value as canonical JSON."""
    if is_chat_action(action):
        canon = canonical_action(action)
        assert isinstance(canon, Mapping)
        calls = canon.get("tool_calls") or []
        if calls:
            return "; ".join(f"{c.get('name')}({c.get('arguments')})" if isinstance(c, Mapping)
                             and "name" in c else _dumps(c) for c in calls)
        content = canon.get("content")
        return content if isinstance(content, str) else _dumps(content)
    if isinstance(action, str):
        return action
    return _dumps(action)


def key_name(key: ActionKey | None) -> str | None:
    """What the params store of a user's ``action_key``: its qualified name (a function is
    not JSON), None for the default."""
    if key is None:
        return None
    return str(getattr(key, "__qualname__", None) or getattr(key, "__name__", None)
               or type(key).__name__)


def check_action_key(key: Any, run: Trajectory) -> ActionKey:
    """``key`` (None: the default) once it has turned every recorded action into a string,
    so a key that raises or returns something else is refused before any rollout."""
    if key is None:
        return default_action_key
    if not callable(key):
        raise InvalidInput(f"action_key={key!r} is not callable",
                           hint="pass a function action -> str, e.g. lambda a: a['tool']")
    for step in run.steps:
        try:
            said = key(step.action)
        except Exception as exc:
            raise InvalidInput(f"action_key raised on the action of step {step.index}: "
                               f"{exc!r}", hint="make it accept every action the agent "
                               "takes") from exc
        if not isinstance(said, str):
            raise InvalidInput(f"action_key returned {type(said).__name__} for step "
                               f"{step.index}", hint="return a str naming the action's group")
    return key  # type: ignore[no-any-return]


class Choices:
    """Per re-drawn step, per group: how many branches took it and their summed outcome."""

    def __init__(self, key: ActionKey) -> None:
        self.key = key
        self.groups: dict[int, dict[str, list[float]]] = {}

    def add(self, step: int, traj: Trajectory, value: float) -> None:
        steps = traj.steps
        group = self.key(steps[step].action) if len(steps) > step else NO_ACTION
        tally = self.groups.setdefault(step, {}).setdefault(str(group), [0, 0.0])
        tally[0] += 1
        tally[1] += value

    def alternatives(self, step: int, recorded: str, level: float) -> tuple[Alternative, ...]:
        """The groups of ``step``, most taken first, the rest past ``MAX_GROUPS`` as one;
        the recorded action (``recorded``) always has its own row, with n 0 when no branch
        took it again."""
        groups = self.groups.get(step)
        if not groups:
            return ()
        total = int(sum(c for c, _ in groups.values()))
        ranked = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))
        others = [kv for kv in ranked if kv[0] != recorded]
        kept = [(recorded, groups.get(recorded, [0, 0.0])), *others[:MAX_GROUPS - 1]]
        rest = others[MAX_GROUPS - 1:]
        if rest:
            kept.append((OTHER, [sum(c for _, (c, _s) in rest), sum(s for _, (_c, s) in rest)]))
        kept.sort(key=lambda kv: (-kv[1][0], kv[0]))
        return tuple(_alternative(k, int(c), s, total, level) for k, (c, s) in kept)


def _alternative(action: str, n: int, fails: float, total: int, level: float) -> Alternative:
    share = n / total
    p_fail = fails / n if n >= MIN_BRANCHES else None
    return Alternative(
        action=action, share=share, share_ci=Interval(*wilson(share, total, level), level),
        p_fail=p_fail,
        p_fail_ci=Interval(*wilson(p_fail, n, level), level) if p_fail is not None else None,
        n=n)


def with_alternatives(steps: Sequence[StepEffect], choices: Choices, run: Trajectory,
                      level: float) -> tuple[StepEffect, ...]:
    """``steps`` with each tested step's alternatives and the key of its recorded action."""
    out = []
    for s in steps:
        if s.tested and s.step < len(run.steps) and choices.groups.get(s.step):
            recorded = str(choices.key(run.steps[s.step].action))
            s = replace(s, alternatives=choices.alternatives(s.step, recorded, level),
                        recorded_action=recorded)
        out.append(s)
    return tuple(out)


__all__ = ["MIN_BRANCHES", "ActionKey", "Choices", "check_action_key", "default_action_key",
           "key_name", "with_alternatives"]
