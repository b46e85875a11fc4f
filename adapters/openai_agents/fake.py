"""A seeded, scripted ``agents.Model`` for tests, examples and benchmarks.

``ScriptedModel(decide)`` is a real SDK model: ``Runner.run`` / ``run_sync`` / ``run_streamed``
drive it like a hosted one. ``decide(messages, tools, rng)`` gets the OpenAI-style message list
(system instructions first), the names of the tools and handoffs offered and a numpy
generator, and returns an action dict (``{"role": "assistant", "content", "tool_calls"}``) or
plain text. Inside a CAR branch the generator is the branch's per-step noise stream, so
branches that share a rollout index share the model's randomness (common random numbers);
outside CAR it is the model's own stream seeded at construction. ``calls`` counts the calls.
``latency_s`` makes each call wait that long (``asyncio.sleep``) before it answers, as a hosted
model does: such a model says it is ``remote``, so an ``OpenAIAgentsAgent`` over it runs its
branches concurrently by default (the latency benchmark's model).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
from agents import ModelResponse, Usage
from agents.models.interface import Model
from openai.types.responses import Response, ResponseCompletedEvent, ResponseUsage
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from ._items import output_of, to_dicts, tool_names_of

Decide = Callable[[list[dict[str, Any]], list[str], np.random.Generator], Any]

_STEP_RNG: contextvars.ContextVar[np.random.Generator | None] = contextvars.ContextVar(
    "car_openai_agents_step_rng", default=None)


def step_rng() -> np.random.Generator | None:
    """The noise stream of the step a CAR branch is deciding, or None outside a branch."""
    return _STEP_RNG.get()


class ScriptedModel(Model):
    """An SDK model whose every reply is ``decide(messages, tools, rng)``."""

    def __init__(self, decide: Decide, *, seed: int = 0, model: str = "scripted",
                 latency_s: float = 0.0) -> None:
        self.decide = decide
        self.model = model
        self.calls = 0
        self.latency_s = latency_s
        self._rng = np.random.default_rng(seed)

    @property
    def remote(self) -> bool:
        """Whether a call waits as a model server's does (it does when given a latency)."""
        return self.latency_s > 0

    def _respond(self, system: str | None, input: Any, tools: list[Any], handoffs: list[Any]
                 ) -> ModelResponse:
        self.calls += 1
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        messages = to_dicts(system, items)
        out = self.decide(messages, tool_names_of(tools, handoffs), step_rng() or self._rng)
        if isinstance(out, str) or out is None:
            out = {"role": "assistant", "content": out or ""}
        prompt = sum(len(str(m.get("content") or "")) for m in messages) // 4 + 1
        completion = len(str(out)) // 4 + 1
        return ModelResponse(output=output_of(out), response_id=None,
                             usage=Usage(requests=1, input_tokens=prompt,
                                         output_tokens=completion,
                                         total_tokens=prompt + completion))

    async def get_response(self, system_instructions: str | None, input: Any,
                           model_settings: Any, tools: list[Any], output_schema: Any,
                           handoffs: list[Any], tracing: Any, *, previous_response_id: Any = None,
                           conversation_id: Any = None, prompt: Any = None) -> ModelResponse:
        resp = self._respond(system_instructions, input, tools, handoffs)
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        return resp

    async def stream_response(self, system_instructions: str | None, input: Any,
                              model_settings: Any, tools: list[Any], output_schema: Any,
                              handoffs: list[Any], tracing: Any, *,
                              previous_response_id: Any = None, conversation_id: Any = None,
                              prompt: Any = None) -> AsyncIterator[Any]:
        resp = self._respond(system_instructions, input, tools, handoffs)
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        yield completed_event(resp.usage, output=resp.output, model=self.model,
                              response_id="scripted")


def completed_event(usage: Usage, *, output: list[Any], model: str, response_id: str,
                    sequence_number: int = 0) -> ResponseCompletedEvent:
    """The ``response.completed`` event that ends a stream, carrying ``usage`` as the SDK's
    Responses types spell it: a streaming model yields it last so the run counts its tokens."""
    tokens = ResponseUsage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                           total_tokens=usage.total_tokens,
                           input_tokens_details=InputTokensDetails.model_validate(
                               {"cached_tokens": 0, "cache_write_tokens": 0}),
                           output_tokens_details=OutputTokensDetails(reasoning_tokens=0))
    response = Response(id=response_id, created_at=0, model=model, object="response",
                        output=output, tool_choice="auto", tools=[], top_p=None,
                        parallel_tool_calls=True, status="completed", usage=tokens)
    return ResponseCompletedEvent(type="response.completed", response=response,
                                  sequence_number=sequence_number)
