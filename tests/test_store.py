"""The SQLite store: WAL, idempotent saves, lineage queries, migrations, two writing processes,
tamper detection, and refusing files that are not ours, too new, or read-only — in every refusal
the file is left exactly as it was."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from _report_data import contrastive_dict
from hypothesis import HealthCheck, given, settings
from strategies import trajectories

import car_core as car
from car_core.errors import (
    AttributionNotFound,
    CorruptRun,
    CorruptStore,
    InvalidInput,
    NotACarStore,
    OutcomeError,
    RunNotFound,
    StoreError,
    StoreReadOnly,
    StoreTooNew,
)
from car_core.results import ContrastiveResult
from car_core.store import MIGRATIONS, RunStore, StoreJournal
from car_core.testing import synthetic as syn

ROOT = Path(__file__).resolve().parents[1]


def fingerprint(path: Path) -> tuple[str, list[str]]:
    """The file's bytes and the folder's names: what 'unchanged' means here."""
    return hashlib.sha256(path.read_bytes()).hexdigest(), sorted(os.listdir(path.parent))


def settled(path: Path, *, keep_wal: bool = False) -> Path:
    """Fold the WAL back into the main file so its bytes say everything."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    if not keep_wal:
        conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    return path


def rows(path: Path) -> dict[str, list[tuple]]:
    conn = sqlite3.connect(path)
    out = {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
           for t in ("runs", "steps", "attributions")}
    conn.close()
    return out


def test_store_is_wal_and_marked_as_ours(store: RunStore) -> None:
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA application_id").fetchone()[0] == 0x43415231


def test_save_and_load_round_trip(store: RunStore, pivot_run: car.Trajectory) -> None:
    assert store.save(pivot_run) == pivot_run.id
    assert store.load(pivot_run.id) == pivot_run
    assert store.exists(pivot_run.id)
    [summary] = store.runs()
    assert summary["id"] == pivot_run.id and summary["n_steps"] == 6
    assert summary["outcome"] == 1.0


def test_the_old_name_list_still_lists_runs_and_warns(store: RunStore, pivot_run) -> None:
    store.save(pivot_run)
    with pytest.warns(DeprecationWarning, match=r"RunStore\.runs\(\)"):
        listed = store.list(branches=True)  # type: ignore[attr-defined]
    assert listed == store.runs(branches=True) and [r["id"] for r in listed] == [pivot_run.id]


def test_saving_the_same_run_twice_changes_nothing(store: RunStore, pivot_run) -> None:
    store.save(pivot_run)
    before = rows(store.path)
    store.save(pivot_run)
    store.save(car.Trajectory.from_json(pivot_run.to_json()))
    assert rows(store.path) == before


def test_a_different_run_under_a_taken_id_is_refused(store: RunStore, pivot_run) -> None:
    store.save(pivot_run)
    before = rows(store.path)
    other = syn.and_game().failing_run()
    impostor = car.Trajectory.new(context=other.context, steps=list(other.steps),
                                  id=pivot_run.id)
    with pytest.raises(StoreError, match="give the new run a fresh id"):
        store.save(impostor)
    assert rows(store.path) == before
    assert store.load(pivot_run.id) == pivot_run


def test_a_tampered_run_object_is_not_saved(store: RunStore, pivot_run) -> None:
    import dataclasses
    bad = dataclasses.replace(pivot_run, steps=(dataclasses.replace(pivot_run.steps[0],
                                                                    action="edited"),
                                                *pivot_run.steps[1:]))
    with pytest.raises(CorruptRun, match="record it again"):
        store.save(bad)
    assert store.runs(branches=True) == []


def test_lineage_queries(store: RunStore, pivot_model, pivot_run) -> None:
    store.save(pivot_run)
    other = pivot_model.failing_run(seed=100)
    store.save(other)
    aid = store.begin_attribution(pivot_run.id, "manual", {"k": 2})
    dist = car.intervene(pivot_run, pivot_model.agent(), car.do_resample(2),
                         outcome=pivot_model.outcome, rollouts=3, progress=False)
    for t in dist.trajectories:
        store.save(t, attribution_id=aid)
    result = ContrastiveResult.from_dict(contrastive_dict(pivot_model, pivot_run))
    store.finish_attribution(aid, result)

    kids = store.children(pivot_run.id)
    assert [k["id"] for k in kids] == [t.id for t in dist.trajectories]
    assert {(k["arm"], k["branch_step"], k["attribution_id"]) for k in kids} == {
        ("intervention", 2, aid)}
    assert store.children(other.id) == []
    assert [(b["arm"], b["rollout"]) for b in store.branches(aid)] == [
        ("intervention", 0), ("intervention", 1), ("intervention", 2)]
    assert {r["id"] for r in store.runs()} == {pivot_run.id, other.id}
    assert len(store.runs(branches=True)) == 5
    loaded = store.load(dist.trajectories[1].id)
    assert loaded == dist.trajectories[1] and loaded.lineage.parent_id == pivot_run.id
    [att] = store.attributions(pivot_run.id)
    assert att.id == aid and att.params == {"k": 2} and att.status == "complete"
    assert isinstance(att.result, ContrastiveResult)  # typed, holding what was stored
    assert att.result.to_dict() == result.to_dict()


