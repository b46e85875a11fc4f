"""A run recorded with an ``InMemorySaver``, or from an app compiled without a checkpointer, is
attributed from another process: its fork points are rebuilt from the record where the messages
are the whole graph state, giving the locus (and every arm) an attribution from the recorded
checkpoints gives; where the record does not hold the state, the run is refused with
``CheckpointsMissing`` before any branch. An app without a checkpointer is branched on a copy
with a checkpointer CAR supplies; the user's app keeps none.

The app (``integrations_tests/support/record_anywhere_apps.py``): the support desk on
``create_agent`` with CAR's middleware, the decision at step 1 refunding with p = 0.3 when the
injection is visible. The middleware seeds every model call from CAR's noise, so a branch from a
rebuilt fork point draws what a branch from the recorded checkpoint draws: the two attributions
agree exactly, not only within an interval.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, LangGraphAgent
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.errors import AgentMismatch, CheckpointsMissing
from integrations_tests.support import record_anywhere_apps as apps

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "integrations_tests" / "support"
ROLLOUTS = 16


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), str(ROOT)]),
            "COLUMNS": "200"}


def run_python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env(), capture_output=True,
                          text=True, timeout=300)


def test_a_run_recorded_in_memory_elsewhere_gives_the_in_process_locus(tmp_path: Path) -> None:
    db = tmp_path / "car.db"
    recorder = run_python(str(SUPPORT / "record_anywhere_apps.py"), str(db), str(ROLLOUTS),
                          cwd=tmp_path)
    assert recorder.returncode == 0, recorder.stderr
    there = json.loads(recorder.stdout)
    assert there["locus"] == 1  # the planted decision, found where the checkpoints lived
    with car.RunStore(db) as store:
        run = store.load(there["run_id"])
        agent = apps.make()  # its InMemorySaver has never seen the run's thread
        res = car.contrastive(run, agent, outcome=apps.outcome, rollouts=ROLLOUTS, seed=0)
    assert res.locus == there["locus"]
    assert [s.effect for s in res.steps] == there["effects"]  # the same draws on every arm
    assert list(agent.saver.list(None)) == []  # every branch thread deleted, none other written

    proc = run_python("-m", "car_core.cli", "attribute", there["run_id"], "--store", str(db),
                      "--agent", "record_anywhere_apps:make", "--outcome",
                      "record_anywhere_apps:outcome", "--rollouts", str(ROLLOUTS), "--json",
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["locus"] == there["locus"]


def test_interventions_on_a_rebuilt_fork_point_apply() -> None:
    """The edit reaches the rebuilt fork point (the injection removed: no refund), and a
    forced action is written there as the step's node."""
    app, _, run = apps.record_failing(car.RunStore(":memory:"))
    agent = apps.make()
    fixed = car.intervene(run, agent, car.do_context(1, sa.remove_injection),
                          outcome=apps.outcome, rollouts=4)
    forced = car.intervene(run, agent, car.do_action(1, run.steps[1].action),
                           outcome=apps.outcome, rollouts=4)
    assert fixed.mean == 0.0 and forced.mean == 1.0
    assert all(len(t.steps) >= 3 for t in fixed.trajectories)  # the model decided again


@pytest.mark.parametrize("private", [False, True])
def test_state_the_record_does_not_hold_is_refused_before_any_branch(private: bool) -> None:
    """A graph whose model node writes ``notes`` as well: the record keeps only the final notes
    (or, when the graph does not output them, none), so no fork point can be rebuilt."""
    cb = CarCallback(outcome=apps.outcome)
    app = apps.noted(InMemorySaver(), sa.PlantedSupportModel(p_follow=1.0), private)
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "gone"}, "callbacks": [cb]})
    run = cb.run
    assert run is not None and run.outcome is not None and run.outcome.value == 1.0
    assert ("notes" in run.meta["final_state"]) is not private
    elsewhere = sa.PlantedSupportModel(p_follow=1.0)
    agent = LangGraphAgent(apps.noted(InMemorySaver(), elsewhere, private), **apps.CLASSES)
    store = car.RunStore(":memory:")
    store.save(run)
    what = "'notes' is not in the graph's output" if private else "wrote state key 'notes'"
    with pytest.raises(CheckpointsMissing, match=what) as refused:
        car.contrastive(run, agent, outcome=apps.outcome, rollouts=2, store=store)
    assert isinstance(refused.value, AgentMismatch)  # `car attribute` exits 2: a setup error
    assert "SqliteSaver" in str(refused.value)
    assert elsewhere.calls == 0 and store.attributions(run.id) == []  # no branch ran
    assert list(agent.saver.list(None)) == []  # no thread was written


