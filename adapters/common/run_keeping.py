"""What every recorder does with a run once it has finished: score it with the user's outcome
and store it, without ever breaking the user's own run over either. A failure is kept in the
recorder's error list and logged (through the redaction rule), and the run stays recorded.

A recorder given a path writes through a ``RunWriter`` (the SQLite write off the run's critical
path, flushed when the run is read back, at ``close()`` and at exit); one given a ``RunStore``
writes to it at once."""

from __future__ import annotations

import os
from typing import Any

import car_core as car
from car_core.contract import RunWriter, redact, scored
from car_core.errors import OutcomeError, StoreError

log = redact.logger(__name__)  # log records pass the redaction rule


def score_run(run: car.Trajectory, outcome: Any, errors: list[OutcomeError]
              ) -> car.Trajectory:
    """``run`` with its outcome (an ``OutcomeFn``, or None for none), scored by the engine's
    rule (``scored``), so the score is the one a replay would give."""
    if outcome is None:
        return run
    try:
        return scored(run, outcome)
    except OutcomeError as exc:
        errors.append(exc)
        log.error("CAR could not score run %s: %s", run.id, exc)
        return run


def open_store(store: Any, errors: list[StoreError]) -> Any:
    """Where a recorder keeps its runs: a ``RunWriter`` for a path (its save errors go to
    ``errors``), the ``RunStore`` (or None) it was given otherwise."""
    if isinstance(store, (str, os.PathLike)):
        return RunWriter(store, errors=errors)
    return store


def store_run(run: car.Trajectory, store: car.RunStore | RunWriter | None,
              errors: list[StoreError]) -> None:
    """Save ``run`` when there is a store; a storage failure is kept in ``errors``."""
    if store is None:
        return
    try:
        store.save(run)
    except StoreError as exc:
        errors.append(exc)
        log.error("CAR could not store run %s: %s", run.id, exc)


def unstored(store: Any, errors: list[StoreError], raised: int) -> StoreError | None:
    """Wait until every run handed to ``store`` is written, then the error a recorder's
    ``flush`` raises for the save errors past the first ``raised`` (those it raised before),
    or None. A run that could not be stored was lost with a log line and nothing else: a
    trial recorded 30 runs on a full disk, stored none, and every flush returned."""
    flush = getattr(store, "flush", None)
    if flush is not None:
        flush()
    if len(errors) <= raised:
        return None
    first, count = errors[raised], len(errors) - raised
    return StoreError(f"{count} run(s) could not be stored: {first}",
                      hint="they are kept in the recorder's runs; once the store can be "
                           "written again, save each with car.RunStore(path).save(run)")


__all__ = ["open_store", "score_run", "store_run", "unstored"]
