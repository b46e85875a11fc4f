"""A LlamaIndex agent's safe tools run again on their own, outside the workflow, to tell whose
doing a branch's tool error was (``sources.drifted_tools``).

The tool is the one the agent was given (never a branch's stand-in for it), called as the
agent calls it (``acall``): a ``ToolOutput`` marked ``is_error``, or an exception, is an error.
Only tools classified safe are run again, and none handed the workflow ``Context``: outside the
workflow there is none to hand it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llama_index.core.tools import BaseTool, FunctionTool, adapt_to_async_tool

from car_core.contract import redact
from car_core.errors import CarError

from ..common.messages import ToolSafety, parse_arguments
from ..common.sources import Reruns, answered_error
from .branch import running_tool


def branch_reruns(agents: Mapping[str, Any], safety: ToolSafety) -> Reruns:
    """One branch's re-runs of the safe tools of ``agents`` (by name)."""
    tools: dict[str, BaseTool] = {}
    for a in agents.values():
        for t in a.tools or ():
            t = getattr(t, "tool", t)  # a branch's stand-in keeps the tool it stands in for
            tool = t if isinstance(t, BaseTool) else FunctionTool.from_defaults(t)
            tools.setdefault(tool.metadata.name or "", tool)

    async def rerun(name: str, args: str) -> str | None:
        try:
            with running_tool(name):  # its nested calls meet the branch's net
                out = await adapt_to_async_tool(tools[name]).acall(**parse_arguments(args))
        except CarError:  # CAR's own stop (a blocked side effect, a budget): as on a branch
            raise
        except Exception as exc:  # the tool raised: an error
            return redact.describe(exc)
        return answered_error(str(getattr(out, "content", out)),
                              bool(getattr(out, "is_error", False)))

    runnable = {n for n in safety.safe_tools if n in tools
                and not getattr(tools[n], "requires_context", False)}
    return Reruns(runnable, rerun, safety.safe_tools)


__all__ = ["branch_reruns"]
