"""The tools an OpenAI Agents SDK app gets from its MCP servers (``Agent(mcp_servers=[...])``),
listed once before any branch, classified, and served to branches.

The user connects the servers, as the SDK shows (``async with MCPServerStdio(...) as server``),
and keeps them connected while CAR attributes. A server's client session lives on the event
loop that connected it, so every call CAR makes to a server (the listing, a safe tool's live
call on a branch) is sent to that loop: the loop the ``CarRecorder`` saw the server used on,
or the one running where ``OpenAIAgentsAgent`` was built. That loop must keep running while
the estimator works, so from inside the ``async with`` block the estimator runs off it:
``await asyncio.to_thread(car.contrastive, run, agent, ...)``; a call that would block it is
refused (it would wait forever).

The listing is the SDK's own (``Agent.get_mcp_tools``: the function tools it would give the
model, names prefixed and schemas converted as the agent's ``mcp_config`` says), taken with a
context of None. Each tool is classified from its server's annotations (``readOnlyHint: true``
is safe; anything else, none included, a side effect, as the MCP specification defaults) and,
whatever its annotations, a tool that needs approval (the server's ``require_approval``, a
function tool's ``needs_approval``) is a side effect; the user's lists win. Branches run the
listed tools in place of the servers: the same ``FunctionTool`` objects, guarded as every
function tool is, with their calls sent to the server's loop. The listing is part of the app's
fingerprint, so a server whose tools changed since the run was recorded is refused before any
branch.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import json
import weakref
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any

from agents import RunContextWrapper
from agents.tool import FunctionTool

from car_core.errors import AdapterError

from ..common.background import background_loop
from ..common.messages import SIDE_EFFECT, Classified, mcp_classified
from ..common.sources import result_text

LIST_TIMEOUT_S = 60.0  # a listing that takes longer: the server's loop is not running

# server -> the event loop its session was used on (noted by the recorder and the wrapper)
_LOOPS: weakref.WeakKeyDictionary[Any, asyncio.AbstractEventLoop] = weakref.WeakKeyDictionary()

Listing = dict[str, list[FunctionTool]]  # agent name -> the function tools its servers give

# while a branch's MCP call runs: where the server's watcher puts the text of a result the
# server flagged ``isError`` (the SDK hands such a result to the model as ordinary output)
_FLAGGED: ContextVar[list[str] | None] = ContextVar("car_mcp_flagged", default=None)


def servers_of(agents: Mapping[str, Any]) -> list[Any]:
    return [s for a in agents.values() for s in a.mcp_servers or ()]


def note_loop(agents: Mapping[str, Any], loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Remember the running loop (or ``loop``) as the one the app's servers live on."""
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
    for server in servers_of(agents):
        _LOOPS[server] = loop


def unsupported_servers(name: str, agent: Any) -> list[str]:
    """The MCP server features a branch cannot serve faithfully, by name."""
    out = []
    for server in agent.mcp_servers or ():
        if callable(getattr(server, "tool_filter", None)):
            out.append(f"agent {name!r}: MCP server {server.name!r} filters its tools with a "
                       "function (CAR lists them once, with no run context, so a filter that "
                       "reads the run would give branches other tools than the run had)")
    return out


async def list_tools(agents: Mapping[str, Any], context: Any = None) -> Listing:
    """The SDK's function tools for each agent with MCP servers (run on the servers' loop)."""
    wrapper = context if isinstance(context, RunContextWrapper) \
        else RunContextWrapper(context=None)
    out: Listing = {}
    for name, a in agents.items():
        if a.mcp_servers:
            out[name] = [t for t in await a.get_mcp_tools(wrapper) if isinstance(t, FunctionTool)]
    return out


