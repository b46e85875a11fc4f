"""The ``car`` command, run the way a user runs it: a subprocess in a folder, reading its exit
status, stdout and stderr."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _report_data import contrastive_dict

from car_core import synthetic as syn
from car_core.store import RunStore
from car_core.trajectory import Step, Trajectory

PIVOT = "car_core.synthetic:pivot"


def car(*args: str, cwd: Path, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(Path(__file__).parents[1]),
           **(env or {})}
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def one_clean_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The error is one line on stderr, never a traceback."""
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("car: error: "), proc.stderr
    return lines[0]


@pytest.fixture
def pivot_store(tmp_path: Path, pivot_run: Trajectory) -> tuple[Path, Trajectory]:
    with RunStore(tmp_path / "car.db") as s:
        s.save(pivot_run)
    return tmp_path, pivot_run


def test_help_documents_commands_and_exit_codes(tmp_path):
    proc = car("--help", cwd=tmp_path)
    assert proc.returncode == 0
    for command in ("demo", "runs", "show", "intervene", "attribute", "report"):
        assert command in proc.stdout
    assert "Exit codes: 0 ok" in proc.stdout and "3 budget exhausted" in proc.stdout


def test_no_command_is_a_usage_error(tmp_path):
    assert car("frobnicate", cwd=tmp_path).returncode == 2


def test_runs_lists_the_stored_run_as_a_table_and_json(pivot_store):
    folder, run = pivot_store
    table = car("runs", cwd=folder)  # --store defaults to ./car.db
    assert table.returncode == 0 and run.id in table.stdout
    rows = json.loads(car("runs", "--json", cwd=folder).stdout)
    assert [r["id"] for r in rows] == [run.id]
    assert rows[0]["n_steps"] == len(run.steps) and rows[0]["outcome"] == 1.0


def test_show_prints_every_step_and_json_round_trips(pivot_store):
    folder, run = pivot_store
    proc = car("show", run.id, cwd=folder)
    assert proc.returncode == 0
    for s in run.steps:
        assert f"[{s.index}]" in proc.stdout
    data = json.loads(car("show", run.id, "--json", cwd=folder).stdout)
    assert Trajectory.from_dict(data).digest == run.digest


def test_show_prints_terminal_escapes_and_markup_as_text(tmp_path):
    steps = [Step(0, "\x1b[2J\x1b[31m[bold red]owned[/]", None, False)]
    run = Trajectory.new(context="ctx", steps=steps)
    with RunStore(tmp_path / "car.db") as s:
        s.save(run)
    proc = car("show", run.id, cwd=tmp_path)
    assert proc.returncode == 0
    assert "\x1b" not in proc.stdout
    assert "\\x1b[2J\\x1b[31m[bold red]owned[/]" in proc.stdout


def test_unknown_run_id_exits_4(pivot_store):
    folder, _ = pivot_store
    for args in (("show", "nope"), ("attribute", "nope", "--agent", PIVOT)):
        proc = car(*args, cwd=folder)
        assert proc.returncode == 4, args
        assert "no run 'nope'" in one_clean_error(proc)


