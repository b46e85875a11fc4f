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
never answered from the record (``guardrails.judges``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from agents.tool import FunctionTool

from ..common.messages import SIDE_EFFECT, Classified
from .app import agents_of
from .guardrails import judges


def nested_agent(tool: Any) -> Any:
    """The agent an agent tool runs (``None`` for any other tool)."""
    if getattr(tool, "_is_agent_tool", False):
        return getattr(tool, "_agent_instance", None)
    return None


@dataclass(frozen=True)
class Inside:
    """What an agent tool's call can reach: the nested agents (through their handoffs and their
    own agent tools), the tools they can call, and what a branch could not guard there."""

    tool: str
    agents: tuple[str, ...]
    tools: tuple[str, ...]
    unsupported: tuple[str, ...]
    guardrail: bool = False  # a guardrail's agents: run on branches, never answered


def inside(agents: Mapping[str, Any], run_config: Any = None) -> dict[str, Inside]:
    """Every agent tool of the app's agents, by tool name, and every guardrail that runs an
    agent, by its label, with what its call can reach."""
    out: dict[str, Inside] = {}
    for a in agents.values():
        for t in a.tools or ():
            root = nested_agent(t)
            if root is not None:
                out[str(t.name)] = _reach(str(t.name), [root])
    for name, roots in judges(agents, run_config).items():
        out[name] = replace(_reach(name, roots), guardrail=True)
    return out


def _reach(name: str, roots: list[Any]) -> Inside:
    seen: dict[str, Any] = {}
    tools: set[str] = set()
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
                deeper = nested_agent(t)
                if deeper is not None:
                    todo.append(deeper)
                elif not isinstance(t, FunctionTool):
                    odd.append(f"agent {agent_name!r} has a {type(t).__name__}")
    return Inside(name, tuple(sorted(seen)), tuple(sorted(tools)), tuple(odd))


def inner_names(reach: Mapping[str, Inside]) -> set[str]:
    """The tools only agent tools' nested runs can call (names a user may classify)."""
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
                    SIDE_EFFECT, f"it runs only inside agent tool {r.tool!r}, which branches "
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
                   else f"agent tool {r.tool!r} would run agent(s) {list(r.agents)} live on a "
                        "branch")
            out.append(f"{who}, which call{'' if len(r.agents) > 1 else 's'} "
                       f"{what}{' and ' if what and odd else ''}{odd}: a branch cannot guard "
                       "tools inside a nested run")
    return out
