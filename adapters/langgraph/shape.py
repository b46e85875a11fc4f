"""What CAR reads of a compiled app once, when the agent is built: its graph levels, its tool
nodes, what every other node's code reaches, and its tools.

The refusals, the fork and the thread import all read the app through this one view, so they
agree on which nodes are tool nodes and which levels CAR can fork into.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableWithFallbacks
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode

from ..common.named import named_objects
from .checkpoints import join
from .reach import Reach, reach


@dataclass(frozen=True)
class AppShape:
    """A compiled app and what its builder says about it (see the module docstring)."""

    app: Any
    saver: Any
    messages_key: str
    graphs: dict[str, Any]  # "" is the app, then each subgraph namespace
    tool_nodes: dict[tuple[str, str], Any]  # (level, node) -> its ToolNode
    reaches: dict[tuple[str, str], Reach]  # every other node: its tools, its models
    tools: list[str]
    async_only: tuple[str, ...]  # the nodes and tools that exist only as coroutines, named
    nested: dict[str, BaseTool]  # tools only other tools' code calls, by name (``_nested``)

    @property
    def is_async(self) -> bool:
        """Whether the graph needs ``ainvoke()``: it has async-only nodes or tools (an
        ``async def`` node, MCP tools)."""
        return bool(self.async_only)

    @classmethod
    def of(cls, app: Any, saver: Any, messages_key: str,
           node_tools: Iterable[str | BaseTool]) -> AppShape:
        graphs: dict[str, Any] = {"": app, **dict(app.get_subgraphs(recurse=True))}
        specs = [(ns, n, spec) for ns, g in graphs.items()
                 for n, spec in getattr(getattr(g, "builder", None), "nodes", {}).items()]
        tool_nodes = {(ns, n): node for ns, n, spec in specs
                      if (node := tool_node(spec.runnable)) is not None}
        reaches = {(ns, n): reach(spec.runnable) for ns, n, spec in specs
                   if (ns, n) not in tool_nodes and join(ns, n) not in graphs}
        given = [t for t in node_tools if isinstance(t, BaseTool)]
        nested = _nested([t for _, t in _tools(tool_nodes, reaches)] + given)
        tools = sorted({t for node in tool_nodes.values()
                        for t in getattr(node, "tools_by_name", {})}
                       | {t for r in reaches.values() for t in r.tools}
                       | {t.name for t in given} | set(nested))
        async_tools = sorted({name for name, t in _tools(tool_nodes, reaches)
                              if _async_only(t)})
        async_only = tuple(
            [f"node {join(ns, n)!r}" for ns, n, spec in specs if _async_only(spec.runnable)]
            + [f"tool {name!r}" for name in async_tools])
        return cls(app, saver, messages_key, graphs, tool_nodes, reaches, tools, async_only,
                   nested)

    @property
    def graph_tools(self) -> set[str]:
        """The tools found in the graph itself: its tool nodes' and those a node's code
        reaches (not the names only given as ``node_tools``)."""
        return {name for name, _ in _tools(self.tool_nodes, self.reaches)}

    def node_code(self) -> dict[str, list[Any]]:
        """The functions of every node that is neither a tool node nor a subgraph, by how a
        message names the node (``node 'name'``): code each branch runs as it is."""
        out: dict[str, list[Any]] = {}
        for ns, g in self.graphs.items():
            for n, spec in getattr(getattr(g, "builder", None), "nodes", {}).items():
                if (ns, n) in self.tool_nodes or join(ns, n) in self.graphs:
                    continue
                fns = [getattr(spec.runnable, part, None) for part in ("func", "afunc")]
                out[f"node {join(ns, n)!r}"] = [f for f in fns if callable(f)]
        return out

    def runs_model(self, level: str, node: str) -> bool:
        """Whether ``node`` at graph level ``level`` is a node whose messages may be model
        decisions: neither a tool node nor a subgraph."""
        return (level, node) not in self.tool_nodes and join(level, node) not in self.graphs


def _tools(tool_nodes: dict[tuple[str, str], Any], reaches: dict[tuple[str, str], Reach]
           ) -> list[tuple[str, Any]]:
    """Every tool object of the graph with its name: its tool nodes' and those a node
    reaches (one name may be several objects, in different nodes)."""
    return ([(name, t) for node in tool_nodes.values()
             for name, t in getattr(node, "tools_by_name", {}).items()]
            + [(name, t) for r in reaches.values() for name, t in r.tools.items()])


def _nested(tools: list[Any]) -> dict[str, BaseTool]:
    """The tools that only the code of ``tools`` (their functions, the sub-agents they run, and
    the tools found there in turn) calls, by name: a lookup that audits through another tool
    object, or asks a billing sub-agent. They run wherever
    the outer tool runs, so they are classified like the graph's own (a side effect among them
    is answered by the branch's guard, and can be named as one)."""
    known = {id(t) for t in tools}
    names = {t.name for t in tools if isinstance(t, BaseTool)}  # one name is one tool to CAR
    out: dict[str, BaseTool] = {}
    todo = [t for t in tools if isinstance(t, BaseTool)]
    while todo:
        tool = todo.pop()
        for part in ("func", "coroutine"):
            fn = getattr(tool, part, None)
            if not callable(fn):
                continue
            found = list(reach(fn).tools.items())
            for app in named_objects(fn, _is_graph):  # a sub-agent the tool runs
                found += _graph_tools(app)
            for name, inner in found:
                if id(inner) not in known and name not in names:
                    known.add(id(inner))
                    out.setdefault(name, inner)
                    todo.append(inner)
    return out


def _is_graph(v: Any) -> bool:
    return hasattr(v, "get_subgraphs") and hasattr(v, "builder")


def _graph_tools(app: Any) -> list[tuple[str, Any]]:
    """The tools of a compiled graph another tool's code runs: its tool nodes' and those its
    other nodes reach, at every level."""
    graphs = {"": app, **dict(app.get_subgraphs(recurse=True))}
    specs = [spec for g in graphs.values()
             for spec in getattr(getattr(g, "builder", None), "nodes", {}).values()]
    out: list[tuple[str, Any]] = []
    for spec in specs:
        node = tool_node(spec.runnable)
        out += (list(getattr(node, "tools_by_name", {}).items()) if node is not None
                else list(reach(spec.runnable).tools.items()))
    return out


def tool_node(runnable: Any) -> ToolNode | None:
    """The ToolNode a graph node runs: the node's runnable itself, or the one it wraps with
    fallbacks (``ToolNode(tools).with_fallbacks([handler])``, LangGraph's customer-support
    tutorial), whose fallbacks only answer the tool errors it raises."""
    if isinstance(runnable, RunnableWithFallbacks):
        runnable = runnable.runnable
    return runnable if isinstance(runnable, ToolNode) else None


def _async_only(obj: Any) -> bool:
    """A node or tool that has only a coroutine: an ``async def`` node, a ``StructuredTool``
    made from an ``async def`` (what langchain-mcp-adapters loads MCP tools as)."""
    if isinstance(obj, BaseTool):
        return getattr(obj, "func", True) is None and getattr(obj, "coroutine", None) is not None
    if isinstance(obj, RunnableWithFallbacks):  # forwards attributes it may fail to read
        return _async_only(obj.runnable) or any(_async_only(f) for f in obj.fallbacks)
    return getattr(obj, "func", True) is None and getattr(obj, "afunc", None) is not None
