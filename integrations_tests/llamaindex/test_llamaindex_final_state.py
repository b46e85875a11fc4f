"""``car_adapters.llamaindex.final_state(run)``: a rule over the app's own ``ChatMessage``
objects scores the recorded failure 1 and a branch whose planted step is re-decided 0; the
workflow store the last step began from comes with it."""

# No ``from __future__ import annotations``: LlamaIndex finds the ``ctx: Context`` parameter
# of a tool by its evaluated annotation, as in the docs' apps.
import asyncio
import json
from typing import Any

from car_adapters.common.messages import assistant, tool_call
from car_adapters.llamaindex import CarRecorder, LlamaIndexAgent, ScriptedLLM, final_state
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.workflow import Context

import car_core as car
from car_core.testing import SideEffectLedger

FARES = {"LX1": 900, "TP2": 300}
BUDGET = 500
CHEAP = assistant(None, [tool_call("b1", "book", {"flight": "TP2"})])


def decide(messages: list[dict[str, Any]], tools: list[str], rng: Any) -> Any:
    """Quote (step 0), book the expensive flight (step 1: the planted choice; always, in the
    record), confirm (step 2)."""
    last = messages[-1]
    if last["role"] != "tool":
        return assistant(None, [tool_call("q0", "quote", {"city": "Lisbon"})])
    if last.get("name") == "quote":
        return assistant(None, [tool_call("b1", "book", {"flight": "LX1"})])
    return "Booked, have a good trip."


def over_budget(messages: list[ChatMessage]) -> bool:
    """The app's rule, over its chat history: the bookings cost more than the budget."""
    spent = sum(json.loads(m.content or "{}").get("price", 0) for m in messages
                if m.role == MessageRole.TOOL and '"price"' in (m.content or ""))
    return spent > BUDGET


def outcome(run: car.Trajectory) -> bool:
    return over_budget(final_state(run)["messages"])


def desk(ledger: SideEffectLedger) -> FunctionAgent:
    async def quote(ctx: Context, city: str) -> str:
        """Quote the flights to a city (keeps the quote in the workflow store)."""
        await ctx.store.set("quoted", sorted(FARES))
        return "; ".join(f"{f} to {city}: {p} EUR" for f, p in FARES.items())

    def book(flight: str) -> str:
        """Book a flight (spends money: a side effect)."""
        ledger.note("book", {"flight": flight})
        return json.dumps({"booked": flight, "price": FARES[flight]})

    return FunctionAgent(name="Desk", description="books flights", system_prompt="Book a trip.",
                         tools=[quote, book], llm=ScriptedLLM(decide))


def test_final_state_gives_chat_messages_and_a_branch_redeciding_the_booking_scores_0() -> None:
    ledger = SideEffectLedger(["book"])
    app = desk(ledger)
    rec = CarRecorder(outcome=outcome).attach()
    try:
        async def main() -> None:
            await app.run(user_msg="Fly me to Lisbon.")
        asyncio.run(main())
        run = rec.run
    finally:
        rec.detach()
    state = final_state(run)
    messages = state["messages"]
    assert all(isinstance(m, ChatMessage) for m in messages)
    assert [m.role for m in messages] == [
        MessageRole.SYSTEM, MessageRole.USER, MessageRole.ASSISTANT, MessageRole.TOOL,
        MessageRole.ASSISTANT, MessageRole.TOOL, MessageRole.ASSISTANT]
    assert json.loads(messages[5].content) == {"booked": "LX1", "price": 900}
    assert messages[5].additional_kwargs == {"tool_call_id": "b1", "name": "book"}
    assert state["response"] == messages[6].content == "Booked, have a good trip."
    assert state["store"]["quoted"] == ["LX1", "TP2"]  # written by step 0's tool
    assert state["agent"] == "Desk"
    assert run.outcome is not None and run.outcome.value == 1.0
    ledger.reset()
    agent = LlamaIndexAgent(app, safe_tools=["quote"], side_effect_tools=["book"],
                            simulators={"book": lambda args: json.dumps(
                                {"booked": args["flight"], "price": FARES[args["flight"]]})})
    dist = car.intervene(run, agent, car.do_action(1, CHEAP), outcome=outcome, rollouts=2)
    assert dist.n == 2 and dist.mean == 0.0
    branch = final_state(dist.trajectories[0])
    assert [json.loads(m.content)["booked"] for m in branch["messages"]
            if m.role == MessageRole.TOOL and '"price"' in (m.content or "")] == ["TP2"]
    assert branch["response"] == "Booked, have a good trip."
    assert ledger.count() == 0  # the booking was simulated on the branches


def test_a_run_a_return_direct_tool_ended_has_that_tools_result_as_its_response() -> None:
    """A ``return_direct`` tool's result is the run's final response, with no model reply
    after it: ``final_state`` gave None, and an outcome over the response scored the failing
    run as passing (a user trial's ``car runs`` listed it passed)."""
    from llama_index.core.tools import FunctionTool

    def issue_voucher(amount: int) -> str:
        """Issue a voucher (ends the run with its answer)."""
        return f"Voucher of ${amount} issued."

    agent = FunctionAgent(name="desk", system_prompt="Refund desk.", llm=ScriptedLLM(
        lambda m, t, r: assistant(None, [tool_call("v1", "issue_voucher", {"amount": 200})])),
        tools=[FunctionTool.from_defaults(issue_voucher, return_direct=True)])
    rec = CarRecorder().attach()

    async def go() -> Any:
        return await agent.run(user_msg="A1 arrived damaged")

    try:
        out = asyncio.run(go())
    finally:
        rec.detach()
    assert final_state(rec.run)["response"] == str(out.response.content) == \
        "Voucher of $200 issued."
