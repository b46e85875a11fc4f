"""The checkpointer branches run on: the app's own, or, for an app compiled without one, an
``InMemorySaver`` CAR supplies on a copy of the app.

A branch is a thread of the app, so it needs a checkpointer even where the recorded run had
none. The user's app object is never changed: CAR branches on ``app.copy()`` with its own
saver, the same nodes, edges and channels (so the same fingerprint). A run recorded without a
checkpointer has no checkpoint anywhere, so its fork points are rebuilt from the record
(``rebuild``), as for a run whose ``InMemorySaver`` died with the recording process.
"""

from __future__ import annotations

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
