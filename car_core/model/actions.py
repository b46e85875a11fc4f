"""When two actions are the same decision: compared modulo the fields a provider assigns.

A chat action (an assistant message ``{"role": "assistant", "content", "tool_calls"}``) carries
fields the model did not decide: each tool call's ``id`` (fresh on every call with most
providers), its ``type``, a message id, refusal or annotation fields some clients add. Two chat
actions are the same decision when they say the same text (``None`` and ``""`` both mean none)
and make the same tool calls, in the same order, with the same arguments (compared as parsed
JSON, so key order and spacing do not count). Any other action is compared as the JSON value it
is. ``action_match_rate``, the conformance checks and the adapters all use ``same_action``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from car_core.model.json_values import JSON


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments as one canonical JSON string (sorted keys), whatever form they came
    in (a dict, or a JSON string as OpenAI sends them); a string that is not JSON is kept."""
    if isinstance(arguments, str):
        try:
            parsed: Any = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
        arguments = parsed
    return json.dumps(arguments if arguments is not None else {}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False)


def is_chat_action(action: Any) -> bool:
    """Whether ``action`` is an assistant message (the shape chat adapters record)."""
    return isinstance(action, Mapping) and (action.get("role") == "assistant"
                                            or ("tool_calls" in action and "role" not in action))


def canonical_action(action: JSON) -> JSON:
    """The part of an action the agent decided: for a chat action its text and its tool calls'
    names and canonical arguments, in order; any other action unchanged."""
    if not is_chat_action(action):
        return action
    assert isinstance(action, Mapping)
    calls: list[JSON] = []
    for call in action.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):  # not the documented shape: compare it whole
            calls.append({k: v for k, v in call.items() if k != "id"}
                         if isinstance(call, Mapping) else call)
            continue
        calls.append({"name": fn.get("name"),
                      "arguments": canonical_arguments(fn.get("arguments"))})
    content = action.get("content")
    return {"role": "assistant", "content": content if content != "" else None,
            "tool_calls": calls}


def same_action(a: JSON, b: JSON) -> bool:
    """Whether ``a`` and ``b`` are the same decision (see the module docstring)."""
    return bool(a == b or canonical_action(a) == canonical_action(b))


__all__ = ["canonical_action", "canonical_arguments", "is_chat_action", "same_action"]