def test_the_cli_refuses_a_run_it_cannot_rebuild_as_a_setup_error(tmp_path: Path) -> None:
    db = tmp_path / "car.db"
    with car.RunStore(db) as store:
        cb = CarCallback(store=store, outcome=apps.outcome)
        app = apps.noted(InMemorySaver(), sa.PlantedSupportModel(p_follow=1.0))
        app.invoke(sa.inputs(), {"configurable": {"thread_id": "gone"}, "callbacks": [cb]})
        run = cb.run
    assert run is not None
    proc = run_python("-m", "car_core.cli", "attribute", run.id, "--store", str(db), "--agent",
                      "record_anywhere_apps:make_noted", "--outcome",
                      "record_anywhere_apps:outcome", "--rollouts", "2", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "does not hold thread 'gone'" in proc.stderr and "'notes'" in proc.stderr
    assert "Resume with" not in proc.stderr


def channels_of(app: Any) -> dict[str, Any]:
    return dict(app.channels)


def test_a_run_recorded_without_a_checkpointer_gives_the_checkpointed_locus(tmp_path: Path
                                                                            ) -> None:
    """The same seeded desk recorded with and without a checkpointer: the bare run, attributed
    in the process that recorded it and from ``car attribute``, gives what forking the
    checkpointed run's recorded checkpoints gives."""
    with car.RunStore(":memory:") as store:
        kept_app, kept_mw, kept = apps.record_failing(store)
        there = car.contrastive(kept, LangGraphAgent(kept_app, model=kept_mw, **apps.CLASSES),
                                outcome=apps.outcome, rollouts=ROLLOUTS, seed=0)
    db = tmp_path / "car.db"
    with car.RunStore(db) as store:
        app, mw, run = apps.record_failing(store, bare=True)
        before = channels_of(app)
        assert run.meta["thread_id"] is None
        assert [s.action for s in run.steps] == [s.action for s in kept.steps]  # the same run
        agent = LangGraphAgent(app, model=mw, **apps.CLASSES)
        res = car.contrastive(run, agent, outcome=apps.outcome, rollouts=ROLLOUTS, seed=0)
    assert there.locus == 1  # the planted decision
    assert res.locus == there.locus
    assert [s.effect for s in res.steps] == [s.effect for s in there.steps]
    # the user's app untouched: still no checkpointer, the same channels; CAR's saver emptied
    assert app.checkpointer is None and agent.app is not app
    assert channels_of(app) == before and all(app.channels[k] is v for k, v in before.items())
    assert list(agent.saver.list(None)) == []

    proc = run_python("-m", "car_core.cli", "attribute", run.id, "--store", str(db),
                      "--agent", "record_anywhere_apps:make_bare", "--outcome",
                      "record_anywhere_apps:outcome", "--rollouts", str(ROLLOUTS), "--json",
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["locus"] == there.locus


def test_a_bare_run_whose_state_the_record_does_not_hold_is_refused(tmp_path: Path) -> None:
    """The ``notes`` graph compiled without a checkpointer: no checkpoint of its run exists,
    and the record keeps only the final notes, so the run is refused before any branch, in
    process and by ``car attribute`` (a setup error, exit 2)."""
    db = tmp_path / "car.db"
    with car.RunStore(db) as store:
        cb = CarCallback(store=store, outcome=apps.outcome)
        app = apps.noted(None, sa.PlantedSupportModel(p_follow=1.0))
        app.invoke(sa.inputs(), {"callbacks": [cb]})
        run = cb.run
        assert run is not None and run.meta["thread_id"] is None
        elsewhere = sa.PlantedSupportModel(p_follow=1.0)
        agent = LangGraphAgent(apps.noted(None, elsewhere), **apps.CLASSES)
        with pytest.raises(CheckpointsMissing, match="wrote state key 'notes'") as refused:
            car.contrastive(run, agent, outcome=apps.outcome, rollouts=2, store=store)
        assert "compiled without a checkpointer" in str(refused.value)
        assert "SqliteSaver" in str(refused.value)
        assert elsewhere.calls == 0 and store.attributions(run.id) == []  # no branch ran
        assert list(agent.saver.list(None)) == []  # no thread was written
    assert app.checkpointer is None
    proc = run_python("-m", "car_core.cli", "attribute", run.id, "--store", str(db), "--agent",
                      "record_anywhere_apps:make_noted_bare", "--outcome",
                      "record_anywhere_apps:outcome", "--rollouts", "2", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "compiled without a checkpointer" in proc.stderr and "'notes'" in proc.stderr
    assert "Resume with" not in proc.stderr
