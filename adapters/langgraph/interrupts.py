"""Where a compiled app stops for a person, refused before any branch of a run reaches it.

An app compiled with ``interrupt_before`` / ``interrupt_after`` (the approval step of
LangGraph's customer-support tutorial) stops there on every thread, a branch's too, and a
branch has nobody to approve it. Those nodes are read from the compiled graph and each of its
subgraphs (``Pregel.interrupt_before_nodes`` / ``interrupt_after_nodes``, ``"*"`` for every
node); a run is refused when a branch of it can reach one: a node its steps ran in, or one
their graph's edges lead to from there (LangGraph's own drawing of the graph, which counts a
conditional edge without declared ends as leading anywhere), including every node of a
subgraph such a node enters. A node only the recorded prefix ran (an intake step before the
first model call) stops no branch.

A ``HumanInTheLoopMiddleware`` (an approval gate on ``create_agent``'s tools) is refused the
same way when a node a branch reaches holds one that gates a tool: it asks a person each time
the model calls that tool, and a branch that re-decides is free to call it (the gated tool is
usually the one the failure is about). Refused at the branch it stopped, a user trial's
attribution ran four branches first. ``interrupt()`` called inside a node's own code is no
refusal here: whether it fires depends on the state, so a branch it stops is refused there
(``stopped``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from langgraph.constants import END, START

from car_core.contract import Trajectory
from car_core.errors import AdapterError

from .checkpoints import recast
from .shape import AppShape

_WHEN = ("interrupt_before", "interrupt_after")
_HINT = ("compile the app CAR attributes with the same graph without interrupt_before / "
         "interrupt_after (a flag in your agent factory, e.g. build_graph(interrupt=False): the "
         "same nodes, edges and tools, so the recorded run still matches it); branches never "
         "run side-effect tools anyway: the guard answers them from the record or a simulator")


_GATE_HINT = ("build the app CAR attributes without HumanInTheLoopMiddleware (a flag in "
              "your agent factory) and pass force_agent=True (--force-agent): the same agent "
              "without its approval gate; name the tools it gated in side_effect_tools, since "
              "nothing else then says they change things. Branches never run them anyway: the "
              "guard answers them from the record or a simulator")


def refuse_interrupts(shape: AppShape, run: Trajectory,
                      reached: dict[str, list[str]]) -> None:
    """Refuse ``run`` when a branch of it can reach a node the app stops at for human input
    (module docstring), naming the node, its subgraph and the compile option or the
    middleware; ``reached``: ``reachable(shape, run)``."""
    stops = {level: _stops(graph) for level, graph in shape.graphs.items()}
    gates = {key: gated for key, reach in shape.reaches.items()
             if (gated := _gated(reach.middleware))}
    if not any(stops.values()) and not gates:
        return
    for level, nodes in reached.items():
        for node in nodes:
            where = f" of subgraph {level!r}" if level else ""
            if (level, node) in gates:
                middleware, tools = gates[(level, node)]
                raise AdapterError(
                    f"the app asks a person to approve {', '.join(map(repr, tools))} "
                    f"({middleware} in node {node!r}{where}); a branch that calls it has "
                    "nobody to answer, so no branch runs", run_id=run.id, hint=_GATE_HINT)
            for when in _WHEN:
                if node in stops[level].get(when, ()):
                    raise AdapterError(
                        f"the app stops for human input {when.split('_')[1]} node {node!r}"
                        f"{where} ({when}); a branch has nobody to answer it, so no branch "
                        "runs", run_id=run.id, hint=_HINT)


def stopped(snapshot: Any, start: int, run_id: str) -> AdapterError:
    """The error for a branch from step ``start`` that stopped for human input anyway
    (``snapshot``: its thread's state where it stopped): an ``interrupt()`` in a node's code,
    or a stop the graph's drawing did not show (a ``Command(goto=...)`` without declared
    destinations)."""
    asked = [t for t in getattr(snapshot, "tasks", ()) if getattr(t, "interrupts", ())]
    node = asked[0].name if asked else snapshot.next[0]
    how = "interrupt()" if asked else "interrupt_before / interrupt_after"
    return AdapterError(
        f"a branch from step {start} stopped for human input at node {node!r} ({how}); a "
        "branch has nobody to answer it", run_id=run_id,
        hint="attribute with the app compiled so that no branch stops for a person: without "
             "interrupt_before / interrupt_after, and with interrupt() only where the steps "
             "you test do not lead")


def _gated(middleware: Iterable[Any]) -> tuple[str, list[str]] | None:
    """The first middleware that asks a person before tools run (``interrupt_on``, as
    ``HumanInTheLoopMiddleware`` keeps it: only the tools it gates) and those tools."""
    for mw in middleware:
        gated = getattr(mw, "interrupt_on", None)
        if isinstance(gated, dict) and gated:
            return type(mw).__name__, sorted(map(str, gated))
    return None


def _stops(graph: Any) -> dict[str, set[str]]:
    """The nodes ``graph`` stops before and after, by compile option (``"*"``: all of its
    own nodes)."""
    nodes = set(getattr(getattr(graph, "builder", None), "nodes", None) or ())
    found: dict[str, set[str]] = {}
    for when in _WHEN:
        named = getattr(graph, f"{when}_nodes", None) or ()
        chosen = nodes if named == "*" else {str(n) for n in named}
        if chosen:
            found[when] = chosen
    return found


def reachable(shape: AppShape, run: Trajectory) -> dict[str, list[str]]:
    """Per graph level, the nodes a branch of ``run`` can run, in the order found: the nodes
    its steps ran in (at a parent level, the subgraph node holding them), then every node the
    edges lead to from those; a subgraph whose node is led to runs from its start."""
    entries: dict[str, list[str]] = {}
    for step in run.steps:
        parts = level_parts(step.meta)
        for depth, part in enumerate([*parts, str(step.meta.get("node"))]):
            entries.setdefault("|".join(parts[:depth]), []).append(part)
    reached: dict[str, list[str]] = {}
    led: dict[str, set[str]] = {}  # per level, the nodes edges lead to from the entries
    for level in sorted(shape.graphs, key=lambda ns: ns.count("|") if ns else -1):
        parent, _, name = level.rpartition("|")
        starts = list(dict.fromkeys(entries.get(level, [])))
        if level and name in led.get(parent, ()):
            starts.append(START)
        after = _after(shape.graphs[level], starts)
        led[level] = set(after)
        reached[level] = [n for n in dict.fromkeys([*starts, *after]) if n not in (START, END)]
    return reached


def level_parts(meta: Any) -> list[str]:
    """The graph levels a step ran inside, outermost first: its checkpoint namespace without
    the task ids (``"|".join`` of them is the step's level, as ``AppShape.graphs`` keys it)."""
    return [p for p in recast(meta.get("checkpoint_ns") or "").split("|") if p]


def _after(graph: Any, starts: Iterable[str]) -> list[str]:
    """The nodes ``graph``'s edges lead to from ``starts``, one edge or more away, in
    breadth-first order; every node of the graph where it cannot be drawn."""
    try:
        drawn = graph.get_graph()
        edges = [(str(e.source), str(e.target)) for e in drawn.edges]
    except Exception:  # an app LangGraph cannot draw: any node may follow any node
        nodes = list(getattr(getattr(graph, "builder", None), "nodes", None) or ())
        return nodes if list(starts) else []
    found: list[str] = []
    frontier = list(starts)
    while frontier:
        following = [b for a, b in edges if a in frontier and b not in found]
        found.extend(dict.fromkeys(following))
        frontier = list(dict.fromkeys(following))
    return found
