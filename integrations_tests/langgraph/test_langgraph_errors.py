"""Bad input to the LangGraph adapter: each a clear car_core error, and the user's threads and
the CAR store left as they were."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent, attribute_thread
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, interrupt

import car_core as car
from car_core.contract import BEGAN_FROM
from car_core.errors import (
    AdapterError,
    InvalidInput,
    InvalidIntervention,
    StoreError,
)
from car_core.model.interventions import compile_plan
from car_core.model.seeding import branch_noise
from car_core.testing import synthetic

NOISE = branch_noise(0, 0, "errors", True)
# the support app's tools, classified: lookups run on branches, the refund never does
SA: dict[str, Any] = {"safe_tools": sa.SAFE_TOOLS, "side_effect_tools": sa.SIDE_EFFECT_TOOLS}


def history(app: Any, thread_id: str) -> list[tuple[str, Any]]:
    return [(s.config["configurable"]["checkpoint_id"], s.values)
            for s in app.get_state_history({"configurable": {"thread_id": thread_id}})]


def threads(saver: Any) -> set[str]:
    return {c.config["configurable"]["thread_id"] for c in saver.list(None)}


def recorded(saver: Any, *, wrapped: bool = True, p_follow: float = 1.0
             ) -> tuple[Any, car.Trajectory]:
    model = sa.PlantedSupportModel(p_follow=p_follow)
    app = sa.build_app(CarChatModel(inner=model) if wrapped else model, saver)
    cb = CarCallback()
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "user"}, "callbacks": [cb]})
    return app, cb.run


def test_an_app_without_a_checkpointer_has_no_thread_to_import(store: Any) -> None:
    """Branches of an app compiled without a checkpointer run on a copy with one CAR supplies
    (``test_langgraph_record_anywhere``), but it keeps no thread to import."""
    app = sa.build_app(sa.PlantedSupportModel())
    with pytest.raises(AdapterError, match="compiled without a checkpointer"):
        LangGraphAgent(app, **SA).import_thread("user")
    with pytest.raises(AdapterError, match="compiled without a checkpointer"):
        attribute_thread(app, "user", outcome=sa.outcome, store=store, **SA)
    assert app.checkpointer is None and store.runs(branches=True) == []


def test_an_unknown_thread_is_refused_and_the_store_stays_empty(store: Any) -> None:
    app, _ = recorded(InMemorySaver())
    with pytest.raises(AdapterError, match="no thread 'nope'"):
        LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS,
                       side_effect_tools=sa.SIDE_EFFECT_TOOLS).import_thread("nope")
    with pytest.raises(AdapterError, match="no thread 'nope'"):
        attribute_thread(app, "nope", outcome=sa.outcome, store=store, **SA)
    assert store.runs(branches=True) == []


def test_a_run_from_a_different_graph_is_refused() -> None:
    saver = InMemorySaver()
    app, run = recorded(saver)
    before = history(app, "user")
    other = StateGraph(MessagesState)
    other.add_node("model", lambda state: {"messages": [AIMessage("hi")]})
    other.add_edge(START, "model")
    other_app = other.compile(checkpointer=saver)
    with pytest.raises(AdapterError, match="different graph"):
        LangGraphAgent(other_app).branch(run, compile_plan(run, car.do_resample(1)), NOISE)
    # on a checkpointer without the run's thread, the record is read against the graph too
    elsewhere = StateGraph(MessagesState)
    elsewhere.add_node("model", lambda state: {"messages": [AIMessage("hi")]})
    elsewhere.add_edge(START, "model")
    with pytest.raises(AdapterError, match="node 'agent', which this graph does not have"):
        LangGraphAgent(elsewhere.compile(checkpointer=InMemorySaver())).branch(
            run, compile_plan(run, car.do_resample(1)), NOISE)
    assert history(app, "user") == before and threads(saver) == {"user"}


def test_a_run_not_recorded_from_langgraph_is_refused() -> None:
    app, _ = recorded(InMemorySaver())
    scm_run = synthetic.pivot().failing_run(seed=0)
    with pytest.raises(AdapterError, match="not recorded from a LangGraph app"):
        LangGraphAgent(app, **SA).branch(scm_run, compile_plan(scm_run, car.do_resample(0)),
                                         NOISE)


def test_a_deleted_checkpoint_is_refused(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "cp.db", check_same_thread=False)
    saver = SqliteSaver(conn)
    app, run = recorded(saver)
    with conn:
        conn.execute("DELETE FROM checkpoints WHERE thread_id = 'user' AND checkpoint_id = ?",
                     (run.steps[1].meta["checkpoint_id"],))
    before = history(app, "user")
    with pytest.raises(AdapterError, match="was deleted"):
        car.intervene(run, LangGraphAgent(app, **SA), car.do_resample(1), outcome=sa.outcome,
                      rollouts=2, progress=False)
    assert history(app, "user") == before and threads(saver) == {"user"}
    conn.close()


def review_app(model: CarChatModel) -> tuple[Any, InMemorySaver]:
    """The support desk with a ``review`` node that stops for a person (``interrupt()``) after
    every refund."""
    bound = model.bind_tools(sa.TOOLS)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    def review(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, ToolMessage) and last.name == "issue_refund":
            interrupt("approve the refund?")
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(sa.TOOLS))
    graph.add_node("review", review)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "review")
    graph.add_edge("review", "agent")
    saver = InMemorySaver()
    return graph.compile(checkpointer=saver), saver


def test_an_interrupt_on_a_branch_is_refused() -> None:
    model = CarChatModel(inner=sa.PlantedSupportModel(p_follow=1.0))
    app, saver = review_app(model)
    config = {"configurable": {"thread_id": "user"}}
    app.invoke(sa.inputs(), config)
    app.invoke(Command(resume="approved"), config)  # a human approved it in the record
    lg = LangGraphAgent(app, model=model, safe_tools=sa.SAFE_TOOLS,
                        side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    run = lg.import_thread("user")
    assert len(run.steps) == 4 and run.status == "complete"
    before = history(app, "user")
    with pytest.raises(AdapterError, match="interrupt"):
        lg.branch(run, compile_plan(run, car.do_resample(1)), NOISE)
    assert history(app, "user") == before and threads(saver) == {"user"}


def test_a_run_paused_by_interrupt_is_recorded_interrupted_and_its_resume_complete() -> None:
    """A user trial's run paused by ``interrupt()`` was stored complete and scored as passing:
    the graph's end leaves ``__interrupt__`` out of what its callbacks see."""
    app, _ = review_app(CarChatModel(inner=sa.PlantedSupportModel(p_follow=1.0)))
    config = {"configurable": {"thread_id": "paused"}}
    paused, resumed = CarCallback(), CarCallback()
    assert "__interrupt__" in app.invoke(sa.inputs(), {**config, "callbacks": [paused]})
    app.invoke(Command(resume="approved"), {**config, "callbacks": [resumed]})
    assert paused.run is not None and resumed.run is not None
    assert paused.run.status == "interrupted" and resumed.run.status == "complete"
    # the resume began after the refund: what holds the cause is the thread, and a result
    # that finds none in this run says how to attribute it (a trial read only "undecided,
    # raise the budget")
    assert BEGAN_FROM not in paused.run.meta
    began = resumed.run.meta[BEGAN_FROM]
    assert began.startswith("it resumed thread 'paused' after a pause for human input "
                            "(Command(resume=...))") and "attribute_thread(app, " in began


