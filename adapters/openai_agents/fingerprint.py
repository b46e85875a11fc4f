"""The fingerprint of an OpenAI Agents SDK app (see ``common.fingerprint``): every agent
reachable from the starting one through handoffs, by its name, instructions (text, or the code
of an instructions function), handoff description, tools (name, description, parameter
schema), handoff targets, output type and tool-use behaviour, and, for an agent with MCP
servers, the tools they listed (with their annotations: what CAR classifies them by); never
its model or model settings (a branch serves the model through CAR).
``OpenAIAgentsAgent.fingerprint()`` and ``CarRecorder`` stamp this value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from car_core.contract import fingerprint_digest

from ..common.fingerprint import callable_print, tool_print
from .app import agents_of, handoff_target


def _text(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if callable(value):
        return callable_print(value)
    return type(value).__qualname__


def _mcp_print(t: Any) -> dict[str, Any]:
    notes = getattr(t, "_mcp_annotations", None)
    dump = getattr(notes, "model_dump", None)
    return {**tool_print(t.name, t.description, t.params_json_schema),
            "mcp_annotations": dump(mode="json", exclude_none=True) if callable(dump) else None}


def _agent(a: Any, mcp: Sequence[Any] = ()) -> dict[str, Any]:
    tools = [tool_print(getattr(t, "name", type(t).__name__), getattr(t, "description", ""),
                        getattr(t, "params_json_schema", None)) for t in a.tools or ()]
    tools += [_mcp_print(t) for t in mcp]
    handoffs = []
    for h in a.handoffs or ():
        target = handoff_target(h)
        handoffs.append(str(getattr(h, "tool_name", None) or getattr(target, "name", "?")))
    output = a.output_type
    behaviour = a.tool_use_behavior
    return {"instructions": _text(a.instructions),
            "handoff_description": a.handoff_description,
            "tools": sorted(tools, key=lambda t: t["name"]), "handoffs": sorted(handoffs),
            "output_type": getattr(output, "__qualname__", None) if output else None,
            "tool_use_behavior": _text(behaviour) if not isinstance(behaviour, dict)
            else sorted(map(str, behaviour.get("stop_at_tool_names", ())))}


def app_fingerprint(root: Any, mcp: Mapping[str, Sequence[Any]] | None = None
                    ) -> dict[str, Any]:
    """The JSON value ``OpenAIAgentsAgent(root).fingerprint()`` returns; ``mcp``: each agent's
    tools from its MCP servers (``mcp_tools.list_tools``)."""
    return {"framework": "openai-agents", "root": root.name,
            "agents": {name: _agent(a, (mcp or {}).get(name, ()))
                       for name, a in sorted(agents_of(root).items())}}


def app_digest(root: Any, mcp: Mapping[str, Sequence[Any]] | None = None) -> str:
    """The ``meta["agent_fingerprint"]`` of a run recorded starting from ``root``."""
    return fingerprint_digest(app_fingerprint(root, mcp))
