"""Tools that wait for a human (``ctx.wait_for_event``), kept off the branches that would hang.

LlamaIndex's human-in-the-loop pattern is a tool handed the workflow ``Context`` that calls
``ctx.wait_for_event(HumanResponseEvent, waiter_event=InputRequiredEvent(...))``: the workflow
puts the ``InputRequiredEvent`` on its event stream and pauses until the app sends the answer.
A branch has nobody to answer it, so such a tool running live on a branch waits until
``wait_for_event``'s own timeout (2000 s by default). ``waiting_tools`` finds the tools whose
code calls ``wait_for_event`` (read from the function's code objects, nested functions
included, so no source file is needed) and ``refuse_live_waits`` refuses, by name and before
anything runs, each one a branch would run live. A tool classified as a side effect never runs
on a branch (its recorded answer is replayed), so it is not refused. ``finished`` is the net
for what reading the code misses (the call made in a helper): it stops the run as soon as its
workflow asks for input.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from types import CodeType
from typing import Any

from llama_index.core.tools import BaseTool, FunctionTool
from llama_index.core.workflow import InputRequiredEvent

from car_core.errors import AdapterError

from ..common.messages import ToolSafety
from ..common.named import code_names

WAIT = "wait_for_event"  # the Context method a human-in-the-loop tool pauses in


def waits_for_event(fn: Any) -> bool:
    """Whether ``fn``'s own code (or a function defined inside it) calls ``wait_for_event``."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return isinstance(code, CodeType) and WAIT in code_names(code)


def waiting_tools(agents: Mapping[str, Any]) -> dict[str, str]:
    """The tools handed the workflow ``Context`` whose function waits for an event (tool name ->
    its agent). Only those can call ``ctx.wait_for_event``: a tool without the ``Context`` has
    no workflow to wait in."""
    found: dict[str, str] = {}
    for agent, a in agents.items():
        for t in getattr(a, "tools", None) or ():
            tool = t if isinstance(t, BaseTool) else FunctionTool.from_defaults(t)
            if (isinstance(tool, FunctionTool) and getattr(tool, "requires_context", False)
                    and waits_for_event(tool.real_fn)):
                found[tool.metadata.name or ""] = agent
    return found


def refuse_live_waits(waiting: Mapping[str, str], safety: ToolSafety) -> None:
    """Refuse each waiting tool a branch would run live (a safe tool, or an unclassified one
    under ``unclassified="live"``): nobody answers it there, so the branch would hang."""
    for name, agent in sorted(waiting.items()):
        if safety.guards(name):
            continue  # a side effect: answered from the record or a simulator, never run
        raise AdapterError(
            f"tool {name!r} of agent {agent!r} waits for a human (ctx.wait_for_event): a branch "
            "runs it live and has nobody to answer it, so the branch would wait until the "
            "wait times out",
            hint=f"classify it in side_effect_tools=[{name!r}, ...]: branches are then "
                 "answered with the answer the record got (add match_on="
                 f"{{{name!r}: 'any'}} to answer a re-worded question alike); or pass "
                 f"simulators={{{name!r}: fn(arguments, ctx)}} to answer it")


def asked_for_input(event: Any, *, step: int, run_id: str | None,
                    live: list[str]) -> AdapterError:
    """The error a run that asked for human input stops with (``finished``)."""
    prefix = getattr(event, "prefix", None)
    asked = f" ({prefix!r})" if isinstance(prefix, str) and prefix else ""
    where = f" at step {step}" if step >= 0 else ""
    return AdapterError(
        f"the workflow asked for human input{where}: it emitted {type(event).__name__}{asked}, "
        "and a run CAR drives has nobody to answer it, so it was stopped", run_id=run_id,
        step=step if step >= 0 else None,
        hint="classify the tool that asks (it calls ctx.wait_for_event, maybe in a helper; "
             f"the tools handed the Context that run live here: {live}) in "
             "side_effect_tools=[...]: branches then get the answer the record got; or pass "
             "simulators={name: fn(arguments, ctx)}")


async def finished(handler: Any, refuse: Callable[[Any], None]) -> Any:
    """``await handler`` (a running workflow), stopped at the first ``InputRequiredEvent`` its
    workflow emits: ``refuse(event)`` notes why, then the run is cancelled, so the await ends
    (with the framework's cancellation error) instead of waiting for an answer."""
    async def watch() -> None:
        async for event in handler.stream_events():
            if isinstance(event, InputRequiredEvent):
                refuse(event)
                await handler.cancel_run()
                return

    watcher = asyncio.ensure_future(watch())
    # a stream that ended with the run's own error: the await below reports that error
    watcher.add_done_callback(lambda t: t.cancelled() or t.exception())
    try:
        return await handler
    finally:
        watcher.cancel()
