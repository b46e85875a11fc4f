"""``LlamaIndexAgent``: a LlamaIndex agent (``FunctionAgent``, ``AgentWorkflow``) as a CAR agent.

LlamaIndex keeps no per-step checkpoints, so a branch at step ``k`` re-enters the workflow with
the message history the recorder kept for step ``k`` (edited by ``do_context``) as its chat
history, the agent that was active at ``k`` as the root agent, and a fresh ``Context`` whose
store holds what the recorder kept for step ``k`` (``store_state``), so tools reading
``ctx.store`` see what the held steps wrote. The recorded messages already carry the state
prompt the framework put on the first message, so a branch formats nothing again. Steps
before ``k`` are copied from the record: no model call, no tool call. From ``k`` on, each
agent's LLM and tools are stand-ins (``branch.py``) for the duration of the branch, and a
private recorder collects the new steps through the same instrumentation as ``CarRecorder``.

The stand-ins are set on the agent objects for the duration of one branch, under a lock kept
per workflow object, so branches over the same agent objects run one at a time whichever
``LlamaIndexAgent`` wraps them; do not run the same agent objects elsewhere while an
attribution is running.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import BaseTool, FunctionTool, adapt_to_async_tool
from llama_index.core.workflow import Context

import car_core as car
from car_core.contract import Noise, Plan, redact
from car_core.errors import AdapterError, CarError, InvalidIntervention

from ..common.branch import check_forced_tools, check_recorded_tools, reentered, renumber
from ..common.messages import (
    ToolSafety,
    edited_messages,
    forced_observations,
    recorded_calls,
)
from ..common.sync import run_sync
from ._messages import from_dicts
from .branch import BranchSession, CarBranchLLM, CarBranchTool
from .fingerprint import workflow_fingerprint
from .recorder import BRANCH_TOKEN, CarRecorder, agents_of, tool_names
from .store_state import STORE_KEY, recorded, restore

MEMORY_TOKENS = 10**9  # the re-entered history must reach the model whole
# On a branch the state prompt is already in the re-entered messages (the recorded ones): a
# template that gives the message back unchanged keeps the framework from adding it twice.
_AS_RECORDED = PromptTemplate("{msg}")
_LOCKS: dict[int, threading.Lock] = {}  # id(workflow) -> the lock its branches share
_LOCKS_GUARD = threading.Lock()


def _workflow_lock(workflow: Any) -> threading.Lock:
    """The lock for ``workflow``'s agent objects (a wrapper keeps the workflow alive, so its
    id is not reused while the lock is in use)."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(id(workflow), threading.Lock())


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
        a = [m for m in before.state if same_agent or m.get("role") != "system"]
        b = [m for m in after.state if same_agent or m.get("role") != "system"]
        if b[:len(a)] != a:
            raise AdapterError(
                f"the app's memory dropped or rewrote messages before step {j} (it saw "
                f"{len(b)} messages after {len(a)} at step {j - 1}), and a branch keeps every "
                f"message, so a branch from step {k} would not see what the app's memory "
                "gives its later steps", run_id=run.id, step=k,
                hint="record the run with a memory that holds it whole (memory="
                     "ChatMemoryBuffer.from_defaults(token_limit=...)), or branch from step "
                     f"{j} or later")


