"""``CarMiddleware``: what ``CarChatModel`` gives, for ``create_agent`` users, without wrapping
the model.

``create_agent(model, tools, middleware=[CarMiddleware()])`` — pass the same object as
``LangGraphAgent(app, model=mw)``. Outside CAR branches it hands every model call on unchanged.
On a branch thread its ``wrap_model_call`` decides the call by step index, as ``CarChatModel``
does: a held step answers with its recorded action (through a stand-in model, so the call is
still seen and recorded, but no real model is called), steps from a ``do_policy`` on go to the
swapped-in model, a ``do_context`` that edits the system prompt gives the call its whole input
(the edited prompt, then the graph's messages), one that edits tool descriptions gives the call
the tools so described, and live calls get a per-step seed from the branch noise when the model
has a ``seed`` field. Every model of a multi-agent app must go through CAR (this middleware on
each ``create_agent``, or ``CarChatModel``), or the step count would skip its calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

try:
    from langchain.agents.middleware import AgentMiddleware
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("CarMiddleware needs LangChain 1.x: "
                      "pip install 'causal-agent-replay[langgraph]'") from exc
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from car_core.contract import Origin

from .messages import action_message
from .model import _current_control, deciding, seedable
from .offered_tools import described, offering


class HeldModel(BaseChatModel):
    """A stand-in chat model that answers with one fixed message (a held step's action).

    It carries the name and profile of the model it stands in for (``of``): ``create_agent``
    reads them to pick a raw schema's structured-output strategy (the provider's where the
    model supports it), and must pick for a held answer the one it picked for the recorded
    call, or the answer is not parsed as it was."""

    message: AIMessage
    model_name: str | None = None

    @classmethod
    def of(cls, message: AIMessage, model: Any) -> HeldModel:
        """The stand-in answering ``message`` for ``model`` (the request's model)."""
        name = (getattr(model, "model_name", None) or getattr(model, "model", None)
                or getattr(model, "model_id", None))
        return cls(message=message, model_name=name if isinstance(name, str) else None,
                   profile=model.profile if isinstance(model, BaseChatModel) else None)

    @property
    def _llm_type(self) -> str:
        return "car-held"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.message.model_copy())],
                          llm_output={"car_origin": Origin.HELD.value})


class CarMiddleware(AgentMiddleware):
    """Lets CAR hold, force, swap and seed a ``create_agent`` app's model calls."""

    def __init__(self, *, seed_models: bool = True) -> None:
        super().__init__()
        self.seed_models = seed_models  # branches share noise when the model takes a seed

    def _route(self, request: Any) -> Any:
        control = _current_control()
        if control is None:
            return request
        k = control.take()
        if k in control.forced:
            control.steps[k] = {"origin": Origin.HELD, "model": None}
            return request.override(model=HeldModel.of(action_message(control.forced[k]),
                                                       request.model))
        model = request.model
        if control.policy is not None and k >= control.policy[0]:
            model = control.policy[1]
        if self.seed_models and control.noise is not None and seedable(model):
            model = model.model_copy(update={"seed": control.noise.int_seed(k)})
        control.steps[k] = {"seed": getattr(model, "seed", None),
                            "model": getattr(model, "model_name", None)
                            or getattr(model, "model", None) or model._llm_type}
        changes: dict[str, Any] = {} if model is request.model else {"model": model}
        if k in control.inputs:  # a do_context that reaches the call: its whole input, the
            # edited system prompt included (so not create_agent's own)
            changes.update(model=model, messages=list(control.inputs[k]), system_message=None)
        if k in control.tools:  # a do_context that edited tool descriptions: this call only
            changes["tools"] = described(request.tools, control.tools[k])
        return request.override(**changes) if changes else request

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        with deciding():
            routed = self._route(request)
            with offering(routed.tools):  # what the recorder keeps as the call's tools
                return handler(routed)

    async def awrap_model_call(self, request: Any,
                               handler: Callable[[Any], Awaitable[Any]]) -> Any:
        with deciding():
            routed = self._route(request)
            with offering(routed.tools):
                return await handler(routed)
