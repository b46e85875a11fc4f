"""Every read command on a damaged store either refuses it in one line that names what is
damaged, or prints exactly what it prints for the undamaged store; and no read changes the
file's bytes or the folder's listing. The damage: a real store file with a byte flipped in each
of its pages, random flips (1 to 16 bytes) and truncations, the hand edits users and the issue
tracker found (an outcome edited 1 → 0, an agent renamed, a branch moved to another
attribution, a lost migration record …), and the files SQLite keeps beside a store (a garbage
``-wal``, a hot ``-journal``). The commands run in process, as ``car`` would."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import car_core as car
from car_core import cli
from car_core.store import RunStore
from car_core.testing import synthetic as syn

DOCUMENTED = {0, 1, 2, 3, 4, 5, 130}  # `car --help`; 70 (internal error) means a bug
# What a refusal of damage says: the file is damaged or not a CAR store, a row or attribution
# was changed after it was stored, a table or record is gone, or a write was left unfinished.
NAMES_DAMAGE = re.compile(r"is damaged|was changed after|digest mismatch|changed after "
                          r"(saving|recording)|not a SQLite database|not a CAR store|did not "
                          r"create|has lost|unfinished write|newer CAR|incomplete|does not "
                          r"parse|malformed|not text|not a number|not an integer|not a date|"
                          r"not JSON|not an object|points at another")
RANDOM_VARIANTS = 200


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real store (two recorded runs, one attributed with its branches), checkpointed so the
    one file holds everything; and what every read command prints for it."""
    folder = tmp_path_factory.mktemp("pristine")
    path = folder / "car.db"
    model = syn.pivot(n_steps=3, at=1)
    run = model.failing_run()
    other = syn.and_game().failing_run()
    with RunStore(path) as store:
        store.save(other)
        res = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=4, seed=0,
                              store=store, progress=False)
    settle(path)
    assert res.attribution_id is not None
    data = path.read_bytes()
    out = tmp_path_factory.mktemp("pristine-out") / "report.html"
    ids = {"run": run.id, "other": other.id, "aid": res.attribution_id}
    baseline = {tuple(masked_args(args, out)): run_cli(args, path, out)
                for args in commands(ids, out)}
    assert all(code == 0 for code, _, _, _ in baseline.values()), baseline
    return {"data": data, "ids": ids, "baseline": baseline}


