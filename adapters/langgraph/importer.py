"""An existing thread's trajectory, rebuilt from its checkpoint history in every namespace.

Each ``AIMessage`` a model node wrote is a step, decided from the checkpoint before it, with the
metadata the callback would have recorded (checkpoints per level, task), so a branch forks an
imported run exactly as a recorded one.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from langchain_core.messages import AIMessage

from car_core.contract import Origin, RunStatus, Step, Trajectory
from car_core.errors import AdapterError

from .checkpoints import join, recast, thread_config
from .fingerprint import app_digest
from .messages import decode, jsonable, state_json, to_dicts, usage_of
from .shape import AppShape
from .step_meta import agent_of


def import_thread(shape: AppShape, thread_id: str, agent: str) -> Trajectory:
    """The trajectory of thread ``thread_id`` (``agent``: the name it is recorded under).
    Messages a subgraph node passes up to its parent, and messages written by tool nodes, by
    the framework (handoff notices) or by a node that calls no model (``_model_wrote``), are
    not decisions. A thread invoked several times (a conversation) gives one trajectory over
    all turns; the callback gives one per invocation."""
    key, app = shape.messages_key, shape.app
    namespaces = sorted({t.config["configurable"].get("checkpoint_ns") or ""
                         for t in shape.saver.list(thread_config(thread_id, None, None))})
    if "" not in namespaces:
        raise AdapterError(f"no thread {thread_id!r} in this app's checkpointer",
                           hint="check the thread id and that the app uses the same "
                                "checkpointer (database file) the run was recorded with")
    found: list[tuple[str, int, Step]] = []
    head_next: tuple[str, ...] = ()
    final: dict[str, Any] = {}
    for ns in namespaces:
        level = recast(ns)
        if level not in shape.graphs:
            raise AdapterError(f"thread {thread_id!r} has checkpoints of subgraph {level!r}"
                               ", which this app does not expose as a subgraph",
                               hint="import with the app the thread was recorded with")
        chain = _chain(app, thread_id, ns)
        if ns == "":
            head_next, final = tuple(chain[-1].next), chain[-1].values
        decisions: dict[str, tuple[str, dict[str, Any], list[dict[str, Any]]]] = {}
        for prev, cur in zip(chain, chain[1:], strict=False):
            nodes = [n for n in prev.next if shape.runs_model(level, n) and n != "__start__"]
            if cur.metadata.get("source") != "loop" or not nodes:
                continue
            before = prev.values.get(key) or []
            seen = {m.id for m in before}
            if len(nodes) > 1:
                if any(isinstance(m, AIMessage) and m.id not in seen
                       and not _framework_written(m) for m in cur.values.get(key) or []):
                    raise AdapterError(
                        f"thread {thread_id!r} has a superstep whose parallel tasks "
                        f"(nodes {sorted(set(nodes))}: a Send fan-out or parallel model "
                        "nodes) wrote model messages; its checkpoints do not say which task "
                        "decided which message", hint="record the app with CarCallback, "
                        "which keeps each model call's task")
                continue
            cid = prev.config["configurable"]["checkpoint_id"]
            parents = dict(prev.metadata.get("parents") or {})
            task = next((t for t in prev.tasks if t.name == nodes[0]), None)
            seen_dicts: list[dict[str, Any]] | None = None  # what they decided from
            for m in cur.values.get(key) or []:
                if (isinstance(m, AIMessage) and m.id is not None and m.id not in seen
                        and not _framework_written(m)
                        and _model_wrote(shape, level, nodes[0], m)):
                    seen_dicts = to_dicts(before) if seen_dicts is None else seen_dicts
                    decisions[m.id] = (cur.config["configurable"]["checkpoint_id"], {
                        "origin": Origin.RECORD, "thread_id": thread_id, "checkpoint_id": cid,
                        "checkpoint_ns": ns, "checkpoint_map": {**parents, ns: cid},
                        "ns": ns, "agent": agent_of(ns, app.get_name(), nodes[0]),
                        "node": nodes[0], "langgraph_step": cur.metadata.get("step"),
                        "task_ns": (f"{join(ns, nodes[0])}:{task.id}" if task is not None
                                    else None),
                        "task_path": jsonable(list(task.path)) if task is not None else None,
                        "model": (m.response_metadata or {}).get("model_name"),
                        "usage": usage_of(m)}, seen_dicts)
        messages = chain[-1].values.get(key) or []
        for pos, action, obs, observed in decode(messages, decisions):
            order, meta, state = decisions[messages[pos].id]
            found.append((order, pos, Step(index=0, action=action, observation=obs,
                                           observed=observed, state=state, meta=meta)))
    found.sort(key=lambda f: (f[0], f[1]))  # checkpoint ids are time-ordered (uuid6)
    steps = [replace(s, index=i) for i, (_, _, s) in enumerate(found)]
    context = {"messages": steps[0].state} if steps else {"input": None}
    return Trajectory.new(context=context, steps=steps, agent=agent,
                          status=RunStatus.INTERRUPTED if head_next else RunStatus.COMPLETE,
                          meta={"framework": "langgraph", "thread_id": thread_id,
                                "final_state": state_json(final), "imported": True,
                                "agent_fingerprint": app_digest(app)})


def _framework_written(message: Any) -> bool:
    """A message the framework wrote, not a model (langgraph-supervisor's handoff notices)."""
    return any(str(k).startswith("__is_handoff") for k in (message.response_metadata or {}))


def _model_wrote(shape: AppShape, level: str, node: str, message: Any) -> bool:
    """Whether ``message`` (an ``AIMessage`` node ``node`` wrote) is a model decision, as the
    callback would have recorded it: a node that reaches no chat model and a message under a
    plain uuid (the id ``add_messages`` gives a message written without one; a chat model's
    output carries its run id or the provider's) is a node's own message."""
    reached = shape.reaches.get((level, node))
    if reached is None or reached.calls_a_model:
        return True
    try:
        return str(uuid.UUID(str(message.id))) != str(message.id)
    except ValueError:
        return True


def _chain(app: Any, thread_id: str, ns: str) -> list[Any]:
    """The checkpoints of one namespace from its first to its head, following parents (so
    earlier forks are skipped)."""
    history = list(app.get_state_history(thread_config(thread_id, None, ns)))
    by_id = {h.config["configurable"]["checkpoint_id"]: h for h in history}
    chain, snap = [], history[0] if history else None
    while snap is not None:
        chain.append(snap)
        parent = (snap.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        snap = by_id.get(parent) if parent else None
    chain.reverse()
    return chain