def test_store_journal_finds_finished_branches(store: RunStore, pivot_model, pivot_run) -> None:
    from car_core.engine.execution import Task
    from car_core.model.interventions import compile_plan
    from car_core.model.seeding import branch_noise
    store.save(pivot_run)
    aid = store.begin_attribution(pivot_run.id, "manual", {})
    journal = StoreJournal(store, aid)
    # the journal finds a branch by the arm and rollout its lineage names
    task = Task("intervention", 0, compile_plan(pivot_run, car.do_resample(1)),
                branch_noise(0, 0, "intervention", True))
    assert journal.lookup(task) is None
    dist = car.intervene(pivot_run, pivot_model.agent(), car.do_resample(1),
                         outcome=pivot_model.outcome, rollouts=1, progress=False)
    journal.write(task, dist.trajectories[0])
    assert journal.lookup(task) == dist.trajectories[0]


def test_a_store_opened_here_serves_an_estimate_run_in_another_thread(
        store: RunStore, pivot_model, pivot_run) -> None:
    """An app with MCP servers must call the estimator off the servers' loop
    (``await asyncio.to_thread(car.contrastive, ..., store=store)``): a store opened on the
    main thread raised sqlite3's "objects created in a thread can only be used in that same
    thread" there. Then the main thread reads what it wrote."""
    import asyncio

    async def main() -> car.ContrastiveResult:
        return await asyncio.to_thread(car.contrastive, pivot_run, pivot_model.agent(),
                                       outcome=pivot_model.outcome, rollouts=16, seed=0,
                                       store=store, progress=False)

    res = asyncio.run(main())
    stored = store.attributions(pivot_run.id)
    assert [a.id for a in stored] == [res.attribution_id] and stored[0].result is not None


def test_migrations_are_recorded_once(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    RunStore(path).close()
    RunStore(path).close()
    conn = sqlite3.connect(path)
    names = [r[0] for r in conn.execute("SELECT name FROM _sqlite_migrations")]
    conn.close()
    assert names == [m.name for m in MIGRATIONS._migrations]


WRITER = textwrap.dedent("""
    import sys
    import car_core as car
    from car_core.testing import synthetic as syn
    from car_core.store import RunStore
    path, first = sys.argv[1], int(sys.argv[2])
    store = RunStore(path)
    model = syn.and_game()
    for seed in range(first, first + 15):
        store.save(car.record(model.agent(), context={"writer": first}, outcome=model.outcome,
                              seed=seed))
    store.close()
""")


@pytest.mark.slow
@pytest.mark.parametrize("fresh", [True, False], ids=["new-file", "existing-file"])
def test_two_processes_write_one_database_at_once(tmp_path: Path, fresh: bool) -> None:
    path = tmp_path / "shared.db"
    if not fresh:
        RunStore(path).close()   # otherwise both processes race to create and migrate it
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(first)], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for first in (0, 1000)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with RunStore(path) as store:
        listed = store.runs()
        assert len(listed) == 30
        assert {store.load(r["id"]).context["writer"] for r in listed} == {0, 1000}


def test_editing_one_stored_byte_is_detected(tmp_path: Path, pivot_run) -> None:
    path = tmp_path / "t.db"
    other = syn.and_game().failing_run()
    with RunStore(path) as store:
        store.save(pivot_run)
        store.save(other)
    conn = sqlite3.connect(path)
    action = conn.execute("SELECT action FROM steps WHERE run_id = ? AND idx = 3",
                          [pivot_run.id]).fetchone()[0]
    edited = action.replace('"bad"', '"bax"')
    assert len(edited) == len(action) and edited != action
    conn.execute("UPDATE steps SET action = ? WHERE run_id = ? AND idx = 3",
                 [edited, pivot_run.id])
    conn.commit()
    conn.close()
    before = rows(path)
    with RunStore(path) as store:
        with pytest.raises(CorruptRun, match="record it again") as info:
            store.load(pivot_run.id)
        assert info.value.step == 3 and info.value.run_id == pivot_run.id
        assert store.load(other.id) == other
    assert rows(path) == before


def test_a_deleted_step_row_is_detected(tmp_path: Path, pivot_run) -> None:
    path = tmp_path / "t.db"
    with RunStore(path) as store:
        store.save(pivot_run)
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM steps WHERE run_id = ? AND idx = 5", [pivot_run.id])
    conn.commit()
    conn.close()
    with RunStore(path) as store, pytest.raises(CorruptRun, match="incomplete"):
        store.load(pivot_run.id)


def test_unparseable_stored_json_is_a_corrupt_run(tmp_path: Path, pivot_run) -> None:
    path = tmp_path / "t.db"
    with RunStore(path) as store:
        store.save(pivot_run)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE steps SET meta = '{oops' WHERE run_id = ? AND idx = 0", [pivot_run.id])
    conn.commit()
    conn.close()
    with RunStore(path) as store, pytest.raises(CorruptRun, match="edited by hand"):
        store.load(pivot_run.id)


