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
import functools
import math
import os
import socket
import sqlite3
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from car_core.errors import (
    AttributionBusy,
    AttributionNotFound,
    CarError,
    CorruptAttribution,
    CorruptRun,
    CorruptStore,
    InvalidInput,
    NotACarStore,
    RunNotFound,
    StoreError,
    StoreReadOnly,
    StoreTooNew,
)
from car_core.model.json_values import digest, dumps, loads
from car_core.model.trajectory import Trajectory
from car_core.model.vocabulary import AttributionStatus
from car_core.results import Result, result_from_dict
from car_core.secrets.redact import redact, redact_json
from car_core.store._deps import sqlite_utils
from car_core.store._deps import sqlite_utils_migrations as Migrations

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
                   [_attribution_seal(row), row["id"]])
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


ATTRIBUTION_SEALED = ("id", "run_id", "method", "status", "params", "result", "created_at",
                      "finished_at")


def _attribution_seal(row: dict[str, Any]) -> str:
    """A digest over an attribution row as stored, so an edited locus or status is caught."""
    def column(name: str) -> Any:
        value = row.get(name)
        if value is None or isinstance(value, str):
            return value
        return float(value)
    return digest({"attribution": {c: column(c) for c in ATTRIBUTION_SEALED}})


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


SUMMARY_COLUMNS = ("id", "created_at", "agent", "status", "outcome", "n_steps", "parent_id",
                   "seed")
_LAST_DATE = 253402300800  # 10000-01-01: a created_at past it is not a date


def _row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with a ``runs`` row read without its steps (None: its seal checks and
    every shown column has its type): the columns a listing shows are trusted only so."""
    try:
        header = loads(row["header"] or "{}")
        if not isinstance(header, dict):
            return "its header is not an object"
        seal = header.pop("seal", None)
        if seal != _seal(row, header):
            return "its row (outcome, agent, status, lineage …) was changed after saving"
    except _DAMAGE as exc:
        return f"it does not parse ({type(exc).__name__})"
    for key in ("created_at", "outcome"):
        value = row[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            return f"its {key} {str(value)[:40]!r} is not a number"
    if row["created_at"] is not None and not 0 <= row["created_at"] < _LAST_DATE:
        return f"its created_at {row['created_at']!r} is not a date"
    for key in ("id", "agent", "status", "parent_id"):
        if row[key] is not None and not isinstance(row[key], str):
            return f"its {key} is not text"
    for key in ("n_steps", "seed"):
        if row[key] is not None and (isinstance(row[key], bool) or not isinstance(row[key], int)):
            return f"its {key} is not an integer"
    return None


def _shown_id(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)[:40]


def damaged_rows(damaged: builtins.list[tuple[str, str]], intact: int) -> CorruptRun:
    """One error for the damaged runs rows of a listing: the first by name, with how many."""
    run_id, wrong = damaged[0]
    more = f" ({len(damaged) - 1} more damaged row(s))" if len(damaged) > 1 else ""
    return CorruptRun(f"stored run {run_id} is damaged: {wrong}{more}; {intact} other row(s) "
                      "are intact", run_id=None,
                      hint="the database was edited by hand or damaged; the other runs stay "
                           "readable; record this one again or restore it from a copy")


def _is_readonly_error(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "readonly" in text or "read-only" in text or "unable to open" in text


F = TypeVar("F", bound=Callable[..., Any])
# What a damaged file or a hand-edited value raises while it is read: SQLite's own errors
# (a malformed page, a dropped table, text that is not UTF-8) and what parsing a stored value
# can raise (a JSON nested too deep, a number out of range, a string where a number belongs).
_DAMAGE = (sqlite3.DatabaseError, ValueError, TypeError, OverflowError, RecursionError,
           UnicodeError, KeyError, AttributeError)


def _guarded(fn: F) -> F:
    """A store method whose damage becomes a ``CorruptStore`` (our own errors pass through)."""
    @functools.wraps(fn)
    def wrapper(self: RunStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except CarError:
            raise
        except sqlite3.OperationalError as exc:
            if _is_readonly_error(exc):
                raise StoreReadOnly(f"{self.path} is read-only: {exc}",
                                    hint="point the store at a writable file") from None
            raise self._damaged(exc) from None
        except _DAMAGE as exc:
            raise self._damaged(exc) from None
    return wrapper  # type: ignore[return-value]


_WAL_MAGIC = (0x377F0682, 0x377F0683)


def _wal_checksum(data: bytes, big_endian: bool) -> tuple[int, int]:
    """SQLite's WAL checksum over ``data`` (a multiple of 8 bytes)."""
    import struct
    words = struct.unpack((">" if big_endian else "<") + f"{len(data) // 4}I", data)
    s0 = s1 = 0
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def _wal_may_hold_frames(wal: Path) -> bool:
    """Whether SQLite would read anything from ``wal``: a WAL whose header is not valid (wrong
    magic, version or checksum) or that is too short for one frame is ignored whole."""
    import struct
    try:
        with wal.open("rb") as f:
            head = f.read(32)
        size = wal.stat().st_size
    except OSError:
        return True  # cannot tell: read it the careful way
    if len(head) < 32:
        return False
    magic, version, page_size = struct.unpack(">III", head[:12])
    if magic not in _WAL_MAGIC or version != 3007000:
        return False
    if _wal_checksum(head[:24], big_endian=magic & 1 == 1) != struct.unpack(">II", head[24:]):
        return False
    return bool(size >= 32 + 24 + int(page_size))


