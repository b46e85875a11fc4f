"""A ``ReActAgent`` run in which the parser rejected one reply (LlamaIndex's retry: the next
call sees the history, the user message again, the bad reply and the parse error, and the call
after it sees none of those) is a run whose memory kept everything: a user trial's run was
refused from every step before the retry as one whose memory "dropped or rewrote messages".

Planted: look the order up (step 0), a reply the parser rejects (step 1), the voucher (step 2,
a side effect; the amount is the planted failure), the answer (step 3)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, ScriptedLLM
from llama_index.core.agent.workflow import ReActAgent
from llama_index.core.tools import FunctionTool

import car_core as car

VOUCHERS: list[int] = []


def lookup_order(order_id: str) -> str:
    """Look an order up (reads only)."""
    return "order A1: damaged; policy voucher is $20"


def issue_voucher(order_id: str, amount: int) -> str:
    """Issue a voucher (a side effect)."""
    VOUCHERS.append(amount)
    return f"Voucher of ${amount} issued."


def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> str:
    seen = sum(m["role"] == "user" and str(m["content"]).startswith("Observation:")
               for m in messages)
    retried = any("Error while parsing" in str(m["content"]) for m in messages)
    if seen == 0:
        return 'Thought: look it up\nAction: lookup_order\nAction Input: {"order_id": "A1"}'
    if seen == 1 and not retried:
        return "Thought: issue it\nAction issue_voucher"  # malformed: the parser rejects it
    if seen == 1:
        amount = 200 if rng.random() < 0.5 else 20
        return ("Thought: issue it\nAction: issue_voucher\nAction Input: "
                + json.dumps({"order_id": "A1", "amount": amount}))
    return "Thought: done\nAnswer: voucher issued"


def too_much(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "issue_voucher"
               and json.loads(c["function"]["arguments"])["amount"] != 20
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())


def test_a_run_with_a_parse_error_is_branched_from_before_it() -> None:
    rec = CarRecorder().attach()
    try:
        for seed in range(30):
            agent = ReActAgent(name="desk", system_prompt="Refund desk.",
                               llm=ScriptedLLM(decide, seed=seed),
                               tools=[FunctionTool.from_defaults(lookup_order),
                                      FunctionTool.from_defaults(issue_voucher)])

            async def go(agent: ReActAgent = agent) -> Any:
                return await agent.run(user_msg="A1 arrived damaged")

            asyncio.run(go())
            if too_much(rec.run):
                break
    finally:
        rec.detach()
    run = rec.run
    assert too_much(run) and any("Error while parsing" in str(m["content"])
                                 for m in run.steps[2].state)
    issued = list(VOUCHERS)
    wrapped = LlamaIndexAgent(agent, safe_tools=["lookup_order"],
                              side_effect_tools=["issue_voucher"],
                              simulators={"issue_voucher": lambda a: "issued"})
    dist = car.intervene(run, wrapped, car.do_resample(0), outcome=too_much, rollouts=16,
                         seed=0)
    assert dist.n == 16 and 0 < dist.mean < 1  # the planted half, re-decided
    assert VOUCHERS == issued
