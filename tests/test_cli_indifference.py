"""`car attribute --indifference`: the level the steps after the locus are ruled out at, as
`car.contrastive(indifference=)` takes it, stored with the attribution and refused where it
cannot apply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from car_core.model.trajectory import Trajectory
from car_core.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)}


def car(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=folder, env=ENV,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def folder(tmp_path: Path, pivot_run: Trajectory) -> Path:
    with RunStore(tmp_path / "car.db") as s:
        s.save(pivot_run)
    return tmp_path


def test_the_flag_sets_the_level_the_result_states_and_the_store_keeps(folder, pivot_run):
    done = car(folder, "attribute", pivot_run.id, "--agent", "car_core.synthetic:pivot",
               "--rollouts", "96", "--indifference", "0.3", "--json", "--no-progress")
    assert done.returncode == 0, done.stderr
    res = json.loads(done.stdout)
    assert res["indifference"] == 0.3 and res["params"]["indifference"] == 0.3
    with RunStore(folder / "car.db", readonly=True) as s:
        (row,) = s.attributions(pivot_run.id)
        assert row.params["indifference"] == 0.3


@pytest.mark.parametrize(("args", "says"), [
    (["--indifference", "1.5"], "indifference=1.5"),
    (["--method", "shapley", "--indifference", "0.2"], "--indifference applies to contrastive"),
])
def test_a_level_that_cannot_apply_is_refused_before_any_branch(folder, pivot_run, args, says):
    done = car(folder, "attribute", pivot_run.id, "--agent", "car_core.synthetic:pivot",
               *args, "--no-progress")
    assert done.returncode == 2 and says in done.stderr
    with RunStore(folder / "car.db", readonly=True) as s:
        assert s.attributions(pivot_run.id) == []
