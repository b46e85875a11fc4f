"""Guardrail tripwires: how a run a guardrail stopped is told apart from one that finished.

The SDK raises ``InputGuardrailTripwireTriggered`` / ``OutputGuardrailTripwireTriggered`` from
``Runner.run`` and tells its run hooks nothing: an input guardrail that runs in parallel with the
agent (the SDK's default) can trip after the agent's reply, and every output guardrail runs
after ``on_agent_end``, so hooks alone record such a stopped run as finished, with a reply the
user never got, and an app that catches the tripwire (the SDK's own examples do) hides it from
anything that waits for the exception. A run is told apart by ``meta["tripwire"]``
(``{"kind": "input" | "output", "guardrail": name}``): a branch sets it from the exception its
``Runner.run`` raised; a recorded run gets it inside ``with recorder.recording(agent):``, which
watches the app's guardrails (``watch``: each guardrail's function reports its own verdict, by
run, to the block the run started in) and keeps the block's runs until it ends. A run lists the
guardrails watched (``meta["guardrails_watched"]``); one of an app whose guardrails can trip
unseen, recorded with any of them unwatched, is refused before any branch: whether it was
stopped cannot be known, so neither can whether it failed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

from agents import Agent
from agents.exceptions import InputGuardrailTripwireTriggered, OutputGuardrailTripwireTriggered

from ..common.named import named_objects

TRIPWIRES = (InputGuardrailTripwireTriggered, OutputGuardrailTripwireTriggered)


def tripwire_of(exc: BaseException | None) -> dict[str, str] | None:
    """``{"kind", "guardrail"}`` of a guardrail tripwire exception, else None."""
    if isinstance(exc, InputGuardrailTripwireTriggered):
        return {"kind": "input", "guardrail": _name(exc.guardrail_result.guardrail)}
    if isinstance(exc, OutputGuardrailTripwireTriggered):
        return {"kind": "output", "guardrail": _name(exc.guardrail_result.guardrail)}
    return None


def _name(guardrail: Any) -> str:
    get = getattr(guardrail, "get_name", None)
    return str(get()) if callable(get) else type(guardrail).__name__


def label(kind: str, guardrail: Any) -> str:
    """How a guardrail is named in messages and in ``meta["guardrails_watched"]``."""
    return f"{kind} guardrail {_name(guardrail)!r}"


def _guardrails(agents: Mapping[str, Any], starting: list[Any], run_config: Any
                ) -> list[tuple[str, Any]]:
    """(kind, guardrail) of every guardrail a run started at ``starting`` may run: the input
    guardrails of the starting agents and ``run_config``, every agent's output guardrails."""
    inputs = [g for a in starting for g in getattr(a, "input_guardrails", None) or ()]
    inputs += list(getattr(run_config, "input_guardrails", None) or ())
    outputs = [g for a in agents.values() for g in getattr(a, "output_guardrails", None) or ()]
    outputs += list(getattr(run_config, "output_guardrails", None) or ())
    return [("input", g) for g in inputs] + [("output", g) for g in outputs]


def unseen_guardrails(agents: Mapping[str, Any], root: str | None, run_config: Any
                      ) -> list[str]:
    """The guardrails of the app whose tripwire the run hooks cannot see: the input
    guardrails that run in parallel with the starting agent ``root`` (its own and
    ``run_config``'s), and every output guardrail. An input guardrail with
    ``run_in_parallel=False`` runs before the first model call: a run it stops records
    nothing."""
    starting = [agents[root]] if root is not None and root in agents else list(agents.values())
    return sorted({label(kind, g) for kind, g in _guardrails(agents, starting, run_config)
                   if kind == "output" or getattr(g, "run_in_parallel", True)})


# the tripwires of the runs of the recording block the code running now is in, by the id of
# each run's usage object (the key the recorder tells runs apart by); None outside a block
TRIPS: ContextVar[dict[int, dict[str, str]] | None] = ContextVar("car_tripwires", default=None)
# the input an input guardrail stopped, by run key as ``TRIPS``: a run stopped before its first
# model call has no other record of what it was asked
BLOCKED: ContextVar[dict[int, Any] | None] = ContextVar("car_blocked_inputs", default=None)
_WATCHED = "__car_watches__"


def watch(agents: Mapping[str, Any], run_config: Any) -> list[str]:
    """Have every guardrail of the app (each agent's, ``run_config``'s) report a tripwire
    to the recording block its run started in (``TRIPS``), and return their labels. The
    guardrail objects are the app's own: each function is wrapped once, and the wrapper
    only notes a verdict (nothing, outside a block; a branch runs outside any)."""
    found = _guardrails(agents, list(agents.values()), run_config)
    for kind, g in found:
        fn = getattr(g, "guardrail_function", None)
        if callable(fn) and not getattr(fn, _WATCHED, False):
            g.guardrail_function = _watched(fn, kind, _name(g))
    return sorted({label(kind, g) for kind, g in found})


def _watched(fn: Callable[..., Any], kind: str, name: str) -> Callable[..., Any]:
    def note(context: Any, out: Any, data: Any) -> Any:
        trips, blocked = TRIPS.get(), BLOCKED.get()
        if trips is not None and getattr(out, "tripwire_triggered", False):
            key = id(getattr(context, "usage", None))
            if key not in trips:
                trips[key] = {"kind": kind, "guardrail": name}
                if kind == "input" and blocked is not None:
                    blocked[key] = data
        return out

    @functools.wraps(fn)
    def run(context: Any, agent: Any, data: Any) -> Any:
        out = fn(context, agent, data)
        if inspect.isawaitable(out):
            async def verdict() -> Any:
                return note(context, await out, data)
            return verdict()
        return note(context, out, data)

    setattr(run, _WATCHED, True)
    return run


def judges(agents: Mapping[str, Any], run_config: Any) -> dict[str, list[Any]]:
    """The agents each guardrail of the app runs, by its ``label``: an input guardrail runs
    again on branches from step 0 and every output guardrail on every branch, and the agent a
    guardrail's function runs (the SDK's own example: a judge agent, ``Runner.run(judge, ...)``)
    runs there with its own tools, which a branch cannot guard. A user trial's judge filed 76
    real audit alerts from one attribution. The agents are found where the function names
    them (``named_agents``)."""
    out: dict[str, list[Any]] = {}
    for kind, g in _guardrails(agents, list(agents.values()), run_config):
        found = named_agents(getattr(g, "guardrail_function", None))
        if found:
            out.setdefault(label(kind, g), []).extend(found)
    return out


def named_agents(fn: Any) -> list[Any]:
    """The ``Agent`` objects a function names (``named_objects``): an agent reached some other
    way (built inside the call, or behind another module's function) is not seen."""
    return named_objects(fn, lambda v: isinstance(v, Agent))


__all__ = ["BLOCKED", "TRIPS", "TRIPWIRES", "judges", "label", "named_agents", "tripwire_of",
           "unseen_guardrails", "watch"]
