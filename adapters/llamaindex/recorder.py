"""``CarRecorder``: LlamaIndex instrumentation turned into CAR trajectories.

One span handler and one event handler on the root dispatcher. A workflow run span (a
``FunctionAgent``, ``ReActAgent`` or ``AgentWorkflow`` run) opens a run; every span below it is
traced back to that root by its parent id, so runs in flight at once never mix. Each
``run_agent_step`` span that returns an ``AgentOutput`` is one step: the first chat-start event
below it gives the messages the model saw, the output gives the action, ``call_tool`` spans
that return a ``ToolCallResult`` give the observation (a result that came back as an error,
``ToolOutput.is_error``: the tool raised and the agent was told so, marked ``"status":
"error"``), the workflow ``Context`` the step span is given gives the store the step decided
from (``store_state``: every key but the framework's own bookkeeping, in ``meta["store"]``),
the first chat-start event the tools the model call was offered (name and description each, in
``meta["tools"]``: ``offered_tools``), and the chat events give model, parameters, token usage
and latency. When the run span closes the
trajectory is sealed, stored and becomes ``rec.run``. Each run carries the workflow's
fingerprint, taken as it starts (``car_adapters.llamaindex.fingerprint``), so attributing it
with another workflow is refused.

Branch runs started by ``LlamaIndexAgent`` carry a token in a context variable: a user's
recorder ignores them, and the branch's own private recorder takes only them.
"""

from __future__ import annotations

import contextvars
import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.agent.workflow import AgentWorkflow, BaseWorkflowAgent
from llama_index.core.agent.workflow.base_agent import DEFAULT_MAX_ITERATIONS
from llama_index.core.agent.workflow.workflow_events import AgentOutput, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent, LLMChatStartEvent
from llama_index.core.instrumentation.span import SimpleSpan
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
from llama_index.core.workflow import Workflow

import car_core as car
from car_core import RunStore
from car_core.contract import OutcomeFn, RunStatus, redact
from car_core.errors import AdapterError, OutcomeError, StoreError

from ..common.messages import tool_result
from ..common.run_keeping import open_store, score_run, store_run, unstored
from ._messages import action_of, to_dicts
from .fingerprint import workflow_digest
from .offered_tools import offered
from .store_state import (
    FRAMEWORK_KEYS,
    STORE_KEY,
    UNRESTORABLE_KEY,
    framework_keys,
    snapshot,
)

BRANCH_TOKEN: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "car_branch_token", default=None)
WRAPPER_MODELS = ("CarBranchLLM",)
# run meta: the record marks each tool result that came back as an error (``"status":
# "error"``), so an unmarked one was answered; a run recorded before carries no such key
ERRORS_MARKED = "tool_errors_marked"
# what CAR records steps of and branches: agent workflows, whose decisions are agent steps
# (and any other BaseWorkflowAgent: CodeActAgent, an agent class of the user's)
AGENT_KINDS = "FunctionAgent, ReActAgent and AgentWorkflow"
PARAM_KEYS = ("temperature", "top_p", "max_tokens", "seed", "model", "model_name",
              "context_window", "num_output")


def _span_name(span_id: str) -> str:
    return span_id[:-37] if len(span_id) > 37 and span_id[-37] == "-" else span_id


def _usage(response: Any) -> dict[str, int]:
    raw = getattr(response, "raw", None)
    usage = raw.get("usage") if isinstance(raw, dict) else getattr(raw, "usage", None)
    if usage is not None and not isinstance(usage, dict):
        usage = getattr(usage, "model_dump", lambda: {})()
    extra = getattr(response, "additional_kwargs", None) or {}
    usage = usage or extra
    try:
        return {"prompt_tokens": int(usage.get("prompt_tokens", 0) or 0),
                "completion_tokens": int(usage.get("completion_tokens", 0) or 0)}
    except (TypeError, ValueError, AttributeError):
        return {"prompt_tokens": 0, "completion_tokens": 0}


