"""The store's schema: its named migrations, and the checks an open makes before it reads or
writes a file.

A file is ours when ``PRAGMA application_id`` says so; a writable open marks a new file as
ours and migrates it (one process at a time), a read-only open migrates nothing and refuses a
file that is not ours, is newer, or has lost what reads need. Every refusal comes before
anything is written.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from car_core.errors import CorruptStore, NotACarStore, StoreError, StoreTooNew
from car_core.store._deps import sqlite_utils
from car_core.store._deps import sqlite_utils_migrations as Migrations
from car_core.store.seals import attribution_seal

APPLICATION_ID = 0x43415231  # "CAR1" in PRAGMA application_id marks a file as ours
MIGRATIONS = Migrations("car")
# The names of our migrations, in order: what a file migrated by a newer CAR is told apart by
# (kept here rather than read from the Migrations object's private list).
MIGRATION_NAMES: list[str] = []


def _migration(name: str) -> Callable[[Callable[[sqlite_utils.Database], None]],
                                      Callable[[sqlite_utils.Database], None]]:
    MIGRATION_NAMES.append(name)
    return MIGRATIONS(name=name)


@_migration("0001_runs_steps_attributions")
def _initial(db: sqlite_utils.Database) -> None:
    db.execute("""CREATE TABLE IF NOT EXISTS runs (
        id TEXT PRIMARY KEY, parent_id TEXT, attribution_id TEXT, arm TEXT, rollout INTEGER,
        branch_step INTEGER, agent TEXT, status TEXT, outcome REAL, n_steps INTEGER,
        digest TEXT NOT NULL, seed INTEGER, created_at REAL, context TEXT, header TEXT)""")
    db.execute("""CREATE TABLE IF NOT EXISTS steps (
        run_id TEXT NOT NULL REFERENCES runs(id), idx INTEGER NOT NULL, digest TEXT NOT NULL,
        action TEXT, observation TEXT, observed INTEGER, state TEXT, meta TEXT,
        PRIMARY KEY (run_id, idx))""")
    db.execute("""CREATE TABLE IF NOT EXISTS attributions (
        id TEXT PRIMARY KEY, run_id TEXT NOT NULL, method TEXT NOT NULL, status TEXT NOT NULL,
        params TEXT, result TEXT, created_at REAL, finished_at REAL)""")
    db.execute("CREATE INDEX IF NOT EXISTS runs_parent ON runs(parent_id)")
    db.execute("CREATE INDEX IF NOT EXISTS runs_attribution ON runs(attribution_id, arm, rollout)")
    db.execute("CREATE INDEX IF NOT EXISTS attributions_run ON attributions(run_id)")


@_migration("0002_sealed_attributions_unique_branches_leases")
def _sealed_unique_leased(db: sqlite_utils.Database) -> None:
    """Attributions get a seal (sealed here for the rows already stored), an attribution's
    branches become unique per (arm, rollout) — duplicates two concurrent resumes stored
    before this rule are removed, the first stored of each pair kept (they ran the same task
    with the same noise) — and a lease table lets one process at a time run an attribution."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(attributions)").fetchall()}
    if "seal" not in columns:
        db.execute("ALTER TABLE attributions ADD COLUMN seal TEXT")
    for row in db.query("SELECT * FROM attributions"):
        db.execute("UPDATE attributions SET seal = ? WHERE id = ?",
                   [attribution_seal(row), row["id"]])
    dupes = """SELECT id FROM runs r WHERE attribution_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM runs o WHERE o.attribution_id = r.attribution_id AND o.arm IS r.arm
        AND o.rollout IS r.rollout AND o.rowid < r.rowid)"""
    db.execute(f"DELETE FROM steps WHERE run_id IN ({dupes})")
    db.execute(f"DELETE FROM runs WHERE id IN ({dupes})")
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS runs_branch_unique ON runs("
               "attribution_id, arm, rollout) WHERE attribution_id IS NOT NULL")
    db.execute("""CREATE TABLE IF NOT EXISTS attribution_leases (
        attribution_id TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT, pid INTEGER,
        acquired_at REAL)""")


def applied(db: sqlite_utils.Database) -> set[str]:
    """The names of the migrations ``db`` records as applied."""
    return {str(m.name) for m in MIGRATIONS.applied(db)}


@contextmanager
def one_read(db: sqlite_utils.Database) -> Iterator[None]:
    """Reads that must see one state of the file: read apart, another process creating
    the store could commit between them (its tables without their migration record look
    like a lost migrations table)."""
    db.execute("BEGIN")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