def test_a_sqlite_file_that_is_not_ours_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.execute("INSERT INTO users VALUES ('ada')")
    conn.commit()
    conn.close()
    before = fingerprint(path)
    with pytest.raises(NotACarStore, match="use a new file"):
        RunStore(path)
    assert fingerprint(path) == before


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 20)
    before = fingerprint(path)
    with pytest.raises(NotACarStore, match="pass the path of a CAR store"):
        RunStore(path)
    assert fingerprint(path) == before


def test_a_store_migrated_by_a_newer_car_is_refused_untouched(tmp_path: Path,
                                                               pivot_run) -> None:
    path = tmp_path / "new.db"
    with RunStore(path) as store:
        store.save(pivot_run)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO _sqlite_migrations (migration_set, name, applied_at) "
                 "VALUES ('car', '9999_from_the_future', '2099-01-01')")
    conn.commit()
    conn.close()
    before = fingerprint(settled(path))
    with pytest.raises(StoreTooNew, match="upgrade causal-agent-replay"):
        RunStore(path)
    assert fingerprint(path) == before


@pytest.fixture(params=[True, False], ids=["wal", "rollback-journal"])
def read_only(request, tmp_path: Path, pivot_run):
    """A CAR store whose file cannot be written. chmod is enough for a normal user; root
    ignores permissions, so there the file is also made immutable (chattr +i)."""
    path = tmp_path / "ro.db"
    with RunStore(path) as store:
        store.save(pivot_run)
    settled(path, keep_wal=request.param)
    path.chmod(0o444)
    immutable = os.geteuid() == 0
    if immutable:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    yield path, request.param
    if immutable:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    path.chmod(0o644)


def test_a_read_only_store_is_refused_for_writing_and_left_untouched(read_only,
                                                                      pivot_run) -> None:
    path, wal = read_only
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    if wal:
        # already in WAL mode and migrated: it opens and reads, but refuses to write
        store = RunStore(path)
        try:
            assert store.load(pivot_run.id) == pivot_run
            with pytest.raises(StoreReadOnly, match="writable file"):
                store.save(syn.and_game().failing_run())
        finally:
            store.close()
    else:
        # switching it to WAL is a write, so it is refused on opening
        with pytest.raises(StoreReadOnly, match="writable file"):
            RunStore(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_a_store_in_a_missing_folder_says_to_check_the_folder(tmp_path: Path) -> None:
    with pytest.raises(StoreReadOnly, match="check the folder exists"):
        RunStore(tmp_path / "missing" / "car.db")


def test_unknown_ids_raise_not_found_errors_that_are_key_errors(store: RunStore) -> None:
    with pytest.raises(RunNotFound, match="car runs") as info:
        store.load("nope")
    assert isinstance(info.value, KeyError) and "nope" in str(info.value)
    with pytest.raises(KeyError):
        store.load("nope")
    with pytest.raises(RunNotFound, match="save the run before attributing"):
        store.begin_attribution("nope", "contrastive", {})
    with pytest.raises(AttributionNotFound, match="RunStore.attributions") as info2:
        store.attribution("nope")
    assert isinstance(info2.value, KeyError)


def test_a_listing_row_given_for_an_id_is_bad_input_not_a_damaged_file(store: RunStore) -> None:
    """A user trial passed a row of the listing to ``load`` and was told the file was damaged
    and to restore it from a copy."""
    with pytest.raises(InvalidInput, match=r"store.load\(row\['id'\]\)"):
        store.load({"id": "abc"})  # type: ignore[arg-type]


def test_a_copied_store_file_opens_elsewhere(tmp_path: Path, pivot_run) -> None:
    """No side files: the database alone carries everything."""
    path = tmp_path / "a.db"
    with RunStore(path) as store:
        store.save(pivot_run)
    settled(path)
    (tmp_path / "b").mkdir()
    shutil.copy(path, tmp_path / "b" / "a.db")
    with RunStore(tmp_path / "b" / "a.db") as copy:
        assert copy.load(pivot_run.id) == pivot_run


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trajectories())
def test_any_trajectory_round_trips_through_the_store(tmp_path: Path, run) -> None:
    # a fresh store per example: two generated runs may claim one (attribution, arm, rollout)
    import uuid
    with RunStore(tmp_path / f"{uuid.uuid4().hex}.db") as store:
        store.save(run)
        assert store.load(run.id) == run


@pytest.mark.parametrize("sql", [
    "UPDATE runs SET outcome = 0.0 WHERE id = :id",
    "UPDATE runs SET status = 'max_steps' WHERE id = :id",
    "UPDATE runs SET header = replace(header, '\"value\": 1.0', '\"value\": 0.0') "
    "WHERE id = :id",
    # dropping the seal along with the edit must not switch the check off
    "UPDATE runs SET outcome = 0.0, header = json_remove(header, '$.seal') WHERE id = :id",
])
def test_editing_the_stored_outcome_or_status_is_detected(tmp_path: Path, pivot_run,
                                                          sql: str) -> None:
    path = tmp_path / "t.db"
    with RunStore(path) as store:
        store.save(pivot_run)
    conn = sqlite3.connect(path)
    before = conn.execute("SELECT * FROM runs").fetchall()
    conn.execute(sql, {"id": pivot_run.id})
    conn.commit()
    assert conn.execute("SELECT * FROM runs").fetchall() != before   # the edit took
    conn.close()
    with RunStore(path) as store, pytest.raises(CorruptRun, match="changed after saving"):
        store.load(pivot_run.id)


