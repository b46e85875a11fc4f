"""LangGraph adapter: record with a callback, fork checkpoints under interventions, attribute.

``CarCallback`` records runs. ``LangGraphAgent(app)`` implements the car_core agent protocol
with LangGraph's own machinery, for an app compiled with a checkpointer whose messages live in a
``messages`` channel with the ``add_messages`` reducer:

- **Fork.** A branch from step ``k`` copies the checkpoints the step-``k`` task was scheduled
  from — one per graph level, so a step inside a subgraph (a worker agent) resumes there under
  its parents as recorded — into a new thread, without their pending writes (which would replay
  the recorded step). Branches never see each other and the user's thread is untouched; steps
  before ``k`` are served from the record with no model or tool call. Branch threads are deleted
  afterwards unless ``keep_branches=True``. Every step of a run is checked once, before its
  first branch runs; a run this app cannot fork is refused naming the shape and the node.
- **Send fan-out.** The model calls of parallel ``Send`` tasks are steps in LangGraph's task
  order (``Send`` index). A fork at one of them keeps the recorded writes of the workers whose
  steps come earlier (held, never re-run) and runs it and the later ones live; branches run a
  superstep's tasks one at a time in that order, so step indices, held steps and seeds land on
  the same task every time. Refused by name: parallel tasks other than one-model-call ``Send``
  tasks (several model nodes in one superstep, a fan-out into subgraphs that call models), and
  a run whose held ``Send`` worker did not finish in the record.
- **Intervene.** ``do_context`` writes the edited messages into the forked checkpoint itself,
  so the model task that was scheduled runs again (``update_state`` would guess which node
  wrote, and guesses wrong on ``Send``-routed graphs such as ``create_agent``). ``do_action`` is
  written with ``update_state(as_node=<the step's node>)`` in the step's namespace, so the node's
  own routing runs; with a model wrapper or middleware it is returned by the model call instead.
  A ``Send`` task builds its model input from its payload, so there ``do_context`` replaces
  that input at the model call, and ``do_action`` / ``do_observation`` / ``do_context`` need
  ``CarChatModel`` (without it they are refused; ``do_resample`` works).
  ``do_observation`` answers the step's tool calls by id. ``do_resample`` simply resumes.
- **The model.** Held steps after ``k`` (Shapley coalitions), ``do_policy`` (a LangChain chat
  model that decides from ``k`` on) and per-step seeds need CAR to decide the model calls:
  ``CarMiddleware`` on ``create_agent`` or ``CarChatModel(inner=model)``, passed as ``model=``.
- **Tools** run live on branches, except the ``side_effect_tools`` you name, answered by the
  guard (``guard``) wherever they run: from the record on a call that matches on the arguments
  that matter (``match_on``), else by ``simulators[name](arguments)``, else ``SideEffectBlocked``.
  The record holds the calls a node makes itself too (the callback keeps them), so those are
  answered like a ``ToolNode``'s. A tool name, in any parameter, that no tool of the graph has
  is refused; the graph's tools are its ``ToolNode``s' and those a node's code reaches
  (``reach``), plus tool objects given as ``node_tools``.
- **Undecided model calls.** With ``model=``, CAR numbers the model calls it decides; a node
  that can call a model CAR does not decide is refused before the first branch, and a branch
  that calls one anyway is stopped at that call (``undecided``).
- ``import_thread(thread_id)`` rebuilds the trajectory the callback would have recorded from the
  checkpoint history of every namespace; ``attribute_thread`` imports and attributes in one call.

A branch that stops for human input (``interrupt``) is an ``AdapterError``: nobody is there to
answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import AIMessage
    from langchain_core.tools import BaseTool
    from langgraph.errors import GraphRecursionError
    from langgraph.prebuilt import ToolNode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("car_adapters.langgraph needs LangGraph: "
                      "pip install 'causal-agent-replay[langgraph]'") from exc

from car_core import RunStore
from car_core.contract import Noise, Origin, Outcome, OutcomeFn, Plan, RunStatus, Step, Trajectory
from car_core.errors import (
    AdapterError,
    AgentMismatch,
    InvalidInput,
    InvalidIntervention,
    StepOutOfRange,
)

from ..common.messages import (
    ToolSafety,
    apply_edit,
    calls_of,
    check_action,
    check_observation,
    consistent,
    recorded_calls,
)
from .callback import CarCallback, agent_of, is_send_task
from .fingerprint import app_digest, app_fingerprint
from .guard import RUN, Guard, guarding
from .messages import (
    action_message,
    decode,
    from_dicts,
    jsonable,
    to_dict,
    to_dicts,
    usage_of,
)
from .middleware import CarMiddleware
from .model import CarChatModel, Control, controlling, seedable
from .reach import reach
from .thread import thread_outcome
from .undecided import UndecidedCalls, refuse_undecided, undecided_nodes

MESSAGES_KEY = "messages"
# LangGraph's pending-write markers (langgraph._internal._constants): a superstep's input, not a
# task's output, and the writes of a task that failed or stopped for input
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"
ERROR, INTERRUPT = "__error__", "__interrupt__"


def _thread(thread_id: str, checkpoint_id: str | None = None,
            ns: str | None = "") -> dict[str, Any]:
    """The config of a thread at namespace ``ns`` (None: every namespace, for listing)."""
    conf: dict[str, Any] = {"thread_id": thread_id}
    if ns is not None:
        conf["checkpoint_ns"] = ns
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _join(level: str, node: str) -> str:
    return f"{level}|{node}" if level else node


def _framework_written(message: Any) -> bool:
    """A message the framework wrote, not a model (langgraph-supervisor's handoff notices)."""
    return any(str(k).startswith("__is_handoff") for k in (message.response_metadata or {}))


class _FirstDecision(BaseCallbackHandler):
    """Stops a throwaway branch as soon as its first model decision is made."""

    raise_error = True
    run_inline = True

    def __init__(self) -> None:
        self.message: Any = None

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        if self.message is None and response.generations and response.generations[0]:
            self.message = getattr(response.generations[0][0], "message", None)
            raise _Decided


class _Decided(Exception):
    pass


class _QuietStop(logging.Filter):
    """LangChain logs a callback's exception before re-raising it. ``_Decided`` is how a
    throwaway branch stops, not an error, and ``UndecidedCalls``' refusal is raised to the
    caller anyway, so their lines are dropped (nothing else is)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(f"{quiet.__name__}." in text for quiet in (_FirstDecision, UndecidedCalls))


logging.getLogger("langchain_core.callbacks.manager").addFilter(_QuietStop())


def _recast(ns: str) -> str:
    """A checkpoint namespace without its task ids: ``a:<id>|b:<id>`` -> ``a|b``."""
    return "|".join(part.split(":")[0] for part in ns.split("|")) if ns else ""


class LangGraphAgent:
    """A compiled LangGraph app as a car_core ``Agent`` (see the module docstring)."""

    def __init__(self, app: Any, *, model: CarChatModel | CarMiddleware | None = None,
                 side_effect_tools: Iterable[str] = (),
                 simulators: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
                 match_on: Mapping[str, Iterable[str] | str] | None = None,
                 node_tools: Iterable[str | BaseTool] = (),
                 messages_key: str = MESSAGES_KEY, keep_branches: bool = False,
                 recursion_limit: int = 50, name: str | None = None) -> None:
        saver = getattr(app, "checkpointer", None)
        if not hasattr(app, "get_state_history"):
            raise InvalidInput(f"LangGraphAgent needs a compiled LangGraph app, got "
                               f"{type(app).__name__}", hint="pass graph.compile(checkpointer=…)")
        if saver is None or isinstance(saver, bool):
            raise AdapterError("the app was compiled without a checkpointer, so there is "
                               "nothing to fork from",
                               hint="compile it with checkpointer=SqliteSaver(conn) or "
                                    "InMemorySaver()")
        if model is not None and not isinstance(model, (CarChatModel, CarMiddleware)):
            raise InvalidInput("model= must be the CarChatModel the app calls or the "
                               "CarMiddleware its create_agent runs",
                               hint="build the app with CarChatModel(inner=your_model) (or "
                                    "create_agent(..., middleware=[CarMiddleware()])) and pass "
                                    "that same object as model=")
        side_effect_tools = ([side_effect_tools] if isinstance(side_effect_tools, str)
                             else list(side_effect_tools))
        node_tools = [node_tools] if isinstance(node_tools, str) else list(node_tools)
        self.app = app
        self.saver = saver
        self.model = model
        self.messages_key = messages_key
        self.keep_branches = keep_branches
        self.recursion_limit = recursion_limit
        # every graph level CAR can fork into: "" is the app, then each subgraph namespace
        self.graphs: dict[str, Any] = {"": app, **dict(app.get_subgraphs(recurse=True))}
        specs = [(ns, n, spec) for ns, g in self.graphs.items()
                 for n, spec in getattr(getattr(g, "builder", None), "nodes", {}).items()]
        self.tool_nodes = {(ns, n): spec.runnable for ns, n, spec in specs
                           if isinstance(spec.runnable, ToolNode)}
        # what every other node can call: its tools, its models, whether CAR decides them
        self.reaches = {(ns, n): reach(spec.runnable) for ns, n, spec in specs
                        if (ns, n) not in self.tool_nodes and _join(ns, n) not in self.graphs}
        self.tools = sorted({t for node in self.tool_nodes.values()
                             for t in getattr(node, "tools_by_name", {})}
                            | {t for r in self.reaches.values() for t in r.tools}
                            | {t.name for t in node_tools if isinstance(t, BaseTool)})
        self._check_tool_names({
            "side_effect_tools": side_effect_tools, "simulators": list(simulators or {}),
            "match_on": list(match_on or {}),
            "node_tools": [t for t in node_tools if not isinstance(t, BaseTool)]})
        self.safety = ToolSafety.of(side_effect_tools, simulators, match_on)
        self.couples_noise = self._couples(model)
        # CAR numbers the model calls it decides: a node calling a model it cannot see is refused
        self.undecided = undecided_nodes(self.reaches) if model is not None else []
        self.name = name or f"langgraph:{app.get_name()}"
        # a graph with async-only nodes cannot run under invoke(); branches use ainvoke()
        self.is_async = any(getattr(spec.runnable, "func", True) is None
                            and getattr(spec.runnable, "afunc", None) is not None
                            for _, _, spec in specs)
        self._checked: set[str] = set()
        self._lock = threading.Lock()

    def _check_tool_names(self, given: Mapping[str, list[str]]) -> None:
        """Refuse any tool name, in any parameter, that no tool of the graph has: a typo would
        leave the real tool unguarded on every branch."""
        unknown = {param: sorted(set(names) - set(self.tools))
                   for param, names in given.items() if set(names) - set(self.tools)}
        if unknown:
            where = "; ".join(f"side-effect tool(s) {names} are not tools of this graph"
                              if param == "side_effect_tools" else
                              f"{param} names {names}, which are not tools of this graph"
                              for param, names in unknown.items())
            raise InvalidInput(f"{where}; its tools are {self.tools}",
                               hint="spell each name exactly as the tool is registered; a tool "
                                    "a node reaches in a way CAR cannot see (built inside the "
                                    "node function) is passed itself: node_tools=[the_tool]")

    def _couples(self, model: CarChatModel | CarMiddleware | None) -> bool:
        """Whether CAR's noise drives the app's model calls: every model CAR decides takes a
        per-step ``seed``. Models it cannot see, or without a seed field, do not couple."""
        if isinstance(model, CarChatModel):
            return seedable(model.inner)
        if not isinstance(model, CarMiddleware) or not model.seed_models:
            return False
        decided = [m for r in self.reaches.values() if r.wrapped for m in r.models]
        return bool(decided) and all(seedable(m) for m in decided)

    def _saver_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop an async checkpointer (AsyncSqliteSaver, AsyncPostgresSaver) is bound
        to, or None for a sync one. Its sync methods only work from another thread while that
        loop runs, so branches are driven from a worker thread and run on that loop."""
        loop = getattr(self.saver, "loop", None)
        if not isinstance(loop, asyncio.AbstractEventLoop):
            return None
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise AdapterError(
                f"{type(self.saver).__name__} runs on this event loop, which CAR would block "
                "while it waits for each branch", hint="call CAR from a worker thread while "
                "the loop runs: await asyncio.to_thread(car.contrastive, run, agent, ...)")
        if loop.is_closed() or not loop.is_running():
            raise AdapterError(f"the event loop {type(self.saver).__name__} is bound to is not "
                               "running, so its checkpoints cannot be read",
                               hint="attribute inside the async code that opened the "
                                    "checkpointer: await asyncio.to_thread(car.contrastive, ...)")
        return loop

    def _invoke(self, value: Any, config: dict[str, Any], **kwargs: Any) -> Any:
        loop = self._saver_loop()
        if loop is not None:
            return asyncio.run_coroutine_threadsafe(self.app.ainvoke(value, config, **kwargs),
                                                    loop).result()
        if not self.is_async:
            return self.app.invoke(value, config, **kwargs)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.app.ainvoke(value, config, **kwargs))
        with ThreadPoolExecutor(max_workers=1) as pool:  # called from inside an event loop
            return pool.submit(asyncio.run, self.app.ainvoke(value, config, **kwargs)).result()

    def fingerprint(self) -> dict[str, Any]:
        """The app's graphs, tools and node code (``car_adapters.langgraph.fingerprint``): a
        run recorded from another app is refused before any branch runs."""
        return app_fingerprint(self.app)

    # -- the protocol -------------------------------------------------------------------------

    def start(self, context: Any, noise: Noise) -> Trajectory:
        """Run the graph on ``context`` (its input) in a new thread, recorded by a callback."""
        thread_id = f"car-run-{uuid.uuid4().hex}"
        cb = CarCallback(messages_key=self.messages_key)
        config = {**_thread(thread_id), "callbacks": [cb], "recursion_limit": self.recursion_limit,
                  "max_concurrency": 1}
        with controlling(thread_id, Control(0, noise=noise if self.couples_noise else None)):
            try:
                self._invoke(context, config)
            except GraphRecursionError:
                pass  # recorded with status "error"; the trajectory says why
        assert cb.run is not None
        return replace(cb.run, agent=self.name)

    def branch(self, run: Trajectory, plan: Plan, noise: Noise,
               stop: Callable[[Trajectory], bool] | None = None) -> Trajectory:
        """A branch of ``run`` under ``plan`` in a forked thread (module docstring). With
        ``stop`` (the outcome's ``settled``), the branch ends after the first superstep, or
        before any when the held prefix suffices, where ``stop(branch so far)`` is True, and
        that partial branch (status settled) is returned. Async apps run to the end."""
        k = plan.start
        self.preflight(run)
        self.safety.warn_free_text(run.id, run.steps)
        if k >= len(run.steps):
            steps = run.held_prefix(len(run.steps))
            return Trajectory.new(context=run.context, steps=steps, seed=noise.seed,
                                  agent=self.name, status=run.status, meta=dict(run.meta))
        self._check(run, k)
        needs_control = plan.policy is not None or any(j > k for j in plan.forced_actions)
        if needs_control and self.model is None:
            raise AdapterError(
                "holding steps after the branch step or swapping the policy needs CAR to "
                "decide the app's model calls", run_id=run.id, step=k,
                hint="add CarMiddleware() to create_agent(..., middleware=[...]), or build "
                     "the app with CarChatModel(inner=your_model); pass that object as "
                     "LangGraphAgent(app, model=...)")
        policy = plan.policy
        if policy is not None and not hasattr(policy[1], "_generate"):
            raise InvalidIntervention("do_policy on a LangGraph agent takes a LangChain chat "
                                      "model", run_id=run.id, step=policy[0],
                                      hint="pass do_policy(k, SomeChatModel(...))")
        if plan.forced_observations and not self.tool_nodes:
            raise AdapterError("do_observation needs the graph's tools to run in a ToolNode, "
                               "whose calls carry the ids the forced results answer",
                               run_id=run.id, step=min(plan.forced_observations),
                               hint="run the graph's tools through langgraph.prebuilt.ToolNode")
        send = is_send_task(run.steps[k].meta)
        if (send and not isinstance(self.model, CarChatModel)
                and (k in plan.forced_actions or k in plan.context_edits)):
            # CarMiddleware only sees create_agent's model node, never a Send worker's call
            raise AdapterError(
                f"step {k} ran in a Send task of node {run.steps[k].meta.get('node')!r}: its "
                "input is the Send payload and its output goes to the task's own writes, so "
                "do_action / do_observation / do_context there need CAR to decide the model "
                "call", run_id=run.id, step=k,
                hint="build the app with CarChatModel(inner=your_model) and pass it as "
                     "LangGraphAgent(app, model=...); do_resample works without it")
        forced = {j: check_action(a, step=j) for j, a in plan.forced_actions.items()}
        edited = None
        if k in plan.context_edits:
            step = run.steps[k]
            edited = apply_edit(plan.context_edits[k], step.state, run_id=run.id, step=k)
            edited = consistent([dict(m) for m in _as_dicts(edited, run.id, k)],
                                run_id=run.id, step=k)
        thread_id = f"car-branch-{uuid.uuid4().hex}"
        control = Control(k, forced={j: a for j, a in forced.items()
                                     if j > k or (j == k and self.model is not None)},
                          policy=policy, noise=noise if self.couples_noise else None)
        if send and edited is not None:  # a Send task builds its input: edit it at the call
            control.inputs[k] = from_dicts(edited)
        cb = CarCallback(messages_key=self.messages_key)
        offset = 0
        guard = Guard(self.safety, _recorded(run), run_id=run.id)
        guard.step = lambda: k + offset + max(cb.decisions_started - 1, 0)
        for j, given in plan.forced_observations.items():
            if j == k:
                for m in check_observation(given, forced.get(k, run.steps[k].action), step=k):
                    guard.forced[str(m.get("tool_call_id"))] = _text(m.get("content"), given)
        later = {j: o for j, o in plan.forced_observations.items() if j > k}

        def forced_later(tool_call_id: str) -> Any:  # do_observation on a live later step
            found = cb.decision_with_call(tool_call_id)
            j = k + offset + found[0] if found is not None else None
            if found is None or j not in later:
                return RUN
            given = check_observation(later[j], to_dict(found[1]), step=j)
            return next(_text(m.get("content"), later[j]) for m in given
                        if m.get("tool_call_id") == tool_call_id)

        guard.lookup = forced_later if later else None
        settle: Callable[[Any], Trajectory | None] | None = None
        if stop is not None and not any(j > k for j in plan.context_edits):
            def settle(values: Any) -> Trajectory | None:
                partial = self._collect(run, plan, k, thread_id, cb, offset, forced, control,
                                        noise, RunStatus.SETTLED, final=values,
                                        live=cb.open_steps(values))
                return partial if stop(partial) else None
        self._fork(run, k, thread_id, edited)  # the first write, after every check passed
        try:
            with controlling(thread_id, control), guarding(thread_id, guard):
                if k in forced and self.model is None:
                    self._write_action(run, k, thread_id, forced[k])
                    control.next_index = k + 1
                    offset = 1
                status = self._drive(run, k, thread_id, cb, control, settle)
            if isinstance(status, Trajectory):
                return status
            return self._collect(run, plan, k, thread_id, cb, offset, forced, control,
                                 noise, status)
        finally:
            if not self.keep_branches:
                self.saver.delete_thread(thread_id)

    def redecide(self, run: Trajectory, k: int, noise: Noise) -> Any:
        """Decide step ``k`` again from its recorded checkpoint, in a throwaway thread that
        stops at its first model decision."""
        self.preflight(run)
        self._check(run, k)
        thread_id = f"car-branch-{uuid.uuid4().hex}"
        self._fork(run, k, thread_id, None)
        stop = _FirstDecision()
        guard = Guard(self.safety, _recorded(run), run_id=run.id)
        try:
            with controlling(thread_id, Control(k, noise=noise if self.couples_noise
                                                else None)), guarding(thread_id, guard):
                try:
                    self._invoke(None, {**_thread(thread_id), "callbacks": [
                        *self._watch(run), stop], "max_concurrency": 1})
                except _Decided:
                    pass
            if stop.message is None:
                raise AdapterError(f"step {k} made no model decision when decided again",
                                   run_id=run.id, step=k,
                                   hint="use the app the run was recorded with")
            return to_dict(stop.message)
        finally:
            self.saver.delete_thread(thread_id)

    # -- import -------------------------------------------------------------------------------

    def import_thread(self, thread_id: str) -> Trajectory:
        """The trajectory of an existing thread, rebuilt from its checkpoint history in every
        namespace (subgraphs included): each ``AIMessage`` a model node wrote is a step, decided
        from the checkpoint before it. Messages a subgraph node passes up to its parent, and
        messages written by tool nodes, by the framework (handoff notices) or by a node that
        calls no model (``_model_wrote``), are not decisions.
        A thread invoked several times (a conversation) gives one trajectory over all turns;
        the callback gives one per invocation."""
        self._saver_loop()
        namespaces = sorted({t.config["configurable"].get("checkpoint_ns") or ""
                             for t in self.saver.list(_thread(thread_id, None, None))})
        if "" not in namespaces:
            raise AdapterError(f"no thread {thread_id!r} in this app's checkpointer",
                               hint="check the thread id and that the app uses the same "
                                    "checkpointer (database file) the run was recorded with")
        found: list[tuple[str, int, Step]] = []
        head_next: tuple[str, ...] = ()
        final: dict[str, Any] = {}
        for ns in namespaces:
            level = _recast(ns)
            if level not in self.graphs:
                raise AdapterError(f"thread {thread_id!r} has checkpoints of subgraph {level!r}"
                                   ", which this app does not expose as a subgraph",
                                   hint="import with the app the thread was recorded with")
            chain = self._chain(thread_id, ns)
            if ns == "":
                head_next, final = tuple(chain[-1].next), chain[-1].values
            decisions: dict[str, tuple[str, dict[str, Any], list[dict[str, Any]]]] = {}
            for prev, cur in zip(chain, chain[1:], strict=False):
                nodes = [n for n in prev.next if (level, n) not in self.tool_nodes
                         and _join(level, n) not in self.graphs and n != "__start__"]
                if cur.metadata.get("source") != "loop" or not nodes:
                    continue
                before = prev.values.get(self.messages_key) or []
                seen = {m.id for m in before}
                if len(nodes) > 1:
                    if any(isinstance(m, AIMessage) and m.id not in seen
                           and not _framework_written(m)
                           for m in cur.values.get(self.messages_key) or []):
                        raise AdapterError(
                            f"thread {thread_id!r} has a superstep whose parallel tasks "
                            f"(nodes {sorted(set(nodes))}: a Send fan-out or parallel model "
                            "nodes) wrote model messages; its checkpoints do not say which task "
                            "decided which message", hint="record the app with CarCallback, "
                            "which keeps each model call's task")
                    continue
                cid = prev.config["configurable"]["checkpoint_id"]
                parents = dict(prev.metadata.get("parents") or {})
                task = next((t for t in prev.tasks if t.name == nodes[0]), None)
                for m in cur.values.get(self.messages_key) or []:
                    if (isinstance(m, AIMessage) and m.id not in seen
                            and not _framework_written(m)
                            and self._model_wrote(level, nodes[0], m)):
                        decisions[m.id] = (cur.config["configurable"]["checkpoint_id"], {
                            "origin": Origin.RECORD, "thread_id": thread_id, "checkpoint_id": cid,
                            "checkpoint_ns": ns, "checkpoint_map": {**parents, ns: cid},
                            "ns": ns, "agent": agent_of(ns, self.app.get_name(), nodes[0]),
                            "node": nodes[0], "langgraph_step": cur.metadata.get("step"),
                            "task_ns": (f"{_join(ns, nodes[0])}:{task.id}" if task is not None
                                        else None),
                            "task_path": jsonable(list(task.path)) if task is not None
                            else None,
                            "model": (m.response_metadata or {}).get("model_name"),
                            "usage": usage_of(m)}, to_dicts(before))
            messages = chain[-1].values.get(self.messages_key) or []
            for pos, action, obs, observed in decode(messages, decisions):
                order, meta, state = decisions[messages[pos].id]
                found.append((order, pos, Step(index=0, action=action, observation=obs,
                                               observed=observed, state=state, meta=meta)))
        found.sort(key=lambda f: (f[0], f[1]))  # checkpoint ids are time-ordered (uuid6)
        steps = [replace(s, index=i) for i, (_, _, s) in enumerate(found)]
        context = {"messages": steps[0].state} if steps else {"input": None}
        return Trajectory.new(context=context, steps=steps, agent=self.name,
                              status=RunStatus.INTERRUPTED if head_next else RunStatus.COMPLETE,
                              meta={"framework": "langgraph", "thread_id": thread_id,
                                    "final_state": jsonable(final), "imported": True,
                                    "agent_fingerprint": app_digest(self.app)})

    def _model_wrote(self, level: str, node: str, message: Any) -> bool:
        """Whether ``message`` (an ``AIMessage`` node ``node`` wrote) is a model decision, as
        the callback would have recorded it: a node that reaches no chat model and a message
        under a plain uuid (the id ``add_messages`` gives a message written without one; a
        chat model's output carries its run id or the provider's) is a node's own message."""
        reached = self.reaches.get((level, node))
        if reached is None or reached.calls_a_model:
            return True
        try:
            return str(uuid.UUID(str(message.id))) != str(message.id)
        except ValueError:
            return True

    def _chain(self, thread_id: str, ns: str) -> list[Any]:
        """The checkpoints of one namespace from its first to its head, following parents (so
        earlier forks are skipped)."""
        history = list(self.app.get_state_history(_thread(thread_id, None, ns)))
        by_id = {h.config["configurable"]["checkpoint_id"]: h for h in history}
        chain, snap = [], history[0] if history else None
        while snap is not None:
            chain.append(snap)
            parent = (snap.parent_config or {}).get("configurable", {}).get("checkpoint_id")
            snap = by_id.get(parent) if parent else None
        chain.reverse()
        return chain

    # -- checks -------------------------------------------------------------------------------

    def preflight(self, run: Trajectory) -> None:
        """Refuse a run whose steps this app cannot fork into, naming the shape and the node,
        before any branch of it runs (checked once per run)."""
        self._saver_loop()
        if run.id in self._checked:
            return
        if run.meta.get("framework") != "langgraph":
            raise AdapterError("this run was not recorded from a LangGraph app", run_id=run.id,
                               hint="record it with CarCallback or import_thread")
        thread_id = str(run.meta.get("thread_id"))
        if self.saver.get_tuple(_thread(thread_id)) is None:  # a setup error, not the agent's
            raise AgentMismatch(f"thread {thread_id!r} does not exist in this app's "
                                "checkpointer", run_id=run.id,
                                hint="build the agent on the checkpointer (database) the run "
                                     "was recorded with; an InMemorySaver keeps its threads "
                                     "only in the process that recorded them")
        if self.model is not None:
            refuse_undecided(run, self.undecided)
        groups: dict[tuple[str, str], dict[str, list[int]]] = {}  # checkpoint -> task -> steps
        for i, step in enumerate(run.steps):
            meta = step.meta
            node, ns = meta.get("node"), meta.get("checkpoint_ns") or ""
            cmap = _cmap(meta)
            if not cmap:
                raise AdapterError(
                    f"step {i} (a model call in node {node!r}) ran outside any graph task "
                    "with a checkpoint — a model called inside a tool, or a graph without "
                    "checkpoints — so no branch can start there", run_id=run.id, step=i,
                    hint="call models from graph nodes; tools that call models are not forked")
            graph = self.graphs.get(_recast(ns))
            if graph is None:
                raise AdapterError(
                    f"step {i} was decided inside subgraph {_recast(ns)!r} (node {node!r}), "
                    "which this app does not expose as a subgraph", run_id=run.id, step=i,
                    hint="add the compiled subgraph as a node, or call it from a node "
                         "function, so it inherits the parent's checkpointer")
            if node not in graph.nodes:
                where = f"subgraph {_recast(ns)!r}" if ns else "this graph"
                raise AdapterError(
                    f"step {i} was decided by node {node!r}, which {where} does not have: "
                    "either the run comes from a different graph, or the model ran in a "
                    "subgraph that keeps no checkpoints (compiled with checkpointer=False, or "
                    "with its own checkpointer)", run_id=run.id, step=i,
                    hint="use the app the run was recorded with; compile subgraphs without "
                         "checkpointer= so they inherit the parent's")
            if (_recast(ns), node) in self.tool_nodes:
                raise AdapterError(f"step {i} is not a model decision of a graph node: it "
                                   f"ran in tool node {node!r} (a model called inside a "
                                   "tool)", run_id=run.id, step=i,
                                   hint="intervene on a step whose action a model node wrote")
            for level, cid in cmap.items():
                groups.setdefault((level, str(cid)), {}).setdefault(
                    _task_at(meta, level), []).append(i)
        for (level, _), by_task in groups.items():
            _check_superstep(run, level, by_task)
        parallel = {key for key, by_task in groups.items() if len(by_task) > 1}
        for k, step in enumerate(run.steps):  # a Send worker held by its writes must have some
            for ns, cid in _cmap(step.meta).items():
                source = (self.saver.get_tuple(_thread(thread_id, cid, ns))
                          if (ns, str(cid)) in parallel else None)
                if source is not None:
                    self._carried_writes(run, k, ns, source)
        with self._lock:
            self._checked.add(run.id)

    def _check(self, run: Trajectory, k: int) -> Any:
        """Refuse a step this app cannot fork at, before anything is written anywhere."""
        if not 0 <= k < len(run.steps):
            raise StepOutOfRange(f"step {k} does not exist; the run has {len(run.steps)} steps",
                                 run_id=run.id)
        step = run.steps[k]
        thread_id = str(run.meta.get("thread_id"))
        for ns, cid in _cmap(step.meta).items():
            if self.saver.get_tuple(_thread(thread_id, cid, ns)) is None:
                raise AdapterError(f"checkpoint {cid} of thread {thread_id!r} (namespace "
                                   f"{ns!r}) was deleted", run_id=run.id, step=k,
                                   hint="the run cannot be forked there; record it again")
        ns = step.meta.get("checkpoint_ns") or ""
        snapshot = self.saver.get_tuple(_thread(thread_id, step.meta["checkpoint_id"], ns))
        values = snapshot.checkpoint["channel_values"].get(self.messages_key) or []
        if not is_send_task(step.meta) and to_dicts(values) != step.state:
            raise AdapterError(f"the checkpoint step {k} was scheduled from does not match the "
                               "record: the run comes from a different graph or thread",
                               run_id=run.id, step=k,
                               hint="use the app and thread the run was recorded with")
        return snapshot

    # -- the machinery ------------------------------------------------------------------------

    def _carried_writes(self, run: Trajectory, k: int, ns: str, source: Any
                        ) -> list[tuple[str, str, Any]]:
        """The pending writes of checkpoint ``source`` (level ``ns``) a fork at step ``k``
        keeps: those of every task of that superstep except the tasks that hold step ``k`` or a
        later step (those run again). A ``Send`` worker whose step comes before ``k`` is held
        this way, by its recorded writes, never re-run; one whose task did not finish in the
        record (no writes, or an error) cannot be held, and the step is refused."""
        cid = str(source.config["configurable"]["checkpoint_id"])
        hosts = [(j, _task_at(s.meta, ns)) for j, s in enumerate(run.steps)
                 if str(_cmap(s.meta).get(ns)) == cid]
        if any(not run.steps[j].meta.get("task_ns") for j, _ in hosts):
            return []  # a record that does not name its tasks: none of them is held
        later = {_task_id(t) for j, t in hosts if j >= k}
        held = {_task_id(t): j for j, t in hosts if j < k and _task_id(t) not in later}
        writes = [tuple(w) for w in source.pending_writes or ()
                  if w[0] not in later and w[0] != NULL_TASK_ID]
        done = {w[0] for w in writes if w[1] not in (ERROR, INTERRUPT)}
        unfinished = sorted(j for tid, j in held.items() if tid not in done)
        if unfinished:
            raise AdapterError(
                f"step {unfinished[0]} ran in a parallel task of the superstep step {k} belongs "
                f"to (node {run.steps[unfinished[0]].meta.get('node')!r}), and that task did not "
                f"finish in the record, so a fork at step {k} could only hold it by running it "
                "again", run_id=run.id, step=k,
                hint="intervene at an earlier step, or record a run whose parallel tasks all "
                     "finish")
        return writes  # type: ignore[return-value]

    def _fork(self, run: Trajectory, k: int, thread_id: str,
              edited: list[dict[str, Any]] | None) -> None:
        """Copy the checkpoints step ``k`` was scheduled from — one per graph level, so a fork
        inside a subgraph resumes there under its parents as recorded — into ``thread_id``.
        The pending writes of the tasks that hold step ``k`` and later steps are left behind
        (LangGraph would replay them instead of deciding again); those of the other tasks of
        the superstep (``Send`` workers whose steps come earlier) are kept, so LangGraph hands
        them back instead of re-running those tasks. A ``do_context`` edit is written into the
        copy of the step's own level directly: the checkpoint keeps its channel versions, so
        exactly the model task that was scheduled runs again (no ``update_state``, whose guess
        of the writing node breaks ``Send``-routed graphs); a ``Send`` task's step is edited at
        its model call instead (its input is its ``Send`` payload). A step inside a subgraph
        (a supervisor or worker agent) decides from messages its parents hold too, under the
        same ids: the edit replaces them at every level, so what the subgraph hands back, and
        every later agent reading the parent's messages, sees the edited history."""
        meta = run.steps[k].meta
        source_thread = str(run.meta["thread_id"])
        own = meta.get("checkpoint_ns") or ""
        cmap = _cmap(meta)
        sources = {ns: self.saver.get_tuple(_thread(source_thread, cid, ns))
                   for ns, cid in cmap.items()}
        replaced: set[str] = set()
        messages: list[Any] = []
        if edited is not None and not is_send_task(meta):
            messages = from_dicts(edited)
            for m in messages:
                if m.id is None:
                    m.id = str(uuid.uuid4())
            replaced = {m.id for m in sources[own].checkpoint["channel_values"].get(
                self.messages_key) or () if m.id is not None}
        for ns, cid in cmap.items():
            source = sources[ns]
            checkpoint = dict(source.checkpoint)
            values = checkpoint["channel_values"].get(self.messages_key) or []
            if ns == own and edited is not None and not is_send_task(meta):
                checkpoint["channel_values"] = {**checkpoint["channel_values"],
                                                self.messages_key: messages}
            elif replaced and any(getattr(m, "id", None) in replaced for m in values):
                checkpoint["channel_values"] = {**checkpoint["channel_values"],
                                                self.messages_key: _splice(values, replaced,
                                                                           messages)}
            config = self.saver.put(_thread(thread_id, None, ns), checkpoint,
                                    {**source.metadata, "car_fork_of": cid},
                                    dict(checkpoint["channel_versions"]))
            by_task: dict[str, list[tuple[str, Any]]] = {}
            for tid, channel, value in self._carried_writes(run, k, ns, source):
                by_task.setdefault(tid, []).append((channel, value))
            for tid, task_writes in by_task.items():
                self.saver.put_writes(config, task_writes, tid)

    def _watch(self, run: Trajectory) -> list[BaseCallbackHandler]:
        """The handler that stops a branch at a model call CAR does not decide (only where CAR
        numbers the calls it decides)."""
        return [UndecidedCalls(run.id)] if self.model is not None else []

    def _write_action(self, run: Trajectory, k: int, thread_id: str,
                      action: Mapping[str, Any]) -> None:
        """Write ``action`` as step ``k``'s node in its own namespace, so the node's routing
        (edges, ``Send``, ``Command``) runs as if the model had decided it."""
        meta = run.steps[k].meta
        ns = meta.get("checkpoint_ns") or ""
        self.app.update_state(_thread(thread_id, None, ns) if ns else _thread(thread_id),
                              {self.messages_key: [action_message(action)]},
                              as_node=meta["node"])

    def _drive(self, run: Trajectory, k: int, thread_id: str, cb: CarCallback,
               control: Control, settle: Callable[[Any], Trajectory | None] | None = None
               ) -> str | Trajectory:
        """Run the branch thread forward; side-effect tools are answered by the guard. With
        ``settle``, the graph state is offered to it before the first superstep and after each
        one, and the first partial branch it returns ends the run (sync apps only)."""
        config = {**_thread(thread_id), "recursion_limit": self.recursion_limit,
                  "callbacks": [*self._watch(run), cb], "max_concurrency": 1}
        try:
            if settle is None or self.is_async or self._saver_loop() is not None:
                self._invoke(None, config)
            else:
                done = settle(self.app.get_state(_thread(thread_id)).values)
                if done is not None:
                    return done
                stream = self.app.stream(None, config, stream_mode="values")
                try:
                    for values in stream:
                        done = settle(values)
                        if done is not None:
                            return done
                finally:
                    stream.close()
        except GraphRecursionError:
            return RunStatus.MAX_STEPS
        snap = self.app.get_state(_thread(thread_id))
        if snap.next:
            raise AdapterError(f"the graph stopped at node {snap.next[0]!r} for input on a "
                               "branch (interrupt); a branch has nobody to answer it",
                               run_id=run.id, step=control.next_index,
                               hint="attribute runs of a graph without human-in-the-loop "
                                    "interrupts, or intervene after the interrupt")
        return RunStatus.COMPLETE

    def _collect(self, run: Trajectory, plan: Plan, k: int, thread_id: str, cb: CarCallback,
                 offset: int, forced: Mapping[int, Any], control: Control, noise: Noise,
                 status: str, final: Any = None, live: list[Step] | None = None
                 ) -> Trajectory:
        if final is None:
            final = self.app.get_state(_thread(thread_id)).values
        steps = run.held_prefix(k)
        if live is None:
            live = [s for r in cb.runs for s in r.steps]
        if offset:  # step k was written as its node, without a model call
            rec = run.steps[k]
            results = {tid: m for tid, m in cb.tool_results().items()}
            obs = [to_dict(results[cid]) for cid, _, _ in calls_of(forced[k]) if cid in results]
            given = (_as_recorded(plan.forced_observations[k], obs or None)
                     if k in plan.forced_observations else obs or None)
            steps.append(Step(index=k, action=dict(forced[k]), observation=given,
                              observed=given is not None, state=rec.state,
                              meta=jsonable({**rec.meta, "thread_id": thread_id,
                                             "origin": plan.origin(k)})))
        for i, s in enumerate(live):
            j = k + offset + i
            meta = {**s.meta, "thread_id": thread_id, **control.steps.get(j, {}),
                    "origin": plan.origin(j)}
            if j in control.inputs:  # the callback saw the input before CAR replaced it
                s = replace(s, state=to_dicts(control.inputs[j]))
            obs = (_as_recorded(plan.forced_observations[j], s.observation)
                   if j in plan.forced_observations else s.observation)
            steps.append(Step(index=j, action=s.action, observation=obs,
                              observed=s.observed or j in plan.forced_observations,
                              state=s.state, meta=jsonable(meta)))
        return Trajectory.new(context=run.context, steps=steps, seed=noise.seed,
                              agent=self.name, status=status,
                              meta={"framework": "langgraph", "thread_id": thread_id,
                                    "parent_thread_id": run.meta.get("thread_id"),
                                    "final_state": jsonable(final)})


