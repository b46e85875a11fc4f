"""SQLite's failures as CAR's errors: which exceptions mean a damaged file, which mean one that
cannot be written, the guard every read method wears, and the transaction that makes one
logical write all or nothing."""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from car_core.errors import CarError, CorruptStore, StoreDiskError, StoreError, StoreReadOnly

F = TypeVar("F", bound=Callable[..., Any])
# What a damaged file or a hand-edited value raises while it is read: SQLite's own errors
# (a malformed page, a dropped table, text that is not UTF-8) and what parsing a stored value
# can raise (a JSON nested too deep, a number out of range, a string where a number belongs).
DAMAGE = (sqlite3.DatabaseError, ValueError, TypeError, OverflowError, RecursionError,
          UnicodeError, KeyError, AttributeError)


def is_readonly_error(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "readonly" in text or "read-only" in text or "unable to open" in text


_FULL, _IOERR = 13, 10  # SQLITE_FULL, SQLITE_IOERR: primary result codes


def disk_refused(exc: sqlite3.Error) -> bool | None:
    """True where the disk is full (or the file at a size limit), False where it failed a
    write (an I/O error), None where SQLite failed otherwise."""
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    text = str(exc).lower()
    if code == _FULL or "disk is full" in text:
        return True
    if code == _IOERR or "disk i/o error" in text:
        return False
    return None


def write_refused(path: str | os.PathLike[str], exc: sqlite3.Error) -> StoreError:
    """The error for a write to ``path`` SQLite refused: a read-only file, a full or failing
    disk, or another failure (nothing was written)."""
    if is_readonly_error(exc):
        return StoreReadOnly.not_writable(path, exc)
    full = disk_refused(exc)
    if full is not None:
        return StoreDiskError.writing(path, exc, full)
    return StoreError(f"writing {path} failed: {exc}",
                      hint="nothing was written; check the disk and try again")


def damaged_file(path: str | os.PathLike[str], exc: BaseException) -> CorruptStore:
    """The error for a store file SQLite or our parsing found damaged while reading it."""
    text = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
    return CorruptStore(f"{path} is damaged: {text}",
                        hint="the file was edited or truncated; restore it from a copy "
                             "(`PRAGMA integrity_check` in sqlite3 says where)")


def guarded(fn: F) -> F:
    """A store method whose damage becomes a ``CorruptStore`` (our own errors pass through)."""
    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except CarError:
            raise
        except sqlite3.OperationalError as exc:
            if is_readonly_error(exc) or disk_refused(exc) is not None:
                raise write_refused(self.path, exc) from None
            raise damaged_file(self.path, exc) from None
        except DAMAGE as exc:
            raise damaged_file(self.path, exc) from None
    return wrapper  # type: ignore[return-value]


class Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT``: one logical write, all or nothing."""

    def __init__(self, conn: Any, path: str | os.PathLike[str]) -> None:
        self.conn = conn  # anything with ``execute``: a sqlite-utils Database
        self.path = path

    def __enter__(self) -> None:
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if is_readonly_error(exc):
                raise StoreReadOnly.not_writable(self.path, exc) from exc
            raise StoreError(f"cannot write {self.path}: {exc}",
                             hint="another process may hold a long write lock; try again") from exc

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self.conn.execute("COMMIT")
            except sqlite3.Error as err:
                self._rollback()
                raise write_refused(self.path, err) from err
        else:
            self._rollback()
            if isinstance(exc, sqlite3.Error):
                raise write_refused(self.path, exc) from exc

    def _rollback(self) -> None:
        """Undo what is still open: SQLite rolls a transaction back by itself when a write
        fails on a full disk, and a second ``ROLLBACK`` raised "no transaction is active" in
        place of "the disk is full"."""
        conn = getattr(self.conn, "conn", self.conn)  # sqlite-utils wraps the connection
        if getattr(conn, "in_transaction", True):
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # nothing left to undo: the error that got here is the one to say


__all__ = ["DAMAGE", "Transaction", "damaged_file", "disk_refused", "guarded",
           "is_readonly_error", "write_refused"]