def _read_plan(path: Path) -> str:
    """How a read-only open reads ``path`` without writing beside it or trusting an
    unfinished write: ``"locked"`` (``mode=ro``: SQLite's locks and journals are honoured —
    a rollback-journal file, a hot ``-journal``, a live WAL with its ``-shm``), ``"immutable"``
    (a WAL-mode file with no ``-wal``, or a ``-wal`` SQLite would ignore, and no ``-journal``:
    the file alone holds every committed write, and ``mode=ro`` would create the ``-wal`` and
    ``-shm``), or ``"copy"`` (a WAL with frames but no ``-shm``: see ``_private_copy``)."""
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    if Path(f"{path}-journal").exists():
        return "locked"
    if wal.exists():  # mode=ro beside a -wal without its -shm would create the -shm
        if shm.exists():
            return "locked"
        return "copy" if _wal_may_hold_frames(wal) else "immutable"
    try:
        with path.open("rb") as f:
            header = f.read(20)
    except OSError:
        return "locked"
    is_wal_file = len(header) == 20 and header[:16] == b"SQLite format 3\x00" and header[18] == 2
    return "immutable" if is_wal_file else "locked"


@dataclass(frozen=True)
class Attribution:
    """A stored attribution: the run and method, how far it got (``status``), the parameters
    it was run with, and its result (None until one is stored)."""

    id: str
    run_id: str
    method: str
    status: AttributionStatus
    params: dict[str, Any]
    result: Result | None
    created_at: float | None = None
    finished_at: float | None = None


