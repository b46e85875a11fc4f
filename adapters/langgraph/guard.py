"""Side-effect tools answered, never run, on CAR branch threads — wherever the tool runs.

A guard is installed once on LangChain's ``BaseTool.run`` / ``arun`` (the path every tool call
takes: a ``ToolNode`` at any depth of the graph, a subgraph, or a node function calling
``tool.invoke`` itself). Outside a CAR branch it does nothing. On a branch thread (found through
the thread id in the runnable config LangGraph propagates, as ``CarChatModel`` does), a call of a
tool the user named in ``side_effect_tools`` is answered by the branch's ``Guard`` from the record
or a simulator, and the tool's own code never runs; an unanswerable call raises
``SideEffectBlocked``. Forced observations (``do_observation``) are served the same way, by tool
call id. Where each call's result came from (``ToolSource``) is noted in ``Guard.sources`` by
tool call id, for the step it belongs to. A simulator may return what a tool may: a
``Command(update=...)`` (a state update, with the ``ToolMessage`` answering the call among its
messages) or a ``ToolMessage`` goes to the graph as returned; one that takes ``ctx`` is handed
a dict of the values LangGraph injected into the tool's call (``InjectedState``,
``InjectedStore``, ``ToolRuntime``, by argument name) and the call's ``tool_call_id`` (for the
``ToolMessage`` of a ``Command``); an async one is awaited. A recorded result that was a list of
content blocks (an MCP tool's) is handed back as that list.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from langchain_core.callbacks import CallbackManager
from langchain_core.messages import ToolMessage
from langchain_core.runnables.config import ensure_config
from langchain_core.tools import BaseTool
from langgraph.types import Command

from car_core.contract import ToolSource
from car_core.errors import SideEffectBlocked

from ..common.messages import ToolSafety, as_content
from ..common.sync import run_sync


@dataclass
class Guard:
    """What one branch thread answers instead of running a tool."""

    safety: ToolSafety
    record: Mapping[tuple[str, str], Any]  # (name, canonical arguments) -> recorded content
    run_id: str | None = None
    step: Callable[[], int | None] = lambda: None  # the step being decided now
    step_of: Callable[[str], int | None] | None = None  # the step that made a tool call
    forced: dict[str, Any] = field(default_factory=dict)  # tool_call_id -> forced content
    lookup: Callable[[str], Any] | None = None  # tool_call_id -> forced content, or RUN
    served: list[tuple[str, str]] = field(default_factory=list)
    sources: dict[str, ToolSource] = field(default_factory=dict)  # tool_call_id -> source
    blocked: SideEffectBlocked | None = None  # the first refusal, whatever the app did with it

    def raise_blocked(self) -> None:
        """Raise the first refusal of this branch: an app whose tool node catches tool errors
        (``handle_tool_errors``, ``with_fallbacks``) hands it to the model as a message and
        the branch goes on, so it must stop here, or a blocked side effect is scored."""
        if self.blocked is not None:
            raise self.blocked

    def answer(self, tool: BaseTool, tool_input: Any, tool_call_id: str | None,
               node: str | None = None) -> Any:
        """``_answer``, with its refusal noted (``raise_blocked``) before it reaches the app."""
        try:
            return self._answer(tool, tool_input, tool_call_id, node)
        except SideEffectBlocked as exc:
            if self.blocked is None:
                self.blocked = exc
            raise

    def _answer(self, tool: BaseTool, tool_input: Any, tool_call_id: str | None,
                node: str | None = None) -> Any:
        """The content to return instead of running ``tool``, a ``Simulated`` call for the
        caller to finish, or ``RUN`` to run it. A call with no tool call id is one node
        ``node`` makes itself: it answers no model decision, so a refusal names the node, not
        a step."""
        if tool_call_id is not None and tool_call_id in self.forced:
            self.sources[tool_call_id] = ToolSource.FORCED
            return self.forced[tool_call_id]
        if tool_call_id is not None and self.lookup is not None:
            content = self.lookup(tool_call_id)
            if content is not RUN:
                self.sources[tool_call_id] = ToolSource.FORCED
                return content
        if not self.safety.guards(tool.name):
            self._refuse_unknown(tool.name, node)
            if tool_call_id is not None:
                self.sources[tool_call_id] = ToolSource.LIVE
            return RUN
        given = tool_input if isinstance(tool_input, Mapping) else {"input": tool_input}
        injected = _injected(tool)
        args = {k: v for k, v in given.items() if k not in injected}
        # a tool with a recorded state write: only an identical call replays it (``writes``)
        writes = {k: v.channels for k, v in self.record.items()
                  if k[0] == tool.name and isinstance(v, Replay)} or None
        if tool_call_id is not None:
            step = self.step_of(tool_call_id) if self.step_of is not None else self.step()
            found = self.safety.answer(tool.name, args, self.record, run_id=self.run_id,
                                       step=step, writes=writes)
        else:
            try:
                found = self.safety.answer(tool.name, args, self.record, run_id=self.run_id,
                                           writes=writes)
            except SideEffectBlocked as exc:
                blocked = SideEffectBlocked(f"in node {node!r} (a call the node makes itself, "
                                            f"not a model's tool call): {exc}")
                blocked.run_id, blocked.hint = exc.run_id, exc.hint
                raise blocked from None
        self.served.append((tool.name, str(tool_call_id)))
        if tool_call_id is not None:
            self.sources[tool_call_id] = found.source
        if isinstance(found.content, Replay):
            if tool_call_id is None:
                raise SideEffectBlocked(
                    f"in node {node!r}: the recorded call of {tool.name!r} wrote graph state "
                    "through its Command, which a call the node makes itself cannot write back",
                    run_id=self.run_id,
                    hint=f"pass simulators={{{tool.name!r}: fn(arguments, ctx)}}")
            return found.content.command(tool_call_id, tool.name)
        if found.simulate:
            return Simulated(self.safety, tool.name, args,
                             {**{k: v for k, v in given.items() if k in injected},
                              "tool_call_id": tool_call_id})
        return found.content


    def _refuse_unknown(self, name: str, node: str | None) -> None:
        """Stop a tool CAR was never told of (built inside a node function, not given as
        ``node_tools``) before it runs: nothing classified it, so it may be a side effect."""
        safety = self.safety
        if name in safety.safe_tools or name in safety.live or safety.unclassified == "live":
            return
        raise SideEffectBlocked(
            f"a branch reached tool {name!r} in node {node!r}, which is not one of the "
            "agent's tools (made inside the node's code), so nothing classified it: it was "
            "not run", run_id=self.run_id,
            hint="pass the tool object as node_tools=[the_tool] and classify it (safe_tools= "
                 "or side_effect_tools=)")


@dataclass(frozen=True)
class Replay:
    """A recorded call whose ``Command`` wrote graph state: its tool message's ``content`` and
    the update's other ``channels``, written back by ``command``."""

    content: Any
    channels: Mapping[str, Any]
    messages_key: str

    def command(self, tool_call_id: str, name: str) -> Any:
        content = self.content if isinstance(self.content, (str, list)) else str(self.content)
        return Command(update={**self.channels, self.messages_key: [ToolMessage(
            content=content, name=name, tool_call_id=tool_call_id)]})


