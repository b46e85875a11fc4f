"""Handoff callbacks (``handoff(agent, on_handoff=...)``): user code a branch's handoff runs.

The SDK calls a handoff's ``on_handoff`` when the model hands off (the SDK docs' example logs
an escalation or fetches data), so a branch that hands off again ran it for real: a user
trial's attribution paged the on-call person 16 times. CAR cannot see what the callback does,
so an app with one is refused before any branch until the user says (``OpenAIAgentsAgent(
handoff_callbacks=...)``): ``"skip"``, branches hand off without calling it (a write it would
make to the run context is not made), or ``"live"``, branches call it (only for a callback
with no side effect). A handoff built some other way than ``handoff(...)`` (a ``Handoff``
with an ``on_invoke_handoff`` of the user's) counts as having one."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

from agents.handoffs import Handoff

from car_core.errors import AdapterError, InvalidInput

REFUSE, SKIP, LIVE = "refuse", "skip", "live"


def callback_of(h: Any) -> Any:
    """The user code a handoff runs when invoked (its ``on_handoff``, or the whole invocation
    of a ``Handoff`` the user built), None when it runs none."""
    if not isinstance(h, Handoff):
        return None  # an agent listed as a handoff: the SDK's own, no callback
    invoke = h.on_invoke_handoff
    impl = invoke.args[0] if isinstance(invoke, functools.partial) and invoke.args else invoke
    if getattr(impl, "__qualname__", "") != "handoff.<locals>._invoke_handoff_impl":
        return invoke
    try:
        return inspect.getclosurevars(impl).nonlocals.get("on_handoff")
    except TypeError:
        return invoke


def with_callbacks(agents: Mapping[str, Any]) -> list[str]:
    """``"agent -> handoff tool (callback)"`` for every handoff of the app that runs user code."""
    out = []
    for name, a in agents.items():
        for h in a.handoffs or ():
            cb = callback_of(h)
            if cb is not None:
                label = getattr(cb, "__qualname__", type(cb).__name__)
                out.append(f"{name} -> {h.tool_name} ({label})")
    return out


def check(agents: Mapping[str, Any], choice: str) -> None:
    """Refuse an app whose handoffs run callbacks, until ``choice`` says what branches do."""
    if choice not in (REFUSE, SKIP, LIVE):
        raise InvalidInput(f"handoff_callbacks={choice!r}",
                           hint='use "skip" (branches do not call them) or "live"')
    found = with_callbacks(agents)
    if found and choice == REFUSE:
        raise AdapterError(
            f"handoff(s) {found} run a callback (on_handoff) when the model hands off, which "
            "CAR cannot see into: a branch that hands off would run it for real",
            hint='pass OpenAIAgentsAgent(agent, ..., handoff_callbacks="skip") to hand off on '
                 "branches without calling it (a write it makes to the run context is then "
                 'not made), or handoff_callbacks="live" if it has no side effect')
