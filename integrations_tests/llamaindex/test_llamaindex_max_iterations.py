"""A branch runs under the app's ``run(max_iterations=...)``, counted from the run's start.

The planted ``FunctionAgent`` looks an order up (step 0), then, at each decision, looks it up
again with probability ``P_AGAIN`` or issues a voucher (a side effect) and ends. The app runs
``agent.run(..., max_iterations=4)``: LlamaIndex counts one iteration per decision (the final
reply too) and stops the run (an error) at the fourth. So a branch from step 1, one iteration
used, has three left: it issues the voucher at step 1 and replies, or stops. A branch that
counted from its own step (with LlamaIndex's default of 20 besides) looked up again and again
and issued vouchers the app never reaches: a user trial's P(fail) of 0.31 read 0.62.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from car_adapters.common.messages import assistant, tool_call
from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, ScriptedLLM
from llama_index.core.agent.workflow import FunctionAgent

import car_core as car
from car_core.errors import BranchesFailed

P_AGAIN = 0.5
LIMIT = 4


class Desk:
    """The agent; ``vouchers`` counts real vouchers (recordings only)."""

    def __init__(self, seed: int = 0) -> None:
        self.vouchers = 0

        def lookup(order: str) -> str:
            """Look an order up (reads only)."""
            return "paid 40"

        def issue_voucher(amount: int) -> str:
            """Issue a voucher (a side effect)."""
            self.vouchers += 1
            return "issued"

        self.agent = FunctionAgent(tools=[lookup, issue_voucher],
                                   llm=ScriptedLLM(self.decide, seed=seed))

    def decide(self, messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
        done = [m for m in messages if m["role"] == "tool"]
        k = len(done)
        if done and done[-1]["name"] == "issue_voucher":
            return "done"
        if k == 0 or rng.random() < P_AGAIN:
            return assistant(None, [tool_call(f"c{k}", "lookup", {"order": "7"})])
        return assistant(None, [tool_call(f"c{k}", "issue_voucher", {"amount": 40})])


def voucher(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "issue_voucher"
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())


def recorded(limit: int | None) -> tuple[Desk, car.Trajectory]:
    rec = CarRecorder().attach()
    try:
        for seed in range(50):
            desk = Desk(seed)
            kw = {"max_iterations": limit} if limit is not None else {}

            async def go(desk: Desk = desk, kw: dict[str, Any] = kw) -> Any:
                return await desk.agent.run(user_msg="Refund order 7.", **kw)
            try:
                asyncio.run(go())
            except Exception:  # noqa: BLE001 - the app's own stop at its limit
                continue
            run = rec.run
            if voucher(run) and len(run.steps) == 3:  # lookup, voucher, reply
                return desk, run
    finally:
        rec.detach()
    raise AssertionError("no seed in 50 gives the run")


def test_the_run_keeps_the_limit_it_was_given_or_the_default() -> None:
    assert recorded(LIMIT)[1].meta["max_iterations"] == LIMIT
    assert recorded(None)[1].meta["max_iterations"] == 20


def test_a_branch_has_what_is_left_of_the_runs_limit() -> None:
    desk, run = recorded(LIMIT)
    agent = LlamaIndexAgent(desk.agent, safe_tools=["lookup"],
                            side_effect_tools=["issue_voucher"])
    assert [agent._iterations_left(run, k) for k in range(3)] == [4, 3, 2]
    assert LlamaIndexAgent(desk.agent, safe_tools=["lookup"], side_effect_tools=[
        "issue_voucher"], max_iterations=6)._iterations_left(run, 1) == 5
    vouchers = desk.vouchers
    # from step 1 the app stops (an error) unless its first decision issues the voucher: 1/2
    # of branches, far above the share an estimate may leave out (with 20 left, none stopped).
    # Below 5 of 40 has probability under 1e-6.
    with pytest.raises(BranchesFailed) as stopped:
        car.intervene(run, agent, car.do_resample(1), outcome=voucher, rollouts=40, seed=0)
    assert all("Max iterations of 3" in f.error for f in stopped.value.failures)
    assert desk.vouchers == vouchers
