"""Driving an async framework's run from the engine's sync ``branch`` call.

The engine calls ``branch`` from plain code, from a worker thread, or from inside the user's own
event loop (a notebook, an async test); ``run_sync`` finishes the coroutine in each case. An
adapter whose clients bind to the loop they first ran on (``AsyncOpenAI``'s connection pool)
keeps one loop for all its branches (``BranchLoop``) and passes it; the others get a fresh loop
per call. ``run_on`` is the async side of the same rule: an adapter's ``abranch`` awaits its
branch on the adapter's ``BranchLoop`` (concurrently with every other branch there) or, with
none, on the caller's own loop; ``branch`` then bridges to that one coroutine once.

A coroutine sent to another thread's loop (``finish_on``, ``await_on``, ``run_on``) is waited
for to its end even when the caller gives up (cancelled by an executor that stops, or ^C): it
is cancelled there and its ``finally`` blocks run before the caller goes on, so a branch deletes
its checkpointer thread before the process can close the checkpointer, and whatever it raised
on its way out is retrieved, never logged as "Task exception was never retrieved".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

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


class _Remote(Generic[T]):
    """``coro`` running as a task on ``loop`` (another thread's), in a copy of the caller's
    context (a branch started there still knows it is one). ``ended`` settles when that task
    has ended, never before: a caller that gives up calls ``cancel`` and goes on waiting on
    ``ended``."""

    def __init__(self, coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ended: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._task: asyncio.Task[T] | None = None
        self._cancelled = False  # read and written on ``loop`` only
        try:
            loop.call_soon_threadsafe(self._start, coro, contextvars.copy_context())
        except RuntimeError:  # the loop is closed: the coroutine never starts
            coro.close()
            raise

    def _start(self, coro: Coroutine[Any, Any, T], context: contextvars.Context) -> None:
        if self._cancelled:  # the caller gave up before it started
            coro.close()
            self.ended.cancel()
            return
        self._task = self.loop.create_task(coro, context=context)
        self._task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[T]) -> None:
        if task.cancelled():
            self.ended.cancel()
        elif (exc := task.exception()) is not None:  # retrieved here, whoever still waits
            self.ended.set_exception(exc)
        else:
            self.ended.set_result(task.result())

    def cancel(self) -> None:
        """Cancel the coroutine on its loop (before it starts, or wherever it waits)."""
        def stop() -> None:
            self._cancelled = True
            if self._task is not None:
                self._task.cancel()
        try:
            self.loop.call_soon_threadsafe(stop)
        except RuntimeError:  # the loop is closed, and the task with it
            pass

    def result(self) -> T:
        """Its result, waited for from sync code; interrupted (^C), it is cancelled and waited
        for to its end before the interruption goes on."""
        try:
            return self.ended.result()
        except BaseException:
            if not self.ended.done():
                self.cancel()
                concurrent.futures.wait([self.ended])
            raise

    async def wait(self) -> T:
        """Its result, awaited from another loop without blocking it; the awaiting task
        cancelled, it is cancelled there and awaited to its end (whatever it raised then is
        dropped) before the cancellation goes on."""
        ended = asyncio.wrap_future(self.ended)
        try:
            await asyncio.wait({ended})
        except asyncio.CancelledError:
            self.cancel()
            while not ended.done():
                try:
                    await asyncio.wait({ended})
                except asyncio.CancelledError:  # cancelled again: it is already stopping
                    continue
            if not ended.cancelled():
                ended.exception()  # retrieved: nobody wants it now
            raise
        return ended.result()


def finish_on(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> T:
    """``coro``'s result, run on ``loop`` (another thread's, running) in a copy of this
    context, waited for from sync code; an interrupted wait cancels it and waits for its
    end."""
    return _Remote(coro, loop).result()


async def await_on(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> T:
    """``coro``'s result, run on ``loop`` (another thread's, running) in a copy of this
    context, awaited without blocking the caller's loop; cancelling the caller cancels it
    there and waits for its end (its ``finally`` blocks run) before the cancellation goes
    on."""
    return await _Remote(coro, loop).wait()


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
        return finish_on(make(), target)
    if running is None:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


async def run_on(make: Callable[[], Coroutine[Any, Any, T]],
                 loop: BranchLoop | None = None) -> T:
    """Await the coroutine ``make()`` from async code: on ``loop`` when given and it is not the
    running one (the caller's task waits without blocking its loop, and cancelling it cancels
    the branch there and waits for its end: ``await_on``), else right here."""
    if loop is not None:
        target = loop.get()
        if asyncio.get_running_loop() is not target:
            return await await_on(make(), target)
    return await make()


__all__ = ["BranchLoop", "await_on", "finish_on", "run_on", "run_sync"]