def test_missing_store_exits_4_and_is_not_created(tmp_path):
    for args in (("runs",), ("attribute", "x", "--agent", PIVOT)):
        proc = car(*args, "--store", "absent.db", cwd=tmp_path)
        assert proc.returncode == 4, args
        assert "no CAR store at absent.db" in one_clean_error(proc)
    # The installed console script maps the same way (main() returns the status).
    script = Path(sys.executable).with_name("car")
    proc = subprocess.run([str(script), "show", "x", "--store", "absent.db"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4 and "no CAR store" in one_clean_error(proc)
    assert not (tmp_path / "absent.db").exists()


def test_a_database_that_is_not_a_car_store_exits_4_untouched(tmp_path):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    before = other.read_bytes()
    proc = car("runs", "--store", str(other), cwd=tmp_path)
    assert proc.returncode == 4
    assert "not create" in one_clean_error(proc)
    assert other.read_bytes() == before


def test_agent_that_cannot_be_imported_exits_2(pivot_store):
    folder, run = pivot_store
    for spec, message in (("no_such_module:make", "cannot import 'no_such_module'"),
                          ("car_core.synthetic:no_such_factory", "has no attribute")):
        proc = car("attribute", run.id, "--agent", spec, cwd=folder)
        assert proc.returncode == 2, spec
        assert message in one_clean_error(proc)


def test_budget_of_zero_exits_2_before_spending(pivot_store):
    folder, run = pivot_store
    proc = car("attribute", run.id, "--agent", PIVOT, "--budget", "0", cwd=folder)
    assert proc.returncode == 2
    assert "--budget 0 cannot pay for any rollout" in one_clean_error(proc)
    with RunStore(folder / "car.db") as s:
        assert s.attributions(run.id) == [] and s.children(run.id) == []


def test_intervene_estimates_the_planted_probability(pivot_store):
    folder, run = pivot_store
    proc = car("intervene", run.id, "--agent", PIVOT, "--do", "resample:2", "--rollouts", "200",
               "--json", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    dist = json.loads(proc.stdout)
    # Re-drawing the pivot fails with p_bad = 0.3. With 200 Bernoulli rollouts the standard
    # error is sqrt(0.3 * 0.7 / 200) = 0.032; 4 standard errors = 0.13 (the seed is fixed).
    assert dist["n"] == 200 and abs(dist["mean"] - syn.pivot().bad_prob[2]) < 0.13
    assert dist["ci"][0] <= dist["mean"] <= dist["ci"][1]


def test_intervene_forced_observation_keeps_the_recorded_action(pivot_store):
    folder, run = pivot_store
    proc = car("intervene", run.id, "--agent", PIVOT, "--do", 'observation:2:{"ack": "good"}',
               "--rollouts", "16", "--json", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    # The outcome reads step 2's action, which do_observation keeps: every branch fails.
    assert json.loads(proc.stdout)["mean"] == 1.0


@pytest.mark.parametrize("spec, message", [
    ("resample:x", "is not a step number"),
    ("action:2:{oops", "the value is not JSON"),
    ("resample:99", "step 99"),
])
def test_intervene_bad_do_exits_2(pivot_store, spec, message):
    folder, run = pivot_store
    proc = car("intervene", run.id, "--agent", PIVOT, "--do", spec, cwd=folder)
    assert proc.returncode == 2, proc.stderr
    assert message in one_clean_error(proc)


def test_agent_and_outcome_load_from_the_current_folder(tmp_path):
    (tmp_path / "my_agent.py").write_text(textwrap.dedent('''
        import car_core as car

        def policy(history, rng):
            return {"n": history.index, "ok": bool(rng.random() < 0.5)}

        def make():
            return car.FunctionAgent(policy=policy, is_final=lambda a: a["n"] == 2, max_steps=3)

        def failed(run):
            return not run.steps[-1].action["ok"]
    '''))
    env_code = ("import car_core as car, my_agent\n"
                "run = car.record(my_agent.make(), outcome=my_agent.failed, seed=1)\n"
                "car.RunStore('car.db').save(run); print(run.id)")
    run_id = subprocess.run([sys.executable, "-c", env_code], cwd=tmp_path, check=True,
                            capture_output=True, text=True).stdout.strip()
    proc = car("intervene", run_id, "--agent", "my_agent:make", "--outcome", "my_agent:failed",
               "--do", 'action:2:{"n": 2, "ok": true}', "--rollouts", "4", "--json",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["mean"] == 0.0  # forcing a good last action avoids failure


def test_report_renders_the_latest_stored_attribution(pivot_store, pivot_model):
    folder, run = pivot_store
    truncated = {**contrastive_dict(pivot_model, run), "locus": None, "truncated": True,
                 "reason": "the budget tripped"}
    with RunStore(folder / "car.db") as s:
        s.save_attribution(run.id, "contrastive", {}, contrastive_dict(pivot_model, run))
        late = s.save_attribution(run.id, "contrastive", {}, truncated, status="truncated")
    proc = car("report", run.id, "--out", "r.html", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    html = (folder / "r.html").read_text()
    # A later truncated attribution does not hide the finished one.
    assert "Step 2 is where this run committed to failure" in html and run.id in html
    proc = car("report", run.id, "--attribution", late, "--out", "t.html", cwd=folder)
    assert proc.returncode == 0 and "the budget tripped" in (folder / "t.html").read_text()
    proc = car("report", run.id, "--attribution", "nope", cwd=folder)
    assert proc.returncode == 4
    assert "no attribution 'nope'" in one_clean_error(proc)


def test_report_without_attribution_writes_the_run(pivot_store):
    folder, run = pivot_store
    proc = car("report", run.id, "--out", "run.html", cwd=folder)
    assert proc.returncode == 0 and "no attribution yet" in proc.stdout
    assert "No attribution yet" in (folder / "run.html").read_text()


# -- attribute and demo (through the real estimators) ---------------------------------------------
def test_attribute_finds_the_planted_locus_and_stores_it(pivot_store, pivot_model):
    folder, run = pivot_store
    proc = car("attribute", run.id, "--agent", PIVOT, "--json", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["locus"] == pivot_model.locus == 2
    with RunStore(folder / "car.db") as s:
        stored = s.attributions(run.id)
        assert [a["id"] for a in stored] == [result["attribution_id"]]
        assert stored[0]["result"]["locus"] == 2
        assert len(list(s.branches(result["attribution_id"]))) == result["rollouts_used"]
    table = car("attribute", run.id, "--agent", PIVOT, "--executor", "async", "--concurrency",
                "4", cwd=folder)
    assert table.returncode == 0 and "◀ locus" in table.stdout and "Locus: step 2." in table.stdout
    # The executor flag reaches the estimator: the async backend gives the same estimate
    # (noise is keyed by task, not by scheduling).
    with RunStore(folder / "car.db") as s:
        first, second = (a["result"] for a in s.attributions(run.id))
    assert second["steps"] == first["steps"] and second["arms"] == first["arms"]


@pytest.mark.slow
def test_attribute_shapley_through_the_cli(tmp_path):
    model = syn.and_game()
    run = model.failing_run()
    with RunStore(tmp_path / "car.db") as s:
        s.save(run)
    proc = car("attribute", run.id, "--agent", "car_core.synthetic:and_game", "--method",
               "shapley", "--budget", "400", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr  # exact mode on 3 players fits in the budget
    result = json.loads(proc.stdout)
    assert result["method"] == "shapley" and not result["truncated"]
    assert result["rollouts_used"] <= 400
    # The analytic values (0.455, 0.455, 0 at p_bad 0.3) lie in the intervals the rollouts gave.
    for v, phi in zip(result["values"], model.shapley(), strict=True):
        assert v["ci"][0] <= phi <= v["ci"][1], (v, phi)
    assert car("report", run.id, "--out", "s.html", cwd=tmp_path).returncode == 0
    assert 'id="shapley-plot"' in (tmp_path / "s.html").read_text()


def test_attribute_exits_1_when_no_step_matters(tmp_path):
    run = syn.no_cause().failing_run()
    with RunStore(tmp_path / "car.db") as s:
        s.save(run)
    proc = car("attribute", run.id, "--agent", "car_core.synthetic:no_cause", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "No locus:" in proc.stdout


def test_attribute_exits_3_when_the_budget_runs_out_and_shows_progress(pivot_store):
    folder, run = pivot_store
    proc = car("attribute", run.id, "--agent", PIVOT, "--budget", "5", "--json", "--progress",
               cwd=folder)
    assert proc.returncode == 3, proc.stderr
    result = json.loads(proc.stdout)  # the bar goes to stderr: stdout stays pure JSON
    assert result["truncated"] and result["rollouts_used"] == 5
    assert result["budget_note"] == "rollout budget of 5 reached"
    # The bar: rollouts done / planned (capped by the budget), rate, budget left.
    assert "5/5" in proc.stderr and "rollouts/s" in proc.stderr
    assert "budget left 0" in proc.stderr


INTERRUPTING = '''
import os, signal
import car_core.synthetic as syn

def make():
    model = syn.pivot()
    agent = model.agent()
    inner, calls = agent.policy, [0]
    limit = int(os.environ.get("STOP_AFTER", "0"))

    def policy(history, rng):
        calls[0] += 1
        if limit and calls[0] == limit:
            os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C mid-attribution
        return inner(history, rng)

    agent.policy = policy
    return agent

outcome = syn.pivot().outcome
'''


@pytest.mark.slow
def test_ctrl_c_keeps_finished_branches_and_resume_finishes_the_same_result(pivot_store):
    folder, run = pivot_store
    (folder / "interrupting.py").write_text(INTERRUPTING)
    args = ("attribute", run.id, "--agent", "interrupting:make", "--outcome",
            "interrupting:outcome", "--rollouts", "16", "--json")
    stopped = car(*args, cwd=folder, env={"STOP_AFTER": "20"})  # the search decides in ~40-90
    assert stopped.returncode == 130, stopped.stderr
    assert "Traceback" not in stopped.stderr and stopped.stdout == ""
    resume_line = stopped.stderr.strip().splitlines()[-1].strip()
    assert resume_line.startswith("car attribute ") and " --resume " in resume_line
    aid = resume_line.split()[-1]
    with RunStore(folder / "car.db") as s:
        kept = len(list(s.branches(aid)))
        assert kept > 0 and s.attribution(aid)["status"] == "running"
    resumed = car(*resume_line.split()[1:], cwd=folder)
    assert resumed.returncode == 0, resumed.stderr
    fresh = car(*args, cwd=folder)
    a, b = json.loads(resumed.stdout), json.loads(fresh.stdout)
    assert a["attribution_id"] == aid
    assert a["locus"] == b["locus"] == 2
    assert a["steps"] == b["steps"] and a["arms"] == b["arms"]
    with RunStore(folder / "car.db") as s:
        assert len(list(s.branches(aid))) == a["rollouts_used"] >= kept


def test_resume_of_an_unknown_attribution_exits_4(pivot_store):
    folder, run = pivot_store
    proc = car("attribute", run.id, "--agent", PIVOT, "--resume", "nope", cwd=folder)
    assert proc.returncode == 4
    assert "no attribution 'nope'" in one_clean_error(proc)


@pytest.mark.slow
def test_demo_records_attributes_and_writes_the_report(tmp_path):
    proc = car("demo", "--policy", "synthetic", "--store", "demo.db", "--out", "demo.html",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "demo.html").read_text()
    assert "committed to failure" in html
    # The run the report explains is in the store, with its attribution.
    reported = re.search(r"<li>run <b>(\w+)</b></li>", html)
    assert reported
    runs = json.loads(car("runs", "--store", "demo.db", "--json", cwd=tmp_path).stdout)
    assert reported.group(1) in [r["id"] for r in runs]
    with RunStore(tmp_path / "demo.db") as s:
        assert s.attributions(reported.group(1))


def test_an_agent_that_raises_exits_5_with_the_step(pivot_store):
    folder, run = pivot_store
    (folder / "broken.py").write_text(textwrap.dedent('''
        import car_core.synthetic as syn

        def make():
            agent = syn.pivot().agent()

            def policy(history, rng):
                raise RuntimeError("model exploded")

            agent.policy = policy
            return agent

        outcome = syn.pivot().outcome
    '''))
    proc = car("intervene", run.id, "--agent", "broken:make", "--outcome", "broken:outcome",
               "--do", "resample:2", "--rollouts", "2", cwd=folder)
    assert proc.returncode == 5
    line = one_clean_error(proc)
    assert "model exploded" in line and "[step 2]" in line


def test_builtin_demo_used_when_the_adapters_demo_is_absent(tmp_path, capsys):
    """The fallback ``car demo`` runs when ``car_adapters.demo`` is not installed: a planted
    pivot run, attributed and reported (called in-process: with the adapters installed the
    subprocess path always takes their demo)."""
    from car_core.cli import _builtin_demo
    result = _builtin_demo(str(tmp_path / "d.db"), tmp_path / "d.html", False)
    assert result.locus == syn.pivot().locus == 2
    assert "Step 2 is where this run committed to failure" in (tmp_path / "d.html").read_text()
    assert "car attribute" in capsys.readouterr().out
    with RunStore(tmp_path / "d.db") as s:
        assert s.attributions(result.run_id)[0]["result"]["locus"] == 2


def test_executor_flags_build_the_named_backend():
    from car_core.cli import ExecutorName, _executor
    from car_core.execution import AsyncioExecutor, Sequential
    assert _executor(None, 16, None) is None  # the estimator picks one for the agent
    assert isinstance(_executor(ExecutorName.sequential, 16, None), Sequential)
    exe = _executor(ExecutorName.async_, 4, None)
    assert isinstance(exe, AsyncioExecutor) and exe.concurrency == 4


def test_resume_with_other_settings_is_refused(pivot_store):
    folder, run = pivot_store
    with RunStore(folder / "car.db") as s:
        aid = s.begin_attribution(run.id, "contrastive", {"seed": 0, "alpha": 0.05,
                                                          "rollouts": 32})
    proc = car("attribute", run.id, "--agent", PIVOT, "--resume", aid, "--seed", "3", cwd=folder)
    assert proc.returncode == 2
    assert "was started with seed 0, not 3" in one_clean_error(proc)
    proc = car("attribute", run.id, "--agent", PIVOT, "--resume", aid, "--method", "shapley",
               cwd=folder)
    assert proc.returncode == 2
    assert "resume it with --method contrastive" in one_clean_error(proc)
    with RunStore(folder / "car.db") as s:
        assert s.children(run.id) == []  # refused before any rollout
