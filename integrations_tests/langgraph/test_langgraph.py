"""The LangGraph adapter against real LangGraph graphs, InMemorySaver and SqliteSaver, and seeded
fake chat models with planted behaviour.

The support agent (``car_adapters.demo.support_agent``) looks up an order (step 0), decides
(step 1), refunds if it decided to (step 2) and replies. Its only random choice is the
decision: "refund" with probability p_follow = 0.3 when the customer message carries the
injection, p_base = 0 without it. Failure = a refund was issued. So, for a failing run,
analytically:

    P(fail | do_resample(1)) = 0.3      P(fail | do_context(1, remove_injection)) = 0
    P(fail | do_action(1, deny)) = 0    P(fail | do_observation(1, "deny recorded")) = 0
    P(fail | do_policy(1, p_follow=0.9 model)) = 0.9      P(fail | do_resample(2)) = 1
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from car_adapters.common.messages import assistant, tool_call
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent, attribute_thread
from langchain_core.messages import AIMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import car_core as car
from car_core.errors import InvalidIntervention, SideEffectBlocked, UnclassifiedTools
from car_core.model.interventions import compile_plan
from car_core.model.seeding import branch_noise
from car_core.testing import (
    check_branch_lineage,
    check_prefix_makes_no_calls,
    check_replay_reproduces,
    check_same_noise_same_branch,
)

ROLLOUTS = 64
# An arm's mean over n = 64 rollouts has standard error sqrt(p(1-p)/n): 0.057 at p = 0.3 and
# 0.0375 at p = 0.9. The tolerance is 4 standard errors of the arm (0.23 and 0.15); with fixed
# seeds the test is deterministic, and a wrong mechanism (resample not re-deciding gives 1.0, an
# edit not applied gives 0.3) lands outside it. Arms whose analytic value is 0 or 1 are exact.
TOL_03 = 4 * math.sqrt(0.3 * 0.7 / ROLLOUTS)
TOL_09 = 4 * math.sqrt(0.9 * 0.1 / ROLLOUTS)


@pytest.fixture(params=["memory", "sqlite"])
def saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield InMemorySaver()
        return
    conn = sqlite3.connect(tmp_path / "checkpoints.db", check_same_thread=False)
    yield SqliteSaver(conn)
    conn.close()


class Support:
    """The support app built over a wrapped planted model, and its failing run."""

    def __init__(self, saver: Any, *,
                 side_effect_tools: tuple[str, ...] = sa.SIDE_EFFECT_TOOLS) -> None:
        self.model = sa.PlantedSupportModel(rng_seed=0)
        self.wrapper = CarChatModel(inner=self.model)
        self.app = sa.build_app(self.wrapper, saver)
        self.saver = saver
        self.agent = LangGraphAgent(self.app, model=self.wrapper, safe_tools=sa.SAFE_TOOLS,
                                    side_effect_tools=side_effect_tools)

    def failing_run(self, store: Any = None) -> car.Trajectory:
        cb = CarCallback(store=store)
        for i in range(50):  # p = 0.3 per ticket; the rng is seeded, so this is deterministic
            self.app.invoke(sa.inputs(), {"configurable": {"thread_id": f"user-{i}"},
                                          "callbacks": [cb]})
            if sa.outcome(cb.run):
                return cb.run
        raise AssertionError("no failing run in 50 tickets")


def user_history(app: Any, thread_id: str) -> list[tuple[str, Any]]:
    return [(s.config["configurable"]["checkpoint_id"], s.values)
            for s in app.get_state_history({"configurable": {"thread_id": thread_id}})]


def deny_action(call_id: str = "call_1") -> dict[str, Any]:
    return assistant("", [tool_call(call_id, "record_decision", {"decision": "deny",
                                                                 "reason": "policy"})])


# -- recording --------------------------------------------------------------------------------

def test_callback_records_each_decision_with_its_checkpoint(saver: Any, store: Any) -> None:
    s = Support(saver)
    run = s.failing_run(store)
    tools = [[c["function"]["name"] for c in st.action["tool_calls"]] for st in run.steps]
    assert tools == [["lookup_order"], ["record_decision"], ["issue_refund"], []]
    assert run.steps[1].observation == [{"role": "tool", "tool_call_id": "call_1",
                                         "name": "record_decision",
                                         "content": '{"recorded": "refund"}'}]
    assert run.steps[3].observed is False and run.steps[3].observation is None
    assert run.steps[0].state == [{"role": "user", "content": sa.CUSTOMER_MESSAGE}]
    assert run.steps[0].meta["prompt"] == [{"role": "system", "content": sa.SYSTEM_PROMPT}]
    thread = run.meta["thread_id"]
    for st in run.steps:
        m = st.meta
        assert (m["thread_id"], m["node"], m["checkpoint_ns"]) == (thread, "agent", "")
        assert m["model"] == "planted-support" and m["usage"]["completion_tokens"] == 8
        assert m["latency_s"] >= 0
        snap = s.app.get_state({"configurable": {"thread_id": thread,
                                                 "checkpoint_id": m["checkpoint_id"]}})
        assert snap.next == ("agent",)  # the checkpoint the model task was scheduled from
        assert len(snap.values["messages"]) == len(st.state)
    assert store.load(run.id).to_dict() == run.to_dict()
    assert run.meta["final_state"]["messages"][-1]["content"].startswith("Your order")


def test_import_thread_gives_the_callback_trajectory(saver: Any) -> None:
    s = Support(saver)
    run = s.failing_run()
    imported = s.agent.import_thread(run.meta["thread_id"])
    assert imported.context == run.context
    assert len(imported.steps) == len(run.steps)
    keys = ("thread_id", "checkpoint_id", "checkpoint_ns", "node", "model", "usage")
    for a, b in zip(run.steps, imported.steps, strict=True):
        assert (a.action, a.observation, a.observed, a.state) == (
            b.action, b.observation, b.observed, b.state)
        assert {k: a.meta[k] for k in keys} == {k: b.meta[k] for k in keys}
    assert imported.meta["final_state"] == run.meta["final_state"]


# -- branching --------------------------------------------------------------------------------

def test_held_prefix_makes_no_model_or_tool_call(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Support(InMemorySaver())
    run = s.failing_run()
    tool_calls: list[str] = []
    for t in sa.TOOLS:
        monkeypatch.setattr(t, "func", (lambda f, name: lambda **kw: (tool_calls.append(name),
                                                                       f(**kw))[1])(t.func,
                                                                                    t.name))
    for k in range(len(run.steps)):
        s.model.reset_calls()
        tool_calls.clear()
        branch = s.agent.branch(run, compile_plan(run, car.do_resample(k)),
                                branch_noise(0, 0, "t", True))
        assert s.model.call_steps == list(range(k, len(branch.steps)))
        live_tools = [c["function"]["name"] for st in branch.steps[k:]
                      for c in st.action["tool_calls"]]
        # the safe tools of the live steps ran; the refund is answered, never run
        assert tool_calls == [t for t in live_tools if t not in sa.SIDE_EFFECT_TOOLS]
        assert [st.meta["origin"] for st in branch.steps[:k + 1]] == ["held"] * k + ["live"]
        assert [st.action for st in branch.steps[:k]] == [st.action for st in run.steps[:k]]


def test_conformance_checks_hold_for_the_agent() -> None:
    s = Support(InMemorySaver())
    # a branch may refund where the record did not: simulated, never run
    s.agent = LangGraphAgent(s.app, model=s.wrapper, safe_tools=sa.SAFE_TOOLS,
                             simulators={"issue_refund": lambda a: '{"simulated": true}'})
    run = car.record(s.agent, context=sa.inputs(), outcome=sa.outcome, seed=3)
    assert run.steps and run.agent.startswith("langgraph:")

    class Counter:  # the checks read .steps (the step of each model call) and .reset()
        steps = property(lambda self: s.model.call_steps)
        reset = staticmethod(s.model.reset_calls)

    check_replay_reproduces(s.agent, run)
    check_prefix_makes_no_calls(s.agent, run, Counter(), calls_per_step=1)
    check_branch_lineage(s.agent, run, sa.outcome)
    check_same_noise_same_branch(s.agent, run)


@pytest.mark.slow
def test_each_intervention_moves_the_outcome_by_its_analytic_amount() -> None:
    s = Support(InMemorySaver())
    run = s.failing_run()

    def p(interventions: Any) -> float:
        return car.intervene(run, s.agent, interventions, outcome=sa.outcome,
                             rollouts=ROLLOUTS, seed=0, progress=False).mean

    assert abs(p(car.do_resample(1)) - 0.3) <= TOL_03
    assert p(car.do_context(1, sa.remove_injection)) == 0.0
    assert p(car.do_action(1, deny_action())) == 0.0
    assert p(car.do_observation(1, ['{"recorded": "deny"}'])) == 0.0
    assert abs(p(car.do_policy(1, sa.PlantedSupportModel(p_follow=0.9))) - 0.9) <= TOL_09
    assert p(car.do_resample(2)) == 1.0


def test_do_context_edits_the_state_the_model_sees() -> None:
    s = Support(InMemorySaver())
    run = s.failing_run()
    dist = car.intervene(run, s.agent, car.do_context(1, sa.remove_injection),
                         outcome=sa.outcome, rollouts=2, seed=0, progress=False)
    step = dist.trajectories[0].steps[1]
    assert step.meta["origin"] == "edited"
    assert sa.INJECTION not in step.state[0]["content"]
    assert step.state[1:] == run.steps[1].state[1:]  # tool call and result kept paired


def test_do_observation_keeps_the_action_and_replaces_the_results() -> None:
    s = Support(InMemorySaver())
    run = s.failing_run()
    branch = s.agent.branch(run, compile_plan(run, car.do_observation(1, ['{"recorded": "deny"}'])),
                            branch_noise(0, 0, "t", True))
    assert branch.steps[1].action == run.steps[1].action
    assert branch.steps[1].observation == [{"role": "tool", "tool_call_id": "call_1",
                                            "name": "record_decision",
                                            "content": '{"recorded": "deny"}'}]
    assert branch.steps[2].action["content"].startswith("Sorry")


def test_do_observation_answers_only_its_step_in_an_app_without_the_wrapper() -> None:
    """Without CarChatModel nothing counts model calls; the forced result must still answer
    step 0's call only, and the later tool calls run live."""
    model = sa.PlantedSupportModel(rng_seed=0, p_follow=1.0)
    app = sa.build_app(model, InMemorySaver())
    cb = CarCallback()
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "u"}, "callbacks": [cb]})
    run = cb.run
    forced = json.dumps({"order_id": sa.ORDER_ID, "refund_eligible": False})
    agent = LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS, side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    branch = agent.branch(run, compile_plan(run, car.do_observation(0, [forced])),
                          branch_noise(0, 0, "t", True))
    assert branch.steps[0].observation[0]["content"] == forced
    assert [st.observation for st in branch.steps[1:]] == [st.observation for st in run.steps[1:]]