def _recorded(run: Trajectory) -> dict[tuple[str, str], Any]:
    """Every tool call of ``run`` a branch's matching call may be answered with: the tool calls
    of its decisions, and the calls its nodes made themselves (recorded by the callback)."""
    out = recorded_calls(run.steps)
    for call in run.meta.get("node_tool_calls") or ():
        if isinstance(call, Mapping) and call.get("name"):
            out.setdefault((str(call["name"]), str(call.get("arguments"))), call.get("content"))
    return out


def _splice(values: list[Any], replaced: set[str], messages: list[Any]) -> list[Any]:
    """A parent level's messages with those of ids ``replaced`` (what the edited step saw)
    replaced by ``messages`` (the edit) where the first of them stood; the rest kept."""
    out: list[Any] = []
    placed = False
    for m in values:
        if getattr(m, "id", None) not in replaced:
            out.append(m)
        elif not placed:
            out.extend(messages)
            placed = True
    return out


def _task_at(meta: Mapping[str, Any], level: str) -> str:
    """The namespace of the task at graph level ``level`` that a step ran in: the step's own
    model task at its own level, the subgraph task holding it at a parent level."""
    parts = str(meta.get("task_ns") or "").split("|")
    depth = len(level.split("|")) if level else 0
    return "|".join(parts[:depth + 1])