def connect_in_background(server: Any, timeout: float = LIST_TIMEOUT_S) -> Any:
    """Connect an MCP server (``MCPServerStdio(...)``, ...) on an event loop CAR runs in a
    thread of its own and keep it connected until the process ends; return the server. For
    code with no ``async with`` block to keep it in: an agent factory the ``car`` CLI calls
    (``car attribute RUN --agent app:make``), or a plain script. Build the app with the
    server and wrap it as usual; the estimator is then called like any other."""
    loop = background_loop()
    try:
        asyncio.run_coroutine_threadsafe(server.connect(), loop).result(timeout)
    except Exception as exc:
        raise AdapterError(f"connecting MCP server {getattr(server, 'name', server)!r} "
                           f"raised {exc!r}",
                           hint="check the server starts on its own (its command, its "
                                "arguments)") from exc
    _LOOPS[server] = loop
    atexit.register(_disconnect, server, loop)
    return server


def _disconnect(server: Any, loop: asyncio.AbstractEventLoop) -> None:
    """At exit: close a server ``connect_in_background`` connected (best effort)."""
    try:
        asyncio.run_coroutine_threadsafe(server.cleanup(), loop).result(5.0)
    except Exception:  # the process is ending; the server's stdio closes with it
        pass


def _loop_of(agents: Mapping[str, Any]) -> asyncio.AbstractEventLoop:
    loops = {id(lp): lp for s in servers_of(agents) if (lp := _LOOPS.get(s)) is not None}
    names = [s.name for s in servers_of(agents)]
    if not loops:
        raise AdapterError(
            f"CAR does not know the event loop MCP servers {names} are connected on",
            hint="connect them as the SDK shows (async with MCPServerStdio(...) as server:), "
                 "build OpenAIAgentsAgent inside that block, and run the estimator from there "
                 "with await asyncio.to_thread(car.contrastive, run, agent, ...); from the car "
                 "CLI (an --agent factory) or a script with no async block, connect each with "
                 "car_adapters.openai_agents.connect_in_background(server)")
    if len(loops) > 1:
        raise AdapterError(f"MCP servers {names} are connected on different event loops",
                           hint="connect every server of the app in one async block")
    loop = next(iter(loops.values()))
    if loop.is_closed() or not loop.is_running():
        raise AdapterError(f"the event loop MCP servers {names} were connected on has stopped",
                           hint="keep the servers connected (inside their async with block) "
                                "while CAR attributes the run")
    return loop


def _on_loop(loop: asyncio.AbstractEventLoop) -> None:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return
    if running is loop:
        raise AdapterError(
            "the estimator was called on the event loop the app's MCP servers are connected "
            "on, so it would block the very loop their sessions need: every call to a server "
            "would wait forever",
            hint="run it off that loop: await asyncio.to_thread(car.contrastive, run, agent, "
                 "...)")


def listed(agents: Mapping[str, Any]) -> tuple[Listing, asyncio.AbstractEventLoop | None]:
    """The listing of the app's MCP servers, taken on their loop, and that loop (None, with an
    empty listing, for an app with no MCP server)."""
    if not servers_of(agents):
        return {}, None
    loop = _loop_of(agents)
    _on_loop(loop)
    watch_errors(agents)
    future = asyncio.run_coroutine_threadsafe(list_tools(agents), loop)
    try:
        return future.result(timeout=LIST_TIMEOUT_S), loop
    except TimeoutError as exc:
        future.cancel()
        raise AdapterError(f"listing the MCP servers' tools took over {LIST_TIMEOUT_S:.0f} s",
                           hint="keep the servers connected and their loop running (call the "
                                "estimator with await asyncio.to_thread(...))") from exc
    except AdapterError:
        raise
    except Exception as exc:  # the server's own failure (not connected, crashed)
        raise AdapterError(f"listing the app's MCP servers' tools raised {exc!r}",
                           hint="connect the servers (async with MCPServerStdio(...) as "
                                "server:) and keep them connected while CAR attributes") from exc


