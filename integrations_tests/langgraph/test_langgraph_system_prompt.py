"""The system prompt as a source of a LangGraph step: offered where the graph's messages hold it
(a ``SystemMessage`` in the input), so taking it out is written into the forked checkpoint and
reaches the model; and where a node prepends it at a model call CAR decides
(``create_agent(system_prompt=...)`` with ``CarMiddleware`` or ``CarChatModel``, a node that
prepends its own ``SystemMessage`` to a ``CarChatModel``), where a branch hands the call the
edited prompt. Where CAR does not decide that call, an edit of it is refused by name before
the branch runs; where the record was made without CAR at the call, it is not offered.

The planted model refunds with probability 0.9 when the system prompt carries the injected
line and never otherwise, so the system prompt's leave-one-out rescue is 0.9 and every other
source's is 0. Budget as in ``integrations_tests/project/test_context_attribution.py``: 64
rollouts, at least 32 of them to confirm; the seed is fixed, so the test is deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel, CarMiddleware, LangGraphAgent
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import PrivateAttr

import car_core as car
from car_core.contract import state_of
from car_core.errors import InvalidIntervention

PROMPT = f"{sa.SYSTEM_PROMPT} {sa.INJECTION}"
ROLLOUTS = 64


class PromptReadingModel(sa.PlantedSupportModel):
    """``PlantedSupportModel``, but the decision reads the injected line in the system prompt;
    ``prompts`` keeps the system prompt each call was given."""

    _prompts: list[str] = PrivateAttr(default_factory=list)

    @property
    def prompts(self) -> list[str]:
        return self._prompts  # shared with the per-step seeded copies

    def decide(self, messages: Sequence[BaseMessage]) -> AIMessage:
        self._prompts.append("".join(str(m.content) for m in messages if m.type == "system"))
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


def prompted_at_the_call(how: str, inner: Any) -> tuple[Any, Any]:
    """An app whose node prepends ``PROMPT`` at the model call, and the object through which
    CAR decides that call: ``create_agent(system_prompt=...)`` with ``CarMiddleware`` or a
    ``CarChatModel``, or a node of its own prepending a ``SystemMessage`` (the support graph)."""
    if how == "create_agent + CarMiddleware":
        mw = CarMiddleware()
        return create_agent(inner, sa.TOOLS, system_prompt=PROMPT, middleware=[mw],
                            checkpointer=InMemorySaver()), mw
    model = CarChatModel(inner=inner)
    if how == "create_agent + CarChatModel":
        return create_agent(model, sa.TOOLS, system_prompt=PROMPT,
                            checkpointer=InMemorySaver()), model
    return sa.build_app(model, InMemorySaver(), system_prompt=PROMPT), model


HOWS = ["create_agent + CarMiddleware", "create_agent + CarChatModel", "node + CarChatModel"]


@pytest.mark.parametrize("how", HOWS)
def test_a_prompt_the_node_prepends_at_a_call_car_decides_is_named_and_its_edit_reaches_it(
        how: str) -> None:
    inner = PromptReadingModel(rng_seed=0, p_follow=0.9)
    app, decider = prompted_at_the_call(how, inner)
    run = failing_run(app, sa.inputs("My order A1001 is late."))
    assert run.steps[1].meta["input"] == "prompt+state"
    sources = car.context_sources(run, 1)
    assert [s.label for s in sources] == ["system prompt", "user message 1",
                                          "tool message 3 (lookup_order)",
                                          *[f"tool {t.name}: description" for t in sa.TOOLS]]
    assert sources[0].text == PROMPT
    agent = LangGraphAgent(app, model=decider, safe_tools=sa.SAFE_TOOLS,
                           side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    result = car.context_attribution(run, agent, step=1, outcome=sa.outcome,
                                     rollouts=ROLLOUTS, seed=0)
    assert [s.source.label for s in result.named] == ["system prompt"]
    assert result.rollouts_used <= ROLLOUTS
    named = result.named[0]
    assert named.rescue_ci is not None and named.rescue_ci[0] <= 0.9 <= named.rescue_ci[1]
    # the edit reached the model: step 1 was given the emptied prompt, and never refunds; the
    # reply after it (step 2) was given the prompt the node prepends, as recorded
    inner.prompts.clear()
    without = car.intervene(run, agent, car.remove_sources(1, [named.source]).interventions,
                            outcome=sa.outcome, rollouts=8, seed=0)
    assert without.n == 8 and without.mean == 0.0
    assert inner.prompts == ["", PROMPT] * 8
    step = without.trajectories[0].steps[1]
    assert step.meta["prompt"] == [{"role": "system", "content": ""}]
    assert step.state == run.steps[1].state  # the graph's messages, as recorded
    # the prompt is given at step 1 only: the node prepends the recorded one again after it
    assert state_of(without.trajectories[0], 2)[0]["content"] == PROMPT


def test_an_edited_prompt_is_refused_by_name_where_car_does_not_decide_the_call() -> None:
    inner = PromptReadingModel(rng_seed=0, p_follow=0.9)
    app, _ = prompted_at_the_call("create_agent + CarMiddleware", inner)
    run = failing_run(app, sa.inputs("My order A1001 is late."))
    agent = LangGraphAgent(app, safe_tools=sa.SAFE_TOOLS, side_effect_tools=sa.SIDE_EFFECT_TOOLS)
    prompt = car.context_sources(run, 1)[0]
    calls = len(inner.prompts)
    with pytest.raises(InvalidIntervention, match="system prompt") as refused:
        car.intervene(run, agent, car.remove_sources(1, [prompt]).interventions,
                      outcome=sa.outcome, rollouts=2, seed=0)
    assert refused.value.step == 1 and "model=" in str(refused.value)
    assert len(inner.prompts) == calls  # refused before the branch called the model
    # its random ablations edit the prompt or the tools' descriptions: each refused by name
    with pytest.raises(InvalidIntervention, match="system prompt|tool descriptions"):
        car.context_attribution(run, agent, step=1, outcome=sa.outcome, rollouts=16, seed=0)
    # an edit that leaves the prompt as recorded still runs there: the fork takes it
    kept = car.intervene(run, agent, car.do_context(1, sa.remove_injection),
                         outcome=sa.outcome, rollouts=2, seed=0)
    assert kept.n == 2


def test_a_prompt_prepended_at_a_call_car_did_not_decide_is_not_offered() -> None:
    run = failing_run(sa.build_app(PromptReadingModel(rng_seed=0, p_follow=0.9),
                                   InMemorySaver(), system_prompt=PROMPT),
                      sa.inputs("My order A1001 is late."))
    labels = [s.label for s in car.context_sources(run, 1)]
    assert "system prompt" not in labels and labels[0] == "user message 0"
    assert run.steps[1].meta["prompt"][0]["content"] == PROMPT  # recorded, apart
    assert "input" not in run.steps[1].meta
