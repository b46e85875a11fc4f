"""``OpenAIAgentsAgent``: an OpenAI Agents SDK app (an ``Agent`` and its handoffs) as a CAR agent.

A branch at step ``k`` re-enters the app the SDK's own way: ``Runner.run`` under the agent that was
active at ``k`` (after any handoffs), with the input items that step saw (rebuilt from the edited
messages under ``do_context``: the first system message is the step's instructions, any other, such
as one ``car.add_instruction`` adds, a system input item in its place; edited descriptions of the
tools the step was offered, ``meta["tools"]``, are given to its model call alone). Steps before
``k`` are copied from the record: no model call, no tool call, and input guardrails (which ran on
the user's input at step 0) do not run again; output guardrails and ``max_turns`` (less the turns
the prefix used) apply as in the recorded run. The branch runs on copies of the agents
(``branch.clone_app``), so the user's agent objects are never changed (a side-effect tool's own
object answers a call from a branch's code while it runs: ``originals``) and branches run
concurrently, each with a fresh run context equal to the one step ``k`` was decided with
(``_context``). A branch is one coroutine on the adapter's branch loop (where model clients stay
bound): ``abranch`` awaits it there, so the asyncio executor overlaps many branches' waits on the
model server (the default when a model waits on one: ``prefers_concurrency``, sharing the model
object and any rate limiter it holds), and ``branch`` finishes the same coroutine from sync code.
``do_policy(k, model)`` swaps the model of the agent that decides step ``k`` (for its decisions from
``k`` on); the other agents keep theirs unless ``policy_agents`` says otherwise. A model server that
is down or failing (refused connection, timeout, 429, 5xx) stops the attribution with
``ModelUnavailable``, resumable, as on every adapter. A branch whose safe tool raised, live, where
CAR cannot show the error was the call's own (the record's identical call was answered, the error
was an outage, the same call answers when run again, or the record's answered call errors now too)
comes back with status error (``_drift``): the tool's world changed, so it is never scored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from agents import Agent, RunConfig, RunContextWrapper, Runner
from agents.exceptions import (
    MaxTurnsExceeded,
)
from agents.handoffs import Handoff
from agents.handoffs.history import get_conversation_history_wrappers
from agents.models.interface import Model
from agents.run import DEFAULT_MAX_TURNS
from agents.tool import FunctionTool, HostedMCPTool, default_tool_error_function

import car_core as car
from car_core.contract import (
    Noise,
    Origin,
    Plan,
    RunStatus,
    compile_plan,
    offered_tools,
    redact,
    state_of,
)
from car_core.errors import AdapterError, CarError, InvalidInput, InvalidIntervention

from ..common.branch import areentered, check_forced_tools, check_recorded_tools, renumber
from ..common.messages import (
    ToolSafety,
    apply_edit,
    calls_of,
    edited_messages,
    forced_observations,
    recorded_calls,
)
from ..common.named import refuse_side_effect_functions
from ..common.offered_tools import edited_descriptions
from ..common.sources import Drift, Reruns, drifted_tools, reads_as_outage, result_text
from ..common.sync import BranchLoop, run_on, run_sync
from . import agent_tools, mcp_tools, originals
from . import handoff_callbacks as handoff_callbacks_
from ._context import (
    NOT_GIVEN,
    ContextFactory,
    ContextRebuilder,
    refuse_shared_context,
    replayable_writes,
)
from ._items import to_dicts, to_items
from .app import agents_of, handoff_target, tool_names
from .branch import BranchSession, Decided, clone_app, noting, noting_formatter
from .fingerprint import app_fingerprint
from .guardrails import tripwire_of, unseen_guardrails
from .offered_tools import as_given
from .recorder import CarRecorder
from .reruns import branch_reruns

# The one event loop every branch runs on, in a daemon thread of its own. A model's async
# client (``AsyncOpenAI``'s connection pool) binds to the loop it first ran on and fails on any
# other, so a loop per branch would make each branch's first call fail (and the branch be
# retried: every model call paid twice).
_BRANCH_LOOP = BranchLoop("car-openai-agents-branches")
_MAX_TURNS = re.compile(r"^MaxTurnsExceeded\(['\"]Max turns \((\d+)\) exceeded")


def stopped_at_max_turns(run: car.Trajectory) -> int | None:
    """The ``max_turns`` a recorded run stopped at (the SDK's ``MaxTurnsExceeded`` says it in
    its message, which the run's error keeps), or None. A trial's app ran with
    ``max_turns=2``: every run stopped there, branches at the default went on to reply, and
    a step was said to avoid the failure in every re-run where nothing could."""
    found = _MAX_TURNS.match(run.error or "")
    return int(found.group(1)) if found else None
# what the SDK tells the model in place of a tool's error unless the tool or run words it
_DEFAULT_FAILURE = default_tool_error_function(RunContextWrapper(context=None), Exception())


def _car_error_in(exc: BaseException) -> BaseException | None:
    """A ``CarError`` or ``Decided`` the SDK may have wrapped in its own exception."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 10:
        if isinstance(cur, (CarError, Decided)):
            return cur
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None


def unsupported(agents: Mapping[str, Any], run_config: RunConfig) -> list[str]:
    """The features of the app a branch cannot replay faithfully, by name."""
    out = []
    for name, a in agents.items():
        for t in a.tools or ():
            if isinstance(t, HostedMCPTool):
                out.append(f"agent {name!r}: tool {t.name!r} is a HostedMCPTool (OpenAI's "
                           "servers call it, so CAR can neither see nor guard its calls; "
                           "connect the MCP server with mcp_servers=[...] instead)")
            elif not isinstance(t, FunctionTool):
                out.append(f"agent {name!r}: tool {getattr(t, 'name', '?')!r} is a "
                           f"{type(t).__name__} (only function tools can be served on a branch)")
        out += mcp_tools.unsupported_servers(name, a)
        for h in a.handoffs or ():
            if isinstance(h, Handoff) and handoff_target(h) is None:
                out.append(f"agent {name!r}: handoff {h.tool_name!r} keeps no reference to its "
                           "agent")
    if run_config.call_model_input_filter is not None:
        out.append("run_config.call_model_input_filter (the recorded input is already "
                   "filtered, and a branch would filter it again: record and attribute the app "
                   "without it)")
    return out


def _check_input_kept(run: car.Trajectory) -> None:
    """Refuse a run whose model input was rewritten between two turns of one agent: the SDK
    hands a turn the previous one's input and what it added, so an input that does not start
    with the previous one was cut or changed by something a branch does not replay (a
    ``RunConfig(call_model_input_filter=...)``: a user trial's factory left the run config out
    and its branches' model saw 3 and 5 items where the run's saw 2)."""
    for j in range(1, len(run.steps)):
        before, after = run.steps[j - 1].meta, run.steps[j].meta
        if before.get("agent") != after.get("agent") or before.get("handoff"):
            continue
        a, b = before.get("input_items"), after.get("input_items")
        if isinstance(a, list) and isinstance(b, list) and b[:len(a)] != a:
            raise AdapterError(
                f"the model's input at step {j} does not continue step {j - 1}'s (it saw "
                f"{len(b)} item(s) after {len(a)}): something rewrote it between the turns, a "
                "RunConfig(call_model_input_filter=...) or a trimmed session, which CAR does "
                "not replay, so branches would hand the model another input", run_id=run.id,
                step=j, hint="attribute the app without the filter (record the run without it)")


def custom_input_filters(agents: Mapping[str, Any]) -> tuple[str, ...]:
    """The caveat of handoffs with an ``input_filter`` of the user's: a branch starts
    ``Runner.run`` with the history up to its step as input, so such a filter sees the run's
    own items before the branch step in ``input_history``, not in ``pre_handoff_items`` /
    ``new_items`` as the run's filter did (a user trial's filter that dropped the run's items
    kept them on branches). The SDK's ``handoff_filters`` treat both alike."""
    found = sorted({f"{name} -> {h.tool_name}" for name, a in agents.items()
                    for h in a.handoffs or () if isinstance(h, Handoff)
                    and h.input_filter is not None
                    and getattr(h.input_filter, "__module__", "") !=
                    "agents.extensions.handoff_filters"})
    if not found:
        return ()
    return (f"handoff input filters of your own ran on branches ({', '.join(found)}), which "
            "see the run's items before the branch step as input history, not as the items "
            "generated before the handoff: a filter that treats those differently hands the "
            "next agent another input than the run's did",)


def waits_on_a_server(agents: Mapping[str, Any], run_config: RunConfig | None = None) -> bool:
    """Whether a branch's decisions wait on a model server: the model each agent decides
    with (the run config's, when it names one, as the SDK picks it) that says ``remote``
    (CAR's ``ScriptedModel`` says False unless it was given a latency) is taken at its word;
    any other ``Model``, or a model name the run config's provider resolves, is a client of a
    server."""
    chosen = run_config.model if run_config is not None else None
    for a in agents.values():
        model = chosen if chosen is not None else a.model
        remote = getattr(model, "remote", None) if isinstance(model, Model) else True
        if not isinstance(remote, bool) or remote:
            return True
    return False


def _instructions_and_items(edited: list[dict[str, Any]], recorded: str | None
                            ) -> tuple[str | None, list[dict[str, Any]]]:
    """The instructions and input items a step re-enters with from its edited messages. Where
    the recorded step had instructions, the edited first message is them (gone: ``""``); every
    other message, system messages included (``car.add_instruction`` adds one after the
    instructions), is an input item in its place, so the model sees them all, in order."""
    if recorded is None:
        return None, to_items(edited)
    if edited and edited[0]["role"] == "system":
        return str(edited[0]["content"] or ""), to_items(edited[1:])
    return "", to_items(edited)


def _used_tools(run: car.Trajectory, k: int) -> frozenset[str]:
    """The agents that made tool calls before step ``k``."""
    return frozenset(str(s.meta.get("agent")) for s in run.steps[:k]
                     if isinstance(s.action, dict) and s.action.get("tool_calls"))


async def _drift(run: car.Trajectory, new: list[car.Step], session: BranchSession,
                 reruns: Callable[[], Reruns]) -> Drift | None:
    """Why a branch cannot be scored when a safe tool it ran live raised (the session noted
    it) and CAR cannot show the error was the call's own (``sources.drifted_tools``, running
    the tool again with ``reruns``; an error the session saw was an outage never is).
    The SDK hands the model a message in place of the error and the record keeps only that
    text, so a recorded call counts as answered only where its result shows it was not an
    error: it has one, and it is neither the SDK's default failure message nor the message
    the branch's identical call was told (the same error, worded by the same function). A
    result a tool returned as text that reads as an outage counts as an error too."""
    errors = {cid: why or said for cid, (said, why) in session.errors.items()}
    for s in new:  # a tool that caught its own outage and returned it as text
        for m in s.observation if isinstance(s.observation, (list, tuple)) else ():
            text = result_text(m.get("content")) if isinstance(m, Mapping) else ""
            if reads_as_outage(text):
                errors.setdefault(str(m.get("tool_call_id")), text)
    if not errors:
        return None
    told = {(name, args): session.errors[cid][0] for s in new
            for cid, name, args in calls_of(s.action) if cid in session.errors}
    unanswered = set()
    for s in run.steps:
        results = {str(m.get("tool_call_id")): m.get("content") for m in s.observation or ()
                   if isinstance(m, Mapping)} if isinstance(s.observation, (list, tuple)) else {}
        for cid, name, args in calls_of(s.action):
            got = results.get(cid)
            if got is None or got == _DEFAULT_FAILURE or reads_as_outage(result_text(got)) or (
                    (name, args) in told
                    and result_text(got) == result_text(told[(name, args)])):
                unanswered.add(cid)
    return await drifted_tools(run.steps, unanswered, new, errors, reruns(),
                               session.outages)


def _check_forced_steps_keep_the_context(run: car.Trajectory, session: BranchSession) -> None:
    """A forced observation is served in place of running the step's tools. Where the recorded
    run context changed between that step and the next (a tool, or a hook around it, wrote
    it), the branch would go on without that write, from a context the app never had."""
    for k in session.forced_obs:
        if k + 1 >= len(run.steps):
            continue
        before = run.step(k).meta.get("run_context")
        after = run.step(k + 1).meta.get("run_context")
        if before != after:
            action = run.step(k).action
            calls = (action.get("tool_calls") or ()) if isinstance(action, dict) else ()
            names = sorted({str(c.get("function", {}).get("name")) for c in calls})
            raise InvalidIntervention(
                f"do_observation cannot replace the results of step {k} ({', '.join(names)}): "
                "the recorded run context changed while that step's tools ran, so they "
                "would not run and that write would be lost; the later steps would see a "
                "context the app never had",
                run_id=run.id, step=k,
                hint="force the step's action with do_action (its tools then run, the write "
                     "with them), or intervene at the next step")


class OpenAIAgentsAgent:
    """Wraps an OpenAI Agents SDK ``Agent`` (the one the run starts with; the agents it hands
    off to come with it) for ``car.intervene``, ``car.contrastive`` and ``car.shapley``.
    Every function tool of every agent is classified here: ``safe_tools`` run live on branches;
    ``side_effect_tools`` never run on a branch: they are answered from the record (on the
    arguments that matter: ``match_on``, see ``ToolSafety``; an identical call also replays
    the run-context write the record shows), by the simulator
    (``simulators[name](arguments)``, or ``(arguments, ctx)`` with ``ctx`` the tool's run
    context wrapper, sync or async, for a tool that writes the context), or stop the branch
    with ``SideEffectBlocked``. A tool in neither list is refused
    (``UnclassifiedTools``) unless ``unclassified="live"`` (a sandbox; every result then says
    so). Tools from the agents' MCP servers are listed before any branch and classified by
    their annotations (``readOnlyHint: true``: safe; anything else: a side effect), and tools
    that need approval are side effects: a branch answers them from the record or a
    simulator, so it never stops for approval (``mcp_tools``). The servers stay connected by
    the user while CAR attributes (call the estimator with ``await asyncio.to_thread(...)``
    from inside their ``async with`` block); hosted tools are refused (``unsupported``).
    ``max_turns`` is the one the app runs with; ``run_config`` supplies the model provider
    (for agents whose model is a name), guardrails and handoff filters.
    Each branch gets the run context the recorded step saw, rebuilt from the record; pass
    ``context_factory(recorded)`` to build it yourself (``recorded`` is the step's snapshot,
    or None for a context CAR could not record; 0.1's ``context=`` is refused, saying so).
    ``handoff_callbacks``: what branches do with a handoff's ``on_handoff`` (the user's code):
    ``"refuse"`` an app with one (the default), ``"skip"`` it, or run it ``"live"``
    (``handoff_callbacks``); the agents' ``AgentHooks`` never run on branches.
    ``policy_agents``: whose model
    ``do_policy`` swaps: ``"deciding"`` (the agent deciding its step), ``"all"``, or agent
    names.
    CAR's noise drives every branch decision (the step's stream for CAR-aware models such as
    ``ScriptedModel``, a per-step request seed for providers), so ``couples_noise`` is True;
    whether a model honours it is measured by the estimators, not assumed."""

    def __init__(self, agent: Agent[Any], *, safe_tools: Iterable[str] = (),
                 side_effect_tools: Iterable[str] = (),
                 simulators: Mapping[str, Callable[..., Any]] | None = None,
                 match_on: Mapping[str, Iterable[str] | str] | None = None,
                 max_turns: int = DEFAULT_MAX_TURNS, run_config: RunConfig | None = None,
                 context_factory: ContextFactory | None = None, context: object = NOT_GIVEN,
                 policy_agents: str | Iterable[str] = "deciding",
                 name: str | None = None, unclassified: str = "refuse",
                 handoff_callbacks: str = "refuse") -> None:
        refuse_shared_context(context)
        if not isinstance(agent, Agent):
            raise AdapterError(f"expected an agents.Agent, got {type(agent).__name__}",
                               hint="pass the Agent your app starts Runner.run with")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise InvalidInput(f"max_turns={max_turns!r} must be an int of at least 1",
                               hint="pass the max_turns your app runs with")
        self.root = agent
        self.agents = agents_of(agent)
        self.run_config = run_config or RunConfig()
        redact.register_from([self.agents, self.run_config])  # model clients' keys and headers
        refused = unsupported(self.agents, self.run_config)
        if refused:
            raise AdapterError("this app uses features CAR cannot replay: " + "; ".join(refused),
                               hint="attribute the app with each of them replaced as its "
                                    "entry says (a hosted tool: wrap what it does in a "
                                    "function tool)")
        handoff_callbacks_.check(self.agents, handoff_callbacks)
        self.handoff_callbacks = handoff_callbacks
        self._rule = ToolSafety.of(side_effect_tools, simulators, match_on, safe_tools=safe_tools,
                                   unclassified=unclassified)
        self._listing: mcp_tools.Listing | None = None
        self._originals: list[FunctionTool] = []
        self._answered_agents: dict[str, tuple[str, ...]] = {}
        self._mcp_loop: Any = None
        self._lock = threading.Lock()
        mcp_tools.note_loop(self.agents)
        try:  # built on the servers' own loop, the listing waits until the loop is free
            asyncio.get_running_loop()
            on_a_loop = bool(mcp_tools.servers_of(self.agents))
        except RuntimeError:
            on_a_loop = False
        if not on_a_loop:
            self._ready()
        self.max_turns = max_turns
        self.contexts = ContextRebuilder(self.agents.values(), context_factory)
        self.policy_agents = self._policy_scope(policy_agents)
        self.name = name or f"openai-agents:{agent.name}"
        self.couples_noise = True
        # over a model server branches default to the asyncio executor, awaited on the branch
        # loop together; an in-process model keeps the sequential one
        self.prefers_concurrency = waits_on_a_server(self.agents, self.run_config)

    def _ready(self) -> mcp_tools.Listing:
        """List the MCP servers' tools (once) and classify every tool (``self.safety``)."""
        with self._lock:
            if self._listing is not None:
                return self._listing
            listing, loop = mcp_tools.listed(self.agents)
            static = [t for a in self.agents.values() for t in a.tools or ()]
            reach = agent_tools.inside(self.agents, self.run_config)
            known = sorted({n for names in self.tool_names(listing).values() for n in names}
                           | agent_tools.inner_names(reach))
            derived = mcp_tools.derived(static, listing)
            for name, said in agent_tools.answered_inside(
                    reach, [*self._rule.side_effect_tools, *self._rule.simulators]).items():
                derived.setdefault(name, []).extend(said)
            safety = self._rule.classified(
                known, derived,
                agent=f"the app of agent {self.root.name!r}", call="OpenAIAgentsAgent(agent")
            nested = agent_tools.live_inside(reach, safety.guards,
                                             safety.safe_tools | safety.live)
            if nested:
                # the guardrail's remedy only where a guardrail is among them (a trial's
                # e-mailing agent tool was told to take the side effect out of a guardrail)
                judged = any(r.guardrail for r in reach.values()
                             if any(why.startswith(f"{r.tool} runs") for why in nested))
                raise AdapterError(
                    "this app uses features CAR cannot replay: " + "; ".join(nested),
                    hint="name each such agent tool or function tool in side_effect_tools "
                         "(a branch answers it from the record, and its agents do not run), or "
                         "name every tool of its agents in safe_tools if they only read"
                         + ("; a guardrail runs on branches with nothing to answer it from, "
                            "so take the side effect out of its agent" if judged else ""))
            functions = [t for t in static if isinstance(t, FunctionTool)]
            refuse_side_effect_functions(
                {t.name: (agent_tools.function_of(t),) for t in functions}, safety,
                objects={t.name: t for t in functions})
            gated = sorted({t.name for t in [*static, *(t for ts in listing.values() for t in ts)]
                            if isinstance(t, FunctionTool) and mcp_tools.needs_approval(t)
                            and not safety.guards(t.name)})
            if gated:
                raise AdapterError(
                    f"tools {gated} need approval but are named safe (or left to run live), so "
                    "a branch that calls one would stop and wait for a person",
                    hint="leave them out of safe_tools: a tool that needs approval is a side "
                         "effect, answered on branches from the record or a simulator")
            # the app's own objects of the tools branches answer (``originals.guarded``)
            self._originals = [t for t in [*static, *(o for r in reach.values()
                                                      for o in r.objects)]
                               if isinstance(t, FunctionTool) and safety.guards(t.name)]
            # agent tools branches answer without running their agents: no decision inside
            # them is a step (``caveats``)
            self._answered_agents = {name: r.agents for name, r in sorted(reach.items())
                                     if not r.guardrail and safety.guards(name)}
            self._safety, self._mcp_loop, self._listing = safety, loop, listing
            return listing

    @property
    def safety(self) -> ToolSafety:
        """The rule for every tool of the app, classified (``ToolSafety.classified``)."""
        self._ready()
        return self._safety

    def tool_names(self, listing: mcp_tools.Listing | None = None) -> dict[str, list[str]]:
        """``agent name -> sorted tool names``, the MCP servers' tools included."""
        if listing is None:
            listing = self._ready()
        return mcp_tools.merged(tool_names(self.root), listing)

    @property
    def caveats(self) -> tuple[str, ...]:
        """What every result must say: tools left unclassified that branches ran live, and
        handoff input filters of the user's (``custom_input_filters``)."""
        self._ready()
        answered = [f"agent tool {name!r} runs agent(s) {list(agents)} and is answered from the "
                    "record or a simulator on branches: no decision inside it is re-decided, so "
                    "a cause there is not found here (the outcome may not vary at all); to "
                    "attribute those decisions, make it a handoff or record that agent's own "
                    "runs" for name, agents in self._answered_agents.items()]
        return (*self.safety.caveats, *answered, *custom_input_filters(self.agents))

    def fingerprint(self) -> dict[str, Any]:
        """The app's agents, instructions, tools (its MCP servers' included, with their
        annotations) and handoffs (``car_adapters.openai_agents.fingerprint``): a run recorded
        from another app, or before a server's tools changed, is refused before any branch
        runs."""
        return app_fingerprint(self.root, self._ready())

    def preflight(self, run: car.Trajectory) -> None:
        """Before any branch: the tools are listed and classified, the run is one this app
        can branch, and every recorded write of a side-effect tool to the run context can be
        replayed (``replayable_writes``; a user trial's estimate was refused from inside its
        first branch instead, with a traceback)."""
        self._ready()
        self._check_run(run)
        replayable_writes(run, self.safety)

    # -- the car_core Agent protocol ----------------------------------------------------------
    def start(self, context: Any, noise: Noise) -> car.Trajectory:
        # a run from scratch is the user's own run, not a branch: its tools run for real
        self._ready()
        session = BranchSession(Plan(start=0), noise, 0, ToolSafety(), {}, None, {})
        items = context if isinstance(context, list) else str(context)
        factory = self.contexts.factory
        run = run_sync(lambda: self._drive(
            items, self.root.name, session, self.max_turns,
            run_context=factory(None) if factory is not None else None), _BRANCH_LOOP)
        return replace(run, context=context, seed=noise.seed)

    def branch(self, run: car.Trajectory, plan: Plan, noise: Noise) -> car.Trajectory:
        """``abranch``'s coroutine, finished from sync code (on the branch loop)."""
        self._ready()
        return run_sync(lambda: self._branch(run, plan, noise), _BRANCH_LOOP)

    async def abranch(self, run: car.Trajectory, plan: Plan, noise: Noise) -> car.Trajectory:
        """The branch as a coroutine: many run at once on the branch loop, each on its own
        copy of the app with its own session, so the asyncio executor overlaps their waits
        on the model server."""
        self._ready()
        return await run_on(lambda: self._branch(run, plan, noise), _BRANCH_LOOP)

    async def _branch(self, run: car.Trajectory, plan: Plan, noise: Noise) -> car.Trajectory:
        return await areentered(run, plan, noise, agent=self.name, safety=self.safety,
                                live=lambda k: self._live(run, plan, noise, k))

    async def _live(self, run: car.Trajectory, plan: Plan, noise: Noise, k: int
                    ) -> tuple[list[car.Step], car.Trajectory]:
        """The steps from ``k`` on, in their places, and the run that collected them."""
        self._check_run(run)
        items, active, system = self._state(run, k)
        system_edit = None
        descriptions: dict[str, str] = {}
        if k in plan.context_edits:
            # the edit gets the step's messages with the tools it was offered (``state_of``)
            given = apply_edit(plan.context_edits[k], state_of(run, k), run_id=run.id, step=k)
            edited = self._check_history(edited_messages(lambda _: given, [], run_id=run.id,
                                                         step=k), run.id, k)
            descriptions = edited_descriptions(run, k, offered_tools(given))
            new_system, items = _instructions_and_items(edited, system)
            if new_system != system:
                system_edit = new_system
        session = BranchSession(plan, noise, k, self.safety, recorded_calls(run.steps), run.id,
                                forced_observations(plan, run.id),
                                policy_agents=self.policy_agents,
                                writes=replayable_writes(run, self.safety))
        if system_edit is not None:  # step k decides from it; later steps from the app's own
            session.system_at[k] = system_edit
        if descriptions:  # step k's call is offered the tools so described; later calls not
            session.tools_at[k] = descriptions
        check_forced_tools(session, self.tool_names(), run.id,
                           why="the SDK writes it itself (a handoff)")
        _check_forced_steps_keep_the_context(run, session)
        # a tool's body that calls a side-effect tool's own object, on the branch or run
        # again below, is answered as the branch answers the tool (``originals``)
        with originals.guarded(self._originals, session):
            live = await self._drive(items, active, session, self.max_turns - k,
                                     keep_input_guardrails=k == 0,
                                     used_tools=_used_tools(run, k),
                                     run_context=self.contexts.at(run, k))
            steps = [self._placed(s, k + i, plan, session) for i, s in enumerate(live.steps)]
            held = run.meta.get("tripwire")
            if k > 0 and isinstance(held, dict) and held.get("kind") == "input":
                # the input guardrail judged the user's input, held from the record: it
                # stopped the recorded run, so it stops this one too
                live = replace(live, status=RunStatus.COMPLETE, error=run.error,
                               meta={**live.meta, "tripwire": held})
            drift = await _drift(run, steps, session, lambda: branch_reruns(  # only if needed
                self.agents, self._ready(), self._mcp_loop, self.safety,
                lambda: self.contexts.at(run, k)))
        if drift:  # a safe tool errored where the record was answered: never scored
            live = drift.on(live)
        return steps, live

    def redecide(self, run: car.Trajectory, k: int, noise: Noise) -> Any:
        """Decide step ``k`` again from its recorded input (one model call, no tool call)."""
        self._ready()
        self._check_run(run)
        plan = compile_plan(run, car.do_resample(k))
        session = BranchSession(plan, noise, k, self.safety, {}, run.id, {},
                                stop_after_first=True)
        items, active, _ = self._state(run, k)
        context = self.contexts.at(run, k)
        try:
            run_sync(lambda: self._drive(items, active, session, 1, keep_input_guardrails=False,
                                         used_tools=_used_tools(run, k), run_context=context),
                     _BRANCH_LOOP)
        except Decided as d:
            return d.action
        raise AdapterError("the model was not called when re-deciding the step", run_id=run.id,
                           step=k, hint="check the agent's model is an agents.Model")

    # -- internals ---------------------------------------------------------------------------
    def _policy_scope(self, given: str | Iterable[str]) -> str | frozenset[str]:
        if given in ("deciding", "all"):
            return str(given)
        names = frozenset([given] if isinstance(given, str) else given)
        unknown = sorted(names - set(self.agents))
        if unknown or not names:
            raise InvalidInput(f"policy_agents={given!r}: "
                               + (f"the app has no agent {unknown}" if unknown else "no name"),
                               hint=f'pass "deciding", "all" or names from {sorted(self.agents)}')
        return names

    @staticmethod
    def _placed(step: car.Step, k: int, plan: Plan, session: BranchSession) -> car.Step:
        """A collected step at its place; after a ``do_policy``, a step whose agent kept its
        own model is live, not swapped."""
        placed = renumber(step, k, plan, session)
        if k in session.tools_at and isinstance(placed.meta.get("tools"), list):
            # recorded from the agent's tools: the call was given them as edited
            placed = replace(placed, meta={**placed.meta, "tools": as_given(
                placed.meta["tools"], session.tools_at[k])})
        if placed.meta.get("origin") == Origin.POLICY_SWAPPED and k not in session.swapped:
            return replace(placed, meta={**placed.meta, "origin": Origin.LIVE})
        return placed

    def _check_run(self, run: car.Trajectory) -> None:
        if run.meta.get("framework") != "openai-agents":
            raise AdapterError("the run was not recorded from an OpenAI Agents SDK app",
                               run_id=run.id,
                               hint="record it with car_adapters.openai_agents.CarRecorder")
        if len(run.steps) > self.max_turns:
            raise InvalidInput(f"the run took {len(run.steps)} turns, more than max_turns="
                               f"{self.max_turns}", run_id=run.id,
                               hint="pass OpenAIAgentsAgent(..., max_turns=N) with the N your "
                                    "app runs with")
        limit = stopped_at_max_turns(run)
        if limit is not None and limit != self.max_turns:
            raise InvalidInput(
                f"the run stopped at max_turns={limit} (MaxTurnsExceeded), and this agent "
                f"branches with max_turns={self.max_turns}: its branches would not stop where "
                "the app does, so a run the app would have stopped could read as rescued",
                run_id=run.id, hint=f"pass OpenAIAgentsAgent(..., max_turns={limit}), the limit "
                                    "your app gives Runner.run")
        check_recorded_tools(run, self.tool_names())
        self.contexts.check(run)
        self._check_guardrails(run)
        self._check_nested_history(run)
        _check_input_kept(run)

    def _check_nested_history(self, run: car.Trajectory) -> None:
        """Refuse a run recorded with ``RunConfig(nest_handoff_history=True)`` (a step's input
        holds the SDK's ``<CONVERSATION HISTORY>`` summary) for an agent whose run config does
        not nest: after a handoff its branches would hand the next agent the raw history, and
        a user trial's estimate named an earlier step that did not matter, with no warning."""
        if self.run_config.nest_handoff_history:
            return
        start, _ = get_conversation_history_wrappers()
        for step in run.steps:
            for item in step.meta.get("input_items") or ():
                content = item.get("content") if isinstance(item, dict) else None
                if isinstance(content, str) and start in content:
                    raise AdapterError(
                        f"step {step.index} saw the SDK's nested handoff history ({start}): "
                        "the run was recorded with RunConfig(nest_handoff_history=True), and "
                        "this agent's run config does not nest it, so its branches would hand "
                        "the next agent another history", run_id=run.id, step=step.index,
                        hint="pass OpenAIAgentsAgent(agent, run_config=...) the RunConfig the "
                             "app runs with")

    def _check_guardrails(self, run: car.Trajectory) -> None:
        """Refuse a run whose guardrails may have stopped it unseen (``guardrails``): whether
        it failed cannot be told."""
        watched = run.meta.get("guardrails_watched")
        watched = set(watched) if isinstance(watched, list) else set()
        unseen = [g for g in unseen_guardrails(self.agents, run.meta.get("root_agent"),
                                               self.run_config) if g not in watched]
        if unseen:
            raise AdapterError(
                f"the app's {', '.join(unseen)} can stop a run after the agent replied without "
                "the SDK telling its hooks, and this run was recorded "
                + ("with it unwatched" if watched else "outside a recording block")
                + ", so CAR cannot tell whether a guardrail stopped it (and so whether it "
                "failed)", run_id=run.id,
                hint="record the run again inside `with recorder.recording(agent):` (the "
                     "starting agent, and run_config=... where the guardrails are there) "
                     "around Runner.run / run_sync / run_streamed and the loop over its "
                     "events; an input guardrail with run_in_parallel=False needs no block")

    def _state(self, run: car.Trajectory, k: int) -> tuple[list[Any], str, str | None]:
        step = run.step(k)
        items = step.meta.get("input_items")
        active = step.meta.get("agent")
        if not isinstance(items, list) or not isinstance(step.state, list):
            raise AdapterError("the recorded step has no input items to resume from",
                               run_id=run.id, step=k,
                               hint="record the run with car_adapters.openai_agents.CarRecorder")
        if active not in self.agents:
            raise AdapterError(f"the step was decided by agent {active!r}, which this app does "
                               f"not have (agents: {sorted(self.agents)})", run_id=run.id,
                               step=k, hint="wrap the Agent the run was recorded with")
        # the step's instructions head its messages; a system message among the input items
        # (the user passed one in the run's input) is one of them, not the instructions
        from_instructions = len(step.state) > len(to_dicts(None, items))
        system = step.state[0]["content"] if from_instructions else None
        return [dict(i) for i in items], str(active), system

    @staticmethod
    def _check_history(messages: list[dict[str, Any]], run_id: str, k: int
                       ) -> list[dict[str, Any]]:
        """An edited history the app can be re-entered from: some input is left."""
        if not [m for m in messages if m["role"] != "system"]:
            raise InvalidIntervention("after the edit no input message is left", run_id=run_id,
                                      step=k, hint="keep the user's message (edit its content)")
        return messages

    def _models(self) -> dict[str, Model]:
        """The model each agent decides with, as the SDK picks it: the run config's model,
        when it has one, for every agent (an audit's branches called each agent's own model
        where the app's runs never did, and found no cause), else the agent's own."""
        out = {}
        provider = self.run_config.model_provider
        chosen = self.run_config.model
        for name, a in self.agents.items():
            model = chosen if chosen is not None else a.model
            out[name] = model if isinstance(model, Model) else provider.get_model(model)
        return out

    async def _drive(self, items: Any, active: str, session: BranchSession, max_turns: int, *,
                     keep_input_guardrails: bool = True,
                     used_tools: frozenset[str] = frozenset(), run_context: Any = None
                     ) -> car.Trajectory:
        """Run the app's copy from ``items`` under ``active``: the branch's one coroutine,
        whether ``branch``, ``abranch``, ``start`` or ``redecide`` asked for it."""
        listing = self._ready()
        served = {a: [mcp_tools.served_on(noting(t, session), self._mcp_loop, session.failed)
                      for t in ts] for a, ts in listing.items()}
        clones = clone_app(self.agents, self._models(), session,
                           keep_input_guardrails=keep_input_guardrails, used_tools=used_tools,
                           mcp=served, skip_callbacks=self.handoff_callbacks == "skip")
        collector = CarRecorder()
        config = dataclasses.replace(
            self.run_config, model=None, tracing_disabled=True,
            input_guardrails=self.run_config.input_guardrails if keep_input_guardrails else None,
            tool_error_formatter=noting_formatter(session, self.run_config.tool_error_formatter))

        try:
            await Runner.run(clones[active], items, context=run_context,
                             max_turns=max_turns, hooks=collector, run_config=config)
        except Exception as exc:
            inner = _car_error_in(exc)
            if inner is not None:
                raise inner from None
            session.raise_blocked()
            collector.close(exc)
            return self._collected(collector, exc)
        session.raise_blocked()
        return self._collected(collector, None)

    def _collected(self, collector: CarRecorder, exc: BaseException | None) -> car.Trajectory:
        runs = collector.runs
        status = RunStatus.MAX_STEPS if isinstance(exc, MaxTurnsExceeded) else RunStatus.ERROR
        tripwire = tripwire_of(exc)
        meta: dict[str, Any] = {}
        if tripwire is not None:
            # the app stopped the run by design, as a recording block records it: an outcome
            # to score (``meta["tripwire"]`` says which guardrail), not a crash to leave out
            status, meta = RunStatus.COMPLETE, {"tripwire": tripwire}
        if runs and exc is not None:
            # the SDK calls on_agent_end before its output guardrails run, so a tripwire
            # arrives after the hooks closed the run as complete
            return replace(runs[-1], status=status, error=repr(exc),
                           meta={**runs[-1].meta, **meta})
        if runs:
            return runs[-1]
        return car.Trajectory.new(context=None, steps=[], status=status, meta=meta,
                                  error=repr(exc) if exc is not None else "no model call")
