"""What a recorded tool call wrote to the framework's state, and how a branch replays it.

Adapters record the framework's state as each step is decided (a LlamaIndex workflow's store,
an OpenAI Agents SDK run context), as JSON. The tools of step ``j`` run between the state of
step ``j`` and that of step ``j + 1``, so where one call is the only one of the step that could
write, the difference is what it wrote (``recorded_changes``). A branch that makes the same
call again gets the recorded result and that write, replayed by ``apply``.

A change is a list of operations, each ``{"path": [key, ...], "before": v, "after": v}`` over
nested JSON objects (``before`` absent: the key was added; ``after`` absent: it was removed;
anything but an object is replaced whole). A branch replays it only where it holds what the
record held at each path the call wrote; elsewhere the write is not the one the tool would
have made there, and ``apply`` raises ``Conflict``. This module imports no framework.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .messages import calls_of

Change = list[dict[str, Any]]
_MISSING = object()


class Conflict(Exception):
    """The branch's state differs from the record's where a recorded change writes."""

    def __init__(self, path: Sequence[Any]) -> None:
        super().__init__(".".join(str(p) for p in path) or "(the whole state)")
        self.path = list(path)


def diff(before: Any, after: Any, path: tuple[Any, ...] = ()) -> Change:
    """The operations that turn ``before`` into ``after`` (empty when they are equal)."""
    if before == after:
        return []
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        out: Change = []
        for key in [*before, *(k for k in after if k not in before)]:
            if key not in after:
                out.append({"path": [*path, key], "before": before[key]})
            elif key not in before:
                out.append({"path": [*path, key], "after": after[key]})
            else:
                out += diff(before[key], after[key], (*path, key))
        return out
    return [{"path": list(path), "before": before, "after": after}]


def _at(value: Any, path: Sequence[Any]) -> Any:
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return _MISSING
        value = value[key]
    return value


def apply(value: Any, change: Iterable[Mapping[str, Any]]) -> Any:
    """``value`` (JSON; not changed) with ``change`` replayed on it, or ``Conflict`` naming the
    first path where ``value`` does not hold what the record held before the write."""
    out = copy.deepcopy(value)
    for op in change:
        path = list(op["path"])
        if _at(out, path) != op.get("before", _MISSING):
            raise Conflict(path)
        if not path:
            out = copy.deepcopy(op["after"])
            continue
        parent = _at(out, path[:-1])
        if not isinstance(parent, dict):
            raise Conflict(path[:-1])
        if "after" in op:
            parent[path[-1]] = copy.deepcopy(op["after"])
        else:
            del parent[path[-1]]
    return out


def recorded_changes(steps: Sequence[Any], state_of: Callable[[Any], Any],
                     may_write: Callable[[str], bool]) -> dict[tuple[str, str], Change]:
    """``(tool name, canonical arguments) -> the change that call wrote`` for every recorded
    call of a tool ``may_write`` names whose change the record shows: its step is not the
    last, ``state_of`` knows the state before it and before the next step (it gives a step's
    state as JSON, or None where the record does not have it), and the state did not change
    or no other call of the step could have written it. An identical call recorded twice
    with different changes is left out: which one a branch's call would make is not known.
    A call left out is one a branch can replay only through a simulator that takes the
    state."""
    out: dict[tuple[str, str], Change] = {}
    clashes: set[tuple[str, str]] = set()
    for j, step in enumerate(steps[:-1]):
        writers = [(name, args) for _, name, args in calls_of(step.action) if may_write(name)]
        if not writers:
            continue
        before, after = state_of(step), state_of(steps[j + 1])
        if before is None or after is None:
            continue
        change = diff(before, after)
        if change and len(writers) > 1:
            continue
        for key in writers:
            if key in out and out[key] != change:
                clashes.add(key)
            out.setdefault(key, change)
    for key in clashes:
        del out[key]
    return out


def unreplayable(steps: Sequence[Any], changes: Mapping[tuple[str, str], Change],
                 names: Iterable[str]) -> list[tuple[int, str]]:
    """``(step, tool)`` of each recorded call of a tool in ``names`` whose change
    ``recorded_changes`` could not derive: a branch that made that call again could not
    replay what it wrote."""
    wanted = set(names)
    return [(j, name) for j, step in enumerate(steps) for _, name, args in calls_of(step.action)
            if name in wanted and (name, args) not in changes]


__all__ = ["Change", "Conflict", "apply", "diff", "recorded_changes", "unreplayable"]
