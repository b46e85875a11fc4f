"""Tools whose own code reaches another tool, or a whole agent: what a branch must not run live.

A branch guards the tool calls the agents' models make (``branch.CarBranchTool``), and a safe
tool runs live there. Its code may call another tool object itself (``audit_tool.call(...)``),
the Python function behind another tool, or run another agent (``await billing.run(...)``)
whose tools are none of the workflow's: in a user trial a lookup named safe wrote four real
audit lines, and a billing sub-agent issued five real refunds, in one attribution each.

``reaches`` reads each tool's function for the tool objects and agents it names
(``named_objects``); the tools those agents can call join the tools the user classifies.
``refuse_nested`` refuses, by name and before any branch, a tool a branch would run live whose
code reaches a side-effect tool that nothing could answer there: a tool object or agent tool
with no simulator (a side-effect tool's own function, called as a plain function, is refused
by ``refuse_side_effect_functions``, on every adapter). For
what reading the code misses (an object reached through another module), the branches keep a
net: a side-effect tool object called by code rather than by a model is answered by its
simulator or an identical recorded call, or stops the branch (``branch.guard_nested_calls``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.tools import BaseTool, FunctionTool

from car_core.errors import AdapterError

from ..common.messages import ToolSafety
from ..common.named import named_objects
from .recorder import is_agent_workflow, tool_names


@dataclass(frozen=True)
class Reach:
    """What one tool's code reaches: tool objects (by name), and agents (by name, with the
    tools each can call)."""

    tools: tuple[str, ...] = ()
    agents: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def names(self) -> set[str]:
        """Every tool name this code can reach."""
        return {*self.tools, *(n for ts in self.agents.values() for n in ts)}


def _as_tool(t: Any) -> BaseTool:
    return t if isinstance(t, BaseTool) else FunctionTool.from_defaults(t)


def _name(tool: BaseTool) -> str:
    return tool.metadata.name or ""


def reaches(agents: Mapping[str, Any]) -> dict[str, Reach]:
    """Per tool of ``agents`` whose code names another tool or an agent, what it reaches."""
    tools = tool_objects(agents)
    own = {id(a) for a in agents.values()}

    def wanted(v: Any) -> bool:
        return isinstance(v, BaseTool) or (is_agent_workflow(v) and id(v) not in own)

    out: dict[str, Reach] = {}
    for name, tool in tools.items():
        if not isinstance(tool, FunctionTool):
            continue
        found = named_objects(tool.real_fn, wanted)
        objects = sorted({_name(v) for v in found if isinstance(v, BaseTool)} - {name})
        runs = {str(getattr(v, "name", type(v).__name__)):
                tuple(sorted({n for ns in tool_names(v).values() for n in ns}))
                for v in found if is_agent_workflow(v) and id(v) not in own}
        if objects or runs:
            out[name] = Reach(tuple(objects), runs)
    return out


def tool_objects(agents: Mapping[str, Any]) -> dict[str, BaseTool]:
    """The tool objects of ``agents`` by name (a plain function made a ``FunctionTool``)."""
    return {_name(t): t for a in agents.values() for t in map(_as_tool, a.tools or ())}


def functions(agents: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
    """The Python function behind each function tool of ``agents`` (tool name -> function)."""
    return {n: (t.real_fn,) for n, t in tool_objects(agents).items() if isinstance(t, FunctionTool)}


def refuse_nested(reach: Mapping[str, Reach], safety: ToolSafety) -> None:
    """Refuse each tool a branch runs live (not a side effect) whose code reaches a
    side-effect tool nothing could answer there (module docstring)."""
    for name, r in sorted(reach.items()):
        if safety.guards(name):
            continue  # answered from the record or a simulator: its code never runs
        objects = [n for n in r.tools if safety.guards(n) and n not in safety.simulators]
        inner = {a: [n for n in ts if safety.guards(n) and n not in safety.simulators]
                 for a, ts in r.agents.items()}
        inner = {a: ts for a, ts in inner.items() if ts}
        if objects or inner:
            what = (f"calls side-effect tool(s) {objects} itself" if objects else
                    f"runs agent(s) {sorted(inner)} in its own code, which can call "
                    f"side-effect tool(s) {sorted({n for ts in inner.values() for n in ts})}")
            names = objects or sorted({n for ts in inner.values() for n in ts})
            raise AdapterError(
                f"tool {name!r} {what}: a branch runs {name!r} live, and those calls are "
                "not the model's tool calls the record answers, so a branch would stop there",
                hint=f"classify {name!r} in side_effect_tools=[...] (branches then get the "
                     "answer the record got, and its code does not run), or pass "
                     f"simulators={{{names[0]!r}: fn(arguments), ...}} for "
                     f"{', '.join(map(repr, names))}")


def all_names(workflow: Any, reach: Mapping[str, Reach]) -> set[str]:
    """The tools a user classifies: the workflow's agents' own, and those their tools'
    code reaches."""
    own = {n for names in tool_names(workflow).values() for n in names}
    return own | {n for r in reach.values() for n in r.names}


__all__ = ["Reach", "all_names", "functions", "reaches", "refuse_nested", "tool_objects"]
