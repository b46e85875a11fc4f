"""``car what``, ``car fix`` and ``car export pairs``, run as a user runs them: a subprocess in
a folder holding a planted context world, reading exit status and output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

import car_core as car_api
from car_core.estimators.pairs import read_pairs
from car_core.store import RunStore
from car_core.testing.synthetic_context import in_tool_description, injected

WORLD = """\
from car_core.testing.synthetic_context import in_tool_description, injected

def world():
    return injected(10)
"""


def car(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "160", "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def folder(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "planted.py").write_text(textwrap.dedent(WORLD))
    run = injected(10).failing_run(0)
    with RunStore(tmp_path / "car.db") as store:
        store.save(run)
    return tmp_path, run.id


def test_car_what_names_the_injected_message(folder: tuple[Path, str]) -> None:
    cwd, run_id = folder
    proc = car("what", run_id, "--step", "0", "--agent", "planted:world", "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["named"] == [3] and data["rollouts_used"] <= 64
    text = car("what", run_id, "--step", "0", "--agent", "planted:world", cwd=cwd)
    assert "user message 3: rescue" in text.stdout and "P.S." in text.stdout


def test_car_what_without_a_step_or_locus_is_one_clean_error(folder: tuple[Path, str]) -> None:
    cwd, run_id = folder
    proc = car("what", run_id, "--agent", "planted:world", cwd=cwd)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--step" in proc.stderr


def test_car_fix_removes_the_named_source_and_validates_it(folder: tuple[Path, str]) -> None:
    cwd, run_id = folder
    proc = car("fix", run_id, "--step", "0", "--agent", "planted:world",
               "--instruction", "never refund", "--json", cwd=cwd)
    assert proc.returncode == 1, proc.stderr  # the world ignores instructions: nothing rescues
    assert [r["kind"] for r in json.loads(proc.stdout)["ranked"]] == ["system prompt"]
    proc = car("fix", run_id, "--step", "0", "--agent", "planted:world", "--pairs", "p.jsonl",
               cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert "remove user message 3" in proc.stdout
    assert [p["rescue"]["label"] for p in read_pairs(cwd / "p.jsonl")] == [
        "remove user message 3"]


def test_car_export_pairs_writes_the_schema(folder: tuple[Path, str]) -> None:
    cwd, run_id = folder
    proc = car("export", "pairs", run_id, "--step", "0", "--agent", "planted:world",
               "--out", "pairs.jsonl", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert "wrote 1 pair(s)" in proc.stdout
    (pair,) = read_pairs(cwd / "pairs.jsonl")
    assert pair["failing_action"] == "bad" and pair["rescue_ci"][0] > 0


def test_a_bad_guard_spec_is_a_usage_error(folder: tuple[Path, str]) -> None:
    cwd, run_id = folder
    proc = car("fix", run_id, "--step", "0", "--agent", "planted:world", "--guard", "x", cwd=cwd)
    assert proc.returncode == 2 and "J:JSON" in proc.stderr


def test_car_what_looks_inside_the_locus_of_the_latest_attribution(
        folder: tuple[Path, str]) -> None:
    cwd, run_id = folder
    world = injected(10)
    with RunStore(cwd / "car.db") as store:
        run = store.load(run_id)
        found = car_api.contrastive(run, world.agent(), outcome=world.outcome, rollouts=4)
        # a one-step run's context cause is no step's rescue: plant the locus the way a
        # finished attribution stores it, to test that `car what` reads it
        store.save_attribution(run_id, "contrastive", {}, replace(found, locus=0))
    proc = car("what", run_id, "--agent", "planted:world", "--json", "--report", "r.html",
               cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["step"] == 0
    html = (cwd / "r.html").read_text()
    assert 'id="what"' in html and 'id="rescue"' in html  # the attribution's page, with the panel


def test_car_attribute_what_finds_the_locus_then_the_message_inside_it(tmp_path: Path) -> None:
    """A world whose one decision follows the injected P.S. with probability 0.6 (and never
    without it): re-drawing step 0 rescues 1 − 0.6 = 0.4, so the attribution (64 rollouts)
    names it, and removing message 3 rescues 0.6, so `--what` names that message inside it
    with `car what`'s default budget. Seeds are fixed, so the run is the same every time."""
    (tmp_path / "planted.py").write_text(
        "from car_core.testing.synthetic_context import injected\n\n"
        "def world():\n    return injected(10, p_hi=0.6, p_lo=0.0)\n")
    run = injected(10, p_hi=0.6, p_lo=0.0).failing_run(0)
    with RunStore(tmp_path / "car.db") as store:
        store.save(run)
    proc = car("attribute", run.id, "--agent", "planted:world", "--rollouts", "64", "--what",
               "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["locus"] == 0 and data["what"]["step"] == 0 and data["what"]["named"] == [3]
    text = car("attribute", run.id, "--agent", "planted:world", "--rollouts", "64", "--what",
               cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("Step 0 (") and "user message 3: rescue" in text.stdout


PROMPT_WORLD = """\
from car_core.testing.synthetic_context import in_tool_description

def world():
    return in_tool_description(10)
"""


def test_car_what_lists_the_system_prompt_and_names_a_tool_description(tmp_path: Path) -> None:
    (tmp_path / "prompted.py").write_text(PROMPT_WORLD)
    run = in_tool_description(10).failing_run(0)
    with RunStore(tmp_path / "car.db") as store:
        store.save(run)
    proc = car("what", run.id, "--step", "0", "--agent", "prompted:world", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[1] tool lookup_policy: description: rescue" in proc.stdout
    effects = proc.stdout.split("effect of keeping each source")[1]
    assert "  system prompt" in effects  # offered as a source, with its effect, not named
    assert "tool issue_refund: description" in effects
