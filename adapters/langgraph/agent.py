"""LangGraph adapter: record with a callback, fork checkpoints under interventions, attribute.

``CarCallback`` records runs. ``LangGraphAgent(app)`` implements the car_core agent protocol
with LangGraph's own machinery, for an app whose messages live in a ``messages`` channel with
the ``add_messages`` reducer. An app compiled without a checkpointer is branched on a copy of it
with an ``InMemorySaver`` CAR supplies (``saver``; the app itself is never changed):

- **Fork.** A branch from step ``k`` copies the checkpoints the step-``k`` task was scheduled
  from — one per graph level, so a step inside a subgraph (a worker agent) resumes there under
  its parents as recorded — into a new thread, without their pending writes (which would replay
  the recorded step). Branches never see each other and the user's thread is untouched; steps
  before ``k`` are served from the record with no model or tool call. Branch threads are deleted
  afterwards unless ``keep_branches=True``. Every step of a run is checked once, before its
  first branch runs; a run this app cannot fork is refused naming the shape and the node.
- **Record anywhere.** A run whose thread the checkpointer does not hold (recorded with an
  ``InMemorySaver`` in another process, or with no checkpointer at all) is branched from fork
  points rebuilt from the record:
  the step's recorded messages written into the branch's fresh thread so the step's model node
  runs next (``rebuild``), where the messages are all the state it was scheduled from; where
  they are not (a subgraph step, a ``Send`` task, other state keys the run wrote) the run is
  refused with ``CheckpointsMissing`` before any branch.
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
  A ``create_agent`` structured answer (a schema tool's call, or a text its model node parses)
  is parsed at the model call, so forcing one needs ``CarMiddleware`` (refused without it).
  A ``Send`` task builds its model input from its payload, so there ``do_context`` replaces
  that input at the model call, and ``do_action`` / ``do_observation`` / ``do_context`` need
  ``CarChatModel`` (without it they are refused; ``do_resample`` works). The same holds at a
  step whose node built the model's whole input itself (a ``SummarizationMiddleware``'s
  summarizer call, ``meta["input"] == "node"``): the fork re-runs that node on the recorded
  checkpoint, which builds the same input, and a forced action or input needs a
  ``CarChatModel`` at that call.
  A system prompt the step's node prepends at a model call CAR decides (``create_agent``'s
  ``system_prompt``; ``meta["input"] == "prompt+state"``) is edited with the messages: the
  graph's go to the fork, the edited prompt with them to that call only (refused by name
  without ``model=``). So are the descriptions of the tools such a call was offered
  (``meta["tools"]``): that call only is bound the tools so described, their functions
  unchanged (refused by name without ``model=``).
  ``do_observation`` answers the step's tool calls by id. ``do_resample`` simply resumes.
- **The model.** Held steps after ``k`` (Shapley coalitions), ``do_policy`` (a LangChain chat
  model that decides from ``k`` on) and per-step seeds need CAR to decide the model calls:
  ``CarMiddleware`` on ``create_agent`` or ``CarChatModel(inner=model)``, passed as ``model=``.
- **Tools** are every one classified when the agent is built: ``safe_tools`` (and tools an MCP
  server annotates ``readOnlyHint: true``) run live on branches; ``side_effect_tools`` (and
  MCP tools not annotated read-only, and tools a ``HumanInTheLoopMiddleware`` gates) never
  run, answered by the guard (``guard``) wherever they run: from the record on a call that
  matches on the arguments that matter (``match_on``), else by the simulator
  (``simulators[name](arguments)``, or ``(arguments, ctx)`` with ``ctx`` the values LangGraph
  injected into the call and its ``tool_call_id``; it may return a ``Command(update=...)`` as
  the tool could), else ``SideEffectBlocked``. A guarded tool whose recorded ``Command`` wrote
  graph state is refused before any branch where the record cannot replay the write and no
  simulator answers it. A tool no source classifies is
  refused by name (``UnclassifiedTools``) unless ``unclassified="live"`` (``tool_classes``).
  The record holds the calls a node makes itself too (the callback keeps them), so those are
  answered like a ``ToolNode``'s. A tool name, in any parameter, that no tool of the graph has
  is refused; the graph's tools are its ``ToolNode``s' and those a node's code reaches
  (``reach``), plus tool objects given as ``node_tools``. A model's tool call a node answers
  with its own code is refused before any branch (no guard sits there), unless it is known to
  run as a LangChain tool or the user names it in ``routing_calls`` (code that only routes or
  reads, run live: the customer-support tutorial's ``ToFlightBookingAssistant``).
- **Undecided model calls.** With ``model=``, CAR numbers the model calls it decides; a node
  that can call a model CAR does not decide is refused before the first branch, and a branch
  that calls one anyway is stopped at that call (``undecided``).
- **Coroutines, concurrently.** ``abranch`` is ``branch`` as a coroutine (``ainvoke`` /
  ``astream``), the same code and checks over async calls (``calls``), so one plan and noise
  give one branch on either path. Apps with async-only tools (MCP tools) branch on both; sync
  nodes and tools run in LangGraph's worker threads. Per-branch state (the model control, the
  guard) is found through the branch's thread id in the runnable config, a context variable,
  so branches on one loop never see each other's. When the app's model waits on a server
  (``prefers_concurrency``), estimates default to the asyncio executor; in-process models
  keep the sequential one.
- **What the run was invoked with** besides its input (``invocation``): its configurable keys
  and runtime context, as the callback recorded them, under ``configurable=`` / ``context=``;
  a run whose context or keys the record could not keep, and that were not given, is refused
  before any branch.
- **The store** (``branch_store``): an app compiled with one says where branches read it,
  ``"live"`` or a store of the user's, refused when it does not; each branch writes to a copy
  of its own over it, never to a real store.
- ``import_thread(thread_id)`` rebuilds the trajectory the callback would have recorded from the
  checkpoint history of every namespace; ``attribute_thread`` imports and attributes in one call.
- **Stops for a person.** An app compiled with ``interrupt_before`` / ``interrupt_after`` on a
  node a branch of the run reaches is refused before any branch (``interrupts``); a branch that
  stops for human input anyway (``interrupt()`` in a node's code) is an ``AdapterError`` there:
  nobody is there to answer. An app with async-only nodes or tools on a checkpointer with no
  coroutine methods (``SqliteSaver``) is refused before any branch too (``saver``).

This module drives branches; the parts live beside it: ``shape`` (what the app's builder says,
read once), ``refusals`` (every shape CAR cannot make faithful, refused before the first write),
``plan`` (the intervention plan read once, per step), ``branch_state`` (one branch in flight
and the trajectory it records), ``checkpoints`` (the fork), ``rebuild`` (fork points rebuilt
from the record), ``saver`` (the checkpointer an app compiled without one branches on),
``interrupts`` (where the app stops for a person), ``calls`` (the app and checkpointer, sync
or async) and ``importer`` (threads).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.tools import BaseTool
    from langgraph.errors import GraphRecursionError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("car_adapters.langgraph needs LangGraph: "
                      "pip install 'causal-agent-replay[langgraph]'") from exc

import car_core as car
from car_core import RunStore
from car_core.contract import Noise, Plan, RunStatus, Trajectory, is_outage, redact, scored
from car_core.errors import AdapterError, CarError, InvalidInput

from ..common.branch import check_forced_actions, model_unavailable
from ..common.messages import ToolSafety, recorded_calls
from ..common.named import refuse_side_effect_functions
from ..common.sync import await_on, finish_on, run_sync
from .branch_saver import BranchSaver, writing_through
from .branch_state import BranchState, answerable_calls
from .branch_store import on_branch, read_store
from .caches import refuse_cached
from .callback import CarCallback
from .calls import AsyncCalls, SyncCalls, now, probe_async
from .checkpoints import fork, thread_config
from .errored import refuse_errored
from .fingerprint import app_fingerprint
from .guard import Guard, guarding, raised_by_tool
from .importer import import_thread
from .interrupts import reachable, refuse_interrupts, stopped
from .invocation import NOT_GIVEN, Invocation, context_schema
from .messages import action_message, to_dict
from .middleware import CarMiddleware
from .model import CarChatModel, Control, controlling, seedable, waits_on_server
from .plan import BranchPlan
from .rebuild import Rebuild, rebuild
from .refusals import (
    edit_reaches_call,
    refuse_branch,
    refuse_persistent_subgraphs,
    refuse_run,
    refuse_step,
    refuse_unknown_tools,
)
from .reruns import branch_reruns
from .run_counters import refuse_run_counters
from .saver import branchable, refuse_sync_only, supplied
from .shape import AppShape
from .thread import thread_outcome
from .tool_classes import derived_classes, refuse_state_blind_answers, tool_objects
from .undecided import UndecidedCalls, undecided_nodes

MESSAGES_KEY = "messages"


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


class LangGraphAgent:
    """A compiled LangGraph app as a car_core ``Agent`` (see the module docstring)."""

    _async_saver: bool | None = None  # the checkpointer's coroutine methods work (probed once)

    def __init__(self, app: Any, *, model: CarChatModel | CarMiddleware | None = None,
                 safe_tools: Iterable[str] = (), side_effect_tools: Iterable[str] = (),
                 simulators: Mapping[str, Callable[..., Any]] | None = None,
                 match_on: Mapping[str, Iterable[str] | str] | None = None,
                 node_tools: Iterable[str | BaseTool] = (),
                 messages_key: str = MESSAGES_KEY, keep_branches: bool = False,
                 recursion_limit: int = 50, name: str | None = None,
                 unclassified: str = "refuse", context: Any = NOT_GIVEN,
                 configurable: Mapping[str, Any] | Callable[[Trajectory], Mapping[str, Any]]
                 | None = None, branch_store: Any = None,
                 routing_calls: Iterable[str] = ()) -> None:
        if not hasattr(app, "get_state_history"):
            raise InvalidInput(f"LangGraphAgent needs a compiled LangGraph app, got "
                               f"{type(app).__name__}", hint="pass graph.compile(checkpointer=…)")
        # compiled without a checkpointer: branches run on a copy with one CAR supplies
        app, saver = branchable(app)
        if model is not None and not isinstance(model, (CarChatModel, CarMiddleware)):
            raise InvalidInput("model= must be the CarChatModel the app calls or the "
                               "CarMiddleware its create_agent runs",
                               hint="build the app with CarChatModel(inner=your_model) (or "
                                    "create_agent(..., middleware=[CarMiddleware()])) and pass "
                                    "that same object as model=")
        side_effect_tools = ([side_effect_tools] if isinstance(side_effect_tools, str)
                             else list(side_effect_tools))
        safe_tools = [safe_tools] if isinstance(safe_tools, str) else list(safe_tools)
        node_tools = [node_tools] if isinstance(node_tools, str) else list(node_tools)
        self.app = app
        self.saver = saver
        self.model = model
        self.messages_key = messages_key
        self.keep_branches = keep_branches
        self.recursion_limit = recursion_limit
        # what a branch is invoked with besides its input: the run's own, or these (invocation)
        self.context, self.configurable = context, configurable
        self.context_schema = context_schema(app)
        # the store branches read, each writing to a copy of its own (branch_store)
        self.read_store = read_store(app, branch_store)
        # every graph level CAR can fork into, its tool nodes, what every other node can call
        self.shape = AppShape.of(app, saver, messages_key, node_tools)
        refuse_persistent_subgraphs(self.shape)
        self.tools = self.shape.tools
        # the tool objects by name, which a branch runs again to tell whose its error was
        self.tool_objects = {t.name: t for t in tool_objects(self.shape, node_tools)}
        # tool calls a node answers with code that only routes or reads: run live on branches
        self.routing_calls = frozenset([routing_calls] if isinstance(routing_calls, str)
                                       else routing_calls)
        tools_named = sorted(self.routing_calls & set(self.tools))
        if tools_named:
            raise InvalidInput(f"routing_calls names {tools_named}, which are tools of this "
                               "graph", hint="classify a tool with safe_tools= or "
                                             "side_effect_tools=; routing_calls is for calls a "
                                             "node answers with its own code")
        refuse_unknown_tools(self.tools, {
            "safe_tools": safe_tools,
            "side_effect_tools": side_effect_tools, "simulators": list(simulators or {}),
            "match_on": list(match_on or {}),
            "node_tools": [t for t in node_tools if not isinstance(t, BaseTool)]})
        # every tool classified before any branch: the user's lists, then MCP annotations and
        # approval gates; a tool nothing classifies is refused here (tool_classes)
        self.safety = ToolSafety.of(
            side_effect_tools, simulators, match_on, safe_tools=safe_tools,
            unclassified=unclassified).classified(
            self.tools, derived_classes(self.shape, node_tools),
            agent=f"LangGraph app {app.get_name()!r}", call="LangGraphAgent(app")
        refuse_side_effect_functions(
            {n: (getattr(t, "func", None), getattr(t, "coroutine", None))
             for n, t in self.tool_objects.items()}, self.safety,
            objects=self.tool_objects, code=self.shape.node_code())
        refuse_state_blind_answers(self.tool_objects, self.safety)
        self.couples_noise = self._couples(model)
        # CAR numbers the model calls it decides: a node calling a model it cannot see is refused
        self.undecided = undecided_nodes(self.shape.reaches) if model is not None else []
        self.name = name or f"langgraph:{app.get_name()}"
        # a graph with async-only nodes cannot run under invoke(); branches use ainvoke()
        self.is_async = self.shape.is_async
        self._checked: set[str] = set()
        self._rebuilt: dict[str, Rebuild] = {}  # run id -> how its fork points are rebuilt
        self._lock = threading.Lock()

    @property
    def caveats(self) -> tuple[str, ...]:
        """What every result must say: tools left unclassified that branches ran live."""
        return self.safety.caveats

    def _couples(self, model: CarChatModel | CarMiddleware | None) -> bool:
        """Whether CAR's noise drives the app's model calls: every model CAR decides takes a
        per-step ``seed``. Models it cannot see, or without a seed field, do not couple."""
        if isinstance(model, CarChatModel):
            return seedable(model.inner)
        if not isinstance(model, CarMiddleware) or not model.seed_models:
            return False
        decided = [m for r in self.shape.reaches.values() if r.wrapped for m in r.models]
        return bool(decided) and all(seedable(m) for m in decided)

    def _saver_loop(self, running_ok: bool = False) -> asyncio.AbstractEventLoop | None:
        """The event loop an async checkpointer (AsyncSqliteSaver, AsyncPostgresSaver) is bound
        to, or None for a sync one. Its sync methods only work from another thread while that
        loop runs, so branches run on that loop. ``running_ok``: the caller is a coroutine,
        which may already run on it (else blocking on it here would hang)."""
        loop = getattr(self.saver, "loop", None)
        if not isinstance(loop, asyncio.AbstractEventLoop):
            return None
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop and not running_ok:
            # every_run: where CAR was called, not a run's own trouble (a triage stops)
            raise AdapterError(
                f"{type(self.saver).__name__} runs on this event loop, which CAR would block "
                "while it waits for each branch", hint="call CAR from a worker thread while "
                "the loop runs: await asyncio.to_thread(car.contrastive, run, agent, ...) (or "
                "car.triage, car.shapley)", every_run=True)
        if loop.is_closed() or not loop.is_running():
            raise AdapterError(f"the event loop {type(self.saver).__name__} is bound to is not "
                               "running, so its checkpoints cannot be read",
                               hint="attribute inside the async code that opened the "
                                    "checkpointer: await asyncio.to_thread(car.contrastive, ...) "
                                    "(or car.triage, car.shapley)", every_run=True)
        return loop

    def _invoke(self, value: Any, config: dict[str, Any], **kwargs: Any) -> Any:
        loop = self._saver_loop()
        app = self._branch_app()
        if loop is None and not self.is_async:
            return app.invoke(value, config, **kwargs)
        return run_sync(lambda: app.ainvoke(value, config, **kwargs), loop)

    def _branch_app(self) -> Any:
        """The app as one branch runs it: over a store of its own where it has one
        (``branch_store``)."""
        return on_branch(self.app, self.read_store)

    def fingerprint(self) -> dict[str, Any]:
        """The app's graphs, tools and node code (``car_adapters.langgraph.fingerprint``): a
        run recorded from another app is refused before any branch runs."""
        return app_fingerprint(self.app)

    # -- the protocol -------------------------------------------------------------------------

    def start(self, context: Any, noise: Noise) -> Trajectory:
        """Run the graph on ``context`` (its input) in a new thread, recorded by a callback."""
        refuse_sync_only(self.saver, self.shape.async_only)
        thread_id = f"car-run-{uuid.uuid4().hex}"
        cb = CarCallback(messages_key=self.messages_key)
        how = self._invocation(None)
        config = {**self._config(thread_id, how), "callbacks": [cb],
                  "recursion_limit": self.recursion_limit, "max_concurrency": 1}
        with controlling(thread_id, Control(0, noise=noise if self.couples_noise else None)):
            try:
                self._invoke(context, config, **how.kwargs())
            except GraphRecursionError:
                pass  # recorded with status "error"; the trajectory says why
        assert cb.run is not None
        return replace(cb.run, agent=self.name)

    def branch(self, run: Trajectory, plan: Plan, noise: Noise,
               stop: Callable[[Trajectory], bool] | None = None) -> Trajectory:
        """A branch of ``run`` under ``plan`` in a forked thread (module docstring). With
        ``stop`` (the outcome's ``settled``), the branch ends after the first superstep, or
        before any when the held prefix suffices, where ``stop(branch so far)`` is True, and
        that partial branch (status settled) is returned. A sync app runs under ``invoke`` /
        ``stream`` on this thread; an app with async-only nodes or tools, or an async
        checkpointer, runs the same branch as ``abranch`` does, to its end here."""
        loop = self._saver_loop()
        state = self._prepare(run, plan, noise, stop)
        if isinstance(state, Trajectory):
            return state
        if loop is not None:  # waited for to its end, even when ^C interrupts the wait
            return finish_on(self._run(state, self._calls(state, AsyncCalls)), loop)
        if self.is_async:
            return run_sync(lambda: self._run(state, self._calls(state, AsyncCalls)))
        return now(self._run(state, self._calls(state, SyncCalls)))

    async def abranch(self, run: Trajectory, plan: Plan, noise: Noise,
                      stop: Callable[[Trajectory], bool] | None = None) -> Trajectory:
        """``branch`` as a coroutine (``ainvoke`` / ``astream``), the same branch for the same
        plan and noise: the asyncio executor runs many at once on one loop. Sync nodes and
        tools run in LangGraph's worker threads. With an async checkpointer bound to another
        loop, the branch runs there; with a checkpointer that has no coroutine methods
        (``SqliteSaver``), ``branch`` runs in a worker thread."""
        loop = self._saver_loop(running_ok=True)
        if loop is None and not await self._saver_is_async():
            return await asyncio.to_thread(self.branch, run, plan, noise, stop)
        if loop is None:
            state = self._prepare(run, plan, noise, stop)
        else:  # the checks read the saver with its sync methods: not from its own loop
            state = await asyncio.to_thread(self._prepare, run, plan, noise, stop)
        if isinstance(state, Trajectory):
            return state
        calls = self._calls(state, AsyncCalls)
        if loop is not None and loop is not asyncio.get_running_loop():
            # cancelled (an estimate that stops), the branch is cancelled on the saver's loop and
            # awaited there to its end: its thread is deleted before the saver can be closed
            return await await_on(self._run(state, calls), loop)
        return await self._run(state, calls)

    @property
    def prefers_concurrency(self) -> bool:
        """Whether branches spend their time waiting on a model server (``waits_on_server``
        of the app's models), so estimates default to the asyncio executor, 16 branches in
        flight sharing the model object and whatever rate limiter it holds. In-process models
        (the embedded llama.cpp one, fakes) keep the sequential default, their fastest."""
        return any(waits_on_server(m) for m in self._models())

    def _models(self) -> list[Any]:
        """The chat models the app's branches call: the one ``CarChatModel`` wraps, and every
        model a node reaches."""
        inner = [self.model.inner] if isinstance(self.model, CarChatModel) else []
        return inner + [m for r in self.shape.reaches.values() for m in r.models]

    async def _saver_is_async(self) -> bool:
        if self._async_saver is None:
            self._async_saver = await probe_async(self.saver)
        return self._async_saver

    def _prepare(self, run: Trajectory, plan: Plan, noise: Noise,
                 stop: Callable[[Trajectory], bool] | None) -> BranchState | Trajectory:
        """Every check and refusal of a branch, before anything is written, then its state
        (``branch_state``); a plan that starts past the run's end is the held run itself.
        ``branch`` and ``abranch`` share it, and ``_run``."""
        k = plan.start
        self._check(run)
        self.safety.warn_free_text(run.id, run.steps)
        if k >= len(run.steps):
            steps = run.held_prefix(len(run.steps))
            return Trajectory.new(context=run.context, steps=steps, seed=noise.seed,
                                  agent=self.name, status=run.status, meta=dict(run.meta))
        view = BranchPlan.of(plan)
        refuse_branch(self.shape, run, view, self.model, run.id in self._rebuilt)
        check_forced_actions(plan, self.tools, recorded_calls(run.steps), run.id)
        return BranchState.open(run, view, noise, f"car-branch-{uuid.uuid4().hex}",
                                agent=self.name, safety=self.safety,
                                decides=self.model is not None, coupled=self.couples_noise,
                                recorder=CarCallback(messages_key=self.messages_key),
                                at_call=edit_reaches_call(run.steps[k], self.model),
                                stop=stop)

    def _calls(self, state: BranchState, kind: type[SyncCalls]) -> SyncCalls:
        """How the branch reaches the app and its checkpointer (``kind``: sync or async):
        through a ``BranchSaver`` of its thread, whose delete waits for every write to the
        thread and drops later ones (``branch_saver``: LangGraph's writes outlive a run that
        stops on a cancel)."""
        saver = BranchSaver(self.saver, state.thread_id)
        return kind(writing_through(self._branch_app(), saver), saver)

    async def _run(self, state: BranchState, calls: SyncCalls) -> Trajectory:
        """The branch itself, the same coroutine for ``branch`` and ``abranch``: the fork, the
        held prefix, the guard and the model control; only ``calls`` (sync or async,
        ``car_adapters.langgraph.calls``, over the branch's ``BranchSaver``) differs."""
        run, k, thread_id = state.run, state.plan.start, state.thread_id
        state.reruns = lambda: branch_reruns(  # built only for a branch with an error to judge
            self.tool_objects, self.safety, calls, self._invocation(run).configurable,
            lambda: Guard(self.safety, answerable_calls(run), run_id=run.id))
        try:
            # the first write, after every check passed; a fork cancelled half way is deleted
            await self._fork(calls, run, k, thread_id, state.edited)
            with controlling(thread_id, state.control), guarding(thread_id, state.guard):
                if k in state.forced and self.model is None:
                    await self._write_action(calls, run, k, thread_id, state.forced[k])
                    state.control.next_index = k + 1
                    state.offset = 1
                try:
                    status = await self._drive(state, calls)
                except CarError:
                    raise
                except Exception as exc:  # a model server down: stop, resumable, as everywhere
                    state.guard.raise_blocked()  # the app turned a refusal into another error
                    if is_outage(exc) and raised_by_tool(exc) is None:
                        raise model_unavailable(
                            exc, step=state.current_step(), run_id=run.id,
                            who="the model server"
                        ) from redact.redacted(exc)
                    raise
                # a refusal the app's own tool-error handler turned into a message for the
                # model (ToolNode(handle_tool_errors=...), with_fallbacks): never scored
                state.guard.raise_blocked()
            if isinstance(status, Trajectory):
                return status
            return await state.collect(status,
                                       (await calls.get_state(thread_config(thread_id))).values)
        finally:
            if not self.keep_branches:
                await calls.delete_thread(thread_id)

    def redecide(self, run: Trajectory, k: int, noise: Noise) -> Any:
        """Decide step ``k`` again from its recorded checkpoint, in a throwaway thread that
        stops at its first model decision."""
        self.preflight(run)
        refuse_step(self.shape, run, k, run.id in self._rebuilt)
        thread_id = f"car-branch-{uuid.uuid4().hex}"
        now(self._fork(SyncCalls(self.app, self.saver), run, k, thread_id, None))
        stop = _FirstDecision()
        guard = Guard(self.safety, answerable_calls(run), run_id=run.id)
        try:
            with controlling(thread_id, Control(k, noise=noise if self.couples_noise
                                                else None)), guarding(thread_id, guard):
                how = self._invocation(run)
                try:
                    self._invoke(None, {**self._config(thread_id, how), "callbacks": [
                        *self._watch(run), stop], "max_concurrency": 1}, **how.kwargs())
                except _Decided:
                    pass
            if stop.message is None:
                raise AdapterError(f"step {k} made no model decision when decided again",
                                   run_id=run.id, step=k,
                                   hint="use the app the run was recorded with")
            return to_dict(stop.message)
        finally:
            self.saver.delete_thread(thread_id)

    def import_thread(self, thread_id: str, turn: int | None = None) -> Trajectory:
        """The trajectory of an existing thread, rebuilt from its checkpoint history in every
        namespace, subgraphs included (``car_adapters.langgraph.importer``); of a thread the
        app was invoked on several times (a conversation), the turn ``turn`` (``-1``: the
        last), refused without one."""
        self._saver_loop()
        if supplied(self.saver):
            raise AdapterError(f"the app was compiled without a checkpointer, so it keeps no "
                               f"thread {thread_id!r} to import",
                               hint="compile it with a checkpointer (SqliteSaver(conn)) and "
                                    "run it on a thread_id, or record runs with CarCallback")
        return import_thread(self.shape, thread_id, self.name, turn)

    def preflight(self, run: Trajectory) -> None:
        """Refuse a run whose steps this app cannot fork into, naming the shape and the node,
        before any branch of it runs (checked once per run; ``refusals``)."""
        self._saver_loop()
        self._check(run)

    def check_plan(self, run: Trajectory, plan: Plan) -> None:
        """Refuse a plan ``branch`` would refuse (``refuse_branch``: held later steps of an app
        whose model calls CAR does not decide, a policy that is no chat model, ...) without
        writing a checkpoint or calling a model, so an estimate refuses it before any branch."""
        self.preflight(run)
        if plan.start < len(run.steps):
            refuse_branch(self.shape, run, BranchPlan.of(plan), self.model,
                          run.id in self._rebuilt)
            check_forced_actions(plan, self.tools, recorded_calls(run.steps), run.id)

    def _check(self, run: Trajectory) -> None:
        if run.id in self._checked:
            return
        # shapes no branch of any step survives, before the steps themselves
        refuse_sync_only(self.saver, self.shape.async_only, run.id)
        reached = reachable(self.shape, run)  # the nodes a branch can run, drawn once
        refuse_interrupts(self.shape, run, reached)
        refuse_cached(self.shape, run, reached)
        refuse_run_counters(self.shape, run, reached)
        rebuilt = refuse_run(self.shape, run,
                             self.undecided if self.model is not None else None, self.safety,
                             self.routing_calls)
        refuse_errored(run)  # after the shapes, which name where a run could not go on
        self._invocation(run)  # a context or configurable keys the branches would lack
        with self._lock:
            if rebuilt is not None:
                self._rebuilt[run.id] = rebuilt
            self._checked.add(run.id)

    async def _fork(self, calls: SyncCalls, run: Trajectory, k: int, thread_id: str,
                    edited: list[Any] | None) -> None:
        """Start ``thread_id`` at step ``k``'s fork point: a copy of the checkpoints it was
        scheduled from (``checkpoints.fork``), or, for a run whose thread the checkpointer does
        not hold, the fork point rebuilt from the record (``rebuild``)."""
        rebuilt = self._rebuilt.get(run.id)
        if rebuilt is None:
            await fork(calls, self.messages_key, run, k, thread_id, edited)
        else:
            await rebuild(calls, self.shape, run, k, thread_id, rebuilt.as_node[k], edited)

    # -- the machinery ------------------------------------------------------------------------

    def _invocation(self, run: Trajectory | None) -> Invocation:
        """The configurable keys and runtime context a branch of ``run`` is invoked with:
        the run's recorded ones, under what the user passed (``invocation``)."""
        return Invocation.of(run, self.context_schema, self.context, self.configurable)

    @staticmethod
    def _config(thread_id: str, how: Invocation) -> dict[str, Any]:
        """A branch thread's config: the run's configurable keys, then the thread's."""
        return {"configurable": {**how.configurable,
                                 **thread_config(thread_id)["configurable"]}}

    def _watch(self, run: Trajectory) -> list[BaseCallbackHandler]:
        """The handler that stops a branch at a model call CAR does not decide (only where CAR
        numbers the calls it decides)."""
        return [UndecidedCalls(run.id)] if self.model is not None else []

    async def _write_action(self, calls: SyncCalls, run: Trajectory, k: int, thread_id: str,
                            action: Mapping[str, Any]) -> None:
        """Write ``action`` as step ``k``'s node in its own namespace, so the node's routing
        (edges, ``Send``, ``Command``) runs as if the model had decided it."""
        meta = run.steps[k].meta
        ns = meta.get("checkpoint_ns") or ""
        await calls.update_state(thread_config(thread_id, None, ns) if ns
                                 else thread_config(thread_id),
                                 {self.messages_key: [action_message(action)]},
                                 as_node=meta["node"])

    async def _drive(self, state: BranchState, calls: SyncCalls) -> str | Trajectory:
        """Run the branch thread forward; side-effect tools are answered by the guard. Where
        the branch settles, the graph state is offered to ``state.settle`` before the first
        superstep and after each one, and the first partial branch it returns ends the run."""
        run, thread_id = state.run, state.thread_id
        how = self._invocation(run)
        config = {**self._config(thread_id, how), "recursion_limit": self.recursion_limit,
                  "callbacks": [*self._watch(run), state.callback], "max_concurrency": 1}
        try:
            if not state.settles:
                await calls.invoke(None, config, **how.kwargs())
            else:
                done = await state.settle(
                    (await calls.get_state(thread_config(thread_id))).values)
                if done is not None:
                    return done
                stream = calls.stream(None, config, **how.kwargs())
                try:
                    async for values in stream:
                        done = await state.settle(values)
                        if done is not None:
                            return done
                finally:
                    await stream.aclose()
        except GraphRecursionError:
            return RunStatus.MAX_STEPS
        snap = await calls.get_state(thread_config(thread_id))
        if snap.next:  # stopped for a person the checks could not see coming (interrupts)
            raise stopped(snap, state.plan.start, run.id)
        return RunStatus.COMPLETE


def attribute_thread(app: Any, thread_id: str, *, outcome: Callable[..., Any],
                     method: str = "contrastive", store: str | os.PathLike[str] | RunStore |
                     None = None, model: CarChatModel | CarMiddleware | None = None,
                     safe_tools: Iterable[str] = (), side_effect_tools: Iterable[str] = (),
                     simulators: Mapping[str, Callable[..., Any]] | None = None,
                     match_on: Mapping[str, Iterable[str] | str] | None = None,
                     node_tools: Iterable[str | BaseTool] = (),
                     rollouts: int = 16, budget: int = 2000, seed: int = 0,
                     unclassified: str = "refuse", turn: int | None = None,
                     context: Any = NOT_GIVEN,
                     configurable: Mapping[str, Any] | None = None, branch_store: Any = None,
                     routing_calls: Iterable[str] = (), **options: Any) -> Any:
    """Import ``thread_id`` from ``app``, score it with ``outcome(run)`` (as everywhere; 1 /
    True = failure; ``final_state(run)`` gives the final graph state with the app's message
    objects, ``run.meta["final_state"]`` stores it as JSON), store it, and attribute the
    failure with ``car.contrastive`` or ``car.shapley``. Returns the stored attribution.
    Importing a thread again reuses the run already stored for it (same steps, final state and
    outcome) instead of storing a copy. ``turn``: which invocation of a thread the app was
    run on several times (``-1``: the last; ``import_thread``). ``context`` / ``configurable``:
    what the thread's runs were invoked with, which a checkpointer does not keep, and
    ``branch_store`` where branches read an app's store, ``routing_calls`` the calls a node
    answers itself that branches may run live (``LangGraphAgent``). Here only, an
    outcome written for the old ``outcome(final_state)`` form is still accepted, deprecated: it
    is handed the stored JSON state, with a ``DeprecationWarning``
    (see ``car_adapters.langgraph.thread``)."""
    if method not in ("contrastive", "shapley"):
        raise InvalidInput(f"method={method!r}", hint="use 'contrastive' or 'shapley'")
    agent = LangGraphAgent(app, model=model, safe_tools=safe_tools,
                           side_effect_tools=side_effect_tools, simulators=simulators,
                           match_on=match_on, node_tools=node_tools, unclassified=unclassified,
                           context=context, configurable=configurable,
                           branch_store=branch_store, routing_calls=routing_calls)
    run = agent.import_thread(thread_id, turn)
    score = thread_outcome(outcome)
    run = replace(scored(run, score, Noise(seed)), seed=seed)
    runs: RunStore | None
    if isinstance(store, (str, os.PathLike)):
        runs, opened = RunStore(store), True
    else:
        runs, opened = store, False
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
