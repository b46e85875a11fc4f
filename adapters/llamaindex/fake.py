"""A seeded, scripted tool-calling LLM for tests, examples and benchmarks.

``ScriptedLLM(decide)`` is a real ``FunctionCallingLLM``: ``FunctionAgent`` and
``AgentWorkflow`` drive it like any hosted model. ``decide(messages, tools, rng)`` gets the
OpenAI-style message list, the names of the tools offered and a numpy generator, and returns an
action dict (``{"role": "assistant", "content", "tool_calls"}``) or plain text. Inside a CAR
branch the generator is the branch's per-step noise stream, so branches that share a rollout
index share the model's randomness (common random numbers); outside CAR it is the LLM's own
stream seeded at construction. ``calls`` counts the model calls, so tests can check that a held
prefix costs none. ``latency_s`` makes each async call wait that long (``asyncio.sleep``) before
it answers, as a hosted model does: such an LLM says it is ``remote``, so a ``LlamaIndexAgent``
over it runs its branches concurrently by default (the latency benchmark's model).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncGenerator, Callable, Generator, Sequence
from typing import Any

import numpy as np
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    LLMMetadata,
)
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM

from ._messages import MessageToolCalls, from_dict, to_dicts

Decide = Callable[[list[dict[str, Any]], list[str], np.random.Generator], Any]

_STEP_RNG: contextvars.ContextVar[np.random.Generator | None] = contextvars.ContextVar(
    "car_step_rng", default=None)


def step_rng() -> np.random.Generator | None:
    """The noise stream of the step a CAR branch is deciding, or None outside a branch."""
    return _STEP_RNG.get()


def _tool_names(tools: Sequence[Any] | None) -> list[str]:
    return [t.metadata.name for t in tools or () if getattr(t, "metadata", None) is not None]


# The calls LlamaIndex makes of an LLM: a subclass that answers one of them its own way may wait
# on anything (``ScriptedLLM.remote``); one that only changes ``_reply`` answers in-process.
_ANSWERS = ("chat", "achat", "stream_chat", "astream_chat", "complete", "acomplete")


class ScriptedLLM(MessageToolCalls, FunctionCallingLLM):
    """A function-calling LLM whose every reply is ``decide(messages, tools, rng)``."""

    model: str = "scripted"
    seed: int = 0
    uses_car_noise: bool = True
    latency_s: float = 0.0
    _decide: Decide = PrivateAttr()
    _rng: np.random.Generator = PrivateAttr()
    _calls: int = PrivateAttr(default=0)

    def __init__(self, decide: Decide, *, seed: int = 0, model: str = "scripted",
                 **kwargs: Any) -> None:
        super().__init__(seed=seed, model=model, **kwargs)
        self._decide = decide
        self._rng = np.random.default_rng(seed)
        self._calls = 0

    @classmethod
    def class_name(cls) -> str:
        return "ScriptedLLM"

    @property
    def calls(self) -> int:
        return self._calls

    @property
    def remote(self) -> bool:
        """Whether a call waits as a model server's does: it does when given a latency, or
        when a subclass answers calls its own way (a trial's subclass awaited
        ``asyncio.sleep`` in ``astream_chat`` with no latency set, and its branches ran one
        at a time, as in-process answers do: 68 s for 60 rollouts against 19 s)."""
        def owner(name: str) -> type | None:  # the class defining it (methods are wrapped)
            return next((c for c in type(self).__mro__ if name in vars(c)), None)
        own = any((c := owner(m)) is not None and c is not ScriptedLLM
                  and issubclass(c, ScriptedLLM) for m in _ANSWERS)
        return self.latency_s > 0 or own

    async def _wait(self) -> None:
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_function_calling_model=True, is_chat_model=True,
                           model_name=self.model)

    def _reply(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        self._calls += 1
        rng = step_rng() or self._rng
        history = to_dicts(messages)
        out = self._decide(history, _tool_names(kwargs.get("tools")), rng)
        if isinstance(out, str) or out is None:
            out = {"role": "assistant", "content": out or ""}
        msg = from_dict(out)
        prompt = sum(len(str(m.get("content") or "")) for m in history) // 4 + 1
        completion = len(str(out)) // 4 + 1
        return ChatResponse(message=msg, raw={"usage": {"prompt_tokens": prompt,
                                                        "completion_tokens": completion}})

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._reply(messages, **kwargs)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        resp = self._reply(messages, **kwargs)
        await self._wait()
        return resp

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any
                    ) -> Generator[ChatResponse, None, None]:
        resp = self._reply(messages, **kwargs)

        def gen() -> Generator[ChatResponse, None, None]:
            yield resp
        return gen()

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any
                           ) -> AsyncGenerator[ChatResponse, None]:
        resp = self._reply(messages, **kwargs)
        await self._wait()

        async def gen() -> AsyncGenerator[ChatResponse, None]:
            yield resp
        return gen()

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                 ) -> CompletionResponse:
        return CompletionResponse(text=self._reply([ChatMessage(role="user", content=prompt)])
                                  .message.content or "")

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any
                        ) -> CompletionResponse:
        response: CompletionResponse = self.complete(prompt, formatted, **kwargs)  # untyped
        return response

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                        ) -> Generator[CompletionResponse, None, None]:
        resp = self.complete(prompt, formatted, **kwargs)

        def gen() -> Generator[CompletionResponse, None, None]:
            yield resp
        return gen()

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                               ) -> AsyncGenerator[CompletionResponse, None]:
        resp = self.complete(prompt, formatted, **kwargs)

        async def gen() -> AsyncGenerator[CompletionResponse, None]:
            yield resp
        return gen()

