"""The checkpointer branches run on: the app's own, or, for an app compiled without one, an
``InMemorySaver`` CAR supplies on a copy of the app.

A branch is a thread of the app, so it needs a checkpointer even where the recorded run had
none. The user's app object is never changed: CAR branches on ``app.copy()`` with its own
saver, the same nodes, edges and channels (so the same fingerprint). A run recorded without a
checkpointer has no checkpoint anywhere, so its fork points are rebuilt from the record
(``rebuild``), as for a run whose ``InMemorySaver`` died with the recording process.

An app with async-only nodes or tools runs only under ``ainvoke``, which a sync-only
checkpointer (``SqliteSaver``, the sync ``PostgresSaver``) cannot serve: such an agent is
refused before any branch (``refuse_sync_only``), not by every branch it would start.
"""

from __future__ import annotations

import dis
import inspect
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver

from car_core.errors import AdapterError


class SuppliedSaver(InMemorySaver):
    """The ``InMemorySaver`` CAR gives a copy of an app compiled without a checkpointer: it
    holds only the threads CAR writes (branches, runs it starts), never a recorded one."""


def branchable(app: Any) -> tuple[Any, Any]:
    """The app branches run on and its checkpointer: ``app`` itself when it was compiled with
    one, else a copy of it on a new ``SuppliedSaver``."""
    saver = getattr(app, "checkpointer", None)
    if saver is not None and saver is not False:
        if saver is True:  # a root graph that only a parent could lend a checkpointer
            raise AdapterError("the app was compiled with checkpointer=True, which only a "
                               "subgraph can use", hint="compile it with a checkpointer "
                               "(SqliteSaver(conn)) or none")
        return app, saver
    if not callable(getattr(app, "copy", None)) or not isinstance(
            getattr(app, "channels", None), dict):
        raise AdapterError(f"the app ({type(app).__name__}) was compiled without a "
                           "checkpointer and CAR cannot copy it to branch on one of its own",
                           hint="compile it with checkpointer=SqliteSaver(conn) or "
                                "InMemorySaver()")
    supplied = SuppliedSaver()
    # Pregel's constructor writes its task channel into the channels mapping it is given: a
    # mapping of its own keeps the user's app untouched
    copy = app.copy(update={"checkpointer": supplied, "channels": dict(app.channels)})
    # copy() passes attributes to the constructor, which drops the compiled serde allowlist
    copy._serde_allowlist = getattr(app, "_serde_allowlist", None)
    return copy, supplied


def supplied(saver: Any) -> bool:
    """Whether ``saver`` is the one CAR gave an app compiled without a checkpointer."""
    return isinstance(saver, SuppliedSaver)


def sync_only(saver: Any) -> bool:
    """Whether ``saver`` has no working coroutine methods: its ``aget_tuple`` can only raise
    ``NotImplementedError`` (``BaseCheckpointSaver``'s, which the sync ``PostgresSaver`` keeps,
    or ``SqliteSaver``'s override). Read from the method's code, never called: a call is a read
    of the checkpointer, and an async one's coroutine belongs to its own event loop."""
    method = getattr(type(saver), "aget_tuple", None)
    code = getattr(inspect.unwrap(method), "__code__", None) if callable(method) else None
    if code is None:  # no such method, or not Python code: assume it works
        return False
    returns = any(i.opname.startswith("RETURN_") and i.opname != "RETURN_GENERATOR"
                  for i in dis.get_instructions(code))
    return "NotImplementedError" in code.co_names and not returns


def refuse_sync_only(saver: Any, async_only: tuple[str, ...], run_id: str | None = None
                     ) -> None:
    """Refuse an app whose ``async_only`` nodes or tools (``AppShape.async_only``) need
    ``ainvoke`` on a checkpointer that has no coroutine methods: every branch would fail in
    LangGraph's first checkpoint read."""
    if not async_only or not sync_only(saver):
        return
    name = type(saver).__name__
    twin = ("AsyncSqliteSaver (langgraph.checkpoint.sqlite.aio)" if "Sqlite" in name else
            "AsyncPostgresSaver (langgraph.checkpoint.postgres.aio)" if "Postgres" in name else
            "its async twin")
    raise AdapterError(
        f"the app has async nodes or tools ({', '.join(async_only)}) but its checkpointer "
        f"{name} is sync-only: LangGraph can run such an app only with ainvoke, which "
        f"{name} cannot serve, so no branch runs", run_id=run_id,
        hint=f"compile the app CAR attributes with {twin} over the same database: in a "
             "factory `car attribute --agent` calls (no event loop of yours), open it with "
             "car_adapters.langgraph.open_in_background(...); inside your own async code, "
             "open it there and call CAR from a worker thread (await asyncio.to_thread("
             "car.contrastive, run, agent, ...)); or make those nodes plain def functions")
