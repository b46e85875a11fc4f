"""What a LangGraph app's own objects say about its tools, before the user's lists are read.

Three sources, read once when ``LangGraphAgent`` is built (the walk only reads attributes):

- **MCP.** A tool that ``langchain-mcp-adapters`` loaded from an MCP server is a
  ``StructuredTool`` whose coroutine is the adapter's own ``call_tool`` closure, holding the
  server's ``mcp.types.Tool`` (and the adapter copies the server's annotations into the tool's
  ``metadata``). It is safe only when the server annotates it ``readOnlyHint: true``; any other
  annotation, or none, makes it a side effect, as the MCP specification defaults. A tool is
  taken for an MCP tool by that origin, never by its metadata alone: a plain tool may carry
  metadata too, and an unannotated MCP tool carries none.
- **Human approval.** A tool named in a ``HumanInTheLoopMiddleware``'s ``interrupt_on`` asks a
  person before it runs: it is a side effect.
- **Handoffs.** A ``langgraph-supervisor`` / ``langgraph-swarm`` handoff tool (marked, as those
  libraries mark and find them, by ``metadata["__handoff_destination"]``) only routes the
  conversation to another agent of the app: it is safe, and must run on a branch for the branch
  to route as the app does.
- **Structured output.** The tools ``create_agent(response_format=...)`` offers the model for
  its answer (``ToolStrategy``'s schemas, and a raw schema's, offered as tools wherever the
  model has no provider output) never run: the agent's model node parses their calls into
  ``structured_response``. They are safe, whatever the strategy.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any, get_origin, get_type_hints

from langchain_core.tools import BaseTool
from langchain_core.tools.base import _is_injected_arg_type
from langgraph.prebuilt import InjectedState, ToolRuntime

from car_core.errors import AdapterError

from ..common.messages import SAFE, SIDE_EFFECT, Classified, mcp_classified, takes_state
from ..common.named import code_names
from .shape import AppShape

_MCP_ADAPTER = "langchain_mcp_adapters"
_HANDOFF = "__handoff_destination"  # the metadata key langgraph-supervisor and -swarm set


def _server_tool(tool: BaseTool) -> Any | None:
    """The ``mcp.types.Tool`` a ``langchain-mcp-adapters`` tool was converted from, or None
    for a tool of any other origin."""
    fn = getattr(tool, "coroutine", None)
    if not str(getattr(fn, "__module__", "") or "").startswith(_MCP_ADAPTER):
        return None
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if (type(value).__module__.split(".")[0] in ("mcp", "mcp_types")
                and hasattr(value, "inputSchema") and hasattr(value, "annotations")):
            return value
    return tool  # the adapter's tool, its server's Tool out of reach: read its metadata


def mcp_tool_class(tool: BaseTool) -> Classified | None:
    """What ``tool`` is by its MCP server's annotations, or None when it does not come from
    an MCP server."""
    source = _server_tool(tool)
    if source is None:
        return None
    if source is tool:  # the annotations the adapter copied into the metadata, if any
        meta = {k: v for k, v in (tool.metadata or {}).items() if k != "_meta"}
        return mcp_classified(meta or None)
    return mcp_classified(getattr(source, "annotations", None))


def approval_gated(shape: AppShape) -> dict[str, str]:
    """Tool name -> the middleware that asks a person to approve its calls."""
    out: dict[str, str] = {}
    for reached in shape.reaches.values():
        for mw in reached.middleware:
            gated = getattr(mw, "interrupt_on", None)
            if isinstance(gated, dict):
                for name in gated:
                    out.setdefault(str(name), type(mw).__name__)
    return out


def tool_objects(shape: AppShape, node_tools: Iterable[Any]) -> list[BaseTool]:
    """Every tool object the app can call: its ``ToolNode``s', those a node's code reaches,
    the ones given as ``node_tools``, and those only a tool's code calls."""
    found: list[BaseTool] = []
    for node in shape.tool_nodes.values():
        found += [t for t in (getattr(node, "tools_by_name", None) or {}).values()
                  if isinstance(t, BaseTool)]
    for reached in shape.reaches.values():
        found += list(reached.tools.values())
    found += [t for t in node_tools if isinstance(t, BaseTool)]
    found += list(shape.nested.values())
    return found


