"""Runs, branches and attributions in one SQLite file (via sqlite-utils).

The trajectory lives in the database and nowhere else: a ``runs`` row holds the header (context,
outcome, lineage) and ``steps`` rows hold the steps with their chained digests; ``load`` rebuilds
the ``Trajectory`` and verifies every digest. Branches are runs with a parent. Writes are one
transaction per logical write, the journal is WAL so several processes can write one file, and
the schema evolves through named migrations. A file that CAR did not write, or that a newer CAR
migrated, is refused before anything is written to it.
"""

from __future__ import annotations

import builtins
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sqlite_utils
from sqlite_utils.migrations import Migrations

from ._json import digest, dumps, loads
from .errors import (
    AttributionNotFound,
    CorruptRun,
    NotACarStore,
    RunNotFound,
    StoreError,
    StoreReadOnly,
    StoreTooNew,
)
from .redact import redact, redact_json
from .trajectory import Trajectory
from .vocabulary import AttributionStatus

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


SEALED_COLUMNS = ("id", "parent_id", "attribution_id", "arm", "rollout", "branch_step", "agent",
                  "status", "outcome", "n_steps", "digest", "seed", "created_at")


def _seal(row: dict[str, Any], header: dict[str, Any]) -> str:
    """A digest over what the step digests do not cover: the run's row and header (outcome,
    lineage, status), so a hand-edited outcome is caught like a hand-edited step."""
    def column(name: str) -> Any:  # as SQLite gives it back (REAL and INTEGER affinity)
        value = row[name]
        if value is None or isinstance(value, str):
            return value
        return float(value) if name in ("outcome", "created_at") else int(value)

    return digest({"row": {c: column(c) for c in SEALED_COLUMNS}, "header": header})


