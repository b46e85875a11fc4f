"""Runs, branches and attributions in one SQLite file (via sqlite-utils).

The trajectory lives in the database and nowhere else: a ``runs`` row holds the header (context,
outcome, lineage) and ``steps`` rows hold the steps with their chained digests; ``load`` rebuilds
the ``Trajectory`` and verifies every digest. Branches are runs with a parent. Writes are one
transaction per logical write, the journal is WAL so several processes can write one file, and
the schema evolves through named migrations (``schema``). A file that CAR did not write, or that
a newer CAR migrated, is refused before anything is written to it.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from car_core.errors import (
    AttributionNotFound,
    CorruptAttribution,
    CorruptRun,
    InvalidInput,
    NotACarStore,
    RunNotFound,
    StoreError,
    StoreReadOnly,
)
from car_core.model.endings import stopped_by
from car_core.model.json_values import dumps, loads
from car_core.model.trajectory import Trajectory
from car_core.model.vocabulary import AttributionStatus
from car_core.results import Result
from car_core.secrets.redact import redact_json
from car_core.store._deps import sqlite_utils
from car_core.store.failures import Transaction, damaged_file, guarded, is_readonly_error
from car_core.store.leases import Leases, drop_lease_row, running_now
from car_core.store.readonly import connect_readonly, unreadable_now
from car_core.store.rows import Attribution, attribution_from_row, run_from_rows, run_rows
from car_core.store.schema import MIGRATIONS, check_readable, open_for_writing
from car_core.store.seals import (
    SEALED_COLUMNS,
    SUMMARY_COLUMNS,
    attribution_seal,
    damaged_rows,
    row_problem,
    shown_id,
)


class RunStore:
    """``RunStore(path)``: save, load and list runs, branches and attributions."""

    def __init__(self, path: str | os.PathLike[str] = "car.db", *, timeout: float = 30.0,
                 readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.legacy = False  # a store that predates sealed attributions (read-only opens)
        self._scratch: Any = None  # a private copy a read-only open reads from, if any
        self._leases = Leases()  # a store dropped unclosed holds none
        if readonly:
            conn, self._scratch = connect_readonly(self.path, timeout)
        else:
            try:
                # handed to another thread (asyncio.to_thread(car.contrastive, ..., store=s),
                # as an app with MCP servers must call it); one thread at a time uses it
                conn = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None,
                                       check_same_thread=False)
            except sqlite3.Error as exc:
                raise StoreReadOnly(f"cannot open {self.path}: {exc}",
                                    hint="check the folder exists and is writable") from exc
        self.db = sqlite_utils.Database(conn)
        try:
            self.db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            if readonly:
                self._check_readable()
            else:
                open_for_writing(self.db, self.path, timeout)
        except StoreError:
            conn.close()  # refused before anything was written; do not leak the handle
            self._drop_scratch()
            raise
        except (sqlite3.DatabaseError, UnicodeError) as exc:
            conn.close()
            self._drop_scratch()
            if readonly and isinstance(exc, sqlite3.OperationalError):
                refusal = unreadable_now(self.path, exc)
                if refusal is not None:
                    raise refusal from None
            if isinstance(exc, sqlite3.Error) and is_readonly_error(exc):
                raise StoreReadOnly(f"{self.path} is read-only: {exc}",
                                    hint="point --store at a writable file") from exc
            if "malformed" in str(exc) or isinstance(exc, UnicodeError):
                raise damaged_file(self.path, exc) from None
            raise NotACarStore(f"{self.path} is not a SQLite database CAR can use: {exc}",
                               hint="pass the path of a CAR store, or a new file") from exc

    def _check_readable(self) -> None:
        """A read-only open checks the file and migrates nothing (``schema.check_readable``)."""
        self.legacy = check_readable(self.db, self.path)

    def _drop_scratch(self) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def close(self) -> None:
        """Close the connection; leases still held are freed first (nothing can finish them
        now), best effort: a store that cannot write leaves them to the pid check."""
        for aid in self._leases.held():
            try:
                self.release_attribution(aid)
            except StoreError:
                self._leases.forget(aid)
        self.db.conn.close()
        self._drop_scratch()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self) -> Transaction:
        if self.readonly:
            raise StoreReadOnly(f"{self.path} was opened read-only",
                                hint="open it with RunStore(path) to write")
        return Transaction(self.db, self.path)

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
        row, steps = run_rows(run, attribution_id)
        with self._write():
            if row["attribution_id"] is not None and self.db.execute(
                    "SELECT 1 FROM runs WHERE attribution_id = ? AND arm IS ? AND rollout IS ?",
                    [row["attribution_id"], row["arm"], row["rollout"]]).fetchone():
                raise StoreError(f"attribution {row['attribution_id']} already holds a branch "
                                 f"for arm {row['arm']!r} rollout {row['rollout']!r}",
                                 run_id=run.id, hint="each (arm, rollout) of an attribution "
                                                     "is run once; resume it instead")
            self.db.table("runs").insert(row)
            if steps:
                self.db.table("steps").insert_all(steps)
        return run.id

    @guarded
    def exists(self, run_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM runs WHERE id = ?", [run_id]).fetchone() is not None

    @guarded
    def load(self, run_id: str) -> Trajectory:
        """The stored run, digests verified. Raises RunNotFound / CorruptRun, and InvalidInput
        for an id that is no string (a listing's row was read as a damaged file)."""
        if not isinstance(run_id, str):
            raise InvalidInput(f"RunStore.load takes a run id, got {type(run_id).__name__}",
                               hint="pass the id: store.load(row['id']) for a row of "
                                    "store.runs()")
        rows = list(self.db.query("SELECT * FROM runs WHERE id = ?", [run_id]))
        if not rows:
            raise RunNotFound(f"no run {run_id!r} in {self.path}", run_id=run_id,
                              hint="list the stored runs with `car runs` or RunStore.runs()")
        row = rows[0]
        if row["id"] != run_id:  # a lookup through a damaged index can land on another row
            raise CorruptRun("the store's index of run ids points at another row",
                             run_id=run_id, hint="the file is damaged; restore it from a copy")
        steps = self.db.query("SELECT * FROM steps WHERE run_id = ? ORDER BY idx", [run_id])
        return run_from_rows(row, steps)

    @guarded
    def runs(self, *, branches: bool = False, limit: int | None = None) -> list[dict[str, Any]]:
        """Summaries of stored runs, newest first (only recorded runs unless ``branches``),
        each row's seal checked: a damaged row raises ``CorruptRun`` naming it."""
        rows, damaged = self.scan(branches=branches, limit=limit)
        if damaged:
            raise damaged_rows(damaged, len(rows))
        return rows

    @guarded
    def scan(self, *, branches: bool = False, limit: int | None = None
             ) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
        """Like ``runs``, but a damaged row does not hide the others: the intact summaries,
        and ``(id, what is wrong)`` for each row whose seal or types do not check."""
        where = "" if branches else "WHERE parent_id IS NULL"
        sql = (f"SELECT {', '.join(SEALED_COLUMNS)}, header FROM runs {where} "
               "ORDER BY created_at DESC, rowid DESC")
        if limit:
            sql += f" LIMIT {min(int(limit), 2**63 - 1)}"
        return self._checked(sql, [], SUMMARY_COLUMNS)

    def _checked(self, sql: str, params: list[Any], keys: tuple[str, ...]
                 ) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
        """Rows of ``runs`` (every sealed column and the header selected) whose seal checks,
        cut to ``keys``, and the damaged ones by id."""
        intact, damaged = [], []
        for row in self.db.query(sql, params):
            wrong = row_problem(row)
            if wrong is None:
                summary = {k: row[k] for k in keys}
                if keys is SUMMARY_COLUMNS:  # which test recorded it, from the sealed header
                    header = loads(row["header"] or "{}")
                    meta = header.get("meta") or {}
                    test = meta.get("test") if isinstance(meta, dict) else None
                    summary["test"] = test if isinstance(test, str) else None
                    session = meta.get("test_session") if isinstance(meta, dict) else None
                    if isinstance(session, str):  # the pytest session that recorded it
                        summary["test_session"] = session
                    # what it was asked (sealed in the header when it was saved): an eval
                    # set's runs recorded at once share a second
                    asked = header.get("input")
                    summary["input"] = asked if isinstance(asked, str) else None
                    # how it ended beyond its status: a run stopped by design says so
                    error = header.get("error")
                    summary["error"] = error if isinstance(error, str) else None
                    summary["stopped_by"] = stopped_by(meta if isinstance(meta, dict) else None)
                intact.append(summary)
            else:
                damaged.append((shown_id(row.get("id")), wrong))
        return intact, damaged

    @guarded
    def with_digest(self, digest: str) -> list[str]:
        """Ids of the recorded runs (not branches) whose content digest is ``digest``, oldest
        first: the same steps imported or recorded again."""
        return [r[0] for r in self.db.execute(
            "SELECT id FROM runs WHERE digest = ? AND parent_id IS NULL ORDER BY rowid",
            [digest]).fetchall()]

    @guarded
    def children(self, run_id: str) -> list[dict[str, Any]]:
        """Branches whose parent is ``run_id`` (seals checked: ``CorruptRun`` names a damaged
        one)."""
        return self._verified(f"SELECT {', '.join(SEALED_COLUMNS)}, header FROM runs WHERE "
                              "parent_id = ? ORDER BY rowid", [run_id],
                              ("id", "arm", "rollout", "branch_step", "outcome",
                               "attribution_id"))

    def _verified(self, sql: str, params: list[Any], keys: tuple[str, ...]
                  ) -> list[dict[str, Any]]:
        rows, damaged = self._checked(sql, params, keys)
        if damaged:
            raise damaged_rows(damaged, len(rows))
        return rows

    # -- attributions ----------------------------------------------------------------------
    # An attribution row is sealed like a run (``seal``: a digest of the row as stored). A
    # resume adds branches but leaves the stored result, status and params alone until it has
    # a new result; one estimate at a time may run an attribution (``leases``).
    @guarded
    def begin_attribution(self, run_id: str, method: str, params: dict[str, Any],
                          attribution_id: str | None = None) -> str:
        """Start (or resume) an attribution and take its lease: ``AttributionBusy`` when a
        live claim holds it (another process, or another thread or connection of this one).
        A stored attribution's result is not touched here."""
        if not self.exists(run_id):
            raise RunNotFound(f"no run {run_id!r} in {self.path}", run_id=run_id,
                              hint="save the run before attributing it")
        aid = attribution_id or uuid.uuid4().hex[:16]
        claimed = False
        try:
            with self._write():
                self._leases.claim(self.db, aid)
                claimed = True
                self._begin_row(aid, run_id, method, params)
        except BaseException:
            if claimed:
                self._leases.forget(aid)  # rolled back: the claim never happened
            raise
        return aid

    def _begin_row(self, aid: str, run_id: str, method: str, params: dict[str, Any]) -> None:
        existing = self.db.execute("SELECT 1 FROM attributions WHERE id = ?", [aid]).fetchone()
        if existing is None:
            row = {"id": aid, "run_id": run_id, "method": method,
                   "status": str(AttributionStatus.RUNNING),
                   "params": dumps(redact_json(params)), "result": None,
                   "created_at": time.time(), "finished_at": None}
            row["seal"] = attribution_seal(row)
            self.db.table("attributions").insert(row, pk="id")

    @guarded
    def claim_lease(self, attribution_id: str) -> None:
        """Take ``attribution_id``'s lease (a triage's or population fix's, whose rows
        ``begin_attribution`` does not write), or raise ``AttributionBusy``; given up with
        ``release_attribution``."""
        claimed = False
        try:
            with self._write():
                self._leases.claim(self.db, attribution_id)
                claimed = True
        except BaseException:
            if claimed:
                self._leases.forget(attribution_id)  # rolled back: the claim never happened
            raise

    def holds(self, attribution_id: str) -> bool:
        """Whether this store holds the lease of ``attribution_id`` (it began it and has not
        finished, released or closed since)."""
        return attribution_id in self._leases

    @guarded
    def running_now(self, attribution_id: str) -> bool:
        """Whether the attribution's estimate may be running now (a live lease holds it)."""
        return running_now(self.db, attribution_id)

    def status_said(self, attribution: Attribution) -> str:
        """The attribution's status as every surface says it: one stored as running with no
        live claim stopped, and waits for a resume ("interrupted")."""
        status = str(attribution.status)
        return ("interrupted" if status == AttributionStatus.RUNNING
                and not self.running_now(attribution.id) else status)

    def release_attribution(self, attribution_id: str) -> None:
        """Give up this store's lease on an attribution (its branches and result stay)."""
        owner = self._leases.forget(attribution_id)
        if owner is None:
            return
        with self._write():
            drop_lease_row(self.db, attribution_id, owner)

    @guarded
    def drop_empty_attribution(self, attribution_id: str) -> bool:
        """Remove an attribution that stopped before it stored anything (still ``running``,
        no result, no branch) and that no claim holds: a row that promises a resume with
        nothing in it, left by an estimate that failed in a way a resume would repeat (an
        error in the outcome function, say). Anything stored keeps it. Whether it was
        removed."""
        if self.holds(attribution_id):
            return False
        with self._write():
            gone = self.db.execute(
                "DELETE FROM attributions WHERE id = ? AND status = ? AND result IS NULL "
                "AND NOT EXISTS (SELECT 1 FROM runs WHERE attribution_id = ?) "
                "AND NOT EXISTS (SELECT 1 FROM attribution_leases WHERE attribution_id = ?)",
                [attribution_id, str(AttributionStatus.RUNNING), attribution_id,
                 attribution_id]).rowcount
        return bool(gone)

    @guarded
    def finish_attribution(self, attribution_id: str, result: Result,
                           status: str = AttributionStatus.COMPLETE,
                           params: dict[str, Any] | None = None, replace: bool = False
                           ) -> None:
        """Store the attribution's result as its JSON (a complete result is never replaced by
        a truncated one, unless ``replace``: the caller asked for a smaller estimate knowingly)
        and free its lease, in one transaction."""
        with self._write():
            rows = list(self.db.query("SELECT * FROM attributions WHERE id = ?",
                                      [attribution_id]))
            if not rows:
                raise AttributionNotFound(f"no attribution {attribution_id!r} in {self.path}",
                                          hint="start it with begin_attribution")
            row = dict(rows[0])
            complete = AttributionStatus.COMPLETE
            if replace or not (row["status"] == complete and status != complete):
                row.update(result=dumps(redact_json(result.to_dict())), status=str(status),
                           finished_at=time.time())
                if params is not None:
                    row["params"] = dumps(redact_json(params))
                row["seal"] = attribution_seal(row)
                self.db.table("attributions").update(attribution_id, {
                    k: row[k] for k in ("result", "status", "finished_at", "params", "seal")})
            self._leases.free(self.db, attribution_id)

    def save_attribution(self, run_id: str, method: str, params: dict[str, Any],
                         result: Result, status: str = AttributionStatus.COMPLETE) -> str:
        aid = self.begin_attribution(run_id, method, params)
        self.finish_attribution(aid, result, status)
        return aid

    @guarded
    def attribution_exists(self, attribution_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM attributions WHERE id = ?",
                               [attribution_id]).fetchone() is not None

    @guarded
    def attribution(self, attribution_id: str) -> Attribution:
        """The stored attribution, its seal checked (``CorruptAttribution`` when edited) and
        its result read back as the estimator's result object."""
        rows = list(self.db.query("SELECT * FROM attributions WHERE id = ?", [attribution_id]))
        if not rows:
            raise AttributionNotFound(f"no attribution {attribution_id!r} in {self.path}",
                                      hint="list them with `car attributions RUN_ID` or "
                                           "RunStore.attributions()")
        row = dict(rows[0])
        if row["id"] != attribution_id:  # a lookup through a damaged index
            raise CorruptAttribution(f"the store's index of attribution ids points at another "
                                     f"row than {attribution_id}",
                                     hint="the file is damaged; restore it from a copy")
        return attribution_from_row(row, sealed=not self.legacy)

    @guarded
    def attributions(self, run_id: str | None = None) -> list[Attribution]:
        """Attributions of ``run_id`` (every run's when None), oldest first."""
        return [self.attribution(aid) for aid in self.attribution_ids(run_id)]

    @guarded
    def attribution_ids(self, run_id: str | None = None) -> list[str]:
        """Ids of the attributions of ``run_id`` (every run's when None), oldest first, read
        without their rows, so one damaged row can be named while the others are read."""
        if run_id is None:
            ids = self.db.execute("SELECT id FROM attributions ORDER BY created_at, rowid")
        else:
            ids = self.db.execute("SELECT id FROM attributions WHERE run_id = ? "
                                  "ORDER BY created_at, rowid", [run_id])
        return [shown_id(r[0]) for r in ids.fetchall()]

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

    @guarded
    def branches(self, attribution_id: str) -> list[dict[str, Any]]:
        """The branches an attribution has stored so far: arm, rollout, outcome, run id. How
        many there are is only as good as the rows that say so: every row that names this
        attribution or its run as its own is checked, so a branch whose attribution id was
        edited away is named (``CorruptRun``) rather than silently not counted."""
        found = self.db.execute("SELECT run_id FROM attributions WHERE id = ?",
                                [attribution_id]).fetchone()
        rows, damaged = self._checked(
            f"SELECT {', '.join(SEALED_COLUMNS)}, header FROM runs WHERE attribution_id = ? "
            "OR parent_id = ? ORDER BY arm, rollout",
            [attribution_id, found[0] if found else None],
            ("id", "arm", "rollout", "outcome", "attribution_id"))
        if damaged:
            raise damaged_rows(damaged, len(rows))
        return [{k: r[k] for k in ("id", "arm", "rollout", "outcome")} for r in rows
                if r["attribution_id"] == attribution_id]


def _deprecated_list(self: RunStore, *, branches: bool = False, limit: int | None = None
                     ) -> list[dict[str, Any]]:
    """Deprecated name of ``RunStore.runs`` (it shadowed the built-in ``list`` in the class)."""
    warnings.warn("RunStore.list() is deprecated and will be removed; use RunStore.runs()",
                  DeprecationWarning, stacklevel=2)
    return self.runs(branches=branches, limit=limit)


# Set after the class, so that ``list`` inside the class body is still the built-in.
# (setattr: mypy refuses a plain assignment of an attribute the class does not declare)
setattr(RunStore, "list", _deprecated_list)  # noqa: B010


__all__ = ["MIGRATIONS", "Attribution", "RunStore", "damaged_rows"]
