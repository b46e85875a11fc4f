"""A recorded run that ended with an error (the model server's 503 on the call after the
refund) is refused by name before any branch: the arm that holds every recorded step has
nothing to go on from. A user trial's run ran eight branches first and then blamed the agent
("the replay itself breaks... fix the agent")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, LangGraphAgent
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.contract import RunStatus
from car_core.errors import AdapterError

REFUNDS: list[str] = []
SERVER = {"down_after_refund": True}


@tool
def issue_refund(order_id: str, amount: float) -> str:
    """Refund an order (moves money: a side effect)."""
    REFUNDS.append(order_id)
    return json.dumps({"refunded": order_id, "amount": amount})


class Flaky(sa.PlantedSupportModel):
    """The support model behind a server that answers 503 once a refund went through."""

    def _generate(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        if SERVER["down_after_refund"] and any(
                getattr(m, "name", None) == "issue_refund" for m in messages):
            raise RuntimeError("503 Service Unavailable")
        return super()._generate(messages, *args, **kwargs)


def refunded(run: car.Trajectory) -> bool:
    """The failure, read from the steps: the run issued a refund."""
    return any(c["function"]["name"] == "issue_refund"
               for s in run.steps for c in s.action.get("tool_calls") or ())


def test_a_run_that_ended_with_an_error_is_refused_before_any_branch() -> None:
    model = Flaky(rng_seed=0)
    app = sa.build_app(model, InMemorySaver(),
                       tools=[sa.lookup_order, sa.record_decision, issue_refund])
    cb = CarCallback(outcome=refunded)
    for i in range(50):
        with _maybe_raises():
            app.invoke(sa.inputs(), {"configurable": {"thread_id": f"t{i}"}, "callbacks": [cb]})
        if cb.runs and refunded(cb.runs[-1]):
            break
    run = cb.runs[-1]
    assert run.status == RunStatus.ERROR and "503" in (run.error or "")
    assert REFUNDS
    calls, refunds = model.calls, len(REFUNDS)
    agent = LangGraphAgent(app, safe_tools=list(sa.SAFE_TOOLS),
                           side_effect_tools=["issue_refund"])
    with pytest.raises(AdapterError, match=r"the run ended with an error after step \d+ "
                                           r"\(.*503 Service Unavailable.*\).*no branch runs"):
        car.contrastive(run, agent, outcome=refunded, rollouts=8, seed=0)
    assert model.calls == calls and len(REFUNDS) == refunds  # nothing ran


class _maybe_raises:
    """A context that lets a run that raised end quietly (most tickets do not refund)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, *_: Any) -> bool:
        return kind is RuntimeError
