"""Tool calls a node answers with its own code, which no guard can answer on a branch.

The notes app (langchain-ai/memory-agent's shape): the model asks to save a note by a tool
call; a ``store`` node runs ``save_note`` itself and answers with a ``ToolMessage``. At step 0
the model saves the user's card number with probability ``P_LEAK`` (the failure), else their
hobby; step 1 answers. So ``P(fail | do_resample(0)) = P_LEAK``.

A user trial of that shape passed ``node_tools=[tool(upsert_memory)]`` as the refusal's hint
said, and the plain function still ran on every branch (16 real writes; 17 with no
classification at all). Here every such record is refused before any branch, and the app
that runs the note as a LangChain tool is attributed with no real write.
"""

from __future__ import annotations

import types
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from car_adapters.demo.planted import SeededChatModel
from car_adapters.langgraph import CarCallback, LangGraphAgent, attribute_thread
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

import car_core as car
from car_core.errors import AdapterError, InvalidInput, SideEffectBlocked

P_LEAK = 0.35
LEDGER: list[str] = []  # every real note written


def save_note(text: str) -> str:
    """Keep a note about the user (a real write)."""
    LEDGER.append(text)
    return f"saved {len(LEDGER)}"


note_tool = tool(save_note)


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class Notes(SeededChatModel):
    """Step 0 saves a note (the card w.p. ``P_LEAK``), step 1 answers. ``call``: the tool
    name of the first call (a name the app has no tool for, in one test)."""

    call: str = "save_note"
    answer_first: float = 0.0  # probability that step 0 answers without a call

    @property
    def _llm_type(self) -> str:
        return "planted-notes"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        if any(isinstance(m, ToolMessage) for m in messages):
            msg = AIMessage("Noted.")
        elif self._draw() < self.answer_first:
            msg = AIMessage("Nothing to keep.")
        else:
            text = "card 4111 1111 1111 1111" if self._draw() < P_LEAK else "likes hiking"
            msg = AIMessage("", tool_calls=[{"name": self.call, "args": {"text": text},
                                             "id": f"c{uuid.uuid4().hex[:6]}"}])
        return ChatResult(generations=[ChatGeneration(message=msg)])


def notes_app(model: Notes, store: Any) -> Any:
    """``agent`` decides; ``store`` answers its tool calls with ``store(call)``."""
    def agent(state: State) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def store_node(state: State) -> dict[str, Any]:
        last = state["messages"][-1]
        return {"messages": [ToolMessage(str(store(c)), tool_call_id=c["id"])
                             for c in getattr(last, "tool_calls", [])]}

    def route(state: State) -> str:
        return "store" if getattr(state["messages"][-1], "tool_calls", None) else END

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_node("store", store_node)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["store", END])
    g.add_edge("store", "agent")
    return g.compile(checkpointer=InMemorySaver())


def plain(call: dict[str, Any]) -> str:  # memory-agent's way: the function itself
    return save_note(**call["args"])


# the same plain call from another module of the app's: reading the node's code does not
# follow it there, so the record's answer is what refuses it
ELSEWHERE = types.ModuleType("notes_helpers")
ELSEWHERE.__dict__["save_note"] = save_note
exec("def store(call):\n    return save_note(**call['args'])\n", ELSEWHERE.__dict__)
STORE_ELSEWHERE = ELSEWHERE.__dict__["store"]


def through_tool(call: dict[str, Any]) -> str:  # the tool object, which the guard answers
    return str(note_tool.invoke(call["args"]))


def built_inside(call: dict[str, Any]) -> str:  # a tool made at call time, never given to CAR
    return str(StructuredTool.from_function(save_note).invoke(call["args"]))


def leaked(run: car.Trajectory) -> bool:
    return any("card" in str(c["function"]["arguments"])
               for s in run.steps for c in s.action.get("tool_calls") or ())


def recorded(app: Any, wanted: Any = leaked) -> car.Trajectory:
    """The first run ``wanted(run)`` holds for (a failing one by default)."""
    for _ in range(60):
        cb = CarCallback(outcome=leaked)
        app.invoke({"messages": [("user", "I'm Sam, I hike; card 4111 1111 1111 1111.")]},
                   {"configurable": {"thread_id": uuid.uuid4().hex}, "callbacks": [cb]})
        assert cb.run is not None
        if wanted(cb.run):
            return cb.run
    raise AssertionError("no such run")


@pytest.fixture(autouse=True)
def ledger() -> list[str]:
    LEDGER.clear()
    return LEDGER


# named as a node tool, the node's plain call of its function is refused where the agent is
# built (``refuse_side_effect_functions``); unnamed, where the record shows the call
CALLS_ITS_FUNCTION = (r"node 'store' calls the function of side-effect tool\(s\) "
                      r"\['save_note'\] in its own code")


@pytest.mark.parametrize("kwargs, says, hint", [
    ({}, r"step 0's call .*'save_note' is not a tool of this graph \(its tools are \[\]\)",
     "ainvoke"),
    ({"node_tools": [note_tool], "side_effect_tools": ["save_note"]}, CALLS_ITS_FUNCTION,
     "tool.invoke"),
    ({"node_tools": [note_tool], "side_effect_tools": ["save_note"], "store": "elsewhere"},
     r"answered by a node, and no LangChain tool named 'save_note' ran in the record",
     "ainvoke"),
])
def test_a_call_a_node_answers_with_its_own_code_is_refused(kwargs: dict[str, Any],
                                                            says: str, hint: str) -> None:
    kwargs = dict(kwargs)
    store = STORE_ELSEWHERE if kwargs.pop("store", None) else plain
    app = notes_app(Notes(rng_seed=1), store)
    run = recorded(app)
    written = len(LEDGER)
    with pytest.raises(AdapterError, match=says) as caught:
        car.contrastive(run, LangGraphAgent(app, **kwargs), outcome=leaked, rollouts=8,
                        seed=0)
    assert hint in (caught.value.hint or "")
    assert len(LEDGER) == written  # no branch ran


