"""A ``langgraph-supervisor`` app with two ``create_agent`` workers (subgraphs), every model call
through one ``CarChatModel``, so held later steps and Shapley coalitions work across agents.

Planted truth (``car_adapters.demo.supervisor_app``): step 4 is ``account_agent``'s decision
(``flag_account``: close with p = 0.5 when the injection the research worker passed on is
visible), step 5 the mechanical ``close_account``. For a failing run:

- contrastive: rescue(4) = 1 - 0.5 = 0.5, rescue(k) = 0 for every other step (resampling 5
  re-decides close, as the flag says so), so the locus is 4, not the mechanical 5.
- Shapley over players {4}, {5} and the other steps grouped: v(S) = 1 when 4 or 5 is held
  (a held 5 closes whatever 4 says), else 0.5; so phi_4 = phi_5 = 0.25, phi_rest = 0.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from car_adapters.demo import supervisor_app as sv
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent, attribute_thread
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.report import render_attribution
from car_core.testing import run_conformance


@pytest.fixture(scope="module")
def app() -> Any:
    model = CarChatModel(inner=sv.PlantedAgentModel(rng_seed=1))
    with pytest.warns(Warning):  # create_supervisor uses the deprecated create_react_agent
        built = sv.build_app(model, InMemorySaver())
    return built, model


def failing(app: Any) -> car.Trajectory:
    cb = CarCallback()
    for i in range(30):  # seeded model: deterministic
        app.invoke(sv.inputs(), {"configurable": {"thread_id": f"user-{i}"},
                                 "callbacks": [cb]})
        if sv.outcome(cb.run):
            assert cb.run is not None
            return cb.run
    raise AssertionError("no failing run")


def test_contrastive_names_the_worker_and_its_decision(app: Any) -> None:
    graph, model = app
    run = failing(graph)
    agent = LangGraphAgent(graph, model=model, safe_tools=sv.SAFE_TOOLS,
                           side_effect_tools=["close_account"])
    closed = len(sv.CLOSED)
    res = car.contrastive(run, agent, outcome=sv.outcome, rollouts=32, seed=0)
    assert res.locus == 4
    lo, hi = res.steps[4].ci
    assert lo <= 0.5 <= hi and lo > 0
    assert res.locus_label == "account_agent, step 4 (its 1st decision)"
    assert "locus: step 4 (decided by account_agent, its 1st decision), rescue " in res.explain()
    assert str(res).startswith("Step 4 (account_agent called ")
    assert "its 1st decision) caused the failure" in str(res).splitlines()[0]
    assert len(sv.CLOSED) == closed  # no branch closed the account for real
    html = render_attribution(res, run)
    assert "account_agent, step 4 (its 1st decision)" in html and "node model" in html
    assert "You manage accounts." in html  # the system prompt step 4 decided under


def test_shapley_splits_credit_between_decision_and_mechanical_step(app: Any) -> None:
    graph, model = app
    run = failing(graph)
    agent = LangGraphAgent(graph, model=model, safe_tools=sv.SAFE_TOOLS,
                           side_effect_tools=["close_account"])
    closed = len(sv.CLOSED)
    sh = car.shapley(run, agent, outcome=sv.outcome, budget=160, players=[4, 5], seed=0)
    # Only v({}) and v({rest}) are random (p = 0.5, variance 0.25); phi_i weighs them by 1/3 and
    # 1/6, so with >= 160/8 = 20 rollouts each se(phi) <= sqrt(0.25/20 * (1/9 + 1/36)) = 0.042;
    # we allow 4 of them.
    tol = 4 * math.sqrt(0.25 / 20 * (1 / 9 + 1 / 36))
    est = [v.estimate for v in sh.values]
    assert est[0] is not None and est[1] is not None and est[2] is not None
    assert abs(est[0] - 0.25) <= tol and abs(est[1] - 0.25) <= tol and abs(est[2]) <= tol
    assert sh.values[0].label == "account_agent, step 4 (its 1st decision)"
    assert sh.rollouts_used <= 160 and len(sv.CLOSED) == closed


def test_attribute_thread_imports_and_attributes_without_side_effects(app: Any) -> None:
    graph, model = app
    run = failing(graph)
    closed = len(sv.CLOSED)
    res = attribute_thread(graph, str(run.meta["thread_id"]),
                           outcome=sv.outcome, model=model,
                           safe_tools=sv.SAFE_TOOLS, side_effect_tools=["close_account"],
                           rollouts=32, seed=0)
    assert res.locus == 4 and res.locus_label == "account_agent, step 4 (its 1st decision)"
    assert len(sv.CLOSED) == closed


def test_supervisor_passes_the_conformance_suite(app: Any) -> None:
    graph, model = app
    ran = run_conformance(
        lambda: LangGraphAgent(graph, model=model, safe_tools=sv.SAFE_TOOLS,
                               side_effect_tools=["close_account"],
                               simulators={"close_account": lambda args: {"closed": "sim"}}),
        context=sv.inputs(), outcome=sv.outcome, seed=0)
    assert ran == ["replay", "lineage", "forced", "noise", "identity", "async", "stop",
                   "coupling", "fingerprint"]


def test_held_steps_leave_only_plain_values_in_checkpoints(app: Any) -> None:
    """A held (forced) decision's message goes into the branch's checkpoints: it must carry
    no CAR type, which LangGraph's checkpoint serializer warns about and will refuse to load."""
    graph, model = app
    run = failing(graph)
    agent = LangGraphAgent(graph, model=model, safe_tools=sv.SAFE_TOOLS,
                           side_effect_tools=["close_account"],
                           keep_branches=True)
    dist = car.intervene(run, agent, [car.do_resample(4), car.do_action(5, run.steps[5].action)],
                         outcome=sv.outcome, rollouts=1, seed=0)
    branch = dist.trajectories[0]
    assert branch.steps[5].meta["origin"] == "held"
    thread_id = branch.meta["thread_id"]
    origins = [m.response_metadata["car_origin"]  # every namespace: the worker's hold it
               for snap in graph.checkpointer.list(None)
               if snap.config["configurable"]["thread_id"] == thread_id
               for m in snap.checkpoint["channel_values"].get("messages") or ()
               if "car_origin" in getattr(m, "response_metadata", {})]
    assert origins and all(type(o) is str for o in origins)  # not car_core's Origin
    graph.checkpointer.delete_thread(thread_id)
