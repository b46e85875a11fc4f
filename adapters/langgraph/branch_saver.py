"""The checkpointer as one branch writes it: the app's own, behind a gate its delete closes.

A branch's thread is deleted when the branch ends, but LangGraph may still be writing to it
then. Its async loop makes every checkpoint write a background task, and a run that stops on
a cancel (an estimate that one branch stopped) returns before they land: on its way out it
waits only for the tasks it had when it began to leave, while the node tasks it cancels then
save their ``__error__`` writes (and the next checkpoint, chained behind earlier writes) as new
ones, and a cancel that reaches the wait itself ends it too. Those writes landed after the
delete and left ``car-branch-*`` threads in the user's checkpointer.

So a branch runs on ``BranchSaver``: every write to its thread goes through it, and deleting
the thread first closes it (a write that starts later is dropped: nothing reads a deleted
branch), then waits for the writes still in flight, then deletes. Reads, and writes to other
threads, pass straight through.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Collection, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from langgraph.checkpoint.base import BaseCheckpointSaver

T = TypeVar("T")


class _Gate:
    """The writes to one thread: whether it is closed, and those in flight (async ones as
    tasks of the saver's loop, sync ones counted)."""

    def __init__(self) -> None:
        self.closed = False
        self.writing: set[asyncio.Task[Any]] = set()
        self.counted = 0
        self.idle = threading.Condition()


class BranchSaver(BaseCheckpointSaver[Any]):
    """``saver`` for the branch on ``thread_id`` (module docstring)."""

    def __init__(self, saver: BaseCheckpointSaver[Any], thread_id: str,
                 gate: _Gate | None = None) -> None:
        super().__init__(serde=saver.serde)
        self.saver, self.thread_id = saver, thread_id
        self._gate = gate or _Gate()
        # whether the saver's writes take ``task_path``: asked once, not on every write
        self._paths = (_takes_task_path(saver.put_writes), _takes_task_path(saver.aput_writes))

    def _ours(self, config: Mapping[str, Any]) -> bool:
        return bool(config.get("configurable", {}).get("thread_id") == self.thread_id)

    # -- writes -------------------------------------------------------------------------------

    async def _write(self, config: Mapping[str, Any], write: Awaitable[T], dropped: T) -> T:
        """``write`` to this branch's thread, as a task that ends even when its caller is
        cancelled (a cancelled write may land all the same, so the delete waits for it);
        ``dropped`` without writing once the thread is closed."""
        if not self._ours(config):
            return await write
        if self._gate.closed:
            if asyncio.iscoroutine(write):
                write.close()
            return dropped
        task = asyncio.ensure_future(write)
        self._gate.writing.add(task)
        task.add_done_callback(self._written)
        return await asyncio.shield(task)

    def _written(self, task: asyncio.Task[Any]) -> None:
        self._gate.writing.discard(task)
        if not task.cancelled():
            task.exception()  # its caller retrieves it; one that was cancelled never will

    def _write_now(self, config: Mapping[str, Any], write: Any, *args: Any) -> Any:
        """The sync twin of ``_write``: ``write(config, *args)``, or None once closed."""
        if not self._ours(config):
            return write(config, *args)
        with self._gate.idle:
            if self._gate.closed:
                return None
            self._gate.counted += 1
        try:
            return write(config, *args)
        finally:
            with self._gate.idle:
                self._gate.counted -= 1
                self._gate.idle.notify_all()

    async def aput(self, config: Any, checkpoint: Any, metadata: Any,
                   new_versions: Any) -> Any:
        return await self._write(config, self.saver.aput(config, checkpoint, metadata,
                                                         new_versions),
                                 _next(config, checkpoint))

    async def aput_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        path = (task_path,) if self._paths[1] else ()
        await self._write(config, self.saver.aput_writes(config, writes, task_id, *path), None)

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        done = self._write_now(config, self.saver.put, checkpoint, metadata, new_versions)
        return _next(config, checkpoint) if done is None else done

    def put_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        path = (task_path,) if self._paths[0] else ()
        self._write_now(config, self.saver.put_writes, writes, task_id, *path)

    # -- the delete ---------------------------------------------------------------------------

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete the thread, this branch's once every write to it has ended, later ones
        dropped; cancelled on the way, it goes on to its end before the cancellation does."""
        if thread_id != self.thread_id:
            await self.saver.adelete_thread(thread_id)
            return
        await _to_its_end(self._close())

    async def _close(self) -> None:
        with self._gate.idle:  # a branch writes one way: async here, sync in ``delete_thread``
            self._gate.closed = True
        while self._gate.writing:  # a write may chain another before it ends
            await asyncio.wait(set(self._gate.writing))
        await self.saver.adelete_thread(self.thread_id)

    def delete_thread(self, thread_id: str) -> None:
        if thread_id == self.thread_id:
            with self._gate.idle:
                self._gate.closed = True
                self._gate.idle.wait_for(lambda: self._gate.counted == 0)
        self.saver.delete_thread(thread_id)

    # -- everything else, as the app's checkpointer does it ----------------------------------

    @property
    def config_specs(self) -> Any:
        return self.saver.config_specs

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> BranchSaver:
        """The app's compiled serde allowlist applied to ``saver``, behind the same gate."""
        return BranchSaver(self.saver.with_allowlist(extra_allowlist), self.thread_id,
                           self._gate)

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.saver.get_next_version(current, channel)

    def get_tuple(self, config: Any) -> Any:
        return self.saver.get_tuple(config)

    async def aget_tuple(self, config: Any) -> Any:
        return await self.saver.aget_tuple(config)

    def list(self, config: Any, *, filter: dict[str, Any] | None = None,
             before: Any = None, limit: int | None = None) -> Iterator[Any]:
        return self.saver.list(config, filter=filter, before=before, limit=limit)

    async def alist(self, config: Any, *, filter: dict[str, Any] | None = None,
                    before: Any = None, limit: int | None = None) -> AsyncIterator[Any]:
        async for item in self.saver.alist(config, filter=filter, before=before, limit=limit):
            yield item

    def get_delta_channel_history(self, *, config: Any, channels: Sequence[str]) -> Any:
        return self.saver.get_delta_channel_history(config=config, channels=channels)

    async def aget_delta_channel_history(self, *, config: Any,
                                         channels: Sequence[str]) -> Any:
        return await self.saver.aget_delta_channel_history(config=config, channels=channels)


def _takes_task_path(method: Any) -> bool:
    """Whether a saver's ``put_writes`` takes ``task_path`` (older savers do not; LangGraph
    asks the same of the saver it is given, here this one)."""
    try:
        return "task_path" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return True


def _next(config: Any, checkpoint: Any) -> dict[str, Any]:
    """The config a saver's ``put`` returns: the thread's, at the checkpoint it was given."""
    return {"configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}}


async def _to_its_end(coro: Awaitable[T]) -> T:
    """``coro`` awaited to its end even when the awaiting task is cancelled (an estimate that
    stops reaches a branch already deleting its thread); the cancellation goes on after."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})  # cancelled, it leaves ``task`` running
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation is what goes on
        raise asyncio.CancelledError
    return task.result()


def writing_through(app: Any, saver: BranchSaver) -> Any:
    """A copy of ``app`` that checkpoints through ``saver`` (``app`` itself is never
    changed: the constructor writes into the channels mapping it is given, and drops the
    compiled serde allowlist, as in ``branchable``)."""
    copy = app.copy(update={"checkpointer": saver, "channels": dict(app.channels)})
    copy._serde_allowlist = getattr(app, "_serde_allowlist", None)
    return copy


__all__ = ["BranchSaver", "writing_through"]
