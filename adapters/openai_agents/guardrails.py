"""Guardrail tripwires: how a run a guardrail stopped is told apart from one that finished.

The SDK raises ``InputGuardrailTripwireTriggered`` / ``OutputGuardrailTripwireTriggered`` from
``Runner.run`` and tells its run hooks nothing: an input guardrail that runs in parallel with the
agent (the SDK's default) can trip after the agent's reply, and every output guardrail runs
after ``on_agent_end``, so hooks alone record such a stopped run as finished, with a reply the
user never got. A run is told apart by ``meta["tripwire"]`` (``{"kind": "input" | "output",
"guardrail": name}``): a branch sets it from the exception its ``Runner.run`` raised; a
recorded run gets it where the recorder saw the exception, which it does for the runs it records
inside ``with recorder.recording():`` (``meta["guardrails_watched"]``). A run recorded without
that from an app whose guardrails can trip unseen is refused before any branch: whether it was
stopped cannot be known, so neither can whether it failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents.exceptions import InputGuardrailTripwireTriggered, OutputGuardrailTripwireTriggered

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


def unseen_guardrails(agents: Mapping[str, Any], root: str | None, run_config: Any
                      ) -> list[str]:
    """The guardrails of the app whose tripwire the run hooks cannot see: the input
    guardrails that run in parallel with the starting agent ``root`` (its own and
    ``run_config``'s), and every output guardrail. An input guardrail with
    ``run_in_parallel=False`` runs before the first model call: a run it stops records
    nothing."""
    found: list[str] = []
    starting = [agents[root]] if root is not None and root in agents else list(agents.values())
    inputs = [g for a in starting for g in getattr(a, "input_guardrails", None) or ()]
    inputs += list(getattr(run_config, "input_guardrails", None) or ())
    found += [f"input guardrail {_name(g)!r}" for g in inputs
              if getattr(g, "run_in_parallel", True)]
    outputs = [g for a in agents.values() for g in getattr(a, "output_guardrails", None) or ()]
    outputs += list(getattr(run_config, "output_guardrails", None) or ())
    found += [f"output guardrail {_name(g)!r}" for g in outputs]
    return sorted(set(found))


__all__ = ["TRIPWIRES", "tripwire_of", "unseen_guardrails"]
