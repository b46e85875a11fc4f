"""Checkpoints of a recorded thread, read and copied into a branch thread.

A step's metadata names the checkpoint it was scheduled from at every graph level
(``checkpoint_map``) and the task it ran in (``task_ns``). ``fork`` copies those checkpoints
into a new thread, keeping the pending writes of the parallel tasks the branch holds and
leaving behind those it runs again; ``carried_writes`` decides which. The fork is a coroutine
over ``calls``, so sync and async branches copy the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import BaseMessage

from car_core.contract import Trajectory
from car_core.errors import AdapterError

from .calls import SyncCalls

# LangGraph's pending-write markers (langgraph._internal._constants): a superstep's input, not a
# task's output, and the writes of a task that failed or stopped for input
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"
ERROR, INTERRUPT = "__error__", "__interrupt__"


def thread_config(thread_id: str, checkpoint_id: str | None = None,
                  ns: str | None = "") -> dict[str, Any]:
    """The config of a thread at namespace ``ns`` (None: every namespace, for listing)."""
    conf: dict[str, Any] = {"thread_id": thread_id}
    if ns is not None:
        conf["checkpoint_ns"] = ns
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def join(level: str, node: str) -> str:
    return f"{level}|{node}" if level else node


def recast(ns: str) -> str:
    """A checkpoint namespace without its task ids: ``a:<id>|b:<id>`` -> ``a|b``."""
    return "|".join(part.split(":")[0] for part in ns.split("|")) if ns else ""


def checkpoint_map(meta: Mapping[str, Any]) -> dict[str, str]:
    """The checkpoint of every graph level a step was scheduled from (older records: one)."""
    cmap = meta.get("checkpoint_map")
    if cmap:
        return dict(cmap)
    cid = meta.get("checkpoint_id")
    return {(meta.get("checkpoint_ns") or ""): cid} if cid else {}


def task_at(meta: Mapping[str, Any], level: str) -> str:
    """The namespace of the task at graph level ``level`` that a step ran in: the step's own
    model task at its own level, the subgraph task holding it at a parent level."""
    parts = str(meta.get("task_ns") or "").split("|")
    depth = len(level.split("|")) if level else 0
    return "|".join(parts[:depth + 1])


def task_id(task_ns: str) -> str:
    return task_ns.split("|")[-1].split(":")[-1]


def carried_writes(run: Trajectory, k: int, ns: str, source: Any) -> list[tuple[str, str, Any]]:
    """The pending writes of checkpoint ``source`` (level ``ns``) a fork at step ``k`` keeps:
    those of every task of that superstep except the tasks that hold step ``k`` or a later
    step (those run again). A ``Send`` worker whose step comes before ``k`` is held this way,
    by its recorded writes, never re-run; one whose task did not finish in the record (no
    writes, or an error) cannot be held, and the step is refused."""
    cid = str(source.config["configurable"]["checkpoint_id"])
    hosts = [(j, task_at(s.meta, ns)) for j, s in enumerate(run.steps)
             if str(checkpoint_map(s.meta).get(ns)) == cid]
    if any(not run.steps[j].meta.get("task_ns") for j, _ in hosts):
        return []  # a record that does not name its tasks: none of them is held
    later = {task_id(t) for j, t in hosts if j >= k}
    held = {task_id(t): j for j, t in hosts if j < k and task_id(t) not in later}
    writes = [tuple(w) for w in source.pending_writes or ()
              if w[0] not in later and w[0] != NULL_TASK_ID]
    done = {w[0] for w in writes if w[1] not in (ERROR, INTERRUPT)}
    unfinished = sorted(j for tid, j in held.items() if tid not in done)
    if unfinished:
        raise AdapterError(
            f"step {unfinished[0]} ran in a parallel task of the superstep step {k} belongs "
            f"to (node {run.steps[unfinished[0]].meta.get('node')!r}), and that task did not "
            f"finish in the record, so a fork at step {k} could only hold it by running it "
            "again", run_id=run.id, step=k,
            hint="intervene at an earlier step, or record a run whose parallel tasks all "
                 "finish")
    return writes


def splice(values: list[Any], replaced: set[str], messages: list[Any]) -> list[Any]:
    """A parent level's messages with those of ids ``replaced`` (what the edited step saw)
    replaced by ``messages`` (the edit) where the first of them stood; the rest kept."""
    out: list[Any] = []
    placed = False
    for m in values:
        if getattr(m, "id", None) not in replaced:
            out.append(m)
        elif not placed:
            out.extend(messages)
            placed = True
    return out


async def fork(calls: SyncCalls, messages_key: str, run: Trajectory, k: int, thread_id: str,
               edited: list[BaseMessage] | None) -> None:
    """Copy the checkpoints step ``k`` was scheduled from — one per graph level, so a fork
    inside a subgraph resumes there under its parents as recorded — into ``thread_id``.
    The pending writes of the tasks that hold step ``k`` and later steps are left behind
    (LangGraph would replay them instead of deciding again); those of the other tasks of the
    superstep (``Send`` workers whose steps come earlier) are kept, so LangGraph hands them
    back instead of re-running those tasks. ``edited`` (a ``do_context`` edit of a step that is
    not a ``Send`` task's, whose input is edited at its model call instead) is written into the
    copy of the step's own level directly: the checkpoint keeps its channel versions, so
    exactly the model task that was scheduled runs again (no ``update_state``, whose guess of
    the writing node breaks ``Send``-routed graphs). A step inside a subgraph (a supervisor or
    worker agent) decides from messages its parents hold too, under the same ids: the edit
    replaces them at every level, so what the subgraph hands back, and every later agent
    reading the parent's messages, sees the edited history. ``calls`` reaches the
    checkpointer, sync or async (``car_adapters.langgraph.calls``)."""
    meta = run.steps[k].meta
    source_thread = str(run.meta["thread_id"])
    own = meta.get("checkpoint_ns") or ""
    cmap = checkpoint_map(meta)
    sources = {ns: await calls.get_tuple(thread_config(source_thread, cid, ns))
               for ns, cid in cmap.items()}
    replaced: set[str] = set()
    if edited is not None:
        for m in edited:
            if m.id is None:
                m.id = str(uuid.uuid4())
        replaced = {m.id for m in sources[own].checkpoint["channel_values"].get(
            messages_key) or () if m.id is not None}
    for ns, cid in cmap.items():
        source = sources[ns]
        checkpoint = dict(source.checkpoint)
        values = checkpoint["channel_values"].get(messages_key) or []
        if ns == own and edited is not None:
            checkpoint["channel_values"] = {**checkpoint["channel_values"],
                                            messages_key: edited}
        elif replaced and any(getattr(m, "id", None) in replaced for m in values):
            checkpoint["channel_values"] = {**checkpoint["channel_values"],
                                            messages_key: splice(values, replaced, edited or [])}
        config = await calls.put(thread_config(thread_id, None, ns), checkpoint,
                                 {**source.metadata, "car_fork_of": cid},
                                 dict(checkpoint["channel_versions"]))
        by_task: dict[str, list[tuple[str, Any]]] = {}
        for tid, channel, value in carried_writes(run, k, ns, source):
            by_task.setdefault(tid, []).append((channel, value))
        for tid, task_writes in by_task.items():
            await calls.put_writes(config, task_writes, tid)
