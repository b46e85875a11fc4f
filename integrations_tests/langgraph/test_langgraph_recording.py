"""What ``CarCallback`` keeps of a run when it converts each message once and seals at flush:
the record a conversion per step would make, byte for byte, a message changed between model
calls recorded as each call saw it, and every finished run stored by a flush or a normal exit."""

from __future__ import annotations

import copy
import dataclasses
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))
from langgraph_record_fixture import edited_history_app, recorded  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[2] / "tests" / "golden" / "langgraph_recorded.json"


def _recorded(store: Any = None) -> tuple[CarCallback, car.Trajectory]:
    app = sa.build_app(sa.PlantedSupportModel(rng_seed=0), InMemorySaver())
    cb = CarCallback(store=store)
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    assert cb.run is not None
    return cb, cb.run


def test_steps_share_each_message_and_seal_as_separate_copies_would(tmp_path: Any) -> None:
    cb, run = _recorded(tmp_path / "runs.db")
    assert len(run.steps) >= 3
    first, later = run.steps[0].state, run.steps[-1].state
    assert later[0] is first[0]  # one dict per message, not one per step
    copied = car.Trajectory.new(
        context=copy.deepcopy(run.context), id=run.id, created_at=run.created_at,
        steps=[dataclasses.replace(copy.deepcopy(s), digest="") for s in run.steps],
        agent=run.agent, status=run.status, meta=copy.deepcopy(run.meta))
    assert copied.to_json() == run.to_json()
    with car.RunStore(tmp_path / "runs.db", readonly=True) as store:
        assert store.load(run.id).to_json() == run.to_json()


def test_the_stored_runs_are_byte_for_byte_what_the_eager_recorder_stored(
        tmp_path: Path) -> None:
    # the golden file was written by the recorder that converted every value at its event;
    # normalised (UUIDs, times) and sealed again, the stored runs must match it exactly
    assert recorded(tmp_path) == json.loads(GOLDEN.read_text())


def test_a_message_changed_between_model_calls_is_recorded_as_each_call_saw_it() -> None:
    app, given = edited_history_app()
    cb = CarCallback()
    app.invoke(given, {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    run = cb.run
    assert run is not None and len(run.steps) == 2
    assert run.steps[0].state[0]["content"] == "original"
    assert run.steps[1].state[0]["content"] == "edited in place"
    assert run.meta["final_state"]["messages"][0]["content"] == "edited in place"


CHILD = '''
import os, signal, sys
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback
from langgraph.checkpoint.memory import InMemorySaver

path, mode = sys.argv[1], sys.argv[2]
app = sa.build_app(sa.PlantedSupportModel(rng_seed=0), InMemorySaver())
kept = CarCallback(store=path)
for i in range(3):
    app.invoke(sa.inputs(), {"configurable": {"thread_id": f"kept-{i}"}, "callbacks": [kept]})
app.invoke(sa.inputs(), {"configurable": {"thread_id": "dropped"},
                         "callbacks": [CarCallback(store=path)]})  # no reference kept
if mode == "flush-then-kill":
    kept.flush()
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(0)  # "exit": a normal exit; no run was read, nothing flushed
'''


@pytest.mark.parametrize("mode,code", [("exit", 0), ("flush-then-kill", -signal.SIGKILL)])
def test_runs_sealed_at_flush_keep_the_durability_promise(tmp_path: Path, mode: str,
                                                          code: int) -> None:
    # every finished run is stored by a normal exit; a flush stores the flushed callback's
    # runs before a SIGKILL (the dropped callback's own writer was not flushed: may be lost)
    path = tmp_path / "runs.db"
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == code, done.stderr
    with car.RunStore(path, readonly=True) as store:
        threads = sorted(store.load(r["id"]).meta["thread_id"] for r in store.runs())
    kept = ["kept-0", "kept-1", "kept-2"]
    if mode == "exit":
        assert threads == ["dropped", *kept]
    else:
        assert set(kept) <= set(threads) <= {"dropped", *kept}


def test_a_run_finished_after_its_writer_closed_is_kept_with_the_store_error(
        tmp_path: Path) -> None:
    app = sa.build_app(sa.PlantedSupportModel(rng_seed=0), InMemorySaver())
    cb = CarCallback(store=tmp_path / "runs.db")
    cb.store.close()
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "late"}, "callbacks": [cb]})
    assert [r.meta["thread_id"] for r in cb.runs] == ["late"]
    assert len(cb.store_errors) == 1 and "closed" in str(cb.store_errors[0])
