"""LangChain messages to and from CAR's OpenAI-style dicts, and a message list read as steps.

A model decision in a LangGraph thread is an ``AIMessage`` in the messages channel; its
observation is the ``ToolMessage``s that answer its tool calls (in call order); its state is the
messages before it. Both the callback and ``import_thread`` use ``decode`` so they agree.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
)
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from car_core.errors import InvalidIntervention

from ..common.messages import assistant, parse_arguments, tool_call, tool_result


def _text(content: Any) -> Any:
    """Message content as stored: a string stays a string; multimodal blocks stay JSON."""
    if isinstance(content, str) or content is None:
        return content
    return json.loads(json.dumps(content, default=str))


def to_dict(message: BaseMessage) -> dict[str, Any]:
    """One LangChain message as an OpenAI-style dict."""
    return dict_of(message, message.content, message.__dict__.get("tool_calls"), message.name)


def seen(message: BaseMessage) -> tuple[BaseMessage, Any, Any, Any]:
    """``(message, content, tool calls, name)``: what ``dict_of`` converts, as it is now. A
    recorder keeps this instead of converting at once: a field assigned anew later does not
    reach it (the objects themselves are kept, so a change made inside a content list or a
    tool call's arguments would)."""
    return (message, message.content, message.__dict__.get("tool_calls"), message.name)


def dict_of(message: BaseMessage, content: Any, tool_calls: Any, name: Any) -> dict[str, Any]:
    """``to_dict(message)`` with the content, tool calls and name given (as ``seen`` kept
    them); the rest (the kind of message, a tool result's call id) is read from ``message``."""
    if isinstance(message, AIMessage):
        calls = [tool_call(c.get("id") or "", c["name"], c.get("args") or {})
                 for c in tool_calls or ()]
        return assistant(_text(content), calls)
    if isinstance(message, ToolMessage):
        return tool_result(message.tool_call_id, name or "", _text(content))
    role = {"human": "user", "system": "system"}.get(message.type, message.type)
    out: dict[str, Any] = {"role": role, "content": _text(content)}
    if name:
        out["name"] = name
    return out


def to_dicts(messages: Iterable[BaseMessage]) -> list[dict[str, Any]]:
    return [to_dict(m) for m in messages]


def action_message(action: Mapping[str, Any]) -> AIMessage:
    """A CAR action (assistant dict) as the ``AIMessage`` a model node would have written."""
    calls = [{"id": c["id"], "name": c["function"]["name"],
              "args": parse_arguments(c["function"].get("arguments") or {}), "type": "tool_call"}
             for c in action.get("tool_calls") or ()]
    return AIMessage(content=action.get("content") or "", tool_calls=calls)


def from_dicts(messages: Sequence[Mapping[str, Any]]) -> list[BaseMessage]:
    """OpenAI-style dicts back to LangChain messages (what ``do_context`` edits return)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidIntervention(
            f"a do_context edit must return a list of message dicts, got "
            f"{type(messages).__name__}", hint="return the edited list of messages")
    out: list[BaseMessage] = []
    for m in messages:
        if isinstance(m, BaseMessage):
            out.append(m)
            continue
        if not isinstance(m, Mapping) or "role" not in m:
            raise InvalidIntervention(f"not a chat message: {m!r}",
                                      hint="each message is a dict with 'role' and 'content'")
        role = m["role"]
        if role == "assistant":
            out.append(action_message(m))
        elif role == "tool":
            out.append(ToolMessage(content=m.get("content") or "", name=m.get("name"),
                                   tool_call_id=str(m.get("tool_call_id", ""))))
        elif role == "system":
            out.append(SystemMessage(content=m.get("content") or ""))
        elif role == "user":
            out.append(HumanMessage(content=m.get("content") or "", name=m.get("name")))
        else:
            out.extend(convert_to_messages([dict(m)]))
    return out


def decode(messages: Sequence[BaseMessage], decisions: Iterable[str] | None = None, *,
           convert: Callable[[BaseMessage], dict[str, Any]] = to_dict,
           ) -> list[tuple[int, dict[str, Any], list[dict[str, Any]] | None, bool]]:
    """``(position, action, observation, observed)`` for each model decision in ``messages``.

    ``decisions`` restricts which ``AIMessage`` ids count (messages that came in the input are
    context, not decisions); None means every ``AIMessage``. ``convert`` turns one message into
    its dict (a recorder passes one that converts each message once).
    """
    wanted = set(decisions) if decisions is not None else None
    out = []
    for pos, m in enumerate(messages):
        if not isinstance(m, AIMessage) or (wanted is not None and m.id not in wanted):
            continue
        results: dict[str, ToolMessage] = {}  # the answers between this decision and the next,
        for later in messages[pos + 1:]:      # so a model that reuses call ids keeps each
            if isinstance(later, AIMessage):  # step's own results
                break
            if isinstance(later, ToolMessage):
                results.setdefault(later.tool_call_id, later)
        action = convert(m)
        ids = [str(c.get("id", "")) for c in action.get("tool_calls") or ()]
        obs = [convert(results[cid]) for cid in ids if cid in results]
        out.append((pos, action, obs or None, bool(obs)))
    return out


def usage_of(message: BaseMessage, llm_output: Mapping[str, Any] | None = None
             ) -> dict[str, int] | None:
    """Token usage in CAR's shape, from ``usage_metadata`` or the provider's ``token_usage``."""
    um = getattr(message, "usage_metadata", None)
    if um:
        return {"prompt_tokens": int(um.get("input_tokens", 0)),
                "completion_tokens": int(um.get("output_tokens", 0))}
    for source in (getattr(message, "response_metadata", None) or {}, llm_output or {}):
        tu = source.get("token_usage") or source.get("usage")
        if isinstance(tu, Mapping):
            return {"prompt_tokens": int(tu.get("prompt_tokens", 0) or 0),
                    "completion_tokens": int(tu.get("completion_tokens", 0) or 0)}
    return None


BLOCKS = "blocks"  # a final-state tool message: its content as the app saw it (not a string)


def as_the_app_saw(message: BaseMessage, stored: dict[str, Any], content: Any, name: Any
                   ) -> dict[str, Any]:
    """``stored`` (``message`` as ``dict_of`` wrote it, from ``content`` and ``name`` as seen)
    with what an OpenAI-style dict drops and an app's rule may read, for a run's final state
    only (steps keep the dicts the model saw): a tool result's content when it was not a
    string (content blocks, kept as JSON under ``"blocks"``; ``content`` stays the JSON string
    every step stores), a tool result's ``status`` when it was not a success, and the name of
    the agent that wrote an ``AIMessage``. ``final_state(run)`` reads them back."""
    extra: dict[str, Any] = {}
    if isinstance(message, ToolMessage):
        if content is not None and not isinstance(content, str):
            extra[BLOCKS] = _text(content)
        if message.status != "success":
            extra["status"] = message.status
    elif isinstance(message, AIMessage) and name:
        extra["name"] = name
    return {**stored, **extra} if extra else stored


def final_dict(message: BaseMessage) -> dict[str, Any]:
    """One message of a final graph state as stored (see ``as_the_app_saw``)."""
    return as_the_app_saw(message, to_dict(message), message.content, message.name)


def state_json(value: Any) -> Any:
    """A final graph state as ``meta["final_state"]`` stores it: ``jsonable`` with each message
    kept as the app saw it (``final_dict``)."""
    return jsonable(value, final_dict)


def jsonable(value: Any, convert: Callable[[BaseMessage], dict[str, Any]] = to_dict) -> Any:
    """A graph state value as JSON: messages become OpenAI-style dicts (through ``convert``),
    a pydantic model or dataclass its JSON dict (``as_json``), the rest is kept when it is
    JSON and stringified otherwise."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value  # the common case first: the checks below cost an ABC lookup each
    if kind is dict:
        return {str(k): jsonable(v, convert) for k, v in value.items()}
    if isinstance(value, BaseMessage):
        return convert(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, convert) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, convert) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return as_json(value)


def as_json(value: Any) -> Any:
    """A value that is not JSON as the JSON a state stores for it: a pydantic model (what
    ``create_agent(response_format=...)`` writes as ``structured_response``) as
    ``model_dump(mode="json")``, a dataclass instance as the dict pydantic dumps it to, so an
    outcome reads its fields by key; anything else, or one with a field that has no JSON
    form, as its ``repr``. (A LangChain message is a pydantic model too: callers convert
    messages first.)"""
    try:
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json")
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return to_jsonable_python(value)
    except Exception:  # noqa: BLE001 - a field with no JSON form, or a custom serializer's
        pass            # own error: the repr, as every other value gets
    return repr(value)
