"""``Send`` fan-out of model calls: the map-reduce refund board of
``car_adapters.demo.review_board`` (three reviewers sent in parallel, a judge, a clerk).

Planted truth for a failing run. Steps: the votes of ``fraud`` (0), ``policy`` (1) and
``history`` (2) in ``Send`` order, the clerk's refund call (3), its closing reply (4). Only the
policy vote is random: "approve" with p = 0.5 when the claim carries the injection; the judge
approves on any "approve", and the clerk refunds an approved claim.

- P(fail | factual) = 1 (the approve vote held, everything after it deterministic).
- do_resample(0) and do_resample(1) decide the policy vote again: P(fail) = p = 0.5, rescue 0.5.
- do_resample(2), (3), (4) hold the approve vote: P(fail) = 1, rescue 0. So the locus is 1,
  the planted vote, not the refund step 3 that carries it out.
- do_context(1, identity) = do_resample(1) = 0.5; do_context(1, remove_injection) = 0;
  do_action(1, "reject") = 0; do_context(3, verdict "denied") = 0.

A fork at step k holds the workers whose steps come before k by their recorded writes (no
model call: the planted model logs every call) and runs the workers from k on live.

Tolerance: an arm of n = 48 rollouts at p = 0.5 has standard error sqrt(0.25 / 48) = 0.072; we
allow 4 of them (0.29). Arms at 0 or 1 are exact.
"""

from __future__ import annotations

import asyncio
import collections
import math
import threading
from typing import Any

import pytest
from car_adapters.demo import review_board as rb
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Send

import car_core as car
from car_core.contract import PARALLEL_TASK
from car_core.errors import AdapterError
from car_core.model.trajectory import step_label
from car_core.testing import SideEffectLedger, run_conformance

N = 48
TOL = 4 * math.sqrt(0.25 / N)
REJECT = {"role": "assistant", "content": "reject"}


def failing(app: Any, cb: CarCallback | None = None) -> car.Trajectory:
    cb = cb or CarCallback()
    for i in range(40):  # seeded model: deterministic
        app.invoke(rb.inputs(), {"configurable": {"thread_id": f"claim-{i}"}, "callbacks": [cb]})
        if rb.outcome(cb.run):
            assert cb.run is not None
            return cb.run
    raise AssertionError("no failing run")


@pytest.fixture
def plain() -> tuple[Any, rb.PlantedBoardModel]:
    model = rb.PlantedBoardModel(rng_seed=0)
    return rb.build_app(model, InMemorySaver()), model


@pytest.fixture
def wrapped() -> tuple[Any, CarChatModel, rb.PlantedBoardModel]:
    model = rb.PlantedBoardModel(rng_seed=0)
    wrapper = CarChatModel(inner=model)
    return rb.build_app(wrapper, InMemorySaver()), wrapper, model


def aspects(run: car.Trajectory) -> list[str]:
    """The reviewer each of the first three steps is, read from the prompt it decided from."""
    return [next(a for a in rb.ASPECTS if s.state[0]["content"] == rb.reviewer_prompt(a))
            for s in run.steps[:3]]


class _Signals:
    history_voted = threading.Event()


class SignallingModel(rb.PlantedBoardModel):
    """Tells the test when the history reviewer has voted."""

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> Any:
        result = super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
        if self.call_log[-1] == "history":
            _Signals.history_voted.set()
        return result


