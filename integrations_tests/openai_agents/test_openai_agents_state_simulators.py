"""OpenAI Agents SDK: a guarded tool that writes the run context is simulable.

A travel agent books a hotel (``book_hotel``: the side effect, counted by a ledger, which also
writes the booking into the run context, as the SDK's examples keep state there) and then
sends the confirmation (``send_confirmation``: safe, reads the booking back from the context).
Planted truth: step 0 books Paris with probability 0.6, else Rome; everything else is
deterministic. Failure = the confirmation the agent ends with names Paris. So for a recorded
run that booked Paris, P(fail | do_resample(0)) = 0.6, and the confirmation names the city the
branch booked only if the branch's context got the booking: from the recorded write replayed
(an identical call) or from the simulator, which is handed the run context wrapper.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from agents import Agent, RunContextWrapper, Runner, function_tool, set_tracing_disabled
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel
from pydantic import BaseModel

import car_core as car
from car_core.errors import AdapterError, SideEffectBlocked
from car_core.testing import CallCounter, SideEffectLedger

set_tracing_disabled(True)

P_PARIS = 0.6
ROLLOUTS = 64
# An arm at p = 0.6 over 64 rollouts has standard error sqrt(0.24 / 64) = 0.061; the tolerance
# is 4 of them. Seeds are fixed: the runs are repeatable.
TOL = 4 * math.sqrt(P_PARIS * (1 - P_PARIS) / ROLLOUTS)


class Trip(BaseModel):
    traveller: str
    booking: str | None = None


def call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return assistant(None, [tool_call(cid, name, args)])


def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    last = messages[-1]
    if last.get("name") == "send_confirmation":
        return str(last["content"])
    if last.get("name") == "book_hotel":
        return call("c1", "send_confirmation", {})
    city = "Paris" if rng.random() < P_PARIS else "Rome"
    return call("c0", "book_hotel", {"city": city, "nights": 2})


def booked_paris(run: car.Trajectory) -> bool:
    last = run.steps[-1].action
    return "Paris" in str(last.get("content") if isinstance(last, dict) else last)


class Travel:
    def __init__(self, ledger: SideEffectLedger, seed: int = 0) -> None:
        self.model_calls = CallCounter(decide)

        @function_tool
        async def book_hotel(ctx: RunContextWrapper[Trip], city: str, nights: int) -> str:
            """Book a hotel (charges the traveller's card)."""
            ledger.note("book_hotel", {"city": city, "nights": nights})
            ctx.context.booking = f"{nights} nights in {city}"
            return "booked"

        @function_tool
        async def send_confirmation(ctx: RunContextWrapper[Trip]) -> str:
            """The confirmation of the trip's booking."""
            return f"Confirmed for {ctx.context.traveller}: {ctx.context.booking}"

        self.agent = Agent[Trip](name="Travel", instructions="Book the trip, then confirm.",
                                 tools=[book_hotel, send_confirmation],
                                 model=ScriptedModel(self.model_calls, seed=seed))

    def wrap(self, **simulators: Any) -> OpenAIAgentsAgent:
        return OpenAIAgentsAgent(self.agent, safe_tools=["send_confirmation"],
                                 side_effect_tools=["book_hotel"], simulators=simulators)


async def simulate_booking(arguments: dict[str, Any], ctx: RunContextWrapper[Trip]) -> str:
    """``book_hotel`` without the charge: the booking goes into the context, as the tool's."""
    ctx.context.booking = f"{arguments['nights']} nights in {arguments['city']}"
    return "booked"


@pytest.fixture
def ledger() -> SideEffectLedger:
    return SideEffectLedger(["book_hotel"])


@pytest.fixture
def recorded(ledger: SideEffectLedger) -> tuple[Travel, car.Trajectory]:
    app = Travel(ledger, seed=1)
    rec = CarRecorder()
    Runner.run_sync(app.agent, "Book me two nights.", context=Trip(traveller="Ada"), hooks=rec)
    run = rec.run
    assert json.loads(run.steps[0].action["tool_calls"][0]["function"]["arguments"])["city"] \
        == "Paris", "the model's seed 1 draws 0.51 < 0.6: the record books Paris"
    assert booked_paris(run) and ledger.count() == 1
    assert run.steps[1].meta["run_context"]["value"]["booking"] == "2 nights in Paris"
    ledger.reset()
    return app, run


def test_an_identical_call_replays_the_recorded_context_write(recorded: Any,
                                                              ledger: SideEffectLedger) -> None:
    app, run = recorded
    dist = car.intervene(run, app.wrap(), car.do_action(0, run.steps[0].action),
                         outcome=booked_paris, rollouts=4, seed=0)
    assert dist.mean == 1.0
    for branch in dist.trajectories:
        assert [s.meta["run_context"] for s in branch.steps] == \
            [s.meta["run_context"] for s in run.steps]
        assert branch.steps[1].observation == run.steps[1].observation
    assert ledger.count() == 0


def test_a_simulator_taking_the_context_writes_it(recorded: Any,
                                                  ledger: SideEffectLedger) -> None:
    app, run = recorded
    dist = car.intervene(run, app.wrap(book_hotel=simulate_booking), car.do_resample(0),
                         outcome=booked_paris, rollouts=ROLLOUTS, seed=1)
    assert abs(dist.mean - P_PARIS) <= TOL
    cities = set()
    for branch in dist.trajectories:
        city = json.loads(branch.steps[0].action["tool_calls"][0]["function"]["arguments"])[
            "city"]
        cities.add(city)
        assert branch.steps[-1].action["content"] == f"Confirmed for Ada: 2 nights in {city}"
    assert cities == {"Paris", "Rome"}
    assert ledger.count() == 0


def test_another_call_without_a_simulator_stops_the_branch(recorded: Any,
                                                           ledger: SideEffectLedger) -> None:
    app, run = recorded
    rome = call("c0", "book_hotel", {"city": "Rome", "nights": 2})
    with pytest.raises(SideEffectBlocked, match=r"'book_hotel'.*record cannot answer"):
        car.intervene(run, app.wrap(), car.do_action(0, rome), outcome=booked_paris,
                      rollouts=1, seed=0)
    assert ledger.count() == 0


def test_a_simulator_that_cannot_write_the_context_is_refused_before_any_branch(
        recorded: Any, ledger: SideEffectLedger) -> None:
    """The recorded call wrote the context, so a simulator without ``ctx`` would drop the
    booking on every simulated branch; refused before any model call."""
    app, run = recorded
    calls = app.model_calls.calls
    with pytest.raises(AdapterError, match=r"'book_hotel' wrote.*run context at step 0.*"
                                           r"simulator does not take") as err:
        car.intervene(run, app.wrap(book_hotel=lambda arguments: "booked"),
                      car.do_resample(0), outcome=booked_paris, rollouts=1, seed=0)
    assert err.value.step == 0 and app.model_calls.calls == calls
    assert ledger.count() == 0
