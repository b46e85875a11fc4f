"""The function tools an OpenAI Agents SDK model call was offered: recorded as ``{"name",
"description"}`` specs, and given again with edited descriptions on a branch.

The SDK offers a call its agent's MCP tools, then its enabled function tools
(``Agent.get_all_tools``), and builds each tool's schema for the model from the
``FunctionTool`` it is handed (``description`` included). The hooks do not see that list, so the
recorder rebuilds it the same way: the MCP tools it listed as the run started, then the agent's
function tools whose ``is_enabled`` holds for this call. An edited tool is a copy
(``dataclasses.replace``) with the new description, handed to that one model call: the SDK runs a
tool the model calls from the agent's own tools, by name, so what runs does not change.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from agents.tool import FunctionTool

Spec = dict[str, str]


def spec(tool: FunctionTool) -> Spec:
    return {"name": tool.name, "description": tool.description or ""}


async def offered(agent: Any, context: Any, mcp: Sequence[FunctionTool]) -> list[Spec] | None:
    """The specs of the function tools ``agent``'s model call is offered, in the SDK's order
    (``mcp``: its MCP servers' tools, listed as the run started); ``None`` where an
    ``is_enabled`` check raised (the step then offers no tool as a source, rather than a list
    that may be wrong)."""
    tools = list(mcp)
    for tool in agent.tools or ():
        if not isinstance(tool, FunctionTool):
            continue
        try:
            enabled = tool.is_enabled
            if not isinstance(enabled, bool):
                found = enabled(context, agent)
                enabled = bool(await found if inspect.isawaitable(found) else found)
        except Exception:  # the user's run goes on; the step just offers no tools
            return None
        if enabled:
            tools.append(tool)
    return [spec(t) for t in tools]


def described(tools: Sequence[Any], descriptions: Mapping[str, str]) -> list[Any]:
    """``tools`` with the named function tools described as ``descriptions`` says (copies: the
    name, arguments and invoke function unchanged); every other tool as given."""
    return [dataclasses.replace(t, description=descriptions[t.name])
            if isinstance(t, FunctionTool) and t.name in descriptions
            and descriptions[t.name] != t.description else t for t in tools]


def as_given(specs: Sequence[Spec], descriptions: Mapping[str, str]) -> list[Spec]:
    """The recorded ``specs`` as a branch gave them: the edited descriptions in place."""
    return [{**t, "description": descriptions.get(t["name"], t["description"])} for t in specs]
