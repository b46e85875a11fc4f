"""What every adapter's ``final_state(run)`` checks first: that the run was recorded by that
adapter's framework, so a rule over one framework's state never reads another's by mistake."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from car_core.contract import Trajectory
from car_core.errors import AdapterError

# framework tag a recorder writes into run.meta -> (its name in words, its adapter module)
_FRAMEWORKS = {"langgraph": ("a LangGraph", "car_adapters.langgraph"),
               "llama-index": ("a LlamaIndex", "car_adapters.llamaindex"),
               "openai-agents": ("an OpenAI Agents SDK", "car_adapters.openai_agents")}


def recorded_meta(run: Trajectory, framework: str) -> Mapping[str, Any]:
    """``run.meta`` of a run ``framework``'s recorder wrote; another framework's run (or one
    with no tag) is refused, naming the adapters whose ``final_state`` reads it."""
    meta = run.meta if isinstance(run.meta, Mapping) else {}
    if meta.get("framework") != framework:
        words, _ = _FRAMEWORKS[framework]
        others = ", ".join(mod for tag, (_, mod) in _FRAMEWORKS.items() if tag != framework)
        raise AdapterError(
            f"final_state reads {words} run; this run's framework is "
            f"{meta.get('framework')!r}", run_id=run.id,
            hint=f"use final_state from the adapter that recorded the run ({others})")
    return meta
