"""``final_state(run)``: an outcome written over the app's own final state (LangChain message
objects, content blocks) scores recorded runs, imported threads and branches as the app does,
from Python and from ``car attribute --outcome``; the old ``outcome(final_state)`` form is refused
with a typed error that says how to write it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from car_adapters.langgraph import CarCallback, LangGraphAgent, final_state
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.errors import AdapterError, OutcomeError
from integrations_tests.support import final_state_apps as desk

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "integrations_tests" / "support"
CHEAP = {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "book_flight", "arguments": '{"flight":"TP2"}'}}]}
BLOCKS = [{"type": "text", "text": "LX1 to Lisbon: 900 EUR"},
          {"type": "text", "text": "TP2 to Lisbon: 300 EUR"}]


def recorded(app: Any, thread: str = "t", store: Any = None) -> car.Trajectory:
    """A run of ``app`` recorded and scored by the app's own rule over ``final_state``."""
    cb = CarCallback(store=store, outcome=desk.outcome)
    app.invoke(desk.inputs(), {"configurable": {"thread_id": thread}, "callbacks": [cb]})
    assert cb.run is not None
    return cb.run


def agent_of(app: Any) -> LangGraphAgent:
    return LangGraphAgent(app, safe_tools=["search_flights"], side_effect_tools=["book_flight"],
                          simulators={"book_flight": desk.simulated_booking})


def test_final_state_gives_the_apps_message_objects_and_content_blocks() -> None:
    run = recorded(desk.build_app(desk.PlantedDesk(), InMemorySaver()))
    state = final_state(run)
    messages = state["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage,
                                           ToolMessage, AIMessage]
    assert messages[0].content == desk.REQUEST
    assert [c["name"] for c in messages[1].tool_calls] == ["search_flights"]
    assert messages[3].tool_calls[0]["args"] == {"flight": "LX1"}
    search, booking = messages[2], messages[4]
    assert (search.tool_call_id, search.name) == ("call_0", "search_flights")
    assert search.content == BLOCKS  # a list of blocks, as the tool returned it
    assert desk.quoted_fares(state) == [b["text"] for b in BLOCKS]
    assert (booking.tool_call_id, booking.name) == ("call_1", "book_flight")
    assert run.outcome is not None and run.outcome.value == 1.0  # the rule sees the failure
    # what steps store is unchanged: the model saw the tool's result as a JSON string
    assert run.steps[0].observation[0]["content"] == json.dumps(BLOCKS)
    # the stored dicts alone: the rule finds no ToolMessage there, hence final_state
    assert not desk.over_budget(run.meta["final_state"])
    state["messages"].clear()  # a new value each call: the run is not edited through it
    assert len(final_state(run)["messages"]) == 6


def test_a_branch_that_redecides_the_planted_step_scores_0() -> None:
    app = desk.build_app(desk.PlantedDesk(), InMemorySaver())
    run = recorded(app)
    before = len(desk.BOOKINGS)
    dist = car.intervene(run, agent_of(app), car.do_action(1, CHEAP), outcome=desk.outcome,
                         rollouts=2)
    assert dist.n == 2 and dist.mean == 0.0  # P(fail) after the cheap booking: 0
    branch = dist.trajectories[0]
    state = final_state(branch)
    assert [(m.name, json.loads(m.content)["price"]) for m in state["messages"]
            if isinstance(m, ToolMessage) and m.name == "book_flight"] == [("book_flight", 300)]
    assert desk.quoted_fares(state) == [b["text"] for b in BLOCKS]  # blocks on a branch too
    assert len(desk.BOOKINGS) == before  # the booking was simulated, never made


def test_an_imported_thread_has_the_same_final_state() -> None:
    app = desk.build_app(desk.PlantedDesk(), InMemorySaver())
    run = recorded(app, thread="imported")
    imported = agent_of(app).import_thread("imported")
    assert imported.meta["final_state"] == run.meta["final_state"]
    assert final_state(imported) == final_state(run)


def test_a_run_stored_before_blocks_were_kept_still_reads() -> None:
    """The golden record of an earlier recorder: no ``blocks`` key; tool content as stored."""
    golden = json.loads((ROOT / "tests" / "golden" / "langgraph_recorded.json").read_text())
    run = car.Trajectory.from_json(golden["support"])
    messages = final_state(run)["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage,
                                           ToolMessage, AIMessage]
    assert json.loads(messages[2].content)["order_id"] == "A1001"


def test_final_state_refuses_a_run_of_another_framework() -> None:
    run = car.record(car.FunctionAgent(policy=lambda h, rng: "a", max_steps=1), context="c",
                     outcome=lambda r: 1.0, seed=0)
    with pytest.raises(AdapterError, match="reads a LangGraph run"):
        final_state(run)


def test_the_old_form_is_refused_with_the_way_to_write_it() -> None:
    app = desk.build_app(desk.PlantedDesk(), InMemorySaver())
    run = recorded(app)
    before = len(desk.BOOKINGS)
    with pytest.raises(OutcomeError, match=r"lambda run: rule\(final_state\(run\)\)"):
        car.intervene(run, agent_of(app), car.do_resample(1), outcome=desk.over_budget,
                      rollouts=2)
    assert len(desk.BOOKINGS) == before


def car_cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "car_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_car_attribute_with_an_outcome_over_final_state(tmp_path: Path) -> None:
    """From ``car attribute --outcome final_state_apps:outcome`` in another process: the
    planted step is found (step 1: rescue 1 - p_expensive = 0.8); the old form exits with the
    typed error instead of an AttributeError."""
    checkpoints, db = str(tmp_path / "checkpoints.db"), str(tmp_path / "car.db")
    with car.RunStore(db) as store:
        run = recorded(desk.sqlite_app(checkpoints, 1.0), thread="cli", store=store)
    assert run.outcome is not None and run.outcome.value == 1.0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), str(ROOT)]),
           "COLUMNS": "200", desk.CHECKPOINTS: checkpoints}
    spec = ["--store", db, "--agent", "final_state_apps:make", "--rollouts", "16"]
    proc = car_cli("attribute", run.id, *spec, "--outcome", "final_state_apps:outcome",
                   "--json", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["locus"] == 1, result
    assert result["steps"][1]["ci"][0] > 0
    old = car_cli("attribute", run.id, *spec, "--outcome", "final_state_apps:over_budget",
                  env=env, cwd=tmp_path)
    assert old.returncode != 0
    assert "lambda run: rule(final_state(run))" in old.stderr
    assert "AttributeError" not in old.stderr and "Traceback" not in old.stderr
