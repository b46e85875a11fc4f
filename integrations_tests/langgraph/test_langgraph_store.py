"""The LangGraph store on branches (``car_adapters.langgraph.branch_store``): CAR does not record
the store, so an app compiled with one says where branches read (``branch_store=``), and a
branch's writes never reach a real store.

The desk (``create_agent(..., store=store)``): step 0 recalls the user's memories
(``runtime.store.search``), step 1 books a meal (a side effect): for a vegetarian, the
vegetarian meal with probability 0.7, else the standard one; step 2 remembers the trip
(``runtime.store.put``, named safe: a user trial's attribution wrote 58 memories into the
user's store that way), step 3 answers. The standard meal fails the run, so

    P(fail | do_resample(0)) = 0.3   reading the memories the run read,
                             = 1     reading "no longer vegetarian", written after the run.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from car_adapters.demo.planted import SeededChatModel
from car_adapters.langgraph import CarCallback, LangGraphAgent
from car_adapters.langgraph.branch_store import BranchStore
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.memory import InMemoryStore

import car_core as car
from car_core.errors import AdapterError, InvalidInput

USER = ("memories", "u7")
P_VEGETARIAN = 0.7
CLASSES: dict[str, Any] = {"safe_tools": ["recall", "remember"],
                           "side_effect_tools": ["book_meal"],
                           "simulators": {"book_meal": lambda a: "booked"}}


@tool
def recall(runtime: ToolRuntime) -> str:
    """The user's memories (reads only)."""
    return "; ".join(i.value["fact"] for i in runtime.store.search(USER))


@tool
def remember(fact: str, runtime: ToolRuntime) -> str:
    """Keep a memory (writes the store)."""
    runtime.store.put(USER, uuid.uuid4().hex, {"fact": fact})
    return "kept"


@tool
def book_meal(meal: str) -> str:
    """Book a meal (a side effect)."""
    return "booked"


class Desk(SeededChatModel):
    """Recalls, books, remembers the trip, answers (see above)."""

    @property
    def _llm_type(self) -> str:
        return "planted-memory-desk"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        done = [m for m in messages if isinstance(m, ToolMessage)]
        call = f"c{uuid.uuid4().hex[:6]}"
        if not done:
            msg = AIMessage("", tool_calls=[{"name": "recall", "id": call, "args": {}}])
        elif len(done) == 1:
            facts = str(done[0].content)
            veg = ("vegetarian" in facts and "no longer vegetarian" not in facts
                   and self._draw() < P_VEGETARIAN)
            msg = AIMessage("", tool_calls=[{"name": "book_meal", "id": call, "args": {
                "meal": "vegetarian" if veg else "standard"}}])
        elif len(done) == 2:
            msg = AIMessage("", tool_calls=[{"name": "remember", "id": call,
                                             "args": {"fact": "trip: Oslo"}}])
        else:
            msg = AIMessage("Booked.")
        return ChatResult(generations=[ChatGeneration(message=msg)])


def desk() -> tuple[Any, InMemoryStore]:
    store = InMemoryStore()
    store.put(USER, "diet", {"fact": "vegetarian"})
    app = create_agent(Desk(rng_seed=2), [recall, book_meal, remember],
                       checkpointer=InMemorySaver(), store=store)
    return app, store


def standard(run: car.Trajectory) -> bool:
    return any(c["function"]["name"] == "book_meal"
               and json.loads(c["function"]["arguments"])["meal"] == "standard"
               for s in run.steps for c in s.action.get("tool_calls") or ())


def recorded(app: Any) -> car.Trajectory:
    for _ in range(50):
        cb = CarCallback(outcome=standard)
        app.invoke({"messages": [("user", "Book me a meal.")]},
                   {"configurable": {"thread_id": uuid.uuid4().hex}, "callbacks": [cb]})
        assert cb.run is not None
        if cb.run.failed:
            return cb.run
    raise AssertionError("no failing run")


def facts(store: InMemoryStore) -> list[str]:
    return sorted(i.value["fact"] for i in store.search(USER, limit=1000))


def test_an_app_with_a_store_must_say_where_branches_read() -> None:
    app, _ = desk()
    with pytest.raises(AdapterError, match=r"compiled with a store \(InMemoryStore\)"):
        LangGraphAgent(app, **CLASSES)
    plain = create_agent(Desk(), [recall, book_meal, remember], checkpointer=InMemorySaver())
    with pytest.raises(InvalidInput, match="compiled without a store"):
        LangGraphAgent(plain, **CLASSES, branch_store="live")


def test_branches_read_the_live_store_and_never_write_it() -> None:
    app, store = desk()
    run = recorded(app)
    kept = facts(store)
    assert kept.count("trip: Oslo") >= 1  # the recorded runs' own writes
    rollouts = 40
    res = car.intervene(run, LangGraphAgent(app, **CLASSES, branch_store="live"),
                        car.do_resample(0), outcome=standard, rollouts=rollouts, seed=0)
    assert facts(store) == kept  # every branch remembered its trip in a copy of its own
    assert abs(res.mean - (1 - P_VEGETARIAN)) <= 3.5 * (0.21 / rollouts) ** 0.5


def test_branches_read_the_store_the_user_names_not_the_future() -> None:
    app, store = desk()
    run = recorded(app)
    seen = InMemoryStore()  # what the run read, kept by the user before the store moved on
    for item in store.search(USER, limit=1000):
        seen.put(USER, item.key, item.value)
    store.put(USER, "later", {"fact": "no longer vegetarian"})
    live = car.intervene(run, LangGraphAgent(app, **CLASSES, branch_store="live"),
                         car.do_resample(0), outcome=standard, rollouts=8, seed=0)
    assert live.mean == 1.0  # as it is now: what "live" says it reads
    rollouts = 40
    res = car.intervene(run, LangGraphAgent(app, **CLASSES, branch_store=seen),
                        car.do_resample(0), outcome=standard, rollouts=rollouts, seed=0)
    assert abs(res.mean - (1 - P_VEGETARIAN)) <= 3.5 * (0.21 / rollouts) ** 0.5
    assert "no longer vegetarian" not in facts(seen) and len(facts(seen)) == len(facts(store)) - 1


def test_a_branch_store_reads_its_own_writes_over_the_base_and_leaves_the_base_alone() -> None:
    base = InMemoryStore()
    base.put(("a", "b"), "k", {"v": 1, "tag": "x"})
    base.put(("a", "c"), "gone", {"v": 2, "tag": "x"})
    mine = BranchStore(base)
    mine.put(("a", "b"), "k", {"v": 10, "tag": "x"})
    mine.put(("a", "d"), "new", {"v": 3, "tag": "y"})
    mine.delete(("a", "c"), "gone")
    got = mine.get(("a", "b"), "k")
    assert got is not None and got.value == {"v": 10, "tag": "x"}
    assert mine.get(("a", "c"), "gone") is None
    assert sorted(i.key for i in mine.search(("a",))) == ["k", "new"]
    assert [i.key for i in mine.search(("a",), filter={"tag": "y"})] == ["new"]
    # a namespace the branch emptied may still be listed: listing reads the base's namespaces
    assert {("a", "b"), ("a", "d")} <= set(mine.list_namespaces())
    assert mine.list_namespaces(prefix=("a", "d")) == [("a", "d")]
    kept = base.get(("a", "b"), "k")
    assert kept is not None and kept.value == {"v": 1, "tag": "x"}  # the base, unwritten
    assert base.get(("a", "c"), "gone") is not None and base.get(("a", "d"), "new") is None
