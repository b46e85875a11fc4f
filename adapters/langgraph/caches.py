"""A node cache on a node where a branch re-decides, refused before any branch.

LangGraph answers a node that has a ``CachePolicy`` (its own, or the graph's default) from the
app's cache (``compile(cache=...)``) whenever the node's input was seen before. A branch
re-decides a step from the recorded state, which is exactly such an input, so its model node
would hand back the recorded decision, or another branch's, instead of drawing a new one: an
audit's attribution read a rescue of 1 where the planted one was 0.5. A run is refused when
a node a branch can reach (``interrupts.reachable``, given) is cached and decides (its steps ran
there, or it reaches a chat model); a cached node that decides nothing (a lookup) is left
alone. The cache is no part of the fingerprint: the graph compiled without it attributes the
runs recorded with it.
"""

from __future__ import annotations

from typing import Any

from car_core.contract import Trajectory
from car_core.errors import AdapterError

from .interrupts import level_parts
from .shape import AppShape


def refuse_cached(shape: AppShape, run: Trajectory, reached: dict[str, list[str]]) -> None:
    """Refuse ``run`` when a node a branch of it can reach (``reached``) is cached and decides
    (module docstring), naming the node and its subgraph."""
    cached = {level: _cached(graph) for level, graph in shape.graphs.items()}
    if not any(cached.values()):
        return
    decided = {("|".join(level_parts(step.meta)), str(step.meta.get("node")))
               for step in run.steps}
    for level, nodes in reached.items():
        for node in nodes:
            if node not in cached[level]:
                continue
            reach = shape.reaches.get((level, node))
            if (level, node) in decided or (reach is not None and (reach.models or reach.wrapped)):
                where = f" of subgraph {level!r}" if level else ""
                raise AdapterError(
                    f"node {node!r}{where} is cached (its CachePolicy, compile(cache=...)): a "
                    "branch that re-decides it would be answered from the cache, a copy of a "
                    "decision and not a new one, so no branch runs", run_id=run.id,
                    hint="compile the app CAR attributes without cache= (a flag in your agent "
                         "factory): the same nodes, edges and tools, so the recorded run still "
                         "matches it")


def _cached(graph: Any) -> set[str]:
    """The nodes of ``graph`` LangGraph answers from its cache: none without one, else those
    with a ``CachePolicy`` of their own or under the graph's default."""
    if getattr(graph, "cache", None) is None:
        return set()
    default = getattr(graph, "cache_policy", None)
    nodes = getattr(getattr(graph, "builder", None), "nodes", None) or {}
    return {str(name) for name, spec in nodes.items()
            if getattr(spec, "cache_policy", None) is not None or default is not None}
