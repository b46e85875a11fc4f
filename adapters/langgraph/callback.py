"""``CarCallback``: record every model decision of a LangGraph run as a CAR trajectory.

Pass it in ``config["callbacks"]``. Each chat-model call inside the graph becomes a ``Step``:
the graph messages it decided from (``state``; messages without an id, such as a system prompt a
node prepends, are kept apart in ``meta["prompt"]``; where that prompt is system messages before
the graph's at a call CAR decides, ``meta["input"] == "prompt+state"``: the step decided from
both, and a branch can hand the call an edited prompt), the ``AIMessage`` as the action, the
tool results that answered it as the observation, and in ``meta`` the model, parameters, token
usage, latency and the LangGraph ids needed to fork there (thread, the checkpoint the task was
scheduled from, node, superstep, task path), and ``car_decided``: whether CAR decides that call
(``CarChatModel`` or ``CarMiddleware``), with the tools such a call was offered in
``meta["tools"]`` (name and description each: a branch can bind it edited descriptions).
Tools a node calls itself (not through a ``ToolNode``) are kept in the run's
``meta["node_tool_calls"]`` (node, tool, arguments, result), so a branch's
matching call can be answered from the record (and tools that returned a ``Command`` writing
state besides their messages named in ``meta["state_writing_tools"]``, and each such call's other
channels kept in ``meta["state_writes"]`` by tool call id, as JSON where they round-trip exactly,
else None, so an identical branch call replays them and ``refusals`` refuses the rest), and
the names of every LangChain tool that ran in ``meta["tools_run"]``: a recorded call answered
with none of that name was run by a node's own code, which no guard can answer on a branch.
A ``Send`` task decides from the messages its
node built from the ``Send`` payload, not from the graph's messages, so its ``state`` is the
whole model input; so is that of a call whose node wrote the whole input itself, with no graph
message in it (a ``SummarizationMiddleware`` summarizing: ``meta["input"] == "node"``). Model
calls of parallel tasks (a ``Send`` fan-out) finish in any order; their steps are put in
LangGraph's own task order (``Send`` index, then node name), so a run records the same way
every time. Runs are keyed by their root run id, so several graphs can run at once
through one handler; each finished run is saved to the store and becomes ``cb.run``. While it
goes, its events keep their values by reference (each message as the call saw it); converting
them to JSON and sealing (JSON check, redaction, digests) happen on the store's writer thread,
or at the first read of ``runs`` / ``run`` without a store, unless ``outcome=`` or a
``RunStore`` object asks for each run at once (see ``CarCallback``). With
``outcome=``, each run is scored as it finishes (``outcome(run)``, as ``car.intervene`` takes
it) and stored with its outcome, so ``car runs`` shows which runs failed. With ``app=`` (the
compiled graph being run), each run carries the app's fingerprint, so attributing it with
another app is refused; without it a run is not checked.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables.config import var_child_runnable_config
from langgraph.errors import GraphInterrupt
from langgraph.types import Command

from car_core import RunStore
from car_core.contract import (
    BEGAN_FROM,
    PARALLEL_TASK,
    Origin,
    OutcomeFn,
    RunStatus,
    RunWriter,
    Step,
    Trajectory,
    canonical_arguments,
    in_branch,
    redact,
)
from car_core.errors import InvalidInput, OutcomeError, StoreError

from ..common.run_keeping import open_store, score_run, store_run, unstored
from . import step_meta
from .fingerprint import app_digest
from .invocation import captured, round_trips
from .messages import as_json, as_the_app_saw, decode, dict_of, jsonable, seen, usage_of
from .model import CAR_DECIDED, decided_by_car
from .offered_tools import offered

log = redact.logger(__name__)  # log records pass the redaction rule
MESSAGES_KEY = "messages"


Seen = tuple[BaseMessage, Any, Any, Any]  # ``messages.seen``: a message as a call saw it
_SKIPPED_PARAMS = ("tools", "car_tools", "car_tool_kwargs", CAR_DECIDED)


@dataclass
class _Call:
    """One model call as its events gave it, kept by reference and converted when the run is
    sealed (``meta``): the messages as ``seen`` then, and copies of the dicts LangChain and
    LangGraph passed (their values are not copied: they are the model's settings and ids)."""

    order: int
    state: list[Seen]
    prompt: list[Seen]
    metadata: dict[str, Any]
    params: dict[str, Any]
    checkpoints: dict[Any, Any]
    decided: bool
    started: float
    built: bool = False  # the node built the model's whole input (not the graph's messages)
    prompt_first: bool = False  # the input was the node's system prompt, then graph messages
    tools: list[dict[str, str]] | None = None  # the tools a call CAR decides was offered
    message: BaseMessage | None = None
    latency: float = 0.0
    llm_output: Any = None

    def meta(self, rec: _Recording) -> dict[str, Any]:
        """The step's ``meta``, with the keys in the order the recorder has always written."""
        md = self.metadata
        params = jsonable({k: v for k, v in self.params.items() if k not in _SKIPPED_PARAMS})
        cmap = {str(ns): str(cid) for ns, cid in self.checkpoints.items()}
        checkpoint_ns, checkpoint_id = list(cmap.items())[-1] if cmap else (None, None)
        meta = {"origin": Origin.RECORD, "thread_id": md.get("thread_id", rec.thread_id),
                "checkpoint_id": checkpoint_id, "checkpoint_ns": checkpoint_ns,
                "checkpoint_map": cmap, "ns": checkpoint_ns,
                "agent": step_meta.agent_of(checkpoint_ns, rec.graph, md.get("langgraph_node")),
                "node": md.get("langgraph_node"), "langgraph_step": md.get("langgraph_step"),
                "task_ns": md.get("langgraph_checkpoint_ns"), "params": params,
                "seed": params.get("seed") if isinstance(params, dict) else None,
                "car_decided": self.decided}
        path = md.get("langgraph_path")
        meta["task_path"] = jsonable(list(path)) if isinstance(path, (list, tuple)) else None
        if isinstance(path, (list, tuple)) and step_meta.is_send_path(path) \
                and len(path) > 1 and isinstance(path[1], int):
            meta[PARALLEL_TASK] = path[1]  # which Send worker: not the agent's Nth decision
        if self.built:
            meta["input"] = step_meta.NODE_INPUT
        elif self.prompt_first:
            meta["input"] = step_meta.PROMPT_FIRST
        if self.prompt:
            meta["prompt"] = [rec.convert(m) for m in self.prompt]
        if self.tools:
            meta["tools"] = self.tools
        if self.message is not None:
            meta["latency_s"] = self.latency
            meta["usage"] = usage_of(self.message, self.llm_output) if self.message else None
            meta["model"] = _model_name(self.message, self.llm_output, meta["params"])
        return meta


@dataclass
class _Recording:
    thread_id: str | None
    inputs: Any
    graph: str | None = None
    calls: dict[int, _Call] = field(default_factory=dict)  # by ``UUID.int`` of the model run
    tool_results: dict[str, ToolMessage] = field(default_factory=dict)
    members: list[int] = field(default_factory=list)  # ``UUID.int`` of its runs
    node_calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # open, by tool run
    node_results: list[dict[str, Any]] = field(default_factory=list)
    state_writers: set[str] = field(default_factory=set)  # tools whose Command wrote state
    state_writes: dict[str, dict[str, Any]] = field(default_factory=dict)  # by tool call id
    tools_run: set[str] = field(default_factory=set)  # names of the LangChain tools that ran
    converted: dict[int, tuple[Any, ...]] = field(default_factory=dict)  # by message identity
    split: bool = False  # graph runs started inside it were kept as runs of their own
    invocation: dict[str, Any] | None = None  # its configurable keys and context (``invocation``)
    interrupted: bool = False  # a node raised GraphInterrupt: the run stopped for a person

    def convert(self, message: Seen) -> dict[str, Any]:
        """``dict_of`` a message as ``seen`` by a call, made once per message object and shared
        by every step that holds it: a graph's messages come back in each later model call and
        in the final state, so converting (and then checking and sealing) each copy anew would
        cost the square of the run. A message whose content, tool calls or name were replaced
        between two calls is converted again, as the later call saw it."""
        m, content, calls, name = message
        hit = self.converted.get(id(m))
        if (hit is not None and hit[0] is m and hit[1] is content and hit[2] is calls
                and hit[3] is name):
            return hit[4]  # type: ignore[no-any-return]
        out = dict_of(m, content, calls, name)
        self.converted[id(m)] = (m, content, calls, name, out)
        return out


_MESSAGE_TYPES: set[type] = set()  # the BaseMessage classes met so far (no ABC check)


def _frozen(value: Any, end: dict[int, Seen]) -> Any:
    """``value`` (a graph state) with every container copied and every other non-JSON value
    replaced by what ``jsonable`` gives it (``as_json``), now; messages are kept by reference and
    ``seen`` into ``end``. ``jsonable(_frozen(v, end), convert)`` later is ``jsonable(v)`` now."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is dict:
        return {str(k): _frozen(v, end) for k, v in value.items()}
    if kind is list:  # a message list, most often: its messages without a call each
        out = []
        for v in value:
            if type(v) in _MESSAGE_TYPES:
                end[id(v)] = (v, v.content, v.__dict__.get("tool_calls"), v.name)  # seen(v)
                out.append(v)
            else:
                out.append(_frozen(v, end))
        return out
    if isinstance(value, BaseMessage):
        _MESSAGE_TYPES.add(kind)
        end[id(value)] = seen(value)
        return value
    if isinstance(value, Mapping):
        return {str(k): _frozen(v, end) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_frozen(v, end) for v in value]
    if isinstance(value, (str, int, float, bool)):
        return value
    return as_json(value)


def _checkpoint_map() -> dict[Any, Any]:
    """The checkpoints the running task was scheduled from, one per graph level (``""`` the
    top-level graph, then each subgraph namespace), read from the runnable config LangGraph
    propagates to the model call (a copy; ``_Call.meta`` makes its keys and ids strings). A
    fork inside a subgraph copies every level."""
    config = var_child_runnable_config.get() or {}
    return dict((config.get("configurable") or {}).get("checkpoint_map") or {})


def task_order(calls: list[tuple[_Call, dict[str, Any]]]) -> list[tuple[_Call, dict[str, Any]]]:
    """Calls (each with its step's meta) in start order, except that the calls scheduled from
    one checkpoint (parallel tasks of a superstep) take the places they occupy in LangGraph's
    task order."""
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, (_, meta) in enumerate(calls):
        groups.setdefault((meta.get("checkpoint_ns"), meta.get("checkpoint_id")), []).append(i)
    out = list(calls)
    for places in groups.values():
        if len(places) > 1:
            ordered = sorted((calls[i] for i in places),
                             key=lambda cm: (step_meta.task_key(cm[1]), cm[0].order))
            for i, cm in zip(places, ordered, strict=True):
                out[i] = cm
    return out


def _tool_messages(output: Any) -> list[ToolMessage]:
    """The tool messages a tool returned: itself, or those in a ``Command`` update (handoffs)."""
    if isinstance(output, ToolMessage):
        return [output]
    update = getattr(output, "update", None)
    messages = update.get("messages") if isinstance(update, dict) else None
    return [m for m in messages or () if isinstance(m, ToolMessage)]


def _model_name(message: BaseMessage | None, llm_output: dict[str, Any] | None,
                params: dict[str, Any]) -> str | None:
    for source in ((getattr(message, "response_metadata", None) or {}), llm_output or {}, params):
        for key in ("model_name", "model"):
            if source.get(key):
                return str(source[key])
    return params.get("_type")


class _Unsealed:
    """The runs a ``CarCallback`` finished and has not sealed yet, each as a function that
    converts what it kept; called (by the first reader of ``runs``, a flush, or the store's
    writer thread), it seals them in finish order into the callback's ``runs`` (while the
    callback is alive) and its store. A store given as a path is handed this, not the
    callback, so a callback dropped before any flush still has its runs stored."""

    def __init__(self, owner: CarCallback) -> None:
        self.owner = weakref.ref(owner)
        self.store, self.errors = owner.store, owner.store_errors
        self.pending: list[Callable[[], dict[str, Any]]] = []
        self.lock = threading.Lock()
        self.sealing = threading.Lock()  # one hand-over at a time keeps the finish order

    def add(self, fields: Callable[[], dict[str, Any]]) -> bool:
        """Keep ``fields`` to seal; whether nothing else was waiting (a hand-over already
        queued seals everything waiting when it runs, this too)."""
        with self.lock:
            self.pending.append(fields)
            return len(self.pending) == 1

    def __call__(self) -> None:
        with self.sealing:
            with self.lock:
                batch, self.pending = self.pending, []
            for fields in batch:
                try:
                    run = Trajectory.new(**fields())
                except Exception as exc:  # as LangChain drops a handler's error
                    log.warning("CAR could not record a LangGraph run: %r", exc)
                    continue
                owner = self.owner()
                if owner is not None:
                    owner._keep(run)
                store_run(run, self.store, self.errors)


class CarCallback(BaseCallbackHandler):
    """Records LangGraph runs as ``car.Trajectory`` values and saves each to ``store``, scored
    by ``outcome(run)`` when given. A run that could not be stored (or scored) is still in
    ``runs``, and its error in ``store_errors`` (or ``outcome_errors``): the graph's run is
    not broken.

    While a run goes, each event keeps what it was given by reference (each message with its
    content, tool calls and name as the call saw them, copies of the call's metadata,
    parameters and checkpoint ids), and when it ends the final state is copied where it can
    change (its containers; messages are kept as seen then). Converting all that to JSON
    values and sealing them into a ``Trajectory`` (the JSON check, redaction, digests) is left
    to the store's writer thread when the store is given as a path (whose writes are durable
    only after a flush anyway), and to the first read of ``runs`` / ``run`` or a ``flush()``
    when no store is given: the run's own thread does only the keeping. With ``outcome=`` or
    a ``RunStore`` object, each run is converted, sealed, scored and stored as it finishes."""

    run_inline = True  # keep event order; LangGraph calls handlers from the task's context

    def __init__(self, store: str | os.PathLike[str] | RunStore | None = None, *,
                 messages_key: str = MESSAGES_KEY, outcome: Any = None, app: Any = None) -> None:
        self.store_errors: list[StoreError] = []
        self.store = open_store(store, self.store_errors)
        self._raised = 0  # of store_errors, how many a flush raised already
        self.fingerprint: str | None = None
        if app is not None:
            if not hasattr(app, "get_subgraphs"):
                raise InvalidInput(f"app= must be the compiled LangGraph app the callback "
                                   f"records, got {type(app).__name__}",
                                   hint="pass graph.compile(...) as app=")
            self.fingerprint = app_digest(app)
        self.messages_key = messages_key
        self.outcome = OutcomeFn(outcome) if outcome is not None else None  # checked now
        self._runs: list[Trajectory] = []
        self._lock = threading.Lock()
        self._unsealed: _Unsealed | None = None
        if self.outcome is None and (self.store is None or isinstance(self.store, RunWriter)):
            self._unsealed = _Unsealed(self)
        self.outcome_errors: list[OutcomeError] = []
        self._open: dict[UUID, _Recording] = {}
        self._done: list[_Recording] = []
        # one made inside a branch records that branch; one made outside never records one
        self._records_branches = in_branch()
        # every open run's own and nested run ids (as ``UUID.int``: hashing a ``UUID`` runs
        # Python code, an int's does not), to the run they belong to
        self._of: dict[int, _Recording] = {}
        # chains started inside a run but outside any graph node (by ``UUID.int``): each may
        # turn out to be a graph run of its own (``_own_run``); with its id, input, thread
        # id, name and the run it was started in
        self._outside: dict[int, tuple[UUID, Any, Any, Any, _Recording]] = {}
        self.decisions_started = 0

    def tool_results(self) -> dict[str, ToolMessage]:
        """Every tool result seen so far, by tool call id (open and finished runs)."""
        with self._lock:
            return {cid: m for rec in [*self._open.values(), *self._done]
                    for cid, m in rec.tool_results.items()}

    def decision_with_call(self, tool_call_id: str) -> tuple[int, BaseMessage] | None:
        """``(position among this handler's decisions, message)`` of the decision that made
        the tool call ``tool_call_id``, while its run is still open."""
        with self._lock:
            for rec in self._open.values():
                for call in rec.calls.values():
                    msg = call.message
                    if msg is not None and any(c.get("id") == tool_call_id
                                               for c in getattr(msg, "tool_calls", ()) or ()):
                        return call.order, msg
        return None

    def open_steps(self, values: Any) -> list[Step]:
        """The steps of the runs still going, as ``build`` would record them if they ended with
        the graph state ``values`` now (a branch asks whether its outcome is settled yet)."""
        with self._lock:
            recs = list(self._open.values())
        return [s for rec in recs for s in self.build(rec, values, None).steps]

    @property
    def runs(self) -> list[Trajectory]:
        """Every finished run, sealed, in the order they finished."""
        self._seal_finished()
        return self._runs

    @property
    def run(self) -> Trajectory | None:
        """The latest finished run (None before any), already in the store when there is one."""
        self.flush()
        return self._runs[-1] if self._runs else None

    def flush(self) -> None:
        """Seal every finished run and wait until each is in the store. A store given as a
        path is written off the graph's critical path (``car_core.contract.RunWriter``):
        reading ``run``, this call and a normal exit each make the writes durable. A run that
        could not be stored raises ``StoreError`` here, once (it stays in ``runs``)."""
        self._seal_finished()
        failed = unstored(self.store, self.store_errors, self._raised)
        self._raised = len(self.store_errors)
        if failed is not None:
            raise failed

    def _seal_finished(self) -> None:
        if self._unsealed is not None:
            self._unsealed()

    def _keep(self, run: Trajectory) -> None:
        with self._lock:  # kept before storing: a store error never loses the run
            self._runs.append(run)

    def _member(self, run_id: UUID, parent_run_id: UUID | None) -> _Recording | None:
        """The open run a nested run belongs to (through its parent), now counted in it. No
        lock: one dict read, one write and a list append each hold under the GIL."""
        rec = self._of.get(parent_run_id.int) if parent_run_id is not None else None
        if rec is not None:
            self._of[run_id.int] = rec
            rec.members.append(run_id.int)
        return rec

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, metadata: dict[str, Any] | None = None,
                       **kwargs: Any) -> None:
        if parent_run_id is not None:  # ``_member``, written out: most events are these
            parent = parent_run_id.int
            node = metadata is not None and "langgraph_node" in metadata
            if node and parent in self._outside:  # the first task of a graph run in a wrapper
                self._own_run(parent)
            rec = self._of.get(parent)
            if rec is not None:
                self._of[run_id.int] = rec
                rec.members.append(run_id.int)
                if not node:  # outside any graph node: maybe a graph run of its own
                    self._outside[run_id.int] = (run_id, inputs, (metadata or {}).get(
                        "thread_id"), kwargs.get("name"), rec)
            return
        if in_branch() and not self._records_branches:
            return  # CAR's own branch, not a run of the user's
        with self._lock:
            rec = _Recording((metadata or {}).get("thread_id"), inputs, kwargs.get("name"),
                             members=[run_id.int])
            self._open[run_id] = rec
            self._of[run_id.int] = rec

    def _own_run(self, chain: int) -> None:
        """Make the chain ``chain`` (started under a recorded run, outside any graph node, and
        now running a graph node: a graph run) a run of its own. A graph invoked inside the
        user's own runnable (an eval harness ``RunnableLambda`` that ``abatch``-es the app, a
        ``prompt | app`` sequence, ``app.with_retry()``) is one run of the app: keyed by the
        outermost chain instead, thirty runs of an eval set were stored as one run of every
        input's steps interleaved, and attributed as one. Its own entry in ``_of`` is set
        before it leaves ``_outside``: a concurrent task that no longer finds it there reads
        the new run."""
        with self._lock:
            held = self._outside.get(chain)
            if held is None:
                return
            run_id, inputs, thread_id, name, wrapper = held
            rec = _Recording(thread_id, inputs, name, members=[chain])
            self._open[run_id] = rec
            self._of[chain] = rec
            del self._outside[chain]
            wrapper.split = True

    def on_tool_start(self, serialized: Any, input_str: str, *, run_id: UUID,
                      parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        rec = self._member(run_id, parent_run_id)
        if rec is None:
            return
        if rec.invocation is None:
            rec.invocation = captured()
        name = (serialized or {}).get("name") or kwargs.get("name")
        if name:
            with self._lock:
                rec.tools_run.add(str(name))
        if kwargs.get("tool_call_id") is not None:
            return
        inputs = kwargs.get("inputs")
        if isinstance(inputs, dict):
            # a tool a node calls itself: kept, so a branch's matching call is answered
            node = (kwargs.get("metadata") or {}).get("langgraph_node")
            with self._lock:
                rec.node_calls[run_id.int] = {"node": node, "name": (serialized or {}).get("name"),
                                          "arguments": canonical_arguments(jsonable(inputs))}

    def on_tool_end(self, output: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                    **kwargs: Any) -> None:
        rec = self._of.get(run_id.int)
        if rec is None:
            return
        if rec.node_calls:
            with self._lock:
                call = rec.node_calls.pop(run_id.int, None)
                if call is not None:
                    content = output.content if isinstance(output, ToolMessage) else output
                    rec.node_results.append({**call, "content": jsonable(content)})
        for m in _tool_messages(output):
            rec.tool_results[m.tool_call_id] = m
        for out in output if isinstance(output, list) else [output]:
            update = getattr(out, "update", None)  # a Command writing more than its message
            keys = (set(update) if isinstance(update, dict) else
                    {u[0] for u in update if isinstance(u, tuple) and u}
                    if isinstance(update, (list, tuple)) else set())
            if isinstance(out, Command) and keys - {self.messages_key}:
                name = str(kwargs.get("name"))
                cid, channels = _replayable(out, self.messages_key)
                with self._lock:
                    rec.state_writers.add(name)
                    rec.state_writes[cid or f"run:{run_id}"] = {
                        "tool": name, "update": channels if cid else None,
                        "messages_key": self.messages_key}

    def on_chat_model_start(self, serialized: Any, messages: list[list[BaseMessage]], *,
                            run_id: UUID, parent_run_id: UUID | None = None,
                            metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        rec = self._member(run_id, parent_run_id)
        if rec is None:
            return  # a model call outside any graph this handler saw start
        if rec.invocation is None:  # read where LangGraph hands the task its config
            rec.invocation = captured()
        md = metadata or {}
        send = step_meta.is_send_path(md.get("langgraph_path"))
        given = messages[0] if messages else []
        # a node that built the model's whole input itself (no graph message in it: a
        # SummarizationMiddleware's prompt) decided from that input, as a Send task does
        built = not send and bool(given) and all(m.id is None for m in given)
        whole = send or built
        # ``seen(m)``, written out: this runs for every message of every call
        prompt = [(m, m.content, m.__dict__.get("tool_calls"), m.name)
                  for m in given if m.id is None]
        state = [(m, m.content, m.__dict__.get("tool_calls"), m.name)
                 for m in given if whole or m.id is not None]
        params = kwargs.get("invocation_params") or {}
        decided = decided_by_car(params)
        # a system prompt the node put before the graph's messages, at a call CAR decides: a
        # branch can hand that call an edited prompt, so the step decided from both
        first = (decided and not whole and bool(prompt)
                 and all(m.type == "system" for m in given[:len(prompt)])
                 and all(m.id is None for m in given[:len(prompt)]))
        call = _Call(0, state, prompt, dict(md), dict(params), _checkpoint_map(),
                     decided, time.perf_counter(), built=built, prompt_first=first,
                     tools=offered(params) if decided else None)
        with self._lock:
            self.decisions_started += 1
            call.order = len(rec.calls)
            rec.calls[run_id.int] = call

    def on_llm_end(self, response: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                   **kwargs: Any) -> None:
        rec = self._of.get(run_id.int)
        call = rec.calls.get(run_id.int) if rec is not None else None
        if call is None or not response.generations or not response.generations[0]:
            return
        call.latency = time.perf_counter() - call.started
        call.llm_output = response.llm_output
        call.message = getattr(response.generations[0][0], "message", None)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                     **kwargs: Any) -> None:
        if self._outside:
            self._outside.pop(run_id.int, None)
        if parent_run_id is None or run_id in self._open:
            self._finish(run_id, outputs, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID,
                       parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        if isinstance(error, GraphInterrupt):  # a node stopped for a person (``interrupt()``)
            rec = self._of.get(run_id.int)
            if rec is not None:
                rec.interrupted = True
        if self._outside:
            self._outside.pop(run_id.int, None)
        if parent_run_id is None or run_id in self._open:
            self._finish(run_id, None, error)

    def _finish(self, run_id: UUID, outputs: Any, error: BaseException | None) -> None:
        with self._lock:
            rec = self._open.pop(run_id, None)
            if rec is None:
                return
            if self._open:
                for member in rec.members:
                    self._of.pop(member, None)
            else:
                self._of.clear()  # no other run open: nothing else is in it
                self._outside.clear()
            if rec.split and not rec.calls:
                return  # the user's runnable around graph runs, each kept as its own run
            self._done = [rec]  # the latest only: a branch reads it, users never grow it
        fields = self._kept(rec, outputs, error)
        if self._unsealed is not None:
            first = self._unsealed.add(fields)
            if first and isinstance(self.store, RunWriter):  # sealed on the writer's thread
                try:
                    self.store.later(self._unsealed)
                except StoreError:  # a closed writer: seal now; the save error is kept
                    self._unsealed()
            return
        run = score_run(Trajectory.new(**fields()), self.outcome, self.outcome_errors)
        self._keep(run)
        store_run(run, self.store, self.store_errors)

    def build(self, rec: _Recording, outputs: Any, error: BaseException | None) -> Trajectory:
        """The run ``rec`` as it would be recorded if it ended now with ``outputs``."""
        return Trajectory.new(**self.fields(rec, outputs, error))

    def fields(self, rec: _Recording, outputs: Any, error: BaseException | None
               ) -> dict[str, Any]:
        """What ``Trajectory.new`` takes for the run ``rec`` if it ended now with ``outputs``."""
        return self._kept(rec, outputs, error)()

    def _kept(self, rec: _Recording, outputs: Any, error: BaseException | None
              ) -> Callable[[], dict[str, Any]]:
        """What the run's end leaves to convert later: the final state copied where it can
        change, each decision and tool result as seen now; the function returned converts it
        into what ``Trajectory.new`` takes, on whichever thread calls it."""
        end: dict[int, Seen] = {}
        final = _frozen(outputs, end) if isinstance(outputs, dict) else {}
        calls = [c for c in list(rec.calls.values()) if c.message is not None]
        results = dict(rec.tool_results)
        for m in [*(c.message for c in calls), *results.values()]:
            if id(m) not in end:  # most are in the final state, seen just now
                end[id(m)] = seen(m)  # type: ignore[arg-type]
        inputs = None if calls else _frozen(rec.inputs, end)
        return functools.partial(
            _fields, rec, calls, results, final, end, inputs,
            repr(error) if error is not None else None, error is not None, time.time(),
            self.messages_key, self.fingerprint)


def _resumed(inputs: Any) -> str | None:
    """How an invoke went on with a thread paused for human input, or None for one given new
    input: ``Command(resume=...)`` (an ``interrupt()``), or no input at all (``invoke(None,
    config)`` after ``interrupt_before`` / ``interrupt_after``)."""
    if isinstance(inputs, Command) and inputs.resume is not None:
        return "Command(resume=...)"
    return "invoked with None" if inputs is None else None


def _replayable(out: Command[Any], messages_key: str) -> tuple[str | None, dict[str, Any] | None]:
    """The tool call id a tool's ``Command`` answers and its update's other channels, when a
    branch can write them back exactly: an update dict whose messages are one ``ToolMessage``,
    no ``goto``, ``graph`` or ``resume``, and channel values that round-trip as JSON unchanged
    (else None: a set, an object, a tuple)."""
    update = out.update
    if not isinstance(update, dict) or out.goto or out.graph is not None \
            or out.resume is not None:
        return None, None
    messages = update.get(messages_key)
    if not (isinstance(messages, list) and len(messages) == 1
            and isinstance(messages[0], ToolMessage)):
        return None, None
    channels = {str(k): v for k, v in update.items() if k != messages_key}
    return messages[0].tool_call_id, channels if round_trips(channels) else None


def _fields(rec: _Recording, calls: list[_Call], results: dict[str, ToolMessage],
            final: dict[str, Any], end: dict[int, Seen], inputs: Any, error: str | None,
            failed: bool, created_at: float, messages_key: str, fingerprint: str | None
            ) -> dict[str, Any]:
    """What ``Trajectory.new`` takes for a run ``CarCallback._kept`` kept at its end."""
    def at_end(message: BaseMessage) -> dict[str, Any]:
        return rec.convert(end[id(message)])

    def as_saw(message: BaseMessage) -> dict[str, Any]:  # a final-state message
        kept = end[id(message)]
        return as_the_app_saw(message, rec.convert(kept), kept[1], kept[3])

    ordered = task_order([(c, c.meta(rec)) for c in sorted(calls, key=lambda c: c.order)])
    final_messages = list(final.get(messages_key) or ())
    for m in final_messages:
        if isinstance(m, ToolMessage):
            results[m.tool_call_id] = m
    # a decision found in the final messages takes the results that follow it there (a
    # model may reuse call ids across steps); one that is not, the results by call id
    at = {m.id: i for i, m in enumerate(final_messages) if isinstance(m, AIMessage) and m.id}
    steps = []
    for i, (call, meta) in enumerate(ordered):
        message: Any = call.message
        state = [rec.convert(m) for m in call.state]
        pos = at.get(message.id) if message.id else None
        answers = final_messages[pos + 1:] if pos is not None else list(results.values())
        _, action, observation, observed = decode(  # this decision only, not later ones
            [message, *answers], [message.id], convert=at_end)[0]
        steps.append(Step(index=i, action=action, observation=observation,
                          observed=observed, state=state, meta=meta))
    status = RunStatus.COMPLETE
    if failed:
        status = RunStatus.ERROR
    elif "__interrupt__" in final or rec.interrupted:  # the graph's end leaves the key out
        status = RunStatus.INTERRUPTED
    context = ({"messages": steps[0].state} if steps
               else {"input": jsonable(inputs, at_end)})
    meta = {"framework": "langgraph", "thread_id": rec.thread_id,
            "final_state": jsonable({k: v for k, v in final.items() if k != "__interrupt__"},
                                    as_saw)}
    if rec.node_results:
        meta["node_tool_calls"] = list(rec.node_results)
    # the tools that ran as LangChain tools, where the guard can answer them on a branch: a
    # recorded call answered without one was run by a node's own code (``refusals``)
    meta["tools_run"] = sorted(rec.tools_run)
    if rec.state_writers:  # absent (older records, or none): nothing known, nothing refused
        meta["state_writing_tools"] = sorted(rec.state_writers)
        meta["state_writes"] = dict(rec.state_writes)
    if fingerprint is not None:
        meta["agent_fingerprint"] = fingerprint
    if rec.invocation is not None:  # {}: invoked with nothing besides its input
        meta["invocation"] = rec.invocation
    resumed = _resumed(rec.inputs)
    if resumed is not None:
        # a trial attributed such a run, which began after its refund: "undecided, raise the
        # budget", and nothing said the thread is what holds the cause
        meta[BEGAN_FROM] = (
            f"it resumed thread {rec.thread_id!r} after a pause for human input ({resumed}): "
            "to attribute the decisions before the pause as well, import the whole thread: "
            f"attribute_thread(app, thread_id={rec.thread_id!r}, ...) with the app compiled "
            "without interrupts")
    return {"context": context, "steps": steps, "agent": "langgraph", "status": status,
            "error": error, "meta": meta, "created_at": created_at}


# what a step's meta says lived here until 0.2; the old names resolve for one more release
_MOVED_TO_STEP_META = frozenset({"PUSH", "DEFAULT_GRAPH_NAME", "NODE_INPUT", "agent_of",
                                 "is_send_task", "builds_input", "task_key"})


def __getattr__(name: str) -> Any:
    """A step-meta helper under its old name, with a DeprecationWarning naming its home."""
    if name in _MOVED_TO_STEP_META:
        warnings.warn(f"{__name__}.{name} moved to {step_meta.__name__}.{name}; import it from "
                      "there (the old name goes in the next release)", DeprecationWarning,
                      stacklevel=2)
        return getattr(step_meta, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
