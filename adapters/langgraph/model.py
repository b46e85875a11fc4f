"""``CarChatModel``: the chat model wrapper that lets CAR steer a LangGraph app's decisions.

Build the app with ``CarChatModel(inner=your_model)`` wherever it would use ``your_model``.
Outside CAR branches it is transparent: every call goes to ``inner``. On a branch (a thread CAR
created, found through the thread id in the runnable config LangGraph propagates), the branch's
``Control`` decides each call by step index: a held step returns its recorded action without
calling any model, steps after a ``do_policy`` go to the swapped-in model, a ``do_context`` on a
``Send`` task's step replaces the messages the model is given (the task builds them from its
``Send`` payload, not from the graph's messages), a ``do_context`` that edits tool descriptions
binds that step's call the tools so described, and every live call gets a per-step seed
from the branch noise when the model has a ``seed`` field (so branches share common random
numbers). The step index is counted per branch thread from the fork step (branches run a
superstep's parallel tasks one at a time, so the count follows LangGraph's task order).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables.config import ensure_config

from car_core.contract import Noise, Origin, redact

from .messages import action_message, usage_of
from .offered_tools import described


@dataclass
class Control:
    """How one branch thread's model calls are decided, and what they cost."""

    next_index: int
    forced: dict[int, Mapping[str, Any]] = field(default_factory=dict)
    policy: tuple[int, Any] | None = None
    noise: Noise | None = None
    inputs: dict[int, list[BaseMessage]] = field(default_factory=dict)  # step -> model input
    # step -> {tool name: edited description}, bound for that step's call only
    tools: dict[int, dict[str, str]] = field(default_factory=dict)
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> int:
        with self.lock:
            k = self.next_index
            self.next_index += 1
            return k


_CONTROLS: dict[str, Control] = {}
_LOCK = threading.Lock()


@contextmanager
def controlling(thread_id: str, control: Control) -> Iterator[Control]:
    """Route the model calls of ``thread_id`` through ``control`` while the block runs."""
    with _LOCK:
        _CONTROLS[thread_id] = control
    try:
        yield control
    finally:
        with _LOCK:
            _CONTROLS.pop(thread_id, None)


def _current_control() -> Control | None:
    thread_id = (ensure_config().get("configurable") or {}).get("thread_id")
    if thread_id is None:
        return None
    with _LOCK:
        return _CONTROLS.get(str(thread_id))


# A chat-model call CAR decides is marked, so a recorder or a branch can tell it from a model
# call CAR never sees (one that would shift the step count): CarChatModel puts the marker in
# its invocation params; CarMiddleware sets the context variable around the model call it
# routes (the call's callbacks run in that context).
CAR_DECIDED = "car_decided"
_DECIDING: ContextVar[bool] = ContextVar("car_deciding", default=False)


@contextmanager
def deciding() -> Iterator[None]:
    """Mark the chat-model calls made inside the block as decided by CAR."""
    token = _DECIDING.set(True)
    try:
        yield
    finally:
        _DECIDING.reset(token)


def decided_by_car(invocation_params: Mapping[str, Any] | None) -> bool:
    """Whether the chat-model call with these invocation params goes through CAR."""
    return _DECIDING.get() or bool((invocation_params or {}).get(CAR_DECIDED))


def seedable(model: Any) -> bool:
    return "seed" in getattr(type(model), "model_fields", {})


# Field names of the chat models that call a server (ChatOpenAI's ``openai_api_base``,
# ChatOllama's ``base_url``, ChatAnthropic's ``anthropic_api_key``, Bedrock's ``endpoint_url``).
_SERVER_FIELDS = ("base_url", "api_base", "api_url", "api_key", "endpoint")


def waits_on_server(model: Any) -> bool:
    """Whether a chat model's calls wait on a model server: its own ``remote`` (True or
    False) when it says, else whether it has a server's address or key among its fields.
    In-process models (the embedded llama.cpp model, fakes) have neither: False."""
    said = getattr(model, "remote", None)
    if isinstance(said, bool):
        return said
    fields = getattr(type(model), "model_fields", {})
    return any(part in name for name in fields for part in _SERVER_FIELDS)


