"""An event loop CAR runs in a daemon thread of its own, for async resources that code without
an event loop of its own must open: an agent factory the ``car`` CLI calls cannot ``await``.

Async checkpointers (``AsyncSqliteSaver``) and MCP sessions stay bound to the loop that opened
them, and the adapters run branches on that loop; opened here, that loop keeps running until
the process ends, so the factory can return an agent built on them.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Awaitable
from typing import Any

from car_core.errors import AdapterError

_LOOP: list[asyncio.AbstractEventLoop] = []
_LOCK = threading.Lock()
OPEN_TIMEOUT_S = 60.0


def background_loop() -> asyncio.AbstractEventLoop:
    """The one loop CAR runs in a daemon thread, started on first use."""
    with _LOCK:
        if not _LOOP or _LOOP[0].is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="car-background-loop",
                             daemon=True).start()
            _LOOP[:] = [loop]
        return _LOOP[0]


def open_in_background(resource: Any, timeout: float = OPEN_TIMEOUT_S) -> Any:
    """Open ``resource`` on CAR's background loop and return what it gives: an async context
    manager is entered (and exited when the process ends), an awaitable awaited. For example
    ``open_in_background(AsyncSqliteSaver.from_conn_string("checkpoints.db"))`` or
    ``open_in_background(client.get_tools())`` in an agent factory for ``car attribute``."""
    loop = background_loop()
    enter = getattr(resource, "__aenter__", None)
    work: Awaitable[Any] = enter() if callable(enter) else resource
    if not isinstance(work, Awaitable):
        raise AdapterError(f"open_in_background takes an async context manager or an "
                           f"awaitable, got {type(resource).__name__}",
                           hint="pass AsyncSqliteSaver.from_conn_string(...) or a coroutine")
    try:
        got = asyncio.run_coroutine_threadsafe(_awaited(work), loop).result(timeout)
    except Exception as exc:
        cause = _first_leaf(exc)
        missing = getattr(cause, "filename", None) if isinstance(cause, OSError) else None
        raise AdapterError(
            f"opening {_named(resource)} on CAR's background loop raised {cause!r}"
            + (f": {missing!r} was not found (an MCP server's command, a database's folder)"
               if isinstance(cause, FileNotFoundError) and missing else ""),
            hint="check it opens on its own (its path, its server's command, its "
                 "credentials)") from exc
    if callable(enter):
        atexit.register(_close, resource, loop)
    return got


async def _awaited(work: Awaitable[Any]) -> Any:
    return await work


def _named(resource: Any) -> str:
    """What was being opened, in the user's words: a coroutine by the function that made it
    (``MultiServerMCPClient.get_tools()``), anything else by its class. A trial's missing MCP
    server command was reported as "opening coroutine ... raised FileNotFoundError"."""
    qualname = getattr(resource, "__qualname__", None)
    if asyncio.iscoroutine(resource) and isinstance(qualname, str):
        return f"{qualname}()"
    return type(resource).__name__


def _first_leaf(exc: BaseException) -> BaseException:
    """The first error inside task groups' ``ExceptionGroup``s (an MCP client's stdio
    transport wraps the failure to start its server in one), or ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _close(resource: Any, loop: asyncio.AbstractEventLoop) -> None:
    """At exit: leave a context ``open_in_background`` entered (best effort)."""
    try:
        asyncio.run_coroutine_threadsafe(resource.__aexit__(None, None, None), loop).result(5.0)
    except Exception:  # the process is ending; its files and sockets close with it
        pass


__all__ = ["background_loop", "open_in_background"]