def test_a_save_that_fails_half_way_leaves_nothing(store: RunStore, pivot_run,
                                                   monkeypatch) -> None:
    """One transaction per logical write: the run row is not kept when its steps fail."""
    import sqlite_utils

    real = sqlite_utils.db.Table.insert_all

    def failing(self, *args, **kwargs):
        if self.name == "steps":
            raise sqlite3.OperationalError("disk I/O error")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(sqlite_utils.db.Table, "insert_all", failing)
    with pytest.raises(StoreError, match="nothing was written"):
        store.save(pivot_run)
    monkeypatch.setattr(sqlite_utils.db.Table, "insert_all", real)
    assert not store.exists(pivot_run.id)
    assert store.db.execute("SELECT count(*) FROM steps").fetchone()[0] == 0
    store.save(pivot_run)
    assert store.load(pivot_run.id) == pivot_run


def test_merge_copies_runs_branches_and_attributions_once(tmp_path: Path, pivot_model) -> None:
    """Stores written in parallel (one per test worker) merge into one, verified on load."""
    parts = []
    for i in range(2):
        with RunStore(tmp_path / f"part{i}.db") as part:
            run = pivot_model.failing_run(seed=i)
            part.save(run)
            # 16 rollouts a step: enough for the search to decide (at 4 it runs out and
            # the attribution is stored truncated, which is not what this test is about)
            res = car.contrastive(run, pivot_model.agent(), outcome=pivot_model.outcome,
                                  rollouts=16, seed=0, store=part)
            assert part.attribution(res.attribution_id).status == "complete"
            parts.append((run, res.attribution_id, len(list(part.branches(res.attribution_id)))))
    with RunStore(tmp_path / "main.db") as main:
        copied = [main.merge(tmp_path / f"part{i}.db") for i in range(2)]
        assert copied == [1 + n for _, _, n in parts]  # each run and its branches
        assert main.merge(tmp_path / "part0.db") == 0  # again: nothing new
        for run, aid, n in parts:
            assert main.load(run.id).digest == run.digest
            assert main.attribution(aid).status == "complete"
            assert len(list(main.branches(aid))) == n
        (tmp_path / "other.db").write_bytes(b"")
        sqlite3.connect(tmp_path / "other.db").execute("CREATE TABLE t (x)").connection.close()
        with pytest.raises(NotACarStore):
            main.merge(tmp_path / "other.db")


# -- sealed attributions, resumes, leases, unique branches ------------------------------------
def finished_attribution(store: RunStore, model: syn.SyntheticSCM, run: car.Trajectory,
                         **kw: object) -> Any:
    return car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=4, seed=0,
                           store=store, progress=False, **kw)


def test_an_edited_attribution_is_a_typed_error_on_load(store: RunStore, pivot_model,
                                                        pivot_run) -> None:
    from car_core.errors import CorruptAttribution
    res = finished_attribution(store, pivot_model, pivot_run)
    assert store.attribution(res.attribution_id).result == res
    store.db.execute("UPDATE attributions SET result = json_set(result, '$.locus', 3)")
    with pytest.raises(CorruptAttribution, match="changed after it was stored"):
        store.attribution(res.attribution_id)
    with pytest.raises(CorruptAttribution):
        store.attributions(pivot_run.id)


def test_an_interrupted_resume_leaves_the_finished_result_alone(store: RunStore, pivot_model,
                                                                pivot_run) -> None:
    res = finished_attribution(store, pivot_model, pivot_run)
    before = store.attribution(res.attribution_id)

    class Stop(Exception):
        pass

    class Interrupting:
        def update(self, n: int = 1) -> None:
            raise Stop

        def close(self) -> None:
            pass

    # a resume with a larger cap (new branches to run) that dies on its first new branch
    with pytest.raises(Stop):
        car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                        rollouts=8, seed=0, store=store, attribution_id=res.attribution_id,
                        progress=Interrupting())
    assert store.attribution(res.attribution_id) == before  # still complete, same result


def test_one_process_at_a_time_runs_an_attribution(store: RunStore, pivot_run) -> None:
    from car_core.errors import AttributionBusy
    store.save(pivot_run)
    aid = store.begin_attribution(pivot_run.id, "manual", {})
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # another live process on this host holds the lease
        store.db.execute("UPDATE attribution_leases SET owner = 'other', pid = ?",
                         [holder.pid])
        with pytest.raises(AttributionBusy, match=f"process {holder.pid}"):
            store.begin_attribution(pivot_run.id, "manual", {}, attribution_id=aid)
        with RunStore(store.path) as other:
            with pytest.raises(AttributionBusy):
                other.begin_attribution(pivot_run.id, "manual", {}, attribution_id=aid)
    finally:
        holder.kill()
        holder.wait()
    # its process is gone: the lease is stale and the resume takes it over
    assert store.begin_attribution(pivot_run.id, "manual", {}, attribution_id=aid) == aid
    store.finish_attribution(aid, ContrastiveResult.from_dict(contrastive_dict(
        syn.pivot(), pivot_run)))
    assert store.db.execute("SELECT count(*) FROM attribution_leases").fetchone()[0] == 0