class RunStore:
    """``RunStore(path)``: save, load and list runs, branches and attributions."""

    def __init__(self, path: str | os.PathLike[str] = "car.db", *, timeout: float = 30.0,
                 readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.legacy = False  # a store that predates sealed attributions (read-only opens)
        self._scratch: Any = None  # a private copy a read-only open reads from, if any
        self._leases: dict[str, str] = {}  # attribution id -> owner of this store's live claim
        weakref.finalize(self, _drop_live, self._leases)  # a store dropped unclosed holds none
        if readonly:
            try:
                conn = self._connect_readonly(timeout)
            except BaseException:  # a failed or interrupted copy: remove it now, not at exit
                self._drop_scratch()
                raise
        else:
            try:
                conn = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None)
            except sqlite3.Error as exc:
                raise StoreReadOnly(f"cannot open {self.path}: {exc}",
                                    hint="check the folder exists and is writable") from exc
        self.db = sqlite_utils.Database(conn)
        try:
            self.db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            if readonly:
                self._check_readable()
            else:
                self._open_for_writing(timeout)
        except StoreError:
            conn.close()  # refused before anything was written; do not leak the handle
            self._drop_scratch()
            raise
        except (sqlite3.DatabaseError, UnicodeError) as exc:
            conn.close()
            self._drop_scratch()
            if readonly and isinstance(exc, sqlite3.OperationalError):
                refusal = self._unreadable_now(exc)
                if refusal is not None:
                    raise refusal from None
            if isinstance(exc, sqlite3.Error) and _is_readonly_error(exc):
                raise StoreReadOnly(f"{self.path} is read-only: {exc}",
                                    hint="point --store at a writable file") from exc
            if "malformed" in str(exc) or isinstance(exc, UnicodeError):
                raise self._damaged(exc) from None
            raise NotACarStore(f"{self.path} is not a SQLite database CAR can use: {exc}",
                               hint="pass the path of a CAR store, or a new file") from exc

    # -- opening ---------------------------------------------------------------------------
    def _connect_readonly(self, timeout: float) -> sqlite3.Connection:
        """Read without writing anything: no new file, no ``-wal``/``-shm`` left behind, and
        never an uncommitted write read as committed (``_read_plan`` says how)."""
        if not self.path.is_file():
            raise StoreError(f"no CAR store at {self.path}",
                             hint="record a run first (`car demo` writes ./car.db) or pass "
                                  "--store PATH")
        if self.path.stat().st_size == 0:
            raise NotACarStore(f"{self.path} is an empty file, not a CAR store",
                               hint="pass the path of a CAR store (an empty file is never "
                                    "turned into one by a read command)")
        plan = _read_plan(self.path)
        source = self.path.resolve()
        if plan == "copy":
            source = self._private_copy()
        uri = (f"file:{urllib.parse.quote(str(source))}?mode=ro"
               + ("&immutable=1" if plan == "immutable" else ""))
        try:
            return sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreReadOnly(f"cannot read {self.path}: {exc}",
                                hint="check the file and its folder are readable") from exc

    def _private_copy(self) -> Path:
        """The file and its ``-wal`` copied to a folder of our own: reading committed frames
        of a WAL whose ``-shm`` is gone needs a new ``-shm``, which is made there, not beside
        the user's file. Removed on ``close``, when the store is dropped, on an open that
        fails, and at interpreter exit (the folder's finalizer); the ``car`` command turns
        SIGTERM into an exception so that a killed read unwinds to these too."""
        import shutil
        import tempfile
        folder = tempfile.TemporaryDirectory(prefix="car-read-")
        self._scratch = folder
        target = Path(folder.name) / "car.db"
        shutil.copyfile(self.path, target)
        shutil.copyfile(f"{self.path}-wal", f"{target}-wal")
        return target

    def _unreadable_now(self, exc: sqlite3.OperationalError) -> StoreError | None:
        """A rollback-journal store a read-only open cannot read as committed: a writer holds
        it, or a writer died and left its ``-journal`` to roll back (a read never does)."""
        text = str(exc).lower()
        if "locked" in text or "busy" in text:
            return StoreError(f"{self.path} is being written by another process",
                              hint="try again when that write has finished")
        if _is_readonly_error(exc) and Path(f"{self.path}-journal").exists():
            return StoreError(f"{self.path} has an unfinished write (a rollback journal "
                              f"{self.path.name}-journal that no process holds)",
                              hint="open it once for writing, which rolls the write back "
                                   "(e.g. `sqlite3 FILE 'PRAGMA integrity_check'`), then read "
                                   "it again")
        return None

    def _drop_scratch(self) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def _check_readable(self) -> None:
        """A read-only open migrates nothing: the file must be ours, not newer, and have the
        tables reads need (an older store whose pending migration only adds seals is read
        as it is). Its checks read one state of the file."""
        with self._one_read():
            self._check_readable_now()

    def _check_readable_now(self) -> None:
        tables = set(self.db.table_names())
        if self.db.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
            if tables:
                raise NotACarStore(f"{self.path} holds tables {sorted(tables)[:5]} that CAR did "
                                   "not create", hint="pass the path of a store CAR wrote")
            raise NotACarStore(f"{self.path} is not a CAR store",
                               hint="pass the path of a store CAR wrote")
        if not tables:  # marked ours, its tables not made yet: a creator is at work, or died
            raise StoreError(f"{self.path} is a new CAR store whose tables are not made yet "
                             "(another process may be creating it)",
                             hint="try again in a moment; if it stays so, open it once for "
                                  "writing (RunStore(path)), which makes them")
        if MIGRATIONS.migrations_table not in tables:
            raise CorruptStore(f"{self.path} has lost its migrations table",
                               hint="the database was edited by hand; restore it from a copy")
        missing = {"runs", "steps", "attributions"} - tables
        if missing:
            raise CorruptStore(f"{self.path} has lost its {', '.join(sorted(missing))} table(s)",
                               hint="the database was edited by hand; restore it from a copy")
        applied = self._applied()
        if applied - self._known():
            raise StoreTooNew(f"{self.path} was migrated by a newer CAR "
                              f"({sorted(applied - self._known())})",
                              hint="upgrade causal-agent-replay to open it")
        if MIGRATION_NAMES[0] not in applied:
            raise CorruptStore(f"{self.path} has lost the record of its migrations",
                               hint="the database was edited by hand; restore it from a copy")
        # unsealed attributions are an older store's only when there is no seal column at all
        # (a lost migration record must not turn the seal check off)
        columns = {r[1] for r in self.db.execute("PRAGMA table_info(attributions)")}
        self.legacy = "seal" not in columns
        self._check_integrity()

    def _check_integrity(self) -> None:
        """SQLite's own checks before anything is read: ``quick_check`` over the whole file
        (every page and record well formed), then ``integrity_check`` of ``runs`` and
        ``attributions``, which also compares each index with its table — reads go through
        those indexes (a run by id, an attribution's branches), and an index entry that
        disagrees with its row would silently drop or swap rows, which ``quick_check`` does not
        see. The ``steps`` index is not compared (on a large store that is most of the cost):
        a run's steps are read through it, but a missing, extra or swapped step fails the
        run's chained digests and step count. A problem refuses the whole file, named."""
        for check in ("quick_check(1)", "integrity_check(runs)",
                      "integrity_check(attributions)"):
            found = self.db.execute(f"PRAGMA {check}").fetchone()
            problem = "no answer" if found is None else str(found[0])
            if problem != "ok":
                raise CorruptStore(f"{self.path} is damaged: SQLite's integrity check reports "
                                   f"{' '.join(problem.split())[:160]!r}",
                                   hint="restore it from a copy; reads refuse a damaged file")

    def _applied(self) -> set[str]:
        return {str(m.name) for m in MIGRATIONS.applied(self.db)}

    @staticmethod
    def _known() -> set[str]:
        return set(MIGRATION_NAMES)

    def _damaged(self, exc: BaseException) -> CorruptStore:
        text = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        return CorruptStore(f"{self.path} is damaged: {text}",
                            hint="the file was edited or truncated; restore it from a copy "
                                 "(`PRAGMA integrity_check` in sqlite3 says where)")

    def _open_for_writing(self, timeout: float) -> None:
        """Check the file is ours and migrate it, waiting out other processes doing the same.
        A new file's switch to WAL and its first transactions can meet another opener's lock
        in a way SQLite reports as "database is locked" at once, without its busy handler
        (lock upgrades that could deadlock): retried until ``timeout``, as the busy handler
        would have waited."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._check_ours()
                self._migrate()
                return
            except sqlite3.OperationalError as exc:
                text = str(exc).lower()
                if not ("locked" in text or "busy" in text) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def _check_ours(self) -> None:
        """Mark a new, empty file as ours, or refuse a file someone else wrote. The check and
        the mark are one transaction, so two processes creating one store do not race."""
        if self.db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID:
            return
        self.db.execute("BEGIN IMMEDIATE")
        try:
            app_id = self.db.execute("PRAGMA application_id").fetchone()[0]
            tables = set(self.db.table_names())
            if app_id != APPLICATION_ID:
                if tables:
                    raise NotACarStore(f"{self.path} already holds tables {sorted(tables)[:5]}"
                                       " that CAR did not create",
                                       hint="use a new file for the CAR store")
                self.db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    @contextmanager
    def _one_read(self) -> Iterator[None]:
        """Reads that must see one state of the file: read apart, another process creating
        the store could commit between them (its tables without their migration record look
        like a lost migrations table)."""
        self.db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _migrate(self) -> None:
        with self._one_read():
            applied, tables = self._applied(), set(self.db.table_names())
        known = self._known()
        unknown = applied - known
        if not applied and "runs" in tables:
            raise CorruptStore(f"{self.path} has lost its migrations table",
                               hint="the database was edited by hand; restore it from a copy")
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
        """Close the connection; leases still held are freed first (nothing can finish them
        now), best effort: a store that cannot write leaves them to the pid check."""
        for aid in list(self._leases):
            try:
                self.release_attribution(aid)
            except StoreError:
                self._forget(aid)
        self.db.conn.close()
        self._drop_scratch()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self) -> Any:
        if self.readonly:
            raise StoreReadOnly(f"{self.path} was opened read-only",
                                hint="open it with RunStore(path) to write")
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

    @_guarded
    def exists(self, run_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM runs WHERE id = ?", [run_id]).fetchone() is not None

    @_guarded
    def load(self, run_id: str) -> Trajectory:
        """The stored run, digests verified. Raises RunNotFound / CorruptRun."""
        rows = list(self.db.query("SELECT * FROM runs WHERE id = ?", [run_id]))
        if not rows:
            raise RunNotFound(f"no run {run_id!r} in {self.path}", run_id=run_id,
                              hint="list the stored runs with `car runs` or RunStore.list()")
        row = rows[0]
        if row["id"] != run_id:  # a lookup through a damaged index can land on another row
            raise CorruptRun("the store's index of run ids points at another row",
                             run_id=run_id, hint="the file is damaged; restore it from a copy")
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
        except (ValueError, TypeError, AttributeError, RecursionError) as exc:
            raise CorruptRun(f"stored run does not parse: {str(exc)[:160]}", run_id=run_id,
                             hint="the database was edited by hand; record the run again"
                             ) from None
        if not isinstance(header, dict):
            raise CorruptRun("the stored header is not an object", run_id=run_id,
                             hint="the database was edited by hand; record the run again")
        seal = header.pop("seal", None)  # every save writes one: a missing seal was removed
        if seal != _seal(row, header):
            raise CorruptRun("the stored header (outcome, lineage, status …) was changed after "
                             "saving", run_id=run_id,
                             hint="the database was edited by hand; record the run again")
        try:
            run = Trajectory.from_dict(data)
        except CorruptRun:
            raise
        except (CarError, ValueError, TypeError, AttributeError, RecursionError) as exc:
            raise CorruptRun(f"stored run does not parse: {str(exc)[:160]}", run_id=run_id,
                             hint="the database was edited by hand; record the run again"
                             ) from None
        if len(run.steps) != row["n_steps"] or run.digest != row["digest"]:
            raise CorruptRun("stored run is incomplete or its digest changed", run_id=run_id,
                             hint="the database was edited by hand; record the run again")
        return run

    @_guarded
    def list(self, *, branches: bool = False, limit: int | None = None) -> list[dict[str, Any]]:
        """Summaries of stored runs, newest first (only recorded runs unless ``branches``),
        each row's seal checked: a damaged row raises ``CorruptRun`` naming it."""
        rows, damaged = self.scan(branches=branches, limit=limit)
        if damaged:
            raise damaged_rows(damaged, len(rows))
        return rows

    @_guarded
    def scan(self, *, branches: bool = False, limit: int | None = None
             ) -> tuple[builtins.list[dict[str, Any]], builtins.list[tuple[str, str]]]:
        """Like ``list``, but a damaged row does not hide the others: the intact summaries,
        and ``(id, what is wrong)`` for each row whose seal or types do not check."""
        where = "" if branches else "WHERE parent_id IS NULL"
        sql = (f"SELECT {', '.join(SEALED_COLUMNS)}, header FROM runs {where} "
               "ORDER BY created_at DESC, rowid DESC")
        if limit:
            sql += f" LIMIT {min(int(limit), 2**63 - 1)}"
        return self._checked(sql, [], SUMMARY_COLUMNS)

    def _checked(self, sql: str, params: builtins.list[Any], keys: tuple[str, ...]
                 ) -> tuple[builtins.list[dict[str, Any]], builtins.list[tuple[str, str]]]:
        """Rows of ``runs`` (every sealed column and the header selected) whose seal checks,
        cut to ``keys``, and the damaged ones by id."""
        intact, damaged = [], []
        for row in self.db.query(sql, params):
            wrong = _row_problem(row)
            if wrong is None:
                summary = {k: row[k] for k in keys}
                if keys is SUMMARY_COLUMNS:  # which test recorded it, from the sealed header
                    meta = loads(row["header"] or "{}").get("meta") or {}
                    test = meta.get("test") if isinstance(meta, dict) else None
                    summary["test"] = test if isinstance(test, str) else None
                intact.append(summary)
            else:
                damaged.append((_shown_id(row.get("id")), wrong))
        return intact, damaged

    @_guarded
    def with_digest(self, digest: str) -> builtins.list[str]:
        """Ids of the recorded runs (not branches) whose content digest is ``digest``, oldest
        first: the same steps imported or recorded again."""
        return [r[0] for r in self.db.execute(
            "SELECT id FROM runs WHERE digest = ? AND parent_id IS NULL ORDER BY rowid",
            [digest]).fetchall()]

    @_guarded
    def children(self, run_id: str) -> builtins.list[dict[str, Any]]:
        """Branches whose parent is ``run_id`` (seals checked: ``CorruptRun`` names a damaged
        one)."""
        return self._verified(f"SELECT {', '.join(SEALED_COLUMNS)}, header FROM runs WHERE "
                              "parent_id = ? ORDER BY rowid", [run_id],
                              ("id", "arm", "rollout", "branch_step", "outcome",
                               "attribution_id"))

    def _verified(self, sql: str, params: builtins.list[Any], keys: tuple[str, ...]
                  ) -> builtins.list[dict[str, Any]]:
        rows, damaged = self._checked(sql, params, keys)
        if damaged:
            raise damaged_rows(damaged, len(rows))
        return rows

    # -- attributions ----------------------------------------------------------------------
    # An attribution row is sealed like a run (``seal``: a digest of the row as stored). A
    # resume adds branches but leaves the stored result, status and params alone until it has
    # a new result; one estimate at a time may run an attribution (a lease row, claimed in a
    # write transaction, owned by that claim, and freed when it finishes, is released, its
    # store closes or its process is gone). Within a process the live claims are in ``_LIVE``,
    # so a second thread or connection of the same process is refused like another process.
    @_guarded
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
                self._claim(aid)
                claimed = True
                self._begin_row(aid, run_id, method, params)
        except BaseException:
            if claimed:
                self._forget(aid)  # rolled back: the claim never happened
            raise
        return aid

    def _begin_row(self, aid: str, run_id: str, method: str, params: dict[str, Any]) -> None:
        existing = self.db.execute("SELECT 1 FROM attributions WHERE id = ?", [aid]).fetchone()
        if existing is None:
            row = {"id": aid, "run_id": run_id, "method": method,
                   "status": str(AttributionStatus.RUNNING),
                   "params": dumps(redact_json(params)), "result": None,
                   "created_at": time.time(), "finished_at": None}
            row["seal"] = _attribution_seal(row)
            self.db.table("attributions").insert(row, pk="id")

    def _claim(self, aid: str) -> None:
        holder = self.db.execute("SELECT owner, host, pid FROM attribution_leases WHERE "
                                 "attribution_id = ?", [aid]).fetchone()
        if holder is not None and _alive(holder[0], holder[1], holder[2]):
            where = ("this process (another thread or store connection)"
                     if holder[2] == os.getpid() and holder[1] == socket.gethostname()
                     else f"process {holder[2]} on {holder[1]}")
            raise AttributionBusy(f"attribution {aid} is being run by {where}",
                                  hint="wait for it to finish, then resume it if it stopped "
                                       "early")
        owner = uuid.uuid4().hex  # one per claim: this store's own live claim is in the way too
        with _LIVE_LOCK:  # live before the row is visible, so no other claim reads it as stale
            _LIVE.add(owner)
        self._leases[aid] = owner
        self.db.execute("INSERT OR REPLACE INTO attribution_leases (attribution_id, owner, "
                        "host, pid, acquired_at) VALUES (?, ?, ?, ?, ?)",
                        [aid, owner, socket.gethostname(), os.getpid(), time.time()])

    def _forget(self, aid: str) -> str | None:
        """Drop this store's claim on ``aid`` from the live set; its owner token, if any."""
        owner = self._leases.pop(aid, None)
        if owner is not None:
            with _LIVE_LOCK:
                _LIVE.discard(owner)
        return owner

    def holds(self, attribution_id: str) -> bool:
        """Whether this store holds the lease of ``attribution_id`` (it began it and has not
        finished, released or closed since)."""
        return attribution_id in self._leases

    @_guarded
    def release_attribution(self, attribution_id: str) -> None:
        """Give up this store's lease on an attribution (its branches and result stay)."""
        owner = self._forget(attribution_id)
        if owner is None:
            return
        with self._write():
            self.db.execute("DELETE FROM attribution_leases WHERE attribution_id = ? AND "
                            "owner = ?", [attribution_id, owner])

    @_guarded
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

    @_guarded
    def finish_attribution(self, attribution_id: str, result: Result,
                           status: str = AttributionStatus.COMPLETE,
                           params: dict[str, Any] | None = None) -> None:
        """Store the attribution's result as its JSON (a complete result is never replaced by
        a truncated one) and free its lease, in one transaction."""
        with self._write():
            rows = list(self.db.query("SELECT * FROM attributions WHERE id = ?",
                                      [attribution_id]))
            if not rows:
                raise AttributionNotFound(f"no attribution {attribution_id!r} in {self.path}",
                                          hint="start it with begin_attribution")
            row = dict(rows[0])
            complete = AttributionStatus.COMPLETE
            if not (row["status"] == complete and status != complete):
                row.update(result=dumps(redact_json(result.to_dict())), status=str(status),
                           finished_at=time.time())
                if params is not None:
                    row["params"] = dumps(redact_json(params))
                row["seal"] = _attribution_seal(row)
                self.db.table("attributions").update(attribution_id, {
                    k: row[k] for k in ("result", "status", "finished_at", "params", "seal")})
            owner = self._forget(attribution_id)
            if owner is not None:
                self.db.execute("DELETE FROM attribution_leases WHERE attribution_id = ? AND "
                                "owner = ?", [attribution_id, owner])

    def save_attribution(self, run_id: str, method: str, params: dict[str, Any],
                         result: Result, status: str = AttributionStatus.COMPLETE) -> str:
        aid = self.begin_attribution(run_id, method, params)
        self.finish_attribution(aid, result, status)
        return aid

    @_guarded
    def attribution_exists(self, attribution_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM attributions WHERE id = ?",
                               [attribution_id]).fetchone() is not None

    @_guarded
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
        seal = row.pop("seal", None)
        if not self.legacy and seal != _attribution_seal(row):
            raise CorruptAttribution(f"attribution {attribution_id} was changed after it was "
                                     "stored", hint="the database was edited by hand; run the "
                                                    "attribution again (a new id)")
        for key in ("id", "run_id", "method", "status"):
            if not isinstance(row[key], str):
                raise CorruptAttribution(f"attribution {attribution_id} has {key} "
                                         f"{row[key]!r}, not text",
                                         hint="the database was edited by hand")
        params = loads(row["params"] or "{}")
        data = loads(row["result"]) if row["result"] else None
        if not isinstance(params, dict) or not isinstance(data, (dict, type(None))):
            raise CorruptAttribution(f"attribution {attribution_id} holds a malformed result",
                                     hint="the database was edited by hand")
        try:
            status = AttributionStatus(row["status"])
            result = None if data is None else result_from_dict(data)
        except (ValueError, InvalidInput) as exc:
            raise CorruptAttribution(f"attribution {attribution_id} holds a malformed result: "
                                     f"{str(exc)[:160]}",
                                     hint="the database was edited by hand; run the "
                                          "attribution again (a new id)") from None
        return Attribution(id=row["id"], run_id=row["run_id"], method=row["method"],
                           status=status, params=params, result=result,
                           created_at=row["created_at"], finished_at=row["finished_at"])

    @_guarded
    def attributions(self, run_id: str | None = None) -> builtins.list[Attribution]:
        """Attributions of ``run_id`` (every run's when None), oldest first."""
        return [self.attribution(aid) for aid in self.attribution_ids(run_id)]

    @_guarded
    def attribution_ids(self, run_id: str | None = None) -> builtins.list[str]:
        """Ids of the attributions of ``run_id`` (every run's when None), oldest first, read
        without their rows, so one damaged row can be named while the others are read."""
        if run_id is None:
            ids = self.db.execute("SELECT id FROM attributions ORDER BY created_at, rowid")
        else:
            ids = self.db.execute("SELECT id FROM attributions WHERE run_id = ? "
                                  "ORDER BY created_at, rowid", [run_id])
        return [_shown_id(r[0]) for r in ids.fetchall()]

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

    @_guarded
    def branches(self, attribution_id: str) -> builtins.list[dict[str, Any]]:
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

def _alive(owner: str, host: str | None, pid: int | None) -> bool:
    """Whether a lease's claim may still run: in this process, whether the claim is live
    (``_LIVE``: taken and not yet finished, released or closed); on this host, whether the pid
    exists; on another host we cannot tell, so it counts as alive."""
    if host != socket.gethostname():
        return True
    if not isinstance(pid, int):
        return False
    if pid == os.getpid():
        with _LIVE_LOCK:
            return owner in _LIVE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# The lease owners this process holds now (one per claim, across every RunStore of the process).
_LIVE: set[str] = set()
_LIVE_LOCK = threading.RLock()  # reentrant: a store finalized by GC inside a locked block


def _drop_live(leases: dict[str, str]) -> None:
    with _LIVE_LOCK:
        _LIVE.difference_update(leases.values())


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
