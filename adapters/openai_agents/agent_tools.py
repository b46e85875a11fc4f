"""Agents used as tools (``agent.as_tool(...)``): what runs inside them on a branch.

An agent tool is a ``FunctionTool`` whose call runs a whole nested ``Runner.run`` of another
agent, with that agent's own model and its own tools. A branch guards the tools it is handed,
not the ones inside a nested run: an agent tool that runs live on a branch runs every tool of
its agent for real. A user trial's orchestrator, its agent tool named safe, sent 26 real
e-mails from one attribution through the nested agent's ``send_email``. So each agent tool a
branch may run is checked before any branch (``live_inside``): every tool its nested agents
can call must itself be known safe, or the agent tool must be answered from the record
(``side_effect_tools``), where its agent never runs.

A guardrail's function may run an agent the same way (the SDK's judge example), and a branch
runs the guardrail again (input guardrails from step 0, output guardrails on every branch)
with nothing to answer it from: the agents it names are checked like an agent tool's, and
never answered from the record (``guardrails.judges``).

A function tool whose own function runs an agent (``await Runner.run(billing, ...)`` in its
body) is a nested run the same way: a user trial's safe ``lookup_order`` ran its billing agent's
``refund`` for real on every branch. The agents a tool's function names are found as a
guardrail's are (``guardrails.named_agents``), and the tool counts as an agent tool of them
(``nested_agents``): refused before any branch where it would run live and its agents reach a
side effect, answered from the record where it is one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import suppress
from copy import copy
from dataclasses import dataclass, field, replace
from typing import Any

from agents.tool import FunctionTool

from ..common.messages import SIDE_EFFECT, Classified
from .app import agents_of
from .guardrails import judges, named_agents
from .originals import own_invoker


def nested_agent(tool: Any) -> Any:
    """The agent an agent tool runs (``None`` for any other tool)."""
    if getattr(tool, "_is_agent_tool", False):
        return getattr(tool, "_agent_instance", None)
    return None


def nested_agents(tool: Any) -> list[Any]:
    """The agents a tool's call may run: an agent tool's agent, or the agents a function
    tool's own function names (``named_agents``), which its body may ``Runner.run``."""
    root = nested_agent(tool)
    if root is not None:
        return [root]
    if isinstance(tool, FunctionTool):
        return named_agents(function_of(tool))
    return []


def function_of(tool: FunctionTool) -> Any:
    """The code a function tool's call runs: the function given to ``function_tool``, or the
    ``on_invoke_tool`` of a tool built by hand (under any guard CAR put there meanwhile)."""
    with suppress(AttributeError):
        return tool.__wrapped__
    own = own_invoker(tool)
    if own is not tool.on_invoke_tool:  # guarded by CAR now: a copy binds the tool's own
        with suppress(AttributeError):
            return copy(tool).__wrapped__
    return own


def kind_of(tool: Any) -> str:
    """How a tool that runs agents is named in messages."""
    return "agent tool" if nested_agent(tool) is not None else "function tool"


@dataclass(frozen=True)
class Inside:
    """What an agent tool's call can reach: the nested agents (through their handoffs and their
    own agent tools), the tools they can call, and what a branch could not guard there."""

    tool: str
    agents: tuple[str, ...]
    tools: tuple[str, ...]
    unsupported: tuple[str, ...]
    guardrail: bool = False  # a guardrail's agents: run on branches, never answered
    kind: str = "agent tool"  # or "function tool": one whose function names the agents
    # the nested agents' function tool objects (``originals.guarded`` guards them)
    objects: tuple[Any, ...] = field(default=(), compare=False, repr=False)


def inside(agents: Mapping[str, Any], run_config: Any = None) -> dict[str, Inside]:
    """Every agent tool of the app's agents (and function tool that runs agents), by tool
    name, and every guardrail that runs an agent, by its label, with what its call can
    reach."""
    out: dict[str, Inside] = {}
    for a in agents.values():
        for t in a.tools or ():
            roots = nested_agents(t)
            if roots:
                out[str(t.name)] = replace(_reach(str(t.name), roots), kind=kind_of(t))
    for name, roots in judges(agents, run_config).items():
        out[name] = replace(_reach(name, roots), guardrail=True)
    return out


def _reach(name: str, roots: list[Any]) -> Inside:
    seen: dict[str, Any] = {}
    tools: set[str] = set()
    objects: dict[int, Any] = {}
    odd: list[str] = []
    todo = list(roots)
    while todo:
        for agent_name, a in agents_of(todo.pop()).items():
            if agent_name in seen:
                continue
            seen[agent_name] = a
            if a.mcp_servers:
                odd.append(f"agent {agent_name!r} connects MCP servers")
            for t in a.tools or ():
                tools.add(str(getattr(t, "name", type(t).__name__)))
                if isinstance(t, FunctionTool):
                    objects[id(t)] = t
                    todo.extend(nested_agents(t))
                else:
                    odd.append(f"agent {agent_name!r} has a {type(t).__name__}")
    return Inside(name, tuple(sorted(seen)), tuple(sorted(tools)), tuple(odd),
                  objects=tuple(objects.values()))


def inner_names(reach: Mapping[str, Inside]) -> set[str]:
    """The tools only nested runs can call (names a user may classify)."""
    return {n for r in reach.values() for n in r.tools}


def answered_inside(reach: Mapping[str, Inside], answered: Iterable[str]
                    ) -> dict[str, list[Classified]]:
    """The nested tools of the agent tools a branch answers from the record or a simulator
    (``answered``): they never run on a branch, so nothing more need classify them."""
    names = set(answered)
    out: dict[str, list[Classified]] = {}
    for r in reach.values():
        if r.tool in names and not r.guardrail:
            for n in r.tools:
                out.setdefault(n, []).append(Classified(
                    SIDE_EFFECT, f"it runs only inside {r.kind} {r.tool!r}, which branches "
                                 "answer from the record"))
    return out


def live_inside(reach: Mapping[str, Inside], guards: Any, safe: Iterable[str]) -> list[str]:
    """Why each agent tool a branch would run live cannot run there: its nested agents call a
    side-effect tool (``guards(name)``) a branch cannot guard inside a nested run, or reach
    what CAR cannot see (MCP servers, hosted tools). Tools ``safe`` to run are fine."""
    ok = set(safe)
    out = []
    for r in reach.values():
        if not r.guardrail and guards(r.tool):
            continue
        effects = [n for n in r.tools if guards(n) or n not in ok]
        if effects or r.unsupported:
            what = (f"side-effect or unclassified tools {effects}" if effects else "")
            odd = "; ".join(r.unsupported)
            who = (f"{r.tool} runs agent(s) {list(r.agents)} on branches" if r.guardrail
                   else f"{r.kind} {r.tool!r} would run agent(s) {list(r.agents)} live on a "
                        "branch" + (" (its function names them)"
                                    if r.kind == "function tool" else ""))
            out.append(f"{who}, which call{'' if len(r.agents) > 1 else 's'} "
                       f"{what}{' and ' if what and odd else ''}{odd}: a branch cannot guard "
                       "tools inside a nested run")
    return out
