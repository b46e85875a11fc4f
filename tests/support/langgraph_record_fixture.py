r"""The stored runs ``CarCallback`` makes of fixed LangGraph apps, normalised so two recordings
compare byte for byte: every UUID (checkpoint, task and message ids) becomes ``<uuid N>`` in
order of first appearance, the run id ``run``, ``created_at`` and each step's ``latency_s``
0; then the run is sealed again (``Trajectory.new``) so the digests are over that content.

``integrations_tests/langgraph/test_langgraph_recording.py`` compares what the recorder stores
now with ``tests/golden/langgraph_recorded.json``, which this script wrote from the code the
recorder had before its events were deferred to the store's writer thread:

    .venv/bin/python tests/support/langgraph_record_fixture.py \
        > tests/golden/langgraph_recorded.json
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def normalised(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: (0.0 if k == "latency_s" else normalised(v, names)) for k, v in value.items()}
    if isinstance(value, list):
        return [normalised(v, names) for v in value]
    if isinstance(value, str):
        return UUID.sub(lambda m: names.setdefault(m.group(0), f"<uuid {len(names)}>"), value)
    return value


def sealed_text(run: Any) -> str:
    """``run`` normalised and sealed again, as JSON."""
    import car_core as car
    names: dict[str, str] = {}
    data = normalised(run.to_dict(), names)
    steps = [car.Step(index=s["index"], action=s["action"], observation=s["observation"],
                      observed=s["observed"], state=s["state"], meta=s["meta"])
             for s in data["steps"]]
    again = car.Trajectory.new(context=data["context"], steps=steps, id="run", created_at=0.0,
                               agent=data["agent"], status=data["status"], error=data["error"],
                               meta=data["meta"])
    return again.to_json()


def edited_history_app() -> tuple[Any, Any]:
    """A graph whose second node rewrites the first message in place before its model call,
    with the input it runs on: each call must be recorded as it saw the history."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph

    model = FakeListChatModel(responses=["first", "second"])

    def ask(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def edit_then_ask(state: MessagesState) -> dict[str, Any]:
        state["messages"][0].content = "edited in place"  # a node that rewrites history
        return ask(state)

    graph = StateGraph(MessagesState)
    graph.add_node("ask", ask)
    graph.add_node("edit_then_ask", edit_then_ask)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", "edit_then_ask")
    return graph.compile(checkpointer=InMemorySaver()), {"messages": [("user", "original")]}


def apps() -> dict[str, tuple[Any, Any]]:
    """Each app, with the input it is recorded on: the support agent (4 decisions, tools),
    and the graph that rewrites its history in place."""
    from car_adapters.demo import support_agent as sa
    from langgraph.checkpoint.memory import InMemorySaver

    return {"support": (sa.build_app(sa.PlantedSupportModel(rng_seed=0), InMemorySaver()),
                        sa.inputs()),
            "edited": edited_history_app()}


def recorded(folder: Path) -> dict[str, str]:
    """Each app recorded into a store given as a path, read back from the store."""
    from car_adapters.langgraph import CarCallback

    import car_core as car
    out = {}
    for name, (app, given) in apps().items():
        cb = CarCallback(store=folder / f"{name}.db")
        app.invoke(given, {"configurable": {"thread_id": "t"}, "callbacks": [cb]})
        cb.flush()
        with car.RunStore(folder / f"{name}.db", readonly=True) as store:
            [row] = store.runs()
            out[name] = sealed_text(store.load(row["id"]))
    return out


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        json.dump(recorded(Path(tmp)), sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
