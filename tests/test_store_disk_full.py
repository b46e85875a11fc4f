"""A store whose disk is full: the write that failed is refused with a typed error that says
so, the store stays as it was, and an attribution it stopped resumes once the disk takes
writes again. A trial filled a tmpfs under ``car attribute``: SQLite had already rolled the
failed ``COMMIT`` back, CAR's second ``ROLLBACK`` raised "cannot rollback - no transaction is
active" in place of "the disk is full", and the store was called damaged ("restore it from a
copy") or the error escaped the hierarchy as a bare ``sqlite3.OperationalError``.

``PRAGMA max_page_count`` caps the file at its size now: SQLite answers a write past it as it
answers a full disk (``SQLITE_FULL``)."""

from __future__ import annotations

from pathlib import Path

import pytest

import car_core as car
from car_core.errors import StoreDiskError, resumable
from car_core.testing import synthetic as syn


def _fill(store: car.RunStore) -> None:
    """Leave the store's connection no room for another page."""
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")


def _unfill(store: car.RunStore) -> None:
    store.db.execute("PRAGMA max_page_count = 1073741823")


def test_a_run_saved_to_a_full_disk_is_refused_as_such_and_the_store_is_unharmed(
        tmp_path: Path) -> None:
    kept = syn.pivot().failing_run(0)
    wordy = car.FunctionAgent(policy=lambda h, rng: {"done": True, "note": "x" * 20_000},
                              environment=lambda h, a, rng: "ok", is_final=lambda a: True)
    lost = car.record(wordy, context={"ticket": 1}, outcome=lambda r: True)  # needs pages
    store = car.RunStore(tmp_path / "car.db")
    store.save(kept)
    _fill(store)
    with pytest.raises(StoreDiskError, match="the disk is full") as refused:
        store.save(lost)
    assert "free space" in (refused.value.hint or "") and resumable(refused.value)
    _unfill(store)
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert [r["id"] for r in store.runs()] == [kept.id]
    assert store.load(kept.id).to_json() == kept.to_json()
    store.save(lost)  # the disk takes writes again
    assert {r["id"] for r in store.runs()} == {kept.id, lost.id}


def test_an_attribution_the_full_disk_stopped_resumes_once_it_takes_writes(
        tmp_path: Path) -> None:
    model = syn.pivot()
    run = model.failing_run(0)
    store = car.RunStore(tmp_path / "car.db")
    store.save(run)
    _fill(store)
    with pytest.raises(StoreDiskError):
        car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=16, seed=0,
                        store=store, attribution_id="full-disk", progress=False)
    _unfill(store)
    res = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=16, seed=0,
                          store=store, attribution_id="full-disk", progress=False)
    assert res.locus == model.locus
