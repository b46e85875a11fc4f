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
from dataclasses import replace
from pathlib import Path

import pytest
from _broken_agent import write_raising_agent
from _report_data import contrastive_dict

from car_core.model.trajectory import Step, Trajectory
from car_core.results import ContrastiveResult
from car_core.store import RunStore
from car_core.testing import synthetic as syn

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
    said = " ".join(proc.stdout.split())  # click wraps the help to the terminal's width
    assert "Exit codes: 0 ok" in said and "3 budget exhausted" in said


def test_no_command_is_a_usage_error(tmp_path):
    assert car("frobnicate", cwd=tmp_path).returncode == 2


def test_runs_lists_the_stored_run_as_a_table_and_json(pivot_store):
    folder, run = pivot_store
    table = car("runs", cwd=folder)  # --store defaults to ./car.db
    assert table.returncode == 0 and run.id in table.stdout
    assert "1.00 failed" in table.stdout  # which runs failed, in a word
    rows = json.loads(car("runs", "--json", cwd=folder).stdout)
    assert [r["id"] for r in rows] == [run.id]
    assert rows[0]["n_steps"] == len(run.steps) and rows[0]["outcome"] == 1.0


def test_runs_say_what_each_run_was_asked_without_squeezing_the_other_columns(
        tmp_path, pivot_run):
    """Thirty runs of an eval set recorded at once share a second: a user trial had to open
    each with ``car show`` to find its input. The last user message is the ``input``
    (``--json`` too): a turn of a conversation starts from the history before it, and a user
    trial's three turns of one session all showed the first turn's message. A terminal too
    narrow for it leaves it out, never cutting the ids."""
    contexts = {"asks-as-text": "Refund order 7, please",
                "asks-in-messages": {"messages": [
                    {"role": "system", "content": "You are a desk."},
                    {"role": "user", "content": "Where is\norder 8?"}]},
                "asks-in-items": [{"role": "user", "content": [
                    {"type": "input_text", "text": "Cancel order 9"}]}],
                "asks-in-a-turn": [{"role": "user", "content": "My order is 10"},
                                   {"role": "assistant", "content": "Noted."},
                                   {"role": "user", "content": "Refund it"}]}
    want = {"asks-as-text": "Refund order 7, please", "asks-in-messages": "Where is order 8?",
            "asks-in-items": "Cancel order 9", "asks-in-a-turn": "Refund it"}
    with RunStore(tmp_path / "car.db") as s:
        for rid, context in contexts.items():
            s.save(Trajectory.new(context=context, id=rid, agent=pivot_run.agent,
                                  steps=[replace(st, digest="") for st in pivot_run.steps],
                                  outcome=pivot_run.outcome))
    rows = json.loads(car("runs", "--json", cwd=tmp_path).stdout)
    assert {r["id"]: r["input"] for r in rows} == want
    wide = car("runs", cwd=tmp_path, env={"COLUMNS": "160"}).stdout
    assert "input" in wide and all(text in wide for text in want.values())
    narrow = car("runs", cwd=tmp_path, env={"COLUMNS": "80"}).stdout
    assert all(rid in narrow for rid in contexts) and "input" not in narrow


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


HOSTILE_ID = "[link=http://evil.example]innocent[/link]\x1b]8;;http://x\x07id[/]\u202egnp.exe"


