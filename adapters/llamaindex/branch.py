"""What a LlamaIndex agent uses on a CAR branch in place of its own model and tools.

The stand-ins sit on the user's agent objects while any branch over them is in flight
(``installed``) and serve the branch whose task is asking: each branch sets its own
``BranchSession`` in a context variable (``session_scope``), so branches running at once on one
event loop (or on several threads) never see each other's plan, noise or step counter. With no
branch session the stand-ins pass every call to what they stand in for.

``CarBranchLLM`` stands in for each agent's LLM: it numbers the decisions from the branch step
on, answers forced and held steps with the recorded action (no model call), sends the others to
the agent's own LLM (or the swapped-in one under ``do_policy``) with the step's noise stream in
context, and normalises every reply to ``ToolCallBlock`` tool calls; the decision a
``do_context`` edit of the tools' descriptions is for is offered copies of the tools so
described (``offered_tools``). ``CarBranchTool`` stands in
for each tool: a forced observation is served as given, a side-effect tool is answered by
``ToolSafety`` (record, simulator, or ``SideEffectBlocked``), everything else runs live.
``CarBranchContextTool`` stands in for each tool handed the workflow ``Context``: the framework
still hands it the ``Context``, and a side-effect one is answered with the recorded result and
the recorded write to ``ctx.store`` replayed (an identical call), or by a simulator given the
``Context`` (``fn(arguments, ctx)``), or stops the branch.
Code a live tool runs (``running_tool``) may call other tool objects itself, or run a nested
agent: on a branch, ``guard_nested_calls`` answers such a call of a side-effect tool as the
stand-ins would, and stops a call of a tool nothing classified.
``StatePrompt`` stands in for the state prompts: a branch re-enters with recorded messages that
already carry the state the framework put on them, so on a branch it gives the message back
unchanged.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, NoReturn

from llama_index.core.base.llms.base import BaseLLM
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    LLMMetadata,
    TextBlock,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.llms.callbacks import llm_chat_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import LLM
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import (
    AsyncBaseTool,
    BaseTool,
    FunctionTool,
    ToolMetadata,
    ToolOutput,
    adapt_to_async_tool,
)

from car_core.contract import Noise, Plan, Stream, ToolSource, is_outage, redact
from car_core.errors import (
    AdapterError,
    CarError,
    ModelUnavailable,
    PolicyError,
    SideEffectBlocked,
)

from ..common import branch as chat_branch
from ..common.messages import Answer, ToolSafety, as_content, calls_of, canonical_arguments
from ..common.state_change import Change, Conflict
from ._messages import MessageToolCalls, from_dict
from .fake import _STEP_RNG
from .offered_tools import described
from .recorder import BRANCH_TOKEN, CarRecorder, _Events, _Spans
from .store_state import replay


class BranchSession(chat_branch.BranchSession):
    """The shared branch session, plus what a LlamaIndex branch re-enters with: ``system``,
    the system messages an agent decides from on this branch, in order, in place of those the
    agent puts first itself (the recorded ones, or a ``do_context`` edit of them: a changed
    prompt, an instruction added after it), and ``as_recorded``, whether the
    messages it re-enters with are recorded ones (the state prompt is already on them),
    ``writes``, what each recorded call of a tool handed the ``Context`` wrote to ``ctx.store``
    where the record shows it (``state_change.recorded_changes``), and ``tools``, by step, the
    descriptions a ``do_context`` edit gave that step's tools (``{name: description}``)."""

    def __init__(self, plan: Plan, noise: Noise, start: int, safety: ToolSafety,
                 record: Mapping[tuple[str, str], Any], run_id: str | None,
                 forced_obs: Mapping[int, list[dict[str, Any]]],
                 writes: Mapping[tuple[str, str], Change] | None = None) -> None:
        super().__init__(plan, noise, start, safety, record, run_id, forced_obs)
        self.system: dict[str, list[str]] = {}
        self.as_recorded = False
        self.writes: Mapping[tuple[str, str], Change] = writes or {}
        self.tools: dict[int, dict[str, str]] = {}


_SESSION: contextvars.ContextVar[BranchSession | None] = contextvars.ContextVar(
    "car_llamaindex_branch", default=None)


