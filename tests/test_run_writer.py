"""``RunWriter`` keeps its durability promise: a flushed run survives a SIGKILL of its process,
an unflushed one may be lost but never leaves a damaged store, a normal exit flushes, and a
save error reaches ``errors`` instead of the recorder that handed the run over."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import car_core as car
from car_core.contract import RunWriter
from car_core.errors import StoreError
from car_core.testing import synthetic

CHILD = '''
import os, signal, sys
import car_core as car
from car_core.testing import synthetic
from car_core.contract import RunWriter

path, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
scm = synthetic.pivot(n_steps=4, at=1)
writer = RunWriter(path)
for seed in range(n):
    writer.save(car.record(scm.agent(), outcome=scm.outcome, seed=seed))
if mode == "flush-then-kill":
    writer.flush()
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(0)  # "exit": a normal exit, no flush called
'''


def _child(path: Path, n: int, mode: str) -> int:
    return subprocess.run([sys.executable, "-c", CHILD, str(path), str(n), mode],
                          capture_output=True, text=True, timeout=120).returncode


def _stored(path: Path) -> list[car.Trajectory]:
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with car.RunStore(path) as store:
        return [store.load(r["id"]) for r in store.runs()]  # load verifies each run's digest


def test_a_flushed_run_survives_a_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    assert _child(path, 20, "flush-then-kill") == -signal.SIGKILL
    assert sorted(r.seed for r in _stored(path)) == list(range(20))


def test_a_normal_exit_flushes(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    assert _child(path, 20, "exit") == 0
    assert sorted(r.seed for r in _stored(path)) == list(range(20))


def test_an_unflushed_kill_loses_runs_whole_and_damages_nothing(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    assert _child(path, 50, "kill") == -signal.SIGKILL
    stored = _stored(path)  # whatever got in is whole; the file is intact
    assert len(stored) <= 50 and len({r.id for r in stored}) == len(stored)


def test_save_returns_at_once_and_flush_makes_the_run_readable(tmp_path: Path) -> None:
    scm = synthetic.pivot(n_steps=4, at=1)
    runs = [car.record(scm.agent(), outcome=scm.outcome, seed=s) for s in range(5)]
    writer = RunWriter(tmp_path / "runs.db")
    assert [writer.save(r) for r in runs] == [r.id for r in runs]
    assert writer.flush() == []
    assert writer.load(runs[3].id) == runs[3]
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        writer.save(runs[0])


def test_a_save_error_reaches_errors_not_the_caller(tmp_path: Path) -> None:
    scm = synthetic.pivot(n_steps=4, at=1)
    run = car.record(scm.agent(), outcome=scm.outcome, seed=0)
    taken = replace(car.record(scm.agent(), outcome=scm.outcome, seed=1), id=run.id)
    errors: list[StoreError] = []
    writer = RunWriter(tmp_path / "runs.db", errors=errors)
    writer.save(run)
    writer.save(taken)  # another run under a stored id: the store refuses it, later
    problems = writer.flush()
    assert len(problems) == 1 and errors == problems
    assert "already stored" in str(problems[0])
    writer.close()
    assert [r.id for r in _stored(tmp_path / "runs.db")] == [run.id]


def test_a_bad_path_is_refused_at_once(tmp_path: Path) -> None:
    (tmp_path / "not-a-store").write_text("hello")
    with pytest.raises(StoreError):
        RunWriter(tmp_path / "not-a-store")



def test_a_flush_waits_for_a_handed_over_task_and_what_it_saves(tmp_path: Path) -> None:
    scm = synthetic.pivot(n_steps=4, at=1)
    runs = [car.record(scm.agent(), outcome=scm.outcome, seed=s) for s in range(4)]
    writer = RunWriter(tmp_path / "runs.db")
    pending = list(runs[:3])

    def seal_and_save() -> None:  # a recorder sealing its runs on the writer's thread
        while pending:
            writer.save(pending.pop(0))

    writer.later(seal_and_save)
    assert writer.flush() == []
    assert [writer.load(r.id) for r in runs[:3]] == runs[:3]
    pending.append(runs[3])
    writer.later(seal_and_save)
    writer.close()  # a normal exit closes the writer the same way
    assert sorted(r.id for r in _stored(tmp_path / "runs.db")) == sorted(r.id for r in runs)


def test_a_task_that_raises_reaches_errors(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "runs.db")

    def broken() -> None:
        raise RuntimeError("seal failed")

    writer.later(broken)
    problems = writer.flush()
    assert len(problems) == 1 and "seal failed" in str(problems[0])
    writer.close()