def test_run_ids_and_statuses_reach_the_terminal_escaped(tmp_path):
    """Ids, agents and statuses are agent-controlled text too: no rich markup is parsed
    (no live hyperlink), no escape sequence runs, no bidi override reorders the line; JSON
    keeps the same value with the override written as an escape."""
    run = Trajectory.new(context="ctx", steps=[Step(0, "\u202eaction", None, False)],
                         id=HOSTILE_ID, agent="agent\u2066[red]x[/red]")
    with RunStore(tmp_path / "car.db") as s:
        s.save(run)
    for args in (["runs"], ["show", HOSTILE_ID], ["show", HOSTILE_ID, "--full"],
                 ["show", HOSTILE_ID, "--json"], ["runs", "--json"]):
        proc = car(*args, cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stderr)
        for raw in ("\x1b", "\x07", "\u202e", "\u2066"):
            assert raw not in proc.stdout, (args, raw)
        if "--json" in args:
            data = json.loads(proc.stdout)
            ids = [r["id"] for r in data] if isinstance(data, list) else [data["id"]]
            assert ids == [HOSTILE_ID]
        else:
            assert "[link=http://evil.example]innocent[/link]" in proc.stdout
            assert "\\u202e" in proc.stdout and "\\x1b" in proc.stdout
    proc = car("show", HOSTILE_ID + "x", cwd=tmp_path)  # in an error line as well
    assert proc.returncode == 4 and "\x1b" not in proc.stderr and "\u202e" not in proc.stderr


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
    # a module that is there but raises on import (its own missing dependency, a bug): the
    # hint to run car from its folder sent a user trial where they already were
    for body, raised in (("import no_such_dependency\n", "ModuleNotFoundError"),
                         ("raise TypeError('bad app')\n", "TypeError")):
        (folder / "broken_app.py").write_text(body, encoding="utf-8")
        said = one_clean_error(car("attribute", run.id, "--agent", "broken_app:make",
                                   cwd=folder))
        assert f"importing 'broken_app' for --agent raised {raised}" in said
        assert "run car from the folder" not in said and "fix the error in broken_app" in said


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
        s.save_attribution(run.id, "contrastive", {}, ContrastiveResult.from_dict(
            contrastive_dict(pivot_model, run)))
        late = s.save_attribution(run.id, "contrastive", {},
                                  ContrastiveResult.from_dict(truncated), status="truncated")
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
        assert [a.id for a in stored] == [result["attribution_id"]]
        assert stored[0].result.locus == 2
        assert len(list(s.branches(result["attribution_id"]))) == result["rollouts_used"]
    table = car("attribute", run.id, "--agent", PIVOT, "--executor", "async", "--concurrency",
                "4", cwd=folder)
    assert table.returncode == 0 and "<- locus" in table.stdout
    assert table.stdout.startswith("Step 2 (synthetic:pivot chose ")
    # The executor flag reaches the estimator: the async backend gives the same estimate
    # (noise is keyed by task, not by scheduling).
    with RunStore(folder / "car.db") as s:
        first, second = (a.result for a in s.attributions(run.id))
    assert second.steps == first.steps and second.arms == first.arms


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
    assert proc.stdout.startswith("No single step caused the failure: ")


def test_attribute_exits_3_when_the_budget_runs_out_and_shows_progress(pivot_store):
    folder, run = pivot_store
    proc = car("attribute", run.id, "--agent", PIVOT, "--budget", "5", "--json", "--progress",
               cwd=folder)
    assert proc.returncode == 3, proc.stderr
    result = json.loads(proc.stdout)  # the bar goes to stderr: stdout stays pure JSON
    assert result["truncated"] and result["rollouts_used"] == 5
    assert result["budget_note"] == "rollout budget of 5 reached"
    # stderr is a pipe here: plain lines, not a redrawn bar: rollouts done / planned (capped
    # by the budget), rate, budget left
    progress = proc.stderr.splitlines()[0]
    assert progress.startswith(f"contrastive {run.id}: 5 of 5 rollouts, ")
    assert "/s, budget left 0" in progress and "\r" not in proc.stderr


