"""``LlamaIndexAgent``: a LlamaIndex agent (``FunctionAgent``, ``AgentWorkflow``) as a CAR agent.

LlamaIndex keeps no per-step checkpoints, so a branch at step ``k`` re-enters the workflow with
the message history the recorder kept for step ``k`` (edited by ``do_context``) as its chat
history, the agent that was active at ``k`` as the root agent, and a fresh ``Context`` whose
store holds what the recorder kept for step ``k`` (``store_state``), so tools reading
``ctx.store`` see what the held steps wrote. The recorded messages already carry the state
prompt the framework put on the first message, so a branch formats nothing again. An edit of
the tools' descriptions the step's model call was offered (``meta["tools"]``, a ``ChatInput``'s
``.tools``) reaches that call only (``offered_tools``); one that renames, adds or drops a tool
is refused before the branch calls anything. Steps
before ``k`` are copied from the record: no model call, no tool call. From ``k`` on, each
agent's LLM and tools are stand-ins (``branch.py``) for the duration of the branch, and a
private recorder collects the new steps through the same instrumentation as ``CarRecorder``. A
branch whose safe tool came back with an error, live, where CAR cannot show the error was the
call's own (the record's identical call was answered, the error says its service is down, the
same call answers when run again, or the record's answered call errors now too) comes back with
status error (``_drift``): the tool's world changed, so it is never scored.

A branch is one coroutine (``abranch``; ``branch`` finishes it from sync code), so the asyncio
executor runs many at once on one event loop. The stand-ins are set on the agent objects while
any branch over them runs (``branch.installed``) and each serves the branch whose task calls
it (its ``BranchSession`` is in a context variable), so branches never share a plan, noise,
step counter, system message or store; an ``AgentWorkflow`` branch starts at its active agent
through its own ``Context`` (``current_agent_name``), never by changing the workflow. Do not
run the same agent objects elsewhere while an attribution is running.

A branch has nobody to answer a human-in-the-loop tool, so one that would run live is refused
when the agent is wrapped, and a branch whose workflow asks for input anyway is stopped at the
``InputRequiredEvent`` instead of waiting (``human_input``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from llama_index.core.agent.workflow import CodeActAgent, FunctionAgent
from llama_index.core.agent.workflow.base_agent import DEFAULT_MAX_ITERATIONS
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.tools import BaseTool, FunctionTool
from llama_index.core.workflow import Context, Workflow

import car_core as car
from car_core.contract import (
    Noise,
    Plan,
    compile_plan,
    offered_tools,
    redact,
    state_of,
)
from car_core.errors import AdapterError, CarError, InvalidIntervention, UnclassifiedTools

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
from ..common.sources import Drift, Reruns, drifted_tools, tool_errors
from ..common.state_change import Change, unreplayable
from ..common.sync import run_sync
from ._messages import from_dicts
from .branch import BranchSession, collecting, installed, session_scope, unwrapped
from .fingerprint import workflow_fingerprint
from .human_input import asked_for_input, finished, refuse_live_waits, waiting_tools
from .nested import all_names, functions, reaches, refuse_nested, tool_objects
from .recorder import (
    AGENT_KINDS,
    ERRORS_MARKED,
    CarRecorder,
    agents_of,
    is_agent_workflow,
    tool_names,
)
from .reruns import branch_reruns
from .store_state import STORE_KEY, app_modules, recorded, resolved, restore, writes

MEMORY_TOKENS = 10**9  # the re-entered history must reach the model whole
# LlamaIndex's own scripted LLMs, which answer in-process.
_IN_PROCESS_LLMS = frozenset({"MockLLM", "MockFunctionCallingLLM"})


def waits_on_a_server(llm: Any) -> bool:
    """Whether ``llm``'s calls wait on a model server: an LLM that says ``remote`` (CAR's
    ``ScriptedLLM`` and the embedded ``LocalLLM`` say False; a ``ScriptedLLM`` given a latency
    says True) is taken at its word, LlamaIndex's mock LLMs answer in-process, any other LLM
    is a client of a server."""
    llm = unwrapped(llm)
    remote = getattr(llm, "remote", None)
    if isinstance(remote, bool):
        return remote
    return type(llm).__name__ not in _IN_PROCESS_LLMS


def _results(steps: Iterable[car.Step]) -> list[Any]:
    return [m for s in steps for m in (s.observation or ()) if isinstance(m, Mapping)]


async def _drift(run: car.Trajectory, new: list[car.Step], reruns: Callable[[], Reruns]
                 ) -> Drift | None:
    """Why a branch cannot be scored when a safe tool it ran live came back with an error
    (marked by its recorder) and CAR cannot show the error was the call's own
    (``sources.drifted_tools``, running the tool again with ``reruns``). The record's calls
    count as answered only where it shows they were: a result recorded unmarked by a recorder
    that marks errors; a run recorded before errors were marked shows none, so there only a
    call that answers when run again counts as drifted. ``reruns`` builds the tools' re-runs,
    only for a branch with an error to judge."""
    now = tool_errors(_results(new))
    if not now:
        return None
    results = {str(m.get("tool_call_id")) for m in _results(run.steps)}
    errored = set(tool_errors(_results(run.steps))) if run.meta.get(ERRORS_MARKED) else None
    unanswered = {cid for s in run.steps for cid, _, _ in calls_of(s.action)
                  if errored is None or cid in errored or cid not in results}
    return await drifted_tools(run.steps, unanswered, new, now, reruns())


def _check_history(messages: list[dict[str, Any]], run_id: str, k: int
                   ) -> list[dict[str, Any]]:
    """An edited history a workflow can be re-entered from: it still starts with the user."""
    rest = [m for m in messages if m["role"] != "system"]
    if not rest or rest[0]["role"] != "user":
        raise InvalidIntervention(
            "after the edit the history no longer starts with a user message",
            run_id=run_id, step=k,
            hint="keep the first user message (edit its content instead of removing it)")
    return messages


def _leading_systems(messages: list[dict[str, Any]]
                     ) -> tuple[list[str], list[dict[str, Any]]]:
    """The texts of the system messages a history starts with, and the messages after them."""
    at = 0
    while at < len(messages) and messages[at]["role"] == "system":
        at += 1
    return [str(m.get("content") or "") for m in messages[:at]], messages[at:]


def _memory_systems(agent: Any, systems: list[str]) -> list[dict[str, Any]]:
    """The leading system messages the app's memory wrote (a memory block, a system message
    it holds), which every agent of the workflow is given after its own prompt: they go in
    the branch's history, so an agent a handoff reaches on the branch sees them too (a user
    trial's payments agent lost the memory's "allowance is $250" after the handoff, and CAR
    named a step with a 100% rescue that had none). A ``FunctionAgent`` writes one system
    message, its prompt, first; with another agent (a ReAct header) all stay its own."""
    prompt = getattr(agent, "system_prompt", None)
    if prompt and systems[:1] == [prompt]:
        rest = systems[1:]
    elif not prompt and isinstance(agent, FunctionAgent):
        rest = systems
    else:
        rest = []
    return [{"role": "system", "content": text} for text in rest]


RETRY_PREFIX = "Error while parsing the output"  # a ReActAgent's retry after a parse error


def _past_retry(state: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A step's messages without the retry a ReActAgent puts after the history when it could
    not parse a reply (the user message again, the bad reply, the parse error; its reasoning
    follows): that call's input alone, never kept in memory, so the next step does not have it
    (a user trial's run with one parse error was refused as a memory that "dropped or rewrote
    messages")."""
    out = list(state)
    i = len(out) - 1
    while i >= 2:
        if ([m.get("role") for m in out[i - 2:i + 1]] == ["user", "assistant", "user"]
                and str(out[i].get("content") or "").startswith(RETRY_PREFIX)):
            del out[i - 2:i + 1]
            i -= 3
        else:
            i -= 1
    return out


