"""A LlamaIndex function-calling LLM that answers through one async ``_reply`` (as a client of
an HTTP model server does): the base of the tests' LLMs that talk to a stub server."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

from car_adapters.llamaindex._messages import MessageToolCalls
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, LLMMetadata
from llama_index.core.llms.callbacks import llm_chat_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM


class AsyncReplyLLM(MessageToolCalls, FunctionCallingLLM):
    """``achat`` and ``astream_chat`` (one chunk) are ``_reply``; the sync API is not served,
    since CAR drives LlamaIndex agents through the async one."""

    @classmethod
    def class_name(cls) -> str:
        return cls.__name__

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_function_calling_model=True, is_chat_model=True,
                           model_name="stub-model")

    async def _reply(self, messages: Sequence[ChatMessage]) -> ChatResponse:
        raise NotImplementedError

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await self._reply(messages)

    def chat(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    stream_chat = complete = stream_complete = acomplete = astream_complete = chat

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any
                           ) -> AsyncGenerator[ChatResponse, None]:
        resp = await self._reply(messages)

        async def gen() -> AsyncGenerator[ChatResponse, None]:
            yield resp
        return gen()
