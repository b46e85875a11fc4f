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
  ``CarChatModel`` (without it they are refused; ``do_resample`` works). The same holds at a
  step whose node built the model's whole input itself (a ``SummarizationMiddleware``'s
  summarizer call, ``meta["input"] == "node"``): the fork re-runs that node on the recorded
  checkpoint, which builds the same input, and a forced action or input needs a
  ``CarChatModel`` at that call.
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

This module drives branches; the parts live beside it: ``shape`` (what the app's builder says,
read once), ``refusals`` (every shape CAR cannot make faithful, refused before the first write),
``plan`` (the intervention plan read once, per step), ``branch_state`` (one branch in flight
and the trajectory it records), ``checkpoints`` (the fork) and ``importer`` (threads).
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
from car_core.contract import Noise, Plan, RunStatus, Trajectory, scored
from car_core.errors import AdapterError, InvalidInput

from ..common.messages import ToolSafety
from ..common.sync import run_sync
from .branch_state import BranchState, answerable_calls
from .callback import CarCallback
from .checkpoints import fork, thread_config
from .fingerprint import app_fingerprint
from .guard import Guard, guarding
from .importer import import_thread
from .messages import action_message, to_dict
from .middleware import CarMiddleware
from .model import CarChatModel, Control, controlling, seedable
from .plan import BranchPlan
from .refusals import refuse_branch, refuse_run, refuse_step, refuse_unknown_tools
from .shape import AppShape
from .thread import thread_outcome
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
        # every graph level CAR can fork into, its tool nodes, what every other node can call
        self.shape = AppShape.of(app, saver, messages_key, node_tools)
        self.tools = self.shape.tools
        refuse_unknown_tools(self.tools, {
            "side_effect_tools": side_effect_tools, "simulators": list(simulators or {}),
            "match_on": list(match_on or {}),
            "node_tools": [t for t in node_tools if not isinstance(t, BaseTool)]})
        self.safety = ToolSafety.of(side_effect_tools, simulators, match_on)
        self.couples_noise = self._couples(model)
        # CAR numbers the model calls it decides: a node calling a model it cannot see is refused
        self.undecided = undecided_nodes(self.shape.reaches) if model is not None else []
        self.name = name or f"langgraph:{app.get_name()}"
        # a graph with async-only nodes cannot run under invoke(); branches use ainvoke()
        self.is_async = self.shape.is_async
        self._checked: set[str] = set()
        self._lock = threading.Lock()

    def _couples(self, model: CarChatModel | CarMiddleware | None) -> bool:
        """Whether CAR's noise drives the app's model calls: every model CAR decides takes a
        per-step ``seed``. Models it cannot see, or without a seed field, do not couple."""
        if isinstance(model, CarChatModel):
            return seedable(model.inner)
        if not isinstance(model, CarMiddleware) or not model.seed_models:
            return False
        decided = [m for r in self.shape.reaches.values() if r.wrapped for m in r.models]
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
        if loop is None and not self.is_async:
            return self.app.invoke(value, config, **kwargs)
        return run_sync(lambda: self.app.ainvoke(value, config, **kwargs), loop)

    def fingerprint(self) -> dict[str, Any]:
        """The app's graphs, tools and node code (``car_adapters.langgraph.fingerprint``): a
        run recorded from another app is refused before any branch runs."""
        return app_fingerprint(self.app)

    # -- the protocol -------------------------------------------------------------------------

    def start(self, context: Any, noise: Noise) -> Trajectory:
        """Run the graph on ``context`` (its input) in a new thread, recorded by a callback."""
        thread_id = f"car-run-{uuid.uuid4().hex}"
        cb = CarCallback(messages_key=self.messages_key)
        config = {**thread_config(thread_id), "callbacks": [cb],
                  "recursion_limit": self.recursion_limit, "max_concurrency": 1}
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
        view = BranchPlan.of(plan)
        refuse_branch(self.shape, run, view, self.model)
        state = BranchState.open(run, view, noise, f"car-branch-{uuid.uuid4().hex}",
                                 agent=self.name, safety=self.safety,
                                 decides=self.model is not None, coupled=self.couples_noise,
                                 messages_key=self.messages_key, stop=stop)
        thread_id = state.thread_id
        # the first write, after every check passed
        fork(self.saver, self.messages_key, run, k, thread_id, state.edited)
        try:
            with controlling(thread_id, state.control), guarding(thread_id, state.guard):
                if k in state.forced and self.model is None:
                    self._write_action(run, k, thread_id, state.forced[k])
                    state.control.next_index = k + 1
                    state.offset = 1
                status = self._drive(state)
            if isinstance(status, Trajectory):
                return status
            return state.collect(status, self.app.get_state(thread_config(thread_id)).values)
        finally:
            if not self.keep_branches:
                self.saver.delete_thread(thread_id)

    def redecide(self, run: Trajectory, k: int, noise: Noise) -> Any:
        """Decide step ``k`` again from its recorded checkpoint, in a throwaway thread that
        stops at its first model decision."""
        self.preflight(run)
        refuse_step(self.shape, run, k)
        thread_id = f"car-branch-{uuid.uuid4().hex}"
        fork(self.saver, self.messages_key, run, k, thread_id, None)
        stop = _FirstDecision()
        guard = Guard(self.safety, answerable_calls(run), run_id=run.id)
        try:
            with controlling(thread_id, Control(k, noise=noise if self.couples_noise
                                                else None)), guarding(thread_id, guard):
                try:
                    self._invoke(None, {**thread_config(thread_id), "callbacks": [
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

    def import_thread(self, thread_id: str) -> Trajectory:
        """The trajectory of an existing thread, rebuilt from its checkpoint history in every
        namespace, subgraphs included (``car_adapters.langgraph.importer``)."""
        self._saver_loop()
        return import_thread(self.shape, thread_id, self.name)

    def preflight(self, run: Trajectory) -> None:
        """Refuse a run whose steps this app cannot fork into, naming the shape and the node,
        before any branch of it runs (checked once per run; ``refusals``)."""
        self._saver_loop()
        if run.id in self._checked:
            return
        refuse_run(self.shape, run, self.undecided if self.model is not None else None)
        with self._lock:
            self._checked.add(run.id)

    # -- the machinery ------------------------------------------------------------------------

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
        self.app.update_state(thread_config(thread_id, None, ns) if ns
                              else thread_config(thread_id),
                              {self.messages_key: [action_message(action)]},
                              as_node=meta["node"])

    def _drive(self, state: BranchState) -> str | Trajectory:
        """Run the branch thread forward; side-effect tools are answered by the guard. Where
        the branch settles, the graph state is offered to ``state.settle`` before the first
        superstep and after each one, and the first partial branch it returns ends the run
        (sync apps only)."""
        run, thread_id = state.run, state.thread_id
        config = {**thread_config(thread_id), "recursion_limit": self.recursion_limit,
                  "callbacks": [*self._watch(run), state.callback], "max_concurrency": 1}
        try:
            if not state.settles or self.is_async or self._saver_loop() is not None:
                self._invoke(None, config)
            else:
                done = state.settle(self.app.get_state(thread_config(thread_id)).values)
                if done is not None:
                    return done
                stream = self.app.stream(None, config, stream_mode="values")
                try:
                    for values in stream:
                        done = state.settle(values)
                        if done is not None:
                            return done
                finally:
                    stream.close()
        except GraphRecursionError:
            return RunStatus.MAX_STEPS
        snap = self.app.get_state(thread_config(thread_id))
        if snap.next:
            raise AdapterError(f"the graph stopped at node {snap.next[0]!r} for input on a "
                               "branch (interrupt); a branch has nobody to answer it",
                               run_id=run.id, step=state.control.next_index,
                               hint="attribute runs of a graph without human-in-the-loop "
                                    "interrupts, or intervene after the interrupt")
        return RunStatus.COMPLETE


def attribute_thread(app: Any, thread_id: str, *, outcome: Callable[..., Any],
                     method: str = "contrastive", store: str | os.PathLike[str] | RunStore |
                     None = None, model: CarChatModel | CarMiddleware | None = None,
                     side_effect_tools: Iterable[str] = (),
                     simulators: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
                     match_on: Mapping[str, Iterable[str] | str] | None = None,
                     node_tools: Iterable[str | BaseTool] = (),
                     rollouts: int = 16, budget: int = 2000, seed: int = 0,
                     **options: Any) -> Any:
    """Import ``thread_id`` from ``app``, score it with ``outcome(run)`` (as everywhere; 1 /
    True = failure; ``final_state(run)`` gives the final graph state with the app's message
    objects, ``run.meta["final_state"]`` stores it as JSON), store it, and attribute the
    failure with ``car.contrastive`` or ``car.shapley``. Returns the stored attribution.
    Importing a thread again reuses the run already stored for it (same steps, final state and
    outcome) instead of storing a copy. Here only, an outcome written for the old
    ``outcome(final_state)`` form is still accepted, deprecated: it is handed the stored JSON
    state, with a ``DeprecationWarning`` (see ``car_adapters.langgraph.thread``)."""
    if method not in ("contrastive", "shapley"):
        raise InvalidInput(f"method={method!r}", hint="use 'contrastive' or 'shapley'")
    agent = LangGraphAgent(app, model=model, side_effect_tools=side_effect_tools,
                           simulators=simulators, match_on=match_on, node_tools=node_tools)
    run = agent.import_thread(thread_id)
    score = thread_outcome(outcome)
    run = replace(scored(run, score, Noise(seed)), seed=seed)
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
