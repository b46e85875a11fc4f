"""A LangGraph app's safe tools run again on their own, outside the graph, to tell whose doing
a branch's tool error was (``sources.drifted_tools``).

The tool object is the app's own (a ``ToolNode``'s, one a node's code reaches, or one given as
``node_tools``), invoked with a tool call as a ``ToolNode`` invokes it, so a tool whose
``handle_tool_error`` turns its failure into a message (every tool langchain-mcp-adapters
loads) answers with a ``ToolMessage`` of status error rather than raising; an exception is an
error too. It is invoked with the run's configurable keys, no thread and no callbacks, so no
branch guard or recorder hears of it, and through the branch's ``Calls`` (an async-only MCP
tool is awaited). Only tools classified safe are run again, and none that needs a value
LangGraph injects (``InjectedState``, ``ToolRuntime`` without a default): outside the graph it
has none to give.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.tools import BaseTool
from langgraph.types import Command

from car_core.contract import redact
from car_core.errors import CarError

from ..common.messages import ToolSafety, parse_arguments
from ..common.sources import Reruns, answered_error, result_text
from .calls import SyncCalls
from .guard import Guard, _injected, guarding

# the keys of a thread, not of the run: a re-run belongs to no thread
_THREAD_KEYS = frozenset({"thread_id", "checkpoint_ns", "checkpoint_id", "checkpoint_map"})


def branch_reruns(tools: Mapping[str, BaseTool], safety: ToolSafety, calls: SyncCalls,
                  configurable: Mapping[str, Any], guard: Callable[[], Guard]) -> Reruns:
    """One branch's re-runs of the app's safe ``tools`` (by name), through ``calls``, each
    under a fresh ``guard()`` as a branch runs: a safe tool whose body calls a side-effect
    tool (an audit log) gets that call answered from the record or by a simulator, or the
    estimate stops with ``SideEffectBlocked``, as on the branch itself. Run without one, a
    trial's lookup wrote 14 real audit lines."""
    base = {k: v for k, v in configurable.items() if k not in _THREAD_KEYS}

    async def rerun(name: str, args: str) -> str | None:
        call = {"type": "tool_call", "name": name, "args": parse_arguments(args),
                "id": f"car-rerun-{uuid.uuid4().hex[:12]}"}
        thread = f"car-rerun-{uuid.uuid4().hex}"  # the guard's key; no checkpoint is written
        config = {"callbacks": [], "run_name": "car re-run",
                  "configurable": {**base, "thread_id": thread}}
        with guarding(thread, guard()) as held:
            try:
                out = await calls.run_tool(tools[name], call, config)
            except CarError:
                raise
            except Exception as exc:  # the tool raised: an error
                held.raise_blocked()  # a blocked side effect the tool turned into an error
                return redact.describe(exc)
            held.raise_blocked()
        if isinstance(out, Command):  # the ToolMessage it answers with is among its messages
            update = out.update if isinstance(out.update, Mapping) else {}
            out = next((m for v in update.values() if isinstance(v, list) for m in v
                        if getattr(m, "tool_call_id", None) == call["id"]), None)
        return answered_error(result_text(getattr(out, "content", out)),
                              getattr(out, "status", None) == "error")

    runnable = {n for n in safety.safe_tools if n in tools and not _needs_injection(tools[n])}
    return Reruns(runnable, rerun, safety.safe_tools)


def _needs_injection(tool: BaseTool) -> bool:
    """Whether ``tool`` takes a value LangGraph injects and has no default for it (a tool
    langchain-mcp-adapters loads takes an optional ``runtime``: it runs without one)."""
    keys = _injected(tool)
    if not keys:
        return False
    fn = getattr(tool, "func", None) or getattr(tool, "coroutine", None) or tool._run
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read: take it that it needs them
        return True
    return any(k not in params or params[k].default is inspect.Parameter.empty for k in keys)


__all__ = ["branch_reruns"]
