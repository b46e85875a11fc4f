"""Per-invocation call limits of ``create_agent`` middleware, refused before any branch.

``ModelCallLimitMiddleware`` and ``ToolCallLimitMiddleware`` count the calls of one invocation
(``run_limit``) in an ``UntrackedValue``, a channel LangGraph keeps out of checkpoints. A branch
forked at step k starts that count at 0, so it gets the whole limit again where the app had k
calls of it spent: an audit's app cut the third model call off (``run_limit=2``) and CAR,
whose branches made it, read P(fail) 0.71 for a truth of 0.5. Refused where the recorded
run reached the limit (its calls of that kind at least ``run_limit``): there branches would go
past where the app stopped. A limit the run stayed below, a safety net, is left alone (a
branch that would need more calls than the app allows from its step is the rarer case). The
thread-wide count (``thread_limit``) is state the checkpoints keep, and is no refusal.
"""

from __future__ import annotations

from typing import Any

from car_core.contract import Trajectory
from car_core.errors import AdapterError

from ..common.messages import calls_of
from .shape import AppShape


def refuse_run_counters(shape: AppShape, run: Trajectory,
                        reached: dict[str, list[str]]) -> None:
    """Refuse ``run`` when a node a branch of it can reach (``reached``) holds middleware with
    a per-run call limit the run reached (module docstring), naming the middleware, its limit
    and the node."""
    counted = {key: found for key, reach in shape.reaches.items()
               if (found := _run_limited(reach.middleware)) is not None}
    if not counted:
        return
    for level, nodes in reached.items():
        for node in nodes:
            if (level, node) not in counted:
                continue
            name, limit, tool = counted[(level, node)]
            if _calls(run, name, tool) < limit:
                continue
            where = f" of subgraph {level!r}" if level else ""
            raise AdapterError(
                f"{name}(run_limit={limit}) in node {node!r}{where} counts the calls of one "
                "invocation in a value LangGraph keeps out of checkpoints, and the run reached "
                "it: a branch forked at a step would count from 0 and get calls the app cut "
                "off, so no branch runs", run_id=run.id,
                hint=f"attribute the agent built with {name}(thread_limit=...) instead (that "
                     "count is in the checkpoints) or without it, passing force_agent=True "
                     "(--force-agent) if CAR says the agent differs")


def _run_limited(middleware: list[Any]) -> tuple[str, int, str | None] | None:
    """The first call-limit middleware with a per-run limit: its name, limit and the tool it
    counts (None: every tool, or model calls)."""
    for mw in middleware:
        limit = getattr(mw, "run_limit", None)
        if type(mw).__name__ in ("ModelCallLimitMiddleware", "ToolCallLimitMiddleware") \
                and isinstance(limit, int):
            return type(mw).__name__, limit, getattr(mw, "tool_name", None)
    return None


def _calls(run: Trajectory, name: str, tool: str | None) -> int:
    """The recorded run's calls of the kind the middleware counts: model calls (its steps),
    or tool calls (of ``tool``, when it counts one)."""
    if name == "ModelCallLimitMiddleware":
        return len(run.steps)
    return sum(1 for step in run.steps for _, called, _ in calls_of(step.action)
               if tool is None or called == tool)
