"""A dead model server stops an OpenAI Agents SDK attribution, over real HTTP on loopback.

The product rule every adapter follows (``test_models_server_down``, the LlamaIndex one): a
refused connection or a 5xx answer stops the attribution with ``ModelUnavailable`` (not a
pile of failed branches ending as "no locus"), the branches that finished stay in the store,
and a resume with the same ``attribution_id`` once the server is back gives the uninterrupted
result, calling the model only for the branches that were missing.

The app is the customer-service shape of ``test_openai_agents_customer_service`` (the handoff
hook reads and writes the run context, the booking tool is a side effect on a ledger), every
agent on the SDK's own ``OpenAIChatCompletionsModel`` over the official ``openai`` client (no
retries of its own), against a stub chat-completions server whose reply is a function of the
request's seed and messages only: triage hands off to seat booking, which reads the seat map,
then books the exit row 4A when the seed is even (12A when odd) and says it is done.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from agents import OpenAIChatCompletionsModel, Runner
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent
from openai import AsyncOpenAI

import car_core as car
from car_core.engine.execution import Executor, Sequential
from car_core.errors import ModelUnavailable
from car_core.store import RunStore
from integrations_tests.openai_agents.test_openai_agents_customer_service import (
    REQUEST,
    Airline,
    AirlineContext,
    booked_exit_row,
    simulate_booking,
)
from integrations_tests.support.dying_server import (
    Counted,
    DyingServer,
    chat_completion,
    comparable,
)
from integrations_tests.support.servers import StubOpenAIServer, free_port, halfway

ROOT = Path(__file__).resolve().parents[2]
ROLLOUTS = 8
URL_VAR = "CAR_TEST_AIRLINE_MODEL_URL"


def reply(seed: int, messages: Sequence[dict[str, Any]], tools: Sequence[str]
          ) -> dict[str, Any]:
    last = next((c["function"]["name"] for m in reversed(messages)
                 if m.get("role") == "assistant" for c in m.get("tool_calls") or ()), None)
    if last is None and "transfer_to_seat_booking_agent" in tools:
        return _call("transfer_to_seat_booking_agent", {}, seed)
    if last == "transfer_to_seat_booking_agent":
        return _call("seat_map", {}, seed)
    if last == "seat_map":
        return _call("update_seat", {"confirmation_number": "ABC123",
                                     "new_seat": "4A" if seed % 2 == 0 else "12A"}, seed)
    return {"role": "assistant", "content": "Your seat is updated."}


def _call(name: str, args: dict[str, Any], seed: int) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"srv-{name}-{seed}", "type": "function",
         "function": {"name": name, "arguments": json.dumps(args)}}]}


class AirlineServer(DyingServer):
    """The stub airline model: its reply is a function of the request's seed, messages and
    tools (the recording run sends no seed: 0)."""

    def respond(self, req: dict[str, Any]) -> dict[str, Any]:
        tools = [t["function"]["name"] for t in req.get("tools") or ()]
        seed = int(req.get("seed", 0))
        return chat_completion(reply(seed, req["messages"], tools),
                               completion_id=f"chatcmpl-{seed}", model=req["model"])


def http_app(base_url: str) -> Airline:
    model = OpenAIChatCompletionsModel(model="stub-model", openai_client=AsyncOpenAI(
        base_url=base_url, api_key="loopback", max_retries=0, timeout=2.0))
    return Airline(model=model)


def wrapped(app: Airline) -> OpenAIAgentsAgent:
    return OpenAIAgentsAgent(app.agent, safe_tools=["faq_lookup", "seat_map"],
                             side_effect_tools=["update_seat"],
                             simulators={"update_seat": simulate_booking},
                             handoff_callbacks="live")  # it writes the run context only


def make_agent() -> OpenAIAgentsAgent:
    """``car attribute --agent`` factory: the app against the server in ``$URL_VAR``."""
    return wrapped(http_app(os.environ[URL_VAR]))


def attribute(store: RunStore, run: car.Trajectory, app: Airline, aid: str,
              executor: Executor) -> Any:
    return car.contrastive(run, wrapped(app), outcome=booked_exit_row, rollouts=ROLLOUTS,
                           seed=5, store=store, attribution_id=aid, executor=executor,
                           search="full", progress=False)


def record(app: Airline, store: Path | None = None) -> car.Trajectory:
    rec = CarRecorder(store=store)
    Runner.run_sync(app.agent, REQUEST, context=AirlineContext(passenger_name="Ada Lovelace"),
                    hooks=rec)
    run = rec.run
    assert booked_exit_row(run) and len(run.steps) == 4 and app.bookings == [
        ("FLT-101", "ABC123", "4A")]
    return run


def test_an_outage_stops_the_attribution_and_a_resume_finishes_it(
        tmp_path: Path, servers: list[AirlineServer]) -> None:
    port = free_port()
    servers.append(AirlineServer(port))
    run = record(http_app(servers[0].base_url))
    app = http_app(servers[0].base_url)  # its own client, first used by the branches

    counted = Counted(lambda: servers[-1])
    with RunStore(tmp_path / "reference.db") as ref_store:
        reference = attribute(ref_store, run, app, "reference", counted)
    assert not reference.failures
    total = sum(counted.calls.values())
    order = list(counted.calls)

    # go down after the first answer of a branch, half-way through, that needs two or more
    done, spent = halfway(order, counted.calls)
    assert 0 < len(done) < len(order)
    servers[0].stop()
    servers.append(AirlineServer(port, answers=spent + 1))
    db = tmp_path / "car.db"
    app.hook_saw.clear()
    with RunStore(db) as store, pytest.raises(ModelUnavailable, match="model server") as err:
        attribute(store, run, app, "interrupted", Sequential())
    assert "resume" in str(err.value) and "Seat Booking Agent" in str(err.value)
    with RunStore(db) as store:
        stored = {(b["arm"], b["rollout"]) for b in store.branches("interrupted")}
        assert sorted(stored) == sorted(done)   # the finished branches, and only them
        assert store.attribution("interrupted").status == "running"

    assert servers[-1].stopped.wait(10)
    servers.append(AirlineServer(port))
    with RunStore(db) as store:
        resumed = attribute(store, run, app, "interrupted", Sequential())
        assert store.attribution("interrupted").status == "complete"
    assert comparable(resumed) == comparable(reference)
    assert servers[-1].answered == total - spent  # only the missing branches asked the model
    assert app.hook_saw and None not in app.hook_saw  # it read the rebuilt context each time
    assert app.bookings == []                         # no branch wrote the booking system


def test_a_server_answering_500_stops_the_attribution(servers: list[AirlineServer]) -> None:
    servers.append(AirlineServer(free_port()))
    run = record(http_app(servers[0].base_url))
    with StubOpenAIServer(failures=[500] * 50) as failing:
        broken = http_app(failing.base_url)
        with pytest.raises(ModelUnavailable, match="InternalServerError") as err:
            car.contrastive(run, wrapped(broken), outcome=booked_exit_row, rollouts=ROLLOUTS,
                            seed=0, progress=False)
        # stopped with the first failed call: over a server the default executor runs
        # branches at once, so those already in flight each made their one call; none was
        # retried and none started after (going on would cost calls on every arm)
        assert 1 <= failing.hits <= ROLLOUTS
    assert err.value.step is not None and "resume" in str(err.value)
    assert not broken.bookings


def test_the_cli_stops_on_a_refused_connection_and_prints_the_resume_command(
        tmp_path: Path, servers: list[AirlineServer]) -> None:
    port = free_port()
    servers.append(AirlineServer(port))
    db = tmp_path / "runs.db"
    run = record(http_app(servers[0].base_url), store=db)
    servers[0].stop()                              # nothing listens on the port now
    env = {**os.environ, URL_VAR: servers[0].base_url, "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "car_core.cli", "attribute", run.id, "--store", str(db),
         "--agent", f"{__name__}:make_agent",
         "--outcome", f"{booked_exit_row.__module__}:booked_exit_row",
         "--rollouts", "8", "--executor", "sequential"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 5, proc.stderr      # the agent's model failed
    assert "model server" in proc.stderr and "APIConnectionError" in proc.stderr
    assert "Resume with:" in proc.stderr and "--resume" in proc.stderr
    assert "no locus" not in proc.stdout + proc.stderr