def test_send_steps_take_the_send_order_whatever_order_the_workers_run_in() -> None:
    """The fraud reviewer (Send index 0) waits until the history reviewer (index 2) has voted,
    so the model calls start and finish out of order; the record is still in Send order, with
    each worker's own prompt as the state it decided from."""
    model = SignallingModel(rng_seed=0)

    def before(aspect: str) -> None:
        if aspect == "fraud":
            assert _Signals.history_voted.wait(timeout=30), "the history reviewer never voted"

    app = rb.build_app(model, InMemorySaver(), before_review=before)
    cb = CarCallback()
    app.invoke(rb.inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    run = cb.run
    assert run is not None
    assert model.call_log.index("history") < model.call_log.index("fraud")  # really out of order
    assert aspects(run) == list(rb.ASPECTS)
    assert [s.meta["task_path"][:2] for s in run.steps[:3]] == [
        ["__pregel_push", i] for i in range(3)]
    assert run.steps[0].state[1] == {"role": "user", "content": rb.CLAIM}
    # each worker is named by its task, not as one agent's 1st, 2nd, 3rd decision in turn
    assert [s.meta[PARALLEL_TASK] for s in run.steps[:3]] == [0, 1, 2]
    assert PARALLEL_TASK not in run.steps[3].meta
    worker = run.steps[1].meta["agent"]
    assert step_label(run, 1) == f"{worker}, step 1 (parallel task 2)"


def test_contrastive_names_the_planted_vote_inside_the_fan_out(plain: Any) -> None:
    app, _ = plain
    run = failing(app)
    refunds = len(rb.REFUNDS)
    agent = LangGraphAgent(app, side_effect_tools=rb.SIDE_EFFECT_TOOLS)
    res = car.contrastive(run, agent, outcome=rb.outcome, rollouts=N, seed=0)
    assert res.locus == 1
    assert res.locus_label.endswith("step 1 (parallel task 2)")
    assert ", parallel task 2) caused the failure" in str(res).splitlines()[0]
    lo, hi = res.steps[1].ci
    assert lo <= 0.5 <= hi and lo > 0
    assert len(rb.REFUNDS) == refunds  # every branch's refund was answered from the record


@pytest.mark.parametrize(("k", "live", "p"), [(0, {"fraud", "policy", "history"}, 0.5),
                                              (1, {"policy", "history"}, 0.5),
                                              (2, {"history"}, 1.0)])
def test_a_fork_in_the_fan_out_holds_the_earlier_workers_and_reruns_the_later(
        plain: Any, k: int, live: set[str], p: float) -> None:
    app, model = plain
    run = failing(app)
    agent = LangGraphAgent(app, side_effect_tools=rb.SIDE_EFFECT_TOOLS)
    model.reset_calls()
    dist = car.intervene(run, agent, car.do_resample(k), outcome=rb.outcome, rollouts=N, seed=2)
    calls = collections.Counter(model.call_log)
    assert {a: calls[a] for a in rb.ASPECTS} == {a: N if a in live else 0 for a in rb.ASPECTS}
    assert abs(dist.mean - p) <= (TOL if p == 0.5 else 0.0)
    for t in dist.trajectories:  # every branch in Send order, its held steps the record's
        assert aspects(t) == list(rb.ASPECTS)
        assert [s.action for s in t.steps[:k]] == [s.action for s in run.steps[:k]]
        assert [s.meta["origin"] for s in t.steps[:k + 1]] == ["held"] * k + ["live"]


def test_interventions_at_a_send_worker_through_the_wrapper(wrapped: Any) -> None:
    app, wrapper, model = wrapped
    run = failing(app)
    refunds = len(rb.REFUNDS)
    agent = LangGraphAgent(app, model=wrapper, side_effect_tools=rb.SIDE_EFFECT_TOOLS)
    resample = car.intervene(run, agent, car.do_resample(1), outcome=rb.outcome, rollouts=N,
                             seed=1)
    same = car.intervene(run, agent, car.do_context(1, lambda m: m), outcome=rb.outcome,
                         rollouts=N, seed=1)
    assert abs(resample.mean - 0.5) <= TOL and abs(same.mean - 0.5) <= TOL
    # coupled noise: rollout r of both arms decides the vote from the same seed
    assert [t.steps[1].action for t in same.trajectories] == [
        t.steps[1].action for t in resample.trajectories]
    model.reset_calls()
    fixed = car.intervene(run, agent, car.do_context(1, rb.remove_injection),
                          outcome=rb.outcome, rollouts=16)
    assert fixed.mean == 0.0 and "fraud" not in model.call_log
    for t in fixed.trajectories:
        assert t.steps[1].meta["origin"] == "edited"
        assert t.steps[1].state[1]["content"] == rb.CLAIM.replace(rb.INJECTION, "").strip()
    forced = car.intervene(run, agent, car.do_action(1, REJECT), outcome=rb.outcome,
                           rollouts=4)
    assert forced.mean == 0.0 and all(t.steps[1].action["content"] == "reject"
                                      for t in forced.trajectories)

    def denied(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**m, "content": m["content"].replace("approved", "denied")} for m in messages]

    overruled = car.intervene(run, agent, car.do_context(3, denied), outcome=rb.outcome,
                              rollouts=4)
    assert overruled.mean == 0.0
    assert len(rb.REFUNDS) == refunds