def test_two_concurrent_resumes_store_each_branch_once(tmp_path: Path, pivot_model,
                                                       pivot_run) -> None:
    """Two processes resume one attribution at once: one runs it, the other is refused
    (AttributionBusy), and every (arm, rollout) is stored exactly once."""
    db = tmp_path / "car.db"
    with RunStore(db) as s:
        s.save(pivot_run)
    code = textwrap.dedent(f"""
        import sys, car_core as car
        from car_core.testing import synthetic as syn
        from car_core.errors import AttributionBusy
        model = syn.pivot()
        with car.RunStore({str(db)!r}) as s:
            run = s.load({pivot_run.id!r})
            try:
                car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=24,
                                seed=0, store=s, attribution_id="shared", progress=False)
            except AttributionBusy:
                print("busy")
                sys.exit(0)
        print("ran")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert "ran" in {o.strip() for o, _ in outs}
    conn = sqlite3.connect(db)
    keys = conn.execute("SELECT arm, rollout FROM runs WHERE attribution_id = 'shared'"
                        ).fetchall()
    conn.close()
    assert keys and len(keys) == len(set(keys))


def test_a_second_connection_of_this_process_is_refused_like_another_process(
        store: RunStore, pivot_run) -> None:
    """The lease belongs to a claim, not to a process: another RunStore of this process (or
    this store again) cannot take a live claim; finishing, releasing or closing frees it."""
    from car_core.errors import AttributionBusy
    store.save(pivot_run)
    aid = store.begin_attribution(pivot_run.id, "manual", {})
    with RunStore(store.path) as other:
        with pytest.raises(AttributionBusy, match="this process"):
            other.begin_attribution(pivot_run.id, "manual", {}, attribution_id=aid)
        with pytest.raises(AttributionBusy, match="this process"):
            store.begin_attribution(pivot_run.id, "manual", {}, attribution_id=aid)
        assert store.holds(aid) and not other.holds(aid)  # the refusals took nothing
        store.release_attribution(aid)
        assert other.begin_attribution(pivot_run.id, "manual", {}, attribution_id=aid) == aid
        with pytest.raises(AttributionBusy):
            store.begin_attribution(pivot_run.id, "manual", {}, attribution_id=aid)
    # ``other`` closed while holding it: nothing can finish that claim, so it is free
    assert store.db.execute("SELECT count(*) FROM attribution_leases").fetchone()[0] == 0
    assert store.begin_attribution(pivot_run.id, "manual", {}, attribution_id=aid) == aid
    store.finish_attribution(aid, ContrastiveResult.from_dict(contrastive_dict(
        syn.pivot(), pivot_run)))
    assert store.db.execute("SELECT count(*) FROM attribution_leases").fetchone()[0] == 0


def test_two_threads_resuming_one_attribution_one_is_refused(tmp_path: Path, pivot_model,
                                                             pivot_run) -> None:
    """Two threads of one process resume one attribution, each with its own connection: the
    second is refused with AttributionBusy while the first runs (its outcome holds it inside
    the estimate until the second has tried), and every (arm, rollout) is stored once."""
    import threading

    from car_core.errors import AttributionBusy
    db = tmp_path / "car.db"
    inside, tried, gate = threading.Event(), threading.Event(), threading.Event()

    def held(run: car.Trajectory, rng: Any) -> float:
        """The one outcome of every attempt (a resume is scored by the outcome it began with);
        once ``gate`` is set, the first branch scored holds the estimate inside its lease."""
        if run is pivot_run or not gate.is_set():  # the check on the record comes first
            return pivot_model.outcome(run, rng)
        inside.set()
        assert tried.wait(60), "the second thread never tried"
        return pivot_model.outcome(run, rng)

    with RunStore(db) as s:  # a short attribution, resumed below with a larger cap
        aid = car.contrastive(pivot_run, pivot_model.agent(), outcome=held,
                              rollouts=2, seed=0, store=s, progress=False).attribution_id
    gate.set()

    errors: dict[str, BaseException] = {}

    def first() -> None:
        try:
            with RunStore(db) as s:
                car.contrastive(pivot_run, pivot_model.agent(), outcome=held, rollouts=4,
                                seed=0, store=s, attribution_id=aid, progress=False)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread below
            errors["first"] = exc
            inside.set()

    def second() -> None:
        assert inside.wait(60), "the first thread never started"
        try:
            with RunStore(db) as s:
                car.contrastive(pivot_run, pivot_model.agent(), outcome=held,
                                rollouts=4, seed=0, store=s, attribution_id=aid,
                                progress=False)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread below
            errors["second"] = exc
        finally:
            tried.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert "first" not in errors, errors.get("first")
    assert isinstance(errors.get("second"), AttributionBusy), errors.get("second")
    with RunStore(db) as s:
        assert s.attribution(aid).status in ("complete", "truncated")  # the first finished
        pairs = [(b["arm"], b["rollout"]) for b in s.branches(aid)]
        assert pairs and len(pairs) == len(set(pairs))
        assert s.db.execute("SELECT count(*) FROM attribution_leases").fetchone()[0] == 0


def test_an_estimate_that_raised_frees_its_lease_for_this_process(store: RunStore,
                                                                  pivot_model, pivot_run):
    class Stop(Exception):
        pass

    class Interrupting:  # a progress bar whose first update raises, as Ctrl-C would
        def update(self, n: int = 1) -> None:
            raise Stop

        def close(self) -> None:
            pass

    store.save(pivot_run)
    with pytest.raises(Stop):
        car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                        rollouts=4, seed=0, store=store, progress=Interrupting())
    (stopped,) = store.attributions(pivot_run.id)
    assert store.db.execute("SELECT count(*) FROM attribution_leases").fetchone()[0] == 0
    with RunStore(store.path) as other:  # another connection resumes it at once
        res = car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                              rollouts=4, seed=0, store=other, attribution_id=stopped.id,
                              progress=False)
    assert res.attribution_id == stopped.id


def test_a_second_branch_for_one_arm_and_rollout_is_refused(store: RunStore, pivot_model,
                                                            pivot_run) -> None:
    store.save(pivot_run)
    aid = store.begin_attribution(pivot_run.id, "manual", {})
    a, b = car.intervene(pivot_run, pivot_model.agent(), car.do_resample(2),
                         outcome=pivot_model.outcome, rollouts=2, progress=False).trajectories
    store.save(a, attribution_id=aid)
    twin = dataclasses_replace_lineage(b, rollout=a.lineage.rollout)
    with pytest.raises(StoreError, match="already holds a branch"):
        store.save(twin, attribution_id=aid)
    with pytest.raises(sqlite3.IntegrityError):  # and the schema itself says so
        store.db.execute("INSERT INTO runs (id, attribution_id, arm, rollout, digest) "
                         "VALUES ('x', ?, ?, ?, 'd')", [aid, a.lineage.arm, a.lineage.rollout])


def dataclasses_replace_lineage(run: car.Trajectory, **changes) -> car.Trajectory:
    import dataclasses
    return dataclasses.replace(run, lineage=dataclasses.replace(run.lineage, **changes))


def test_an_older_store_migrates_seals_and_drops_duplicate_branches(tmp_path: Path,
                                                                    pivot_model,
                                                                    pivot_run) -> None:
    """A store written before sealed attributions and unique branches, holding the duplicate
    branches two concurrent resumes stored: opening it migrates it, keeps the first branch of
    each (arm, rollout), and seals its attributions."""
    import sqlite_utils
    path = tmp_path / "old.db"
    db = sqlite_utils.Database(path)
    db.execute("PRAGMA application_id = 1128354353")
    MIGRATIONS.apply(db, stop_before="0002_sealed_attributions_unique_branches_leases")
    db.execute("PRAGMA journal_mode = WAL")
    db.conn.close()
    dist = car.intervene(pivot_run, pivot_model.agent(), car.do_resample(2),
                         outcome=pivot_model.outcome, rollouts=3, progress=False)
    conn = sqlite3.connect(path)
    old = contrastive_dict(pivot_model, pivot_run)  # intervals without ci_level, as then
    conn.execute("INSERT INTO attributions (id, run_id, method, status, params, result, "
                 "created_at) VALUES ('old', ?, 'contrastive', 'complete', '{}', ?, 1.0)",
                 [pivot_run.id, json.dumps(old)])
    conn.commit()
    conn.close()
    # the rows as the old code stored them, then a duplicate of each under a fresh id
    with RunStore(tmp_path / "scratch.db") as scratch:
        scratch.save(pivot_run)
        for t in dist.trajectories:
            scratch.save(t, attribution_id="old")
    src = sqlite3.connect(tmp_path / "scratch.db")
    dst = sqlite3.connect(path)
    for table in ("runs", "steps"):
        cols = [r[1] for r in src.execute(f"PRAGMA table_info({table})")]
        for row in src.execute(f"SELECT * FROM {table}"):
            dst.execute(f"INSERT INTO {table} VALUES ({','.join('?' * len(cols))})", row)
    for row in src.execute("SELECT * FROM runs WHERE attribution_id = 'old'"):
        dst.execute(f"INSERT INTO runs VALUES ({','.join('?' * len(row))})",
                    ["dup-" + row[0], *row[1:]])
    dst.commit()
    dst.close()
    src.close()
    with RunStore(path) as store:
        kept = [(b["arm"], b["rollout"], b["id"]) for b in store.branches("old")]
        assert sorted(kept) == sorted((t.lineage.arm, t.lineage.rollout, t.id)
                                      for t in dist.trajectories)
        # sealed as it was, and read back typed
        assert store.attribution("old").result == ContrastiveResult.from_dict(old)
        for t in dist.trajectories:
            assert store.load(t.id) == t


def test_concurrent_creation_of_a_fresh_store_never_refuses_it(tmp_path: Path) -> None:
    """Several processes open one new file at the same moment: the check that the file is
    ours and the mark that makes it ours are one transaction, so none sees a half-made store
    as someone else's (NotACarStore)."""
    code = textwrap.dedent("""
        import sys, time
        from car_core.store import RunStore
        start = float(sys.argv[2])
        while time.time() < start:
            pass
        RunStore(sys.argv[1]).close()
        print("ok")
    """)
    import time
    for i in range(4):
        path = tmp_path / f"fresh-{i}.db"
        start = time.time() + 1.5
        procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(start)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=ROOT) for _ in range(4)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [o.strip() for o, _ in outs] == ["ok"] * 4, outs


