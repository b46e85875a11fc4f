"""Side-effect tools answered, never run, on CAR branch threads — wherever the tool runs.

A guard is installed once on LangChain's ``BaseTool.run`` / ``arun`` (the path every tool call
takes: a ``ToolNode`` at any depth of the graph, a subgraph, or a node function calling
``tool.invoke`` itself). Outside a CAR branch it does nothing. On a branch thread (found through
the thread id in the runnable config LangGraph propagates, as ``CarChatModel`` does), a call of a
tool the user named in ``side_effect_tools`` is answered by the branch's ``Guard`` from the record
or a simulator, and the tool's own code never runs; an unanswerable call raises
``SideEffectBlocked``. Forced observations (``do_observation``) are served the same way, by tool
call id.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from langchain_core.callbacks import CallbackManager
from langchain_core.messages import ToolMessage
from langchain_core.runnables.config import ensure_config
from langchain_core.tools import BaseTool

from car_core.errors import SideEffectBlocked

from ..common.messages import ToolSafety


@dataclass
class Guard:
    """What one branch thread answers instead of running a tool."""

    safety: ToolSafety
    record: Mapping[tuple[str, str], Any]  # (name, canonical arguments) -> recorded content
    run_id: str | None = None
    step: Callable[[], int | None] = lambda: None
    forced: dict[str, Any] = field(default_factory=dict)  # tool_call_id -> forced content
    lookup: Callable[[str], Any] | None = None  # tool_call_id -> forced content, or RUN
    served: list[tuple[str, str]] = field(default_factory=list)

    def answer(self, tool: BaseTool, tool_input: Any, tool_call_id: str | None,
               node: str | None = None) -> Any:
        """The content to return instead of running ``tool``, or ``RUN`` to run it. A call
        with no tool call id is one node ``node`` makes itself: it answers no model decision,
        so a refusal names the node, not a step."""
        if tool_call_id is not None and tool_call_id in self.forced:
            return self.forced[tool_call_id]
        if tool_call_id is not None and self.lookup is not None:
            content = self.lookup(tool_call_id)
            if content is not RUN:
                return content
        if not self.safety.guards(tool.name):
            return RUN
        args = tool_input if isinstance(tool_input, Mapping) else {"input": tool_input}
        args = {k: v for k, v in args.items() if k not in _injected(tool)}
        if tool_call_id is not None:
            content = self.safety.serve(tool.name, args, self.record, run_id=self.run_id,
                                        step=self.step())
        else:
            try:
                content = self.safety.serve(tool.name, args, self.record, run_id=self.run_id)
            except SideEffectBlocked as exc:
                blocked = SideEffectBlocked(f"in node {node!r} (a call the node makes itself, "
                                            f"not a model's tool call): {exc}")
                blocked.run_id, blocked.hint = exc.run_id, exc.hint
                raise blocked from None
        self.served.append((tool.name, str(tool_call_id)))
        return content


RUN = object()
_GUARDS: dict[str, Guard] = {}
_LOCK = threading.Lock()
_INSTALLED = False


def _injected(tool: BaseTool) -> set[str]:
    try:
        return set(getattr(tool, "_injected_args_keys", ()) or ())
    except Exception:  # pragma: no cover - a tool class without the helper
        return set()


def _guard_for(config: Any) -> Guard | None:
    conf = (config or ensure_config()).get("configurable") or {}
    thread_id = conf.get("thread_id")
    if thread_id is None:
        return None
    with _LOCK:
        return _GUARDS.get(str(thread_id))


def _node_of(config: Any) -> str | None:
    node = ((config or ensure_config()).get("metadata") or {}).get("langgraph_node")
    return str(node) if node is not None else None


def _answered(content: Any, tool: BaseTool, tool_input: Any, kwargs: Mapping[str, Any]) -> Any:
    """The tool's output for an answered call, reported to the callbacks as if it had run (so
    recorders see the result) without running it."""
    tool_call_id = kwargs.get("tool_call_id")
    out = content if tool_call_id is None else ToolMessage(
        content=content if isinstance(content, str) else str(content), name=tool.name,
        tool_call_id=tool_call_id)
    manager = CallbackManager.configure(kwargs.get("callbacks"), tool.callbacks)
    run = manager.on_tool_start({"name": tool.name, "description": tool.description},
                                str(tool_input), run_id=kwargs.get("run_id"),
                                tool_call_id=tool_call_id)
    run.on_tool_end(out)
    return out


def install() -> None:
    """Wrap ``BaseTool.run`` and ``BaseTool.arun`` once (idempotent, transparent off-branch)."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        _INSTALLED = True
    run, arun = BaseTool.run, BaseTool.arun

    def guarded_run(self: BaseTool, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        guard = _guard_for(kwargs.get("config"))
        if guard is not None:
            content = guard.answer(self, tool_input, kwargs.get("tool_call_id"),
                                   _node_of(kwargs.get("config")))
            if content is not RUN:
                return _answered(content, self, tool_input, kwargs)
        return run(self, tool_input, *args, **kwargs)

    async def guarded_arun(self: BaseTool, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        guard = _guard_for(kwargs.get("config"))
        if guard is not None:
            content = guard.answer(self, tool_input, kwargs.get("tool_call_id"),
                                   _node_of(kwargs.get("config")))
            if content is not RUN:
                return _answered(content, self, tool_input, kwargs)
        return await arun(self, tool_input, *args, **kwargs)

    BaseTool.run = guarded_run  # type: ignore[method-assign]
    BaseTool.arun = guarded_arun  # type: ignore[method-assign]


@contextmanager
def guarding(thread_id: str, guard: Guard) -> Iterator[Guard]:
    """Answer the guarded tool calls of ``thread_id`` with ``guard`` while the block runs."""
    install()
    with _LOCK:
        _GUARDS[thread_id] = guard
    try:
        yield guard
    finally:
        with _LOCK:
            _GUARDS.pop(thread_id, None)