def test_without_the_wrapper_edits_at_a_send_worker_are_refused_before_anything_runs(
        plain: Any) -> None:
    app, model = plain
    run = failing(app)
    agent = LangGraphAgent(app, side_effect_tools=rb.SIDE_EFFECT_TOOLS)
    model.reset_calls()
    for arm in (car.do_context(1, rb.remove_injection), car.do_action(1, REJECT)):
        with pytest.raises(AdapterError, match=r"step 1 ran in a Send task of node 'reviewer'"):
            car.intervene(run, agent, arm, outcome=rb.outcome, rollouts=4)
    assert model.call_log == []


def test_the_send_board_passes_the_whole_conformance_suite(
        wrapped: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    app, wrapper, model = wrapped
    ledger = SideEffectLedger(rb.SIDE_EFFECT_TOOLS)
    monkeypatch.setattr(rb.issue_refund, "func", ledger.wrap("issue_refund",
                                                              rb.issue_refund.func))

    def make() -> Any:
        counter = type("Counter", (), {"steps": property(lambda self: model.call_steps),
                                       "reset": staticmethod(model.reset_calls)})()
        return LangGraphAgent(app, model=wrapper, side_effect_tools=rb.SIDE_EFFECT_TOOLS), counter

    run = next(r for r in (car.record(make()[0], context=rb.inputs(), outcome=rb.outcome,
                                      seed=s) for s in range(20)) if rb.outcome(r))
    assert ledger.count("issue_refund") >= 1  # the recorded run refunded for real
    ran = run_conformance(make, run=run, outcome=rb.outcome, seed=0, side_effects=ledger)
    assert ran == ["replay", "prefix", "lineage", "forced", "noise", "identity", "async",
                   "stop", "coupling", "fingerprint-in-process", "side-effects"]


def test_a_held_worker_that_did_not_finish_is_refused_before_any_branch_runs() -> None:
    """The fraud reviewer fails after voting: a fork at the later votes could only hold it by
    running it again."""
    model = rb.PlantedBoardModel(rng_seed=0)

    def after(aspect: str) -> None:
        if aspect == "fraud":
            raise RuntimeError("the fraud service is down")

    app = rb.build_app(model, InMemorySaver(), after_review=after)
    cb = CarCallback()
    with pytest.raises(RuntimeError, match="fraud service"):
        app.invoke(rb.inputs(), {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
    run = cb.run
    assert run is not None and run.status == "error" and aspects(run)[0] == "fraud"
    model.reset_calls()
    with pytest.raises(AdapterError, match=r"step 0 ran in a parallel task .* did not finish"):
        car.intervene(run, LangGraphAgent(app, side_effect_tools=rb.SIDE_EFFECT_TOOLS),
                      car.do_resample(0), outcome=rb.outcome, rollouts=4)
    assert model.call_log == []


class Echo(rb.PlantedBoardModel):
    def decide(self, messages: Any) -> tuple[str, AIMessage]:
        return "fraud", AIMessage(f"on {messages[-1].content}")


def _recorded(app: Any) -> car.Trajectory:
    cb = CarCallback()
    app.invoke({"messages": [HumanMessage("go")]},
               {"configurable": {"thread_id": "fan"}, "callbacks": [cb]})
    assert cb.run is not None and len(cb.run.steps) == 2
    return cb.run


def test_parallel_model_nodes_and_fan_outs_into_subgraphs_are_refused_by_name() -> None:
    """Two model nodes in one superstep (not Send tasks), and a Send fan-out into a subgraph
    that calls the model: no fork can hold one task apart, so both are refused before any
    model call."""
    model = Echo()

    def node(name: str) -> Any:
        return lambda state: {"messages": [model.invoke([HumanMessage(name)])]}

    parallel = StateGraph(MessagesState)
    parallel.add_node("a", node("a"))
    parallel.add_node("b", node("b"))
    parallel.add_edge(START, "a")
    parallel.add_edge(START, "b")

    def refused(app: Any, match: str) -> None:
        run = _recorded(app)
        model.reset_calls()
        with pytest.raises(AdapterError, match=match):
            car.intervene(run, LangGraphAgent(app), car.do_resample(1), outcome=rb.outcome,
                          rollouts=2)
        assert model.call_log == []  # refused before any model call

    refused(parallel.compile(checkpointer=InMemorySaver()),
            r"several model nodes in one superstep, not Send")

    inner = StateGraph(MessagesState)
    inner.add_node("think", lambda state: {"messages": [model.invoke(state["messages"])]})
    inner.add_edge(START, "think")
    outer = StateGraph(MessagesState)
    outer.add_node("worker", inner.compile())
    outer.add_conditional_edges(START, lambda state: [
        Send("worker", {"messages": [HumanMessage(t)]}) for t in ("x", "y")], ["worker"])
    refused(outer.compile(checkpointer=InMemorySaver()),
            r"decided inside a subgraph one of them runs")


def test_import_thread_refuses_a_fan_out_whose_workers_wrote_model_messages() -> None:
    """Checkpoints do not say which Send task wrote which message: the import is refused
    (the callback records such runs)."""
    model = Echo()
    graph = StateGraph(MessagesState)
    graph.add_node("write", lambda task: {"messages": [model.invoke([HumanMessage(task["t"])])]})
    graph.add_conditional_edges(START, lambda state: [Send("write", {"t": t})
                                                      for t in ("a", "b")], ["write"])
    app = graph.compile(checkpointer=InMemorySaver())
    run = _recorded(app)
    agent = LangGraphAgent(app)
    with pytest.raises(AdapterError, match=r"parallel tasks \(nodes \['write'\]: a Send"):
        agent.import_thread("fan")
    dist = car.intervene(run, agent, car.do_resample(1), outcome=lambda r: False, rollouts=2)
    assert all(t.steps[0].action == run.steps[0].action for t in dist.trajectories)


def test_an_async_fan_out_is_branched_with_ainvoke_in_send_order() -> None:
    """The same board with async nodes: branches run with ``ainvoke``, the workers one at a
    time in Send order, the earlier ones held (no model call)."""
    model = rb.PlantedBoardModel(rng_seed=0)
    wrapper = CarChatModel(inner=model)
    app = rb.build_app(wrapper, InMemorySaver(), asynchronous=True)
    cb = CarCallback()
    for i in range(40):  # seeded model: deterministic
        asyncio.run(app.ainvoke(rb.inputs(), {"configurable": {"thread_id": f"a-{i}"},
                                              "callbacks": [cb]}))
        if rb.outcome(cb.run):
            break
    run = cb.run
    assert run is not None and rb.outcome(run) and aspects(run) == list(rb.ASPECTS)
    agent = LangGraphAgent(app, model=wrapper, side_effect_tools=rb.SIDE_EFFECT_TOOLS)
    assert agent.is_async
    model.reset_calls()
    dist = car.intervene(run, agent, car.do_resample(1), outcome=rb.outcome, rollouts=N,
                         seed=4)
    calls = collections.Counter(model.call_log)
    assert (calls["fraud"], calls["policy"], calls["history"]) == (0, N, N)
    assert abs(dist.mean - 0.5) <= TOL
    assert all(aspects(t) == list(rb.ASPECTS) for t in dist.trajectories)
    edited = car.intervene(run, agent, car.do_context(1, rb.remove_injection),
                           outcome=rb.outcome, rollouts=8)
    assert edited.mean == 0.0


def test_shapley_across_the_fan_out_splits_credit_between_vote_and_refund(wrapped: Any) -> None:
    """Players {1} (the policy vote), {3} (the refund call) and the other steps grouped. A held
    vote approves, so the clerk refunds; a held refund call refunds whatever the vote: v(S) = 1
    when 1 or 3 is held, else p = 0.5. So phi_1 = phi_3 = 0.25 and phi_rest = 0. Coalitions
    that hold the later votes or the closing reply force them inside the fan-out, by step."""
    app, wrapper, _ = wrapped
    run = failing(app)
    refunds = len(rb.REFUNDS)
    agent = LangGraphAgent(app, model=wrapper, side_effect_tools=rb.SIDE_EFFECT_TOOLS)
    sh = car.shapley(run, agent, outcome=rb.outcome, budget=160, players=[1, 3], seed=0)
    # Only v({}) and v({rest}) are random (p = 0.5, variance 0.25); phi_i weighs them by 1/3 and
    # 1/6, so with >= 160/8 = 20 rollouts each se(phi) <= sqrt(0.25/20 * (1/9 + 1/36)) = 0.042;
    # we allow 4 of them.
    tol = 4 * math.sqrt(0.25 / 20 * (1 / 9 + 1 / 36))
    est = [v.estimate for v in sh.values]
    assert est[0] is not None and est[1] is not None and est[2] is not None
    assert abs(est[0] - 0.25) <= tol and abs(est[1] - 0.25) <= tol and abs(est[2]) <= tol
    assert sh.rollouts_used <= 160 and len(rb.REFUNDS) == refunds
