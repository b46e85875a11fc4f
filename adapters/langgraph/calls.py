"""How a branch reaches the app and its checkpointer: one branch body, driven sync or async.

``LangGraphAgent`` writes a branch once, as a coroutine, and awaits every call it makes to the
app (``invoke``, ``stream``, ``get_state``, ``update_state``) and its checkpointer
(``get_tuple``, ``put``, ``put_writes``, ``delete_thread``), and a tool it runs again on its
own (``run_tool``), through a ``Calls``:

- ``SyncCalls`` makes the plain calls. Nothing the body awaits ever waits, so ``now`` finishes
  the coroutine on the calling thread with no event loop: ``branch`` of a sync app is as sync
  as it always was (``invoke`` / ``stream``), and its context variables stay where they are.
- ``AsyncCalls`` awaits their coroutine twins (``ainvoke``, ``astream``, ``aget_state``,
  ``aput``, ...): ``abranch`` is then a coroutine the asyncio executor runs with others on one
  loop, and nodes or tools that exist only as coroutines (MCP tools, ``async def`` tools) run;
  LangGraph runs a sync node or tool in a worker thread with the task's context copied.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class SyncCalls:
    """The app's and the checkpointer's plain methods, as awaitables that never wait."""

    def __init__(self, app: Any, saver: Any) -> None:
        self.app, self.saver = app, saver

    async def invoke(self, value: Any, config: dict[str, Any], **kwargs: Any) -> Any:
        return self.app.invoke(value, config, **kwargs)

    async def stream(self, value: Any, config: dict[str, Any], **kwargs: Any
                     ) -> AsyncGenerator[Any, None]:
        stream = self.app.stream(value, config, stream_mode="values", **kwargs)
        try:
            for values in stream:
                yield values
        finally:
            stream.close()

    async def get_state(self, config: dict[str, Any]) -> Any:
        return self.app.get_state(config)

    async def update_state(self, config: dict[str, Any], values: Any, as_node: str) -> Any:
        return self.app.update_state(config, values, as_node=as_node)

    async def get_tuple(self, config: dict[str, Any]) -> Any:
        return self.saver.get_tuple(config)

    async def put(self, config: dict[str, Any], checkpoint: Any, metadata: Any,
                  versions: Any) -> Any:
        return self.saver.put(config, checkpoint, metadata, versions)

    async def put_writes(self, config: dict[str, Any], writes: Any, task_id: str) -> None:
        self.saver.put_writes(config, writes, task_id)

    async def delete_thread(self, thread_id: str) -> None:
        self.saver.delete_thread(thread_id)

    async def run_tool(self, tool: Any, call: dict[str, Any], config: dict[str, Any]) -> Any:
        """One of the app's tools run on its own, outside the graph (a safe tool's re-run)."""
        return tool.invoke(call, config)


class AsyncCalls(SyncCalls):
    """The coroutine twins of ``SyncCalls``' methods."""

    async def invoke(self, value: Any, config: dict[str, Any], **kwargs: Any) -> Any:
        return await self.app.ainvoke(value, config, **kwargs)

    async def stream(self, value: Any, config: dict[str, Any], **kwargs: Any
                     ) -> AsyncGenerator[Any, None]:
        stream = self.app.astream(value, config, stream_mode="values", **kwargs)
        try:
            async for values in stream:
                yield values
        finally:
            await stream.aclose()

    async def get_state(self, config: dict[str, Any]) -> Any:
        return await self.app.aget_state(config)

    async def update_state(self, config: dict[str, Any], values: Any, as_node: str) -> Any:
        return await self.app.aupdate_state(config, values, as_node=as_node)

    async def get_tuple(self, config: dict[str, Any]) -> Any:
        return await self.saver.aget_tuple(config)

    async def put(self, config: dict[str, Any], checkpoint: Any, metadata: Any,
                  versions: Any) -> Any:
        return await self.saver.aput(config, checkpoint, metadata, versions)

    async def put_writes(self, config: dict[str, Any], writes: Any, task_id: str) -> None:
        await self.saver.aput_writes(config, writes, task_id)

    async def delete_thread(self, thread_id: str) -> None:
        await self.saver.adelete_thread(thread_id)

    async def run_tool(self, tool: Any, call: dict[str, Any], config: dict[str, Any]) -> Any:
        return await tool.ainvoke(call, config)


def now(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never waits (it awaits only ``SyncCalls``), run to its
    end here, with no event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a branch driven with SyncCalls waited on an event loop")


async def probe_async(saver: Any) -> bool:
    """Whether the checkpointer's coroutine methods work: ``SqliteSaver`` and the sync
    ``PostgresSaver`` raise ``NotImplementedError`` there, and their apps run only under
    ``invoke``."""
    try:
        await saver.aget_tuple({"configurable": {"thread_id": "car-probe", "checkpoint_ns": ""}})
    except NotImplementedError:
        return False
    return True
