"""One ``CarRecorder`` watching runs that overlap (the SDK's research_bot runs its searches with
``asyncio.create_task``), read while some are still going.

A user trial read ``recorder.run`` after the first search finished: every run still in flight
was closed as an error, the steps they took next were dropped, and an empty run was stored as
complete. A run in flight now stays open; reading the recorder closes only the runs whose task
is over.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agents import Agent, MaxTurnsExceeded, Runner, function_tool, set_tracing_disabled
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, RunStillOpen, ScriptedModel

from car_core.errors import InvalidInput

set_tracing_disabled(True)  # no trace export from tests (it would need an API key)


@function_tool
def search(query: str) -> str:
    """Search the web (reads only)."""
    return f"results for {query}"


def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    """Search once, then summarise."""
    if any(m.get("role") == "tool" for m in messages):
        return "summary"
    return assistant(None, [tool_call("c1", "search", {"query": messages[-1]["content"]})])


def searcher() -> Agent[Any]:
    return Agent(name="searcher", instructions="Search, then summarise.", tools=[search],
                 model=ScriptedModel(decide, latency_s=0.1))


async def pipeline(recorder: CarRecorder) -> tuple[Any, list[Any], list[Any]]:
    """Three searches started 50 ms apart; the recorder is read as the first one ends."""
    agent = searcher()

    async def one(query: str, delay: float) -> Any:
        await asyncio.sleep(delay)
        return await Runner.run(agent, query, hooks=recorder)

    tasks = [asyncio.create_task(one(q, d)) for q, d in (("a", 0.0), ("b", 0.05), ("c", 0.1))]
    await tasks[0]
    seen = recorder.run  # b and c are still searching
    results = await asyncio.gather(*tasks)
    return seen, recorder.runs, [recorder.run_of(r) for r in results]


def query(run: Any) -> str:
    return str(json.loads(run.steps[0].action["tool_calls"][0]["function"]["arguments"])
               ["query"])


def test_reading_the_recorder_leaves_the_runs_in_flight_open() -> None:
    recorder = CarRecorder()
    seen, runs, by_result = asyncio.run(pipeline(recorder))
    assert seen.status == "complete" and len(seen.steps) == 2
    assert len(runs) == 3 and len({r.id for r in runs}) == 3
    assert all(r.status == "complete" and len(r.steps) == 2 for r in runs)
    assert sorted(map(query, runs)) == ["a", "b", "c"]  # none spliced into another
    # each Runner.run's own run, whatever order they ended in
    assert [query(r) for r in by_result] == ["a", "b", "c"]


def test_a_run_that_raised_is_still_closed_as_an_error_when_read() -> None:
    """The reader's own task ran it: its ``Runner.run`` is over, so it is closed."""
    recorder = CarRecorder()

    def crash(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
        if any(m.get("role") == "tool" for m in messages):
            raise RuntimeError("model server gone")
        return decide(messages, tools, rng)

    agent = Agent(name="searcher", instructions="Search.", tools=[search],
                  model=ScriptedModel(crash))

    async def go() -> tuple[Any, Any]:
        try:
            await Runner.run(agent, "a", hooks=recorder)
        except RuntimeError as exc:
            raised = exc
        return recorder.run, raised

    run, raised = asyncio.run(go())
    assert run.status == "error" and len(run.steps) == 1
    if getattr(raised, "run_data", None) is not None:  # the SDK says which run raised
        assert recorder.run_of(raised) is run
    with pytest.raises(InvalidInput, match="neither a run's result"):
        recorder.run_of("a")


def test_a_run_that_raised_between_turns_beside_others_is_named_by_its_exception() -> None:
    """``max_turns`` raises in the run's own task after a turn ended normally: read at once
    from the loop while another run's turn is running, that run may be about to start its
    next turn, so it is kept open, with a warning; its exception names it (``run_of``),
    closed as an error. Read with no other run going, it is closed at once."""
    recorder = CarRecorder()
    agent = searcher()

    slow = Agent(name="searcher", instructions="Search, then summarise.", tools=[search],
                 model=ScriptedModel(decide, latency_s=1.5))  # still in its first turn

    async def go() -> BaseException:
        other = asyncio.create_task(Runner.run(slow, "slow", hooks=recorder))
        try:
            await Runner.run(agent, "a", hooks=recorder, max_turns=1)
        except MaxTurnsExceeded as exc:
            with pytest.warns(RunStillOpen, match="ended a turn just now"):
                assert recorder.runs == []
            await other
            return exc
        raise AssertionError("max_turns did not stop the run")

    raised = asyncio.run(go())
    run = recorder.run_of(raised)
    assert run.status == "error" and len(run.steps) == 1
    assert sorted(r.status for r in recorder.runs) == ["complete", "error"]

    alone = CarRecorder()

    async def one() -> Any:
        try:
            await Runner.run(agent, "a", hooks=alone, max_turns=1)
        except MaxTurnsExceeded:
            return alone.run
        raise AssertionError("max_turns did not stop the run")

    assert asyncio.run(one()).status == "error"
