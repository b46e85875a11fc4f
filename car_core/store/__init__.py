"""Where runs and attributions are kept: one SQLite file.

``RunStore`` loads lazily: a recorder that only queues runs (``run_writer``) does not pay for
sqlite-utils until its first write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from car_core.store.runs import MIGRATIONS, Attribution, RunStore, StoreJournal, damaged_rows

__all__ = ["MIGRATIONS", "Attribution", "RunStore", "StoreJournal", "damaged_rows"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from car_core.store import runs
        return getattr(runs, name)
    raise AttributeError(f"module 'car_core.store' has no attribute {name!r}")