# -- a read-only open --------------------------------------------------------------------------
def check_readable(db: sqlite_utils.Database, path: Path) -> bool:
    """A read-only open migrates nothing: the file must be ours, not newer, and have the
    tables reads need (an older store whose pending migration only adds seals is read
    as it is). Its checks read one state of the file. Whether the store predates sealed
    attributions (its attributions are then read unsealed)."""
    with one_read(db):
        tables = set(db.table_names())
        if db.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
            if tables:
                raise NotACarStore(f"{path} holds tables {sorted(tables)[:5]} that CAR did "
                                   "not create", hint="pass the path of a store CAR wrote")
            raise NotACarStore(f"{path} is not a CAR store",
                               hint="pass the path of a store CAR wrote")
        if not tables:  # marked ours, its tables not made yet: a creator is at work, or died
            raise StoreError(f"{path} is a new CAR store whose tables are not made yet "
                             "(another process may be creating it)",
                             hint="try again in a moment; if it stays so, open it once for "
                                  "writing (RunStore(path)), which makes them")
        if MIGRATIONS.migrations_table not in tables:
            raise CorruptStore.edited_by_hand(f"{path} has lost its migrations table")
        missing = {"runs", "steps", "attributions"} - tables
        if missing:
            raise CorruptStore.edited_by_hand(
                f"{path} has lost its {', '.join(sorted(missing))} table(s)")
        done = applied(db)
        if done - set(MIGRATION_NAMES):
            raise StoreTooNew.migrated_by_newer(path, done - set(MIGRATION_NAMES))
        if MIGRATION_NAMES[0] not in done:
            raise CorruptStore.edited_by_hand(f"{path} has lost the record of its migrations")
        # unsealed attributions are an older store's only when there is no seal column at all
        # (a lost migration record must not turn the seal check off)
        columns = {r[1] for r in db.execute("PRAGMA table_info(attributions)")}
        check_integrity(db, path)
        return "seal" not in columns


def check_integrity(db: sqlite_utils.Database, path: Path) -> None:
    """SQLite's own checks before anything is read: ``quick_check`` over the whole file
    (every page and record well formed), then ``integrity_check`` of ``runs`` and
    ``attributions``, which also compares each index with its table — reads go through
    those indexes (a run by id, an attribution's branches), and an index entry that
    disagrees with its row would silently drop or swap rows, which ``quick_check`` does not
    see. The ``steps`` index is not compared (on a large store that is most of the cost):
    a run's steps are read through it, but a missing, extra or swapped step fails the
    run's chained digests and step count. A problem refuses the whole file, named."""
    for check in ("quick_check(1)", "integrity_check(runs)", "integrity_check(attributions)"):
        found = db.execute(f"PRAGMA {check}").fetchone()
        problem = "no answer" if found is None else str(found[0])
        if problem != "ok":
            raise CorruptStore(f"{path} is damaged: SQLite's integrity check reports "
                               f"{' '.join(problem.split())[:160]!r}",
                               hint="restore it from a copy; reads refuse a damaged file")


# -- a writable open ---------------------------------------------------------------------------
def open_for_writing(db: sqlite_utils.Database, path: Path, timeout: float) -> None:
    """Check the file is ours and migrate it, waiting out other processes doing the same.
    A new file's switch to WAL and its first transactions can meet another opener's lock
    in a way SQLite reports as "database is locked" at once, without its busy handler
    (lock upgrades that could deadlock): retried until ``timeout``, as the busy handler
    would have waited."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _check_ours(db, path)
            _migrate(db, path)
            return
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if not ("locked" in text or "busy" in text) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _check_ours(db: sqlite_utils.Database, path: Path) -> None:
    """Mark a new, empty file as ours, or refuse a file someone else wrote. The check and
    the mark are one transaction, so two processes creating one store do not race."""
    if db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        app_id = db.execute("PRAGMA application_id").fetchone()[0]
        tables = set(db.table_names())
        if app_id != APPLICATION_ID:
            if tables:
                raise NotACarStore(f"{path} already holds tables {sorted(tables)[:5]}"
                                   " that CAR did not create",
                                   hint="use a new file for the CAR store")
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _migrate(db: sqlite_utils.Database, path: Path) -> None:
    with one_read(db):
        done, tables = applied(db), set(db.table_names())
    known = set(MIGRATION_NAMES)
    if not done and "runs" in tables:
        raise CorruptStore.edited_by_hand(f"{path} has lost its migrations table")
    if done - known:
        raise StoreTooNew.migrated_by_newer(path, done - known)
    if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        db.execute("PRAGMA journal_mode = WAL")
    if done != known:
        db.execute("BEGIN IMMEDIATE")  # one writer migrates; the others wait
        try:
            MIGRATIONS.ensure_migrations_table(db)
            for migration in MIGRATIONS.pending(db):
                migration.fn(db)
                # the one private call left: apply() opens its own transaction, and
                # migrating must share the BEGIN IMMEDIATE that makes one writer migrate
                MIGRATIONS._record_applied(db, migration.name)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise


__all__ = ["APPLICATION_ID", "MIGRATIONS", "MIGRATION_NAMES", "applied", "check_integrity",
           "check_readable", "one_read", "open_for_writing"]