def settle(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def commands(ids: dict[str, str], out: Path) -> list[list[str]]:
    """Every read command: runs (table, JSON, with branches), show (short, full, JSON),
    attributions (all, one run's JSON) and report (latest, one attribution)."""
    run = ids["run"]
    return [["runs"], ["runs", "--json"], ["runs", "--branches", "--json"], ["show", run],
            ["show", run, "--full"], ["show", run, "--json", "--full"],
            ["show", ids["other"], "--json"], ["attributions"],
            ["attributions", run, "--json"], ["report", run, "--out", str(out)],
            ["report", run, "--attribution", ids["aid"], "--out", str(out)]]


def run_cli(args: list[str], store: Path, out: Path) -> tuple[int, str, str, bytes | None]:
    """Exit code, stdout, stderr and the report written (None when none was), with the
    store's and the report's paths written as STORE and OUT (they differ between copies)."""
    out.unlink(missing_ok=True)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main([*args, "--store", str(store)])
    report = out.read_bytes() if out.exists() else None

    def masked(text: str) -> str:
        return text.replace(str(store), "STORE").replace(str(out), "OUT")
    return code, masked(stdout.getvalue()), masked(stderr.getvalue()), report


def masked_args(args: list[str], out: Path) -> list[str]:
    return ["OUT" if a == str(out) else a for a in args]


def snapshot(folder: Path) -> tuple[list[str], dict[str, str]]:
    names = sorted(os.listdir(folder))
    return names, {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in names}


def check_every_read_command(folder: Path, pristine: dict[str, Any]) -> list[int]:
    """Run each read command against ``folder/car.db`` and assert the contract: a refusal is
    one line naming the damage; anything else is byte for byte the undamaged output."""
    out_dir = folder.parent / f"{folder.name}-out"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / "report.html"
    before = snapshot(folder)
    codes = []
    for args in commands(pristine["ids"], out):
        code, stdout, stderr, report = run_cli(args, folder / "car.db", out)
        assert code in DOCUMENTED, (args, code, stderr)
        if code:
            lines = [line for line in stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and lines[0].startswith("car: error: "), (args, stderr)
            assert NAMES_DAMAGE.search(lines[0]), (args, lines[0])
        else:
            expected = pristine["baseline"][tuple(masked_args(args, out))]
            assert (code, stdout, stderr, report) == expected, args
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
    folder = damaged_copy(tmp_path, pristine["data"])
    assert set(check_every_read_command(folder, pristine)) == {0}


def random_damage(data: bytes, k: int) -> bytes:
    """Variant ``k``: one byte flipped in page ``k`` (every page, index pages included, gets
    one), then 1, 2, 4 or 16 flips anywhere, or a truncation, chosen by ``k``."""
    rng = random.Random(k)
    raw = bytearray(data)
    page = int.from_bytes(data[16:18], "big") or 65536
    pages = len(data) // page
    kind = k % 6 if k >= pages else None
    if kind is None:
        raw[k * page + rng.randrange(page)] ^= rng.randrange(1, 256)
    elif kind == 5:
        raw = raw[: rng.randrange(len(raw))]
    else:
        for _ in range((1, 2, 4, 16, 16)[kind]):
            raw[rng.randrange(len(raw))] ^= rng.randrange(1, 256)
    return bytes(raw)


@pytest.mark.parametrize("k", range(RANDOM_VARIANTS))
def test_flipped_bytes_and_truncation(tmp_path: Path, pristine, k: int) -> None:
    damaged = random_damage(pristine["data"], k)
    assert damaged != pristine["data"]
    check_every_read_command(damaged_copy(tmp_path, damaged), pristine)


def edited(data: bytes, folder: Path, *sql: str, rollback_journal: bool = True) -> Path:
    """The store with ``sql`` applied by hand (as a user with sqlite3 would), checkpointed;
    left in rollback-journal mode unless told otherwise (so no ``-wal`` is beside it)."""
    folder = damaged_copy(folder, data)
    conn = sqlite3.connect(folder / "car.db")
    for statement in sql:
        conn.execute(statement)
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    if rollback_journal:
        conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    return folder


BRANCH = "(SELECT id FROM runs WHERE parent_id IS NOT NULL ORDER BY rowid LIMIT 1)"
RECORDED = "(SELECT id FROM runs WHERE parent_id IS NULL ORDER BY rowid LIMIT 1)"
# Each edit is damage a user reported; the commands that show the damaged part must refuse.
EDITS = {
    "drop steps": ["DROP TABLE steps"],
    "drop runs": ["DROP TABLE runs"],
    "drop attributions": ["DROP TABLE attributions"],
    "drop migrations": ["DROP TABLE _sqlite_migrations"],
    "migration record lost": ["DELETE FROM _sqlite_migrations"],
    "migration set renamed, locus edited": [
        "UPDATE _sqlite_migrations SET migration_set = 'cap'",
        "UPDATE attributions SET result = json_set(result, '$.locus', 2)"],
    "action not UTF-8": ["UPDATE steps SET action = CAST(x'22ff22' AS TEXT)"],
    "agent not UTF-8": ["UPDATE runs SET agent = CAST(x'c328' AS TEXT)"],
    "agent renamed": [f"UPDATE runs SET agent = 'someone else' WHERE id = {RECORDED}"],
    "outcome 1 -> 0": [f"UPDATE runs SET outcome = 0 WHERE id = {RECORDED}"],
    "outcome 'x'": ["UPDATE runs SET outcome = 'x'"],
    "status edited": [f"UPDATE runs SET status = 'complete!' WHERE id = {RECORDED}"],
    "seed edited": [f"UPDATE runs SET seed = seed + 1 WHERE id = {RECORDED}"],
    "created_at 'yesterday'": ["UPDATE runs SET created_at = 'yesterday'"],
    "created_at 1e300": ["UPDATE runs SET created_at = 1e300"],
    "created_at moved": [f"UPDATE runs SET created_at = created_at - 1 WHERE id = {RECORDED}"],
    "n_steps text": ["UPDATE runs SET n_steps = 'many'"],
    "branch outcome flipped": [f"UPDATE runs SET outcome = 1 - outcome WHERE id = {BRANCH}"],
    "branch moved to another attribution": [
        f"UPDATE runs SET attribution_id = 'elsewhere' WHERE id = {BRANCH}"],
    "branch arm renamed": [f"UPDATE runs SET arm = 'hold<9' WHERE id = {BRANCH}"],
    "branch unparented": [f"UPDATE runs SET parent_id = NULL WHERE id = {BRANCH}"],
    "branch header emptied": [f"UPDATE runs SET header = NULL WHERE id = {BRANCH}"],
    "context edited": [f"UPDATE runs SET context = '\"edited\"' WHERE id = {RECORDED}"],
    "action nested 100000 deep": [
        "UPDATE steps SET action = (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 "
        "FROM n WHERE i < 100000) SELECT group_concat('[', '') FROM n) || "
        "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000) "
        "SELECT group_concat(']', '') FROM n)"],
    "locus edited": ["UPDATE attributions SET result = json_set(result, '$.locus', 2)"],
    "attribution seal removed": ["UPDATE attributions SET seal = NULL"],
    "attribution created_at moved": ["UPDATE attributions SET created_at = created_at + 1"],
    "attribution result not JSON": ["UPDATE attributions SET result = '{'"],
    "attribution status number": ["UPDATE attributions SET status = 7"],
    "header not an object": ["UPDATE runs SET header = '[1]'"],
    "application id cleared": ["PRAGMA application_id = 0"],
    "migrated by a newer CAR": ["INSERT INTO _sqlite_migrations (migration_set, name, "
                                "applied_at) VALUES ('car', '9999_future', '2030')"],
    "index emptied (writable_schema)": [
        "PRAGMA writable_schema = ON",
        "UPDATE sqlite_schema SET sql = replace(sql, 'runs(attribution_id', "
        "'runs(agent') WHERE name = 'runs_attribution'"],
}


@pytest.mark.parametrize("name", sorted(EDITS))
def test_hand_edited_stores(tmp_path: Path, pristine, name: str) -> None:
    codes = check_every_read_command(edited(pristine["data"], tmp_path, *EDITS[name]), pristine)
    assert any(code == 4 for code in codes), (name, codes)  # the damage is seen and refused


def test_a_damaged_row_is_named_and_the_other_runs_stay_readable(tmp_path: Path,
                                                                 pristine) -> None:
    ids = pristine["ids"]
    folder = edited(pristine["data"], tmp_path,
                    f"UPDATE runs SET outcome = 0 WHERE id = '{ids['run']}'")
    out = tmp_path / "report.html"
    code, stdout, stderr, _ = run_cli(["runs", "--json"], folder / "car.db", out)
    assert code == 4 and f"stored run {ids['run']} is damaged" in stderr
    assert ids["other"] in stdout and ids["run"] not in stdout  # the intact row is listed
    code, _, stderr, _ = run_cli(["show", ids["run"]], folder / "car.db", out)
    assert code == 4 and ids["run"] in stderr
    assert run_cli(["show", ids["other"], "--json"], folder / "car.db", out) == \
        pristine["baseline"][("show", ids["other"], "--json")]


# Files SQLite keeps beside a store, written by hand or left by a crash.
COMPANIONS = {
    "garbage -wal": {"-wal": random.Random(1).randbytes(9000)},
    "empty -wal": {"-wal": b""},
    "-wal with a valid header and garbage frames": {"-wal": None},
    "garbage -journal": {"-journal": random.Random(2).randbytes(5000)},
    "stray -shm": {"-shm": random.Random(3).randbytes(32768)},
}


def wal_header_only(page_size: int) -> bytes:
    """A WAL header SQLite accepts (magic, version, page size, salts, checksum) followed by
    one frame of garbage that fails its checksum."""
    import struct
    head = struct.pack(">IIIIII", 0x377F0682, 3007000, page_size, 0, 12345, 67890)
    s0 = s1 = 0
    words = struct.unpack("<6I", head)
    for i in range(0, 6, 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return head + struct.pack(">II", s0, s1) + random.Random(4).randbytes(24 + page_size)


@pytest.mark.parametrize("name", sorted(COMPANIONS))
@pytest.mark.parametrize("mode", ["wal", "rollback-journal"])
def test_files_beside_the_store(tmp_path: Path, pristine, name: str, mode: str) -> None:
    """Reads beside a -wal without its -shm create no -shm (SQLite would, under mode=ro); a
    -wal SQLite ignores reads as the undamaged store; a hot -journal is refused, never read
    as committed."""
    data = pristine["data"]
    folder = (edited(data, tmp_path) if mode == "rollback-journal"
              else damaged_copy(tmp_path, data))
    page = int.from_bytes(data[16:18], "big")
    for suffix, content in COMPANIONS[name].items():
        body = wal_header_only(page) if content is None else content
        Path(f"{folder / 'car.db'}{suffix}").write_bytes(body)
    codes = check_every_read_command(folder, pristine)
    if name.endswith("-wal") or "-wal " in name or name == "stray -shm":
        assert set(codes) == {0}, codes


def test_committed_frames_of_a_wal_without_its_shm_are_read(tmp_path: Path, pristine) -> None:
    """A store copied with its -wal but not its -shm: what was committed to the WAL is shown
    (read through a private copy), and nothing is created beside it."""
    ids = pristine["ids"]
    source = damaged_copy(tmp_path / "src", pristine["data"])
    writer = sqlite3.connect(source / "car.db")
    writer.execute("SELECT count(*) FROM runs").fetchone()  # holds the file open
    extra = syn.and_game().failing_run()
    with RunStore(source / "car.db") as store:
        store.save(extra)  # committed to the WAL; the open writer keeps it from checkpointing
    folder = tmp_path / "copy"
    folder.mkdir()
    shutil.copyfile(source / "car.db", folder / "car.db")
    shutil.copyfile(source / "car.db-wal", folder / "car.db-wal")
    writer.close()
    before = snapshot(folder)
    code, stdout, _, _ = run_cli(["runs", "--json"], folder / "car.db", tmp_path / "r.html")
    assert code == 0 and extra.id in stdout and ids["run"] in stdout
    assert snapshot(folder) == before


def test_a_zero_byte_file_is_refused_and_stays_zero_bytes(tmp_path: Path, pristine) -> None:
    folder = damaged_copy(tmp_path, b"")
    assert set(check_every_read_command(folder, pristine)) == {4}
    code, _, stderr, _ = run_cli(["runs"], folder / "car.db", tmp_path / "r.html")
    assert "empty file, not a CAR store" in stderr
    assert (folder / "car.db").stat().st_size == 0
