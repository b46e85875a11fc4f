"""LangGraph adapter: record with a callback, fork checkpoints under interventions, attribute.

``CarCallback`` records runs. ``LangGraphAgent(app)`` implements the car_core agent protocol
with LangGraph's own machinery, for an app compiled with a checkpointer whose messages live in a
``messages`` channel with the ``add_messages`` reducer:

- **Fork.** A branch from step ``k`` copies the checkpoint the step-``k`` task was scheduled from
  (not its pending writes, which would replay the recorded step) into a new thread, so branches
  never see each other and the user's thread is untouched; steps before ``k`` are therefore
  served from the record with no model or tool call. Branch threads are deleted afterwards
  unless ``keep_branches=True``.
- **Intervene** with ``update_state`` on the branch thread: ``do_action`` writes the action as the
  model node, ``do_observation`` writes the recorded action as the model node and the given tool
  results as the tool node, ``do_context`` replaces the message list with the edited one (tool
  calls and results kept paired). ``do_resample`` simply resumes, so the model decides again.
- **The model.** Held steps after ``k`` (Shapley coalitions), ``do_policy`` (a LangChain chat
  model that decides from ``k`` on) and per-step seeds need the app to call its model through
  ``CarChatModel(inner=model)``; pass that wrapper as ``LangGraphAgent(app, model=wrapper)``.
- **Tools** run live on branches, except the ``side_effect_tools`` you name: those are answered
  from the record on an exact call match, else by ``simulators[name](arguments)``, else the branch
  stops with ``SideEffectBlocked``. The branch is interrupted before each ``ToolNode`` to do this,
  so a side-effect tool that no ``ToolNode`` runs is refused when the agent is built.
- ``import_thread(thread_id)`` rebuilds the trajectory the callback would have recorded from
  ``get_state_history``; ``attribute_thread`` imports a thread and attributes it in one call.

A branch that stops for human input (``interrupt``) is an ``AdapterError``: nobody is there to
answer. Subgraphs and several model nodes running in the same superstep are not forked into.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

try:
    from langchain_core.messages import AIMessage, RemoveMessage, ToolMessage
    from langgraph.errors import GraphRecursionError
    from langgraph.graph.message import REMOVE_ALL_MESSAGES
    from langgraph.prebuilt import ToolNode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("car_adapters.langgraph needs LangGraph: "
                      "pip install 'causal-agent-replay[langgraph]'") from exc

from car_core import RunStore
from car_core.contract import Noise, Origin, Outcome, OutcomeFn, Plan, RunStatus, Step, Trajectory
from car_core.errors import AdapterError, InvalidInput, InvalidIntervention, StepOutOfRange

from ..chat_messages import (
    ToolSafety,
    apply_edit,
    calls_of,
    check_action,
    check_observation,
    consistent,
    recorded_calls,
)
from .callback import CarCallback
from .messages import (
    action_message,
    decode,
    from_dicts,
    jsonable,
    to_dict,
    to_dicts,
    usage_of,
)
from .model import CarChatModel, Control, controlling, seedable
from .thread import thread_outcome

MESSAGES_KEY = "messages"


def _thread(thread_id: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


class LangGraphAgent:
    """A compiled LangGraph app as a car_core ``Agent`` (see the module docstring)."""

    def __init__(self, app: Any, *, model: CarChatModel | None = None,
                 side_effect_tools: Iterable[str] = (),
                 simulators: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
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
        if model is not None and not isinstance(model, CarChatModel):
            raise InvalidInput("model= must be the CarChatModel the app calls",
                               hint="build the app with CarChatModel(inner=your_model) and "
                                    "pass that same object as model=")
        self.app = app
        self.saver = saver
        self.model = model
        self.safety = ToolSafety.of(side_effect_tools, simulators)
        self.messages_key = messages_key
        self.keep_branches = keep_branches
        self.recursion_limit = recursion_limit
        self.tool_nodes = {n: spec.runnable for n, spec in app.builder.nodes.items()
                           if isinstance(spec.runnable, ToolNode)}
        served = {t for node in self.tool_nodes.values()
                  for t in getattr(node, "tools_by_name", {})}
        unguarded = sorted(self.safety.side_effect_tools - served)
        if unguarded:  # a tool run by any other node would run live on every branch
            raise AdapterError(f"side-effect tool(s) {unguarded} are not run by a ToolNode of "
                               "this graph, so branches could not keep them from running",
                               hint="run the graph's tools through langgraph.prebuilt.ToolNode "
                                    "and check the tool names")
        self.couples_noise = model is not None and seedable(model.inner)
        self.name = name or f"langgraph:{app.get_name()}"
        # a graph with async-only nodes cannot run under invoke(); branches use ainvoke()
        self.is_async = any(getattr(spec.runnable, "func", True) is None
                            and getattr(spec.runnable, "afunc", None) is not None
                            for spec in app.builder.nodes.values())

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

    # -- the protocol -------------------------------------------------------------------------

    def start(self, context: Any, noise: Noise) -> Trajectory:
        """Run the graph on ``context`` (its input) in a new thread, recorded by a callback."""
        thread_id = f"car-run-{uuid.uuid4().hex}"
        cb = CarCallback(messages_key=self.messages_key)
        config = {**_thread(thread_id), "callbacks": [cb], "recursion_limit": self.recursion_limit}
        with controlling(thread_id, Control(0, noise=noise if self.couples_noise else None)):
            try:
                self._invoke(context, config)
            except GraphRecursionError:
                pass  # recorded with status "error"; the trajectory says why
        assert cb.run is not None
        return replace(cb.run, agent=self.name)

    def branch(self, run: Trajectory, plan: Plan, noise: Noise) -> Trajectory:
        k = plan.start
        if k >= len(run.steps):
            steps = run.held_prefix(len(run.steps))
            return Trajectory.new(context=run.context, steps=steps, seed=noise.seed,
                                  agent=self.name, status=run.status, meta=dict(run.meta))
        snapshot = self._check(run, k)
        needs_wrapper = plan.policy is not None or any(j > k for j in plan.forced_actions)
        if needs_wrapper and self.model is None:
            raise AdapterError(
                "holding steps after the branch step or swapping the policy needs the app's "
                "model wrapped in CarChatModel", run_id=run.id, step=k,
                hint="build the app with model=CarChatModel(inner=your_model) and pass "
                     "LangGraphAgent(app, model=that_wrapper)")
        policy = plan.policy
        if policy is not None and not hasattr(policy[1], "_generate"):
            raise InvalidIntervention("do_policy on a LangGraph agent takes a LangChain chat "
                                      "model", run_id=run.id, step=policy[0],
                                      hint="pass do_policy(k, SomeChatModel(...))")
        if plan.forced_observations and not self.tool_nodes:
            raise AdapterError("do_observation needs the graph's tools to run in a ToolNode, "
                               "where the branch can answer them instead", run_id=run.id,
                               step=min(plan.forced_observations),
                               hint="run the graph's tools through langgraph.prebuilt.ToolNode")
        forced = {j: check_action(a, step=j) for j, a in plan.forced_actions.items()}
        config = self._fork(run, k)
        thread_id = config["configurable"]["thread_id"]
        control = Control(k, forced={j: a for j, a in forced.items() if j > k},
                          policy=policy, noise=noise if self.couples_noise else None)
        try:
            with controlling(thread_id, control):
                base = self._apply(run, plan, k, snapshot, config, control)
                status = self._drive(run, plan, k, base, thread_id, control)
            return self._collect(run, plan, k, thread_id, base, control, noise, status)
        finally:
            if not self.keep_branches:
                self.saver.delete_thread(thread_id)

    def redecide(self, run: Trajectory, k: int, noise: Noise) -> Any:
        """Decide step ``k`` again from its recorded checkpoint, in a throwaway thread."""
        self._check(run, k)
        config = self._fork(run, k)
        thread_id = config["configurable"]["thread_id"]
        node = run.steps[k].meta["node"]
        try:
            with controlling(thread_id, Control(k, noise=noise if self.couples_noise else None)):
                self._invoke(None, _thread(thread_id), interrupt_after=[node])
            messages = self.app.get_state(_thread(thread_id)).values[self.messages_key]
            return to_dict(next(m for m in reversed(messages) if isinstance(m, AIMessage)))
        finally:
            self.saver.delete_thread(thread_id)

    # -- import -------------------------------------------------------------------------------

    def import_thread(self, thread_id: str) -> Trajectory:
        """The trajectory of an existing thread, rebuilt from its checkpoint history: each
        ``AIMessage`` a model node wrote is a step, decided from the checkpoint before it.
        A thread invoked several times (a conversation) gives one trajectory over all turns;
        the callback gives one per invocation."""
        self._saver_loop()
        history = list(self.app.get_state_history(_thread(thread_id)))
        if not history:
            raise AdapterError(f"no thread {thread_id!r} in this app's checkpointer",
                               hint="check the thread id and that the app uses the same "
                                    "checkpointer (database file) the run was recorded with")
        by_id = {h.config["configurable"]["checkpoint_id"]: h for h in history}
        chain, snap = [], history[0]
        while snap is not None:  # follow parents from the head, so earlier forks are skipped
            chain.append(snap)
            parent = (snap.parent_config or {}).get("configurable", {}).get("checkpoint_id")
            snap = by_id.get(parent) if parent else None
        chain.reverse()
        decisions: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        for prev, cur in zip(chain, chain[1:], strict=False):
            nodes = [n for n in prev.next if n not in self.tool_nodes]
            if cur.metadata.get("source") != "loop" or not nodes:
                continue
            before = prev.values.get(self.messages_key) or []
            seen = {m.id for m in before}
            for m in cur.values.get(self.messages_key) or []:
                if isinstance(m, AIMessage) and m.id not in seen:
                    decisions[m.id] = (
                        {"origin": Origin.RECORD, "thread_id": thread_id,
                         "checkpoint_id": prev.config["configurable"]["checkpoint_id"],
                         "checkpoint_ns": "", "node": nodes[0],
                         "langgraph_step": cur.metadata.get("step"),
                         "model": (m.response_metadata or {}).get("model_name"),
                         "usage": usage_of(m)},
                        to_dicts(before))
        final = chain[-1].values
        messages = final.get(self.messages_key) or []
        steps = []
        for i, (pos, action, obs, observed) in enumerate(decode(messages, decisions)):
            meta, state = decisions[messages[pos].id]
            steps.append(Step(index=i, action=action, observation=obs, observed=observed,
                              state=state, meta=meta))
        context = {"messages": steps[0].state} if steps else {"input": None}
        return Trajectory.new(context=context, steps=steps, agent=self.name,
                              status=(RunStatus.INTERRUPTED if chain[-1].next
                                      else RunStatus.COMPLETE),
                              meta={"framework": "langgraph", "thread_id": thread_id,
                                    "final_state": jsonable(final), "imported": True})

    # -- the machinery ------------------------------------------------------------------------

    def _check(self, run: Trajectory, k: int) -> Any:
        """Refuse a run this app cannot fork, before anything is written anywhere."""
        self._saver_loop()
        if run.meta.get("framework") != "langgraph":
            raise AdapterError("this run was not recorded from a LangGraph app", run_id=run.id,
                               hint="record it with CarCallback or import_thread")
        if not 0 <= k < len(run.steps):
            raise StepOutOfRange(f"step {k} does not exist; the run has {len(run.steps)} steps",
                                 run_id=run.id)
        step = run.steps[k]
        node, checkpoint_id = step.meta.get("node"), step.meta.get("checkpoint_id")
        thread_id = run.meta.get("thread_id")
        if node not in self.app.nodes:
            raise AdapterError(f"step {k} was decided by node {node!r}, which this graph does "
                               "not have: the run comes from a different graph", run_id=run.id,
                               step=k, hint="use the app the run was recorded with")
        if node in self.tool_nodes or not checkpoint_id or step.meta.get("checkpoint_ns"):
            raise AdapterError(f"step {k} is not a model decision of the top-level graph "
                               f"(it ran in node {node!r})", run_id=run.id, step=k,
                               hint="intervene on a step whose action a model node wrote")
        if self.saver.get_tuple(_thread(str(thread_id))) is None:
            raise AdapterError(f"thread {thread_id!r} does not exist in this app's "
                               "checkpointer", run_id=run.id,
                               hint="use the app and checkpointer the run was recorded with")
        config = _thread(str(thread_id), checkpoint_id)
        if self.saver.get_tuple(config) is None:
            raise AdapterError(f"checkpoint {checkpoint_id} of thread {thread_id!r} was deleted",
                               run_id=run.id, step=k,
                               hint="the run cannot be forked there; record it again")
        snapshot = self.app.get_state(config)
        if node not in snapshot.next or to_dicts(
                snapshot.values.get(self.messages_key) or []) != step.state:
            raise AdapterError(f"the checkpoint step {k} was scheduled from does not match the "
                               "record: the run comes from a different graph or thread",
                               run_id=run.id, step=k,
                               hint="use the app and thread the run was recorded with")
        return snapshot

    def _fork(self, run: Trajectory, k: int) -> dict[str, Any]:
        """Copy the checkpoint step ``k`` was scheduled from into a new thread. Its pending
        writes are left behind: they hold what the step-``k`` task wrote in the record, and
        LangGraph would replay them instead of deciding again."""
        meta = run.steps[k].meta
        source = self.saver.get_tuple(_thread(str(run.meta["thread_id"]), meta["checkpoint_id"]))
        thread_id = f"car-branch-{uuid.uuid4().hex}"
        checkpoint = source.checkpoint
        return self.saver.put(_thread(thread_id), checkpoint,
                              {**source.metadata, "car_fork_of": meta["checkpoint_id"]},
                              dict(checkpoint["channel_versions"]))

    def _apply(self, run: Trajectory, plan: Plan, k: int, snapshot: Any,
               config: dict[str, Any], control: Control) -> int:
        """Write the intervention at ``k`` into the branch thread; return how many messages
        precede step ``k``'s action there."""
        step = run.steps[k]
        key = self.messages_key
        base = len(snapshot.values.get(key) or [])
        if k in plan.context_edits:
            edited = apply_edit(plan.context_edits[k], step.state, run_id=run.id, step=k)
            edited = consistent([dict(m) for m in _as_dicts(edited, run.id, k)], run_id=run.id,
                                step=k)
            self.app.update_state(_thread(config["configurable"]["thread_id"]),
                                  {key: [RemoveMessage(id=REMOVE_ALL_MESSAGES),
                                         *from_dicts(edited)]})  # as the node that last wrote,
            # so the model task that was scheduled is scheduled again
            base = len(edited)
        elif k in plan.forced_actions:
            action = check_action(plan.forced_actions[k], step=k)
            self.app.update_state(_thread(config["configurable"]["thread_id"]),
                                  {key: [action_message(action)]}, as_node=step.meta["node"])
            control.next_index = k + 1
        return base

    def _drive(self, run: Trajectory, plan: Plan, k: int, base: int, thread_id: str,
               control: Control) -> str:
        """Run the branch thread forward, answering tool calls that must not run live. The
        step a tool node answers is counted from the branch's own messages (the decisions after
        ``base``), not from the model wrapper, which an app may not use."""
        intercept = list(self.tool_nodes) if (self.safety.side_effect_tools
                                             or plan.forced_observations) else None
        record = recorded_calls(run.steps)
        config = {**_thread(thread_id), "recursion_limit": self.recursion_limit}
        while True:
            snap = self.app.get_state(_thread(thread_id))
            node = snap.next[0] if snap.next else None
            if intercept is not None and node in self.tool_nodes:
                # paused before a tool node: answer the calls that must not run live; with no
                # answer, resuming runs the node live (LangGraph does not stop there twice)
                decided = sum(isinstance(m, AIMessage)
                              for m in (snap.values.get(self.messages_key) or [])[base:])
                results = self._tool_results(snap, node, k + decided - 1, plan, record, run)
                if results is not None:
                    self.app.update_state(_thread(thread_id), {self.messages_key: results},
                                          as_node=node)
            try:
                self._invoke(None, config, interrupt_before=intercept)
            except GraphRecursionError:
                return RunStatus.MAX_STEPS
            snap = self.app.get_state(_thread(thread_id))
            if not snap.next:
                return RunStatus.COMPLETE
            node = snap.next[0]
            if any(t.interrupts for t in snap.tasks) or intercept is None or (
                    node not in self.tool_nodes):
                raise AdapterError(f"the graph stopped at node {node!r} for input on a branch "
                                   "(interrupt); a branch has nobody to answer it",
                                   run_id=run.id, step=control.next_index,
                                   hint="attribute runs of a graph without human-in-the-loop "
                                        "interrupts, or intervene after the interrupt")

    def _tool_results(self, snap: Any, node: str, j: int, plan: Plan,
                      record: Mapping[tuple[str, str], Any], run: Trajectory
                      ) -> list[ToolMessage] | None:
        messages = snap.values.get(self.messages_key) or []
        action = to_dict(next(m for m in reversed(messages) if isinstance(m, AIMessage)))
        calls = calls_of(action)
        if j in plan.forced_observations:
            given = check_observation(plan.forced_observations[j], action, step=j)
            return from_dicts(given)  # type: ignore[return-value]
        if not any(self.safety.guards(name) for _, name, _ in calls):
            return None
        tools = getattr(self.tool_nodes[node], "tools_by_name", {})
        out: list[ToolMessage] = []
        for cid, name, args in calls:
            if self.safety.guards(name):
                content = self.safety.serve(name, args, record, run_id=run.id, step=j)
                out.append(ToolMessage(content=content if isinstance(content, str)
                                       else str(content), name=name, tool_call_id=cid))
            else:
                result = tools[name].invoke({"type": "tool_call", "id": cid, "name": name,
                                             "args": _loads(args)})
                out.append(result if isinstance(result, ToolMessage) else
                           ToolMessage(content=str(result), name=name, tool_call_id=cid))
        return out

    def _collect(self, run: Trajectory, plan: Plan, k: int, thread_id: str, base: int,
                 control: Control, noise: Noise, status: str) -> Trajectory:
        final = self.app.get_state(_thread(thread_id)).values
        messages = final.get(self.messages_key) or []
        steps = run.held_prefix(k)
        for i, (pos, action, obs, observed) in enumerate(decode(messages[base:])):
            j = k + i
            meta = {"thread_id": thread_id, "node": run.steps[min(j, len(run.steps) - 1)]
                    .meta.get("node"), **control.steps.get(j, {}), "origin": plan.origin(j)}
            steps.append(Step(index=j, action=action, observation=obs, observed=observed,
                              state=to_dicts(messages[:base + pos]), meta=jsonable(meta)))
        return Trajectory.new(context=run.context, steps=steps, seed=noise.seed,
                              agent=self.name, status=status,
                              meta={"framework": "langgraph", "thread_id": thread_id,
                                    "parent_thread_id": run.meta.get("thread_id"),
                                    "final_state": jsonable(final)})


def _loads(args: str) -> Any:
    return json.loads(args)


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
                     None = None, model: CarChatModel | None = None,
                     side_effect_tools: Iterable[str] = (),
                     simulators: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
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
                           simulators=simulators)
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
