"""The fingerprint of a compiled LangGraph app (see ``car_adapters.common.fingerprint``): per graph
level, its nodes (a tool node by its tools, a subgraph by its name, any other by the code it
runs), its edges and its conditional edges. ``LangGraphAgent.fingerprint()``, ``CarCallback(app=
app)`` and ``import_thread`` all stamp this value, so a run recorded any of those ways is
checked against the agent it is attributed with."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableWithFallbacks
from langgraph.prebuilt import ToolNode

from car_core.contract import fingerprint_digest

from ..common.fingerprint import callable_print, tool_print


def _attr(r: Any, name: str) -> Any:
    """``r.name`` or None: a runnable that forwards unknown attributes to another
    (``RunnableWithFallbacks``) can raise anything from type hints it evaluates."""
    try:
        return getattr(r, name, None)
    except Exception:
        return None


def _runnable(r: Any) -> Any:
    if isinstance(r, RunnableWithFallbacks):  # the tutorial's ToolNode(...).with_fallbacks
        return {"runnable": _runnable(r.runnable),
                "fallbacks": [_runnable(f) for f in r.fallbacks]}
    if isinstance(r, ToolNode):
        return {"tools": [tool_print(n, getattr(t, "description", ""), getattr(t, "args", {}))
                          for n, t in sorted(r.tools_by_name.items())]}
    if hasattr(r, "get_subgraphs") and hasattr(r, "builder"):  # a compiled subgraph
        return {"subgraph": r.get_name()}
    steps = _attr(r, "steps")
    if isinstance(steps, (list, tuple)):  # a runnable sequence
        return {"steps": [_runnable(s) for s in steps]}
    fn = _attr(r, "func") or _attr(r, "afunc")
    if fn is not None:
        return callable_print(fn)
    return callable_print(r)


def _graph(g: Any) -> dict[str, Any]:
    builder = getattr(g, "builder", None)
    nodes = getattr(builder, "nodes", {}) or {}
    branches = getattr(builder, "branches", {}) or {}
    return {"name": g.get_name(),
            "nodes": {str(n): _runnable(spec.runnable) for n, spec in sorted(nodes.items())},
            "edges": sorted([str(a), str(b)] for a, b in getattr(builder, "edges", ()) or ()),
            "waiting": sorted([sorted(map(str, a)), str(b)]
                              for a, b in getattr(builder, "waiting_edges", ()) or ()),
            "branches": {f"{src}.{name}": {"path": _runnable(b.path),
                                           "ends": sorted(map(str, (b.ends or {}).values()))}
                         for src, named in sorted(branches.items())
                         for name, b in sorted(named.items())}}


def app_fingerprint(app: Any) -> dict[str, Any]:
    """The JSON value ``LangGraphAgent(app).fingerprint()`` returns."""
    graphs = {"": app, **dict(app.get_subgraphs(recurse=True))}
    return {"framework": "langgraph",
            "graphs": {str(ns): _graph(g) for ns, g in sorted(graphs.items())}}


def app_digest(app: Any) -> str:
    """The ``meta["agent_fingerprint"]`` of a run recorded from ``app``."""
    return fingerprint_digest(app_fingerprint(app))
