"""A read-only open of a store whose ``-wal`` lost its ``-shm`` reads a private copy in the
temporary folder (``car-read-*``): the copy is removed however the read ends, a ``car``
command killed with SIGTERM or interrupted with Ctrl-C included."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from car_core.model.trajectory import Trajectory
from car_core.store import RunStore

ROOT = Path(__file__).resolve().parents[1]


def copy_plan_store(tmp_path: Path, run: Trajectory) -> Path:
    """A store whose committed run is still in its ``-wal`` and whose ``-shm`` is gone (a
    copy taken while a writer had it open): the one a read must copy to read."""
    writer_dir, reader_dir = tmp_path / "writer", tmp_path / "reader"
    writer_dir.mkdir()
    reader_dir.mkdir()
    with RunStore(writer_dir / "car.db") as s:
        s.save(run)
        for name in ("car.db", "car.db-wal"):
            shutil.copyfile(writer_dir / name, reader_dir / name)
    return reader_dir / "car.db"


# The command, with the read held open at the point where its private copy exists: it says
# where the copy is, then waits for a line on stdin (the test signals it there instead).
READER = textwrap.dedent("""
    import sys
    from car_core import cli
    from car_core.store import RunStore

    checked = RunStore._check_readable

    def held(self):
        checked(self)
        print(self._scratch.name if self._scratch is not None else "no copy", flush=True)
        sys.stdin.readline()

    RunStore._check_readable = held
    sys.exit(cli.main(["runs", "--store", sys.argv[1]]))
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_killed_read_leaves_no_private_copy(tmp_path, pivot_run, sig):
    db = copy_plan_store(tmp_path, pivot_run)
    proc = subprocess.Popen([sys.executable, "-c", READER, str(db)], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    copy = Path(proc.stdout.readline().strip())
    assert copy.name.startswith("car-read-") and (copy / "car.db").exists()
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr  # an interruption, one line, as Ctrl-C ends
    assert stderr.strip() == "car: error: interrupted"
    assert not copy.exists()  # the private copy went with it
    assert sorted(p.name for p in db.parent.iterdir()) == ["car.db", "car.db-wal"]


def test_a_read_that_fails_after_copying_removes_its_copy(tmp_path, pivot_run, monkeypatch):
    """The copy is made before the connection: a connection that cannot be made removes it
    at once, not when the interpreter exits."""
    import sqlite3
    import tempfile
    db = copy_plan_store(tmp_path, pivot_run)
    made: list[str] = []
    real = tempfile.TemporaryDirectory

    def recording(*args, **kwargs):
        folder = real(*args, **kwargs)
        made.append(folder.name)
        return folder

    def refused(*args, **kwargs):
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", recording)
    monkeypatch.setattr("car_core.store.readonly.sqlite3.connect", refused)
    with pytest.raises(Exception, match="cannot read"):
        RunStore(db, readonly=True)
    assert made and not Path(made[0]).exists(), made
