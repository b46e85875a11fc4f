"""Where the user's coroutines run: an ``async def`` outcome (an LLM judge awaiting a model) is
awaited on one event loop of CAR's own, in a daemon thread started on first use.

One loop for the life of the process, not a fresh one per score: an async judge usually keeps
one client (``AsyncOpenAI()``, an ``httpx.AsyncClient``) at module level, and such a client's
connections belong to the loop that opened them, so a judge run by ``asyncio.run`` per call, or
on the loop of each batch of branches, fails its next call with "Event loop is closed". On the
one loop every score shares the client's connections, many judges wait at once, and the loop
that drives the branches is never blocked by a judge.

``run_to_end`` waits for an awaitable from sync code (a sequential run, the check of the
record, a recorder); ``awaited`` awaits one from another loop (the async executor's), without
blocking it. A coroutine handed to either is always run, so none is left un-awaited, and what
it raises is raised to the caller unchanged.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_owner: tuple[int, threading.Thread] | None = None  # the process and thread running _loop


def outcome_loop() -> asyncio.AbstractEventLoop:
    """The loop the user's coroutines run on, started on first use (and again in a forked
    child, which inherits the loop but not the thread running it)."""
    global _loop, _owner
    with _lock:
        if _loop is None or _owner is None or _owner[0] != os.getpid() \
                or not _owner[1].is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=_serve, args=(loop,), name="car-outcome",
                                      daemon=True)
            thread.start()
            _loop, _owner = loop, (os.getpid(), thread)
        return _loop


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """Run ``loop`` for good. A ``sys.exit`` (or ^C) inside a user's coroutine escapes the
    loop after its task took it as its result: run on, so the waiting caller gets it."""
    while True:
        try:
            loop.run_forever()
            return
        except BaseException:  # the task's caller raises it, not us
            continue


def _submit(awaitable: Awaitable[T], loop: asyncio.AbstractEventLoop) -> Future[T]:
    return asyncio.run_coroutine_threadsafe(_coroutine(awaitable), loop)


def _coroutine(awaitable: Awaitable[T]) -> Coroutine[Any, Any, T]:
    """``awaitable`` as a coroutine (a task needs one); a coroutine is handed on as itself, so
    one cancelled before it starts is closed, not left un-awaited."""
    if asyncio.iscoroutine(awaitable):
        return awaitable

    async def whole() -> T:
        return await awaitable
    return whole()


def run_to_end(awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result, waited for from sync code: run on ``outcome_loop``. From a
    coroutine already running there (a judge that calls sync CAR code that scores), which
    cannot wait on its own loop, on a fresh loop in a worker thread instead."""
    loop = outcome_loop()
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        with ThreadPoolExecutor(1, thread_name_prefix="car-outcome-nested") as pool:
            return pool.submit(asyncio.run, _coroutine(awaitable)).result()
    return _submit(awaitable, loop).result()


async def awaited(awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result, awaited from another event loop without blocking it: run on
    ``outcome_loop``; cancelling the caller cancels it there."""
    loop = outcome_loop()
    if asyncio.get_running_loop() is loop:
        return await awaitable
    return await asyncio.wrap_future(_submit(awaitable, loop))
