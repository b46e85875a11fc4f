"""Fork points rebuilt from the record, for a run whose thread the agent's checkpointer does not
hold (an ``InMemorySaver`` of the process that recorded it, gone with that process, or none: the
app was compiled without a checkpointer, and branches run on one CAR supplies, ``saver``).

A step's fork point is the graph state its model task was scheduled from. Where the record
holds all of that state — a model node of the top-level graph whose state is its messages
channel, which the step stores as ``state`` — a branch writes those messages into its own fresh
thread with ``update_state`` as the node that schedules the step's node (``START`` where it
does, else a node with an edge to it), so LangGraph's next task is the step's model node, and
runs on from there as a fork of the recorded checkpoint would. Messages the run's final state
still holds unchanged are taken from there, as the app kept them (content blocks, the agent's
name on its messages).

``plan_rebuild`` checks every step once, before the first branch, by building its fork point in
a scratch thread and comparing it with the record. Where the record does not hold the state a
step was scheduled from it refuses the run with ``CheckpointsMissing``, naming what is missing:
a step inside a subgraph (its parents' state), a ``Send`` task or a node that built its model's
input itself (the payload and the scheduling checkpoint), a state key besides the messages that
the run wrote (the record keeps only its final value) or that the graph does not output (the
record never saw it), a reducer that does not give back the recorded messages, or a graph where
no node schedules the step's node from the messages alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.channels.ephemeral_value import EphemeralValue
from langgraph.constants import START

from car_core.contract import Trajectory
from car_core.errors import CheckpointsMissing

from .calls import SyncCalls, now
from .checkpoints import checkpoint_map, thread_config
from .final import final_state
from .messages import from_dicts, to_dict, to_dicts
from .saver import supplied
from .shape import AppShape
from .step_meta import builds_input, is_send_task

PERSIST = ("build the agent on the same app (the same checkpointer object) that recorded "
           "the run, or record on a checkpointer another process can read (SqliteSaver, "
           "PostgresSaver) and build the agent on it")
RECOMPILE = ("compile the app with a checkpointer another process can read (SqliteSaver, "
             "PostgresSaver), record the run again and build the agent on it")


@dataclass(frozen=True)
class Rebuild:
    """How a run's fork points are rebuilt: for each step, the node its messages are written
    as (so the step's node is the thread's next task)."""

    as_node: dict[int, str]


def plan_rebuild(shape: AppShape, run: Trajectory) -> Rebuild:
    """The way to rebuild every step's fork point of ``run`` from its record, each checked in a
    scratch thread, or ``CheckpointsMissing`` naming what the record lacks."""
    why, hint = _why_missing(shape, run.meta.get("thread_id"))

    def refuse(what: str, step: int | None = None) -> CheckpointsMissing:
        return CheckpointsMissing(f"{why}, and the record cannot rebuild where a branch "
                                  f"starts: {what}", run_id=run.id, step=step, hint=hint)

    builder = getattr(shape.app, "builder", None)
    channels: Mapping[str, Any] = getattr(builder, "channels", None) or {}
    if shape.messages_key not in channels:
        raise refuse(f"the app is not a StateGraph with a {shape.messages_key!r} channel")
    for key in _unrecorded_keys(shape, run, channels):
        raise refuse(key)
    plan: dict[int, str] = {}
    for k, step in enumerate(run.steps):
        node, ns = step.meta.get("node"), step.meta.get("checkpoint_ns") or ""
        if ns or len(checkpoint_map(step.meta)) > 1:
            raise refuse(f"step {k} was decided inside subgraph {ns.split(':')[0]!r} (node "
                         f"{node!r}), whose parent graphs' state the record does not hold", k)
        if builds_input(step):
            kind = ("ran in a Send task, whose payload and scheduling checkpoint"
                    if is_send_task(step.meta) else
                    "is a model call whose input its node built itself (a summarizer), "
                    "whose scheduling checkpoint")
            raise refuse(f"step {k} (node {node!r}) {kind} the record does not hold", k)
        found = next((n for n in _writers(builder, str(node))
                      if _rebuilds(shape, run, k, n)), None)
        if found is None:
            raise refuse(f"no node of the graph schedules node {node!r} from the recorded "
                         f"messages alone with the messages step {k} decided from (a reducer "
                         "that does not give them back, or a route through other nodes)", k)
        plan[k] = found
    return Rebuild(plan)


async def rebuild(calls: SyncCalls, shape: AppShape, run: Trajectory, k: int, thread_id: str,
                  as_node: str, edited: list[BaseMessage] | None) -> None:
    """Write step ``k``'s fork point into the fresh thread ``thread_id``: the messages it
    decided from (``edited``, a ``do_context`` edit, in their place) as ``as_node``."""
    messages = edited if edited is not None else recorded_messages(run, k)
    await calls.update_state(thread_config(thread_id), {shape.messages_key: messages},
                             as_node=as_node)


def recorded_messages(run: Trajectory, k: int) -> list[BaseMessage]:
    """The messages step ``k`` decided from, as LangChain messages: those the final state
    still holds unchanged at the same place as the app kept them, the others from the step."""
    state = run.steps[k].state
    kept = final_state(run).get("messages")
    kept = kept if isinstance(kept, list) else []
    out: list[BaseMessage] = []
    for i, m in enumerate(state):
        same = i < len(kept) and isinstance(kept[i], BaseMessage) and to_dict(kept[i]) == m
        out.append(kept[i] if same else from_dicts([m])[0])
    return out


def _why_missing(shape: AppShape, thread_id: Any) -> tuple[str, str]:
    """Why no checkpoint of the run can be read, and what to do about it."""
    if thread_id is None:
        return ("the run was recorded from an app compiled without a checkpointer, so no "
                "checkpoint of it exists", RECOMPILE)
    if supplied(shape.saver):
        return (f"this app was compiled without a checkpointer, so it does not hold thread "
                f"{thread_id!r}", PERSIST)
    return (f"this app's checkpointer does not hold thread {thread_id!r} (an InMemorySaver "
            "keeps its threads only in the saver object that recorded them: a new app built "
            "with a new InMemorySaver, even in the same process, holds none)", PERSIST)


def _unrecorded_keys(shape: AppShape, run: Trajectory, channels: Mapping[str, Any]
                     ) -> list[str]:
    """The state keys besides the messages whose value at a step the record does not hold:
    one the graph does not output (the record never saw it), or one the run wrote (the record
    keeps only its final value). Ephemeral keys (``create_agent``'s ``jump_to``) hold nothing
    between supersteps."""
    outputs = shape.app.output_channels
    outputs = {outputs} if isinstance(outputs, str) else set(outputs)
    final = run.meta.get("final_state")
    final = final if isinstance(final, Mapping) else {}
    out = []
    for key, channel in channels.items():
        if key == shape.messages_key or isinstance(channel, EphemeralValue):
            continue
        if key not in outputs:
            out.append(f"state key {key!r} is not in the graph's output, so the record never "
                       "saw its value")
        elif final.get(key) is not None:
            out.append(f"the run wrote state key {key!r}, and the record keeps only its final "
                       "value, not its value at each step")
    return out


def _writers(builder: Any, node: str) -> list[str]:
    """The nodes an update can be written as so that ``node`` runs next: ``START``, then the
    nodes with an edge or a route to it, in a fixed order."""
    edges = {a for a, b in getattr(builder, "edges", ()) if b == node}
    routes = {a for a, specs in (getattr(builder, "branches", None) or {}).items()
              for spec in specs.values() if spec.ends is None or node in spec.ends.values()}
    return [START, *sorted((edges | routes) - {START})]


def _rebuilds(shape: AppShape, run: Trajectory, k: int, as_node: str) -> bool:
    """Whether writing step ``k``'s messages as ``as_node`` into a scratch thread gives a
    thread whose next task is the step's node, holding exactly the recorded messages."""
    calls = SyncCalls(shape.app, shape.saver)
    thread_id = f"car-rebuild-{uuid.uuid4().hex}"
    try:
        now(rebuild(calls, shape, run, k, thread_id, as_node, None))
        snap = shape.app.get_state(thread_config(thread_id))
        values = snap.values.get(shape.messages_key) or []
        return (tuple(snap.next) == (run.steps[k].meta.get("node"),)
                and to_dicts(values) == run.steps[k].state)
    except Exception:  # noqa: BLE001 - any failure to write as this node: not a way to rebuild
        return False
    finally:
        shape.saver.delete_thread(thread_id)