def _check_memory_kept(run: car.Trajectory, k: int) -> None:
    """Refuse a branch from ``k`` when the app's memory dropped or rewrote messages at a later
    recorded step (a token limit, a summary): the branch's memory keeps every message, so its
    live steps would see a history the app's memory would not have given them. Kept means each
    step's messages start with the previous step's (system prompts aside where a handoff
    changed the agent)."""
    for j in range(k + 1, len(run.steps)):
        before, after = run.steps[j - 1], run.steps[j]
        if not isinstance(before.state, list) or not isinstance(after.state, list):
            continue
        same_agent = before.meta.get("agent") == after.meta.get("agent")
        a = [m for m in _past_retry(before.state) if same_agent or m.get("role") != "system"]
        b = [m for m in _past_retry(after.state) if same_agent or m.get("role") != "system"]
        if b[:len(a)] != a:
            raise AdapterError(
                f"the app's memory dropped or rewrote messages before step {j} (it saw "
                f"{len(b)} messages after {len(a)} at step {j - 1}), and a branch keeps every "
                f"message, so a branch from step {k} would not see what the app's memory "
                "gives its later steps", run_id=run.id, step=k,
                hint="record the run with a memory that holds it whole (memory="
                     "ChatMemoryBuffer.from_defaults(token_limit=...)), or branch from step "
                     f"{j} or later")


