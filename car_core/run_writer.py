"""``RunWriter``: saves finished runs to a ``RunStore`` on a thread of its own.

A recorder hands a finished run to the writer and returns to the user's code at once; the
SQLite write happens off the run's critical path. A recorder may also defer sealing its runs
(the JSON check, redaction and digests) to the first read of its runs or to a flush: it
registers its hand-over with ``feed``, and every ``flush`` and ``close`` calls it first, so
what a flush promises holds for those runs too.

The durability promise, exactly: a run is in the store once ``flush()`` (or ``close()``) has
returned — each save is its own committed transaction, so a flushed run survives a SIGKILL of
the process that wrote it. Writers flush at ``close()``, when the process exits normally
(``atexit``), and whenever a run is read back through them (``load``). A run finished but not
yet flushed (queued, or waiting to be sealed) is lost if the process is killed first; nothing
already stored is damaged (the write is one transaction or none).
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import StoreError
from .redact import logger
from .trajectory import Trajectory

_STOP = object()
log = logger(__name__)  # log records pass the redaction rule


class RunWriter:
    """A queue in front of ``RunStore(path)``; ``save`` returns before the write. Save errors
    go to ``errors`` (and to ``flush``'s return value), never to the caller of ``save``."""

    def __init__(self, path: str | os.PathLike[str], *,
                 errors: list[StoreError] | None = None) -> None:
        self.path = Path(path)
        self.errors: list[StoreError] = errors if errors is not None else []
        _store(self.path).close()  # a bad path is refused now, in the caller's thread
        self._queue: queue.Queue[Any] = queue.Queue()
        self._closed = False
        self._feeds: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._work, name=f"car-run-writer:{self.path}",
                                        daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def save(self, run: Trajectory) -> str:
        """Queue ``run`` for the store; returns its id at once."""
        if self._closed:
            raise StoreError(f"the run writer for {self.path} is closed",
                             run_id=run.id, hint="save through a new RunWriter or a RunStore")
        self._queue.put(run)
        return run.id

    def feed(self, hand_over: Callable[[], None]) -> None:
        """Call ``hand_over`` (a recorder's: it saves the runs it has finished but not yet
        handed over) at the start of every ``flush`` and ``close``. It is held until the
        writer closes, so runs a recorder deferred are stored even when the recorder itself
        is gone (keep ``hand_over`` free of references to what should not live that long)."""
        self._feeds.append(hand_over)

    def flush(self) -> list[StoreError]:
        """Wait until every run finished so far is committed; the save errors so far."""
        if not self._closed:
            self._hand_over()
            self._queue.join()
        return list(self.errors)

    def _hand_over(self) -> None:
        for hand_over in list(self._feeds):
            hand_over()

    def load(self, run_id: str) -> Trajectory:
        """The stored run, after the queued ones are written."""
        self.flush()
        with _store(self.path, readonly=True) as store:
            run: Trajectory = store.load(run_id)
            return run

    def close(self) -> None:
        """Flush, then stop the writer thread (idempotent)."""
        if self._closed:
            return
        self._hand_over()
        self._queue.put(_STOP)
        self._queue.join()
        self._closed = True
        self._feeds.clear()
        self._thread.join()
        atexit.unregister(self.close)

    def _work(self) -> None:
        store: Any = None
        try:
            while True:
                item = self._queue.get()
                try:
                    if item is _STOP:
                        return
                    if store is None:
                        store = _store(self.path)
                    store.save(item)
                except Exception as exc:  # a writer thread must never die silently
                    err = exc if isinstance(exc, StoreError) else StoreError(
                        f"could not store run {item.id}: {exc!r}", run_id=item.id)
                    self.errors.append(err)
                    log.error("CAR could not store run %s: %s", item.id, err)
                finally:
                    self._queue.task_done()
        finally:
            if store is not None:
                store.close()


def _store(path: Path, readonly: bool = False) -> Any:
    from .store import RunStore  # sqlite-utils loads with the first write, not on import
    return RunStore(path, readonly=readonly)


__all__ = ["RunWriter"]
