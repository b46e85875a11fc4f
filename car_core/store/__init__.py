"""Where runs and attributions are kept: one SQLite file.

``RunStore`` loads lazily: a recorder that only queues runs (``run_writer``) does not pay for
sqlite-utils until its first write.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Union

from car_core.errors import InvalidInput

if TYPE_CHECKING:
    from car_core.store.journal import StoreJournal
    from car_core.store.rows import Attribution
    from car_core.store.runs import RunStore
    from car_core.store.schema import MIGRATIONS
    from car_core.store.seals import damaged_rows

# Where each name lives, imported on first use (``RunStore`` brings sqlite-utils with it).
_HOMES = {"MIGRATIONS": "schema", "Attribution": "rows", "RunStore": "runs",
          "StoreJournal": "journal", "damaged_rows": "seals"}
__all__ = ["MIGRATIONS", "Attribution", "RunStore", "StoreJournal", "StoreLike", "as_store",
           "damaged_rows"]

# what ``store=`` of the Python API takes: a store, or the path of its SQLite file
StoreLike = Union["RunStore", str, "os.PathLike[str]"]


def as_store(store: StoreLike | None, what: str = "store") -> RunStore | None:
    """``store=`` as a ``RunStore``: one given is used as it is, a path is opened (as
    ``CarCallback(store="car.db")`` takes it; a user who passed the same path to
    ``car.contrastive`` got ``AttributeError: 'str' object has no attribute 'save'`` from
    deep inside the estimate). Anything else is refused before anything runs."""
    if store is None:
        return None
    if isinstance(store, (str, os.PathLike)):
        from car_core.store.runs import RunStore
        return RunStore(store)
    if not callable(getattr(store, "save", None)):
        raise InvalidInput(f"{what}={store!r} is not a run store",
                           hint="pass car.RunStore(path), or the path of the SQLite file")
    return store


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib
        return getattr(importlib.import_module(f"car_core.store.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'car_core.store' has no attribute {name!r}")