INTERRUPTING = '''
import os, signal
import car_core.testing.synthetic as syn

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
        assert kept > 0 and s.attribution(aid).status == "running"
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
    write_raising_agent(folder, "model exploded")
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
        assert s.attributions(result.run_id)[0].result.locus == 2


def test_executor_flags_build_the_named_backend():
    from car_core.cli import ExecutorName
    from car_core.cli.kit import chosen_executor
    from car_core.engine.execution import AsyncioExecutor, Sequential
    assert chosen_executor(None, None) is None  # the estimator picks one for the agent
    assert isinstance(chosen_executor(ExecutorName.sequential, None), Sequential)
    exe = chosen_executor(ExecutorName.async_, 4)
    assert isinstance(exe, AsyncioExecutor) and exe.concurrency == 4
    # --concurrency alone asks for that many at once: it was dropped (a trial's 64 ran 16)
    alone = chosen_executor(None, 64)
    assert isinstance(alone, AsyncioExecutor) and alone.concurrency == 64


def test_resume_with_other_settings_is_refused(pivot_store):
    folder, run = pivot_store
    with RunStore(folder / "car.db") as s:
        aid = s.begin_attribution(run.id, "contrastive", {"seed": 0, "alpha": 0.05,
                                                          "rollouts": 32})
    proc = car("attribute", run.id, "--agent", PIVOT, "--resume", aid, "--seed", "3", cwd=folder)
    assert proc.returncode == 2
    assert "was started with seed 0, not 3" in one_clean_error(proc)
    proc = car("attribute", run.id, "--agent", PIVOT, "--resume", aid, "--alpha", "0.1",
               cwd=folder)
    assert proc.returncode == 2
    assert "was started with alpha 0.05, not 0.1" in one_clean_error(proc)
    proc = car("attribute", run.id, "--agent", PIVOT, "--resume", aid, "--method", "shapley",
               cwd=folder)
    assert proc.returncode == 2
    assert "resume it with --method contrastive" in one_clean_error(proc)
    with RunStore(folder / "car.db") as s:
        assert s.children(run.id) == []  # refused before any rollout


def test_resume_with_a_larger_rollout_cap_continues_the_attribution(pivot_store):
    """The API's rule: raising --rollouts (or --budget) on a resume continues the same
    attribution and prints what a fresh attribution with that cap prints."""
    folder, run = pivot_store
    base = ("attribute", run.id, "--agent", PIVOT, "--json")
    small = car(*base, "--rollouts", "16", "--budget", "5", cwd=folder)
    assert small.returncode == 3, small.stderr
    aid = json.loads(small.stdout)["attribution_id"]
    # the smaller --budget given at the start stays unless the resume lifts it too
    cap = str(len(run.steps) * 32)  # n·K, the cap a fresh run derives
    grown = car(*base, "--rollouts", "32", "--budget", cap, "--resume", aid, cwd=folder)
    assert grown.returncode == 0, grown.stderr
    fresh = car(*base, "--rollouts", "32", cwd=folder)
    a, b = json.loads(grown.stdout), json.loads(fresh.stdout)
    assert a["attribution_id"] == aid != b["attribution_id"]
    for data in (a, b):  # what names the attribution and its example branch, not the estimate
        data.pop("attribution_id")
        example = data.pop("example_branch")
        assert example["steps"] and example["outcome"]["value"] == 0.0
    assert a == b
    with RunStore(folder / "car.db") as s:
        assert s.attribution(aid).status == "complete"


def test_a_resume_without_flags_continues_with_the_attributions_own_settings(pivot_store):
    """Leaving --seed, --alpha, --rollouts and --budget out of a resume means "as started",
    not the defaults: the resumed result is the one a fresh run with those settings gives."""
    folder, run = pivot_store
    base = ("attribute", run.id, "--agent", PIVOT, "--json")
    started = ("--rollouts", "12", "--seed", "3", "--alpha", "0.1")
    small = car(*base, *started, "--budget", "5", cwd=folder)
    assert small.returncode == 3, small.stderr
    aid = json.loads(small.stdout)["attribution_id"]
    with RunStore(folder / "car.db") as s:
        assert s.attribution(aid).params["budget"]["rollouts"] == 5
    still_capped = car(*base, "--resume", aid, cwd=folder)
    assert still_capped.returncode == 3, still_capped.stderr  # its own --budget 5, kept
    cap = str(len(run.steps) * 12)
    resumed = car(*base, "--resume", aid, "--budget", cap, cwd=folder)
    assert resumed.returncode == 0, resumed.stderr
    fresh = car(*base, *started, cwd=folder)
    a, b = json.loads(resumed.stdout), json.loads(fresh.stdout)
    for data in (a, b):
        data.pop("attribution_id"), data.pop("example_branch")
    assert a == b


# -- read commands write nothing; safety and recovery ----------------------------------------
def settled_store(folder: Path, *runs: Trajectory) -> Path:
    db = folder / "car.db"
    with RunStore(db) as s:
        for r in runs:
            s.save(r)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    return db


def test_read_commands_leave_no_file_beside_the_store(tmp_path, pivot_run):
    db = settled_store(tmp_path, pivot_run)
    before = (sorted(os.listdir(tmp_path)), db.read_bytes())
    out = tmp_path.parent / f"{tmp_path.name}-report.html"
    for args in (["runs"], ["show", pivot_run.id], ["attributions"],
                 ["report", pivot_run.id, "--out", str(out)]):
        proc = car(*args, cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stderr)
        assert (sorted(os.listdir(tmp_path)), db.read_bytes()) == before, args


def as_nobody(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``car`` as an unprivileged user (file modes do not bind root, who runs the tests). What
    the command imports is imported first, as root: the checkout may sit in a folder only root
    may enter (``mktemp -d``), where nobody could not import it after the switch."""
    code = textwrap.dedent(f"""
        import contextlib, io, os, shutil, sys, tempfile
        from car_core.cli import main
        # the same command first, as root, on a copy: it imports all it will need, lazily
        # imported parts of typer, rich and pydantic included
        here, copy = os.getcwd(), tempfile.mkdtemp()
        shutil.copytree(here, copy, dirs_exist_ok=True)
        os.chdir(copy)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                main({list(args)!r})
            except BaseException:
                pass
        os.chdir(here)
        shutil.rmtree(copy)
        if os.geteuid() == 0:  # after the imports: the interpreter's files are root's
            os.setgid(65534); os.setuid(65534)
        sys.exit(main({list(args)!r}))
    """)
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_store_in_a_read_only_folder_is_listable_and_refuses_an_attribution(
        tmp_path, pivot_run):
    import shutil
    import tempfile
    folder = Path(tempfile.mkdtemp(prefix="car-ro-"))  # pytest's own tmp is root-only
    db = settled_store(folder, pivot_run)
    before = (sorted(os.listdir(folder)), db.read_bytes())
    os.chmod(db, 0o444)
    os.chmod(folder, 0o555)
    try:
        listed = as_nobody("runs", "--json", cwd=folder)
        assert listed.returncode == 0, listed.stderr
        assert [r["id"] for r in json.loads(listed.stdout)] == [pivot_run.id]
        shown = as_nobody("show", pivot_run.id, cwd=folder)
        assert shown.returncode == 0, shown.stderr
        attributed = as_nobody("attribute", pivot_run.id, "--agent", PIVOT, "--rollouts", "4",
                               cwd=folder)
        assert attributed.returncode == 4, attributed.stderr
        assert "read-only" in one_clean_error(attributed)
    finally:
        os.chmod(folder, 0o755)
        os.chmod(db, 0o644)
    assert (sorted(os.listdir(folder)), db.read_bytes()) == before
    shutil.rmtree(folder)


def test_a_run_recorded_with_another_agent_is_refused_unless_forced(tmp_path):
    and_run = syn.and_game().failing_run()
    settled_store(tmp_path, and_run)
    proc = car("attribute", and_run.id, "--agent", PIVOT, "--rollouts", "4", cwd=tmp_path)
    assert proc.returncode == 2
    line = one_clean_error(proc)  # refused before it began: no attribution, no resume line
    assert "recorded with agent 'synthetic:and'" in line and "--force-agent" in line
    with RunStore(tmp_path / "car.db") as s:
        assert s.attributions(and_run.id) == [] and s.runs(branches=True) == s.runs()
    proc = car("intervene", and_run.id, "--agent", PIVOT, "--do", "resample:1", cwd=tmp_path)
    assert proc.returncode == 2 and "--force-agent" in one_clean_error(proc)
    forced = car("attribute", and_run.id, "--agent", PIVOT, "--rollouts", "4",
                 "--force-agent", cwd=tmp_path)
    assert forced.returncode in (0, 1, 3), forced.stderr  # it ran, whatever it found


def test_attributions_lists_them_and_report_says_which_it_shows(pivot_store):
    folder, run = pivot_store
    c = car("attribute", run.id, "--agent", PIVOT, "--rollouts", "8", "--json", cwd=folder)
    s = car("attribute", run.id, "--agent", PIVOT, "--method", "shapley", "--budget", "600",
            "--json", cwd=folder)
    cid, sid = json.loads(c.stdout)["attribution_id"], json.loads(s.stdout)["attribution_id"]
    listed = car("attributions", run.id, "--json", cwd=folder)
    assert listed.returncode == 0, listed.stderr
    rows = {r["id"]: r for r in json.loads(listed.stdout)}
    assert rows[cid]["method"] == "contrastive" and rows[sid]["method"] == "shapley"
    assert rows[cid]["locus"] == json.loads(c.stdout)["locus"]
    assert rows[cid]["rollouts"] == json.loads(c.stdout)["rollouts_used"]
    assert rows[cid]["status"] == "complete"
    table = car("attributions", cwd=folder)
    assert cid in table.stdout and "shapley" in table.stdout
    latest = car("report", run.id, cwd=folder)
    assert sid in latest.stdout and "car attributions" in latest.stdout
    page = (folder / "report.html").read_text()
    assert f"Showing attribution {sid} (shapley" in page and "--attribution ID" in page
    picked = car("report", run.id, "--method", "contrastive", cwd=folder)
    assert picked.returncode == 0 and cid in picked.stdout
    assert f"Showing attribution {cid} (contrastive" in (folder / "report.html").read_text()


EDITS_MODULE = '''
import os
def keep(history):
    with open("edits.log", "a") as f:
        f.write(str(history.index) + "\\n")
    return history
