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
from car_core.errors import AdapterError, InvalidInput

from .checkpoints import join, recast, thread_config
from .fingerprint import app_digest
from .invocation import imported
from .messages import decode, jsonable, state_json, to_dicts, usage_of
from .shape import AppShape
from .step_meta import agent_of


def import_thread(shape: AppShape, thread_id: str, agent: str,
                  turn: int | None = None) -> Trajectory:
    """The trajectory of thread ``thread_id`` (``agent``: the name it is recorded under).
    Messages a subgraph node passes up to its parent, and messages written by tool nodes, by
    the framework (handoff notices) or by a node that calls no model (``_model_wrote``), are
    not decisions. A thread invoked several times (a conversation) is imported one turn (one
    invocation) at a time, as the callback records it: ``turn`` (``-1``: the last) picks it,
    and a thread of several turns without one is refused (``_turns``)."""
    key, app = shape.messages_key, shape.app
    namespaces = sorted({t.config["configurable"].get("checkpoint_ns") or ""
                         for t in shape.saver.list(thread_config(thread_id, None, None))})
    if "" not in namespaces:
        raise AdapterError(f"no thread {thread_id!r} in this app's checkpointer",
                           hint="check the thread id and that the app uses the same "
                                "checkpointer (database file) the run was recorded with")
    found: list[tuple[str, int, Step]] = []
    root = _chain(app, thread_id, "")
    lo, hi, end = _turns(root, thread_id, turn)
    head_next, final = tuple(end.next), end.values
    for ns in namespaces:
        level = recast(ns)
        if level not in shape.graphs:
            raise AdapterError(f"thread {thread_id!r} has checkpoints of subgraph {level!r}"
                               ", which this app does not expose as a subgraph",
                               hint="import with the app the thread was recorded with")
        chain = root if ns == "" else _chain(app, thread_id, ns)
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
    found = [f for f in found if lo <= f[0] and (hi is None or f[0] < hi)]
    steps = [replace(s, index=i) for i, (_, _, s) in enumerate(found)]
    context = {"messages": steps[0].state} if steps else {"input": None}
    return Trajectory.new(context=context, steps=steps, agent=agent,
                          status=RunStatus.INTERRUPTED if head_next else RunStatus.COMPLETE,
                          meta={"framework": "langgraph", "thread_id": thread_id,
                                "final_state": state_json(final), "imported": True,
                                "agent_fingerprint": app_digest(app),
                                "invocation": imported(getattr(end, "metadata", None))})


def _turns(root: list[Any], thread_id: str, turn: int | None) -> tuple[str, str | None, Any]:
    """The turn ``turn`` of a thread whose top-level checkpoints are ``root``: the id of the
    checkpoint its input was written at, that of the next turn's (None for the last) and its
    last checkpoint. Each invocation of the app writes its input as a checkpoint of source
    ``"input"``. A branch of a conversation imported whole ended with the turn it started in,
    never sending the later user messages: a user trial's branches of turn 1 never reached
    turn 2's refund and were scored as rescues (the whole-thread import had been documented).
    So a thread of several turns is refused unless ``turn`` says which one to import."""
    starts = [i for i, snap in enumerate(root) if snap.metadata.get("source") == "input"]
    if not starts:
        starts = [0]
    if turn is None:
        if len(starts) > 1:
            raise AdapterError(
                f"thread {thread_id!r} holds {len(starts)} turns (the app was invoked "
                f"{len(starts)} times on it); a branch of one ends with that turn and never "
                "sends the later turns' messages, so the thread cannot be attributed as one "
                "run", hint="import one turn: import_thread(thread_id, turn=-1) (the last; "
                            "attribute_thread takes turn= too), as CarCallback records each "
                            "invocation; what an earlier turn left in the conversation is "
                            "held as its state")
        turn = 0
    if isinstance(turn, bool) or not isinstance(turn, int) or not -len(starts) <= turn < len(
            starts):
        raise InvalidInput(f"turn={turn!r}, but thread {thread_id!r} holds {len(starts)} "
                           "turn(s)", hint=f"pass an index from 0 to {len(starts) - 1}, or -1 "
                                           "for the last")
    k = turn % len(starts)
    lo = root[starts[k]].config["configurable"]["checkpoint_id"]
    if k + 1 < len(starts):
        nxt = starts[k + 1]
        return lo, root[nxt].config["configurable"]["checkpoint_id"], root[nxt - 1]
    return lo, None, root[-1]


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
