"""Crash-safe attributions: an attribution SIGKILLed at any point resumes from its journal in
the store and ends with the same result as an uninterrupted run with the same seed, without
re-running the branches that had finished; a store that cannot be written stops before any
rollout is spent, and loses nothing that was already written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

import car_core as car
from car_core.errors import StoreReadOnly
from car_core.store import RunStore
from car_core.testing import synthetic as syn

ROLLOUTS = 10  # per arm: arm resample@2 makes 4 policy calls a branch, resample@3 makes 3
CALLS_PER_BRANCH = {"resample@2": 4, "resample@3": 3}


def killing_pivot_agent(model: syn.SyntheticSCM, kill_at: int
                        ) -> tuple[car.FunctionAgent, dict[str, int]]:
    """The pivot model's agent with a policy that counts its calls and SIGKILLs its own
    process on call ``kill_at`` (a crash at an arbitrary point of an attribution)."""
    calls = {"n": 0}
    lock = threading.Lock()

    def policy(history: car.History, rng: Any) -> Any:
        with lock:
            calls["n"] += 1
            n = calls["n"]
        if n == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return model.policy(history, rng)

    agent = car.FunctionAgent(policy=policy, environment=model.environment,
                              is_final=lambda a: bool(a.get("final")),
                              max_steps=model.n_steps, name=model.agent().name)
    return agent, calls


def attribute(db: Path, run_id: str, aid: str, kill_at: int, backend: str) -> dict[str, Any]:
    """Two arms of ROLLOUTS branches of the pivot model (do_resample at steps 2 and 3),
    journaled to the store as they finish. The policy counts its calls and, on call number
    ``kill_at``, SIGKILLs its own process — in the middle of a branch."""
    from car_core.engine.agent import OutcomeFn
    from car_core.engine.execution import Task, brancher, execute, make_executor
    from car_core.model.budget import BudgetMeter
    from car_core.model.interventions import compile_plan
    from car_core.model.seeding import branch_noise
    from car_core.store import StoreJournal

    model = syn.pivot()
    store = RunStore(db)
    run = store.load(run_id)
    agent, calls = killing_pivot_agent(model, kill_at)
    tasks = []
    for k in (2, 3):
        plan = compile_plan(run, car.do_resample(k))
        tasks += [Task(f"resample@{k}", r, plan, branch_noise(7, r, plan.describe(), True))
                  for r in range(ROLLOUTS)]
    ran: list[list[Any]] = []
    inner = brancher(run, agent, OutcomeFn(model.outcome))

    def fn(task: Task) -> Any:
        ran.append([task.arm, task.rollout])
        return inner(task)

    results = execute(tasks, fn, BudgetMeter(None), executor=make_executor(backend, 3),
                      journal=StoreJournal(store, aid), keep=lambda t: t.outcome.value,
                      progress=False)
    store.close()
    return {"values": [[t.arm, t.rollout, v] for t, v in results], "ran": sorted(ran),
            "calls": calls["n"]}


def attribute_contrastive(db: Path, run_id: str, aid: str, kill_at: int,
                          backend: str) -> dict[str, Any]:
    """``car.contrastive`` on the pivot model with the store as its journal; the policy
    SIGKILLs its process on call ``kill_at``. Returns the result without the per-branch ids."""
    from car_core.engine.execution import make_executor

    model = syn.pivot()
    agent, calls = killing_pivot_agent(model, kill_at)
    with RunStore(db) as store:
        run = store.load(run_id)
        res = car.contrastive(run, agent, outcome=model.outcome, rollouts=16, seed=3,
                              store=store, attribution_id=aid,
                              executor=make_executor(backend, 4), progress=False)
    out = res.to_dict()
    for volatile in ("attribution_id", "example_branch"):  # branch ids are fresh uuids
        out.pop(volatile)
    return {"result": out, "calls": calls["n"]}


def attribute_killed_in_writes(kind: str) -> Any:
    """``car.contrastive`` as ``attribute_contrastive`` runs it, SIGKILLed from inside the
    store: ``vm`` at the ``kill_at``-th progress tick SQLite gives while a write transaction
    is open (mid-INSERT of a branch, its steps, a lease or the result), ``commit`` as the
    ``kill_at``-th COMMIT starts, ``timer`` ``kill_at`` microseconds after the store opened
    (wherever that lands: an fsync, a commit, a policy call). Every branch whose write
    committed is printed at once (``stored ARM ROLLOUT``), so the parent knows what must
    survive (on ``out_fd``). Returns the result, the ticks and commits made and the seconds
    it ran."""
    def run(db: Path, run_id: str, aid: str, kill_at: int, backend: str,
            out_fd: int = 1) -> dict[str, Any]:
        import time

        from car_core.engine.execution import make_executor
        from car_core.store import StoreJournal

        def die() -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        journal_write = StoreJournal.write

        def write(self: StoreJournal, task: Any, result: Any) -> None:
            journal_write(self, task, result)  # returns once the branch is committed
            os.write(out_fd, f"stored {task.arm} {task.rollout}\n".encode())

        StoreJournal.write = write  # type: ignore[method-assign]
        model = syn.pivot()
        counts = {"ticks": 0, "commits": 0}
        started = time.monotonic()
        with RunStore(db) as store:
            conn = store.db.conn

            def tick() -> int:
                if conn.in_transaction:
                    counts["ticks"] += 1
                    if counts["ticks"] == kill_at and kind == "vm":
                        die()
                return 0

            def trace(sql: str) -> None:
                if sql.lstrip().upper().startswith("COMMIT"):
                    counts["commits"] += 1
                    if counts["commits"] == kill_at and kind == "commit":
                        die()

            conn.set_progress_handler(tick, 10)
            conn.set_trace_callback(trace)
            if kind == "timer" and kill_at >= 0:
                threading.Timer(kill_at / 1e6, die).start()
            res = car.contrastive(store.load(run_id), model.agent(), outcome=model.outcome,
                                  rollouts=16, seed=3, store=store, attribution_id=aid,
                                  executor=make_executor(backend, 4), progress=False)
        out = res.to_dict()
        for volatile in ("attribution_id", "example_branch"):
            out.pop(volatile)
        return {"result": out, **counts, "seconds": time.monotonic() - started}
    return run


MODES = {"execute": attribute, "contrastive": attribute_contrastive,
         **{f"write-{kind}": attribute_killed_in_writes(kind)
            for kind in ("vm", "commit", "timer")}}


def killed_child(db: Path, run_id: str, aid: str, kill_at: int, backend: str,
                 mode: str = "execute") -> subprocess.CompletedProcess[str]:
    """``MODES[mode]`` in a fresh process (this file run as a script), to be SIGKILLed."""
    return subprocess.run([sys.executable, __file__, mode, str(db), run_id, aid,
                           str(kill_at), backend], capture_output=True, text=True, timeout=120)


@pytest.fixture
def stored_run(tmp_path: Path) -> tuple[Path, car.Trajectory]:
    db = tmp_path / "car.db"
    run = syn.pivot().failing_run(seed=0)
    with RunStore(db) as store:
        store.save(run)
        store.begin_attribution(run.id, "resume-test", {}, attribution_id="reference")
        store.begin_attribution(run.id, "resume-test", {}, attribution_id="killed")
    return db, run


@pytest.mark.parametrize(("backend", "kill_at"), [
    ("sequential", 1), ("sequential", 23), ("sequential", 62), ("async", 23)])
def test_sigkilled_attribution_resumes_to_the_same_result(
        stored_run: tuple[Path, car.Trajectory], backend: str, kill_at: int) -> None:
    """Killed before any branch finished (call 1), mid-way, and near the end."""
    db, run = stored_run
    reference = attribute(db, run.id, "reference", -1, backend)
    assert reference["calls"] == ROLLOUTS * (4 + 3)

    killed = killed_child(db, run.id, "killed", kill_at, backend)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with RunStore(db) as store:
        finished = {(b["arm"], b["rollout"]) for b in store.branches("killed")}
    assert len(finished) < 2 * ROLLOUTS

    result = attribute(db, run.id, "killed", -1, backend)  # the resume
    assert result["values"] == reference["values"]
    # finished branches were read back, not re-run: only the others called the policy
    assert {tuple(t) for t in result["ran"]}.isdisjoint(finished)
    assert len(result["ran"]) == 2 * ROLLOUTS - len(finished)
    assert result["calls"] == sum(CALLS_PER_BRANCH[arm] for arm, _ in result["ran"])
    with RunStore(db) as store:
        assert len(list(store.branches("killed"))) == 2 * ROLLOUTS


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sequential", "async"])
def test_sigkilled_contrastive_resumes_to_the_same_result(
        stored_run: tuple[Path, car.Trajectory], backend: str) -> None:
    """The estimator itself, killed mid-way through its rollouts and resumed with the same
    seed and attribution id: same locus, effects, intervals and rollouts used; the resume
    makes only the policy calls the killed run had not finished."""
    db, run = stored_run  # the estimator begins its own attributions (the fixture's are
    # "resume-test" ones, which a contrastive resume rightly refuses)
    reference = attribute_contrastive(db, run.id, "c-reference", -1, backend)
    assert reference["result"]["locus"] == syn.pivot().locus
    total = reference["calls"]
    killed = killed_child(db, run.id, "c-killed", total // 2, backend, mode="contrastive")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with RunStore(db) as store:
        kept = list(store.branches("c-killed"))
    assert 0 < len(kept) < reference["result"]["rollouts_used"]

    resumed = attribute_contrastive(db, run.id, "c-killed", -1, backend)
    assert resumed["result"] == reference["result"]
    # a branch of arm hold<j runs steps j..5 live: 6 - j policy calls. Stored branches are
    # read back, so the resume makes exactly the calls of the branches that were not stored
    stored_calls = sum(6 - int(b["arm"].split("<")[1]) for b in kept)
    assert stored_calls > 0
    assert resumed["calls"] == total - stored_calls


def _read_only_child(db: Path) -> str:
    """Open the store and begin an attribution as a process that may not write the file (an
    unprivileged user when the tests run as root, for whom file modes do not bind)."""
    code = textwrap.dedent(f"""
        import os, sys
        import car_core as car
        from car_core.errors import StoreReadOnly
        # a read-only open first, as root, loads what a store needs while root's own Python
        # is readable (the store's modules load on first use); it writes nothing
        car.RunStore({str(db)!r}, readonly=True).close()
        if os.geteuid() == 0:
            os.setgid(65534); os.setuid(65534)
        try:
            store = car.RunStore({str(db)!r})
            store.begin_attribution(store.runs()[0]["id"], "x", {{}})
        except StoreReadOnly as exc:
            print("StoreReadOnly", exc)
            sys.exit(0)
        print("opened")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_read_only_store_is_refused_before_any_rollout(
        stored_run: tuple[Path, car.Trajectory]) -> None:
    src, run = stored_run
    folder = Path(tempfile.mkdtemp(prefix="car-ro-"))
    db = folder / "car.db"
    try:
        shutil.copy(src, db)
        before = db.read_bytes()
        os.chmod(db, 0o444)
        os.chmod(folder, 0o555)  # readable by anyone, writable by no one (but root)
        out = _read_only_child(db)
        assert out.startswith("StoreReadOnly "), out
        assert "writable" in out  # the message says what to do
        assert db.read_bytes() == before
        with RunStore(db) as store:  # what was stored is intact
            assert store.load(run.id).digest == run.digest
    finally:
        os.chmod(folder, 0o755)
        shutil.rmtree(folder)