@contextmanager
def session_scope(session: BranchSession) -> Iterator[None]:
    """Make ``session`` the one the stand-ins serve in this task (and the tasks it starts)."""
    token = _SESSION.set(session)
    try:
        yield
    finally:
        _SESSION.reset(token)


class _Installed:
    """What ``installed`` put on one workflow's agent objects, and how many branches use it."""

    def __init__(self) -> None:
        self.count = 0
        self.saved: dict[str, tuple[Any, Any, Any]] = {}
        self.flow_prompt: Any = None


_INSTALLED: dict[int, _Installed] = {}  # id(workflow) -> its stand-ins while branches run
_INSTALL_LOCK = threading.Lock()


_IN_TOOL: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "car_llamaindex_in_tool", default=None)


@contextmanager
def running_tool(name: str) -> Iterator[None]:
    """Mark the code that runs here as tool ``name``'s: tool calls it makes (and the tasks it
    starts make, a nested agent's among them) are the net's (``guard_nested_calls``)."""
    token = _IN_TOOL.set(name)
    try:
        yield
    finally:
        _IN_TOOL.reset(token)


_NET_LOCK = threading.Lock()
_NETTED: set[type] = set()  # tool classes whose call methods carry the net
_CALLS = ("call", "acall", "__call__")


def guard_nested_calls() -> None:
    """Put the net for nested calls on the call methods of ``FunctionTool`` and of every tool
    class the app defined (``_app_tool_classes``; looked for again at each branch, so a class
    imported later is netted too), transparent where no branch session is set: on a branch,
    a call of a tool object that the stand-ins did not make — a tool's own code calling
    another tool, or a nested agent calling its tools — is answered like a side-effect call
    (``_nested``: simulator or identical recorded call) when it is a side effect, or stopped
    when nothing classified the tool; a safe tool runs (``nested`` module docstring). The net
    was on ``FunctionTool`` alone: a user trial's own ``AsyncBaseTool``, a side effect with a
    simulator, called from a safe tool's code, wrote real ledger lines from the branches."""
    with _NET_LOCK:
        for cls in (FunctionTool, *_app_tool_classes()):
            if cls in _NETTED:
                continue
            _NETTED.add(cls)
            for attr in _CALLS:
                original = cls.__dict__.get(attr)
                if original is not None:
                    netted = _netted_acall if attr == "acall" else _netted_call
                    setattr(cls, attr, netted(original))


