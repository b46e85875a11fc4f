"""What a recorded step's ``meta`` says about the LangGraph task that made its model call.

The recorder (``callback``) and the thread importer (``importer``) write these keys, and a
branch's checks and state (``refusals``, ``branch_state``) read them; all take them from here,
so the branching side never imports the recorder to learn what a step was.
"""

from __future__ import annotations

from typing import Any

from car_core.contract import PROMPT_INPUT, Step

PUSH = "__pregel_push"  # LangGraph's task-path tag of a Send task (langgraph._internal._constants)
DEFAULT_GRAPH_NAME = "LangGraph"  # what ``compile()`` names a graph given no ``name=``
NODE_INPUT = "node"  # ``meta["input"]`` of a step whose node built the model's whole input
# ``meta["input"]`` of a step whose model got the system prompt its node prepended
# (``meta["prompt"]``), then the graph's messages (``state``), at a call CAR decides
PROMPT_FIRST = PROMPT_INPUT


def agent_of(ns: str | None, graph: str | None, node: str | None = None) -> str | None:
    """The agent a step belongs to: the innermost subgraph node of its namespace
    (``"account_agent:<task>"`` -> ``account_agent``), else the graph's own name when it was
    given one (``compile(name=...)``, ``create_react_agent(name=...)``), else the node that
    made the call: "decided by LangGraph" would say nothing."""
    if not ns:
        return graph if graph and (graph != DEFAULT_GRAPH_NAME or not node) else node
    return ns.split("|")[-1].split(":")[0]


def is_send_path(path: Any) -> bool:
    """Whether a LangGraph task path is a ``Send`` task's (tagged ``PUSH``)."""
    return isinstance(path, (list, tuple)) and bool(path) and path[0] == PUSH


def is_send_task(meta: Any) -> bool:
    """Whether a step's model call ran in a ``Send`` task (LangGraph's PUSH task path)."""
    return isinstance(meta, dict) and is_send_path(meta.get("task_path"))


def builds_input(step: Step) -> bool:
    """Whether a step's model input was built by its task rather than read from the graph's
    messages channel: a ``Send`` task (from its payload), or a node that wrote the whole
    prompt itself (``SummarizationMiddleware``; older records: no graph message in ``state``,
    the input in ``meta["prompt"]``). Such a step's ``state`` is its whole model input, so the
    checkpoint it was scheduled from does not hold it: a fork there re-runs the node, which
    builds the same input again, and only a change made at the model call reaches it."""
    meta = step.meta
    return (is_send_task(meta) or meta.get("input") == NODE_INPUT
            or (not step.state and bool(meta.get("prompt"))))


def task_key(meta: dict[str, Any]) -> tuple[int, Any]:
    """A step's place among the tasks of its superstep, as LangGraph orders them: ``Send``
    tasks by their index, then node tasks by name."""
    path: list[Any] = list(meta.get("task_path") or ())
    if len(path) > 1 and path[0] == PUSH:
        return (0, int(path[1]) if isinstance(path[1], int) else 0)
    return (1, str(path[1]) if len(path) > 1 else "")


def prompt_first(step: Step) -> bool:
    """Whether a step's model input was its node's system prompt, then the graph's messages,
    at a call CAR decides: ``do_context`` edits both (``car_core``'s ``state_of``), and an
    edited prompt can only reach the model at that call."""
    return step.meta.get("input") == PROMPT_FIRST and isinstance(step.meta.get("prompt"), list)


def split_prompt(messages: list[Any], recorded: int) -> tuple[list[Any], list[Any]]:
    """An edited ``prompt + state`` cut back into the prompt (its leading system messages, at
    most as many as the ``recorded`` prompt had) and the graph's messages."""
    n = 0
    while n < min(recorded, len(messages)) and _role(messages[n]) == "system":
        n += 1
    return messages[:n], messages[n:]


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None