def _task_id(task_ns: str) -> str:
    return task_ns.split("|")[-1].split(":")[-1]


def _check_superstep(run: Trajectory, level: str, by_task: Mapping[str, list[int]]) -> None:
    """Refuse the tasks of one superstep (scheduled from one checkpoint at ``level``) that no
    fork can hold apart: several model calls in one task, or parallel tasks other than
    ``Send`` tasks that each make one model call in the task itself."""
    def own(i: int) -> bool:
        return (run.steps[i].meta.get("checkpoint_ns") or "") == level

    for steps in by_task.values():
        if len(steps) > 1 and any(own(i) for i in steps):
            node = run.steps[steps[1]].meta.get("node")
            raise AdapterError(
                f"node {node!r} made several model calls in one task (steps {steps[0]} and "
                f"{steps[1]}); forking at the later one would re-run the earlier one",
                run_id=run.id, step=steps[1], hint="make one model call per node run (split "
                "the node)")
    if len(by_task) < 2:
        return
    first, second = sorted(steps[0] for steps in by_task.values())[:2]
    nodes = sorted({str(run.steps[i].meta.get("node")) for s in by_task.values() for i in s})
    inner = next((i for s in by_task.values() for i in s if not own(i)), None)
    if inner is not None:
        raise AdapterError(
            f"steps {first} and {second} ran in parallel tasks of one superstep (nodes "
            f"{nodes}), and step {inner} was decided inside a subgraph one of them runs (a Send "
            "fan-out or parallel branches into subgraphs): their checkpoints interleave, so no "
            "fork can hold one task apart from the others", run_id=run.id, step=inner,
            hint="send to plain nodes that call the model themselves, or run the subgraphs one "
                 "superstep at a time")
    pull = next((s[0] for s in by_task.values() if not is_send_task(run.steps[s[0]].meta)), None)
    if pull is not None:
        raise AdapterError(
            f"steps {first} and {second} are model calls scheduled from the same checkpoint "
            f"in parallel (nodes {nodes}: several model nodes in one superstep, not Send "
            "tasks); forking one of them would re-run the other", run_id=run.id, step=pull,
            hint="run model nodes one superstep at a time, or fan out with Send")


