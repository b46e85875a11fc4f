"""Apps recorded with an ``InMemorySaver`` and attributed in another process.

``build()`` is the support desk on ``create_agent`` with CAR's middleware and the planted
support model (``car_adapters.demo.support_agent``): the decision at step 1 refunds with
p = 0.3 when the injection is visible. Its messages are its whole state, so the record rebuilds
every fork point. ``build(bare=True)`` is the same desk compiled without a checkpointer, which
``make_bare()`` gives ``car attribute``. ``noted(saver)`` is the support graph with a ``notes``
key its model node writes: the record keeps only the final notes, so it cannot rebuild a fork
point (``noted(None)`` and ``make_noted_bare()``: the same graph without a checkpointer).

Run as a script (``python record_anywhere_apps.py STORE ROLLOUTS``), it records a failing run
of ``build()`` into ``STORE`` and attributes it in that same process, where the checkpoints
live, and prints ``{"run_id", "locus", "effects"}`` as JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarMiddleware, LangGraphAgent
from langchain.agents import create_agent
from langchain_core.messages import AnyMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph, add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from typing_extensions import TypedDict

import car_core as car

outcome = sa.outcome
CLASSES: dict[str, Any] = {"safe_tools": sa.SAFE_TOOLS, "side_effect_tools": sa.SIDE_EFFECT_TOOLS}


def build(bare: bool = False) -> tuple[Any, CarMiddleware]:
    """The create_agent support desk, on a new InMemorySaver (``bare``: compiled without a
    checkpointer)."""
    mw = CarMiddleware()
    app = create_agent(sa.PlantedSupportModel(rng_seed=0), sa.TOOLS,
                       system_prompt=sa.SYSTEM_PROMPT,
                       checkpointer=None if bare else InMemorySaver(), middleware=[mw])
    return app, mw


def make() -> LangGraphAgent:
    """The agent ``car attribute --agent`` builds in a new process: a new app, whose
    InMemorySaver holds none of the recorded threads."""
    app, mw = build()
    return LangGraphAgent(app, model=mw, **CLASSES)


def make_bare() -> LangGraphAgent:
    """The agent ``car attribute --agent`` builds from the desk compiled without a
    checkpointer: CAR branches on a copy of it with a checkpointer of its own."""
    app, mw = build(bare=True)
    return LangGraphAgent(app, model=mw, **CLASSES)


class Messages(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class NotedState(Messages):
    notes: str


def noted(saver: Any, model: Any, private: bool = False) -> Any:
    """The support graph whose model node also writes ``notes`` (how many messages it saw),
    kept out of the graph's output when ``private``."""
    bound = model.bind_tools(sa.TOOLS)

    def agent(state: NotedState) -> dict[str, Any]:
        reply = bound.invoke([SystemMessage(sa.SYSTEM_PROMPT), *state["messages"]])
        return {"messages": [reply], "notes": f"saw {len(state['messages'])} messages"}

    graph = StateGraph(NotedState, output_schema=Messages if private else None)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(sa.TOOLS))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


def make_noted() -> LangGraphAgent:
    return LangGraphAgent(noted(InMemorySaver(), sa.PlantedSupportModel()), **CLASSES)


def make_noted_bare() -> LangGraphAgent:
    return LangGraphAgent(noted(None, sa.PlantedSupportModel()), **CLASSES)


def record_failing(store: car.RunStore, bare: bool = False
                   ) -> tuple[Any, CarMiddleware, car.Trajectory]:
    """A failing run of ``build(bare)``, stored; the app that recorded it and its middleware.
    A bare app runs on no thread: it has no checkpointer to keep one."""
    app, mw = build(bare)
    cb = CarCallback(store=store, outcome=outcome)
    for i in range(60):  # a seeded model: the same runs every time
        config = {} if bare else {"configurable": {"thread_id": f"user-{i}"}}
        app.invoke(sa.inputs(), {**config, "callbacks": [cb]})
        run = cb.run
        if run is not None and run.outcome is not None and run.outcome.value == 1.0:
            return app, mw, run
    raise AssertionError("no failing run")


def main(path: str, rollouts: int) -> None:
    with car.RunStore(path) as store:
        app, mw, run = record_failing(store)
        res = car.contrastive(run, LangGraphAgent(app, model=mw, **CLASSES), outcome=outcome,
                              rollouts=rollouts, seed=0)
    print(json.dumps({"run_id": run.id, "locus": res.locus,
                      "effects": [s.effect for s in res.steps]}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
