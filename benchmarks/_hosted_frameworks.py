"""The LlamaIndex and OpenAI Agents SDK rows of ``benchmarks/hosted_latency.py``.

Each row attributes one failing run of the travel desk of ``car_adapters.demo.travel_desk``,
built natively in the framework: a ``FunctionAgent`` over ``ScriptedLLM``, an SDK ``Agent``
over ``ScriptedModel``. The planted model searches the fares (step 0), books the flex fare
(over budget: the failure) with probability ``P_FLEX`` else the cheapest (step 1), e-mails the
itinerary (step 2) and answers (step 3), so the answer is step 1. It draws from CAR's noise
(a seed fixes the answer) and, given ``latency_s``, waits that long per call (``asyncio.sleep``)
and says it is ``remote``, so the adapter's default executor is the concurrent one. The run is
recorded without latency; only the attribution is timed, twice: with no ``executor=`` (what
CAR picks) and with ``car_core.engine.execution.Sequential()``. ``book_flight`` and
``send_itinerary`` write a ledger; branches answer them from the record or the desk's
simulators, and a row checks the ledger did not grow.

    .venv/bin/python benchmarks/_hosted_frameworks.py     # these rows at 300 ms, 16 rollouts
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from car_adapters.common.messages import assistant, tool_call
from car_adapters.demo import travel_desk as td

import car_core as car
from car_core import defaults
from car_core.engine.execution import Sequential

Row = Callable[[float, int, int], dict[str, Any]]
REQUEST = "Book me the cheapest flight to Lisbon (LIS) and e-mail me the itinerary."
P_FLEX = 0.25
TOOLS = "function"


def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    """The planted travel agent (see the module docstring), on OpenAI-style messages."""
    calls = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
    k = sum(1 for m in messages if m["role"] == "assistant")
    if k == 0:
        return assistant(None, [tool_call("call_0", "search_fares", {"destination": "LIS"})])
    if k == 1:
        fare = td.FLEX if rng.random() < P_FLEX else td.SAVER
        return assistant(None, [tool_call("call_1", "book_flight", {"fare_id": fare})])
    if k == 2:
        fare = json.loads(calls[1]["function"]["arguments"])["fare_id"]
        return assistant(None, [tool_call("call_2", "send_itinerary",
                                          {"booking_id": f"BK-{fare}"})])
    return "Booked and sent."


class Ledger:
    """The real side effects, one entry per call."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def search_fares(self, destination: str) -> str:
        """The fares to a destination airport, cheapest first (reads only)."""
        return json.dumps(td.FARES.get(destination, []))

    def book_flight(self, fare_id: str) -> str:
        """Book a fare and charge the traveller's card (a side effect)."""
        self.lines.append({"tool": "book_flight", "fare_id": fare_id})
        return json.dumps({"booking_id": f"BK-{fare_id}", "charged": True})

    def send_itinerary(self, booking_id: str) -> str:
        """E-mail the itinerary of a booking to the traveller (a side effect)."""
        self.lines.append({"tool": "send_itinerary", "booking_id": booking_id})
        return json.dumps({"sent": booking_id})


def answer(res: Any) -> tuple[Any, ...]:
    """What must not depend on the executor: the locus and every step's estimate."""
    return (res.locus, tuple((s.step, s.effect, s.ci) for s in res.steps))


def timed(run: car.Trajectory, agent: Any, calls: Callable[[], int], latency_s: float,
          rollouts: int, seed: int, ledger: Ledger, framework: str) -> dict[str, Any]:
    """The row: the default run and the sequential one, timed, on the same seed."""
    written = len(ledger.lines)
    out = []
    for executor in (None, Sequential()):
        before, start = calls(), time.perf_counter()
        res = car.contrastive(run, agent, outcome=td.booked_flex, rollouts=rollouts, seed=seed,
                              executor=executor, progress=False)
        out.append((res, time.perf_counter() - start, calls() - before))
    assert len(ledger.lines) == written, "a branch ran a side-effect tool"
    (default, wall, n), (sequential, wall_seq, _) = out
    return {"framework": framework, "tools": TOOLS, "model_calls": n, "wall_default_s": wall,
            "wall_sequential_s": wall_seq, "ideal_s": n * latency_s / defaults.CONCURRENCY,
            "same_answer": answer(default) == answer(sequential), "locus": default.locus}


def llamaindex_row(latency_s: float, rollouts: int, seed: int) -> dict[str, Any]:
    from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, ScriptedLLM
    from llama_index.core.agent.workflow import FunctionAgent

    ledger = Ledger()
    rec = CarRecorder().attach()
    try:
        for s in range(seed, seed + 200):  # record without latency: only attribution is timed
            llm = ScriptedLLM(decide, seed=s)
            app = FunctionAgent(tools=[ledger.search_fares, ledger.book_flight,
                                       ledger.send_itinerary], llm=llm,
                                system_prompt="You are a travel desk.")

            async def go(a: Any = app) -> None:
                await a.run(user_msg=REQUEST)
            asyncio.run(go())
            if td.booked_flex(rec.run):
                break
        run = rec.run
    finally:
        rec.detach()
    assert td.booked_flex(run), "no failing run recorded"
    llm.latency_s = latency_s
    agent = LlamaIndexAgent(app, safe_tools=list(td.SAFE_TOOLS),
                            side_effect_tools=list(td.SIDE_EFFECT_TOOLS),
                            simulators=td.simulators())
    return timed(run, agent, lambda: llm.calls, latency_s, rollouts, seed, ledger, "LlamaIndex")


def openai_agents_row(latency_s: float, rollouts: int, seed: int) -> dict[str, Any]:
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from car_adapters.openai_agents import CarRecorder, OpenAIAgentsAgent, ScriptedModel

    set_tracing_disabled(True)  # no trace export (it would need an API key)
    ledger = Ledger()
    tools = [function_tool(ledger.search_fares), function_tool(ledger.book_flight),
             function_tool(ledger.send_itinerary)]
    rec = CarRecorder()
    for s in range(seed, seed + 200):  # record without latency: only attribution is timed
        model = ScriptedModel(decide, seed=s)
        app = Agent(name="Travel desk", instructions="You are a travel desk.", model=model,
                    tools=tools)
        Runner.run_sync(app, REQUEST, hooks=rec)
        if td.booked_flex(rec.run):
            break
    run = rec.run
    assert td.booked_flex(run), "no failing run recorded"
    model.latency_s = latency_s
    agent = OpenAIAgentsAgent(app, safe_tools=list(td.SAFE_TOOLS),
                              side_effect_tools=list(td.SIDE_EFFECT_TOOLS),
                              simulators=td.simulators())
    return timed(run, agent, lambda: model.calls, latency_s, rollouts, seed, ledger,
                 "OpenAI Agents SDK")


ROWS: list[Row] = [llamaindex_row, openai_agents_row]


if __name__ == "__main__":
    for row in ROWS:
        r = row(0.3, 16, 0)
        print({k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()},
              f"default/ideal={r['wall_default_s'] / r['ideal_s']:.2f}x", flush=True)