def test_journal_failure_keeps_written_branches_for_resume(
        tmp_path: Path, stored_run: tuple[Path, car.Trajectory]) -> None:
    """The disk fills mid-attribution: the run stops with StoreReadOnly, the branches written
    before stay, and a resume runs only the rest."""
    from car_core.engine.agent import OutcomeFn
    from car_core.engine.execution import Task, brancher, execute
    from car_core.model.budget import BudgetMeter
    from car_core.model.interventions import compile_plan
    from car_core.model.seeding import branch_noise
    from car_core.store import StoreJournal

    db, run = stored_run
    model = syn.pivot()
    plan = compile_plan(run, car.do_resample(2))
    tasks = [Task("resample@2", r, plan, branch_noise(7, r, plan.describe(), True))
             for r in range(12)]
    fn = brancher(run, model.agent(), OutcomeFn(model.outcome))

    class FillingJournal(StoreJournal):
        def write(self, task: Any, result: Any) -> None:
            if task.rollout == 5:
                raise StoreReadOnly("database or disk is full", hint="free space, then resume")
            super().write(task, result)

    with RunStore(db) as store:
        with pytest.raises(StoreReadOnly):
            execute(tasks, fn, BudgetMeter(None), journal=FillingJournal(store, "killed"),
                    progress=False)
        assert sorted(b["rollout"] for b in store.branches("killed")) == [0, 1, 2, 3, 4]
        ran: list[int] = []
        res = execute(tasks, lambda t: ran.append(t.rollout) or fn(t), BudgetMeter(None),
                      journal=StoreJournal(store, "killed"), progress=False)
        full = execute(tasks, fn, BudgetMeter(None), progress=False)
    assert ran == list(range(5, 12))
    assert [r.outcome.value for _, r in res] == [r.outcome.value for _, r in full]


