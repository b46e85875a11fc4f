"""The embedded SmolLM2 model as a LlamaIndex function-calling LLM: no server, no key.

``LocalLLM`` drives ``FunctionAgent`` / ``AgentWorkflow`` like a hosted model. Its replies come
from ``car_adapters.models.local.generate`` (grammar-constrained tool calls, the prefix-cached
llama.cpp context). The seed of a call is drawn from the CAR branch's per-step noise when there
is one (so branches share common random numbers), else from the LLM's own stream seeded by
``seed`` (so successive runs sample afresh), exactly as ``ScriptedLLM`` draws its randomness.

It needs the ``local`` extra (llama-cpp-python) and langchain-core, which
``car_adapters.models.local`` imports for its LangChain chat model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse

from ..models import local
from ..models.chat_agent import make_action
from ._messages import from_dict, to_dicts
from .fake import ScriptedLLM, step_rng


def _unused(messages: Any, tools: Any, rng: Any) -> Any:  # ScriptedLLM wants a decide
    raise AssertionError("LocalLLM decides with the embedded model")


class LocalLLM(ScriptedLLM):
    """SmolLM2-135M-Instruct in-process; ``fresh_tools`` as in ``models.local.generate``."""

    temperature: float = 0.8
    max_tokens: int = 48
    top_p: float = 0.95
    fresh_tools: bool = False

    def __init__(self, *, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(_unused, seed=seed, model=local.MODEL, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "CarLocalLLM"

    def _reply(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        self._calls += 1
        history = to_dicts(messages)
        tools = [t.metadata.to_openai_tool() for t in kwargs.get("tools") or ()
                 if getattr(t, "metadata", None) is not None]
        seed = int((step_rng() or self._rng).integers(2**31 - 1))
        out = local.generate(history, tools=tools or None, seed=seed,
                             temperature=self.temperature, max_tokens=self.max_tokens,
                             top_p=self.top_p, fresh_tools=self.fresh_tools)
        k = sum(1 for m in history if m.get("role") == "assistant")
        action = make_action(k, out["content"], out["calls"], out["finish_reason"], tools,
                             self.max_tokens)
        return ChatResponse(message=from_dict(action),
                            raw={"usage": out["usage"], "seed": seed, "model": local.MODEL})


__all__ = ["LocalLLM"]