def test_a_store_migrated_by_another_opener_between_two_reads_is_not_called_damaged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the test above can only meet by chance, made to happen every time: while one
    opener has read which migrations a new file has (none), a second opener creates the whole
    store. The first must then find a store to join, not tables without their migration
    record ("lost its migrations table")."""
    import threading

    from car_core.store import schema
    path = tmp_path / "fresh.db"
    real = schema.applied
    other: dict[str, Any] = {}

    def applied_then_another_opener(db: Any) -> set[str]:
        names = real(db)
        if threading.current_thread() is threading.main_thread() and "thread" not in other:
            def open_it() -> None:
                try:
                    RunStore(path).close()
                    other["ok"] = True
                except Exception as exc:  # reported below, with the main opener's result
                    other["error"] = exc
            other["thread"] = threading.Thread(target=open_it)
            other["thread"].start()
            # long enough for the other opener to migrate the file if nothing holds it back
            other["thread"].join(timeout=1.0)
        return names

    monkeypatch.setattr(schema, "applied", applied_then_another_opener)
    with RunStore(path) as store:
        assert store.runs() == []
    other["thread"].join(timeout=60)
    assert other.get("ok") and "error" not in other, other
    monkeypatch.setattr(schema, "applied", real)
    with RunStore(path, readonly=True) as again:
        assert again.runs() == []


def test_a_read_only_open_of_a_store_still_being_created_says_so(tmp_path: Path) -> None:
    """Between a new store's mark and its first migration (another process is creating it,
    or died doing so) a read says what it is, not that the file was damaged, and writes
    nothing; an open for writing then finishes it."""
    import sqlite_utils
    path = tmp_path / "new.db"
    db = sqlite_utils.Database(path)
    db.execute("PRAGMA application_id = 1128354353")
    db.conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="tables are not made yet") as info:
        RunStore(path, readonly=True)
    assert not isinstance(info.value, CorruptStore)
    assert path.read_bytes() == before
    with RunStore(path) as store:
        assert store.runs() == []
    with RunStore(path, readonly=True) as again:
        assert again.runs() == []


def test_a_read_only_open_writes_nothing(tmp_path: Path, pivot_run) -> None:
    path = tmp_path / "car.db"
    with RunStore(path) as store:
        store.save(pivot_run)
    settled(path)
    before = fingerprint(path)
    with RunStore(path, readonly=True) as ro:
        assert ro.load(pivot_run.id) == pivot_run
        assert [r["id"] for r in ro.runs()] == [pivot_run.id]
        with pytest.raises(StoreReadOnly, match="opened read-only"):
            ro.begin_attribution(pivot_run.id, "x", {})
    assert fingerprint(path) == before
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(NotACarStore, match="empty file"):
        RunStore(empty, readonly=True)
    assert empty.read_bytes() == b""


HOLD_UNCOMMITTED = textwrap.dedent("""
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("PRAGMA cache_size = 1")  # spill: the uncommitted pages reach the main file
    conn.execute("BEGIN")
    conn.execute("UPDATE runs SET outcome = 0")
    conn.execute("UPDATE steps SET meta = meta || ' '")
    print("held", flush=True)
    sys.stdin.read()  # hold the write until killed
