"""The app's own side-effect tool objects, guarded while branches run.

A branch runs copies of the app's tools (``branch.clone_app``), and the model's calls go to the
copies. A tool's body may still call another tool's original object, the way one tool reuses
another (``await write_audit.on_invoke_tool(ctx, args)``): a user trial's safe ``lookup_order``
did, and its side-effect ``write_audit`` wrote the real audit log on every branch. So while any
branch is in flight (``guarded``), each original ``FunctionTool`` of a side-effect tool has its
``on_invoke_tool`` replaced by a dispatcher: a call made inside a branch (the branch's session
is in the calling code's context, ``_BRANCH``) is answered as the branch answers that tool
(the record, a simulator, or ``SideEffectBlocked``); any other call (your own runs, in another
thread or task) goes to the tool's own invoker, as before. The last branch to end puts the
invoker back, so the objects are as they were. A copy of a tool made meanwhile binds the tool's
own invoker, as it would without the dispatcher (``__agents_bind_function_tool__``)."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from agents.tool import FunctionTool

from car_core.errors import CarError

from .branch import BranchSession, answered

Invoker = Callable[[Any, str], Awaitable[Any]]

# the session of the branch the code running now belongs to (None outside any branch)
_BRANCH: ContextVar[BranchSession | None] = ContextVar("car_openai_agents_branch",
                                                         default=None)
_OWN = "__car_own__"  # the dispatcher's attribute holding the tool's own invoker
_LOCK = threading.Lock()


@dataclass
class _Held:
    tool: FunctionTool
    own: Invoker
    branches: int = 0


_HELD: dict[int, _Held] = {}  # id(tool) -> the tool guarded now, with its own invoker


def own_invoker(tool: FunctionTool) -> Invoker:
    """The tool's own ``on_invoke_tool``, under any dispatcher ``guarded`` put there."""
    invoke = tool.on_invoke_tool
    own: Invoker = getattr(invoke, _OWN, invoke)
    return own


@contextmanager
def guarded(tools: Iterable[FunctionTool], session: BranchSession) -> Iterator[None]:
    """Run the block as ``session``'s branch, with ``tools`` (the original objects of the
    tools it answers) dispatching calls made inside it to the session; the tools are as they
    were once no branch holds them."""
    token = _BRANCH.set(session)
    held: list[_Held] = []
    try:
        with _LOCK:
            for tool in {id(t): t for t in tools}.values():
                h = _HELD.get(id(tool))
                if h is None:
                    h = _HELD[id(tool)] = _Held(tool, tool.on_invoke_tool)
                    tool.on_invoke_tool = _dispatcher(tool.name, h.own)
                h.branches += 1
                held.append(h)
        yield
    finally:
        with _LOCK:
            for h in held:
                h.branches -= 1
                if h.branches == 0:
                    h.tool.on_invoke_tool = h.own
                    del _HELD[id(h.tool)]
        _BRANCH.reset(token)


def _dispatcher(name: str, own: Invoker) -> Invoker:
    async def invoke(ctx: Any, arguments: str) -> Any:
        s = _BRANCH.get()
        if s is None or not s.safety.guards(name):  # not a branch's call, or not a side effect
            return await own(ctx, arguments)  # to it
        try:
            return await answered(s, name, ctx, arguments, s.current)
        except CarError as exc:  # the SDK may turn it into a message: the branch stops
            s.blocked = exc
            raise

    setattr(invoke, _OWN, own)
    bind = getattr(own, "__agents_bind_function_tool__", None)
    if callable(bind):  # a copy made now binds the tool's own invoker, as the SDK would
        vars(invoke)["__agents_bind_function_tool__"] = bind
    return invoke


__all__ = ["guarded", "own_invoker"]
