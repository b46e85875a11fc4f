"""Every read command on a damaged store: one line on stderr, a documented exit code, no
traceback, and the file and its folder exactly as they were. The damage is a real store file
mutated by Hypothesis (flipped bytes, truncation) plus the structured damage users and the
issue tracker found (dropped tables, text that is not UTF-8, values of the wrong type)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import car_core as car
from car_core import cli
from car_core import synthetic as syn
from car_core.store import RunStore

DOCUMENTED = {0, 1, 2, 3, 4, 5, 130}  # `car --help`; 70 (internal error) means a bug


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, str, str]:
    """A real store (a run, its branches, a finished attribution), checkpointed so the one
    file holds everything: its bytes, the run id and the attribution id."""
    folder = tmp_path_factory.mktemp("pristine")
    path = folder / "car.db"
    model = syn.pivot(n_steps=3, at=1)
    run = model.failing_run()
    with RunStore(path) as store:
        res = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=4, seed=0,
                              store=store, progress=False)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    assert res.attribution_id is not None
    return path.read_bytes(), run.id, res.attribution_id


def commands(run_id: str, aid: str, out: Path) -> list[list[str]]:
    return [["runs"], ["runs", "--branches", "--json"], ["show", run_id],
            ["show", run_id, "--json", "--full"], ["report", run_id, "--out", str(out)],
            ["report", run_id, "--attribution", aid, "--out", str(out)],
            ["attributions"], ["attributions", run_id, "--json"]]


def snapshot(folder: Path) -> tuple[list[str], dict[str, str]]:
    names = sorted(os.listdir(folder))
    return names, {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in names}


def run_cli(args: list[str]) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(args)
    return code, stdout.getvalue(), stderr.getvalue()


def check_every_read_command(folder: Path, run_id: str, aid: str) -> list[int]:
    """Run each read command against ``folder/car.db``; assert the contract; return codes."""
    out_dir = folder.parent / f"{folder.name}-out"
    out_dir.mkdir(exist_ok=True)
    store = folder / "car.db"
    before = snapshot(folder)
    codes = []
    for args in commands(run_id, aid, out_dir / "report.html"):
        code, _, stderr = run_cli([*args, "--store", str(store)])
        assert code in DOCUMENTED, (args, code, stderr)
        assert "Traceback" not in stderr, (args, stderr)
        lines = [line for line in stderr.splitlines() if line.strip()]
        if code:
            assert len(lines) == 1 and lines[0].startswith("car: error: "), (args, stderr)
        assert snapshot(folder) == before, args  # nothing written, nothing created beside it
        codes.append(code)
    return codes


def damaged_copy(base: Path, data: bytes) -> Path:
    folder = base / "store"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / "car.db").write_bytes(data)
    return folder


def test_the_pristine_store_reads_cleanly(tmp_path: Path, pristine) -> None:
    data, run_id, aid = pristine
    assert check_every_read_command(damaged_copy(tmp_path, data), run_id, aid) == [0] * 8


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 2**31), st.integers(1, 255)), min_size=1,
                      max_size=8),
       cut=st.one_of(st.none(), st.integers(0, 2**31)))
def test_flipped_bytes_and_truncation(tmp_path: Path, pristine, flips, cut) -> None:
    data, run_id, aid = pristine
    raw = bytearray(data)
    for offset, mask in flips:
        raw[offset % len(raw)] ^= mask
    if cut is not None:
        raw = raw[: cut % (len(raw) + 1)]
    check_every_read_command(damaged_copy(tmp_path, bytes(raw)), run_id, aid)


def edited(data: bytes, folder: Path, *sql: str) -> Path:
    """The store with ``sql`` applied by hand (as a user with sqlite3 would), checkpointed."""
    folder = damaged_copy(folder, data)
    conn = sqlite3.connect(folder / "car.db")
    for statement in sql:
        conn.execute(statement)
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode = DELETE")  # leave no -wal beside the file
    conn.close()
    return folder


# Each edit is damage a user reported; the command that shows the damaged part must refuse.
EDITS = {
    "drop steps": ["DROP TABLE steps"],
    "drop runs": ["DROP TABLE runs"],
    "drop attributions": ["DROP TABLE attributions"],
    "drop migrations": ["DROP TABLE _sqlite_migrations"],
    "action not UTF-8": ["UPDATE steps SET action = CAST(x'22ff22' AS TEXT)"],
    "agent not UTF-8": ["UPDATE runs SET agent = CAST(x'c328' AS TEXT)"],
    "outcome 'x'": ["UPDATE runs SET outcome = 'x'"],
    "created_at 'yesterday'": ["UPDATE runs SET created_at = 'yesterday'"],
    "created_at 1e300": ["UPDATE runs SET created_at = 1e300"],
    "n_steps text": ["UPDATE runs SET n_steps = 'many'"],
    "action nested 100000 deep": [
        "UPDATE steps SET action = (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 "
        "FROM n WHERE i < 100000) SELECT group_concat('[', '') FROM n) || "
        "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000) "
        "SELECT group_concat(']', '') FROM n)"],
    "locus edited": ["UPDATE attributions SET result = json_set(result, '$.locus', 2)"],
    "attribution result not JSON": ["UPDATE attributions SET result = '{'"],
    "attribution status number": ["UPDATE attributions SET status = 7"],
    "header not an object": ["UPDATE runs SET header = '[1]'"],
    "application id cleared": ["PRAGMA application_id = 0"],
    "migrated by a newer CAR": ["INSERT INTO _sqlite_migrations (migration_set, name, "
                                "applied_at) VALUES ('car', '9999_future', '2030')"],
}


@pytest.mark.parametrize("name", sorted(EDITS))
def test_hand_edited_stores(tmp_path: Path, pristine, name: str) -> None:
    data, run_id, aid = pristine
    codes = check_every_read_command(edited(data, tmp_path, *EDITS[name]), run_id, aid)
    assert any(code == 4 for code in codes), (name, codes)  # the damage is seen and refused


def test_a_zero_byte_file_is_refused_and_stays_zero_bytes(tmp_path: Path, pristine) -> None:
    _, run_id, aid = pristine
    folder = damaged_copy(tmp_path, b"")
    assert set(check_every_read_command(folder, run_id, aid)) == {4}
    code, _, stderr = run_cli(["runs", "--store", str(folder / "car.db")])
    assert "empty file, not a CAR store" in stderr
    assert (folder / "car.db").stat().st_size == 0
