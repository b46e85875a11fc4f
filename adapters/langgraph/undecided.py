"""Chat-model calls CAR does not decide, refused by name.

When CAR decides an app's model calls (``CarChatModel`` or ``CarMiddleware``), it numbers them:
held steps, forced actions and per-step seeds go to the call with that number. A model call it
never sees (a ``SummarizationMiddleware`` whose model is not wrapped, a node calling another
model) is still recorded as a step, so on a branch every later decision would land one number
off: a held step would hold a live decision and a forced action would land late. So such calls
are refused: up front from the graph (a node that reaches an unwrapped model and can call it),
before the first branch from the record (a recorded step CAR did not decide), and at the call
itself on a branch (``UndecidedCalls``, a callback: callbacks see every chat-model call).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler

from car_core.contract import Trajectory
from car_core.errors import AdapterError

from .model import decided_by_car
from .reach import Reach, model_name

_HINT = ("wrap that model too — CarChatModel(inner=model), e.g. SummarizationMiddleware("
         "model=CarChatModel(inner=summarizer)) — or build LangGraphAgent without model= "
         "(do_resample works at every step without it, a summarizer's too; do_context and "
         "do_observation at the steps that decide from the graph's messages)")


def _fires(reached: Reach) -> bool:
    """Whether a node's middleware can call its model: a summarizer with no trigger never
    does (``SummarizationMiddleware(trigger=None)``); anything else may."""
    return not reached.middleware or any(getattr(m, "trigger", True) is not None
                                         for m in reached.middleware)


def undecided_nodes(reaches: Mapping[tuple[str, str], Reach]) -> list[tuple[str, str, str]]:
    """``(node, model, why)`` for each node that can call a chat model CAR does not decide: it
    reaches an unwrapped model and no CAR wrapper, and, for middleware, is configured to fire."""
    out = []
    for (ns, node), r in sorted(reaches.items()):
        if r.models and not r.wrapped and _fires(r):
            where = f"node {node!r}" + (f" of subgraph {ns!r}" if ns else "")
            why = "; ".join(f"{type(m).__name__} configured to fire (trigger="
                            f"{getattr(m, 'trigger', None)!r})" for m in r.middleware)
            out.append((where, model_name(r.models[0]), why))
    return out


def refuse_undecided(run: Trajectory, nodes: list[tuple[str, str, str]]) -> None:
    """Refuse, before any branch, a graph node or a recorded step whose model CAR does not
    decide."""
    if nodes:
        where, model, why = nodes[0]
        raise AdapterError(
            f"{where} can call chat model {model}, which CAR does not decide"
            + (f" ({why})" if why else "") + ": on a branch its calls would shift the steps "
            "CAR holds, forces and seeds", run_id=run.id, hint=_HINT)
    for i, step in enumerate(run.steps):
        if step.meta.get("car_decided") is False:
            raise AdapterError(
                f"step {i} is a call of chat model {step.meta.get('model')!r} in node "
                f"{step.meta.get('node')!r} that CAR did not decide: on a branch it would shift "
                "the steps CAR holds, forces and seeds", run_id=run.id, step=i, hint=_HINT)


class UndecidedCalls(BaseCallbackHandler):
    """On a branch where CAR decides the model calls, stops the branch at the first chat-model
    call CAR does not decide, naming its model and node."""

    raise_error = True
    run_inline = True

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def on_chat_model_start(self, serialized: Any, messages: Any, *,
                            metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        params = kwargs.get("invocation_params") or {}
        if decided_by_car(params):
            return
        name = (params.get("model_name") or params.get("model") or params.get("_type")
                or (serialized or {}).get("name"))
        node = (metadata or {}).get("langgraph_node")
        raise AdapterError(
            f"a branch called chat model {name!r} in node {node!r}, which CAR does not decide: "
            "its step would shift the steps CAR holds, forces and seeds, so the branch is "
            "stopped", run_id=self.run_id, hint=_HINT)