'''


def test_intervene_do_context_loads_the_edit_function(pivot_store):
    folder, run = pivot_store
    (folder / "edits.py").write_text(EDITS_MODULE)
    proc = car("intervene", run.id, "--agent", PIVOT, "--do", "context:2:edits:keep",
               "--rollouts", "4", "--json", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["n"] == 4
    assert (folder / "edits.log").read_text().split() == ["2"] * 4  # once per branch
    bad = car("intervene", run.id, "--agent", PIVOT, "--do", "context:2:edits:nope", cwd=folder)
    assert bad.returncode == 2 and "has no attribute" in one_clean_error(bad)


def test_a_huge_rollout_count_under_a_small_budget_runs_in_bounded_memory(pivot_store):
    """10**9 rollouts per arm under --budget 12 (too few to decide this run), in a process
    limited to 2 GiB of address space: building the tasks up front would need hundreds of GB."""
    folder, run = pivot_store
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from car_core.cli import main
        sys.exit(main(["attribute", {run.id!r}, "--agent", {PIVOT!r}, "--rollouts",
                       str(10**9), "--budget", "12", "--json"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert proc.returncode == 3, proc.stderr  # the budget ran out, as asked
    assert json.loads(proc.stdout)["rollouts_used"] == 12
    assert "--resume" in proc.stderr  # and it says how to continue


@pytest.mark.parametrize(("args", "code", "message"), [
    (["runs", "--limit", str(2**70)], 0, None),
    (["attribute", "RUN", "--agent", PIVOT, "--seed", str(2**64)], 2, "--seed"),
    (["intervene", "RUN", "--agent", PIVOT, "--do", "resample:1", "--seed", str(2**64)], 2,
     "--seed"),
    # 20,000 deep (the shell's limit on one argument is 128 KiB); Python's JSON reader stops
    # at about 1,000
    (["intervene", "RUN", "--agent", PIVOT, "--do", "action:1:" + "[" * 20000 + "]" * 20000],
     2, "nested too deep"),
    (["intervene", "RUN", "--agent", PIVOT, "--do", "x" * 50000], 2, "is not a step number"),
    (["attribute", "RUN"], 2, "Missing option '--agent'"),
    (["attribute", "RUN", "--agent", PIVOT, "--method", "bogus"], 2, "--method"),
    (["show", "id[/]"], 4, "id[/]"),
    (["show", "[link=http://evil.example]innocent[/link]"], 4, "[link=http://evil.example]"),
])
def test_small_bad_inputs_exit_cleanly(pivot_store, args, code, message):
    folder, run = pivot_store
    args = [run.id if a == "RUN" else a for a in args]
    proc = car(*args, cwd=folder)
    assert proc.returncode == code, proc.stderr
    if code:
        line = one_clean_error(proc)
        assert len(line) < 2000 and message in line


EXITING = '''
import sys
import car_core.testing.synthetic as syn

