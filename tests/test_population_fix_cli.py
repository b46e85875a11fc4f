"""``car fix --runs ID... | --failed`` and ``car export fix``, run as a user runs them, on the
planted two-mode population (``TwoModeDesk``, see ``tests/test_population_fix.py`` for the
planted rescues): the JSON contract, the answer first in plain words, storage, resume, and
``car fix RUN_ID`` refusing the population-only options.

Tolerances: a late run's pairs under the instruction are all zero under shared noise, so it
is never listed as rescued whatever K; the pooled interval is checked against the planted
value through its own coverage (≥ 95%).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import car_core as car
from car_core.fix_results import CSV_COLUMNS
from car_core.store import RunStore
from car_core.testing.synthetic_population import TwoModeDesk

DESK = TwoModeDesk()
AGENT = "car_core.testing.synthetic_population:TwoModeDesk"
POLICY = "car_core.testing.synthetic_population:careful_policy"
CONTRACT = {"rescue", "rescue_ci", "rescued", "not_rescued"}


def car_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[car.Trajectory]]:
    cwd = tmp_path_factory.mktemp("fix")
    runs = DESK.population(3, 2, seed=0, ids="fixcli")
    with RunStore(cwd / "car.db") as store:
        for r in runs:
            store.save(r)
    return cwd, runs


def test_fix_runs_json_keeps_the_contract_and_lists_every_run(folder):
    cwd, runs = folder
    late = {r.id for r in runs if r.context["mode"] == "late"}
    proc = car_cli("fix", "--runs", *(r.id for r in runs), "--agent", AGENT, "--instruction",
                   DESK.fix, "--policy", POLICY, "--rollouts", "16", "--json", cwd=cwd)
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    assert data["method"] == "population-fix" and data["runs_total"] == len(runs)
    assert len(data["candidates"]) == 2
    for c in data["candidates"]:
        assert CONTRACT <= c.keys()
        assert sorted(c["rescued"] + c["not_rescued"]) == sorted(r.id for r in runs)
        assert c["rescue_ci"][0] <= c["rescue"] <= c["rescue_ci"][1]
    instruction = data["candidates"][0]
    assert instruction["from_step"] == "locus" and set(instruction["not_rescued"]) >= late
    assert data["candidates"][1]["from_step"] == "0"
    # the loci were found by attributing the runs; the fix and that triage are listed
    listed = json.loads(car_cli("attributions", "--json", cwd=cwd).stdout)
    methods = {a["id"]: a["method"] for a in listed}
    assert methods[data["fix_id"]] == "population-fix"
    assert methods[f"{data['fix_id']}-loci"] == "triage"
    exported = car_cli("export", "fix", data["fix_id"], "--format", "csv", cwd=cwd)
    assert exported.returncode == 0, exported.stderr
    lines = exported.stdout.splitlines()
    assert lines[0] == ",".join(CSV_COLUMNS) and len(lines) == 1 + 2 * len(runs)
    as_json = json.loads(car_cli("export", "fix", data["fix_id"], cwd=cwd).stdout)
    assert as_json["candidates"] == data["candidates"]
    # resumed: every run is read back, nothing is spent
    again = car_cli("fix", "--resume", data["fix_id"], "--agent", AGENT, "--instruction",
                    DESK.fix, "--policy", POLICY, "--rollouts", "16", "--json", cwd=cwd)
    assert again.returncode == proc.returncode, again.stderr
    second = json.loads(again.stdout)
    assert second["rollouts_used"] == 0
    assert all(r["reused"] for c in second["candidates"] for r in c["per_run"])
    # --resume alone: a policy fix cannot be rebuilt from its stored label, so it says which
    # to give again (it said "no fix to test on the population")
    bare = car_cli("fix", "--resume", data["fix_id"], "--agent", AGENT, "--rollouts", "16",
                   cwd=cwd)
    assert bare.returncode == 2 and "cannot be rebuilt" in bare.stderr
    assert "give the fixes again" in bare.stderr


def test_fix_failed_says_the_answer_first_in_plain_words(folder):
    cwd, runs = folder
    proc = car_cli("fix", "--failed", "--agent", AGENT, "--system", DESK.fix, "--rollouts",
                   "32", "--json", cwd=cwd)
    assert proc.returncode in (0, 1), proc.stderr
    # an instruction or system line is rebuilt from its stored label: --resume alone goes on
    fid = json.loads(proc.stdout)["fix_id"]
    again = car_cli("fix", "--resume", fid, "--agent", AGENT, "--rollouts", "32", "--json",
                    cwd=cwd)
    assert again.returncode == proc.returncode, again.stderr
    assert json.loads(again.stdout)["rollouts_used"] == 0
    proc = car_cli("fix", "--failed", "--agent", AGENT, "--system", DESK.fix, "--rollouts",
                   "32", cwd=cwd)
    assert proc.returncode in (0, 1), proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"The fix 'system prompt: {DESK.fix}'")
    assert f"on average over the {len(runs)} failed runs" in first
    assert "fix " in proc.stdout and "car export fix" in proc.stdout
    # piped, as in CI: no progress unless asked for; asked for, a line per run tested
    assert "[1/" not in proc.stderr
    shown = car_cli("fix", "--failed", "--agent", AGENT, "--system", DESK.fix, "--rollouts",
                    "8", "--progress", cwd=cwd)
    assert shown.returncode in (0, 1), shown.stderr
    assert all(f"[{i}/{len(runs)}] run " in shown.stderr for i in range(1, len(runs) + 1))
    # with the time so far, and about how long is left until the last run
    assert re.search(rf"\[1/{len(runs)}\] run \w+ · \d+ s so far, about .+ left",
                     shown.stderr), shown.stderr


@pytest.mark.parametrize(("args", "words"), [
    (("A", "B"), "takes one RUN_ID"),
    (("--failed", "A"), "takes no RUN_ID"),
    (("A", "--system", "x"), "--system is for a population"),
    (("--failed", "--step", "1", "--instruction", "x"), "are for one run"),
    (("--failed",), "no fix to test"),
    (("--failed", "--guard", "2:x"), "is not JSON"),
    (("--failed", "--instruction", "x", "--from-step", "middle"), "--from-step"),
    (("--failed", "--instruction", "x", "--until", "1"), "no failed run matches"),
    (("--runs", "A", "--instruction", "x", "--session", "s1"), "select failed runs"),
    (("--failed", "--instruction", "x", "--since", "yesterday"), "neither a date"),
])
def test_bad_population_input_exits_2_with_a_hint(folder, args, words):
    cwd, _ = folder
    proc = car_cli("fix", *args, "--agent", AGENT, cwd=cwd)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr


def test_fix_failed_takes_the_selection_car_triage_takes(folder):
    """--since/--until/--agent-name/--test/--session pick the failed runs as `car triage`
    does: a window holding every recorded run keeps all of them."""
    cwd, runs = folder
    proc = car_cli("fix", "--failed", "--since", "2000-01-01", "--until", "2999-01-01",
                   "--agent", AGENT, "--instruction", DESK.fix, "--rollouts", "8", "--json",
                   cwd=cwd)
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads(proc.stdout)["runs_total"] == len(runs)


def test_resume_takes_the_stored_settings_a_flag_leaves_out(folder):
    """A user trial's `car fix --failed ... --resume FIX_ID` without --rollouts was refused,
    "was run with other rollouts", naming neither value (the fix had 32, the flag's default
    is 64), though `--resume FIX_ID` alone is documented to go on and `car attribute` takes
    a flag left out from the attribution. A flag left out takes the fix's setting; one given
    that differs is refused, naming both values."""
    cwd, runs = folder
    proc = car_cli("fix", "--failed", "--agent", AGENT, "--system", DESK.fix, "--rollouts",
                   "8", "--seed", "3", "--alpha", "0.1", "--budget", "5000", "--json",
                   cwd=cwd)
    assert proc.returncode in (0, 1), proc.stderr
    fid = json.loads(proc.stdout)["fix_id"]
    again = car_cli("fix", "--failed", "--agent", AGENT, "--resume", fid, "--json", cwd=cwd)
    assert again.returncode == proc.returncode, again.stderr
    resumed = json.loads(again.stdout)
    assert resumed["rollouts_used"] == 0
    # --alpha and --budget left out are the fix's too (they fell back to 0.05 and no cap)
    assert resumed["alpha"] == 0.1
    assert resumed["params"]["budget"]["rollouts"] == 5000
    alpha = car_cli("fix", "--failed", "--agent", AGENT, "--resume", fid, "--alpha", "0.05",
                    cwd=cwd)
    assert alpha.returncode == 2 and "--alpha 0.1" in alpha.stderr, alpha.stderr
    other = car_cli("fix", "--failed", "--agent", AGENT, "--resume", fid, "--rollouts", "16",
                    cwd=cwd)
    assert other.returncode == 2, other.stderr
    assert "--rollouts 8" in other.stderr and "16" in other.stderr
    seed = car_cli("fix", "--failed", "--agent", AGENT, "--resume", fid, "--seed", "0",
                   cwd=cwd)
    assert seed.returncode == 2 and "--seed 3" in seed.stderr, seed.stderr
