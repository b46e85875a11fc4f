"""What leaving CAR on in a test suite costs, three figures side by side in one run.

1. ``python -c "import car_core"`` in a fresh process, against ``python -c pass`` (wall time,
   median of ``--imports`` interleaved pairs; the OS file cache is warm, the interpreter cold).
2. The first ``car_recorder`` use in a process that has already imported LangGraph and built
   its app (a one-node graph over LangChain's fake chat model; CAR not yet imported):
   ``RunRecorder.start()`` + one recorded run + ``finish()``, imports included, minus the same
   run unrecorded (median over ``--imports`` fresh processes).
3. LangGraph recording overhead with the store: the planted support agent (4 decisions, a
   zero-latency model) with ``CarCallback(store=path)`` against the same run without it
   (median of the ratios of ``--runs`` interleaved pairs in one process, which of a pair runs
   first alternating: the critical path), and amortised (every recorded run plus the final
   ``flush()``, which seals the runs the callback deferred and waits for the store, over
   every plain run). Beside it the same without a store, and a LangChain handler that does
   nothing (the dispatch any handler costs, which no recorder can go below).

    .venv/bin/python benchmarks/ci_cost.py                 # 15 processes, 300 pairs
    .venv/bin/python benchmarks/ci_cost.py --imports 30 --runs 500
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIRST_USE = '''
import sys, time
from pathlib import Path
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
import car_adapters.pytest_plugin  # loaded by pytest before any test

model = FakeListChatModel(responses=["done"] * 10)
graph = StateGraph(MessagesState)
graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
graph.add_edge(START, "agent")
app = graph.compile(checkpointer=InMemorySaver())
ask = {"messages": [("user", "hello")]}
app.invoke(ask, {"configurable": {"thread_id": "warm"}})
t = time.perf_counter()
app.invoke(ask, {"configurable": {"thread_id": "plain"}})
plain = time.perf_counter() - t
t = time.perf_counter()
from car_adapters.pytest_plugin.recording import RunRecorder, close_writers
rec = RunRecorder("test_x.py::test_x", Path(sys.argv[1]))
rec.start()
app.invoke(ask, {"configurable": {"thread_id": "recorded"}})
rec.finish()
recorded = time.perf_counter() - t
close_writers()
assert len(rec.runs) == 1
print(recorded - plain)
'''


def _wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - start


def imports(n: int) -> tuple[float, float]:
    bare, car = [], []
    for _ in range(n + 1):  # the first pair warms the file cache and is dropped
        bare.append(_wall([sys.executable, "-c", "pass"]))
        car.append(_wall([sys.executable, "-c", "import car_core"]))
    return statistics.median(bare[1:]), statistics.median(car[1:])


def first_use(n: int, folder: Path) -> float:
    extra = []
    for i in range(n):
        out = subprocess.run([sys.executable, "-c", FIRST_USE, str(folder / f"first-{i}.db")],
                             check=True, capture_output=True, text=True).stdout
        extra.append(float(out.split()[-1]))
    return statistics.median(extra)


def recording(runs: int, folder: Path, handler: str = "store") -> tuple[float, float, float]:
    """``(median plain s/run, median ratio of the pairs, amortised ratio)``. The median ratio
    is the critical path, what a run waits for; the amortised ratio is every recorded run
    plus the final ``flush()`` (which seals the runs the callback deferred and waits for the
    store) over every plain run, so work moved off the critical path is still counted."""
    from car_adapters.demo.support_agent import PlantedSupportModel, build_app, inputs
    from car_adapters.langgraph import CarCallback
    from langchain_core.callbacks import BaseCallbackHandler
    from langgraph.checkpoint.memory import InMemorySaver

    class Nothing(BaseCallbackHandler):
        """A handler that does nothing: the dispatch LangChain costs any handler."""

        run_inline = True

    app = build_app(PlantedSupportModel(rng_seed=0), InMemorySaver())
    cb: Any = {"store": lambda: CarCallback(store=folder / "recorded.db"),
               "memory": CarCallback, "nothing": Nothing}[handler]()
    plain, stored = [], []
    def timed(config: dict[str, Any]) -> float:
        t = time.perf_counter()
        app.invoke(inputs(), config)
        return time.perf_counter() - t

    for i in range(runs + 5):  # the first 5 pairs warm caches and are dropped
        plain_cfg = {"configurable": {"thread_id": f"p{i}"}}
        stored_cfg = {"configurable": {"thread_id": f"r{i}"}, "callbacks": [cb]}
        if i % 2:  # which of the pair runs first alternates, so order effects cancel
            t_stored, t_plain = timed(stored_cfg), timed(plain_cfg)
        else:
            t_plain, t_stored = timed(plain_cfg), timed(stored_cfg)
        if i >= 5:
            plain.append(t_plain)
            stored.append(t_stored)
        elif i == 4 and handler != "nothing":
            cb.flush()  # the warm-up runs' deferred work is not the measured runs'
    flush = 0.0
    if handler != "nothing":
        t = time.perf_counter()
        cb.flush()
        flush = time.perf_counter() - t
        assert len(cb.runs) == runs + 5
    ratios = [s / p for s, p in zip(stored, plain, strict=True)]
    amortised = (sum(stored) + flush) / sum(plain)
    return statistics.median(plain), statistics.median(ratios), amortised


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imports", type=int, default=15, help="fresh processes per figure")
    parser.add_argument("--runs", type=int, default=300, help="interleaved LangGraph pairs")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="car-ci-cost-"))
    bare, car = imports(args.imports)
    extra = first_use(args.imports, folder)
    rows = [(label, *recording(args.runs, folder, handler)) for label, handler in (
        ("LangGraph run recorded into the store (ms/run)", "store"),
        ("LangGraph run recorded, no store (ms/run)", "memory"),
        ("LangGraph run, a handler that does nothing (ms/run)", "nothing"))]
    print(f"{'figure':<52} {'value':>10} {'baseline':>10} {'ratio':>7} {'amortised':>10}")
    label = 'python -c "import car_core" (wall s)'
    print(f"{label:<52} {car:>10.3f} {bare:>10.3f} {car / bare:>6.2f}x")
    print(f"{'first car_recorder use, LangGraph loaded (extra s)':<52} {extra:>10.3f}")
    for label, plain, ratio, amortised in rows:
        print(f"{label:<52} {plain * ratio * 1e3:>10.2f} {plain * 1e3:>10.2f} {ratio:>6.2f}x "
              f"{amortised:>9.2f}x")
    print(f"(medians: {args.imports} processes, {args.runs} interleaved pairs; ratio: median of "
          f"the pairs' ratios, the run's critical path; amortised: all recorded runs and the "
          f"final flush over all plain runs)")


if __name__ == "__main__":
    main()
