"""``BranchSaver``: a branch's delete of its thread outlasts LangGraph's own writes to it. On
a stop, a cancelled node's ``__error__`` write and the next checkpoint landed after the delete,
and a delete the stop cancelled did not finish: both left ``car-branch-*`` threads in the
user's checkpointer (``test_langgraph_stopped_branches.py`` is the whole estimate)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from car_adapters.langgraph.branch_saver import BranchSaver
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver


class SlowSaver(InMemorySaver):
    """Writes land ``delay`` seconds after they are asked for, as a busy database's do."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def aput(self, config: Any, checkpoint: Any, metadata: Any,
                   new_versions: Any) -> Any:
        await asyncio.sleep(self.delay)
        return self.put(config, checkpoint, metadata, new_versions)


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


def threads(saver: InMemorySaver) -> set[str]:
    return {c.config["configurable"]["thread_id"] for c in saver.list(None)}


async def write(saver: Any, thread: str) -> Any:
    return await saver.aput(config(thread), empty_checkpoint(), {}, {})


def test_the_delete_waits_for_a_write_in_flight_and_drops_later_ones() -> None:
    async def main() -> None:
        inner = SlowSaver(0.1)
        branch = BranchSaver(inner, "car-branch-1")
        in_flight = asyncio.ensure_future(write(branch, "car-branch-1"))
        await asyncio.sleep(0.01)  # the write has begun, and lands after the delete began
        await branch.adelete_thread("car-branch-1")
        assert in_flight.done() and threads(inner) == set()
        later = await write(branch, "car-branch-1")  # dropped, but answered as a put is
        assert later["configurable"]["thread_id"] == "car-branch-1"
        assert threads(inner) == set()
        await write(branch, "user-1")  # another thread's writes pass straight through
        assert threads(inner) == {"user-1"}
    asyncio.run(main())


def test_a_cancelled_delete_still_deletes_then_raises_the_cancel() -> None:
    async def main() -> None:
        inner = SlowSaver(0.1)
        branch = BranchSaver(inner, "car-branch-1")
        in_flight = asyncio.ensure_future(write(branch, "car-branch-1"))
        await asyncio.sleep(0.01)
        deleting = asyncio.ensure_future(branch.adelete_thread("car-branch-1"))
        await asyncio.sleep(0.01)
        deleting.cancel()  # the stop reaches a branch already deleting its thread
        with pytest.raises(asyncio.CancelledError):
            await deleting
        await in_flight
        assert threads(inner) == set()
    asyncio.run(main())


def test_the_sync_delete_closes_the_thread_to_later_writes() -> None:
    inner = InMemorySaver()
    branch = BranchSaver(inner, "car-branch-1")
    branch.put(config("car-branch-1"), empty_checkpoint(), {}, {})
    assert threads(inner) == {"car-branch-1"}
    branch.delete_thread("car-branch-1")
    branch.put(config("car-branch-1"), empty_checkpoint(), {}, {})
    assert threads(inner) == set()