def _is_readonly_error(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "readonly" in text or "read-only" in text or "unable to open" in text


class RunStore:
    """``RunStore(path)``: save, load and list runs, branches and attributions."""

    def __init__(self, path: str | os.PathLike[str] = "car.db", *, timeout: float = 30.0) -> None:
        self.path = Path(path)
        try:
            conn = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreReadOnly(f"cannot open {self.path}: {exc}",
                                hint="check the folder exists and is writable") from exc
        self.db = sqlite_utils.Database(conn)
        try:
            self._check_ours()
            self.db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            self._migrate()
        except StoreError:
            conn.close()  # refused before anything was written; do not leak the handle
            raise
        except sqlite3.DatabaseError as exc:
            conn.close()
            if _is_readonly_error(exc):
                raise StoreReadOnly(f"{self.path} is read-only: {exc}",
                                    hint="point --store at a writable file") from exc
            raise NotACarStore(f"{self.path} is not a SQLite database CAR can use: {exc}",
                               hint="pass the path of a CAR store, or a new file") from exc

    # -- opening ---------------------------------------------------------------------------
    def _check_ours(self) -> None:
        app_id = self.db.execute("PRAGMA application_id").fetchone()[0]
        tables = set(self.db.table_names())
        if app_id == APPLICATION_ID:
            return
        if tables:
            raise NotACarStore(f"{self.path} already holds tables {sorted(tables)[:5]} that CAR "
                               "did not create", hint="use a new file for the CAR store")
        self.db.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def _migrate(self) -> None:
        applied = {m.name for m in MIGRATIONS.applied(self.db)}
        known = set(MIGRATION_NAMES)
        unknown = applied - known
        if unknown:
            raise StoreTooNew(f"{self.path} was migrated by a newer CAR ({sorted(unknown)})",
                              hint="upgrade causal-agent-replay to open it")
        if self.db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self.db.execute("PRAGMA journal_mode = WAL")
        if applied != known:
            self.db.execute("BEGIN IMMEDIATE")  # one writer migrates; the others wait
            try:
                MIGRATIONS.ensure_migrations_table(self.db)
                for migration in MIGRATIONS.pending(self.db):
                    migration.fn(self.db)
                    # the one private call left: apply() opens its own transaction, and
                    # migrating must share the BEGIN IMMEDIATE that makes one writer migrate
                    MIGRATIONS._record_applied(self.db, migration.name)
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        self.db.conn.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self) -> Any:
        return _Transaction(self)

    # -- runs ------------------------------------------------------------------------------
    def save(self, run: Trajectory, *, attribution_id: str | None = None) -> str:
        """Store ``run`` (idempotent: saving the same run again changes nothing). A different
        run under an id that is already taken is refused."""
        run.verify()
        existing = self.db.execute("SELECT digest FROM runs WHERE id = ?", [run.id]).fetchone()
        if existing is not None:
            if existing[0] == run.digest:
                return run.id
            raise StoreError(f"a different run is already stored under id {run.id}",
                             run_id=run.id, hint="give the new run a fresh id")
        lineage = run.lineage
        header = {"outcome": run.outcome.to_dict() if run.outcome else None,
                  "lineage": lineage.to_dict() if lineage else None,
                  "meta": redact_json(run.meta),  # error texts and meta may quote a key
                  "error": redact(run.error) if run.error else run.error}
        row = {"id": run.id, "parent_id": lineage.parent_id if lineage else None,
               "attribution_id": attribution_id or (lineage.attribution_id if lineage else None),
               "arm": lineage.arm if lineage else None,
               "rollout": lineage.rollout if lineage else None,
               "branch_step": lineage.branch_step if lineage else None, "agent": run.agent,
               "status": run.status, "outcome": run.outcome.value if run.outcome else None,
               "n_steps": len(run.steps), "digest": run.digest, "seed": run.seed,
               "created_at": run.created_at, "context": dumps(run.context),
               "header": dumps(header)}
        header["seal"] = _seal(row, header)
        row["header"] = dumps(header)
        steps = [{"run_id": run.id, "idx": s.index, "digest": s.digest, "action": dumps(s.action),
                  "observation": dumps(s.observation), "observed": int(s.observed),
                  "state": dumps(s.state), "meta": dumps(s.meta)} for s in run.steps]
        with self._write():
            self.db.table("runs").insert(row)
            if steps:
                self.db.table("steps").insert_all(steps)
        return run.id

    def exists(self, run_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM runs WHERE id = ?", [run_id]).fetchone() is not None

    def load(self, run_id: str) -> Trajectory:
        """The stored run, digests verified. Raises RunNotFound / CorruptRun."""
        rows = list(self.db.query("SELECT * FROM runs WHERE id = ?", [run_id]))
        if not rows:
            raise RunNotFound(f"no run {run_id!r} in {self.path}", run_id=run_id,
                              hint="list the stored runs with `car runs` or RunStore.list()")
        row = rows[0]
        try:
            header = loads(row["header"] or "{}")
            steps = [{"index": s["idx"], "digest": s["digest"], "action": loads(s["action"]),
                      "observation": loads(s["observation"]), "observed": bool(s["observed"]),
                      "state": loads(s["state"]), "meta": loads(s["meta"])}
                     for s in self.db.query("SELECT * FROM steps WHERE run_id = ? ORDER BY idx",
                                            [run_id])]
            data = {"id": row["id"], "context": loads(row["context"]), "steps": steps,
                    "outcome": header.get("outcome"), "seed": row["seed"],
                    "agent": row["agent"] or "", "status": row["status"],
                    "error": header.get("error"), "lineage": header.get("lineage"),
                    "meta": header.get("meta") or {}, "created_at": row["created_at"]}
        except (ValueError, TypeError, AttributeError) as exc:
            raise CorruptRun(f"stored run does not parse: {exc}", run_id=run_id,
                             hint="the database was edited by hand; record the run again") from exc
        seal = header.pop("seal", None)  # every save writes one: a missing seal was removed
        if seal != _seal(row, header):
            raise CorruptRun("the stored header (outcome, lineage, status …) was changed after "
                             "saving", run_id=run_id,
                             hint="the database was edited by hand; record the run again")
        run = Trajectory.from_dict(data)
        if len(run.steps) != row["n_steps"] or run.digest != row["digest"]:
            raise CorruptRun("stored run is incomplete or its digest changed", run_id=run_id,
                             hint="the database was edited by hand; record the run again")
        return run

    def list(self, *, branches: bool = False, limit: int | None = None) -> list[dict[str, Any]]:
        """Summaries of stored runs, newest first (only recorded runs unless ``branches``)."""
        where = "" if branches else "WHERE parent_id IS NULL"
        sql = (f"SELECT id, created_at, agent, status, outcome, n_steps, parent_id, seed "
               f"FROM runs {where} ORDER BY created_at DESC, rowid DESC")
        if limit:
            sql += f" LIMIT {int(limit)}"
        return list(self.db.query(sql))

    def with_digest(self, digest: str) -> builtins.list[str]:
        """Ids of the recorded runs (not branches) whose content digest is ``digest``, oldest
        first: the same steps imported or recorded again."""
        return [r[0] for r in self.db.execute(
            "SELECT id FROM runs WHERE digest = ? AND parent_id IS NULL ORDER BY rowid",
            [digest]).fetchall()]

    def children(self, run_id: str) -> builtins.list[dict[str, Any]]:
        """Branches whose parent is ``run_id``."""
        return list(self.db.query("SELECT id, arm, rollout, branch_step, outcome, attribution_id "
                                  "FROM runs WHERE parent_id = ? ORDER BY rowid", [run_id]))

    # -- attributions ----------------------------------------------------------------------
    def begin_attribution(self, run_id: str, method: str, params: dict[str, Any],
                          attribution_id: str | None = None) -> str:
        if not self.exists(run_id):
            raise RunNotFound(f"no run {run_id!r} in {self.path}", run_id=run_id,
                              hint="save the run before attributing it")
        aid = attribution_id or uuid.uuid4().hex[:16]
        with self._write():
            self.db.table("attributions").upsert(
                {"id": aid, "run_id": run_id, "method": method, "status": AttributionStatus.RUNNING,
                 "params": dumps(redact_json(params)), "result": None, "created_at": time.time(),
                 "finished_at": None}, pk="id")
        return aid

    def finish_attribution(self, attribution_id: str, result: dict[str, Any],
                           status: str = AttributionStatus.COMPLETE) -> None:
        with self._write():
            self.db.table("attributions").update(attribution_id, {
                "result": dumps(redact_json(result)), "status": status, "finished_at": time.time()})

    def save_attribution(self, run_id: str, method: str, params: dict[str, Any],
                         result: dict[str, Any], status: str = AttributionStatus.COMPLETE) -> str:
        aid = self.begin_attribution(run_id, method, params)
        self.finish_attribution(aid, result, status)
        return aid

    def attribution(self, attribution_id: str) -> dict[str, Any]:
        rows = list(self.db.query("SELECT * FROM attributions WHERE id = ?", [attribution_id]))
        if not rows:
            raise AttributionNotFound(f"no attribution {attribution_id!r} in {self.path}",
                                      hint="list them with RunStore.attributions(run_id)")
        row = dict(rows[0])
        row["params"] = loads(row["params"] or "{}")
        row["result"] = loads(row["result"]) if row["result"] else None
        return row

    def attributions(self, run_id: str) -> builtins.list[dict[str, Any]]:
        return [self.attribution(r["id"]) for r in self.db.query(
            "SELECT id FROM attributions WHERE run_id = ? ORDER BY created_at", [run_id])]

    def merge(self, path: str | os.PathLike[str]) -> int:
        """Copy every run, step and attribution of the CAR store at ``path`` into this one, in
        one transaction (rows already here are kept: ids are unique, saves idempotent). For
        stores written in parallel, such as one per test worker. Returns the runs copied."""
        other = RunStore(path)  # refuses a file that is not a CAR store, or a newer one
        other.close()
        tables = ("runs", "steps", "attributions")
        before = self.db.execute("SELECT count(*) FROM runs").fetchone()[0]
        self.db.execute("ATTACH DATABASE ? AS merged", [str(path)])
        try:
            with self._write():
                for table in tables:
                    cols = ", ".join(f'"{c}"' for c in self.db.table(table).columns_dict)
                    self.db.execute(f"INSERT OR IGNORE INTO main.{table} ({cols}) "
                                    f"SELECT {cols} FROM merged.{table}")
        finally:
            self.db.execute("DETACH DATABASE merged")
        return int(self.db.execute("SELECT count(*) FROM runs").fetchone()[0] - before)

    def branches(self, attribution_id: str) -> Iterator[dict[str, Any]]:
        """The branches an attribution has stored so far: arm, rollout, outcome, run id."""
        yield from self.db.query("SELECT id, arm, rollout, outcome FROM runs WHERE "
                                 "attribution_id = ? ORDER BY arm, rollout", [attribution_id])


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT``: one logical write, all or nothing."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    def __enter__(self) -> None:
        try:
            self.store.db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _is_readonly_error(exc):
                raise StoreReadOnly(f"{self.store.path} is read-only: {exc}",
                                    hint="point the store at a writable file") from exc
            raise StoreError(f"cannot write {self.store.path}: {exc}",
                             hint="another process may hold a long write lock; try again") from exc

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self.store.db.execute("COMMIT")
            except sqlite3.OperationalError as err:
                self.store.db.execute("ROLLBACK")
                if _is_readonly_error(err):
                    raise StoreReadOnly(f"{self.store.path} is read-only: {err}") from err
                raise
        else:
            self.store.db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError) and _is_readonly_error(exc):
                raise StoreReadOnly(f"{self.store.path} is read-only: {exc}",
                                    hint="point the store at a writable file") from exc
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"writing {self.store.path} failed: {exc}",
                                 hint="nothing was written; check the disk and try again"
                                 ) from exc


class StoreJournal:
    """Keeps an attribution's branches in the store as they finish, so a killed attribution
    resumes without re-running them (``car_core.execution.Journal``)."""

    def __init__(self, store: RunStore, attribution_id: str) -> None:
        self.store = store
        self.attribution_id = attribution_id

    def lookup(self, task: Any) -> Trajectory | None:
        row = self.store.db.execute(
            "SELECT id FROM runs WHERE attribution_id = ? AND arm = ? AND rollout = ?",
            [self.attribution_id, task.arm, task.rollout]).fetchone()
        return self.store.load(row[0]) if row else None

    def write(self, task: Any, result: Trajectory) -> None:
        self.store.save(result, attribution_id=self.attribution_id)