def test_a_resumed_run_whose_cause_came_before_the_pause_points_at_the_thread() -> None:
    model = CarChatModel(inner=sa.PlantedSupportModel(p_follow=1.0))
    app, _ = review_app(model)
    config = {"configurable": {"thread_id": "t"}}
    app.invoke(sa.inputs(), config)
    resumed = CarCallback()
    app.invoke(Command(resume="approved"), {**config, "callbacks": [resumed]})
    run = resumed.run
    assert run is not None and sa.outcome(run)  # the refund is in the history it began from
    lg = LangGraphAgent(app, model=model, safe_tools=sa.SAFE_TOOLS,
                        side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    res = car.contrastive(run, lg, outcome=sa.outcome, rollouts=16, budget=96, seed=0,
                          progress=False)
    assert res.answer == "no cause", res.reason
    assert any("it resumed thread 't' after a pause for human input" in c and
               "attribute_thread(app, thread_id='t', ...)" in c for c in res.caveats), \
        res.caveats


def test_a_step_that_is_not_a_model_decision_is_refused() -> None:
    summariser = sa.PlantedSupportModel()

    @tool
    def summarise(text: str) -> str:
        """Summarise a text with a chat model (a model call inside a tool)."""
        return str(summariser.invoke([HumanMessage(text)]).content)

    class Caller(sa.PlantedSupportModel):
        def decide(self, messages: Any) -> AIMessage:
            if any(isinstance(m, ToolMessage) for m in messages):
                return AIMessage("done")
            return AIMessage("", tool_calls=[{"id": "s", "name": "summarise",
                                              "args": {"text": "long"}}])

    model = Caller()
    bound = model.bind_tools([summarise])
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [bound.invoke(state["messages"])]})
    graph.add_node("tools", ToolNode([summarise]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    app = graph.compile(checkpointer=InMemorySaver())
    cb = CarCallback()
    app.invoke({"messages": [HumanMessage("go")]},
               {"configurable": {"thread_id": "user"}, "callbacks": [cb]})
    run = cb.run
    assert [s.meta["node"] for s in run.steps] == ["agent", "tools", "agent"]
    with pytest.raises(AdapterError, match="not a model decision"):
        LangGraphAgent(app, safe_tools=["summarise"]).branch(
            run, compile_plan(run, car.do_resample(1)), NOISE)


def test_bad_interventions_are_refused_before_anything_runs() -> None:
    saver = InMemorySaver()
    app, run = recorded(saver)
    agent = LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS, side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    before = history(app, "user")
    with pytest.raises(InvalidIntervention, match="assistant message"):
        agent.branch(run, compile_plan(run, car.do_action(1, "refund")), NOISE)
    with pytest.raises(InvalidIntervention, match=r"edit raised IndexError.*\[step 1\]"):
        agent.branch(run, compile_plan(run, car.do_context(1, lambda m: m[99])), NOISE)
    with pytest.raises(InvalidIntervention, match="not a list of messages"):
        agent.branch(run, compile_plan(run, car.do_context(1, lambda m: "no")), NOISE)
    with pytest.raises(InvalidIntervention, match="without their results"):
        agent.branch(run, compile_plan(run, car.do_context(
            2, lambda m: [x for x in m if x["role"] != "tool"])), NOISE)
    with pytest.raises(InvalidIntervention, match="2 results but the action made 1 tool calls"):
        agent.branch(run, compile_plan(run, car.do_observation(1, ["a", "b"])), NOISE)
    with pytest.raises(AdapterError, match="CarChatModel"):
        agent.branch(run, compile_plan(run, [car.do_resample(0),
                                             car.do_action(1, run.steps[1].action)]), NOISE)
    assert history(app, "user") == before and threads(saver) == {"user"}


@pytest.mark.parametrize("budget", [64, 4096], ids=["exact", "permutation"])
def test_shapley_on_an_app_car_does_not_decide_is_refused_before_any_branch(
        store: Any, budget: int) -> None:
    """Shapley's coalitions hold steps after a resampled one, which a plain app cannot do: the
    first such coalition used to be refused only after the resample-only ones ran, calling the
    model ~20 times. Every coalition's plan is now checked before the first branch."""
    saver = InMemorySaver()
    model = sa.PlantedSupportModel(p_follow=1.0)  # the recorded run follows the injection
    app = sa.build_app(model, saver)
    cb = CarCallback()
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "user"}, "callbacks": [cb]})
    run = cb.run
    assert sa.outcome(run) == 1.0
    model.p_follow = 0.5
    model.reset_calls()
    agent = LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS, side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    with pytest.raises(AdapterError, match="CarChatModel"):
        car.shapley(run, agent, outcome=sa.outcome, budget=budget, store=store,
                    progress=False)
    assert model.calls == 0 and threads(saver) == {"user"}
    assert store.attributions() == []


