"""What the app's memory gives every agent survives a handoff on a branch.

A ``Memory`` with a memory block (``StaticMemoryBlock``, inserted as a system message, the
default) gives each agent of an ``AgentWorkflow`` its own prompt and then the memory's system
message. A branch from the first agent's step took every leading system message as that
agent's own, so the agent a handoff reached on the branch lost the memory: a user trial's
payments agent no longer saw "bob's allowance is $250", and CAR said a step that changed
nothing rescued 100% of runs.

Planted: ``triage`` hands off (step 0); ``payments`` looks the account up (step 1) and, when it
sees the allowance, pays 250 with probability 0.6, else 100; without it, it always pays 250. A
payment over 100 fails the run, so re-deciding from step 0 fails with probability 0.6.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from car_adapters.common.messages import assistant, tool_call
from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, ScriptedLLM
from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
from llama_index.core.memory import Memory, StaticMemoryBlock

import car_core as car

NOTE = "From an earlier session: bob's allowance is $250."
P_OVER = 0.6


class Payments:
    """The workflow; ``payments_saw`` says, for each of payments' decisions, whether the
    memory's note was among its system messages; ``moved`` is the real money moved."""

    def __init__(self) -> None:
        self.payments_saw: list[bool] = []
        self.moved: list[int] = []

    def decide(self, messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
        systems = [str(m["content"]) for m in messages if m["role"] == "system"]
        if "You route requests." in systems[0]:
            return assistant(None, [tool_call("h", "handoff", {"to_agent": "payments",
                                                               "reason": "a payment"})])
        seen = any(NOTE in s for s in systems)
        self.payments_saw.append(seen)
        done = [m for m in messages if m["role"] == "tool"]
        if len(done) == 1:  # the handoff's answer only
            return assistant(None, [tool_call("l", "lookup_account", {"account": "chk"})])
        if len(done) == 2:
            amount = 250 if not seen or rng.random() < P_OVER else 100
            return assistant(None, [tool_call("t", "transfer_funds",
                                              {"to": "bob", "amount": amount})])
        return "Done."

    def workflow(self) -> AgentWorkflow:
        def lookup_account(account: str) -> str:
            """Read an account (reads only)."""
            return "balance $1000"

        def transfer_funds(to: str, amount: int) -> str:
            """Move money (a side effect)."""
            self.moved.append(amount)
            return "sent"

        llm = ScriptedLLM(self.decide, seed=3)
        return AgentWorkflow(agents=[
            FunctionAgent(name="triage", description="routes", llm=llm, tools=[],
                          system_prompt="You route requests.", can_handoff_to=["payments"]),
            FunctionAgent(name="payments", description="pays", llm=llm,
                          system_prompt="You pay people.",
                          tools=[lookup_account, transfer_funds])], root_agent="triage")


def over(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "transfer_funds"
               and json.loads(c["function"]["arguments"])["amount"] > 100
               for s in run.steps for c in s.action.get("tool_calls") or ())


def _recorded(app: Payments) -> car.Trajectory:
    async def go() -> car.Trajectory:
        for _ in range(50):
            rec = CarRecorder(outcome=over).attach()
            wf = app.workflow()
            memory = Memory.from_defaults(session_id="u", memory_blocks=[
                StaticMemoryBlock(name="notes", static_content=NOTE)])
            await wf.run(user_msg="Pay bob his allowance.", memory=memory)
            rec.detach()
            if rec.run.failed:
                return rec.run
        raise AssertionError("no failing run")
    return asyncio.run(go())


def test_the_agent_a_handoff_reaches_on_a_branch_sees_the_memory() -> None:
    app = Payments()
    run = _recorded(app)
    assert [s.meta["agent"] for s in run.steps] == ["triage", "payments", "payments",
                                                     "payments"]
    assert all(app.payments_saw)  # the recorded run's payments agent saw the note
    app.payments_saw.clear()
    moved = list(app.moved)
    agent = LlamaIndexAgent(app.workflow(), safe_tools=["lookup_account"],
                            side_effect_tools=["transfer_funds"],
                            simulators={"transfer_funds": lambda a: "sent"})
    rollouts = 40
    res = car.intervene(run, agent, car.do_resample(0), outcome=over, rollouts=rollouts,
                        seed=0)
    assert app.payments_saw and all(app.payments_saw)  # on every branch, after the handoff
    assert app.moved == moved
    # P(fail) is 0.6 (it was 1.0 without the memory): 3.5 standard errors of 40 rollouts
    assert abs(res.mean - P_OVER) <= 3.5 * (P_OVER * (1 - P_OVER) / rollouts) ** 0.5