def _cmap(meta: Mapping[str, Any]) -> dict[str, str]:
    """The checkpoint of every graph level a step was scheduled from (older records: one)."""
    cmap = meta.get("checkpoint_map")
    if cmap:
        return dict(cmap)
    cid = meta.get("checkpoint_id")
    return {(meta.get("checkpoint_ns") or ""): cid} if cid else {}


def _as_recorded(given: Any, results: Any) -> Any:
    """The observation a forced step records: the tool results the graph got, when the user
    gave results (strings or tool messages); else the value exactly as given."""
    items = given if isinstance(given, (list, tuple)) else [given]
    if all(isinstance(i, str) or (isinstance(i, Mapping) and "content" in i) for i in items):
        return results
    return given


def _text(content: Any, given: Any) -> Any:
    """A forced tool result's content: a given value with no ``content`` field is sent whole,
    as JSON."""
    if content is not None:
        return content
    return given if isinstance(given, str) else json.dumps(given, default=str)


def _as_dicts(edited: Any, run_id: str, k: int) -> list[Mapping[str, Any]]:
    if isinstance(edited, (str, bytes)) or not isinstance(edited, (list, tuple)):
        raise InvalidIntervention(f"the do_context edit returned {type(edited).__name__}, not a "
                                  "list of messages", run_id=run_id, step=k,
                                  hint="the edit takes and returns the list of message dicts")
    for m in edited:
        if not isinstance(m, Mapping):
            raise InvalidIntervention(f"the do_context edit returned a non-message {m!r}",
                                      run_id=run_id, step=k,
                                      hint="each message is a dict with 'role' and 'content'")
    return list(edited)


