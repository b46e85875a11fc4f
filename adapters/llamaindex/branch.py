"""What a LlamaIndex agent uses on a CAR branch in place of its own model and tools.

``CarBranchLLM`` stands in for each agent's LLM: it numbers the decisions from the branch step
on, answers forced and held steps with the recorded action (no model call), sends the others to
the agent's own LLM (or the swapped-in one under ``do_policy``) with the step's noise stream in
context, and normalises every reply to ``ToolCallBlock`` tool calls. ``CarBranchTool`` stands in
for each tool: a forced observation is served as given, a side-effect tool is answered by
``ToolSafety`` (record, simulator, or ``SideEffectBlocked``), everything else runs live.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    LLMMetadata,
    TextBlock,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import LLM
from llama_index.core.tools import AsyncBaseTool, ToolMetadata, ToolOutput

from car_core.contract import Stream, redact
from car_core.errors import (
    AdapterError,
    CarError,
    ModelUnavailable,
    PolicyError,
)

from ..common.branch import BranchSession, is_outage
from ..common.messages import calls_of, canonical_arguments
from ._messages import MessageToolCalls, from_dict
from .fake import _STEP_RNG


def _normalise(content: str | None, selections: Sequence[Any]) -> ChatMessage:
    blocks: list[Any] = [TextBlock(text=content)] if content is not None else []
    blocks += [ToolCallBlock(tool_call_id=s.tool_id, tool_name=s.tool_name,
                             tool_kwargs=dict(s.tool_kwargs)) for s in selections]
    return ChatMessage(role="assistant", blocks=blocks)


class CarBranchLLM(MessageToolCalls, FunctionCallingLLM):
    """Serves an agent's decisions on a branch (see the module docstring)."""

    _inner: Any = PrivateAttr()
    _session: Any = PrivateAttr()

    def __init__(self, inner: LLM, session: BranchSession) -> None:
        super().__init__()
        self._inner = inner
        self._session = session

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
        s: BranchSession = self._session
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
                s.blocked = ModelUnavailable(
                    f"the model server failed at step {k}: {redact.describe(exc)}", run_id=s.run_id,
                    step=k, hint="start the server or fix its address, then resume the "
                                 "attribution with the same attribution_id")
                raise s.blocked from redact.redacted(exc)
            raise PolicyError(f"the LLM raised {redact.describe(exc)}", run_id=s.run_id, step=k,
                              hint="check the model (and any do_policy LLM) works on its own"
                              ) from redact.redacted(exc)
        finally:
            _STEP_RNG.reset(token)
        return ChatResponse(message=_normalise(resp.message.content, selections or ()),
                            raw=resp.raw, additional_kwargs={"car_branch": True})

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await self._decide(messages, kwargs.get("tools"),
                                  bool(kwargs.get("allow_parallel_tool_calls", True)))

    async def achat_with_tools(self, tools: Sequence[Any], user_msg: Any = None,
                               chat_history: list[ChatMessage] | None = None,
                               verbose: bool = False, allow_parallel_tool_calls: bool = False,
                               tool_required: bool = False, **kwargs: Any) -> ChatResponse:
        messages = self._prepare_chat_with_tools(tools, user_msg, chat_history)["messages"]
        return await self.achat(messages, tools=list(tools or ()),
                                allow_parallel_tool_calls=allow_parallel_tool_calls)

    async def astream_chat_with_tools(self, tools: Sequence[Any], user_msg: Any = None,
                                      chat_history: list[ChatMessage] | None = None,
                                      verbose: bool = False,
                                      allow_parallel_tool_calls: bool = False,
                                      tool_required: bool = False, **kwargs: Any
                                      ) -> AsyncGenerator[ChatResponse, None]:
        resp = await self.achat_with_tools(tools, user_msg, chat_history, verbose,
                                           allow_parallel_tool_calls)

        async def gen() -> AsyncGenerator[ChatResponse, None]:
            yield resp
        return gen()

    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any
                           ) -> AsyncGenerator[ChatResponse, None]:
        resp = await self.achat(messages, **kwargs)

        async def gen() -> AsyncGenerator[ChatResponse, None]:
            yield resp
        return gen()


    def _sync(self, *a: Any, **k: Any) -> Any:
        raise AdapterError("CAR branches drive LlamaIndex agents through the async API only",
                           hint="run the agent with `await agent.run(...)`")

    chat = stream_chat = complete = stream_complete = _sync  # type: ignore[assignment]

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any
                        ) -> CompletionResponse:
        return self._sync()

    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                               ) -> Any:
        return self._sync()


class CarBranchTool(AsyncBaseTool):
    """Serves one tool on a branch (see the module docstring)."""

    def __init__(self, inner: AsyncBaseTool, session: BranchSession) -> None:
        self._inner = inner
        self._session = session

    @property
    def metadata(self) -> ToolMetadata:
        return self._inner.metadata

    def _served(self, kwargs: dict[str, Any]) -> ToolOutput | None:
        s: BranchSession = self._session
        name = self.metadata.name or ""
        k = s.current
        if k in s.forced_obs:
            wanted = canonical_arguments(kwargs)
            for msg, (_, cname, cargs) in zip(s.forced_obs[k],
                                              calls_of(s.plan.forced_actions.get(k)),
                                              strict=False):
                if cname == name and cargs == wanted:
                    return ToolOutput(content=str(msg["content"]), tool_name=name,
                                      raw_input={"kwargs": kwargs}, raw_output=msg["content"])
        if s.safety.guards(name):
            try:
                out = s.safety.serve(name, kwargs, s.record, run_id=s.run_id, step=k)
            except CarError as exc:
                s.blocked = exc
                raise
            return ToolOutput(content=str(out), tool_name=name, raw_input={"kwargs": kwargs},
                              raw_output=out)
        return None

    def call(self, *args: Any, **kwargs: Any) -> ToolOutput:
        return self._served(kwargs) or self._inner.call(*args, **kwargs)

    async def acall(self, *args: Any, **kwargs: Any) -> ToolOutput:
        return self._served(kwargs) or await self._inner.acall(*args, **kwargs)
