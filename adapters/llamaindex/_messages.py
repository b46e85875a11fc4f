"""LlamaIndex ``ChatMessage`` values to and from the OpenAI-style dicts CAR stores.

Tool calls travel as ``ToolCallBlock`` blocks (the form llama-index-core 0.14 uses natively)
and, when a model keeps them elsewhere, are read from ``additional_kwargs["tool_calls"]``.
Tool results carry their call id in ``additional_kwargs["tool_call_id"]``, as ``FunctionAgent``
writes them; the tool's name is recovered from the call it answers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, TextBlock, ToolCallBlock
from llama_index.core.llms.llm import ToolSelection

from ..common.messages import assistant, calls_of, parse_arguments, tool_call, tool_result

Message = dict[str, Any]


def _text(msg: ChatMessage) -> str | None:
    parts = [b.text for b in msg.blocks if isinstance(b, TextBlock)]
    return "\n".join(parts) if parts else None


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def selections_of(msg: ChatMessage) -> list[ToolSelection]:
    """The tool calls an assistant message carries, wherever the model put them."""
    out = []
    for block in msg.blocks:
        if isinstance(block, ToolCallBlock):
            kwargs = block.tool_kwargs
            if isinstance(kwargs, str):
                kwargs = parse_arguments(kwargs)
            out.append(ToolSelection(tool_id=block.tool_call_id or "", tool_name=block.tool_name,
                                     tool_kwargs=kwargs))
    for call in msg.additional_kwargs.get("tool_calls") or ():
        if isinstance(call, ToolSelection):
            out.append(call)
        elif isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
            fn = call["function"]
            out.append(ToolSelection(tool_id=str(call.get("id", "")), tool_name=fn["name"],
                                     tool_kwargs=parse_arguments(fn.get("arguments") or {})))
    return out


def action_of(content: str | None, selections: Iterable[ToolSelection]) -> Message:
    """A CAR action from a response's text and its parsed tool calls."""
    return assistant(content, [tool_call(s.tool_id, s.tool_name, s.tool_kwargs)
                               for s in selections])


def to_dicts(messages: Sequence[ChatMessage]) -> list[Message]:
    """A LlamaIndex message list as OpenAI-style dicts (tool names filled from their calls)."""
    names: dict[str, str] = {}
    out: list[Message] = []
    for msg in messages:
        role = msg.role.value if hasattr(msg.role, "value") else str(msg.role)
        if role == "assistant":
            action = action_of(_text(msg), selections_of(msg))
            for cid, name, _ in calls_of(action):
                names[cid] = name
            if not action["tool_calls"]:
                del action["tool_calls"]
            out.append(action)
        elif role == "tool":
            cid = str(msg.additional_kwargs.get("tool_call_id", ""))
            name = str(msg.additional_kwargs.get("name") or names.get(cid, ""))
            out.append(tool_result(cid, name, _text(msg) or ""))
        else:
            out.append({"role": role, "content": _jsonable(_text(msg))})
    return out


def from_dict(message: Mapping[str, Any]) -> ChatMessage:
    """One OpenAI-style dict as a LlamaIndex message."""
    role = message.get("role")
    content = message.get("content")
    if role == "assistant":
        blocks: list[Any] = [TextBlock(text=content)] if content is not None else []
        for cid, name, args in calls_of(message):
            blocks.append(ToolCallBlock(tool_call_id=cid, tool_name=name,
                                        tool_kwargs=parse_arguments(args)))
        return ChatMessage(role="assistant", blocks=blocks)
    if role == "tool":
        return ChatMessage(role="tool", content=str(content if content is not None else ""),
                           additional_kwargs={"tool_call_id": message.get("tool_call_id", ""),
                                              "name": message.get("name", "")})
    return ChatMessage(role=str(role), content=content if content is not None else "")


def from_dicts(messages: Iterable[Mapping[str, Any]]) -> list[ChatMessage]:
    return [from_dict(m) for m in messages]


class MessageToolCalls:
    """The two tool-calling hooks our LLM stand-ins share: the tools travel beside the chat
    messages, and tool calls are read back from the reply message. Mixed in before
    ``FunctionCallingLLM``."""

    def _prepare_chat_with_tools(self, tools: Sequence[Any], user_msg: Any = None,
                                 chat_history: list[ChatMessage] | None = None,
                                 verbose: bool = False, allow_parallel_tool_calls: bool = False,
                                 tool_required: bool = False, **kwargs: Any) -> dict[str, Any]:
        messages = list(chat_history or [])
        if user_msg:
            messages.append(ChatMessage(role="user", content=user_msg)
                            if isinstance(user_msg, str) else user_msg)
        return {"messages": messages, "tools": tools}

    def get_tool_calls_from_response(self, response: Any, error_on_no_tool_call: bool = False,
                                     **kwargs: Any) -> list[Any]:
        return selections_of(response.message)