@dataclass(frozen=True)
class Simulated:
    """A side-effect call its simulator answers: ``finish`` (sync) or ``afinish`` (async)
    give what the simulator returned, awaited where it is async."""

    safety: ToolSafety
    name: str
    arguments: dict[str, Any]
    ctx: dict[str, Any]

    def finish(self) -> Any:
        out = self.safety.simulate(self.name, self.arguments, self.ctx)
        if inspect.isawaitable(out):
            async def done(out: Any = out) -> Any:
                return await out
            return run_sync(done)
        return out

    async def afinish(self) -> Any:
        return await self.safety.asimulate(self.name, self.arguments, self.ctx)


RUN = object()
_GUARDS: dict[str, Guard] = {}
_LOCK = threading.Lock()
_INSTALLED = False


def _injected(tool: BaseTool) -> set[str]:
    try:
        return set(getattr(tool, "_injected_args_keys", ()) or ())
    except Exception:  # pragma: no cover - a tool class without the helper
        return set()


# the guard of the branch the code running now belongs to: what a call that passes a config of
# its own (a sub-agent run on its own thread id, ``tool.invoke(..., config=...)``) is guarded by
_BRANCH_GUARD: ContextVar[Guard | None] = ContextVar("car_langgraph_guard", default=None)


def _guard_for(config: Any) -> Guard | None:
    """The guard of the branch thread ``config`` names, else of the branch this code runs in:
    LangChain hands a call that passes its own config (a sub-agent invoked on its own thread
    id) that config alone, and a trial's safe lookup that did so refunded for real on every
    branch."""
    conf = (config or ensure_config()).get("configurable") or {}
    thread_id = conf.get("thread_id")
    if thread_id is not None:
        with _LOCK:
            guard = _GUARDS.get(str(thread_id))
        if guard is not None:
            return guard
    return _BRANCH_GUARD.get()


