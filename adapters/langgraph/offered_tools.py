"""The tools a model call CAR decides was offered: recorded as ``{"name", "description"}``
specs, and bound again with edited descriptions on a branch.

``CarChatModel`` keeps the tools the app bound (``car_tools`` in its invocation params);
``CarMiddleware`` offers ``create_agent``'s request tools inside ``offering``, so the recorder
reads them in the call's context. An edited tool is a copy with the new description (a
``BaseTool``'s ``model_copy``, a dict's copy): its function, name and arguments are unchanged,
so ``create_agent`` still finds it among its registered tools and the tool node runs it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

_OFFERED: ContextVar[Sequence[Any] | None] = ContextVar("car_offered_tools", default=None)


@contextmanager
def offering(tools: Sequence[Any] | None) -> Iterator[None]:
    """Mark ``tools`` as what the chat-model calls made inside the block are offered."""
    token = _OFFERED.set(list(tools) if tools is not None else None)
    try:
        yield
    finally:
        _OFFERED.reset(token)


def offered(params: Mapping[str, Any]) -> list[dict[str, str]] | None:
    """The specs of the tools a call CAR decides was offered (``offering``, or a
    ``CarChatModel``'s ``car_tools``), or ``None`` where CAR did not see them."""
    tools = _OFFERED.get()
    if tools is None:
        tools = params.get("car_tools")
    if not tools:
        return None
    specs = [s for s in (spec(t) for t in tools) if s is not None]
    return specs or None


def spec(tool: Any) -> dict[str, str] | None:
    """A tool's name and description; ``None`` for a provider's built-in tool (no name)."""
    if isinstance(tool, BaseTool):
        return {"name": tool.name, "description": tool.description or ""}
    fn = _function(tool) if isinstance(tool, Mapping) else None
    if fn is None:
        try:
            fn = convert_to_openai_tool(tool)["function"]
        except Exception:  # not a tool LangChain can describe: nothing to offer as a source
            return None
    name = fn.get("name")
    return {"name": name, "description": str(fn.get("description") or "")} \
        if isinstance(name, str) else None


def described(tools: Sequence[Any], descriptions: Mapping[str, str]) -> list[Any]:
    """``tools`` with the named ones described as ``descriptions`` says (the rest as given)."""
    out: list[Any] = []
    for tool in tools:
        found = spec(tool)
        if found is None or found["name"] not in descriptions \
                or descriptions[found["name"]] == found["description"]:
            out.append(tool)
        elif isinstance(tool, BaseTool):
            out.append(tool.model_copy(update={"description": descriptions[found["name"]]}))
        else:
            given = copy.deepcopy(dict(tool)) if isinstance(tool, Mapping) \
                else convert_to_openai_tool(tool)
            fn = _function(given)
            assert fn is not None  # ``spec`` found its name there
            fn["description"] = descriptions[found["name"]]
            out.append(given)
    return out


def _function(tool: Mapping[str, Any]) -> Any:
    """Where a tool dict keeps its name and description: OpenAI's ``function``, or itself."""
    fn = tool.get("function") if tool.get("type") == "function" else tool
    return fn if isinstance(fn, Mapping) else None
