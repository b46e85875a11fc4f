"""The tools a LlamaIndex model call was offered: recorded as ``{"name", "description"}``
specs, and offered again with edited descriptions at a branch's step ``k``.

The recorder reads them from the chat-start event of the step's first model call (the
``tools`` a ``FunctionCallingLLM`` was handed: tool objects for CAR's own LLMs and stand-ins,
a provider's dicts for a hosted model). A ``ReActAgent`` puts its tools in its prompt, not
beside it, so its steps record none. Every model call on a branch goes through
``CarBranchLLM``, so an edited description always reaches the model: step ``k``'s call is
handed copies of the tools described as edited (``described``). A copy keeps the tool's
function, name and argument schema; the framework runs the tools it was given by name, so the
copies only change what the model reads.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.tools import (
    AsyncBaseTool,
    FunctionTool,
    ToolMetadata,
    ToolOutput,
    adapt_to_async_tool,
)


def offered(tools: Any) -> list[dict[str, str]] | None:
    """The specs of the tools a model call was handed (a provider's built-in tool, which has no
    name, left out), or ``None`` where it was handed none (a plain chat call)."""
    if not isinstance(tools, (list, tuple)):
        return None
    specs = [s for s in (spec(t) for t in tools) if s is not None]
    return specs or None


def spec(tool: Any) -> dict[str, str] | None:
    """A tool's name and description: a LlamaIndex tool's metadata, or a provider's tool dict
    (OpenAI's ``{"type": "function", "function": {...}}``, or the name and description at its
    top level)."""
    meta = getattr(tool, "metadata", None)
    if isinstance(meta, ToolMetadata):
        return {"name": meta.name, "description": meta.description or ""} \
            if isinstance(meta.name, str) else None
    if not isinstance(tool, Mapping):
        return None
    fn = tool.get("function") if tool.get("type") == "function" else tool
    name = fn.get("name") if isinstance(fn, Mapping) else None
    return {"name": name, "description": str(fn.get("description") or "")} \
        if isinstance(fn, Mapping) and isinstance(name, str) else None


def described(tools: Sequence[Any], descriptions: Mapping[str, str]) -> list[Any]:
    """``tools`` with the named ones described as ``descriptions`` says (the rest as given)."""
    out: list[Any] = []
    for tool in tools:
        meta = tool.metadata
        new = descriptions.get(meta.name or "")
        if new is None or new == meta.description:
            out.append(tool)
            continue
        metadata = dataclasses.replace(meta, description=new)
        if isinstance(tool, FunctionTool):  # the same function (and Context it is handed)
            twin = copy.copy(tool)
            twin._metadata = metadata
            out.append(twin)
        else:
            out.append(Redescribed(tool, metadata))
    return out


class Redescribed(AsyncBaseTool):
    """A tool under other metadata (another description): its calls go to the tool."""

    def __init__(self, tool: Any, metadata: ToolMetadata) -> None:
        self.tool = tool
        self._inner = adapt_to_async_tool(tool)
        self._metadata = metadata

    @property
    def metadata(self) -> ToolMetadata:
        return self._metadata

    def call(self, *args: Any, **kwargs: Any) -> ToolOutput:
        return self._inner.call(*args, **kwargs)

    async def acall(self, *args: Any, **kwargs: Any) -> ToolOutput:
        return await self._inner.acall(*args, **kwargs)
