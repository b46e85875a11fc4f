"""Where runs and attributions are kept: one SQLite file.

``RunStore`` loads lazily: a recorder that only queues runs (``run_writer``) does not pay for
sqlite-utils until its first write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from car_core.store.journal import StoreJournal
    from car_core.store.rows import Attribution
    from car_core.store.runs import RunStore
    from car_core.store.schema import MIGRATIONS
    from car_core.store.seals import damaged_rows

# Where each name lives, imported on first use (``RunStore`` brings sqlite-utils with it).
_HOMES = {"MIGRATIONS": "schema", "Attribution": "rows", "RunStore": "runs",
          "StoreJournal": "journal", "damaged_rows": "seals"}
__all__ = ["MIGRATIONS", "Attribution", "RunStore", "StoreJournal", "damaged_rows"]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib
        return getattr(importlib.import_module(f"car_core.store.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'car_core.store' has no attribute {name!r}")