def test_a_run_the_store_refuses_is_kept_with_its_error(store: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """LangChain swallows a handler's exception, so a store failure must not lose the run: it
    is kept in ``runs`` with its error, and the first read of ``run`` (a flush) raises it."""
    def refuse(run: car.Trajectory) -> None:
        raise StoreError(f"refused {run.id}")

    monkeypatch.setattr(store, "save", refuse)
    cb = CarCallback(store=store)
    app = sa.build_app(sa.PlantedSupportModel(p_follow=0.0), InMemorySaver())
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "u"}, "callbacks": [cb]})
    with pytest.raises(StoreError, match="1 run\\(s\\) could not be stored: refused"):
        cb.run  # noqa: B018 - reading it flushes, which raises
    assert cb.run is not None and len(cb.run.steps) == 3  # lookup, deny, reply
    assert [str(e) for e in cb.store_errors] == [f"refused {cb.run.id}"]


def test_tools_a_node_calls_itself_are_guarded_when_named() -> None:
    """A node that runs tools itself: CAR finds them in the node's code, so a typo is refused
    (listing them, this node's included) and the right name needs no node_tools; the call is
    answered on branches and never runs. Forcing a result there (no ToolNode) is refused."""
    runs: list[str] = []
    refunds: list[dict[str, Any]] = []  # the ledger: real executions of the side effect

    @tool("issue_refund")
    def ledger_refund(order_id: str, amount: float) -> str:
        """Refund an order (moves money: a side effect)."""
        refunds.append({"order_id": order_id, "amount": amount})
        return json.dumps({"refunded": order_id, "amount": amount})

    by_name = {**{t.name: t for t in sa.TOOLS}, "issue_refund": ledger_refund}
    model = CarChatModel(inner=sa.PlantedSupportModel(p_follow=1.0))
    bound = model.bind_tools(sa.TOOLS)

    def tools(state: MessagesState) -> dict[str, Any]:
        calls = state["messages"][-1].tool_calls
        runs.extend(c["name"] for c in calls)
        return {"messages": [ToolMessage(by_name[c["name"]].invoke(c["args"]), name=c["name"],
                                         tool_call_id=c["id"]) for c in calls]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [bound.invoke(state["messages"])]})
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    saver = InMemorySaver()
    app = graph.compile(checkpointer=saver)
    cb = CarCallback()
    app.invoke(sa.inputs(), {"configurable": {"thread_id": "user"}, "callbacks": [cb]})
    run, recorded_runs = cb.run, list(runs)
    with pytest.raises(InvalidInput, match=r"\['issue_refnd'\] are not tools of this graph; "
                                           r"its tools are \['issue_refund', 'lookup_order', "
                                           r"'record_decision'\]"):
        LangGraphAgent(app, model=model, side_effect_tools=["issue_refnd"])
    with pytest.raises(AdapterError, match="do_observation needs"):
        LangGraphAgent(app, model=model, safe_tools=sa.SAFE_TOOLS,
                       side_effect_tools=sa.SIDE_EFFECT_TOOLS).branch(
            run, compile_plan(run, car.do_observation(0, ["{}"])), NOISE)
    assert runs == recorded_runs and threads(saver) == {"user"}
    agent = LangGraphAgent(app, model=model, side_effect_tools=["issue_refund"],
                           safe_tools=sa.SAFE_TOOLS)
    branch = agent.branch(run, compile_plan(run, car.do_resample(2)), NOISE)
    assert [c["function"]["name"] for c in branch.steps[2].action["tool_calls"]] == [
        "issue_refund"]  # decided again on the branch, answered from the record
    assert len(refunds) == 1  # the recorded run's refund only