def factory():
    sys.exit(0)

def agent_exits():
    model = syn.pivot()
    agent = model.agent()
    def policy(history, rng):
        sys.exit(0)
    agent.policy = policy
    return agent

def outcome_exits(run):
    sys.exit(0)

def agent_fails():
    model = syn.pivot()
    agent = model.agent()
    def policy(history, rng):
        raise RuntimeError("broken tool")
    agent.policy = policy
    return agent

outcome = syn.pivot().outcome
'''


@pytest.mark.parametrize(("agent", "outcome"), [
    ("exiting:factory", "exiting:outcome"), ("exiting:agent_exits", "exiting:outcome"),
    (PIVOT, "exiting:outcome_exits")])
def test_user_code_calling_sys_exit_is_not_a_silent_success(pivot_store, agent, outcome):
    folder, run = pivot_store
    (folder / "exiting.py").write_text(EXITING)
    for command in (["attribute", run.id, "--rollouts", "4"],
                    ["intervene", run.id, "--do", "resample:2", "--rollouts", "4"]):
        proc = car(*command, "--agent", agent, "--outcome", outcome, cwd=folder)
        assert proc.returncode == 5, (command, proc.stderr)
        assert "called sys.exit(0)" in proc.stderr and "Traceback" not in proc.stderr


def test_every_branch_failing_exits_5_in_attribute_and_intervene(pivot_store):
    folder, run = pivot_store
    (folder / "exiting.py").write_text(EXITING)
    common = ["--agent", "exiting:agent_fails", "--outcome", "exiting:outcome",
              "--rollouts", "4"]
    attributed = car("attribute", run.id, *common, cwd=folder)
    intervened = car("intervene", run.id, "--do", "resample:2", *common, cwd=folder)
    assert attributed.returncode == intervened.returncode == 5, (attributed.stderr,
                                                                  intervened.stderr)


def test_attributions_says_interrupted_for_a_running_row_no_live_claim_holds(pivot_store):
    """An attribution stopped by Ctrl-C stays stored as running; with no live claim on it,
    `car attributions` lists it as interrupted (it read "running" forever)."""
    folder, run = pivot_store
    path = folder / "car.db"
    with RunStore(path) as store:
        stopped = store.begin_attribution(run.id, "contrastive", {"rollouts": 8})
    # the store closed: its claim is gone, as when the process stopped
    listed = car("attributions", "--json", "--store", str(path), cwd=folder)
    assert listed.returncode == 0, listed.stderr
    rows = {r["id"]: r for r in json.loads(listed.stdout)}
    assert rows[stopped]["status"] == "interrupted"
    with RunStore(path) as store:  # a claim this process holds: it may be running now
        live = store.begin_attribution(run.id, "contrastive", {"rollouts": 8})
        listed = car("attributions", "--json", "--store", str(path), cwd=folder)
        rows = {r["id"]: r for r in json.loads(listed.stdout)}
        assert rows[live]["status"] == "running"


def test_out_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A trial's ``car report --out r.html`` on a full disk exited 2 but left a truncated
    12 KB file where a good report had been. ``--out`` writes beside the file and renames it
    over; a full disk leaves the old file and says to free space."""
    import errno
    from pathlib import Path

    from car_core.cli import kit
    from car_core.errors import InvalidInput
    target = tmp_path / "r.html"
    target.write_text("the good report", encoding="utf-8")
    real = Path.write_text

    def half_then_full(self, text, *args, **kwargs):
        real(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_full)
    with pytest.raises(InvalidInput, match="No space left") as raised:
        kit.write_out(target, "a new report " * 100, "pass --out a writable path")
    monkeypatch.setattr(Path, "write_text", real)
    assert "free space" in (raised.value.hint or "")
    assert target.read_text(encoding="utf-8") == "the good report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]
    kit.write_out(target, "a new report", "pass --out a writable path")
    assert target.read_text(encoding="utf-8") == "a new report"