def _app_tool_classes() -> list[type]:
    """The ``BaseTool`` subclasses loaded so far that are neither LlamaIndex's own (its
    wrappers and adapters reach the app's tools through the app's classes) nor CAR's
    stand-ins."""
    found, todo = [], list(BaseTool.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if not cls.__module__.startswith(("llama_index.", __name__.rpartition(".")[0])):
            found.append(cls)
    return found


def _netted_call(original: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(self: BaseTool, *args: Any, **kwargs: Any) -> Any:
        s = _SESSION.get()
        if s is not None and _nested_guarded(s, self):
            name, arguments = self.metadata.name or "", _arguments(self, args, kwargs)
            return _nested_output(self, arguments, _nested(s, lambda: s.safety.served(
                name, arguments, s.record, run_id=s.run_id)))
        return original(self, *args, **kwargs)
    return guarded


def _netted_acall(original: Callable[..., Any]) -> Callable[..., Any]:
    async def guarded(self: BaseTool, *args: Any, **kwargs: Any) -> Any:
        s = _SESSION.get()
        if s is not None and _nested_guarded(s, self):
            name, arguments = self.metadata.name or "", _arguments(self, args, kwargs)
            found = _nested(s, lambda: s.safety.answer(name, arguments, s.record,
                                                         run_id=s.run_id))
            if found.simulate:
                ctx = kwargs.get(getattr(self, "ctx_param_name", None) or "")
                found = replace(found, content=as_content(
                    await s.safety.asimulate(name, arguments, ctx)))
            return _nested_output(self, arguments, found)
        return await original(self, *args, **kwargs)
    return guarded


def _arguments(tool: BaseTool, args: Sequence[Any], kwargs: Mapping[str, Any]
               ) -> dict[str, Any]:
    """A nested call's arguments as a model's tool call names them: the keywords (less the
    workflow ``Context``), and a positional input (``BaseTool(input)``) merged in when it is
    a mapping, else as ``input``."""
    out = {k: v for k, v in kwargs.items() if k != getattr(tool, "ctx_param_name", None)}
    if len(args) == 1 and isinstance(args[0], Mapping):
        return {**args[0], **out}
    if args:
        out["input"] = args[0] if len(args) == 1 else list(args)
    return out


def _nested_guarded(s: BranchSession, tool: BaseTool) -> bool:
    """Whether a call of ``tool`` on branch ``s`` is the net's to answer: a side effect, or a
    tool nothing classified (stopped, unless ``unclassified="live"``). The stand-ins call the
    tools they run (safe ones) through here too, and those pass."""
    if isinstance(tool, CarBranchContextTool) or _IN_TOOL.get() is None:
        return False  # a stand-in, or a call the framework makes (a handoff): not nested
    if getattr(getattr(tool, "real_fn", None), "__module__", "").startswith("llama_index."):
        return False  # the framework's own tool (a nested workflow's handoff)
    name = tool.metadata.name or ""
    safety = s.safety
    if safety.guards(name):
        return True
    if name in safety.safe_tools or name in safety.live or safety.unclassified == "live":
        return False
    s.blocked = SideEffectBlocked(
        f"a branch reached tool {name!r} from another tool's code, and it is none of the tools "
        "CAR classified (not one the agents were given, nor one their code names), so it was "
        "not run", run_id=s.run_id, step=s.current,
        hint=f"classify the tool whose code calls {name!r} in side_effect_tools=[...] (its "
             "recorded answer is then replayed and its code does not run)")
    raise s.blocked


def _nested(s: BranchSession, answer: Callable[[], Answer]) -> Answer:
    """``answer()``, with a refusal worded as a call from code and noted on the session (the
    framework hands a tool's error to the model; the branch must stop anyway)."""
    try:
        return answer()
    except SideEffectBlocked as exc:
        s.blocked = SideEffectBlocked(f"from another tool's code (not a model's tool call): {exc}",
                                      run_id=exc.run_id, step=s.current, hint=exc.hint)
        raise s.blocked from None


def _nested_output(tool: BaseTool, arguments: Mapping[str, Any], found: Answer) -> ToolOutput:
    return ToolOutput(content=str(found.content), tool_name=tool.metadata.name or "",
                      raw_input={"kwargs": dict(arguments)}, raw_output=found.content)


@contextmanager
def installed(workflow: Any, agents: Mapping[str, Any], context_tools: Iterable[str]
              ) -> Iterator[None]:
    """The stand-ins on ``workflow``'s agents while this branch runs: put there by the first
    branch over them to start (from any wrapper, loop or thread) and taken away, the agents
    given back as they were, when the last one ends. ``context_tools``: the tools handed the
    workflow ``Context``, whose stand-ins stay function tools that take it, so the framework
    still hands it to them."""
    keep = set(context_tools)
    guard_nested_calls()
    with _INSTALL_LOCK:
        inst = _INSTALLED.setdefault(id(workflow), _Installed())
        if inst.count == 0:
            for name, a in agents.items():
                inst.saved[name] = (a.llm, a.tools, a.state_prompt)
                a.llm = CarBranchLLM(a.llm, str(name))
                a.tools = [CarBranchContextTool(t) if _tool_name(t) in keep
                           else CarBranchTool(t) for t in a.tools or ()]
                a.state_prompt = StatePrompt(a.state_prompt)
            if getattr(workflow, "root_agent", None) is not None:  # AgentWorkflow's own
                inst.flow_prompt = workflow.state_prompt
                workflow.state_prompt = StatePrompt(workflow.state_prompt)
        inst.count += 1
    try:
        yield
    finally:
        with _INSTALL_LOCK:
            inst.count -= 1
            if inst.count == 0:
                for name, a in agents.items():
                    a.llm, a.tools, a.state_prompt = inst.saved[name]
                if inst.flow_prompt is not None:
                    workflow.state_prompt = inst.flow_prompt
                del _INSTALLED[id(workflow)]


class _Router:
    """One span handler and one event handler on the root dispatcher for every branch in
    flight, each call handed to the collector of the branch whose task makes it (its token in
    ``BRANCH_TOKEN``). A recorder attached per branch would see every event of every branch:
    with many branches at once the instrumentation cost grows with their square."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.collectors: dict[object, CarRecorder] = {}
        self.spans = _Spans(self)  # type: ignore[arg-type]  # it calls _enter / _exit only
        self.events = _Events(self)  # type: ignore[arg-type]  # and _llm_event

    def _targets(self) -> list[CarRecorder]:
        token = BRANCH_TOKEN.get()
        found = self.collectors.get(token) if token is not None else None
        if found is not None:
            return [found]
        with self.lock:  # a call from outside any branch: each collector ignores what is not its
            return list(self.collectors.values())

    def _enter(self, id_: str, bound_args: Any, instance: Any, parent: str | None) -> None:
        for rec in self._targets():
            rec._enter(id_, bound_args, instance, parent)

    def _exit(self, id_: str, result: Any, err: BaseException | None) -> None:
        for rec in self._targets():
            rec._exit(id_, result, err)

    def _llm_event(self, event: Any) -> None:
        for rec in self._targets():
            rec._llm_event(event)


_ROUTER = _Router()


@contextmanager
def collecting() -> Iterator[CarRecorder]:
    """A private recorder for the branch run in this task: it takes only the runs started
    under its token (set here, in ``BRANCH_TOKEN``), so a user's recorder ignores them."""
    token = object()
    collector = CarRecorder(_token=token)
    root = get_dispatcher()
    with _ROUTER.lock:
        _ROUTER.collectors[token] = collector
        if len(_ROUTER.collectors) == 1:
            root.add_span_handler(_ROUTER.spans)
            root.add_event_handler(_ROUTER.events)
    reset = BRANCH_TOKEN.set(token)
    try:
        yield collector
    finally:
        BRANCH_TOKEN.reset(reset)
        with _ROUTER.lock:
            del _ROUTER.collectors[token]
            if not _ROUTER.collectors:
                if _ROUTER.spans in root.span_handlers:
                    root.span_handlers.remove(_ROUTER.spans)
                if _ROUTER.events in root.event_handlers:
                    root.event_handlers.remove(_ROUTER.events)


def unwrapped(llm: Any) -> Any:
    """The LLM an agent was given, even while a branch's stand-in is in its place."""
    return llm._inner if isinstance(llm, CarBranchLLM) else llm


def _as_tool(tool: Any) -> BaseTool:
    return tool if isinstance(tool, BaseTool) else FunctionTool.from_defaults(tool)


def _tool_name(tool: Any) -> str:
    return _as_tool(tool).metadata.name or ""


def _normalise(content: str | None, selections: Sequence[Any]) -> ChatMessage:
    blocks: list[Any] = [TextBlock(text=content)] if content is not None else []
    blocks += [ToolCallBlock(tool_call_id=s.tool_id, tool_name=s.tool_name,
                             tool_kwargs=dict(s.tool_kwargs)) for s in selections]
    return ChatMessage(role="assistant", blocks=blocks)


class CarBranchLLM(MessageToolCalls, FunctionCallingLLM):
    """Serves an agent's decisions on a branch (see the module docstring)."""

    _inner: Any = PrivateAttr()
    _agent: str = PrivateAttr()

    def __init__(self, inner: LLM, agent: str) -> None:
        super().__init__()
        self._inner = inner
        self._agent = agent

    @classmethod
    def class_name(cls) -> str:
        return "CarBranchLLM"

    @property
    def metadata(self) -> LLMMetadata:
        meta = self._inner.metadata
        return LLMMetadata(**{**meta.model_dump(), "is_function_calling_model": True})

    async def _decide(self, messages: Sequence[ChatMessage], tools: Sequence[Any] | None,
                      allow_parallel: bool) -> ChatResponse:
        """Step ``k``'s reply. ``tools`` is None for a plain chat call (``ReActAgent`` parses
        its tool calls from the text), else the tools offered to a function-calling model."""
        s = _SESSION.get()
        assert s is not None  # the public methods pass calls outside a branch through
        s.raise_blocked()
        k = s.claim()
        plan = s.plan
        if k in plan.forced_actions and k not in plan.context_edits:
            msg = from_dict(plan.forced_actions[k])
            return ChatResponse(message=msg, additional_kwargs={"car_branch": True})
        llm = self._inner
        if plan.policy is not None and k >= plan.policy[0]:
            llm = plan.policy[1]
            if not isinstance(llm, LLM) or (tools is not None
                                            and not isinstance(llm, FunctionCallingLLM)):
                raise AdapterError(f"do_policy gave {type(llm).__name__}, not a LlamaIndex "
                                   "function-calling LLM", run_id=s.run_id, step=k,
                                   hint="pass an LLM instance (e.g. another FunctionCallingLLM)")
        token = _STEP_RNG.set(s.noise.rng(k, Stream.POLICY))
        try:
            s.model_calls += 1
            if tools is None:
                resp = await llm.achat(list(messages))
                return ChatResponse(message=resp.message, raw=resp.raw,
                                    additional_kwargs={"car_branch": True})
            resp = await llm.achat_with_tools(tools=list(tools), chat_history=list(messages),
                                              allow_parallel_tool_calls=allow_parallel)
            selections = llm.get_tool_calls_from_response(resp, error_on_no_tool_call=False)
        except ModelUnavailable as exc:
            s.blocked = exc  # in case the framework wraps it: the branch must still stop
            raise
        except CarError:
            raise
        except Exception as exc:  # the model's failure: say which step
            if is_outage(exc):  # stop the attribution (resumable), as every adapter does
                s.blocked = chat_branch.model_unavailable(exc, step=k, run_id=s.run_id)
                raise s.blocked from s.blocked.__cause__
            raise PolicyError(f"the LLM raised {redact.describe(exc)}", run_id=s.run_id, step=k,
                              hint="check the model (and any do_policy LLM) works on its own"
                              ) from redact.redacted(exc)
        finally:
            _STEP_RNG.reset(token)
        return ChatResponse(message=_normalise(resp.message.content, selections or ()),
                            raw=resp.raw, additional_kwargs={"car_branch": True})

    def _as_branch_sees(self, messages: Sequence[ChatMessage]) -> list[ChatMessage]:
        """The messages with this branch's system messages for this agent, where it has them,
        in place of the leading ones the agent wrote (its prompt; a ReAct agent's header too):
        the branch's history starts past its own, so every leading one is the agent's."""
        s = _SESSION.get()
        systems = s.system.get(self._agent) if s is not None else None
        out = list(messages)
        if systems is None:
            return out
        lead = 0
        while lead < len(out) and out[lead].role == "system":
            lead += 1
        if [m.content for m in out[:lead]] == systems:
            return out  # the agent's own, as the step saw them
        return [*(ChatMessage(role="system", content=text) for text in systems), *out[lead:]]

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        # LlamaIndex's callback decorators return their function untyped: the types are said here
        response: ChatResponse
        if _SESSION.get() is None:
            response = await self._inner.achat(messages, **kwargs)
        else:
            response = await self._branch_chat(self._as_branch_sees(messages),
                                               **self._as_branch_offers(kwargs))
        return response

    @staticmethod
    def _as_branch_offers(kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments with the tools described as this branch's edit of the step
        about to be decided says (that step's call only; the rest get them as recorded)."""
        s = _SESSION.get()
        edited = s.tools.get(s.next) if s is not None else None
        if not edited or not kwargs.get("tools"):
            return kwargs
        return {**kwargs, "tools": described(kwargs["tools"], edited)}

    @llm_chat_callback()
    async def _branch_chat(self, messages: Sequence[ChatMessage], **kwargs: Any
                           ) -> ChatResponse:
        return await self._decide(messages, kwargs.get("tools"),
                                  bool(kwargs.get("allow_parallel_tool_calls", True)))

    async def achat_with_tools(self, tools: Sequence[Any], user_msg: Any = None,
                               chat_history: list[ChatMessage] | None = None,
                               verbose: bool = False, allow_parallel_tool_calls: bool = False,
                               tool_required: bool = False, **kwargs: Any) -> ChatResponse:
        if _SESSION.get() is None:
            return await self._inner.achat_with_tools(  # type: ignore[no-any-return]
                tools, user_msg=user_msg, chat_history=chat_history, verbose=verbose,
                allow_parallel_tool_calls=allow_parallel_tool_calls,
                tool_required=tool_required, **kwargs)
        messages = self._prepare_chat_with_tools(tools, user_msg, chat_history)["messages"]
        return await self.achat(messages, tools=list(tools or ()),
                                allow_parallel_tool_calls=allow_parallel_tool_calls)

    def get_tool_calls_from_response(self, response: Any, error_on_no_tool_call: bool = False,
                                     **kwargs: Any) -> list[Any]:
        if (getattr(response, "additional_kwargs", None) or {}).get("car_branch"):
            return super().get_tool_calls_from_response(response, error_on_no_tool_call)
        return self._inner.get_tool_calls_from_response(  # type: ignore[no-any-return]
            response, error_on_no_tool_call=error_on_no_tool_call, **kwargs)

    async def astream_chat_with_tools(self, tools: Sequence[Any], user_msg: Any = None,
                                      chat_history: list[ChatMessage] | None = None,
                                      verbose: bool = False,
                                      allow_parallel_tool_calls: bool = False,
                                      tool_required: bool = False, **kwargs: Any
                                      ) -> AsyncGenerator[ChatResponse, None]:
        if _SESSION.get() is None:
            return await self._inner.astream_chat_with_tools(  # type: ignore[no-any-return]
                tools, user_msg=user_msg, chat_history=chat_history, verbose=verbose,
                allow_parallel_tool_calls=allow_parallel_tool_calls,
                tool_required=tool_required, **kwargs)
        resp = await self.achat_with_tools(tools, user_msg, chat_history, verbose,
                                           allow_parallel_tool_calls)

        async def gen() -> AsyncGenerator[ChatResponse, None]:
            yield resp
        return gen()

    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any
                           ) -> AsyncGenerator[ChatResponse, None]:
        if _SESSION.get() is None:
            return await self._inner.astream_chat(  # type: ignore[no-any-return]
                messages, **kwargs)
        resp = await self.achat(messages, **kwargs)

        async def gen() -> AsyncGenerator[ChatResponse, None]:
            yield resp
        return gen()


    def _sync(self, *a: Any, **k: Any) -> NoReturn:
        raise AdapterError("CAR branches drive LlamaIndex agents through the async API only",
                           hint="run the agent with `await agent.run(...)`")

    chat = stream_chat = complete = stream_complete = _sync

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any
                        ) -> CompletionResponse:
        return self._sync()

    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                               ) -> Any:
        return self._sync()


class CarBranchTool(AsyncBaseTool):
    """Serves one tool on a branch (see the module docstring)."""

    def __init__(self, tool: Any) -> None:
        self.tool = tool  # as the agent was given it, put back when the branches end
        self._inner = adapt_to_async_tool(_as_tool(tool))

    @property
    def metadata(self) -> ToolMetadata:
        return self._inner.metadata

    def _served(self, kwargs: dict[str, Any]) -> ToolOutput | None:
        s = _SESSION.get()
        name = self.metadata.name or ""
        if s is None or not s.serves(name):
            return None
        k = s.current
        if k in s.forced_obs:
            wanted = canonical_arguments(kwargs)
            for msg, (_, cname, cargs) in zip(s.forced_obs[k],
                                              calls_of(s.plan.forced_actions.get(k)),
                                              strict=False):
                if cname == name and cargs == wanted:
                    s.note(k, name, kwargs, ToolSource.FORCED)
                    return ToolOutput(content=str(msg["content"]), tool_name=name,
                                      raw_input={"kwargs": kwargs}, raw_output=msg["content"])
        if s.safety.guards(name):
            try:
                found = s.safety.served(name, kwargs, s.record, run_id=s.run_id, step=k)
            except CarError as exc:
                s.blocked = exc
                raise
            s.note(k, name, kwargs, found.source)
            return ToolOutput(content=str(found.content), tool_name=name,
                              raw_input={"kwargs": kwargs}, raw_output=found.content)
        return None

    def _live(self, kwargs: dict[str, Any]) -> None:
        """Note that a branch ran this tool for real (a safe tool)."""
        s = _SESSION.get()
        if s is not None:
            s.note(s.current, self.metadata.name or "", kwargs, ToolSource.LIVE)

    def call(self, *args: Any, **kwargs: Any) -> ToolOutput:
        served = self._served(kwargs)
        if served is not None:
            return served
        self._live(kwargs)
        with running_tool(self.metadata.name or ""):
            return self._inner.call(*args, **kwargs)

    async def acall(self, *args: Any, **kwargs: Any) -> ToolOutput:
        served = self._served(kwargs)
        if served is not None:
            return served
        self._live(kwargs)
        with running_tool(self.metadata.name or ""):
            return await self._inner.acall(*args, **kwargs)


class CarBranchContextTool(FunctionTool):
    """Serves one tool handed the workflow ``Context`` on a branch (see the module docstring):
    a function tool taking the ``Context`` as the original does, so the framework hands it
    over; a call the branch does not guard runs the original."""

    def __init__(self, tool: Any) -> None:
        inner = _as_tool(tool)
        assert isinstance(inner, FunctionTool)  # only function tools are handed the Context
        super().__init__(fn=inner._real_fn, metadata=inner.metadata,
                         partial_params=dict(inner.partial_params))
        # the framework hands the Context to a function tool by these, as to the original
        self.requires_context, self.ctx_param_name = True, inner.ctx_param_name
        self.tool = tool  # as the agent was given it, put back when the branches end
        self._inner = inner

    def _guarded(self) -> BranchSession | None:
        s = _SESSION.get()
        return s if s is not None and s.safety.guards(self.metadata.name or "") else None

    def call(self, *args: Any, **kwargs: Any) -> ToolOutput:
        if self._guarded() is not None:
            raise AdapterError("CAR branches drive LlamaIndex agents through the async API only",
                               hint="run the agent with `await agent.run(...)`")
        return self._inner.call(*args, **kwargs)

    async def acall(self, *args: Any, **kwargs: Any) -> ToolOutput:
        s = self._guarded()
        name = self.metadata.name or ""
        arguments = {k: v for k, v in kwargs.items() if k != self.ctx_param_name}
        if s is None:
            branch = _SESSION.get()
            if branch is not None:  # a safe tool: it runs for real on the branch
                branch.note(branch.current, name, arguments, ToolSource.LIVE)
            with running_tool(name):
                return await self._inner.acall(*args, **kwargs)
        ctx = kwargs.get(self.ctx_param_name or "")
        k = s.current
        try:
            found = s.safety.answer(name, arguments, s.record, run_id=s.run_id, step=k,
                                    writes=s.writes)
            s.note(k, name, arguments, found.source)
            if found.simulate:
                out = as_content(await s.safety.asimulate(name, arguments, ctx))
            else:
                out = found.content
                try:
                    await replay(ctx, found.change or [])
                except Conflict as exc:
                    raise SideEffectBlocked(
                        f"the branch called side-effect tool {name!r} as the record did, but "
                        f"its ctx.store holds another value at {exc} than the record held "
                        "there when the call wrote it, so the recorded write is not what the "
                        "tool would write here", run_id=s.run_id, step=k,
                        hint=f"pass simulators={{{name!r}: fn(arguments, ctx)}}: it is handed "
                             "the workflow Context and writes ctx.store as the tool would"
                    ) from None
        except CarError as exc:
            s.blocked = exc
            raise
        return ToolOutput(content=str(out), tool_name=name, raw_input={"kwargs": arguments},
                          raw_output=out)


class StatePrompt(PromptTemplate):
    """A state prompt that, on a branch re-entered with recorded messages, gives the message
    back unchanged (the recorded message already carries the state); elsewhere it is the
    prompt it stands in for."""

    _prompt: Any = PrivateAttr()

    def __init__(self, prompt: Any) -> None:
        text = prompt.get_template() if hasattr(prompt, "get_template") else str(prompt)
        super().__init__(text)
        self._prompt = prompt

    def format(self, llm: BaseLLM | None = None,
               completion_to_prompt: Callable[[str], str] | None = None, **kwargs: Any) -> str:
        s = _SESSION.get()
        if s is not None and s.as_recorded:
            return str(kwargs.get("msg", ""))
        if isinstance(self._prompt, str):
            return self._prompt.format(**kwargs)
        if completion_to_prompt is not None:  # passed on only when given, as it came
            kwargs["completion_to_prompt"] = completion_to_prompt
        return str(self._prompt.format(llm=llm, **kwargs))