def _params(model_dict: dict[str, Any]) -> dict[str, Any]:
    return {k: model_dict[k] for k in PARAM_KEYS
            if k in model_dict and isinstance(model_dict[k], (str, int, float, bool))}


class RunNotRecorded(UserWarning):
    """A workflow run ended with no agent step seen, so the recorder kept no run of it."""


def is_agent_workflow(workflow: Any) -> bool:
    """Whether ``workflow`` is one CAR records steps of and branches (``AGENT_KINDS``)."""
    return isinstance(workflow, (BaseWorkflowAgent, AgentWorkflow))


def agents_of(workflow: Any) -> dict[str, Any]:
    """The agents of an ``AgentWorkflow`` by name, or a single agent under its own name."""
    agents = getattr(workflow, "agents", None)
    return dict(agents) if isinstance(agents, dict) else {getattr(workflow, "name", ""):
                                                          workflow}


def tool_names(workflow: Any) -> dict[str, list[str]]:
    """Per agent, the names of the tools it was given (what a branch must still offer)."""
    out = {}
    for name, agent in agents_of(workflow).items():
        names = []
        for t in getattr(agent, "tools", None) or ():
            meta = getattr(t, "metadata", None)
            names.append(meta.name if meta is not None else getattr(t, "__name__", repr(t)))
        out[str(name)] = sorted(names)
    return out


def _context_of(start_event: Any) -> Any:
    """What the run started from: the user message as a string, or a message list."""
    msgs: list[Any] = list(getattr(start_event, "chat_history", None) or [])
    user = getattr(start_event, "user_msg", None)
    if isinstance(user, str):
        user = ChatMessage(role="user", content=user)
    if user is not None:
        msgs.append(user)
    dicts = to_dicts(msgs)
    if len(dicts) == 1 and dicts[0]["role"] == "user":
        return dicts[0]["content"]
    return dicts


@dataclass
class _StepBuf:
    state: Any = None
    model: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 0,
                                                           "completion_tokens": 0})
    started: float | None = None
    ended: float | None = None
    llm_calls: int = 0
    store: dict[str, Any] | None = None
    unrestorable: list[str] = field(default_factory=list)
    tools: list[dict[str, str]] | None = None  # what the step's model call was offered


@dataclass
class _RunBuf:
    root: str
    workflow: Any
    context: Any
    fingerprint: str | None = None
    skip_keys: frozenset[str] = FRAMEWORK_KEYS
    spans: set[str] = field(default_factory=set)
    open_steps: dict[str, _StepBuf] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    inner_runs: int = 0  # workflow runs inside this one, each recorded as a run of its own
    max_iterations: int | None = None  # the run's ``run(max_iterations=...)``, where given


class _Spans(BaseSpanHandler[SimpleSpan]):
    _rec: Any = PrivateAttr()

    def __init__(self, rec: CarRecorder) -> None:
        super().__init__()
        self._rec = rec

    @classmethod
    def class_name(cls) -> str:
        return "CarRecorderSpans"

    def new_span(self, id_: str, bound_args: Any, instance: Any = None,
                 parent_span_id: str | None = None, tags: Any = None, **kw: Any) -> None:
        self._rec._enter(id_, bound_args, instance, parent_span_id)
        return None

    def prepare_to_exit_span(self, id_: str, bound_args: Any, instance: Any = None,
                             result: Any = None, **kw: Any) -> None:
        self._rec._exit(id_, result, None)
        return None

    def prepare_to_drop_span(self, id_: str, bound_args: Any, instance: Any = None,
                             err: BaseException | None = None, **kw: Any) -> None:
        self._rec._exit(id_, None, err)
        return None


class _Events(BaseEventHandler):
    _rec: Any = PrivateAttr()

    def __init__(self, rec: CarRecorder) -> None:
        super().__init__()
        self._rec = rec

    @classmethod
    def class_name(cls) -> str:
        return "CarRecorderEvents"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, (LLMChatStartEvent, LLMChatEndEvent)):
            self._rec._llm_event(event)


