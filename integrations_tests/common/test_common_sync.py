"""``car_adapters.common.sync.run_sync``: the one way the async adapters (LlamaIndex, OpenAI
Agents) finish a coroutine from the engine's sync ``branch`` call, wherever it is called from."""

from __future__ import annotations

import asyncio

import pytest
from car_adapters.common.sync import BranchLoop, run_sync

from car_core.errors import AdapterError


async def _loop_id() -> int:
    return id(asyncio.get_running_loop())


def test_from_plain_code_it_returns_the_coroutines_value() -> None:
    assert run_sync(lambda: asyncio.sleep(0, result=7)) == 7


def test_from_inside_a_running_loop_it_runs_elsewhere_and_returns() -> None:
    async def caller() -> tuple[int, int]:
        return id(asyncio.get_running_loop()), run_sync(_loop_id)

    outer, inner = asyncio.run(caller())
    assert outer != inner  # finished on a loop of its own, not by re-entering the caller's


def test_a_branch_loop_is_shared_by_every_call() -> None:
    loop = BranchLoop("test-branches")
    seen = {run_sync(_loop_id, loop) for _ in range(3)}
    assert seen == {id(loop.get())}


def test_a_branch_loop_works_from_inside_the_callers_loop() -> None:
    loop = BranchLoop("test-branches")

    async def caller() -> int:
        return run_sync(_loop_id, loop)

    assert asyncio.run(caller()) == id(loop.get())


def test_a_branch_started_from_inside_a_branch_is_refused() -> None:
    loop = BranchLoop("test-branches")

    async def nested() -> int:
        return run_sync(_loop_id, loop)  # on the branch loop itself: it would wait on itself

    with pytest.raises(AdapterError, match="from inside another branch"):
        run_sync(nested, loop)
