"""An OpenAI Agents SDK app's safe tools run again on their own, outside ``Runner.run``, to tell
whose doing a branch's tool error was (``sources.drifted_tools``).

A tool is run through a copy of it with no failure function, so its error comes out as the
exception the SDK would have turned into a message for the model; an MCP tool's call goes to
its server's loop (``mcp_tools.served_on``), where a result the server flagged ``isError`` is
an error too. The call gets a ``ToolContext`` of its own over the run context the branch
started from. Only tools classified safe are run again, and no tool that runs an agent (an
agent tool, ``as_tool``, or a function tool whose function names one,
``agent_tools.nested_agents``): its call is a whole nested run, with model calls of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agents.tool import FunctionTool, set_function_tool_failure_error_function
from agents.tool_context import ToolContext

from car_core.contract import redact
from car_core.errors import CarError

from ..common.messages import ToolSafety
from ..common.sources import Reruns, answered_error, result_text
from . import mcp_tools
from .agent_tools import nested_agents


def branch_reruns(agents: Mapping[str, Any], listing: mcp_tools.Listing,
                  loop: asyncio.AbstractEventLoop | None, safety: ToolSafety,
                  run_context: Callable[[], Any]) -> Reruns:
    """One branch's re-runs of the app's safe tools: its agents' function tools and the ones
    its MCP servers gave (``listing``, called on ``loop``), each with a fresh run context
    (``run_context()``: the one the branch started from)."""
    static = [t for a in agents.values() for t in a.tools or ()]
    mcp = [t for ts in listing.values() for t in ts]
    tools: dict[str, FunctionTool] = {}
    for t in _function_tools([*static, *mcp]):
        tools.setdefault(t.name, t)
    served = {t.name for t in mcp}

    async def rerun(name: str, args: str) -> str | None:
        probe = set_function_tool_failure_error_function(dataclasses.replace(tools[name]), None)
        flagged: list[str] = []
        if name in served and loop is not None:
            probe = mcp_tools.served_on(probe, loop,
                                        lambda _cid, told, _error: flagged.append(told))
        ctx = ToolContext(context=run_context(), tool_name=name,
                          tool_call_id=f"car-rerun-{uuid.uuid4().hex[:12]}", tool_arguments=args)
        try:
            out = await probe.on_invoke_tool(ctx, args)
        except CarError:  # CAR's own stop (a blocked side effect, a budget): as on a branch
            raise
        except Exception as exc:  # the tool raised: an error
            return redact.describe(exc)
        return answered_error(result_text(out), bool(flagged))

    runnable = {n for n in safety.safe_tools if n in tools and not nested_agents(tools[n])}
    return Reruns(runnable, rerun, safety.safe_tools)


def _function_tools(tools: Iterable[Any]) -> list[FunctionTool]:
    return [t for t in tools if isinstance(t, FunctionTool)]


__all__ = ["branch_reruns"]