class CarRecorder:
    """Records every agent workflow run into a ``car.Trajectory`` (stored when ``store`` is
    given: a path or a ``car.RunStore``). Call ``attach()`` once; ``run`` is the latest finished
    run and ``runs`` all of them, in the order they finished. ``outcome`` (``outcome(run)`` or
    ``outcome(run, rng)``, as for ``car.record``) scores each run as it finishes, so the store
    knows which runs failed. A run that could not be stored or scored is still in ``runs``, and
    the error in ``store_errors`` / ``outcome_errors`` (the agent's run is not broken). A
    workflow run inside another one (an agent used as a tool) is recorded as its own run. A
    workflow run in which no agent step was seen (a custom ``Workflow``) is not kept: a
    ``RunNotRecorded`` warning says so, and ``skipped`` names its workflow."""

    def __init__(self, store: str | os.PathLike[str] | RunStore | None = None, *,
                 outcome: Callable[..., Any] | None = None,
                 _token: object | None = None) -> None:
        self.store_errors: list[StoreError] = []
        self.store = open_store(store, self.store_errors)
        self._raised = 0  # of store_errors, how many a flush raised already
        self.outcome = OutcomeFn(outcome) if outcome is not None else None
        self.runs: list[car.Trajectory] = []
        self.outcome_errors: list[OutcomeError] = []
        self.skipped: list[str] = []  # the workflow of each run not kept (``_unrecorded``)
        self._token = _token
        self._lock = threading.RLock()
        self._run_of: dict[str, str] = {}
        self._parent: dict[str, str | None] = {}
        self._bufs: dict[str, _RunBuf] = {}
        self._spans = _Spans(self)
        self._events = _Events(self)
        self._attached = False

    # -- registration -------------------------------------------------------------------
    def attach(self) -> CarRecorder:
        """Register on the root dispatcher (once: calling it again changes nothing)."""
        with self._lock:
            if not self._attached:
                root = get_dispatcher()
                root.add_span_handler(self._spans)
                root.add_event_handler(self._events)
                self._attached = True
        return self

    def flush(self) -> None:
        """Wait until every finished run is in the store. A store given as a path is written
        off the agent's critical path (``car_core.contract.RunWriter``): reading ``run``,
        ``detach()``, this call and a normal exit each make the writes durable. A run that
        could not be stored raises ``StoreError`` here, once (it stays in ``runs``)."""
        failed = unstored(self.store, self.store_errors, self._raised)
        self._raised = len(self.store_errors)
        if failed is not None:
            raise failed

    def detach(self) -> None:
        """Unregister (runs still in flight are dropped) and flush the finished ones."""
        self.flush()
        with self._lock:
            if self._attached:
                root = get_dispatcher()
                if self._spans in root.span_handlers:
                    root.span_handlers.remove(self._spans)
                if self._events in root.event_handlers:
                    root.event_handlers.remove(self._events)
                self._attached = False
                self._bufs.clear()
                self._run_of.clear()
                self._parent.clear()

    @property
    def attached(self) -> bool:
        return self._attached

    @property
    def run(self) -> car.Trajectory:
        """The latest finished run, already in the store when there is one."""
        self.flush()
        if self.runs:
            return self.runs[-1]
        if not self._attached:
            raise AdapterError("this CarRecorder was never attached, so it saw no run",
                               hint="call rec.attach() before running the agent")
        if self.skipped:
            raise AdapterError(
                f"no agent run has finished since the recorder was attached; it saw "
                f"{len(self.skipped)} run(s) of {sorted(set(self.skipped))} with no agent step, "
                "and kept none of them",
                hint=f"CAR records agent workflows ({AGENT_KINDS}): run one of those")
        raise AdapterError("no agent run has finished since the recorder was attached",
                           hint="await agent.run(...) to completion, then read rec.run")

    # -- span and event plumbing ---------------------------------------------------------
    def _enter(self, id_: str, bound_args: Any, instance: Any, parent: str | None) -> None:
        with self._lock:
            root = self._run_of.get(parent) if parent else None
            nested_run = isinstance(instance, Workflow) and ".run-" in id_
            if root is not None and not nested_run:
                self._run_of[id_] = root
                self._parent[id_] = parent
                buf = self._bufs[root]
                buf.spans.add(id_)
                if _span_name(id_).endswith(".run_agent_step"):
                    ctx = bound_args.arguments.get("ctx") if bound_args is not None else None
                    store, bad = snapshot(ctx, buf.skip_keys)
                    buf.open_steps[id_] = _StepBuf(store=store, unrestorable=bad)
                return
            if not nested_run:
                return
            if BRANCH_TOKEN.get() is not self._token:
                return
            if root is not None:
                self._bufs[root].inner_runs += 1
            start = bound_args.arguments.get("start_event") if bound_args is not None else None
            self._run_of[id_] = id_
            self._parent[id_] = None
            redact.register_from(instance)  # its LLMs' keys are never recorded
            read = getattr(start, "get", None)
            given = read("max_iterations") if callable(read) else None
            self._bufs[id_] = _RunBuf(root=id_, workflow=instance, context=_context_of(start),
                                      max_iterations=given if isinstance(given, int) else None,
                                      spans={id_}, fingerprint=None if self._token is not None
                                      else workflow_digest(instance),  # as the run began
                                      skip_keys=framework_keys(agents_of(instance).values()))

    def _step_of(self, span_id: str | None) -> tuple[_RunBuf, _StepBuf] | None:
        root = self._run_of.get(span_id or "")
        if root is None:
            return None
        buf = self._bufs[root]
        sid: str | None = span_id
        while sid is not None and sid not in buf.open_steps:
            sid = self._parent.get(sid)
        return (buf, buf.open_steps[sid]) if sid is not None else None

    def _llm_event(self, event: Any) -> None:
        with self._lock:
            found = self._step_of(event.span_id)
            if found is None:
                return
            _, step = found
            if isinstance(event, LLMChatStartEvent):
                model_dict = dict(event.model_dict or {})
                cls = model_dict.get("class_name", "")
                if step.state is None:
                    step.state = to_dicts(event.messages)
                    step.tools = offered((event.additional_kwargs or {}).get("tools"))
                    step.started = time.monotonic()
                if cls not in WRAPPER_MODELS:
                    step.model = str(model_dict.get("model") or model_dict.get("model_name")
                                     or cls or "unknown")
                    step.params = _params(model_dict)
                    step.llm_calls += 1
            else:
                step.ended = time.monotonic()
                if event.response is not None and not _from_wrapper(event.response):
                    u = _usage(event.response)
                    step.usage["prompt_tokens"] += u["prompt_tokens"]
                    step.usage["completion_tokens"] += u["completion_tokens"]

    def _exit(self, id_: str, result: Any, err: BaseException | None) -> None:
        finished, dropped = None, None
        with self._lock:
            root = self._run_of.get(id_)
            if root is None:
                return
            buf = self._bufs[root]
            if id_ in buf.open_steps:
                step = buf.open_steps[id_]
                if isinstance(result, AgentOutput):
                    buf.steps.append(self._step_record(step, result))
            elif isinstance(result, ToolCallResult) and buf.steps:
                out = result.tool_output
                answer = tool_result(result.tool_id, result.tool_name, str(out.content))
                if out.is_error:  # the tool raised (or said so): the agent was told the error
                    answer["status"] = "error"
                buf.steps[-1]["results"].append(answer)
            if id_ == root:
                dropped = self._unrecorded(buf, err)
                finished = self._finish(buf, err)
        if dropped is not None:
            self.skipped.append(type(buf.workflow).__name__)
            if dropped:
                warnings.warn(dropped, RunNotRecorded, stacklevel=2)
            return
        if finished is not None:
            finished = score_run(finished, self.outcome, self.outcome_errors)
            self.runs.append(finished)
            store_run(finished, self.store, self.store_errors)

    def _unrecorded(self, buf: _RunBuf, err: BaseException | None) -> str | None:
        """Why a finished workflow run is not kept (a warning, or "" to drop it quietly), or
        None to keep it. A run in which no agent step was seen (a custom ``Workflow`` of
        ``@step`` methods, whose model and tool calls are no agent steps) is dropped, not
        stored: stored, it would be a complete run of no step, scored as a pass by any outcome
        that looks for a failure in the steps, hiding a real failure from ``car runs`` and
        triage; stored with status error, every run of a working app would be listed as
        failed. The warning says so where the app runs; ``rec.run`` says so too. Dropped
        quietly: a workflow whose steps ran agents (each recorded as a run of its own). An
        agent workflow that failed before its first step stays an error run, and a branch's
        own recorder keeps whatever its branch ran."""
        if self._token is not None or buf.steps or (err is not None
                                                    and is_agent_workflow(buf.workflow)):
            return None
        if buf.inner_runs:
            return ""
        name = type(buf.workflow).__name__
        if is_agent_workflow(buf.workflow):
            return (f"CAR did not store a run of {name}: it ended without an agent step "
                    "(no model decision was seen), so there is nothing to replay or score")
        return (f"CAR did not store a run of the custom Workflow {name}: CAR records only "
                f"agent workflows ({AGENT_KINDS}), whose decisions are agent steps; its model "
                "and tool calls are not, so the run would be stored with no step and scored "
                "as if it had done nothing wrong. Build the app from those agents, or run one "
                "inside a step of the workflow: each agent run is then recorded on its own")

    @staticmethod
    def _step_record(step: _StepBuf, output: AgentOutput) -> dict[str, Any]:
        action = action_of(output.response.content, output.tool_calls or ())
        latency = (step.ended - step.started) if step.started and step.ended else 0.0
        meta: dict[str, Any] = {
            "agent": output.current_agent_name, "model": step.model, "params": step.params,
            "usage": dict(step.usage), "latency_s": round(latency, 6),
            "llm_calls": step.llm_calls, STORE_KEY: step.store}
        if step.unrestorable:
            meta[UNRESTORABLE_KEY] = step.unrestorable
        if step.tools:
            meta["tools"] = step.tools
        return {"action": action, "state": step.state, "meta": meta, "results": []}

    def _finish(self, buf: _RunBuf, err: BaseException | None) -> car.Trajectory:
        for sid in buf.spans:
            self._run_of.pop(sid, None)
            self._parent.pop(sid, None)
        del self._bufs[buf.root]
        steps = []
        for i, s in enumerate(buf.steps):
            order = [c["id"] for c in s["action"]["tool_calls"]]
            results = sorted(s["results"], key=lambda m: order.index(m["tool_call_id"])
                             if m["tool_call_id"] in order else len(order))
            steps.append(car.Step(index=i, action=s["action"], observation=results or None,
                                  observed=bool(results), state=s["state"],
                                  meta={**s["meta"], "llamaindex_run": buf.root}))
        meta = {"framework": "llama-index", "workflow": type(buf.workflow).__name__,
                "tools": tool_names(buf.workflow), ERRORS_MARKED: True,
                "max_iterations": buf.max_iterations or DEFAULT_MAX_ITERATIONS}
        if buf.fingerprint is not None:
            meta["agent_fingerprint"] = buf.fingerprint
        return car.Trajectory.new(
            context=buf.context, steps=steps, agent=f"llamaindex:{type(buf.workflow).__name__}",
            status=RunStatus.ERROR if err is not None else RunStatus.COMPLETE,
            error=repr(err) if err is not None else None, meta=meta)


def _from_wrapper(response: Any) -> bool:
    return bool((getattr(response, "additional_kwargs", None) or {}).get("car_branch"))
