"""``car_adapters.openai_agents.final_state(run)``: a rule over the run's final output, input
list and run context scores the recorded failure 1 and a branch whose planted step is
re-decided 0."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agents import Agent, Runner, function_tool
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import (
    CarRecorder,
    OpenAIAgentsAgent,
    ScriptedModel,
    final_state,
)

import car_core as car
from car_core.testing import SideEffectLedger

FARES = {"LX1": 900, "TP2": 300}
CHEAP = assistant(None, [tool_call("b1", "book", {"flight": "TP2"})])


@dataclass
class Trip:
    """The run context: the traveller's budget."""

    budget: int = 500


def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    """Quote (step 0), book the expensive flight (step 1: the planted choice; always, in the
    record), confirm (step 2)."""
    last = messages[-1]
    if last["role"] != "tool":
        return assistant(None, [tool_call("q0", "quote", {"city": "Lisbon"})])
    if last.get("name") == "quote":
        return assistant(None, [tool_call("b1", "book", {"flight": "LX1"})])
    return "Booked, have a good trip."


def over_budget(state: dict[str, Any]) -> bool:
    """The app's rule: the bookings among the run's items cost more than its context's budget,
    and the desk confirmed them (a final output)."""
    spent = sum(json.loads(item["output"]).get("price", 0) for item in state["input_list"]
                if item.get("type") == "function_call_output" and '"price"' in item["output"])
    return state["final_output"] is not None and spent > state["run_context"]["budget"]


def booked(state: dict[str, Any]) -> list[str]:
    return [json.loads(i["output"])["booked"] for i in state["input_list"]
            if i.get("type") == "function_call_output" and '"booked"' in i["output"]]


def outcome(run: car.Trajectory) -> bool:
    return over_budget(final_state(run))


def desk(ledger: SideEffectLedger) -> Agent[Trip]:
    @function_tool
    def quote(city: str) -> str:
        """Quote the flights to a city."""
        return "; ".join(f"{f} to {city}: {p} EUR" for f, p in FARES.items())

    @function_tool
    def book(flight: str) -> str:
        """Book a flight (spends money: a side effect)."""
        ledger.note("book", {"flight": flight})
        return json.dumps({"booked": flight, "price": FARES[flight]})

    return Agent[Trip](name="Desk", instructions="Book a trip.", tools=[quote, book],
                       model=ScriptedModel(decide))


def test_final_state_gives_the_output_items_and_context_and_a_branch_scores_0() -> None:
    ledger = SideEffectLedger(["book"])
    app = desk(ledger)
    rec = CarRecorder(outcome=outcome)
    result = Runner.run_sync(app, "Fly me to Lisbon.", context=Trip(), hooks=rec)
    run = rec.run
    state = final_state(run)
    assert state["final_output"] == result.final_output == "Booked, have a good trip."
    assert state["last_agent"] == "Desk"
    assert state["run_context"] == {"budget": 500}
    assert booked(state) == ["LX1"]
    assert state["input_list"][0] == {"content": "Fly me to Lisbon.", "role": "user"}
    assert state["input_list"][-1] == {"role": "assistant", "content": result.final_output}
    assert run.outcome is not None and run.outcome.value == 1.0
    ledger.reset()
    agent = OpenAIAgentsAgent(app, safe_tools=["quote"], side_effect_tools=["book"],
                              simulators={"book": lambda args: json.dumps(
                                  {"booked": args["flight"], "price": FARES[args["flight"]]})})
    dist = car.intervene(run, agent, car.do_action(1, CHEAP), outcome=outcome, rollouts=2)
    assert dist.n == 2 and dist.mean == 0.0
    branch = final_state(dist.trajectories[0])
    assert branch["final_output"] == "Booked, have a good trip."
    assert booked(branch) == ["TP2"]
    assert ledger.count() == 0  # the booking was simulated on the branches
