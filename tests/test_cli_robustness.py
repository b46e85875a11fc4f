"""The ``car`` command when things go wrong around it: memory that runs out, a Ctrl-C before the
command has even been imported, a hostile run id in the last line it prints, a killed demo,
and the memory ``car intervene`` holds per branch."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import json
import subprocess
import sys
import textwrap
import tomllib
import tracemalloc
from pathlib import Path

import pytest
from _broken_agent import write_raising_agent

import car_core as car
from car_core import cli
from car_core.store import RunStore
from car_core.testing import synthetic as syn

ROOT = Path(__file__).resolve().parents[1]
PIVOT = "car_core.synthetic:pivot"


def run_cli(args: list[str]) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(args)
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.fixture
def stored(tmp_path: Path, pivot_run: car.Trajectory) -> tuple[Path, car.Trajectory]:
    with RunStore(tmp_path / "car.db") as s:
        s.save(pivot_run)
    return tmp_path / "car.db", pivot_run


def test_running_out_of_memory_is_one_line_and_not_an_internal_error(stored, monkeypatch):
    path, run = stored

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr("car_core.cli.intervene.run_intervene", exhausted)  # what it runs
    # what `attribute` runs
    monkeypatch.setattr("car_core.estimators.settings.contrastive", exhausted)
    for args in (["intervene", run.id, "--agent", PIVOT, "--do", "resample:2"],
                 ["attribute", run.id, "--agent", PIVOT, "--rollouts", "2"]):
        code, _, stderr = run_cli([*args, "--store", str(path)])
        assert code == 3, (args, stderr)
        first = stderr.splitlines()[0]
        assert first.startswith("car: error: out of memory") and "internal error" not in stderr


def test_a_memory_error_in_a_finalizer_prints_nothing_and_the_hook_is_restored(stored,
                                                                                monkeypatch):
    """A finalizer that fails for want of memory during a command: the command's own answer
    is all that is printed (no "Exception ignored …" line), and the process's hook is back
    afterwards."""
    path, run = stored

    class Dying:
        def __del__(self) -> None:
            raise MemoryError

    real = cli.kit.existing_store

    def opening(store: str):
        Dying()  # collected at once: its __del__ runs inside the command
        gc.collect()
        return real(store)

    monkeypatch.setattr(cli.kit, "existing_store", opening)
    before = sys.unraisablehook
    code, stdout, stderr = run_cli(["runs", "--store", str(path)])
    assert code == 0 and run.id in stdout
    assert stderr == ""
    assert sys.unraisablehook is before


INTERRUPT_IMPORTS = textwrap.dedent("""
    import sys

    class CtrlC:  # a Ctrl-C that lands while the command's libraries are imported
        def find_spec(self, name, path=None, target=None):
            if name == "typer":
                raise KeyboardInterrupt
            return None

    sys.meta_path.insert(0, CtrlC())
    import _car_entry
    sys.exit(_car_entry.main())