class LlamaIndexAgent:
    """Wraps a LlamaIndex ``FunctionAgent``, ``ReActAgent`` or ``AgentWorkflow`` for
    ``car.intervene``, ``car.contrastive`` and ``car.shapley``. ``side_effect_tools`` never run
    on a branch: they are answered from the record (on the arguments that matter: ``match_on``,
    see ``ToolSafety``), by ``simulators[name](arguments)``, or stop the branch.
    ``max_iterations`` caps the decisions a branch makes from its branch step on."""

    def __init__(self, agent: Any, *, side_effect_tools: Iterable[str] = (),
                 simulators: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
                 match_on: Mapping[str, Iterable[str] | str] | None = None,
                 max_iterations: int = 20, name: str | None = None) -> None:
        if not hasattr(agent, "run"):
            raise AdapterError(f"expected a LlamaIndex agent workflow, got {type(agent).__name__}",
                               hint="pass a FunctionAgent, ReActAgent or AgentWorkflow")
        self.workflow = agent
        redact.register_from(agent)  # its LLMs' keys are never stored, rendered or printed
        self.safety = ToolSafety.of(side_effect_tools, simulators, match_on)
        self.max_iterations = max_iterations
        self.name = name or f"llamaindex:{type(agent).__name__}"
        self._lock = _workflow_lock(agent)
        self._with_context: dict[str, str] | None = None
        self._check_side_effect_names()
        with self._lock:  # another wrapper's branch may have its stand-in LLMs in place
            self.couples_noise = all(getattr(a.llm, "uses_car_noise", False)
                                     for a in self._agents().values())

    def _check_side_effect_names(self) -> None:
        """Every side-effect name must be a tool of one of the workflow's agents (all of them,
        for an ``AgentWorkflow``), or the real tool would run on every branch."""
        if not self.safety.side_effect_tools:
            return
        for name, a in self._agents().items():
            if getattr(a, "tool_retriever", None) is not None:
                raise AdapterError(
                    f"agent {name!r} picks its tools with a tool_retriever, so side-effect "
                    "tools cannot be checked or guarded on branches",
                    hint="give the agent tools=[...] for attribution")
        given = {n for names in tool_names(self.workflow).values() for n in names}
        self.safety.check_names(given, agent=f"the {type(self.workflow).__name__}")
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
        the workflow ``Context`` would lose whatever it writes to ``ctx.store``, and the later
        steps of the branch would read a store the app never had."""
        for tool_name, name in self._context_tools().items():
            if self.safety.guards(tool_name):
                raise AdapterError(
                    f"side-effect tool {tool_name!r} of agent {name!r} takes the "
                    "workflow Context, so answering it from the record or a simulator "
                    "would drop what it writes to ctx.store",
                    hint="keep the side effect in a tool without a ctx parameter (a "
                         "separate tool can write the store), or leave the tool out of "
                         "side_effect_tools if it is safe to run")

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
        session = BranchSession(Plan(start=0), noise, 0, self.safety, {}, None, {})
        root = getattr(self.workflow, "root_agent", None) or getattr(self.workflow, "name", None)
        run = self._drive(messages, root, None, session, store=None)
        return replace(run, context=context, seed=noise.seed)

    def branch(self, run: car.Trajectory, plan: Plan, noise: Noise) -> car.Trajectory:
        return reentered(run, plan, noise, agent=self.name, safety=self.safety,
                         live=lambda k: self._live(run, plan, noise, k))

    def _live(self, run: car.Trajectory, plan: Plan, noise: Noise, k: int
              ) -> tuple[list[car.Step], car.Trajectory]:
        """The steps from ``k`` on, in their places, and the run that collected them."""
        check_recorded_tools(run, tool_names(self.workflow))
        _check_memory_kept(run, k)
        state, active = self._state(run, k)
        store = recorded(run.step(k).meta, run_id=run.id, step=k)
        if k in plan.context_edits:
            state = _check_history(edited_messages(plan.context_edits[k], state, run_id=run.id,
                                                   step=k), run.id, k)
        session = BranchSession(plan, noise, k, self.safety, recorded_calls(run.steps), run.id,
                                forced_observations(plan, run.id))
        # a forced result is served in place of running the tool: one handed the workflow
        # Context would not write ctx.store, and the later steps would read a store the app
        # never had
        check_forced_tools(session, tool_names(self.workflow), run.id,
                           why="the framework runs that tool itself",
                           refused={name: f"it takes the workflow Context (agent {agent!r}), so "
                                    "it would not run and what it writes to ctx.store would be "
                                    "lost" for name, agent in self._context_tools().items()})
        live = self._drive(state, active, run, session, store=store)
        return [renumber(s, k + i, plan) for i, s in enumerate(live.steps)], live

    def redecide(self, run: car.Trajectory, k: int, noise: Noise) -> Any:
        """Decide step ``k`` again from its recorded messages (one model call, no tools)."""
        plan = car.interventions.compile_plan(run, car.do_resample(k))
        session = BranchSession(plan, noise, k, self.safety, recorded_calls(run.steps), run.id,
                                {})
        state, active = self._state(run, k)
        store = recorded(run.step(k).meta, run_id=run.id, step=k)
        return self._drive(state, active, run, session, store=store,
                           stop_after_first=True).steps[0].action

    # -- internals ---------------------------------------------------------------------------
    def _state(self, run: car.Trajectory, k: int) -> tuple[list[dict[str, Any]], str | None]:
        step = run.step(k)
        if not isinstance(step.state, list):
            raise AdapterError("the recorded step has no message history to resume from",
                               run_id=run.id, step=k,
                               hint="record the run with car_adapters.llamaindex.CarRecorder")
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

    def _drive(self, messages: list[dict[str, Any]], active: str | None,
               run: car.Trajectory | None, session: BranchSession, *,
               store: Mapping[str, Any] | None, stop_after_first: bool = False
               ) -> car.Trajectory:
        """Run the workflow from ``messages`` under the branch's stand-ins. ``store``: the
        recorded store a branch starts from (the messages are recorded ones too), or None for
        a run from scratch."""
        agents = self._agents()
        target = agents.get(active) if active else None
        system = None
        while messages and messages[0]["role"] == "system":
            system = messages[0].get("content")
            messages = messages[1:]
        token = object()
        collector = CarRecorder(_token=token)
        max_iter = 1 if stop_after_first else self.max_iterations

        async def go() -> None:
            BRANCH_TOKEN.set(token)
            memory = ChatMemoryBuffer.from_defaults(token_limit=MEMORY_TOKENS)
            ctx = Context(self.workflow)
            if store is not None:
                await restore(ctx, store)
            await self.workflow.run(ctx=ctx, chat_history=from_dicts(messages), memory=memory,
                                    max_iterations=max_iter, early_stopping_method="force")

        self._check_retrievers(agents, session)
        with self._lock:
            saved = {n: (a.llm, a.tools, a.system_prompt, a.state_prompt)
                     for n, a in agents.items()}
            root = getattr(self.workflow, "root_agent", None)
            flow_prompt = getattr(self.workflow, "state_prompt", None) if root else None
            collector.attach()
            try:
                for a in agents.values():
                    a.llm = CarBranchLLM(a.llm, session)
                    a.tools = [self._stand_in(t, session) for t in a.tools or ()]
                    if store is not None:
                        a.state_prompt = _AS_RECORDED
                if store is not None and flow_prompt is not None:  # AgentWorkflow's own
                    self.workflow.state_prompt = _AS_RECORDED
                if target is not None:
                    if root is not None:
                        self.workflow.root_agent = active
                    if system is not None and system != target.system_prompt:
                        target.system_prompt = system
                try:
                    run_sync(go)
                    session.raise_blocked()
                except CarError:
                    raise
                except Exception as exc:
                    session.raise_blocked()
                    if not (stop_after_first and "Max iterations" in str(exc)):
                        return self._failed(collector, exc, run)
            finally:
                collector.detach()
                for n, a in agents.items():
                    a.llm, a.tools, a.system_prompt, a.state_prompt = saved[n]
                if root is not None:
                    self.workflow.root_agent = root
                if flow_prompt is not None:
                    self.workflow.state_prompt = flow_prompt
        if not collector.runs:
            raise AdapterError("the branch produced no run", hint="check the agent runs alone")
        return collector.runs[-1]

    @staticmethod
    def _stand_in(tool: Any, session: BranchSession) -> Any:
        """The tool a branch offers: a stand-in for tools the branch must not run (side
        effects, forced observations); the tool itself otherwise, so LlamaIndex still hands a
        ``Context`` to tools that ask for one."""
        tool = tool if isinstance(tool, BaseTool) else FunctionTool.from_defaults(tool)
        if session.serves(tool.metadata.name or ""):
            return CarBranchTool(adapt_to_async_tool(tool), session)
        return tool

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
