"""Attribution leases: one estimate at a time may run an attribution.

A lease is a row in ``attribution_leases``, claimed in a write transaction, owned by that
claim (a fresh owner token each time), and freed when the attribution finishes, is released,
its store closes or its process is gone. Within a process the live claims are in ``_LIVE``, so
a second thread or connection of the same process is refused like another process.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
import weakref

from car_core.errors import AttributionBusy
from car_core.store._deps import sqlite_utils

# The lease owners this process holds now (one per claim, across every RunStore of the process).
_LIVE: set[str] = set()
_LIVE_LOCK = threading.RLock()  # reentrant: a store finalized by GC inside a locked block


def _alive(owner: str, host: str | None, pid: int | None) -> bool:
    """Whether a lease's claim may still run: in this process, whether the claim is live
    (``_LIVE``: taken and not yet finished, released or closed); on this host, whether the pid
    exists; on another host we cannot tell, so it counts as alive."""
    if host != socket.gethostname():
        return True
    if not isinstance(pid, int):
        return False
    if pid == os.getpid():
        with _LIVE_LOCK:
            return owner in _LIVE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_now(db: sqlite_utils.Database, attribution_id: str) -> bool:
    """Whether a live claim holds the attribution's lease: its estimate may be running now. An
    attribution stored as running with no live claim was stopped (a Ctrl-C, a crash) and waits
    for a resume."""
    holder = db.execute("SELECT owner, host, pid FROM attribution_leases WHERE "
                        "attribution_id = ?", [attribution_id]).fetchone()
    return holder is not None and _alive(holder[0], holder[1], holder[2])


def _drop_live(owners: dict[str, str]) -> None:
    with _LIVE_LOCK:
        _LIVE.difference_update(owners.values())


class Leases:
    """The leases one store holds: attribution id -> owner token of its live claim. Dropped
    unreleased (the store garbage-collected without ``close``), they stop being live."""

    def __init__(self) -> None:
        self._owners: dict[str, str] = {}
        weakref.finalize(self, _drop_live, self._owners)

    def __contains__(self, attribution_id: str) -> bool:
        return attribution_id in self._owners

    def held(self) -> list[str]:
        return list(self._owners)

    def claim(self, db: sqlite_utils.Database, attribution_id: str) -> None:
        """Take the lease of ``attribution_id`` inside the caller's write transaction, or
        raise ``AttributionBusy`` naming the live claim that holds it."""
        holder = db.execute("SELECT owner, host, pid FROM attribution_leases WHERE "
                            "attribution_id = ?", [attribution_id]).fetchone()
        if holder is not None and _alive(holder[0], holder[1], holder[2]):
            where = ("this process (another thread or store connection)"
                     if holder[2] == os.getpid() and holder[1] == socket.gethostname()
                     else f"process {holder[2]} on {holder[1]}")
            raise AttributionBusy(f"attribution {attribution_id} is being run by {where}",
                                  hint="wait for it to finish, then resume it if it stopped "
                                       "early")
        owner = uuid.uuid4().hex  # one per claim: this store's own live claim is in the way too
        with _LIVE_LOCK:  # live before the row is visible, so no other claim reads it as stale
            _LIVE.add(owner)
        self._owners[attribution_id] = owner
        db.execute("INSERT OR REPLACE INTO attribution_leases (attribution_id, owner, "
                   "host, pid, acquired_at) VALUES (?, ?, ?, ?, ?)",
                   [attribution_id, owner, socket.gethostname(), os.getpid(), time.time()])

    def forget(self, attribution_id: str) -> str | None:
        """Drop this store's claim on ``attribution_id`` from the live set; its owner token,
        if it held one."""
        owner = self._owners.pop(attribution_id, None)
        if owner is not None:
            with _LIVE_LOCK:
                _LIVE.discard(owner)
        return owner

    def free(self, db: sqlite_utils.Database, attribution_id: str) -> None:
        """Forget the claim and delete its row, inside the caller's write transaction."""
        owner = self.forget(attribution_id)
        if owner is not None:
            drop_lease_row(db, attribution_id, owner)


def drop_lease_row(db: sqlite_utils.Database, attribution_id: str, owner: str) -> None:
    """Delete the lease row of ``attribution_id`` if ``owner``'s claim still holds it (a
    stale claim taken over by another process is that process's to free)."""
    db.execute("DELETE FROM attribution_leases WHERE attribution_id = ? AND owner = ?",
               [attribution_id, owner])


__all__ = ["Leases", "drop_lease_row"]
