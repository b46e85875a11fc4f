"""Driving an async framework's run from the engine's sync ``branch`` call.

The engine calls ``branch`` from plain code, from a worker thread, or from inside the user's own
event loop (a notebook, an async test); ``run_sync`` finishes the coroutine in each case. An
adapter whose clients bind to the loop they first ran on (``AsyncOpenAI``'s connection pool)
keeps one loop for all its branches (``BranchLoop``) and passes it; the others get a fresh loop
per call. ``run_on`` is the async side of the same rule: an adapter's ``abranch`` awaits its
branch on the adapter's ``BranchLoop`` (concurrently with every other branch there) or, with
none, on the caller's own loop; ``branch`` then bridges to that one coroutine once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from car_core.errors import AdapterError

T = TypeVar("T")


class BranchLoop:
    """One event loop, started on first use in a daemon thread of its own, that every branch of
    an adapter runs on."""

    def __init__(self, thread_name: str) -> None:
        self.thread_name = thread_name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name=self.thread_name,
                                 daemon=True).start()
                self._loop = loop
            return self._loop


def run_sync(make: Callable[[], Coroutine[Any, Any, T]],
             loop: BranchLoop | asyncio.AbstractEventLoop | None = None) -> T:
    """Run the coroutine ``make()`` to completion from sync code, even when a loop is already
    running here (which then waits, as any blocking call makes it): on ``loop`` when given (an
    adapter's ``BranchLoop``, or a running loop of the app's, such as the one an async
    checkpointer is bound to), else on a fresh loop (in a worker thread when this thread runs
    one)."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is not None:
        target = loop.get() if isinstance(loop, BranchLoop) else loop
        if running is target:
            raise AdapterError("a CAR branch was started from inside another branch",
                               hint="call car.intervene / contrastive / shapley outside the app")
        return asyncio.run_coroutine_threadsafe(make(), target).result()
    if running is None:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


async def run_on(make: Callable[[], Coroutine[Any, Any, T]],
                 loop: BranchLoop | None = None) -> T:
    """Await the coroutine ``make()`` from async code: on ``loop`` when given and it is not the
    running one (the caller's task waits without blocking its loop, and cancelling it cancels
    the branch there), else right here."""
    if loop is not None:
        target = loop.get()
        if asyncio.get_running_loop() is not target:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make(), target))
    return await make()


__all__ = ["BranchLoop", "run_on", "run_sync"]
