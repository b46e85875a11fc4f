"""Opening a store for reading without writing anything: no new file, no ``-wal``/``-shm``
left beside the user's file, and never an uncommitted write read as committed.

How depends on the files beside the store (``read_plan``), and for a WAL on whether SQLite
would read anything from it, which takes reading the WAL's header the way SQLite does.
"""

from __future__ import annotations

import sqlite3
import struct
import tempfile
import urllib.parse
from pathlib import Path

from car_core.errors import NotACarStore, StoreError, StoreReadOnly
from car_core.store.failures import is_readonly_error

_WAL_MAGIC = (0x377F0682, 0x377F0683)


def _wal_checksum(data: bytes, big_endian: bool) -> tuple[int, int]:
    """SQLite's WAL checksum over ``data`` (a multiple of 8 bytes)."""
    words = struct.unpack((">" if big_endian else "<") + f"{len(data) // 4}I", data)
    s0 = s1 = 0
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def _wal_may_hold_frames(wal: Path) -> bool:
    """Whether SQLite would read anything from ``wal``: a WAL whose header is not valid (wrong
    magic, version or checksum) or that is too short for one frame is ignored whole."""
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


def read_plan(path: Path) -> str:
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


def connect_readonly(path: Path, timeout: float
                     ) -> tuple[sqlite3.Connection, tempfile.TemporaryDirectory[str] | None]:
    """A read-only connection to the store at ``path`` (``read_plan`` says how), and the
    folder of the private copy it reads from, if any: the caller removes that folder when it
    closes the connection; an open that fails or is interrupted removes it here."""
    if not path.is_file():
        raise StoreError(f"no CAR store at {path}",
                         hint="record a run first (`car demo` writes ./car.db) or pass "
                              "--store PATH")
    if path.stat().st_size == 0:
        raise NotACarStore(f"{path} is an empty file, not a CAR store",
                           hint="pass the path of a CAR store (an empty file is never "
                                "turned into one by a read command)")
    plan = read_plan(path)
    source, scratch = path.resolve(), None
    try:
        if plan == "copy":
            scratch = tempfile.TemporaryDirectory(prefix="car-read-")
            source = _private_copy(path, Path(scratch.name))
        uri = (f"file:{urllib.parse.quote(str(source))}?mode=ro"
               + ("&immutable=1" if plan == "immutable" else ""))
        try:
            return sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None,
                                   check_same_thread=False), scratch
        except sqlite3.Error as exc:
            raise StoreReadOnly(f"cannot read {path}: {exc}",
                                hint="check the file and its folder are readable") from exc
    except BaseException:  # a failed or interrupted copy: remove it now, not at exit
        if scratch is not None:
            scratch.cleanup()
        raise


def _private_copy(path: Path, folder: Path) -> Path:
    """The file and its ``-wal`` copied to a folder of our own: reading committed frames
    of a WAL whose ``-shm`` is gone needs a new ``-shm``, which is made there, not beside
    the user's file. Removed on ``close``, when the store is dropped, on an open that
    fails, and at interpreter exit (the folder's finalizer); the ``car`` command turns
    SIGTERM into an exception so that a killed read unwinds to these too."""
    import shutil
    target = folder / "car.db"
    shutil.copyfile(path, target)
    shutil.copyfile(f"{path}-wal", f"{target}-wal")
    return target


def unreadable_now(path: Path, exc: sqlite3.OperationalError) -> StoreError | None:
    """A rollback-journal store a read-only open cannot read as committed: a writer holds
    it, or a writer died and left its ``-journal`` to roll back (a read never does)."""
    text = str(exc).lower()
    if "locked" in text or "busy" in text:
        return StoreError(f"{path} is being written by another process",
                          hint="try again when that write has finished")
    if is_readonly_error(exc) and Path(f"{path}-journal").exists():
        return StoreError(f"{path} has an unfinished write (a rollback journal "
                          f"{path.name}-journal that no process holds)",
                          hint="open it once for writing, which rolls the write back "
                               "(e.g. `sqlite3 FILE 'PRAGMA integrity_check'`), then read "
                               "it again")
    return None


__all__ = ["connect_readonly", "read_plan", "unreadable_now"]
