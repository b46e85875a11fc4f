"""A safe tool that CAR runs again to judge its error runs under a branch's guard.

CAR runs a safe tool's errored call again, outside the graph, to tell whether the error was
the call's own (``sources.drifted_tools``). The planted lookup writes an audit line through a
side-effect tool from inside its own body, which the branch's guard answers from the record
at any depth. Run again without a guard, a trial's lookups wrote 14 real audit lines during an
attribution; the ledger here must stay at the record's count, and the estimate is scored.
The planted model asks for order Z9, which does not exist, with probability 0.7 (the failure:
it then apologises), else A1: re-deciding step 0 rescues 0.3.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car


class Planted(BaseChatModel):
    """Step 0 looks order Z9 up w.p. 0.7, else A1 (its own draws: seeds mean nothing);
    step 1 apologises when the lookup found nothing."""

    rng: Any = None

    @property
    def _llm_type(self) -> str:
        return "planted-lookup"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(**kwargs)

    def _generate(self, messages: list[Any], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        if not any(isinstance(m, AIMessage) for m in messages):
            order = "Z9" if self.rng.random() < 0.7 else "A1"
            said = AIMessage("", tool_calls=[{"id": f"c{self.rng.random()}", "args":
                                               {"order_id": order}, "name": "lookup_order"}])
        else:
            found = next(m for m in messages if isinstance(m, ToolMessage))
            said = AIMessage("Sorry, I cannot find that order." if "no such" in
                             str(found.content) else "Your order has shipped.")
        return ChatResult(generations=[ChatGeneration(message=said)])


def apologised(run: car.Trajectory) -> bool:
    return any("cannot find" in str((s.action or {}).get("content")) for s in run.steps)


def test_a_safe_tool_run_again_cannot_reach_a_side_effect(tmp_path: Path) -> None:
    ledger = tmp_path / "audit.jsonl"

    @tool
    def audit_log(entry: str) -> str:
        """Write an audit entry."""
        with ledger.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
        return "logged"

    @tool
    def lookup_order(order_id: str) -> str:
        """Look an order up."""
        audit_log.invoke({"entry": f"looked up {order_id}"})
        if order_id != "A1":
            raise ToolException(f"no such order {order_id}")
        return json.dumps({"order_id": order_id, "status": "shipped"})

    lookup_order.handle_tool_error = True
    model = CarChatModel(inner=Planted(rng=random.Random(7)))
    app = create_agent(model, [lookup_order, audit_log], checkpointer=InMemorySaver())
    cb = CarCallback()
    for i in range(40):  # 0.3 ** 40: no failure in 40 tries is out of the question
        app.invoke({"messages": [{"role": "user", "content": "Where is my order?"}]},
                   {"configurable": {"thread_id": f"t{i}"}, "callbacks": [cb]})
        if cb.run is not None and apologised(cb.run):
            break
    run = cb.run
    assert run is not None and apologised(run)
    recorded = len(ledger.read_text(encoding="utf-8").splitlines())
    agent = LangGraphAgent(app, model=model, safe_tools=["lookup_order"],
                           side_effect_tools=["audit_log"], match_on={"audit_log": "any"})
    res = car.contrastive(run, agent, outcome=apologised, rollouts=16, seed=0)
    assert len(ledger.read_text(encoding="utf-8").splitlines()) == recorded  # none ran
    assert res.failures == ()  # the unknown order is the agent's own doing: scored
    tested = res.steps[0]
    assert tested.tested and tested.ci.low <= 0.3 <= tested.ci.high