def _check_agent_workflow(agent: Any) -> None:
    """Refuse, before anything runs, a workflow CAR cannot branch: a branch re-enters an agent
    workflow at one of its agent steps, and a custom ``Workflow`` (``@step`` methods of its
    own) has none, so its runs are recorded with no step and its branches would decide
    nothing. Anything else without ``run`` is no workflow at all."""
    if is_agent_workflow(agent):
        return
    if isinstance(agent, Workflow):
        raise AdapterError(
            f"a custom Workflow ({type(agent).__name__}) is not an agent workflow CAR can "
            f"branch: CAR records and branches {AGENT_KINDS}, whose agent steps a branch "
            "re-enters, and a run of this one records no step",
            hint="build the app from those agents (FunctionAgent(tools=[...], llm=...)); where "
                 "your workflow runs such an agent inside a step, wrap that agent: each of its "
                 "runs is recorded as a run of its own")
    raise AdapterError(f"expected a LlamaIndex agent workflow, got {type(agent).__name__}",
                       hint=f"pass one of {AGENT_KINDS}")


def _check_agents(agents: Mapping[str, Any]) -> None:
    """Refuse, before anything runs, an agent whose decisions the record misses: a
    ``CodeActAgent`` runs the code its model writes, calling the tools inside it as plain
    functions that no branch guard sees (an audit's branches failed inside it, "fix the
    agent"); ``output_cls`` / ``structured_output_fn`` ask the model once more, after the last
    step, for the structured answer, a decision no step records or re-draws (an audit's app
    got another fare in it than its reply named)."""
    for name, a in agents.items():
        if isinstance(a, CodeActAgent):
            raise AdapterError(
                f"agent {name!r} is a CodeActAgent: it runs the code its model writes, which "
                "calls the tools as plain functions no branch can answer or guard",
                hint="attribute the app with a FunctionAgent or ReActAgent over the same tools")
        for field in ("output_cls", "structured_output_fn"):
            if getattr(a, field, None) is not None:
                raise AdapterError(
                    f"agent {name!r} has {field}: after its last step it asks the model for the "
                    "structured answer, a decision no step records and no branch re-draws",
                    hint=f"attribute the app with the FunctionAgent built without {field} (parse "
                         "the structured answer from the reply in your own code)")