KILLS = 20


@pytest.mark.slow
def test_twenty_random_kills_then_a_resume_give_the_same_result(
        stored_run: tuple[Path, car.Trajectory]) -> None:
    """One attribution SIGKILLed 20 times in a row, each time at a random policy call of the
    resumed process, then resumed to the end: the same result as an uninterrupted run, every
    (arm, rollout) stored exactly once (none lost, none duplicated), the file intact."""
    import random
    import sqlite3
    db, run = stored_run
    reference = attribute_contrastive(db, run.id, "c-reference", -1, "sequential")
    # each child makes at most total / (KILLS + 2) calls before it dies, so 20 kills can
    # never finish the attribution: every one of them lands mid-way
    cap = max(2, reference["calls"] // (KILLS + 2))
    rng = random.Random(2026)
    for _ in range(KILLS):
        child = killed_child(db, run.id, "c-chain", rng.randint(1, cap), "sequential",
                             mode="contrastive")
        assert child.returncode == -signal.SIGKILL, child.stderr
        conn = sqlite3.connect(db)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.close()
    with RunStore(db) as store:
        before = len(store.branches("c-chain"))
    assert 0 < before < reference["result"]["rollouts_used"]
    resumed = attribute_contrastive(db, run.id, "c-chain", -1, "sequential")
    assert resumed["result"] == reference["result"]
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    keys = {aid: conn.execute("SELECT arm, rollout FROM runs WHERE attribution_id = ? "
                              "ORDER BY arm, rollout", [aid]).fetchall()
            for aid in ("c-reference", "c-chain")}
    conn.close()
    assert keys["c-chain"] == keys["c-reference"]  # none lost, none extra
    assert len(set(keys["c-chain"])) == len(keys["c-chain"]) == resumed["result"][
        "rollouts_used"]


WRITE_KILLS = 24  # 8 of each kind


def forked_child(db: Path, run_id: str, aid: str, kill_at: int, kind: str) -> tuple[int, str]:
    """``attribute_killed_in_writes(kind)`` in a forked child (a fresh interpreter would spend
    most of each trial importing), its lines sent back through a pipe: (exit code, output).
    The parent holds no SQLite connection when it forks."""
    import traceback
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            os.close(read)
            out = attribute_killed_in_writes(kind)(db, run_id, aid, kill_at, "sequential",
                                                   out_fd=write)
            os.write(write, (json.dumps(out) + "\n").encode())
            code = 0
        except BaseException:  # noqa: BLE001 - reported to the parent, which fails on it
            os.write(write, traceback.format_exc().encode())
        finally:
            os._exit(code)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)  # reaped: its lease's pid is gone, not a zombie
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode()