""")


def test_uncommitted_writes_of_a_rollback_journal_store_are_never_read(tmp_path: Path,
                                                                       pivot_run) -> None:
    """A rollback-journal store whose writer has written uncommitted pages into the file: a
    read waits for it and then refuses (never shows those pages); once the writer is gone, its
    hot journal is refused by reads (which cannot roll it back) until a writing open rolls it
    back, and then the committed run reads as it was."""
    path = tmp_path / "car.db"
    with RunStore(path) as store:
        store.save(pivot_run)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    writer = subprocess.Popen([sys.executable, "-c", HOLD_UNCOMMITTED, str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "held"
        assert Path(f"{path}-journal").exists()
        before = fingerprint(path)
        with pytest.raises(StoreError, match="being written by another process"):
            RunStore(path, readonly=True, timeout=0.1)
        assert fingerprint(path) == before
    finally:
        writer.kill()
        writer.wait()
    before = fingerprint(path)
    with pytest.raises(StoreError, match="unfinished write"):
        RunStore(path, readonly=True, timeout=0.1)
    assert fingerprint(path) == before
    with RunStore(path) as store:  # a writing open rolls the dead writer's pages back
        assert store.load(pivot_run.id) == pivot_run
    with RunStore(path, readonly=True) as store:
        assert [r["outcome"] for r in store.runs()] == [1.0]


def test_a_flipped_byte_in_an_index_page_is_refused_not_read_short(tmp_path: Path,
                                                                    pivot_model,
                                                                    pivot_run) -> None:
    """An index entry that no longer matches its row: a query through the index silently
    misses the branch, and ``quick_check`` says ok; reads run ``integrity_check``, which
    compares every index with its table, and refuse the file."""
    path = tmp_path / "car.db"
    with RunStore(path) as store:
        car.contrastive(pivot_run, pivot_model.agent(), outcome=pivot_model.outcome,
                        rollouts=2, seed=0, store=store, progress=False)
    settled(path)
    conn = sqlite3.connect(path)
    root = conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'runs_attribution'"
                        ).fetchone()[0]
    aid = conn.execute("SELECT attribution_id FROM runs WHERE attribution_id IS NOT NULL "
                       "LIMIT 1").fetchone()[0]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    raw = bytearray(path.read_bytes())
    page = raw[(root - 1) * page_size: root * page_size]
    at = page.rindex(aid.encode())  # one index entry's copy of the attribution id
    raw[(root - 1) * page_size + at] ^= 0x01  # '0'..'f' -> another character, still text
    path.write_bytes(bytes(raw))
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] != "ok"
    conn.close()
    before = fingerprint(path)
    with pytest.raises(CorruptStore, match="integrity check"):
        RunStore(path, readonly=True)
    assert fingerprint(path) == before


def test_a_store_from_before_sealed_attributions_still_opens_for_reading(tmp_path: Path,
                                                                         pivot_run) -> None:
    """A store at the first migration (no attribution seals yet) is read as it is, migrating
    nothing: its runs list and load, its attribution reads back unsealed."""
    import sqlite_utils
    path = tmp_path / "old.db"
    db = sqlite_utils.Database(path)
    db.execute("PRAGMA application_id = 1128354353")
    MIGRATIONS.apply(db, stop_before="0002_sealed_attributions_unique_branches_leases")
    db.conn.close()
    with RunStore(tmp_path / "scratch.db") as scratch:
        scratch.save(pivot_run)
    src, dst = sqlite3.connect(tmp_path / "scratch.db"), sqlite3.connect(path)
    for table in ("runs", "steps"):
        for row in src.execute(f"SELECT * FROM {table}"):
            dst.execute(f"INSERT INTO {table} VALUES ({','.join('?' * len(row))})", row)
    dst.execute("INSERT INTO attributions (id, run_id, method, status, params, result, "
                "created_at) VALUES ('old', ?, 'contrastive', 'running', '{}', NULL, 1.0)",
                [pivot_run.id])
    dst.commit()
    dst.close()
    src.close()
    before = fingerprint(path)
    with RunStore(path, readonly=True) as store:
        assert store.legacy
        assert [r["id"] for r in store.runs()] == [pivot_run.id]
        assert store.load(pivot_run.id) == pivot_run
        assert store.attribution("old").status == "running"
    assert fingerprint(path) == before


def test_a_path_given_as_store_is_opened_as_the_run_store(tmp_path: Path, pivot_model) -> None:
    # CarCallback(store="car.db") takes a path, so users pass one to the estimates too: it
    # raised AttributeError ('str' object has no attribute 'save') from inside the estimate
    path = tmp_path / "car.db"
    run = next(r for r in (car.record(pivot_model.agent(), outcome=pivot_model.outcome,
                                      seed=s, store=str(path)) for s in range(100))
               if r.failed)
    res = car.contrastive(run, pivot_model.agent(), outcome=pivot_model.outcome, rollouts=4,
                          seed=0, store=path, early_stop=True)
    with RunStore(path) as db:
        assert db.load(run.id) == run
        assert db.attribution(res.attribution_id).run_id == run.id


def test_a_store_that_is_not_one_is_refused_before_anything_runs(pivot_model,
                                                                  pivot_run) -> None:
    calls = []

    def outcome(r: car.Trajectory) -> float:
        calls.append(r)
        return pivot_model.outcome(r)

    with pytest.raises(InvalidInput, match=r"store=.* is not a run store") as err:
        car.contrastive(pivot_run, pivot_model.agent(), outcome=outcome, rollouts=4,
                        store={"path": "car.db"})
    assert "car.RunStore(path)" in (err.value.hint or "")
    assert calls == []  # not even the record's check ran


def test_a_run_whose_outcome_raised_on_record_is_kept_unscored(tmp_path: Path) -> None:
    """``car.record`` scored the run before saving it: an outcome that raised threw away a run
    that had happened (side effects and all), and the error named a run id no store held. The
    run is stored unscored, the error says so, and a working outcome attributes it."""
    model = syn.pivot()
    store = RunStore(tmp_path / "car.db")

    def broken(run: Any) -> float:
        raise KeyError("verdict")

    with pytest.raises(OutcomeError, match="stored unscored") as raised:
        car.record(model.agent(), context={"scm": model.name}, outcome=broken, seed=7,
                   store=store)
    run = store.load(raised.value.run_id)
    assert run.outcome is None and len(run.steps) == model.n_steps
    with pytest.raises(OutcomeError, match="not kept"):
        car.record(model.agent(), context={"scm": model.name}, outcome=broken, seed=7)