class LlamaIndexAgent:
    """Wraps a LlamaIndex ``FunctionAgent``, ``ReActAgent`` or ``AgentWorkflow`` for
    ``car.intervene``, ``car.contrastive`` and ``car.shapley``. Every tool of every agent is
    classified here: ``safe_tools`` run live on branches; ``side_effect_tools`` never run on a
    branch: they are answered from the record (on the arguments that matter: ``match_on``,
    see ``ToolSafety``), by ``simulators[name](arguments)``, or stop the branch. A side-effect
    tool handed the workflow ``Context`` (it writes ``ctx.store``) is answered, on an identical
    call, with its recorded result and its recorded write to the store replayed, else by a
    simulator that takes the ``Context`` too, ``fn(arguments, ctx)`` (async or not), which
    writes the store as the tool would; where the record cannot show what a call of it wrote
    and no such simulator is given, the run is refused before any branch. A tool in
    neither list is refused (``UnclassifiedTools``) unless ``unclassified="live"`` (a sandbox;
    every result then says so). ``max_iterations`` is the app's ``run(max_iterations=...)``
    (by default the run's own, as recorded, else LlamaIndex's 20): a branch from step ``k`` gets
    what is left of it after the ``k`` decisions before, as the run would have (a
    branch that counted from its own step ran past the limit the app stops at, and a user
    trial's P(fail) of 0.31 read 0.62). Refused here, before anything runs: a custom
    ``Workflow`` (no agent step to re-enter), and a tool that waits for a human
    (``ctx.wait_for_event``) where branches would run it live (``human_input``); a run whose
    workflow asks for input anyway (an ``InputRequiredEvent`` on its stream) stops there with an
    ``AdapterError``."""

    def __init__(self, agent: Any, *, safe_tools: Iterable[str] = (),
                 side_effect_tools: Iterable[str] = (),
                 simulators: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
                 match_on: Mapping[str, Iterable[str] | str] | None = None,
                 max_iterations: int | None = None, name: str | None = None,
                 unclassified: str = "refuse") -> None:
        _check_agent_workflow(agent)
        _check_agents(agents_of(agent))
        self.workflow = agent
        redact.register_from(agent)  # its LLMs' keys are never stored, rendered or printed
        self.safety = ToolSafety.of(side_effect_tools, simulators, match_on,
                                    safe_tools=safe_tools, unclassified=unclassified)
        self.max_iterations = max_iterations
        self.name = name or f"llamaindex:{type(agent).__name__}"
        self._with_context: dict[str, str] | None = None
        self._check_side_effect_names()
        refuse_live_waits(waiting_tools(self._agents()), self.safety)
        llms = [unwrapped(a.llm) for a in self._agents().values()]  # a branch's may be in place
        self.couples_noise = all(getattr(llm, "uses_car_noise", False) for llm in llms)
        # over a model server branches default to the asyncio executor (awaited together on
        # its loop); in-process models keep the sequential one
        self.prefers_concurrency = any(waits_on_a_server(llm) for llm in llms)

    @property
    def caveats(self) -> tuple[str, ...]:
        """What every result must say: tools left unclassified that branches ran live."""
        return self.safety.caveats

    def _check_side_effect_names(self) -> None:
        """Every tool of every agent of the workflow is classified (a name the user gives must
        be a tool of one of them), or the real tool would run unchecked on every branch. An
        agent that picks its tools with a ``tool_retriever`` has tools nobody can list."""
        for name, a in self._agents().items():
            if getattr(a, "tool_retriever", None) is None:
                continue
            if self.safety.side_effect_tools or self.safety.safe_tools:
                raise AdapterError(
                    f"agent {name!r} picks its tools with a tool_retriever, so its tools "
                    "cannot be checked or guarded on branches",
                    hint="give the agent tools=[...] for attribution")
            if self.safety.unclassified != "live":
                raise UnclassifiedTools(
                    f"agent {name!r} picks its tools with a tool_retriever, so CAR cannot "
                    "classify them as safe to run on a branch or as side effects, and no "
                    "branch runs", tools=[f"tool_retriever of {name}"],
                    hint='give the agent tools=[...] and name them in safe_tools=[...] / '
                         'side_effect_tools=[...], or pass unclassified="live" where every '
                         "tool may run for real (a sandbox)")
        reach = reaches(self._agents())
        given = all_names(self.workflow, reach)
        retrievers = {f"the tools agent {n!r}'s tool_retriever picks" for n, a in
                      self._agents().items() if getattr(a, "tool_retriever", None) is not None}
        self.safety = self.safety.classified(
            given, agent=f"the {type(self.workflow).__name__}", call="LlamaIndexAgent(agent")
        if retrievers:
            self.safety = replace(self.safety, live=self.safety.live | retrievers)
        refuse_nested(reach, self.safety)
        refuse_side_effect_functions(functions(self._agents()), self.safety,
                                     objects=tool_objects(self._agents()))
        self._check_guarded_tools_keep_out_of_the_store()

    def _context_tools(self) -> dict[str, str]:
        """The tools handed the workflow ``Context`` (tool name -> its agent): what they write
        to ``ctx.store`` is state later steps read, so a branch must run them to have it."""
        if self._with_context is None:
            self._with_context = {}
            for name, a in self._agents().items():
                for t in a.tools or ():
                    tool = t if isinstance(t, BaseTool) else FunctionTool.from_defaults(t)
                    if getattr(tool, "requires_context", False):
                        self._with_context[tool.metadata.name or ""] = name
        return self._with_context

    def _check_guarded_tools_keep_out_of_the_store(self) -> None:
        """A side-effect tool is answered on branches without running, so one that is handed
        the workflow ``Context`` must have its write to ``ctx.store`` made another way, or the
        later steps of the branch would read a store the app never had: its simulator must
        take the ``Context`` (a recorded write is checked per run: ``_check_replayable``)."""
        for tool_name, name in self._context_tools().items():
            if tool_name in self.safety.simulators and not self.safety.simulates_state(
                    tool_name):
                raise AdapterError(
                    f"side-effect tool {tool_name!r} of agent {name!r} takes the "
                    "workflow Context, but its simulator does not, so a simulated call "
                    "would drop what the tool writes to ctx.store",
                    hint="give the simulator a ctx parameter, fn(arguments, ctx), and write "
                         "ctx.store in it as the tool does (async def is fine), or leave the "
                         "tool out of side_effect_tools if it is safe to run")

    def _check_replayable(self, run: car.Trajectory) -> dict[tuple[str, str], Change]:
        """What each recorded call of a tool handed the ``Context`` wrote to the store, for
        branches to replay; refused, before any branch, where a side-effect one with no
        simulator taking the ``Context`` has a recorded call whose write the record cannot
        show (another tool handed the ``Context`` was called in the same step, it was the
        last step, a store value could not be recorded, or it removed a store key)."""
        tools = self._context_tools()
        found = writes(run.steps, tools)
        guarded = [n for n in tools if self.safety.guards(n)
                   and not self.safety.simulates_state(n)]
        for j, tool_name in unreplayable(run.steps, found, guarded):
            raise AdapterError(
                f"side-effect tool {tool_name!r} of agent {tools[tool_name]!r} takes the "
                f"workflow Context, and what its call at step {j} wrote to ctx.store cannot "
                "be told from the record (another tool handed the Context ran in that step, "
                "it was the run's last step, a store value could not be recorded, or it "
                "removed a store key), so a "
                "branch that made the call again would drop that write", run_id=run.id,
                step=j,
                hint=f"pass simulators={{{tool_name!r}: fn(arguments, ctx)}}: it is handed the "
                     "workflow Context and writes ctx.store as the tool does; or leave the "
                     "tool out of side_effect_tools if it is safe to run")
        return found

    def _agents(self) -> dict[str, Any]:
        return agents_of(self.workflow)

    @staticmethod
    def framework_state(run: car.Trajectory, k: int) -> Any:
        """The workflow store step ``k`` of ``run`` decided from, as its recorder took it from
        the live ``Context`` (on a branch: the branch's own context), for the conformance
        check that a branch starts from the recorded state."""
        return run.step(k).meta.get(STORE_KEY)

    def fingerprint(self) -> dict[str, Any]:
        """The workflow's agents, prompts and tools (``car_adapters.llamaindex.fingerprint``):
        a run recorded from another workflow is refused before any branch runs."""
        return workflow_fingerprint(self.workflow)

    # -- the car_core Agent protocol ----------------------------------------------------------
    def start(self, context: Any, noise: Noise) -> car.Trajectory:
        messages = context if isinstance(context, list) else [{"role": "user",
                                                               "content": str(context)}]
        # a run from scratch is the user's own run, not a branch: its tools run for real
        session = BranchSession(Plan(start=0), noise, 0, ToolSafety(unclassified="live"), {},
                                None, {})
        root = getattr(self.workflow, "root_agent", None) or getattr(self.workflow, "name", None)
        run = run_sync(lambda: self._drive(messages, root, None, session, store=None))
        return replace(run, context=context, seed=noise.seed)

    def branch(self, run: car.Trajectory, plan: Plan, noise: Noise) -> car.Trajectory:
        """``abranch``'s coroutine, finished from sync code."""
        return run_sync(lambda: self.abranch(run, plan, noise))

    async def abranch(self, run: car.Trajectory, plan: Plan, noise: Noise) -> car.Trajectory:
        """The branch as a coroutine on the caller's loop: the asyncio executor awaits many at
        once, each with its own session, so their waits on the model server overlap."""
        return await areentered(run, plan, noise, agent=self.name, safety=self.safety,
                                live=lambda k: self._live(run, plan, noise, k))

    def preflight(self, run: car.Trajectory) -> None:
        """Before any branch: the run's tools are the app's, and every class its workflow
        store holds can be rebuilt here (``store_state.resolved``)."""
        check_recorded_tools(run, tool_names(self.workflow))
        for step in run.steps:
            values = step.meta.get(STORE_KEY)
            if isinstance(values, dict):
                self._store(values, run.id, step.index)

    def _store(self, values: Any, run_id: str, step: int) -> Any:
        return resolved(values, app_modules(self._agents().values()), run_id=run_id,
                        step=step)

    async def _live(self, run: car.Trajectory, plan: Plan, noise: Noise, k: int
                    ) -> tuple[list[car.Step], car.Trajectory]:
        """The steps from ``k`` on, in their places, and the run that collected them."""
        check_recorded_tools(run, tool_names(self.workflow))
        _check_memory_kept(run, k)
        state, active = self._state(run, k)
        store = self._store(recorded(run.step(k).meta, run_id=run.id, step=k), run.id, k)
        descriptions: dict[str, str] = {}
        if k in plan.context_edits:
            given = apply_edit(plan.context_edits[k], state_of(run, k), run_id=run.id, step=k)
            # the tools' descriptions travel beside the messages (a ChatInput's .tools)
            descriptions = edited_descriptions(run, k, offered_tools(given))
            edited = _check_history(edited_messages(lambda _: given, state, run_id=run.id,
                                                    step=k), run.id, k)
            if active is None and _leading_systems(edited)[0] != _leading_systems(state)[0]:
                raise InvalidIntervention(
                    f"the edit changes the system messages step {k} saw, but the record does "
                    "not say which agent decided it, so the branch cannot put them in place of "
                    "that agent's own prompt", run_id=run.id, step=k,
                    hint="record the run again with car_adapters.llamaindex.CarRecorder (it "
                         "notes the agent of every step), or edit other messages")
            state = edited
        session = BranchSession(plan, noise, k, self.safety, recorded_calls(run.steps), run.id,
                                forced_observations(plan, run.id), self._check_replayable(run))
        if descriptions:  # offered so described at step k's model call only
            session.tools[k] = descriptions
        # a forced result is served in place of running the tool: one handed the workflow
        # Context would not write ctx.store, and the later steps would read a store the app
        # never had
        check_forced_tools(session, tool_names(self.workflow), run.id,
                           why="the framework runs that tool itself",
                           refused={name: f"it takes the workflow Context (agent {agent!r}), so "
                                    "it would not run and what it writes to ctx.store would be "
                                    "lost" for name, agent in self._context_tools().items()})
        live = await self._drive(state, active, run, session, store=store)
        steps = [renumber(s, k + i, plan, session) for i, s in enumerate(live.steps)]
        with session_scope(session):  # a safe tool run again meets the branch's net too
            drift = await _drift(run, steps, lambda: branch_reruns(self._agents(), self.safety))
        if drift:  # a safe tool errored where the record was answered: never scored
            live = drift.on(live)
        return steps, live

    def redecide(self, run: car.Trajectory, k: int, noise: Noise) -> Any:
        """Decide step ``k`` again from its recorded messages (one model call, no tools)."""
        plan = compile_plan(run, car.do_resample(k))
        session = BranchSession(plan, noise, k, self.safety, recorded_calls(run.steps), run.id,
                                {})
        state, active = self._state(run, k)
        store = self._store(recorded(run.step(k).meta, run_id=run.id, step=k), run.id, k)
        return run_sync(lambda: self._drive(state, active, run, session, store=store,
                                            stop_after_first=True)).steps[0].action

    # -- internals ---------------------------------------------------------------------------
    def _state(self, run: car.Trajectory, k: int) -> tuple[list[dict[str, Any]], str | None]:
        step = run.step(k)
        if not isinstance(step.state, list):
            raise AdapterError("the recorded step has no message history to resume from",
                               run_id=run.id, step=k,
                               hint="record the run with car_adapters.llamaindex.CarRecorder; "
                                    "a custom LLM must emit LlamaIndex's instrumentation "
                                    "events for its messages to be recorded: decorate its "
                                    "chat/achat with llama_index.core.llms.callbacks."
                                    "llm_chat_callback() (and stream_chat/astream_chat alike)")
        active = step.meta.get("agent")
        if active is not None and active not in self._agents():
            raise AdapterError(f"the run was decided by agent {active!r}, which this workflow "
                               "does not have", run_id=run.id, step=k,
                               hint="wrap the same workflow the run was recorded with")
        rest = [m for m in step.state if isinstance(m, dict) and m.get("role") != "system"]
        if not rest or rest[0].get("role") != "user":
            first = rest[0].get("role") if rest else "nothing"
            raise AdapterError(
                f"the messages step {k} decided from begin with {first}, not a user message "
                "(the app's memory dropped it), and a LlamaIndex workflow is re-entered only "
                "from a history that has one", run_id=run.id, step=k,
                hint="record the run with a memory that holds it whole (memory="
                     "ChatMemoryBuffer.from_defaults(token_limit=...))")
        return list(step.state), active

    def _iterations_left(self, run: car.Trajectory | None, k: int) -> int:
        """The iterations a branch from step ``k`` has: the app's limit (``max_iterations``,
        else the run's, else LlamaIndex's default) less the ``k`` decisions before it, each of
        which the run counted (LlamaIndex counts every agent output, a final reply too)."""
        limit = self.max_iterations or (run.meta.get("max_iterations") if run is not None
                                        else None) or DEFAULT_MAX_ITERATIONS
        return int(limit) if run is None else max(1, int(limit) - k)

    async def _drive(self, messages: list[dict[str, Any]], active: str | None,
                     run: car.Trajectory | None, session: BranchSession, *,
                     store: Mapping[str, Any] | None, stop_after_first: bool = False
                     ) -> car.Trajectory:
        """Run the workflow from ``messages`` under the branch's stand-ins: the branch's one
        coroutine, whether ``branch``, ``abranch``, ``start`` or ``redecide`` asked for it.
        ``store``: the recorded store a branch starts from (the messages are recorded ones
        too), or None for a run from scratch."""
        agents = self._agents()
        target = agents.get(active) if active else None
        systems, messages = _leading_systems(messages)
        if target is not None and (systems or run is not None):
            # this branch's alone, for its active agent, every one in order: in place of the
            # agent's own (an edit may add an instruction after the prompt, or remove it)
            session.system[str(active)] = systems
            messages = [*_memory_systems(target, systems), *messages]
        session.as_recorded = store is not None
        root = getattr(self.workflow, "root_agent", None)
        max_iter = 1 if stop_after_first else self._iterations_left(run, session.plan.start)
        self._check_retrievers(agents, session)
        with (installed(self.workflow, agents, self._context_tools()), session_scope(session),
              collecting() as collector):
            try:
                memory = ChatMemoryBuffer.from_defaults(token_limit=MEMORY_TOKENS)
                ctx = Context(self.workflow)
                if store is not None:
                    await restore(ctx, store)
                if root is not None and target is not None:  # an AgentWorkflow starts there
                    async with ctx.store.edit_state() as state:
                        state["current_agent_name"] = active
                await finished(self.workflow.run(ctx=ctx, chat_history=from_dicts(messages),
                                                 memory=memory, max_iterations=max_iter,
                                                 early_stopping_method="force"),
                               lambda event: self._asked(session, event))
                session.raise_blocked()
            except CarError:
                raise
            except Exception as exc:
                session.raise_blocked()
                if not (stop_after_first and "Max iterations" in str(exc)):
                    return self._failed(collector, exc, run)
        if not collector.runs:
            raise AdapterError("the branch produced no run", hint="check the agent runs alone")
        return collector.runs[-1]

    def _asked(self, session: BranchSession, event: Any) -> None:
        """Stop the run: its workflow asked for human input nobody will give (a waiting tool
        reading its code did not find: ``human_input``)."""
        live = sorted(n for n in self._context_tools() if not session.safety.guards(n))
        if session.blocked is None:
            session.blocked = asked_for_input(event, step=session.current,
                                              run_id=session.run_id, live=live)

    def _check_retrievers(self, agents: dict[str, Any], session: BranchSession) -> None:
        for name, a in agents.items():
            if getattr(a, "tool_retriever", None) is not None and session.serves_any():
                raise AdapterError(
                    f"agent {name!r} picks its tools with a tool_retriever, so a branch cannot "
                    "guard side-effect tools or serve forced observations",
                    hint="give the agent tools=[...] for attribution")

    @staticmethod
    def _failed(collector: CarRecorder, exc: BaseException, run: car.Trajectory | None
                ) -> car.Trajectory:
        """A branch the framework aborted (max iterations, a tool that raised) is still a run:
        its steps so far, with the error, so the outcome function can score it."""
        if collector.runs:
            return collector.runs[-1]
        raise AdapterError(f"the agent failed on the branch: {exc!r}",
                           run_id=run.id if run is not None else None,
                           hint="run the agent alone to see the error") from exc
