"""The LangGraph adapter keeps the contract every CAR agent keeps: the conformance suite with a
ledger of real side-effect calls, action matching that ignores provider-assigned tool-call ids,
outcomes stored as runs finish, and ``attribute_thread`` taking ``outcome(run)`` and storing a
thread once.

The app is the support agent of ``car_adapters.demo.support_agent`` (see test_langgraph.py):
failure = a refund was issued; the only random choice is the decision at step 1, "refund" with
probability 0.3 after the injection. ``issue_refund`` is the side-effect tool.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import pytest
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent, attribute_thread
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.model.seeding import Noise
from car_core.testing import SideEffectLedger, run_conformance


@pytest.fixture
def ledger(monkeypatch: pytest.MonkeyPatch) -> SideEffectLedger:
    """Counts every real call of ``issue_refund`` (the tool's function itself is wrapped)."""
    book = SideEffectLedger(sa.SIDE_EFFECT_TOOLS)
    monkeypatch.setattr(sa.issue_refund, "func", book.wrap("issue_refund", sa.issue_refund.func))
    return book


def failing_run(app: Any, cb: CarCallback, tries: int = 50) -> car.Trajectory:
    for i in range(tries):  # p = 0.3 per ticket; the model's rng is seeded: deterministic
        app.invoke(sa.inputs(), {"configurable": {"thread_id": f"user-{i}"}, "callbacks": [cb]})
        if sa.outcome(cb.run):
            return cb.run
    raise AssertionError(f"no failing run in {tries} tickets")


def test_the_agent_passes_the_whole_conformance_suite_with_no_real_side_effect(
        ledger: SideEffectLedger) -> None:
    model = sa.PlantedSupportModel(rng_seed=0)
    wrapper = CarChatModel(inner=model)
    app = sa.build_app(wrapper, InMemorySaver())
    run = failing_run(app, CarCallback())
    assert ledger.count("issue_refund") == 1  # the user's run refunded for real, once

    class Counter:  # the prefix check reads .steps (the step of each model call) and .reset()
        steps = property(lambda self: model.call_steps)
        reset = staticmethod(model.reset_calls)

    def make() -> Any:  # the graph's tools must never run issue_refund on a branch
        return (LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS, model=wrapper,
                               side_effect_tools=sorted(ledger.names),
                               simulators={"issue_refund": lambda a: '{"simulated": true}'}),
                Counter())

    ran = run_conformance(make, run=run, outcome=sa.outcome, seed=0, side_effects=ledger)
    assert ran == ["replay", "prefix", "lineage", "forced", "noise", "identity", "async",
                   "stop", "coupling", "fingerprint-in-process", "side-effects"]
    assert ledger.count() == 0  # reset after the record; nothing ran on any branch


def test_the_suite_catches_real_side_effects_when_the_tool_is_not_guarded(
        ledger: SideEffectLedger) -> None:
    wrapper = CarChatModel(inner=sa.PlantedSupportModel(rng_seed=0))
    app = sa.build_app(wrapper, InMemorySaver())
    run = failing_run(app, CarCallback())
    with pytest.raises(car.errors.ConformanceFailure, match=r"ran side-effect tool\(s\) "
                                                            r"\['issue_refund'\] for real"):
        # the refund wrongly named safe: the ledger catches it on the first check
        run_conformance(lambda: LangGraphAgent(app, model=wrapper,
                                               safe_tools=[*sa.SAFE_TOOLS, "issue_refund"]),
                        run=run, outcome=sa.outcome, side_effects=ledger)


class FreshIdModel(sa.PlantedSupportModel):
    """Gives every tool call a fresh id, as hosted providers do, and a message id too."""

    def decide(self, messages: Any) -> AIMessage:
        msg = super().decide(messages)
        for call in msg.tool_calls:
            call["id"] = f"call_{uuid.uuid4().hex[:12]}"
        msg.id = f"msg_{uuid.uuid4().hex}"
        return msg