def _stored_lines(stdout: str) -> set[tuple[str, int]]:
    return {(parts[1], int(parts[2])) for parts in (line.split() for line in
            stdout.splitlines()) if len(parts) == 3 and parts[0] == "stored"}


def test_kills_inside_store_writes_lose_nothing_finished(
        stored_run: tuple[Path, car.Trajectory]) -> None:
    """One attribution SIGKILLed 24 times in a row from inside its store writes — mid-INSERT
    while a write transaction is open, as a COMMIT starts, and at random moments — then
    resumed to the end. After every kill the store opens, ``PRAGMA integrity_check`` is ok,
    every branch the child saw committed is still there with the outcome the uninterrupted
    run gave that (arm, rollout), none is stored twice; the resume gives the uninterrupted
    result. Each kill lands in the first half of the work left (ticks, commits or seconds,
    scaled from the uninterrupted child), so it dies mid-way and the chain progresses."""
    import json as json_
    import random
    import sqlite3

    db, run = stored_run
    code, out = forked_child(db, run.id, "w-reference", -1, "vm")
    assert code == 0, out
    reference = json_.loads(out.splitlines()[-1])
    total = reference["result"]["rollouts_used"]  # branches, one commit each
    per_branch = {"vm": reference["ticks"] / reference["commits"],
                  "commit": 1.0, "timer": reference["seconds"] * 1e6 / total}

    def outcomes(conn: sqlite3.Connection, aid: str) -> list[tuple[str, int, float]]:
        return conn.execute("SELECT arm, rollout, outcome FROM runs WHERE attribution_id = ?"
                            " ORDER BY arm, rollout", [aid]).fetchall()

    conn = sqlite3.connect(db)
    truth = {(a, r): y for a, r, y in outcomes(conn, "w-reference")}
    conn.close()
    rng = random.Random(16)
    kinds = ["vm", "commit", "timer"] * (WRITE_KILLS // 3)
    rng.shuffle(kinds)
    survived: set[tuple[str, int]] = set()
    killed = 0
    left = total
    for kind in kinds:
        # somewhere in the first half of what is left to do (in ticks, commits or time), so
        # the child always dies before it could finish and every kill lands mid-way
        kill_at = rng.randint(1, max(2, int(per_branch[kind] * left / 2)))
        code, out = forked_child(db, run.id, "w-chain", kill_at, kind)
        # a timer may fire after the child's last write (then it dies later, or not at all)
        assert code == -signal.SIGKILL or (kind == "timer" and code == 0), (kind, out)
        killed += code == -signal.SIGKILL
        survived |= _stored_lines(out)
        with RunStore(db) as store:  # opens: no torn write left behind
            assert store.attribution("w-chain").run_id == run.id
        conn = sqlite3.connect(db)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        stored = outcomes(conn, "w-chain")
        conn.close()
        keys = [(a, r) for a, r, _ in stored]
        assert len(keys) == len(set(keys))  # none twice
        assert survived <= set(keys)  # none that finished is lost
        assert all(truth[(a, r)] == y for a, r, y in stored)  # each one whole
        left = total - len(keys)
    assert killed >= 20 and survived
    code, out = forked_child(db, run.id, "w-chain", -1, "vm")
    assert code == 0, out
    assert json_.loads(out.splitlines()[-1])["result"] == reference["result"]
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert [(a, r) for a, r, _ in outcomes(conn, "w-chain")] == sorted(truth)
    assert conn.execute("SELECT count(*) FROM attribution_leases").fetchone()[0] == 0
    conn.close()


if __name__ == "__main__":  # the child process of the kill-and-resume test
    mode_, db_, run_id_, aid_, kill_at_, backend_ = sys.argv[1:7]
    print(json.dumps(MODES[mode_](Path(db_), run_id_, aid_, int(kill_at_), backend_)))