def _forwards(tool: Any) -> bool:
    """Whether ``tool`` is the one ``langgraph_supervisor.create_forward_message_tool`` makes,
    known by its name and the module of its function (it carries no handoff metadata)."""
    fn = getattr(tool, "func", None)
    return (getattr(tool, "name", None) == "forward_message"
            and getattr(fn, "__module__", "") == "langgraph_supervisor.handoff")


def derived_classes(shape: AppShape, node_tools: Iterable[Any]) -> dict[str, list[Classified]]:
    """Tool name -> what the app's objects say of it (MCP annotations, handoffs, structured
    output, approval gates)."""
    out: dict[str, list[Classified]] = {}
    for tool in tool_objects(shape, node_tools):
        said = mcp_tool_class(tool)
        if said is not None:
            out.setdefault(tool.name, []).append(said)
        target = (tool.metadata or {}).get(_HANDOFF)
        if target is not None:
            out.setdefault(tool.name, []).append(Classified(
                SAFE, f"it hands the conversation to agent {target!r} of the app (a handoff: "
                      "it changes nothing outside the app)"))
        elif _forwards(tool):
            out.setdefault(tool.name, []).append(Classified(
                SAFE, "langgraph-supervisor's forward_message: it copies a worker's message "
                      "into the conversation (it changes nothing outside the app)"))
    for name in sorted({n for reached in shape.reaches.values() for n in reached.structured}):
        out.setdefault(name, []).append(Classified(
            SAFE, "create_agent's structured output: the model node parses a call of it into "
                  "structured_response, and it never runs"))
    for name, who in approval_gated(shape).items():
        out.setdefault(name, []).append(Classified(
            SIDE_EFFECT, f"{who} asks a person to approve each call of it"))
    return out


def refuse_state_blind_answers(tools: Mapping[str, BaseTool], safety: Any) -> None:
    """Refuse a side-effect tool that reads graph state (``InjectedState``) unless its simulator
    takes ``ctx``: a branch's call is answered from the record by its model arguments alone,
    blind to that state, so a branch whose state differs gets the recorded result (an audit's
    refund tool refunded ``state["approved"]``; a branch that approved 40 read "refunded 900",
    and CAR said no step caused the failure where the approval rescued half). A simulator that
    takes ``ctx`` is handed the injected values. A tool that runs live sees its state. A
    ``ToolRuntime`` parameter counts where the tool's code reads an attribute ``state`` (of
    the runtime, as far as the code's names tell): most tools read its ``context``, which
    branches keep, and refusing every ``ToolRuntime`` would refuse most ``create_agent``
    apps' side-effect tools."""
    for name, tool in sorted(tools.items()):
        if not safety.guards(name):
            continue
        read = _state_params(tool)
        simulator = safety.simulators.get(name)
        if read and (simulator is None or not takes_state(simulator)):
            raise AdapterError(
                f"side-effect tool {name!r} reads graph state ({read[0]}): a "
                "branch's call of it is answered by its model arguments alone, blind to that "
                "state, so a branch whose state differs would get the recorded result",
                hint=f"pass simulators={{{name!r}: fn(arguments, ctx)}}: ctx holds the values "
                     "LangGraph injects (by argument name), to answer as the tool would")


def _state_params(tool: BaseTool) -> list[str]:
    """How ``tool``'s function reads the graph state, one phrase a parameter: an
    ``InjectedState`` one, or a ``ToolRuntime`` one whose ``state`` the code reads."""
    fn = getattr(tool, "func", None) or getattr(tool, "coroutine", None)
    if fn is None:
        return []
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception:  # annotations that cannot be evaluated: nothing read as state
        return []
    hints.pop("return", None)
    said = [f"InjectedState {k!r}" for k, v in hints.items()
            if _is_injected_arg_type(v, injected_type=InjectedState)]
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is not None and "state" in code_names(code):
        said += [f"ToolRuntime {k!r}, whose state it reads" for k, v in hints.items()
                 if _is_runtime(k, v)]
    return said


def _is_runtime(name: str, hint: Any) -> bool:
    """Whether LangGraph hands this parameter the ``ToolRuntime``: annotated so (bare or
    parametrised), or named ``runtime``, as ``ToolNode`` finds it."""
    kind = get_origin(hint) or hint
    return name == "runtime" or (isinstance(kind, type) and issubclass(kind, ToolRuntime))