def test_action_match_ignores_the_tool_call_ids_a_provider_assigns() -> None:
    # p_follow = 1: every step is deterministic, so re-deciding gives the recorded decision
    # and the match rate is exactly 1 when ids do not count, 0 on tool-call steps when they do.
    wrapper = CarChatModel(inner=FreshIdModel(p_follow=1.0))
    app = sa.build_app(wrapper, InMemorySaver())
    cb = CarCallback()
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    run = cb.run
    agent = LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS, side_effect_tools=sa.SIDE_EFFECT_TOOLS,
                           model=wrapper)
    again = agent.redecide(run, 1, Noise(0))
    assert again["tool_calls"][0]["id"] != run.steps[1].action["tool_calls"][0]["id"]
    assert again != run.steps[1].action
    match = car.action_match_rate(run, agent, replays=2)
    assert match.per_step == (1.0,) * len(run.steps) and match.rate == 1.0
    assert len(run.steps) == 4 and all(s.action["tool_calls"] for s in run.steps[:3])


def test_the_callback_stores_each_runs_outcome_as_it_finishes(store: Any) -> None:
    cb = CarCallback(store=store.path, outcome=sa.outcome)  # a path, as a user passes it
    app = sa.build_app(CarChatModel(inner=sa.PlantedSupportModel(rng_seed=0)), InMemorySaver())
    for i in range(12):
        app.invoke(sa.inputs(), {"configurable": {"thread_id": f"u{i}"}, "callbacks": [cb]})
    cb.flush()  # a path is written off the run's critical path; flush makes it durable
    listed = {r["id"]: r["outcome"] for r in store.runs()}
    assert listed == {r.id: float(sa.outcome(r)) for r in cb.runs} and len(listed) == 12
    assert set(listed.values()) == {0.0, 1.0}  # p = 0.3 over 12 seeded tickets: both happen
    assert all(store.load(r.id).outcome == r.outcome for r in cb.runs)
    shown = subprocess.run([sys.executable, "-m", "car_core.cli", "runs", "--store",
                            str(store.path), "--json"], capture_output=True, text=True,
                           check=True)  # what `car runs` shows
    assert {r["id"]: r["outcome"] for r in json.loads(shown.stdout)} == listed

    def broken(run: car.Trajectory) -> float:
        raise RuntimeError("judge down")

    bad = CarCallback(store=store, outcome=broken)
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "x"}, "callbacks": [bad]})
    assert bad.run is not None and bad.run.outcome is None  # recorded, unscored, not lost
    assert "judge down" in str(bad.outcome_errors[0])
    assert store.load(bad.run.id).outcome is None


def test_attribute_thread_takes_outcome_of_the_run_and_stores_a_thread_once(
        store: Any, ledger: SideEffectLedger) -> None:
    wrapper = CarChatModel(inner=sa.PlantedSupportModel(rng_seed=0))
    app = sa.build_app(wrapper, InMemorySaver())
    run = failing_run(app, CarCallback())
    thread = run.meta["thread_id"]
    assert ledger.count() == 1
    ledger.reset()
    seen: list[Any] = []

    def outcome(r: car.Trajectory) -> bool:
        seen.append(type(r))
        return sa.outcome(r)

    first = attribute_thread(app, thread, outcome=outcome, model=wrapper, store=store,
                             safe_tools=sa.SAFE_TOOLS, side_effect_tools=ledger.names,
                             rollouts=16, progress=False)
    assert first.locus == 1 and all(issubclass(t, car.Trajectory) for t in seen)
    second = attribute_thread(app, thread, outcome=sa.outcome, model=wrapper, store=store,
                              safe_tools=sa.SAFE_TOOLS, side_effect_tools=ledger.names,
                              rollouts=4, progress=False)
    assert second.run_id == first.run_id
    assert [r["id"] for r in store.runs()] == [first.run_id]  # one stored run, two attributions
    assert len(store.attributions(first.run_id)) == 2
    assert store.load(first.run_id).outcome.value == 1.0
    assert ledger.count() == 0  # the import path's branches answered refunds from the record


def test_attribute_thread_still_accepts_outcome_of_the_final_state(store: Any) -> None:
    wrapper = CarChatModel(inner=sa.PlantedSupportModel(rng_seed=0))
    app = sa.build_app(wrapper, InMemorySaver())
    run = failing_run(app, CarCallback())

    def old(state: dict[str, Any]) -> bool:  # the old form: reads the final state as a dict
        return any(c["function"]["name"] == "issue_refund"
                   for m in state["messages"] for c in m.get("tool_calls") or ())

    with pytest.warns(DeprecationWarning, match=r"outcome\(run\)"):
        res = attribute_thread(app, run.meta["thread_id"], outcome=old, model=wrapper,
                               store=store, rollouts=16, progress=False,
                               safe_tools=sa.SAFE_TOOLS, side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    assert res.locus == 1 and store.load(res.run_id).outcome.value == 1.0
