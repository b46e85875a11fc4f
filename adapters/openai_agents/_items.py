"""The SDK's input items and model output to and from the OpenAI-style dicts CAR stores.

Input items (the Responses-format list ``to_input_list()`` returns) become chat messages with
the SDK's own converter, tool messages get the name of the call they answer, and text parts
are joined; the way back builds the plain item forms every model in the SDK accepts
(``{"role", "content"}``, ``function_call``, ``function_call_output``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agents.models.chatcmpl_converter import Converter
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage
from openai.types.responses.response_output_text import ResponseOutputText

from ..common.messages import assistant, calls_of, tool_call

Message = dict[str, Any]


def _text(content: Any) -> Any:
    """Chat content as a string when it is text parts, else unchanged (JSON-safe)."""
    if isinstance(content, list) and all(isinstance(p, Mapping) and "text" in p
                                         for p in content):
        return "".join(str(p["text"]) for p in content)
    try:
        json.dumps(content)
        return content
    except (TypeError, ValueError):
        return str(content)


def to_dicts(system: str | None, items: Sequence[Any]) -> list[Message]:
    """What a model call saw (instructions and input items) as OpenAI-style message dicts."""
    out: list[Message] = [{"role": "system", "content": system}] if system else []
    names: dict[str, str] = {}
    for raw in Converter.items_to_messages(list(items)):
        msg: dict[str, Any] = dict(raw)
        role = msg.get("role")
        if role == "assistant":
            calls = [tool_call(c["id"], c["function"]["name"], c["function"].get("arguments"))
                     for c in msg.get("tool_calls") or ()]
            for call in calls:
                names[call["id"]] = call["function"]["name"]
            action = assistant(_text(msg.get("content")), calls)
            if not calls:
                del action["tool_calls"]
            out.append(action)
        elif role == "tool":
            cid = str(msg.get("tool_call_id", ""))
            out.append({"role": "tool", "tool_call_id": cid, "name": names.get(cid, ""),
                        "content": _text(msg.get("content"))})
        else:
            out.append({"role": str(role), "content": _text(msg.get("content"))})
    return out


def to_items(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-style dicts as SDK input items; a system message becomes a system input item,
    which every model of the SDK passes on as a system message in its place."""
    items: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant":
            if m.get("content"):
                items.append({"role": "assistant", "content": m["content"]})
            for cid, name, args in calls_of(m):
                items.append({"type": "function_call", "call_id": cid, "name": name,
                              "arguments": args})
        elif role == "tool":
            content = m.get("content")
            items.append({"type": "function_call_output", "call_id": str(m.get("tool_call_id")),
                          "output": content if isinstance(content, str)
                          else json.dumps(content)})
        else:
            items.append({"role": str(role), "content": m.get("content") or ""})
    return items


def action_of(output: Sequence[Any]) -> Message:
    """A CAR action from a ``ModelResponse.output`` list (text and function calls)."""
    texts: list[str] = []
    calls = []
    for item in output:
        kind = getattr(item, "type", None) or (item.get("type") if isinstance(item, Mapping)
                                               else None)
        if isinstance(item, ResponseOutputMessage):
            for part in item.content:
                texts.append(str(getattr(part, "text", None) or getattr(part, "refusal", "")))
        elif isinstance(item, ResponseFunctionToolCall):
            calls.append(tool_call(item.call_id, item.name, item.arguments))
        elif kind == "function_call" and isinstance(item, Mapping):
            calls.append(tool_call(item["call_id"], item["name"], item.get("arguments")))
    return assistant("".join(texts) if texts else None, calls)


def output_of(action: Mapping[str, Any]) -> list[Any]:
    """A CAR action as ``ModelResponse.output`` items (what a forced or held step returns)."""
    out: list[Any] = []
    content = action.get("content")
    if content:
        out.append(ResponseOutputMessage(
            id="car-message", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(text=str(content), type="output_text", annotations=[],
                                        logprobs=[])]))
    for cid, name, args in calls_of(action):
        out.append(ResponseFunctionToolCall(id=cid, call_id=cid, type="function_call",
                                            name=name, arguments=args))
    return out


def tool_names_of(tools: Iterable[Any], handoffs: Iterable[Any] = ()) -> list[str]:
    """The names a model is offered: its tools' and its handoffs' tool names."""
    return [str(getattr(t, "name", "")) for t in tools] + [
        str(getattr(h, "tool_name", "")) for h in handoffs]