def test_held_later_step_is_served_without_a_model_call() -> None:
    """A Shapley coalition: step 0 resampled, step 1 held at its factual action."""
    s = Support(InMemorySaver())
    run = s.failing_run()
    s.model.reset_calls()
    plan = compile_plan(run, [car.do_resample(0), car.do_action(1, run.steps[1].action)])
    branch = s.agent.branch(run, plan, branch_noise(0, 0, "t", True))
    assert branch.steps[1].action == run.steps[1].action
    assert branch.steps[1].meta["origin"] == "held"
    assert 1 not in s.model.call_steps and s.model.call_steps == [0, 2, 3]
    assert sa.outcome(branch)


def test_contrastive_names_the_decision_not_the_refund_step(store: Any) -> None:
    s = Support(InMemorySaver())
    run = s.failing_run(store)
    res = car.contrastive(run, s.agent, outcome=sa.outcome, rollouts=32, seed=0, store=store,
                          progress=False)
    assert res.locus == 1
    assert store.attribution(res.attribution_id).run_id == run.id


def test_attribute_thread_imports_scores_and_stores(store: Any) -> None:
    s = Support(InMemorySaver())
    run = s.failing_run()
    before = user_history(s.app, run.meta["thread_id"])
    res = attribute_thread(s.app, run.meta["thread_id"], outcome=sa.outcome,
                           model=s.wrapper, store=store, rollouts=32, progress=False,
                           safe_tools=sa.SAFE_TOOLS, side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    assert res.locus == 1
    stored = store.attribution(res.attribution_id)
    assert store.load(stored.run_id).outcome.value == 1.0
    assert user_history(s.app, run.meta["thread_id"]) == before


def test_attribute_thread_closes_a_store_it_opened_from_a_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Support(InMemorySaver())
    run = s.failing_run()
    closed: list[Path] = []
    close = car.RunStore.close
    monkeypatch.setattr(car.RunStore, "close", lambda self: (closed.append(self.path),
                                                             close(self))[1])
    res = attribute_thread(s.app, run.meta["thread_id"], outcome=sa.outcome,
                           model=s.wrapper, store=tmp_path / "car.db", rollouts=4,
                           progress=False, safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    assert [Path(p) for p in closed] == [tmp_path / "car.db"]
    with car.RunStore(tmp_path / "car.db") as store:
        assert store.attribution(res.attribution_id).run_id == res.run_id


def test_branches_never_touch_the_users_thread(saver: Any) -> None:
    s = Support(saver)
    run = s.failing_run()
    thread = run.meta["thread_id"]
    before = user_history(s.app, thread)
    threads_before = {c.config["configurable"]["thread_id"] for c in saver.list(None)}
    dist = car.intervene(run, s.agent, car.do_context(1, sa.remove_injection),
                         outcome=sa.outcome, rollouts=4, seed=0, progress=False)
    assert user_history(s.app, thread) == before
    assert {c.config["configurable"]["thread_id"] for c in saver.list(None)} == threads_before
    kept = LangGraphAgent(s.app, model=s.wrapper, keep_branches=True, safe_tools=sa.SAFE_TOOLS,
                          side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    dist = car.intervene(run, kept, car.do_resample(1), outcome=sa.outcome, rollouts=3, seed=0,
                         progress=False)
    branch_threads = {t.meta["thread_id"] for t in dist.trajectories}
    assert len(branch_threads) == 3 and thread not in branch_threads
    assert user_history(s.app, thread) == before


# -- tools on branches ------------------------------------------------------------------------

def test_a_refused_call_of_a_forced_action_names_the_forced_step() -> None:
    """A ``do_action`` whose parallel calls include a side effect the record cannot answer
    stops the branch naming the forced step. Where CAR writes the forced action itself (no
    ``model=``), the refusal named the step after it, whose model only replied (a trial)."""
    s = Support(InMemorySaver())
    run = s.failing_run()
    both = assistant("", [tool_call("call_a", "lookup_order", {"order_id": sa.ORDER_ID}),
                          tool_call("call_b", "issue_refund", {"order_id": sa.ORDER_ID,
                                                               "amount": 999.0})])
    plan = compile_plan(run, car.do_action(0, both))
    unwrapped = LangGraphAgent(s.app, safe_tools=sa.SAFE_TOOLS,
                               side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    for agent in (s.agent, unwrapped):
        with pytest.raises(SideEffectBlocked, match="issue_refund") as stopped:
            agent.branch(run, plan, branch_noise(0, 0, "t", True))
        assert stopped.value.step == 0


def test_a_forced_action_calling_no_tool_of_the_app_is_refused_before_any_branch() -> None:
    """A trial's ``do_action`` spelled ``get-order`` for ``get_order``: every branch got the
    framework's "not a valid tool" message, went on, and the intervention read as a rescue
    of 100%. It is refused, naming the call and the app's tools, before a model is called."""
    s = Support(InMemorySaver())
    run = s.failing_run()
    s.model.reset_calls()
    typo = assistant("", [tool_call("call_a", "lookup-order", {"order_id": sa.ORDER_ID})])
    with pytest.raises(InvalidIntervention, match=r"do_action at step 0 calls \['lookup-order'\]"
                       r", but the app has no such tool \(its tools: \[.*'lookup_order'"):
        car.intervene(run, s.agent, car.do_action(0, typo), outcome=sa.outcome, rollouts=4,
                      seed=0, progress=False)
    assert s.model.calls == 0
    # the tools the app has (and a recorded call) still go through
    good = assistant("", [tool_call("call_a", "lookup_order", {"order_id": sa.ORDER_ID})])
    car.intervene(run, s.agent, car.do_action(0, good), outcome=sa.outcome, rollouts=1, seed=0,
                  progress=False)


class BigRefund(sa.PlantedSupportModel):
    """Refunds a different amount than any record: no recorded answer for the call."""

    def decide(self, messages: Any) -> AIMessage:
        msg = super().decide(messages)
        for c in msg.tool_calls:
            if c["name"] == "issue_refund":
                c["args"]["amount"] = 999.0
        return msg


def test_side_effect_tools_never_run_on_branches(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Support(InMemorySaver(), side_effect_tools=("issue_refund",))
    run = s.failing_run()
    refunds: list[dict[str, Any]] = []
    original = sa.issue_refund.func
    monkeypatch.setattr(sa.issue_refund, "func",
                        lambda **kw: (refunds.append(kw), original(**kw))[1])
    dist = car.intervene(run, s.agent, car.do_resample(2), outcome=sa.outcome, rollouts=4,
                         seed=0, progress=False)
    assert dist.mean == 1.0 and refunds == []  # served from the record: same call, same answer
    assert all(t.steps[2].observation == run.steps[2].observation for t in dist.trajectories)

    plan = compile_plan(run, car.do_policy(2, BigRefund()))
    with pytest.raises(SideEffectBlocked, match="issue_refund"):
        s.agent.branch(run, plan, branch_noise(0, 0, "t", True))
    simulated = LangGraphAgent(s.app, model=s.wrapper, safe_tools=sa.SAFE_TOOLS,
                               side_effect_tools=["issue_refund"],
                               simulators={"issue_refund": lambda a: f"simulated {a['amount']}"})
    branch = simulated.branch(run, plan, branch_noise(0, 0, "t", True))
    assert branch.steps[2].observation[0]["content"] == "simulated 999.0"
    as_json = LangGraphAgent(s.app, model=s.wrapper, safe_tools=sa.SAFE_TOOLS,
                             simulators={"issue_refund": lambda a: {"simulated": a["amount"]}})
    branch = as_json.branch(run, plan, branch_noise(0, 0, "t", True))
    assert json.loads(branch.steps[2].observation[0]["content"]) == {"simulated": 999.0}
    assert refunds == []
    # unclassified, the refund is refused before any branch; opted out (a sandbox), it runs
    with pytest.raises(UnclassifiedTools, match="issue_refund") as err:
        LangGraphAgent(s.app, model=s.wrapper, safe_tools=sa.SAFE_TOOLS)
    assert err.value.tools == ("issue_refund",) and refunds == []
    sandbox = LangGraphAgent(s.app, model=s.wrapper, unclassified="live")
    assert "issue_refund" in sandbox.caveats[0] and "lookup_order" in sandbox.caveats[0]
    live = sandbox.branch(run, compile_plan(run, car.do_resample(2)),
                          branch_noise(0, 0, "t", True))
    assert len(refunds) == 1 and live.steps[2].observed  # unclassified tools run live


# -- graph shapes -----------------------------------------------------------------------------

@tool
def weather(city: str) -> str:
    """Weather in a city."""
    return f"sunny in {city}"


@tool
def clock(city: str) -> str:
    """Local time in a city."""
    return f"noon in {city}"


class TwoToolsModel(sa.PlantedSupportModel):
    """Step 0 calls two tools in one message; step 1 answers from their results."""

    def decide(self, messages: Any) -> AIMessage:
        results = [m for m in messages if isinstance(m, ToolMessage)]
        if not results:
            return AIMessage("", tool_calls=[
                {"id": "w", "name": "weather", "args": {"city": "Oslo"}},
                {"id": "c", "name": "clock", "args": {"city": "Oslo"}}])
        return AIMessage(" / ".join(str(m.content) for m in results))


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_parallel_tool_calls_with_a_prebuilt_react_agent() -> None:
    from langgraph.prebuilt import create_react_agent
    model = TwoToolsModel()
    wrapper = CarChatModel(inner=model)
    app = create_react_agent(wrapper, [weather, clock], checkpointer=InMemorySaver())
    cb = CarCallback()
    app.invoke({"messages": [{"role": "user", "content": "Oslo?"}]},
               {"configurable": {"thread_id": "p"}, "callbacks": [cb]})
    run = cb.run
    assert [m["tool_call_id"] for m in run.steps[0].observation] == ["w", "c"]
    assert [m["content"] for m in run.steps[0].observation] == ["sunny in Oslo", "noon in Oslo"]
    agent = LangGraphAgent(app, model=wrapper, safe_tools=["weather", "clock"])
    assert [st.to_dict() | {"meta": None, "digest": None} for st in
            agent.import_thread("p").steps] == [
        st.to_dict() | {"meta": None, "digest": None} for st in run.steps]
    branch = agent.branch(run, compile_plan(run, car.do_observation(0, ["rain", "dusk"])),
                          branch_noise(0, 0, "t", True))
    assert branch.steps[1].action["content"] == "rain / dusk"


class SameIdModel(sa.PlantedSupportModel):
    """Reuses one tool-call id at every step, as some models and servers do."""

    def decide(self, messages: Any) -> AIMessage:
        done = sum(isinstance(m, ToolMessage) for m in messages)
        if done < 2:
            tool = (weather, clock)[done]
            return AIMessage("", tool_calls=[{"id": "x", "name": tool.name,
                                              "args": {"city": "Oslo"}}])
        return AIMessage("done")


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_reused_tool_call_ids_keep_each_steps_own_result() -> None:
    from langgraph.prebuilt import create_react_agent
    wrapper = CarChatModel(inner=SameIdModel())
    app = create_react_agent(wrapper, [weather, clock], checkpointer=InMemorySaver())
    cb = CarCallback()
    app.invoke({"messages": [{"role": "user", "content": "Oslo?"}]},
               {"configurable": {"thread_id": "x"}, "callbacks": [cb]})
    agent = LangGraphAgent(app, model=wrapper, safe_tools=["weather", "clock"])
    expected = ["sunny in Oslo", "noon in Oslo", None]
    for run in (cb.run, agent.import_thread("x")):
        assert [s.observation and s.observation[0]["content"] for s in run.steps] == expected
    branch = agent.branch(run, compile_plan(run, car.do_resample(0)),
                          branch_noise(0, 0, "t", True))
    assert [s.observation and s.observation[0]["content"] for s in branch.steps] == expected


def _forgiving_app(model: Any, saver: Any, how: str) -> Any:
    """The support graph whose tool node hands tool errors to the model as messages, as
    LangGraph's customer-support tutorial does: ``handle_tool_errors=True``, or the
    tutorial's ``with_fallbacks`` around the ToolNode."""
    from langchain_core.runnables import RunnableLambda
    bound = model.bind_tools(sa.TOOLS)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke([SystemMessage(sa.SYSTEM_PROMPT),
                                           *state["messages"]])]}

    def handle_tool_error(state: dict[str, Any]) -> dict[str, Any]:
        calls = state["messages"][-1].tool_calls
        return {"messages": [ToolMessage(content=f"Error: {state.get('error')!r}, fix it",
                                         tool_call_id=c["id"]) for c in calls]}

    tools: Any = ToolNode(sa.TOOLS, handle_tool_errors=True)
    if how == "fallbacks":
        tools = ToolNode(sa.TOOLS).with_fallbacks([RunnableLambda(handle_tool_error)],
                                                  exception_key="error")
    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


@pytest.mark.parametrize("how", ["handle_tool_errors", "fallbacks"])
def test_a_blocked_side_effect_the_app_hands_to_the_model_still_stops_the_branch(
        how: str) -> None:
    """An app whose tool node turns tool errors into messages for the model (the tutorial's
    shape) caught CAR's refusal of an unanswerable side-effect call, and the model went on:
    the branch was scored, and a user trial read "no step caused it" (P(fail) 100%) where the
    rescue is 0.8. The refusal now stops the branch whatever the app did with it."""
    model = sa.PlantedSupportModel(rng_seed=0)
    wrapper = CarChatModel(inner=model)
    app = _forgiving_app(wrapper, InMemorySaver(), how)
    cb = CarCallback(app=app)
    for i in range(50):
        app.invoke(sa.inputs(), {"configurable": {"thread_id": f"u{i}"}, "callbacks": [cb]})
        if sa.outcome(cb.run):
            break
    run = cb.run
    assert sa.outcome(run)
    agent = LangGraphAgent(app, model=wrapper, safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=sa.SIDE_EFFECT_TOOLS)

    refund_step = next(i for i, st in enumerate(run.steps)
                       if any(c["function"]["name"] == "issue_refund"
                              for c in st.action.get("tool_calls") or ()))
    with pytest.raises(SideEffectBlocked, match="issue_refund"):
        car.intervene(run, agent, car.do_policy(refund_step, BigRefund()), outcome=sa.outcome,
                      rollouts=2, seed=0, progress=False)


def _async_app(model: Any, saver: Any) -> Any:
    bound = model.bind_tools(sa.TOOLS)

    async def agent(state: MessagesState) -> dict[str, Any]:
        reply = await bound.ainvoke([SystemMessage(sa.SYSTEM_PROMPT), *state["messages"]])
        return {"messages": [reply]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(sa.TOOLS))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


def test_async_graph_and_concurrent_runs_do_not_cross_talk() -> None:
    model = sa.PlantedSupportModel(p_follow=1.0)
    app = _async_app(CarChatModel(inner=model), InMemorySaver())
    cb = CarCallback()

    async def many() -> None:
        await asyncio.gather(*[
            app.ainvoke(sa.inputs(f"order {sa.ORDER_ID}, ticket {i}. {sa.INJECTION}"),
                        {"configurable": {"thread_id": f"a{i}"}, "callbacks": [cb]})
            for i in range(4)])

    asyncio.run(many())
    assert len(cb.runs) == 4
    agent = LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS, side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    for run in cb.runs:
        thread = run.meta["thread_id"]
        ticket = run.steps[0].state[0]["content"]
        assert f"ticket {thread[1:]}." in ticket
        assert all(st.meta["thread_id"] == thread and st.state[0]["content"] == ticket
                   for st in run.steps)
        assert len(run.steps) == 4 and sa.outcome(run)
        imported = agent.import_thread(thread).steps
        assert [(st.state, st.meta["checkpoint_id"]) for st in imported] == [
            (st.state, st.meta["checkpoint_id"]) for st in run.steps]


def test_sync_runs_in_parallel_threads_are_kept_apart() -> None:
    s = Support(InMemorySaver())
    cb = CarCallback()

    def one(i: int) -> None:
        s.app.invoke(sa.inputs(f"ticket {i}"), {"configurable": {"thread_id": f"s{i}"},
                                                 "callbacks": [cb]})

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(one, range(8)))
    assert sorted(r.meta["thread_id"] for r in cb.runs) == sorted(f"s{i}" for i in range(8))
    for run in cb.runs:
        i = run.meta["thread_id"][1:]
        assert all(st.state[0]["content"] == f"ticket {i}" for st in run.steps)
        assert all(st.meta["thread_id"] == f"s{i}" for st in run.steps)


def test_branches_in_flight_at_once_are_kept_apart() -> None:
    """Coupled noise makes each rollout a function of its index, so branches run eight at a
    time must give exactly the sequential values, each in its own thread."""
    from car_core.engine.execution import AsyncioExecutor, Sequential
    s = Support(InMemorySaver(), side_effect_tools=("issue_refund",))
    run = s.failing_run()

    def dist(executor: Any) -> Any:
        return car.intervene(run, s.agent, car.do_resample(1), outcome=sa.outcome, rollouts=32,
                             seed=0, progress=False, executor=executor)

    alone, together = dist(Sequential()), dist(AsyncioExecutor(concurrency=8))
    assert together.values == alone.values and 0 < together.mean < 1
    assert len({t.meta["thread_id"] for t in together.trajectories}) == 32
    assert all(sa.outcome(t) == (len(t.steps) == 4) for t in together.trajectories)


def test_action_arguments_keep_their_json_shape() -> None:
    s = Support(InMemorySaver())
    run = s.failing_run()
    args = json.loads(run.steps[2].action["tool_calls"][0]["function"]["arguments"])
    assert args == {"order_id": sa.ORDER_ID, "amount": 129.0}


def test_the_example_names_the_decision_and_do_context_rescues(tmp_path: Path) -> None:
    import importlib.util
    path = Path(__file__).parents[2] / "examples" / "langgraph_support_agent.py"
    spec = importlib.util.spec_from_file_location("langgraph_support_agent", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = example.main(["--rollouts", "16", "--store", str(tmp_path / "car.db")])
    assert out["locus"] == 1 and out["rescued"] == 0.0
    store = car.RunStore(tmp_path / "car.db")
    assert store.attribution(out["attribution_id"]).run_id == out["run_id"]
    store.close()


def test_an_async_graph_is_branched_with_ainvoke() -> None:
    """p_follow = 1: the injection always wins, so resampling the decision keeps the failure
    (exactly 1) and removing the injection always rescues it (exactly 0)."""
    model = sa.PlantedSupportModel(p_follow=1.0)
    wrapper = CarChatModel(inner=model)
    app = _async_app(wrapper, InMemorySaver())
    cb = CarCallback()
    asyncio.run(app.ainvoke(sa.inputs(), {"configurable": {"thread_id": "a"}, "callbacks": [cb]}))
    run = cb.run
    agent = LangGraphAgent(app, model=wrapper, safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=["issue_refund"])
    assert agent.is_async
    assert car.intervene(run, agent, car.do_resample(1), outcome=sa.outcome, rollouts=4,
                         progress=False).mean == 1.0
    assert car.intervene(run, agent, car.do_context(1, sa.remove_injection),
                         outcome=sa.outcome, rollouts=4, progress=False).mean == 0.0

    async def inside_a_loop() -> car.Trajectory:
        return agent.branch(run, compile_plan(run, car.do_action(1, deny_action())),
                            branch_noise(0, 0, "t", True))

    branch = asyncio.run(inside_a_loop())
    assert not sa.outcome(branch) and branch.steps[1].meta["origin"] == "forced"


def test_coalitions_share_noise_so_a_step_without_effect_changes_no_rollout() -> None:
    """Step 0 (the order lookup) is deterministic. With common random numbers through
    CarChatModel's per-step seeds, holding it or resampling it gives the same outcome in every
    rollout, for any coalition of the other steps; holding the decision (step 1) or the refund
    (step 2) makes every rollout fail."""
    s = Support(InMemorySaver())
    run = s.failing_run()

    def values(held: set[int]) -> tuple[float, ...]:
        plan = [car.do_action(k, run.steps[k].action) if k in held else car.do_resample(k)
                for k in range(len(run.steps))]
        return car.intervene(run, s.agent, plan, outcome=sa.outcome, rollouts=16, seed=0,
                             progress=False).values

    for others in (set(), {3}):
        assert values(others | {0}) == values(others)
    assert values(set()) != values({1}) == values({2}) == (1.0,) * 16