def test_the_same_app_running_the_tool_object_is_attributed_with_no_real_write() -> None:
    app = notes_app(Notes(rng_seed=1), through_tool)
    run = recorded(app)
    assert "save_note" in run.meta["tools_run"]
    written = len(LEDGER)
    agent = LangGraphAgent(app, node_tools=[note_tool], side_effect_tools=["save_note"],
                           simulators={"save_note": lambda a: "saved"})
    rollouts = 60
    res = car.intervene(run, agent, car.do_resample(0), outcome=leaked, rollouts=rollouts,
                        seed=0)
    assert abs(res.mean - P_LEAK) <= 3.5 * (P_LEAK * (1 - P_LEAK) / rollouts) ** 0.5
    assert len(LEDGER) == written


def test_a_tool_made_inside_a_node_is_stopped_before_it_runs() -> None:
    """The record never called it (step 0 answered), so nothing refused it up front; the
    branches that call it are stopped at the call, and nothing is written."""
    app = notes_app(Notes(rng_seed=1, answer_first=0.5), built_inside)
    run = recorded(app, lambda r: not any(s.action.get("tool_calls") for s in r.steps))
    written = len(LEDGER)  # the runs recorded before it
    with pytest.raises(SideEffectBlocked, match=r"tool 'save_note' in node 'store'.*not run"):
        car.intervene(run, LangGraphAgent(app), car.do_resample(0), outcome=leaked,
                      rollouts=16, seed=0)
    assert len(LEDGER) == written


def test_a_made_up_tool_name_the_tool_node_turned_away_is_not_refused() -> None:
    """A ``ToolNode`` answers a call of a tool it does not have with an error and runs
    nothing, on the record and on branches alike: that answer is no node's own code."""
    model = Notes(rng_seed=1, call="save_memo")
    g = StateGraph(State)
    g.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    g.add_node("tools", ToolNode([note_tool]))
    g.add_edge(START, "agent")
    g.add_conditional_edges(
        "agent", lambda s: "tools" if s["messages"][-1].tool_calls else END, ["tools", END])
    g.add_edge("tools", "agent")
    app = g.compile(checkpointer=InMemorySaver())
    run = recorded(app)
    assert "save_memo is not a valid tool" in run.steps[0].observation[0]["content"]
    res = car.intervene(run, LangGraphAgent(app, side_effect_tools=["save_note"]),
                        car.do_resample(0), outcome=leaked, rollouts=40, seed=0)
    assert abs(res.mean - P_LEAK) <= 3.5 * (P_LEAK * (1 - P_LEAK) / 40) ** 0.5
    assert LEDGER == []


def test_an_imported_thread_cannot_show_the_tool_ran_so_it_is_refused() -> None:
    """A user trial imported the same thread (``attribute_thread``) and the check was skipped:
    6 real writes. A node whose code calls the function of the tool named in ``node_tools``
    is refused by the agent ``attribute_thread`` builds; one that calls it from another
    module, which reading the code does not follow, by the thread: its checkpoints do not show
    whether a LangChain tool ran."""
    refused_on_import(plain, CALLS_ITS_FUNCTION)
    refused_on_import(STORE_ELSEWHERE, r"an imported thread does not show whether a LangChain "
                                       r"tool named 'save_note' ran")


def refused_on_import(store: Any, says: str) -> None:
    app = notes_app(Notes(rng_seed=1), store)
    run = recorded(app)
    written = len(LEDGER)
    with pytest.raises(AdapterError, match=says):
        attribute_thread(app, str(run.meta["thread_id"]), outcome=leaked,
                         node_tools=[note_tool], side_effect_tools=["save_note"],
                         simulators={"save_note": lambda a: "saved"}, rollouts=8)
    assert len(LEDGER) == written


def test_a_call_a_node_only_routes_runs_live_once_named() -> None:
    """The customer-support tutorial's ``ToFlightBookingAssistant``: a schema the model calls
    and an entry node answers ("the assistant is now ..."), with no effect. Refused unnamed;
    named in ``routing_calls``, branches run that node live and the estimate goes through."""
    app = notes_app(Notes(rng_seed=1, call="ToNotesAssistant"),
                    lambda call: "The notes assistant is now active.")
    run = recorded(app)
    with pytest.raises(AdapterError, match=r"routing_calls=\['ToNotesAssistant'\]"):
        car.intervene(run, LangGraphAgent(app), car.do_resample(0), outcome=leaked,
                      rollouts=4, seed=0)
    rollouts = 60
    res = car.intervene(run, LangGraphAgent(app, routing_calls=["ToNotesAssistant"]),
                        car.do_resample(0), outcome=leaked, rollouts=rollouts, seed=0)
    assert abs(res.mean - P_LEAK) <= 3.5 * (P_LEAK * (1 - P_LEAK) / rollouts) ** 0.5
    with pytest.raises(InvalidInput, match=r"routing_calls names \['save_note'\], which are "
                                           r"tools of this graph"):
        LangGraphAgent(notes_app(Notes(), through_tool), node_tools=[note_tool],
                       routing_calls=["save_note"])
