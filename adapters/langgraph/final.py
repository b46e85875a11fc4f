"""``final_state(run)``: a LangGraph run's final graph state as the app saw it.

A run stores its final state as JSON (``run.meta["final_state"]``: messages as OpenAI-style
dicts), so an app's own rule that reads ``ToolMessage`` objects or content blocks finds neither
there. ``final_state`` turns the stored state back into what the graph held, so the app's rule
can score runs and branches as it scores the app: ``outcome=lambda run: rule(final_state(run))``.
Recorded, imported and branch runs all store their final state the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage

from car_core.contract import Trajectory
from car_core.errors import AdapterError

from ..common.final import recorded_meta
from .messages import BLOCKS, action_message

# The keys each stored message has (required, then allowed), by role: what ``dict_of`` writes,
# plus what ``as_the_app_saw`` adds to a final-state message.
_SHAPES: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "assistant": (frozenset({"role", "content", "tool_calls"}),
                  frozenset({"role", "content", "tool_calls", "name"})),
    "tool": (frozenset({"role", "content", "tool_call_id"}),
             frozenset({"role", "content", "tool_call_id", "name", BLOCKS, "status"})),
    "user": (frozenset({"role", "content"}), frozenset({"role", "content", "name"})),
    "system": (frozenset({"role", "content"}), frozenset({"role", "content", "name"})),
}


def final_state(run: Trajectory) -> dict[str, Any]:
    """The graph state ``run`` ended with, as the app saw it: every stored message back as a
    LangChain message (``HumanMessage``, ``AIMessage`` with its ``tool_calls`` and, where one
    was recorded, the ``name`` of the agent that wrote it, ``ToolMessage`` with its
    ``tool_call_id``, ``name`` and ``status``, ``SystemMessage``), content blocks as the list
    of blocks the app had; every other channel as stored (JSON: a pydantic model or a
    dataclass, such as ``create_agent``'s ``structured_response``, as its JSON dict, so
    ``final_state(run)["structured_response"]["refund_cents"]``; any other value that was not
    JSON as its ``repr``). Message ids, metadata and tool artifacts are not stored and not
    given back. A dict anywhere in the state with exactly the shape CAR stores a message in is
    read as a message; a message of another kind (a ``ChatMessage``, a ``FunctionMessage``) is
    left as its stored dict. Runs recorded before content blocks were kept give a tool's
    blocks as the JSON string they were stored as. A new dict each call: edit it freely."""
    meta = recorded_meta(run, "langgraph")
    state = meta.get("final_state")
    if not isinstance(state, Mapping):
        raise AdapterError("the run carries no final graph state (run.meta['final_state'])",
                           run_id=run.id,
                           hint="record the run with car_adapters.langgraph.CarCallback or "
                                "import its thread with LangGraphAgent(app).import_thread")
    return {str(k): _read(v) for k, v in state.items()}


def _read(value: Any) -> Any:
    if isinstance(value, Mapping):
        message = message_of(value)
        return message if message is not None else {str(k): _read(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_read(v) for v in value]
    return value


def message_of(stored: Mapping[str, Any]) -> BaseMessage | None:
    """One stored message dict as the LangChain message it was; None for a dict that does not
    have a stored message's shape."""
    shape = _SHAPES.get(stored.get("role"))  # type: ignore[arg-type]
    keys = set(stored)
    if shape is None or not shape[0] <= keys <= shape[1]:
        return None
    role, content = stored["role"], stored["content"]
    if role == "assistant":
        if not isinstance(stored["tool_calls"], list):
            return None
        message = action_message(stored)
        if stored.get("name"):
            message.name = str(stored["name"])
        return message
    if role == "tool":
        return ToolMessage(content=stored[BLOCKS] if BLOCKS in stored else _content(content),
                           tool_call_id=str(stored["tool_call_id"]), name=stored.get("name"),
                           status=stored.get("status", "success"))
    kind = HumanMessage if role == "user" else SystemMessage
    return kind(content=_content(content), name=stored.get("name"))


def _content(content: Any) -> Any:
    return "" if content is None else content
