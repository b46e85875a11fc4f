"""Fixtures shared by the framework integration tests (framework-specific ones live in each
test module)."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# scipy loads with car_core's first estimate; the pytester suites run pytest in this process,
# which drops every module a run imported when it ends, and scipy's C extensions cannot be
# loaded a second time: imported here, before any such run, it stays.
import scipy.stats  # noqa: F401

from car_core.store import RunStore

pytest_plugins = ["pytester"]  # the pytest plugin's tests run small suites inside pytest


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    """A fresh CAR store in a temporary SQLite file."""
    s = RunStore(tmp_path / "car.db")
    yield s
    s.close()


@pytest.fixture
def servers() -> Iterator[list[Any]]:
    """Stub model servers a test starts (``dying_server.DyingServer``), in order; whatever is
    still up at the end is stopped."""
    started: list[Any] = []
    yield started
    for s in started:
        if not s.stopped.is_set():
            s.stop()



def _pg_bin(name: str) -> str:
    """A PostgreSQL server program: on PATH, or where Debian's ``postgresql`` package puts it."""
    found = shutil.which(name) or next(iter(sorted(glob.glob(
        f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is missing: run `make postgres` "
                           "(apt-get install postgresql)")
    return found


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A real PostgreSQL server of our own: ``initdb`` into a temporary folder, started on a free
    loopback port (as the ``postgres`` user when the tests run as root, which the server
    refuses to be), stopped and removed after the session."""
    as_user: list[str] = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    root = Path(tempfile.mkdtemp(prefix="car-pg-"))
    if as_user:
        shutil.chown(root, "postgres", "postgres")
    data = root / "data"
    with socket.socket() as s:  # a free port, released just before the server binds it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = functools.partial(subprocess.run, check=True, capture_output=True, text=True)
    try:
        run([*as_user, _pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
             "--no-sync", "-E", "UTF8"])
        run([*as_user, _pg_bin("pg_ctl"), "-D", str(data), "-l", str(root / "server.log"),
             "-w", "-t", "60", "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 "
             "-c fsync=off -c full_page_writes=off", "start"])
        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        import psycopg
        with psycopg.connect(dsn, connect_timeout=30) as conn:  # accepts connections
            conn.execute("SELECT 1")
        yield dsn
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run([*as_user, _pg_bin("pg_ctl"), "-D", str(data), "-m", "immediate",
                            "-w", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
