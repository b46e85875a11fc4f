"""LangGraph branches stop where the outcome is settled, and score exactly what a full run does.

The demo's refund desk (``car_adapters.demo.refund_desk``) driven by a planted, seeded model:
its first decision calls ``issue_refund`` with probability P_REFUND, else
``check_refund_policy``; then it calls the tool it has not called yet, then answers. The failure
(refund before any policy check) is settled by the first decision, so a branch from step 0 needs
one model call and a branch from a later step none, where a full branch needs three. Branches
share their noise per rollout (the model is seeded per step), so each one must score the same
with and without stopping, and the attribution must come out identical.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
from car_adapters.demo import refund_desk as desk
from car_adapters.demo.planted import SeededChatModel
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import PrivateAttr

import car_core as car
from car_core.model.interventions import compile_plan, do_resample
from car_core.model.seeding import Noise
from car_core.model.vocabulary import RunStatus

P_REFUND = 0.6
TOOLS = ("issue_refund", "check_refund_policy")


class PlantedDesk(SeededChatModel):
    """Seeded: the first decision refunds with probability P_REFUND; ``calls`` is shared by
    the per-step copies CAR makes."""

    seed: int | None = 0
    _log: list[int] = PrivateAttr(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "planted-desk"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(**kwargs)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self._log.append(1)
        called = [m.name for m in messages if isinstance(m, ToolMessage)]
        n_ai = sum(isinstance(m, AIMessage) for m in messages)
        if not called:
            refund = self._draw() < P_REFUND
            name = "issue_refund" if refund else "check_refund_policy"
        else:
            name = next((t for t in TOOLS if t not in called), None)
        msg = (AIMessage("", tool_calls=[{"id": f"call_{n_ai}", "name": name,
                                         "args": {"order_id": desk.ORDER_ID}}])
               if name else AIMessage("Done."))
        return ChatResult(generations=[ChatGeneration(message=msg)])


def plain_outcome(run: car.Trajectory) -> bool:
    """The desk's outcome without its ``settled`` hook: every branch runs to the end."""
    return bool(desk.outcome(run))


@pytest.fixture(scope="module")
def desk_run() -> tuple[Any, CarChatModel, PlantedDesk, car.Trajectory]:
    planted = PlantedDesk()
    wrapper = CarChatModel(inner=planted)
    app = desk.build_app(wrapper, InMemorySaver())
    cb = CarCallback()
    for i in range(40):
        wrapper.inner = planted.model_copy(update={"seed": i})
        app.invoke(desk.inputs(), {"configurable": {"thread_id": f"t{i}"}, "callbacks": [cb]})
        if desk.outcome(cb.run):
            break
    wrapper.inner = planted
    run = cb.run
    assert run is not None and desk.outcome(run) and len(run.steps) == 3
    return app, wrapper, planted, run


def _agent(app: Any, wrapper: CarChatModel) -> LangGraphAgent:
    return LangGraphAgent(app, model=wrapper, safe_tools=desk.SAFE_TOOLS,
                          side_effect_tools=desk.SIDE_EFFECT_TOOLS,
                          simulators={"issue_refund": desk.simulated_refund})


@pytest.mark.parametrize("start, calls_per_branch", [(0, 1), (1, 0), (2, 0)])
def test_a_branch_stops_at_its_settling_step_and_scores_the_same(desk_run, start,
                                                                 calls_per_branch) -> None:
    app, wrapper, planted, run = desk_run
    agent = _agent(app, wrapper)
    plan = compile_plan(run, [do_resample(start)])
    full_calls = short_calls = 0
    for r in range(16):
        noise = Noise(5, (1, r))
        planted._log.clear()
        full = agent.branch(run, plan, noise)
        full_calls += len(planted._log)
        planted._log.clear()
        short = agent.branch(run, plan, noise, stop=desk.outcome.settled)
        short_calls += len(planted._log)
        assert desk.outcome(short) == desk.outcome(full)
        assert short.status == RunStatus.SETTLED
        assert len(short.steps) == max(start, 1)
        assert short.steps[0].action == full.steps[0].action
    assert short_calls == 16 * calls_per_branch
    assert full_calls == 16 * (3 - start)


def test_a_settled_branch_never_reaches_the_side_effect_tool(desk_run) -> None:
    """A branch that refunds first stops before the tool node: not even the simulator runs."""
    app, wrapper, _, run = desk_run
    simulated: list[dict[str, Any]] = []
    agent = LangGraphAgent(app, model=wrapper, safe_tools=desk.SAFE_TOOLS,
                           side_effect_tools=desk.SIDE_EFFECT_TOOLS,
                           simulators={"issue_refund": lambda a: simulated.append(a) or "ok"})
    plan = compile_plan(run, [do_resample(0)])
    outcomes = [desk.outcome(agent.branch(run, plan, Noise(9, (1, r)),
                                          stop=desk.outcome.settled)) for r in range(16)]
    assert any(outcomes) and simulated == []


def test_contrastive_is_identical_with_settling_and_finds_the_first_decision(desk_run) -> None:
    """Planted truth: the failure is decided at step 0 (rescue 1 - P_REFUND = 0.4)."""
    app, wrapper, planted, run = desk_run
    planted._log.clear()
    full = car.contrastive(run, _agent(app, wrapper), outcome=plain_outcome, rollouts=32,
                           seed=2)
    full_calls = len(planted._log)
    planted._log.clear()
    short = car.contrastive(run, _agent(app, wrapper), outcome=desk.outcome, rollouts=32,
                            seed=2)
    assert [dataclasses.astuple(s) for s in short.steps] == [
        dataclasses.astuple(s) for s in full.steps]
    assert short.rollouts_used == full.rollouts_used
    assert short.locus == 0 and short.steps[0].ci[0] > 0
    assert len(planted._log) < full_calls / 2


def test_the_desks_settled_hook_never_speaks_too_early() -> None:
    """Every message sequence of up to four assistant turns (each calling one of the two tools,
    another tool, or answering): once ``settled`` is True for a prefix, no continuation scores
    differently from that prefix."""
    import itertools
    turns = [*TOOLS, "lookup", None]

    def state(seq: Sequence[str | None]) -> dict[str, Any]:
        return {"messages": [{"role": "assistant", "content": "" if t else "hi", "tool_calls": [
            {"id": f"c{i}", "type": "function",
             "function": {"name": t, "arguments": "{}"}}] if t else []}
            for i, t in enumerate(seq)]}

    def run_of(seq: Sequence[str | None]) -> Any:
        return type("Run", (), {"meta": {"final_state": state(seq)}})()

    checked = 0
    for n in range(5):
        for seq in itertools.product(turns, repeat=n):
            for cut in range(n + 1):
                if desk.outcome.settled(run_of(seq[:cut])):
                    assert desk.outcome(run_of(seq)) == desk.outcome(run_of(seq[:cut]))
                    checked += 1
    assert checked > 100
