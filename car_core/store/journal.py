"""``StoreJournal``: the engine's journal of finished branches, kept in the store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from car_core.model.trajectory import Trajectory

if TYPE_CHECKING:
    from car_core.store.runs import RunStore


class StoreJournal:
    """Keeps an attribution's branches in the store as they finish, so a killed attribution
    resumes without re-running them (``car_core.engine.execution.Journal``)."""

    def __init__(self, store: RunStore, attribution_id: str) -> None:
        self.store = store
        self.attribution_id = attribution_id

    def stored(self) -> set[tuple[str, int]]:
        return {(r[0], r[1]) for r in self.store.db.execute(
            "SELECT arm, rollout FROM runs WHERE attribution_id = ?", [self.attribution_id])}

    def lookup(self, task: Any) -> Trajectory | None:
        row = self.store.db.execute(
            "SELECT id FROM runs WHERE attribution_id = ? AND arm = ? AND rollout = ?",
            [self.attribution_id, task.arm, task.rollout]).fetchone()
        return self.store.load(row[0]) if row else None

    def write(self, task: Any, result: Trajectory) -> None:
        self.store.save(result, attribution_id=self.attribution_id)


__all__ = ["StoreJournal"]