def attribute_thread(app: Any, thread_id: str, *, outcome: Callable[..., Any],
                     method: str = "contrastive", store: str | os.PathLike[str] | RunStore |
                     None = None, model: CarChatModel | CarMiddleware | None = None,
                     side_effect_tools: Iterable[str] = (),
                     simulators: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
                     match_on: Mapping[str, Iterable[str] | str] | None = None,
                     node_tools: Iterable[str | BaseTool] = (),
                     rollouts: int = 16, budget: int = 2000, seed: int = 0,
                     **options: Any) -> Any:
    """Import ``thread_id`` from ``app``, score it with ``outcome(run)`` (as everywhere; the
    final graph state is ``run.meta["final_state"]``, messages as OpenAI-style dicts; 1 / True
    = failure), store it, and attribute the failure with ``car.contrastive`` or
    ``car.shapley``. Returns the stored attribution. Importing a thread again reuses the run
    already stored for it (same steps, final state and outcome) instead of storing a copy. An
    outcome written for the old ``outcome(final_state)`` form still works, with a
    ``DeprecationWarning`` (see ``car_adapters.langgraph.thread``)."""
    import car_core as car
    if method not in ("contrastive", "shapley"):
        raise InvalidInput(f"method={method!r}", hint="use 'contrastive' or 'shapley'")
    agent = LangGraphAgent(app, model=model, side_effect_tools=side_effect_tools,
                           simulators=simulators, match_on=match_on, node_tools=node_tools)
    run = agent.import_thread(thread_id)
    score = thread_outcome(outcome)
    run = replace(run, outcome=Outcome(OutcomeFn(score)(run, Noise(seed).rng(0, "outcome"))),
                  seed=seed)
    opened = isinstance(store, (str, os.PathLike))
    runs = RunStore(store) if opened else store
    try:
        if runs is not None:
            run = _stored_copy(runs, run)
            runs.save(run)
        if method == "contrastive":
            return car.contrastive(run, agent, outcome=score, rollouts=rollouts, seed=seed,
                                   store=runs, **options)
        return car.shapley(run, agent, outcome=score, budget=budget, seed=seed, store=runs,
                           **options)
    finally:
        if opened and runs is not None:  # a store this call opened from a path
            runs.close()


def _stored_copy(runs: RunStore, run: Trajectory) -> Trajectory:
    """``run`` under the id of an equal run already in the store (the same thread imported
    before: same steps, meta and outcome), so importing twice stores one run."""
    for run_id in runs.with_digest(run.digest):
        stored = runs.load(run_id)
        if stored.meta == run.meta and stored.outcome == run.outcome:
            return replace(run, id=stored.id, created_at=stored.created_at)
    return run
