"""``RunWriter``: saves finished runs to a ``RunStore`` on a thread of its own.

A recorder hands a finished run to the writer and returns to the user's code at once; the
SQLite write happens off the run's critical path. A recorder may also hand over the sealing of
its runs (the JSON check, redaction and digests): ``later(task)`` runs ``task`` on the writer's
thread in queue order, and the runs it saves are written before any flush that began after
the task was queued returns, so what a flush promises holds for those runs too.

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

from car_core.errors import StoreError
from car_core.model.trajectory import Trajectory
from car_core.secrets.redact import logger

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

    def later(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the writer's thread, after what is queued now (a recorder's: it
        seals the runs it finished and ``save``s them). A flush waits for it and for what it
        saves; an error it raises is logged and kept in ``errors``."""
        if self._closed:
            raise StoreError(f"the run writer for {self.path} is closed",
                             hint="save through a new RunWriter or a RunStore")
        self._queue.put(_Task(task))

    def flush(self) -> list[StoreError]:
        """Wait until every run handed over so far is committed; the save errors so far."""
        if not self._closed:
            self._queue.join()
        return list(self.errors)

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
        self._queue.put(_STOP)
        self._queue.join()
        self._closed = True
        self._thread.join()
        atexit.unregister(self.close)

    def _work(self) -> None:
        store: Any = None
        try:
            while True:
                item = self._queue.get()
                try:
                    if item is _STOP:
                        if self._queue.empty():
                            return
                        self._queue.put(_STOP)  # a task saved runs after the stop: first those
                        continue
                    if isinstance(item, _Task):
                        item.task()
                        continue
                    if store is None:
                        store = _store(self.path)
                    store.save(item)
                except Exception as exc:  # a writer thread must never die silently
                    run_id = getattr(item, "id", None)
                    err = exc if isinstance(exc, StoreError) else StoreError(
                        f"could not store run {run_id or '(a handed-over task)'}: {exc!r}",
                        run_id=run_id)
                    self.errors.append(err)
                    log.error("CAR could not store run %s: %s", run_id, err)
                finally:
                    self._queue.task_done()
        finally:
            if store is not None:
                store.close()


class _Task:
    """A callable the writer's thread runs in queue order (not a run to save)."""

    def __init__(self, task: Callable[[], None]) -> None:
        self.task = task


def _store(path: Path, readonly: bool = False) -> Any:
    from car_core.store.runs import (
        RunStore,  # sqlite-utils loads with the first write, not on import
    )
    return RunStore(path, readonly=readonly)


__all__ = ["RunWriter"]