""")


def test_ctrl_c_during_the_imports_exits_130_with_one_line():
    proc = subprocess.run([sys.executable, "-c", INTERRUPT_IMPORTS, "runs"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "car: error: interrupted\n"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["car"] == "_car_entry:main"  # what the installed `car` runs


def test_the_last_line_of_attribute_escapes_the_run_id(tmp_path, pivot_run):
    hostile = dataclasses.replace(pivot_run, id="run\x1b]0;owned\x07")
    path = tmp_path / "car.db"
    with RunStore(path) as s:
        s.save(hostile)
    code, stdout, _ = run_cli(["attribute", hostile.id, "--agent", PIVOT, "--rollouts", "4",
                               "--store", str(path)])
    assert code in (0, 1, 3)
    last = stdout.rstrip("\n").splitlines()[-1]
    assert last.startswith("report: car report ") and "\\x1b]0;owned\\x07" in last
    assert "\x1b" not in stdout and "\x07" not in stdout


def test_the_demo_keeps_its_scratch_checkpoints_in_memory(tmp_path, monkeypatch):
    """A demo killed at any moment leaves no folder behind: it never makes one."""
    import tempfile

    from car_adapters.demo import run_demo

    def no_folder(*args, **kwargs):
        raise AssertionError("the demo made a temporary folder")

    monkeypatch.setattr(tempfile, "mkdtemp", no_folder)
    monkeypatch.setattr(tempfile, "TemporaryDirectory", no_folder)
    with contextlib.redirect_stdout(io.StringIO()):
        result = run_demo(policy="synthetic", store=str(tmp_path / "demo.db"),
                          report=str(tmp_path / "report.html"), rollouts=4, progress=False)
    assert result["run_id"] is not None and (tmp_path / "report.html").exists()


def peak_per_branch(rollouts_small: int, rollouts_large: int, keep: bool) -> float:
    """Peak bytes allocated per extra branch while ``car.intervene`` runs: the difference
    between two runs' peaks, after a warm-up run, so fixed costs cancel."""
    model = syn.pivot()
    run = model.failing_run()
    agent = model.agent()
    car.intervene(run, agent, car.do_resample(2), outcome=model.outcome,  # warm the caches
                  rollouts=rollouts_small, progress=False, keep_trajectories=keep)
    peaks = []
    for rollouts in (rollouts_small, rollouts_large):
        gc.collect()
        tracemalloc.start()
        dist = car.intervene(run, agent, car.do_resample(2), outcome=model.outcome,
                             rollouts=rollouts, progress=False, keep_trajectories=keep)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert dist.n == rollouts
        del dist
    return (peaks[1] - peaks[0]) / (rollouts_large - rollouts_small)


def test_intervene_without_trajectories_holds_a_number_per_branch_not_a_run(monkeypatch):
    """Without the trajectories a branch costs its outcome at the peak (a float in a list and
    then a tuple: tens of bytes), not its task record (about 340 bytes, which ``execute``
    keeps per finished branch until it returns) and not its steps (over 2 KiB for this 6-step
    run): the branches run a batch at a time (32 here, so both runs span several batches)."""
    import car_core.engine.replay as replay
    monkeypatch.setattr(replay, "OUTCOME_BATCH", 32)
    lean = peak_per_branch(64, 256, keep=False)
    full = peak_per_branch(64, 256, keep=True)
    assert lean < 96 and full > 2048, (lean, full)


def test_cli_intervene_keeps_no_trajectory_and_prints_the_same_estimate(stored):
    path, run = stored
    code, stdout, stderr = run_cli(["intervene", run.id, "--agent", PIVOT, "--do",
                                    "resample:2", "--rollouts", "32", "--json",
                                    "--store", str(path)])
    assert code == 0, stderr
    printed = json.loads(stdout)
    model = syn.pivot()
    api = car.intervene(run, model.agent(), car.do_resample(2), outcome=model.outcome,
                        rollouts=32, progress=False)
    assert printed["branch_ids"] == []  # nothing stored, so no id to point at
    assert (printed["mean"], printed["ci"], printed["values"]) == \
        (api.mean, list(api.ci), list(api.values))


def test_every_branch_failing_says_why(tmp_path, pivot_run):
    write_raising_agent(tmp_path, "broken tool")
    path = tmp_path / "car.db"
    with RunStore(path) as s:
        s.save(pivot_run)
    sys.path.insert(0, str(tmp_path))
    try:
        code, _, stderr = run_cli(["attribute", pivot_run.id, "--agent", "broken:make",
                                   "--outcome", "broken:outcome", "--rollouts", "4",
                                   "--store", str(path)])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("broken", None)
    assert code == 5
    lines = [line for line in stderr.splitlines() if line.strip()]
    # one line that says why, then the command that resumes once the agent is fixed
    assert "broken tool" in lines[0] and "branches failed" in lines[0], stderr
    assert lines[1:] and "Resume with:" in lines[1] and "--resume" in lines[-1], stderr


def test_a_report_to_a_path_that_cannot_be_written_is_bad_input_with_a_hint(stored, tmp_path):
    """``--out`` pointing into a folder that does not exist: exit 2, one line naming the path
    and what to pass instead (``kit.write_out``), no traceback and no file."""
    db, run = stored
    target = tmp_path / "no-such-folder" / "report.html"
    code, _, err = run_cli(["report", run.id, "--store", str(db), "--out", str(target)])
    assert code == 2 and f"cannot write {target}" in err and "--out" in err
    assert "Traceback" not in err and not target.exists()