def _node_of(config: Any) -> str | None:
    node = ((config or ensure_config()).get("metadata") or {}).get("langgraph_node")
    return str(node) if node is not None else None


def _answered(content: Any, tool: BaseTool, tool_input: Any, kwargs: Mapping[str, Any]) -> Any:
    """The tool's output for an answered call, reported to the callbacks as if it had run (so
    recorders see the result) without running it: a simulator's ``Command`` or ``ToolMessage``
    as it returned it; content blocks (a list) as the list, as the tool gave them."""
    tool_call_id = kwargs.get("tool_call_id")
    if isinstance(content, (ToolMessage, Command)) or tool_call_id is None:
        out = content
    else:
        out = ToolMessage(content=content if isinstance(content, (str, list)) else str(content),
                          name=tool.name, tool_call_id=tool_call_id)
    manager = CallbackManager.configure(kwargs.get("callbacks"), tool.callbacks)
    run = manager.on_tool_start({"name": tool.name, "description": tool.description},
                                str(tool_input), run_id=kwargs.get("run_id"),
                                tool_call_id=tool_call_id)
    run.on_tool_end(out)
    return out


def _simulated(out: Any) -> Any:
    """A simulator's result as a tool's: a ``Command`` or ``ToolMessage`` as returned, the
    rest as a tool message's content (a non-string as JSON)."""
    return out if isinstance(out, (Command, ToolMessage)) else as_content(out)


TOOL_TAG = "__car_live_tool__"  # on an exception a tool run live on a branch raised


def _tag(exc: BaseException, name: str) -> None:
    """Mark ``exc`` as raised by tool ``name`` running live on a branch (``raised_by_tool``)."""
    try:
        setattr(exc, TOOL_TAG, name)
    except AttributeError:  # an exception that takes no attributes: left as a model error
        pass


def raised_by_tool(exc: BaseException) -> str | None:
    """The live tool that raised ``exc`` (or an error it came from) on a branch, else None: a
    tool's service failing once (a flaky API past the app's own RetryPolicy) fails that branch,
    counted like any other, where a model server down stops the estimate."""
    seen, e = 0, exc
    while e is not None and seen < 16:
        name = getattr(e, TOOL_TAG, None)
        if isinstance(name, str):
            return name
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
        seen += 1
    return None


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
            if isinstance(content, Simulated):
                content = _simulated(content.finish())
            if content is not RUN:
                return _answered(content, self, tool_input, kwargs)
            try:
                return run(self, tool_input, *args, **kwargs)
            except Exception as exc:
                _tag(exc, self.name)
                raise
        return run(self, tool_input, *args, **kwargs)

    async def guarded_arun(self: BaseTool, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        guard = _guard_for(kwargs.get("config"))
        if guard is not None:
            content = guard.answer(self, tool_input, kwargs.get("tool_call_id"),
                                   _node_of(kwargs.get("config")))
            if isinstance(content, Simulated):
                content = _simulated(await content.afinish())
            if content is not RUN:
                return _answered(content, self, tool_input, kwargs)
            try:
                return await arun(self, tool_input, *args, **kwargs)
            except Exception as exc:
                _tag(exc, self.name)
                raise
        return await arun(self, tool_input, *args, **kwargs)

    BaseTool.run = guarded_run  # type: ignore[method-assign]
    BaseTool.arun = guarded_arun  # type: ignore[method-assign]


@contextmanager
def guarding(thread_id: str, guard: Guard) -> Iterator[Guard]:
    """Answer the guarded tool calls of ``thread_id`` with ``guard`` while the block runs."""
    install()
    with _LOCK:
        _GUARDS[thread_id] = guard
    token = _BRANCH_GUARD.set(guard)
    try:
        yield guard
    finally:
        _BRANCH_GUARD.reset(token)
        with _LOCK:
            _GUARDS.pop(thread_id, None)
