"""A tool a branch runs live whose own code calls the plain function behind a side-effect tool
(the function the app also gave the agent as a tool): no branch guard sees a plain call, so the
side effect would happen for real on every branch that runs the outer tool. Each adapter
refuses it by name when the agent is wrapped, before any branch; classified a side effect, the
outer tool is answered from the record and its code never runs, so it is not refused."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, function_tool
from car_adapters.langgraph import CarChatModel, LangGraphAgent
from car_adapters.llamaindex import LlamaIndexAgent
from car_adapters.models.chat_agent import ChatAgent
from car_adapters.openai_agents import OpenAIAgentsAgent
from car_adapters.openai_agents.fake import ScriptedModel
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.tools import FunctionTool

import integrations_tests.support as support
from car_core.errors import AdapterError
from integrations_tests.support import audit_tools
from integrations_tests.support.llamaindex_stub import AsyncReplyLLM

LEDGER: list[str] = []
REFUSED = r"tool 'lookup_order' calls the function of side-effect tool\(s\) \['write_audit'\]"


def write_audit(entry: str) -> str:
    """Write an entry to the audit log (a side effect)."""
    LEDGER.append(entry)
    return "audited"


def lookup_order(order_id: str) -> str:
    """Look an order up; the app audits every lookup by calling the audit function itself."""
    write_audit(f"looked up {order_id}")
    return f"order {order_id}: a kettle"


def reply(text: str) -> str:
    """Answer the customer."""
    return "sent"


def chat_agent(**classes: Any) -> Any:
    return ChatAgent(lambda history, rng: "done",
                     tools={"lookup_order": lookup_order, "write_audit": write_audit,
                            "reply": reply}, **classes)


def langgraph_agent(**classes: Any) -> Any:
    model = CarChatModel(inner=FakeMessagesListChatModel(responses=[AIMessage("done")]))
    tools = [StructuredTool.from_function(f) for f in (lookup_order, write_audit, reply)]
    app = create_agent(model, tools, checkpointer=InMemorySaver())
    return LangGraphAgent(app, model=model, **classes)


def openai_agents_agent(**classes: Any) -> Any:
    tools = [function_tool(f) for f in (lookup_order, write_audit, reply)]
    app = Agent(name="desk", model=ScriptedModel(lambda messages, tools, rng: "done"),
                tools=tools)
    return OpenAIAgentsAgent(app, **classes)


WRAPS = [chat_agent, langgraph_agent, openai_agents_agent]


@pytest.mark.parametrize("wrap", WRAPS)
def test_a_live_tool_calling_a_side_effects_function_is_refused(wrap: Any) -> None:
    with pytest.raises(AdapterError, match=REFUSED) as info:
        wrap(safe_tools=["lookup_order", "reply"], side_effect_tools=["write_audit"])
    assert "side_effect_tools" in (info.value.hint or "")
    assert LEDGER == []


@pytest.mark.parametrize("wrap", WRAPS)
def test_classified_a_side_effect_the_outer_tool_is_not_refused(wrap: Any) -> None:
    wrap(safe_tools=["reply"], side_effect_tools=["lookup_order", "write_audit"])


@pytest.mark.parametrize("wrap", WRAPS)
def test_a_safe_tool_calling_a_safe_tools_function_is_not_refused(wrap: Any) -> None:
    wrap(safe_tools=["lookup_order", "write_audit", "reply"])


class Desk:
    """Tools as bound methods: ``self.write_audit(...)`` is a new method object at each access,
    so it is matched by the function behind it."""

    def lookup_order(self, order_id: str) -> str:
        self.write_audit(f"looked up {order_id}")
        return f"order {order_id}: a kettle"

    def write_audit(self, entry: str) -> str:
        LEDGER.append(entry)
        return "audited"


def test_a_bound_method_calling_a_side_effect_method_is_refused() -> None:
    desk = Desk()
    with pytest.raises(AdapterError, match=REFUSED):
        ChatAgent(lambda history, rng: "done",
                  tools={"lookup_order": desk.lookup_order, "write_audit": desk.write_audit},
                  safe_tools=["lookup_order"], side_effect_tools=["write_audit"])


def test_a_graph_node_calling_a_side_effect_tools_function_is_refused() -> None:
    audit = StructuredTool.from_function(write_audit)
    model = CarChatModel(inner=FakeMessagesListChatModel(responses=[AIMessage("done")]))

    def audited(state: MessagesState) -> dict[str, Any]:
        audit.func(entry="a node's own audit")  # past BaseTool.run: no guard sees it
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("audit", audited)
    graph.add_node("tools", ToolNode([audit]))
    graph.add_edge(START, "audit")
    graph.add_edge("audit", "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    app = graph.compile(checkpointer=InMemorySaver())
    with pytest.raises(AdapterError, match=r"node 'audit' calls the function of side-effect "
                                           r"tool\(s\) \['write_audit'\]"):
        LangGraphAgent(app, model=model, side_effect_tools=["write_audit"])


def lookup_via_module(order_id: str) -> str:
    """Look an order up, auditing through the audit module (a LlamaIndex trial's billing tool
    was accepted as safe and credited for real on every branch)."""
    audit_tools.write_audit(f"looked up {order_id}")
    return f"order {order_id}: a kettle"


def lookup_via_package(order_id: str) -> str:
    """The same through the package: ``support.audit_tools.write_audit``."""
    support.audit_tools.write_audit(f"looked up {order_id}")
    return f"order {order_id}: a kettle"


def by_module_chat(lookup: Any) -> Any:
    return ChatAgent(lambda history, rng: "done",
                     tools={"lookup_order": lookup, "write_audit": audit_tools.write_audit},
                     safe_tools=["lookup_order"], side_effect_tools=["write_audit"])


def by_module_llamaindex(lookup: Any) -> Any:
    tools = [FunctionTool.from_defaults(fn=f, name=f.__name__.replace("_via_module", "_order")
                                        .replace("_via_package", "_order"))
             for f in (lookup, audit_tools.write_audit)]
    agent = FunctionAgent(name="desk", description="a desk", llm=AsyncReplyLLM(), tools=tools)
    return LlamaIndexAgent(agent, safe_tools=["lookup_order"], side_effect_tools=["write_audit"])


@pytest.mark.parametrize("lookup", [lookup_via_module, lookup_via_package])
@pytest.mark.parametrize("wrap", [by_module_chat, by_module_llamaindex])
def test_a_side_effect_called_through_its_module_is_refused(wrap: Any, lookup: Any) -> None:
    with pytest.raises(AdapterError, match=REFUSED):
        wrap(lookup)
    assert audit_tools.LEDGER == []