class CarChatModel(BaseChatModel):
    """Wraps the app's chat model so CAR can hold, force, swap and seed its calls."""

    inner: BaseChatModel

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        redact.register_from(self.inner)  # its key, headers and URL userinfo are never written
        if self.profile is None:  # what create_agent reads, with ``model_name``, to pick
            self.profile = self.inner.profile  # a raw schema's structured-output strategy

    @property
    def model_name(self) -> str | None:
        """The wrapped model's name: ``create_agent(response_format=Schema)`` uses the
        provider's structured output for a model it knows supports it (``gpt-4o``), and the
        wrapper must not turn that into the tool strategy the unwrapped app does not use."""
        for key in ("model_name", "model", "model_id"):
            name = getattr(self.inner, key, None)
            if isinstance(name, str) and name:
                return name
        return None

    @property
    def _llm_type(self) -> str:
        return self.inner._llm_type

    @property
    def _identifying_params(self) -> Mapping[str, Any]:
        return self.inner._identifying_params

    def _get_invocation_params(self, stop: list[str] | None = None,
                               **kwargs: Any) -> dict[str, Any]:
        return {**super()._get_invocation_params(stop=stop, **kwargs), CAR_DECIDED: True}

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        # Keep the tools, not the inner model's binding: a swapped-in model binds them itself.
        return self.bind(car_tools=list(tools), car_tool_kwargs=kwargs)

    def _plan(self, kwargs: dict[str, Any]
              ) -> tuple[Control | None, int | None, Any, dict[str, Any]]:
        tools = kwargs.pop("car_tools", None)
        tool_kwargs = kwargs.pop("car_tool_kwargs", None) or {}
        control = _current_control()
        k = control.take() if control is not None else None
        model: Any = self.inner
        if control is not None and k is not None:
            if control.policy is not None and k >= control.policy[0]:
                model = control.policy[1]
            if control.noise is not None and seedable(model):
                model = model.model_copy(update={"seed": control.noise.int_seed(k)})
        extra: dict[str, Any] = {}
        if tools and control is not None and k in control.tools:
            tools = described(tools, control.tools[k])  # a do_context edited descriptions
        if tools:
            bound = model.bind_tools(tools, **tool_kwargs)
            extra = dict(getattr(bound, "kwargs", {}) or {})
        return control, k, model, {**extra, **kwargs}

    @staticmethod
    def _forced(control: Control, k: int) -> ChatResult:
        msg = action_message(control.forced[k])
        control.steps[k] = {"origin": Origin.HELD, "model": None}
        return ChatResult(generations=[ChatGeneration(message=msg)],
                          llm_output={"car_origin": Origin.HELD.value})

    @staticmethod
    def _note(control: Control | None, k: int | None, model: Any, result: ChatResult,
              started: float) -> ChatResult:
        if control is not None and k is not None:
            msg = result.generations[0].message
            control.steps[k] = {
                "model": getattr(model, "model_name", None) or getattr(model, "model", None)
                or model._llm_type,
                "usage": usage_of(msg, result.llm_output),
                "seed": getattr(model, "seed", None),
                "latency_s": time.perf_counter() - started}
        return result

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        control, k, model, kw = self._plan(kwargs)
        if control is not None and k in control.forced:
            return self._forced(control, k)
        if control is not None and k in control.inputs:
            messages = list(control.inputs[k])
        started = time.perf_counter()
        result = model._generate(messages, stop=stop, run_manager=run_manager, **kw)
        return self._note(control, k, model, result, started)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        control, k, model, kw = self._plan(kwargs)
        if control is not None and k in control.forced:
            return self._forced(control, k)
        if control is not None and k in control.inputs:
            messages = list(control.inputs[k])
        started = time.perf_counter()
        result = await model._agenerate(messages, stop=stop, run_manager=run_manager, **kw)
        return self._note(control, k, model, result, started)

