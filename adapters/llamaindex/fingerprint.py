"""The fingerprint of a LlamaIndex agent workflow (see ``car_adapters.common.fingerprint``): each
agent's name, description, system prompt, tools (name, description, argument schema) and
handoff targets, the workflow's own prompts and its root agent; never its LLM (a branch swaps
in stand-ins, a test a scripted model). ``LlamaIndexAgent.fingerprint()`` and ``CarRecorder``
stamp this value."""

from __future__ import annotations

import json
from typing import Any

from car_core.contract import fingerprint_digest

from ..common.fingerprint import callable_print, jsonable, tool_print

_WORKFLOW_PROMPTS = ("handoff_prompt", "handoff_output_prompt", "state_prompt")
_AGENT_TEXT = ("description", "system_prompt")


def _prompt(value: Any) -> Any:
    """A prompt field: text as itself, a prompt template by its template text."""
    if value is None or isinstance(value, str):
        return value
    template = getattr(value, "template", None)
    if isinstance(template, str):
        return template
    if callable(value):
        return callable_print(value)
    return type(value).__qualname__


def _tool(t: Any) -> dict[str, Any]:
    meta = getattr(t, "metadata", None)
    if meta is None:
        return {"function": callable_print(t)}
    try:
        schema = meta.get_parameters_dict()
    except Exception:  # noqa: BLE001 - a schema that cannot be built is named by the tool
        schema = None
    return tool_print(meta.name, meta.description, schema)


def _agent(a: Any) -> dict[str, Any]:
    return {"type": type(a).__qualname__,
            **{f: _prompt(getattr(a, f, None)) for f in _AGENT_TEXT},
            "tools": sorted((_tool(t) for t in getattr(a, "tools", None) or ()),
                            key=lambda d: json.dumps(jsonable(d), sort_keys=True)),
            "handoffs": sorted(map(str, getattr(a, "can_handoff_to", None) or ())),
            "retriever": getattr(a, "tool_retriever", None) is not None}


def workflow_fingerprint(workflow: Any) -> dict[str, Any]:
    """The JSON value ``LlamaIndexAgent(workflow).fingerprint()`` returns."""
    agents = getattr(workflow, "agents", None)
    if isinstance(agents, dict):
        return {"framework": "llama-index", "workflow": type(workflow).__qualname__,
                "root": str(getattr(workflow, "root_agent", "")),
                **{p: _prompt(getattr(workflow, p, None)) for p in _WORKFLOW_PROMPTS},
                "agents": {str(n): _agent(a) for n, a in sorted(agents.items())}}
    return {"framework": "llama-index", "workflow": type(workflow).__qualname__,
            "agents": {str(getattr(workflow, "name", "")): _agent(workflow)}}


def workflow_digest(workflow: Any) -> str:
    """The ``meta["agent_fingerprint"]`` of a run recorded from ``workflow``."""
    return fingerprint_digest(workflow_fingerprint(workflow))
