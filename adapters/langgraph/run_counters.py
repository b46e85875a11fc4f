"""Per-invocation call limits of ``create_agent`` middleware, refused before any branch.

``ModelCallLimitMiddleware`` and ``ToolCallLimitMiddleware`` count the calls of one invocation
(``run_limit``) in an ``UntrackedValue``, a channel LangGraph keeps out of checkpoints. A branch
forked at step k starts that count at 0, so it gets the whole limit again where the app had k
calls of it spent: an audit's app cut the third model call off (``run_limit=2``) and CAR,
whose branches made it, read P(fail) 0.71 for a truth of 0.5. The thread-wide count
(``thread_limit``) is state the checkpoints keep, and is no refusal.
"""

from __future__ import annotations

from typing import Any

from car_core.contract import Trajectory
from car_core.errors import AdapterError

from .interrupts import reachable
from .shape import AppShape


def refuse_run_counters(shape: AppShape, run: Trajectory) -> None:
    """Refuse ``run`` when a node a branch of it can reach holds middleware with a per-run
    call limit (module docstring), naming the middleware, its limit and the node."""
    counted = {key: found for key, reach in shape.reaches.items()
               if (found := _run_limited(reach.middleware)) is not None}
    if not counted:
        return
    for level, nodes in reachable(shape, run).items():
        for node in nodes:
            if (level, node) not in counted:
                continue
            name, limit = counted[(level, node)]
            where = f" of subgraph {level!r}" if level else ""
            raise AdapterError(
                f"{name}(run_limit={limit}) in node {node!r}{where} counts the calls of one "
                "invocation in a value LangGraph keeps out of checkpoints: a branch forked at a "
                "step would count from 0 and get calls the app would have cut off, so no "
                "branch runs", run_id=run.id,
                hint=f"attribute the agent built with {name}(thread_limit=...) instead (that "
                     "count is in the checkpoints) or without it, passing force_agent=True "
                     "(--force-agent) if CAR says the agent differs")


def _run_limited(middleware: list[Any]) -> tuple[str, int] | None:
    for mw in middleware:
        limit = getattr(mw, "run_limit", None)
        if type(mw).__name__ in ("ModelCallLimitMiddleware", "ToolCallLimitMiddleware") \
                and isinstance(limit, int):
            return type(mw).__name__, limit
    return None
