"""The system prompt as a source of a LangGraph step: offered where the graph's messages hold it
(a ``SystemMessage`` in the input), so taking it out is written into the forked checkpoint and
reaches the model; not offered where a node prepends its own prompt at the call (the record
keeps that in ``meta["prompt"]``, which no ``do_context`` edit of the messages reaches).

The planted model refunds with probability 0.9 when the system prompt carries the injected
line and never otherwise, so the system prompt's leave-one-out rescue is 0.9 and every other
source's is 0. Budget as in ``integrations_tests/project/test_context_attribution.py``: 64
rollouts, at least 32 of them to confirm; the seed is fixed, so the test is deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import car_core as car

PROMPT = f"{sa.SYSTEM_PROMPT} {sa.INJECTION}"
ROLLOUTS = 64


class PromptReadingModel(sa.PlantedSupportModel):
    """``PlantedSupportModel``, but the decision reads the injected line in the system prompt."""

    def decide(self, messages: Sequence[BaseMessage]) -> AIMessage:
        call_id = f"call_{sum(isinstance(m, AIMessage) for m in messages)}"
        tools = [m for m in messages if isinstance(m, ToolMessage)]
        last = tools[-1].name if tools else None
        if last == "lookup_order":
            told = any(m.type == "system" and sa.INJECTION in str(m.content) for m in messages)
            refund = self._draw() < (self.p_follow if told else self.p_base)
            return AIMessage("", tool_calls=[{"id": call_id, "name": "record_decision",
                                              "args": {"decision": "refund" if refund
                                                       else "deny"}}])
        if last == "record_decision" and json.loads(str(tools[-1].content))["recorded"] == \
                "refund":
            return AIMessage("", tool_calls=[{"id": call_id, "name": "issue_refund",
                                              "args": {"order_id": sa.ORDER_ID, "amount": 129.0}}])
        return super().decide(messages)


def graph_prompted_app(model: Any) -> Any:
    """The support graph whose model node sends the graph's messages as they are: the system
    prompt is the input's first message, so the graph's state holds it."""
    bound = model.bind_tools(list(sa.TOOLS))

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(list(sa.TOOLS)))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=InMemorySaver())


def failing_run(app: Any, inputs: dict[str, Any]) -> car.Trajectory:
    cb = CarCallback()
    for i in range(20):
        app.invoke(inputs, {"configurable": {"thread_id": f"t{i}"}, "callbacks": [cb]})
        if sa.outcome(cb.run):
            return cb.run
    raise AssertionError("no failing run in 20 tries")


def test_a_system_prompt_in_the_graphs_messages_is_named_and_its_removal_reaches_the_model(
        ) -> None:
    model = CarChatModel(inner=PromptReadingModel(rng_seed=0, p_follow=0.9))
    app = graph_prompted_app(model)
    run = failing_run(app, {"messages": [{"role": "system", "content": PROMPT},
                                         {"role": "user", "content": "My order A1001 is late."}]})
    sources = car.context_sources(run, 1)
    assert [s.label for s in sources][0] == "system prompt" and sources[0].text == PROMPT
    agent = LangGraphAgent(app, model=model, safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    result = car.context_attribution(run, agent, step=1, outcome=sa.outcome,
                                     rollouts=ROLLOUTS, seed=0)
    assert [s.source.label for s in result.named] == ["system prompt"]
    assert result.rollouts_used <= ROLLOUTS
    named = result.named[0]
    assert named.rescue_ci is not None and named.rescue_ci[0] <= 0.9 <= named.rescue_ci[1]
    # the edit reached the model: without the prompt the step never decides to refund
    without = car.intervene(run, agent, car.remove_sources(1, [named.source]).interventions,
                            outcome=sa.outcome, rollouts=8, seed=0)
    assert without.n == 8 and without.mean == 0.0
    assert without.trajectories[0].steps[1].state[0] == {"role": "system", "content": ""}


def test_a_prompt_the_node_prepends_at_the_call_is_not_offered_as_a_source() -> None:
    model = CarChatModel(inner=sa.PlantedSupportModel(rng_seed=0, p_follow=0.9))
    run = failing_run(sa.build_app(model, InMemorySaver()), sa.inputs())
    labels = [s.label for s in car.context_sources(run, 1)]
    assert "system prompt" not in labels and labels[0] == "user message 0"
    assert run.steps[1].meta["prompt"][0]["content"] == sa.SYSTEM_PROMPT  # recorded, apart