def watch_errors(agents: Mapping[str, Any]) -> None:
    """Let each of the app's servers say when a result it sent back is flagged ``isError``:
    the SDK gives the model that result's text as the tool's output, so a read-only tool whose
    service is down where CAR runs would look answered, and the model's reply to the error
    would be scored (a user trial: the lookup's rescue read 83% where it is 0). The server's
    ``call_tool`` is wrapped once; outside a branch's call (``served_on``) it only passes the
    result on."""
    for server in servers_of(agents):
        if getattr(server, "_car_watches_errors", False):
            continue
        inner = server.call_tool

        async def call_tool(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
            result = await _inner(*args, **kwargs)
            flagged = _FLAGGED.get()
            if flagged is not None and getattr(result, "isError", False):
                flagged.append(" ".join(str(getattr(c, "text", "")) for c in
                                        getattr(result, "content", None) or ()).strip())
            return result

        server.call_tool = call_tool
        server._car_watches_errors = True


class FlaggedResult(RuntimeError):
    """An MCP server's result flagged ``isError`` (no exception reached the SDK)."""


def needs_approval(tool: Any) -> bool:
    return getattr(tool, "needs_approval", False) is not False


def derived(static: Iterable[Any], listing: Listing) -> dict[str, list[Classified]]:
    """What the SDK says of each tool: MCP annotations, approval gates (``Classified``)."""
    out: dict[str, list[Classified]] = {}
    mcp = [t for tools in listing.values() for t in tools]
    for t in mcp:
        out.setdefault(t.name, []).append(mcp_classified(getattr(t, "_mcp_annotations", None)))
    for t in [*static, *mcp]:
        if isinstance(t, FunctionTool) and needs_approval(t):
            out.setdefault(t.name, []).append(Classified(
                SIDE_EFFECT, "it needs human approval (needs_approval / require_approval)"))
    return out


def served_on(tool: FunctionTool, loop: asyncio.AbstractEventLoop,
              failed: Callable[[Any, str, BaseException], None] | None = None) -> FunctionTool:
    """A copy of an MCP function tool whose calls run on its server's loop (a branch runs on
    CAR's own loop, where the server's session cannot be used). ``failed(call_id, told,
    error)`` hears of each call whose result the server flagged ``isError``
    (``watch_errors``), as a raise would be heard of."""
    inner = tool.on_invoke_tool

    async def invoke(ctx: Any, arguments: str) -> Any:
        flagged: list[str] = []

        async def on_server() -> Any:
            token = _FLAGGED.set(flagged)
            try:
                return await inner(ctx, arguments)
            finally:
                _FLAGGED.reset(token)
        out = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(on_server(), loop))
        if flagged and failed is not None:
            failed(getattr(ctx, "tool_call_id", None), result_text(out), FlaggedResult(
                f"the MCP server flagged the result an error (isError): {flagged[0]}"))
        return out

    return dataclasses.replace(tool, on_invoke_tool=invoke)


def names(listing: Listing) -> dict[str, list[str]]:
    return {agent: [t.name for t in tools] for agent, tools in listing.items()}


def merged(static: Mapping[str, list[str]], listing: Listing) -> dict[str, list[str]]:
    """``agent -> sorted tool names``, the MCP tools included."""
    extra = names(listing)
    return {a: sorted([*tools, *extra.get(a, ())]) for a, tools in static.items()}


_BLOCKS = {"input_text", "input_image", "input_file"}


def structured(tool: FunctionTool) -> FunctionTool:
    """A copy of a (guarded) MCP tool whose results served from the record come back as the
    content blocks the tool gave (the SDK sends an MCP result to the model as a list of
    ``input_text`` / ``input_image`` blocks, and the record keeps that list as JSON text), so
    a branch's model sees what the recorded one saw."""
    inner = tool.on_invoke_tool

    async def invoke(ctx: Any, arguments: str) -> Any:
        out = await inner(ctx, arguments)
        if isinstance(out, str) and out.startswith("["):
            try:
                value = json.loads(out)
            except ValueError:
                return out
            if value and isinstance(value, list) and all(
                    isinstance(b, dict) and b.get("type") in _BLOCKS for b in value):
                # as the tool's own output types (text, image, file): the SDK turns them into
                # the same blocks again
                return [{**b, "type": str(b["type"]).removeprefix("input_")} for b in value]
        return out

    return dataclasses.replace(tool, on_invoke_tool=invoke)
