"""The shape of an OpenAI Agents SDK app: the agents reachable through handoffs, where a handoff
leads, each agent's tools. The recorder, the fingerprint and the branch all read an app through
these, so none of them imports another to get at them."""

from __future__ import annotations

from typing import Any

from agents.handoffs import Handoff

from car_core.errors import AdapterError


def agents_of(root: Any) -> dict[str, Any]:
    """Every agent reachable from ``root`` through handoffs, by name."""
    seen: dict[str, Any] = {}
    todo = [root]
    while todo:
        a = todo.pop()
        if a is None or a.name in seen:
            if a is not None and seen[a.name] is not a:
                raise AdapterError(f"two different agents are named {a.name!r}",
                                   hint="give every agent in the app its own name")
            continue
        seen[a.name] = a
        for h in getattr(a, "handoffs", None) or ():
            todo.append(handoff_target(h))
    return seen


def handoff_target(h: Any) -> Any:
    """The agent a handoff entry leads to (``None`` when the SDK keeps no reference)."""
    if isinstance(h, Handoff):
        ref = getattr(h, "_agent_ref", None)
        return ref() if ref is not None else None
    return h


def tool_names(root: Any) -> dict[str, list[str]]:
    """``agent name -> sorted tool names`` over the app (handoffs excluded)."""
    return {name: sorted(str(getattr(t, "name", type(t).__name__)) for t in a.tools or ())
            for name, a in agents_of(root).items()}
